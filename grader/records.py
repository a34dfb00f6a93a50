"""The records of a run that the supervisor writes and verification reads: what was asked (`RunRequest`), how
it stopped (`Stop`), and what each rank did (`RankRecord`, its result a `RankResult`).

Plain data, shared by two layers: the supervisor (grader/processes/) fills them in; verification
(grader/verify/), the planner and the tests' in-process runs (tests/switchsim.py) read them without loading
a process module. Nothing here imports torch or starts anything.

The enums are `str` enums: their members compare equal to, and serialize as, their values ("completed",
"return", "switch"), the words results.json and the ranks' frames carry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: the switch's record is the supervisor's, read here, never built
    from .switch.record import Call


class _Word(str, Enum):
    def __str__(self) -> str:   # the word itself in messages and f-strings, not "Stop.TIMEOUT"
        return self.value


class Stop(_Word):
    """Why the supervisor stopped a run (COMPLETED: it was not stopped; every rank finished)."""
    COMPLETED = "completed"
    TIMEOUT = "timeout"                # its wall-clock limit
    DEADLOCK = "deadlock"              # every live rank waits on an operation the switch cannot complete
    PROCESS_LIMIT = "process_limit"    # a fork bomb: half a uid's process budget
    FAILFAST = "failfast"              # one rank failed; the others were stopped after a grace
    OUTPUT_LIMIT = "output_limit"      # a rank printed more than its limit
    PROTOCOL = "protocol"              # a rank broke the wire protocol (or the grader's code inside it)
    TRAFFIC_LIMIT = "traffic_limit"    # a rank sent, or left unread, more than the switch carries
    CANCELLED = "cancelled"            # the caller cancelled it (Runner.run_many's watch)
    GRADER_ERROR = "grader_error"      # the grader itself could not run it: not the student's fault


class Mode(_Word):
    """What a run is for."""
    SWITCH = "switch"   # graded: every operation goes through the supervisor's switch
    REAL = "real"       # torch's own backend (gloo / NCCL) between the run's ranks; they only report
    BENCH = "bench"     # time the student's function against a collective (processes/bench_rank.py)


class How(_Word):
    """How a rank's entry function ended, as the rank reported it."""
    RETURN = "return"
    RAISE = "raise"
    EXIT = "exit"              # sys.exit / SystemExit from the student's code
    LOAD_ERROR = "load_error"  # the submission could not be loaded (a syntax error, an import that failed)


@dataclass(frozen=True)
class BenchOptions:
    """A bench run's measurements: buffer sizes in bytes, the collective timed beside the student's function,
    and the bytes moved per measurement (its repetitions: budget / size, 1..20)."""
    sizes: tuple[int, ...]
    baseline: str
    budget: int


@dataclass(frozen=True)
class RunRequest:
    world_size: int
    source: str
    filename: str
    entry: str = "run_worker"             # the function each rank calls: entry(rank, world_size)
    quantities: tuple[str, ...] = ()      # what each rank reports: returned values or final locals
    backend: str = "gloo"                 # a real-backend run's backend: "gloo" or "nccl"
    perturb: tuple[str, ...] = ()         # operations (comm.OPS names) whose sent data the switch perturbs
    label: str = ""
    preload: tuple[str, ...] = ()         # torch modules the zygote imports before forking (StaticReport.torch_modules)
    time_scale: float = 1.0               # the run's wall and CPU limits times this (code that compiles)
    mode: Mode = Mode.SWITCH
    bench: BenchOptions | None = None     # Mode.BENCH: what to time
    files: dict = field(default_factory=dict)   # files written in each rank's working folder (%%writefile)
    cuda: bool = False                    # the ranks see the machine's GPUs (a graded run's CUDA tensors go
    #                                       through the switch by host copies; a real NCCL run needs them)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))   # a plain word ("real") is taken as its member
        if (self.mode is Mode.BENCH) != (self.bench is not None):
            raise ValueError("a bench run, and only a bench run, has bench options")

    def perturbs(self, op: str) -> bool:
        return op in self.perturb

    @property
    def real(self) -> bool:
        """torch's own backend carries the run (no switch)."""
        return self.mode is not Mode.SWITCH


@dataclass
class RankResult:
    """What a rank reported when its entry function ended (the supervisor checked every field's type)."""
    how: How
    error: dict | None = None       # {"type", "message", "frames": [{"line", "function", "text", "file"?}]}
    values: dict = field(default_factory=dict)   # quantity name -> its value as wire.value decoded it, or None
    source: str = "return"          # where the values came from: "return" (returned) or "locals" (final locals)
    returned_type: str = "?"        # the type of what the entry function returned

    def __post_init__(self) -> None:
        self.how = How(self.how)

    @property
    def returned(self) -> bool:
        return self.how is How.RETURN


@dataclass
class RankRecord:
    rank: int
    ready: bool = False
    calls: list[Call] = field(default_factory=list)     # every operation, as the switch measured it, in order
    inside: Call | None = None                          # the operation the rank waits on (the switch's word)
    snapshot: dict = field(default_factory=dict)        # entry-function tensors as of its last operation
    checks: list = field(default_factory=list)          # the student's own checks that failed (a perturbed run
    #                                                     records them): {"line", "values" as they stood there}
    checks_dropped: int = 0                             # failed checks past the supervisor's cap
    result: RankResult | None = None
    notes: list[str] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)   # real-backend runs: each call as the rank timed it
    last_started: dict | None = None                    # real-backend runs: the last call it started, as it said
    setup_error: str | None = None
    broken: str | None = None                           # what broke the grader's code inside the rank, after "ready"
    unread: bool = False                                # stopped: it left more answers unread than allowed
    out_of_memory: bool = False                         # the grader's code inside it ran out of memory (its limit)
    done: bool = False                                  # sent everything it will send
    exit: dict | None = None                            # {"code": n} or {"signal": n}
    output: bytearray = field(default_factory=bytearray)
    output_total: int = 0
    report_bytes: int = 0

    @property
    def finished(self) -> bool:
        return self.done or self.exit is not None

    @property
    def failed(self) -> bool:
        if self.result is not None:
            return not self.result.returned
        return self.exit is not None

    @property
    def how(self) -> How | None:
        """How its entry function ended; None: it never said."""
        return self.result.how if self.result is not None else None

    def output_text(self) -> str:
        return self.output.decode("utf-8", "replace")


@dataclass
class RunOutcome:
    request: RunRequest
    ranks: list[RankRecord]
    stop: Stop = Stop.COMPLETED
    stop_rank: int | None = None
    elapsed: float = 0.0
    error: str | None = None
    processes: int | None = None  # processes of the run's uids when it was stopped (root mode only)
    process_limit_hit: bool = False
    oom_killed: bool = False      # the kernel killed a rank of this run for the grader's total memory

    def __post_init__(self) -> None:
        self.stop = Stop(self.stop)
