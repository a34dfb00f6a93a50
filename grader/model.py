"""Results as plain dataclasses: what each check concluded, and the whole grading.

Messages are kept as catalog keys with their values (`Note`), and rendered in the reader's language
only when a report or results.json is written.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field



class Outcome(str, enum.Enum):
    """Why a check passed or failed (verify/outcomes.py decides how a rank ended, verify/kinds/ each check)."""
    PASS = "pass"
    NOT_SUBMITTED = "not_submitted"      # load problem: empty, not UTF-8, bad notebook ...
    SYNTAX_ERROR = "syntax_error"
    NO_ENTRY = "no_entry"                # no entry function (run_worker)
    NO_EXERCISE = "no_exercise"          # which exercise this is could not be told
    NOT_CALLED = "not_called"            # static: the collective is never reached
    TODO = "todo"                        # the stub's NotImplementedError
    LOAD_ERROR = "load_error"            # the definitions raised when loaded
    EXCEPTION = "exception"
    EARLY_EXIT = "early_exit"            # sys.exit / os._exit inside run_worker
    CRASH = "crash"                      # killed by a signal
    TIMEOUT = "timeout"
    DEADLOCK = "deadlock"
    MEMORY_LIMIT = "memory_limit"
    CPU_LIMIT = "cpu_limit"
    FILE_LIMIT = "file_limit"
    PROCESS_LIMIT = "process_limit"
    OUTPUT_LIMIT = "output_limit"
    TRAFFIC_LIMIT = "traffic_limit"      # more through the switch than a run allows
    PROTOCOL = "protocol"                # a rank sent the grader what no honest rank sends
    MISSING = "missing"                  # no value to check (nothing returned, no such local)
    BAD_TYPE = "bad_type"                # not a plain torch.Tensor
    WRONG = "wrong"                      # wrong shape, dtype or values
    NOT_COLLECTIVE = "not_collective"    # right numbers, but not derived from what the communication delivered
    FORBIDDEN = "forbidden"              # static: an operation the exercise does not allow
    REAL_BACKEND = "real_backend"        # passed through the switch, failed (or answered otherwise) on real gloo/NCCL
    GRADER_ERROR = "grader_error"


@dataclass(frozen=True)
class Words:
    """A message parameter that has its own words in each language (an exercise's labels and hints)."""
    zh: str
    en: str

    def __str__(self) -> str:
        return self.en


@dataclass(frozen=True)
class CellLines:
    """Lines of a notebook as its reader finds them: (cell from 1, every cell counted; line in that cell) each. A message
    parameter (feedback/lines.py puts it where a line of the joined code was): "cell 3, line 29"."""
    places: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Note:
    """One message: a catalog key and the values it is formatted with."""
    key: str
    params: dict = field(default_factory=dict)


@dataclass
class CheckResult:
    spec: object            # the exercise's Check (exercise/spec.py): results depend on no declaration module
    outcome: Outcome
    score: float = 0.0
    notes: list[Note] = field(default_factory=list)       # shown for every check (hidden ones: hints only)
    details: list[Note] = field(default_factory=list)     # per-rank specifics: visible checks only

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS


@dataclass
class GradingResult:
    submission: str
    checks: list[CheckResult]
    exercise: str = ""
    execution_time: float = 0.0
    summary: list[Note] = field(default_factory=list)     # shown above the checks
    teaching: list[Note] = field(default_factory=list)    # timings and ring volumes (visible run)
    layers: list[str] = field(default_factory=list)       # sandbox layers applied
    outputs: list[tuple[int, str, int]] = field(default_factory=list)  # visible run: (rank, kept text, total bytes)
    grader_error: str | None = None                       # traceback for staff; the grade is then 0
    runs: list[dict] = field(default_factory=list)        # for staff: how each run ended (never shown to students)
    staff: list[Note] = field(default_factory=list)       # for staff: an exercise's own code that failed (never shown to students)
    exercise_title: tuple[str, str] = ("", "")            # (zh, en), set by api.grade
    exercise_total: float = 0.0                           # the points of every check, hidden ones included
    entry: str = ""                                       # the exercise's entry function
    timeline: object = None                               # asked for (api.grade(timeline=True)): the visible
    #                                                       run as feedback/runview.RunView, sizes and times only

    @property
    def score(self) -> float:
        return sum(c.score for c in self.checks)

    @property
    def max_score(self) -> float:
        return sum(c.spec.points for c in self.checks)

    @property
    def all_passed(self) -> bool:
        return self.grader_error is None and bool(self.checks) and all(c.passed for c in self.checks)   # nothing graded: not passed
