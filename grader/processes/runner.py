"""Transport: start runs on the zygote, watch every rank's pipes, enforce limits, stop runs cleanly.

The supervisor never imports torch and never unpickles anything: ranks talk newline-delimited JSON.
Decisions here are about processes only (time, output, liveness); what the values mean is verify.py's.

    with Runner() as runner:
        outcomes = runner.run_many([RunRequest(world_size=2, source=..., filename=...), ...])
"""
from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import secrets

from . import launch
from .launch import BASE_PREFIX
from .protocol import Call
from .sandbox import Limits, MemoryCgroup, claim_uid_block, count_processes, default_total_mb, uid_range

FAILFAST_GRACE_S = 0.5   # after one rank fails, the others get this long to report
DEADLOCK_GRACE_S = 1.0   # all unfinished ranks inside collectives, one rank done, nothing moving
STOP_GRACE_S = 3.0       # SIGTERM to the run's leader (its pid 1, or the leader above it), then SIGKILL
PROCESS_CHECK_S = 0.5    # how often a run's processes are counted (a fork bomb stops within about this)
MAX_LINE = 80 << 20      # one protocol message (a tensor of protocol.MAX_ELEMENTS values, base64)
MAX_PROTOCOL = 96 << 20  # all protocol messages of one rank (values are capped at protocol.BUDGET_BYTES)




def _sweep_stale_bases() -> None:
    """Remove run folders of supervisors that died without cleaning up (their pid is in the name)."""
    for path in Path(tempfile.gettempdir()).glob(f"{BASE_PREFIX}*-*"):
        pid = path.name[len(BASE_PREFIX):].split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


class GraderError(RuntimeError):
    """The grader itself could not run (not the student's fault)."""


@dataclass
class RunRequest:
    world_size: int
    source: str
    filename: str
    entry: str = "run_worker"             # the function each rank calls: entry(rank, world_size)
    quantities: tuple[str, ...] = ()      # what each rank reports: returned values or final locals
    backend: str = "gloo"                 # "gloo" or "nccl"
    perturb: tuple[str, ...] = ()         # operations (comm.OPS names) whose sent data is perturbed
    label: str = ""
    preload: tuple[str, ...] = ()         # torch modules the zygote imports before forking (static.imports)
    mode: str = ""                        # "": grade; "bench:<json options>": time `entry` (bench_rank.py)

    def perturbs(self, op: str) -> bool:
        return op in self.perturb


@dataclass
class RankRecord:
    rank: int
    ready: bool = False
    calls: list[Call] = field(default_factory=list)     # every operation, in the order it was entered
    blocked: int | None = None                          # the operation the rank waits on (its seq)
    events: int = 0                                     # messages received so far (orders calls and completions)
    snapshot: dict = field(default_factory=dict)        # entry-function tensors as of its last operation
    result: dict | None = None
    notes: list[str] = field(default_factory=list)
    setup_error: str | None = None
    done: bool = False                                  # sent everything it will send
    exit: dict | None = None                            # {"code": n} or {"signal": n}
    output: bytearray = field(default_factory=bytearray)
    output_total: int = 0
    protocol_bytes: int = 0

    @property
    def finished(self) -> bool:
        return self.done or self.exit is not None

    @property
    def failed(self) -> bool:
        if self.result is not None:
            return self.result.get("how") != "return"
        return self.exit is not None

    def output_text(self) -> str:
        return self.output.decode("utf-8", "replace")

    @property
    def inside(self) -> Call | None:
        """The operation this rank is blocked in, if it is."""
        if self.blocked is None or self.blocked >= len(self.calls):
            return None
        call = self.calls[self.blocked]
        return None if call.completed else call


@dataclass
class RunOutcome:
    request: RunRequest
    ranks: list[RankRecord]
    stop: str = "completed"       # completed | timeout | deadlock | process_limit | failfast | output_limit | protocol | grader_error
    stop_rank: int | None = None
    elapsed: float = 0.0
    error: str | None = None
    seeds: dict = field(default_factory=dict)  # (rank, seq) -> seed of that call's deltas (perturbed runs)
    processes: int | None = None  # processes of the run's uid when it was stopped (root mode only)
    process_limit_hit: bool = False
    oom_killed: bool = False      # the kernel killed a rank of this run for the grader's total memory


def _p2p_can_progress(ranks: list[RankRecord]) -> bool:
    """Some pending send has a pending matching receive (or the reverse): the exchange may complete."""
    pending = [call for rec in ranks for call in rec.calls if not call.completed and call.op in ("send", "recv")]
    sends = {(c.rank, c.peer, c.tag) for c in pending if c.op == "send"}
    for c in pending:
        if c.op == "recv" and ((c.peer, c.rank, c.tag) in sends
                               or (c.peer is None and any(s[1] == c.rank for s in sends))):
            return True
    return False


class _Run:
    """One run in flight: its pipes, its leader's pidfd, its records."""

    def __init__(self, request: RunRequest, slot: int, workdir: Path, limits: Limits, uid: int | None):
        self.request, self.slot, self.workdir, self.limits, self.uid = request, slot, workdir, limits, uid
        self.outcome = RunOutcome(request, [RankRecord(r) for r in range(request.world_size)])
        self.buffers: dict[int, bytearray] = {}
        self.fd_role: dict[int, tuple[str, int]] = {}
        self.pending: dict[int, memoryview] = {}
        self.pidfd: int | None = None
        self.started = time.monotonic()
        self.last_progress = self.started
        self.failfast_at: float | None = None
        self.stopping_since: float | None = None
        self.leader_gone = False
        self.killed = False
        self.oom_before = 0
        self.processes_checked = self.started  # when the run's processes were last counted (fork bombs)
        self.spec_fd: dict[int, int] = {}   # rank -> write end of its control pipe (spec, then deltas)
        self.writing: set[int] = set()      # control pipes registered for writing

    def set_stop(self, reason: str, rank: int | None = None) -> None:
        if self.outcome.stop == "completed" and self.stopping_since is None:
            self.outcome.stop, self.outcome.stop_rank = reason, rank


class Runner:
    """Owns the zygote and every run's processes. Reuse one Runner for many submissions."""

    def __init__(self, *, limits: Limits | None = None, max_parallel: int = 9, sandbox: bool = True,
                 python: str | None = None):
        self.limits = limits or Limits()
        self.max_parallel = max_parallel
        self.use_sandbox = sandbox
        self.python = python or sys.executable
        self.conn: socket.socket | None = None
        self.proc: subprocess.Popen | launch.Forked | None = None
        self.hello: dict | None = None
        _sweep_stale_bases()
        early = launch.adopt(self.python)   # a zygote this process started before its imports
        self.base = early[0] if early is not None else launch.new_base()
        self._ids = 0
        self._sel = None
        # Rank uids: a block of this process's own (no other live grader, batch workers included, holds it),
        # and a new uid from it for every run, never reused while this Runner lives (up to UID_BLOCK runs).
        self.uid_block, self._uid_claim = claim_uid_block() if sandbox and os.geteuid() == 0 else (None, None)
        self._uids = 0
        self.cgroup: MemoryCgroup | None = None
        if sandbox and os.geteuid() == 0:
            self.cgroup = MemoryCgroup.create(f"grader-{os.getpid()}-{id(self) % 10000}",
                                              self.limits.total_mb or default_total_mb())
        self.start(early[1:] if early is not None else None)

    # -- zygote -------------------------------------------------------------------------------
    def start(self, started=None) -> None:
        """Start the zygote without waiting for it: its torch import overlaps the supervisor's work.
        `started`: (process, socket) of one launch.prestart() began (a process, or a launch.Forked)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:   # a zygote that died: reaped, and its socket closed
            launch.stop_zygote(self.proc)
            self.conn.close()
        self.proc, self.conn = started if started is not None else launch.zygote(self.base, self.python)
        self.hello = None

    def _ready(self) -> dict:
        if self.hello is None:
            self.conn.settimeout(120)
            try:
                data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, 1)
            except (socket.timeout, OSError) as err:
                raise GraderError(f"zygote did not start: {err}; see {self.base / 'zygote.log'}") from err
            if not data and isinstance(self.proc, launch.Forked):  # the batch's template is gone: start cold
                self.conn.close()
                self.proc = None
                self.start()
                return self._ready()
            if not data:
                raise GraderError(f"zygote exited at start-up; see {self.base / 'zygote.log'}: "
                                  + self._zygote_log_tail())
            self.hello = json.loads(data)
            if fds and isinstance(self.proc, launch.Forked):
                self.proc.attach(self.hello["pid"], fds.pop())
            for fd in fds:
                os.close(fd)
            self.conn.settimeout(30)
        return self.hello

    def _zygote_log_tail(self) -> str:
        try:
            return (self.base / "zygote.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    @property
    def layers(self) -> dict:
        return self._ready()["layers"]

    @property
    def gpus(self) -> int:
        return self._ready()["gpus"]

    def next_uid(self) -> int:
        low, high = uid_range(self.uid_block)
        uid = low + self._uids % (high - low)
        self._uids += 1
        return uid

    def layer_names(self) -> list[str]:
        """The layers each run gets here, as catalog ids; seccomp and NO_NEW_PRIVS are named when missing."""
        from .sandbox import Layers
        lay, on = self.layers, self.use_sandbox
        layers = Layers(root=lay["root"] and on, namespaces=lay["namespaces"] and on,
                        user_namespace=lay["user_namespace"] and on, seccomp=lay.get("seccomp", False) and on,
                        no_new_privs=lay.get("no_new_privs", False) and on)
        names = layers.names(self.limits.tmp_mb)
        if self.cgroup is not None:
            names.append(f"memory_cgroup:{self.cgroup.limit_mb}")
        return names

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            launch.stop_zygote(self.proc)
            self.proc = None
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self._uid_claim is not None:
            self._uid_claim.close()
            self._uid_claim = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------
    def run_many(self, requests: list[RunRequest]) -> list[RunOutcome]:
        """Run every request (up to max_parallel at once) and return their outcomes, in order."""
        self._ready()
        queue = list(enumerate(requests))
        results: dict[int, RunOutcome] = {}
        active: dict[int, tuple[int, _Run]] = {}
        free_slots = list(range(self.max_parallel))
        sel = self._sel = selectors.DefaultSelector()
        try:
            while queue or active:
                while queue and free_slots:
                    index, request = queue.pop(0)
                    slot = free_slots.pop(0)
                    try:
                        run = self._launch(request, slot, sel)
                    except GraderError as err:
                        outcome = RunOutcome(request, [RankRecord(r) for r in range(request.world_size)],
                                             stop="grader_error", error=str(err))
                        results[index] = outcome
                        free_slots.append(slot)
                        continue
                    active[id(run)] = (index, run)
                self._pump(sel, [run for _, run in active.values()])
                for key, (index, run) in list(active.items()):
                    if run.leader_gone:
                        self._drain(run)
                        self._finish(run, sel)
                        results[index] = run.outcome
                        free_slots.append(run.slot)
                        del active[key]
        finally:
            for _, run in active.values():
                self._kill(run, signal.SIGKILL)
                self._finish(run, sel)
            sel.close()
            self._sel = None
        return [results[i] for i in range(len(requests))]

    def _launch(self, request: RunRequest, slot: int, sel) -> _Run:
        layers = self._ready()["layers"]
        namespaces = layers["namespaces"] and self.use_sandbox
        drop = layers["root"] and self.use_sandbox and self.uid_block is not None
        uid = self.next_uid() if drop else None
        # With namespaces: the mount point of the run's new root (its /tmp is a tmpfs in there). Without:
        # the ranks' working folder itself, on the host's disk.
        workdir = Path(tempfile.mkdtemp(prefix=f"run{slot}-", dir=self.base))
        if uid is not None and not namespaces:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        run = _Run(request, slot, workdir, self.limits, uid)
        cwd = "/tmp" if namespaces else str(workdir)
        # The rendezvous store. In the run's own network namespace: a TCPStore that the run's pid 1 hosts on loopback
        # (no file locks, so the seccomp filter can deny them; the port is free, the namespace is the run's).
        # Without one: a FileStore in the run's folder (no port, so no clash between runs).
        store = ({"kind": "tcp", "host": "127.0.0.1", "port": random.randrange(20000, 32000)} if namespaces
                 else {"kind": "file", "path": f"{cwd}/.store"})
        send_fds, keep = [], []
        for r in range(request.world_size):
            spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
            res_r, res_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            send_fds += [spec_r, res_w, out_w]
            for fd in (spec_w, res_r, out_r):
                os.set_blocking(fd, False)
            spec = {"rank": r, "world_size": request.world_size, "source": request.source,
                    "filename": request.filename, "entry": request.entry, "quantities": list(request.quantities),
                    "backend": request.backend, "perturb": bool(request.perturb), "mode": request.mode,
                    "store": store, "timeout": self.limits.wall_s}
            run.pending[spec_w] = memoryview((json.dumps(spec) + "\n").encode())
            run.spec_fd[r] = spec_w
            run.fd_role.update({spec_w: ("spec", r), res_r: ("result", r), out_r: ("output", r)})
            keep += [spec_w, res_r, out_r]
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(status_r, False)
        send_fds.append(status_w)
        run.fd_role[status_r] = ("status", -1)
        self._ids += 1
        req = {"id": self._ids, "world_size": request.world_size, "uid": uid, "cwd": cwd,
               "workdir": str(workdir), "namespaces": namespaces, "user_namespace": layers["user_namespace"],
               "seccomp": layers.get("seccomp", False) and self.use_sandbox, "store": store,
               "no_new_privs": layers.get("no_new_privs", False) and self.use_sandbox,
               "limits": asdict(self.limits), "cuda": request.backend == "nccl",
               "cgroup": self.cgroup.procs if self.cgroup is not None else None, "preload": list(request.preload)}
        try:
            socket.send_fds(self.conn, [json.dumps(req).encode()], send_fds)
            data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, 1)
            if not data or not fds:
                raise GraderError("zygote closed the connection")
        except (OSError, GraderError) as err:
            for fd in send_fds + keep:
                os.close(fd)
            self.start()  # a fresh zygote for the next run
            raise GraderError(f"could not start a run: {err}") from err
        for fd in send_fds:
            os.close(fd)
        run.pidfd = fds[0]
        run.started = run.last_progress = time.monotonic()
        run.oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        for fd, (role, _) in run.fd_role.items():
            sel.register(fd, selectors.EVENT_WRITE if role == "spec" else selectors.EVENT_READ, run)
            if role == "spec":
                run.writing.add(fd)
        sel.register(run.pidfd, selectors.EVENT_READ, run)
        return run

    # -- event loop -----------------------------------------------------------------------------
    def _pump(self, sel, runs: list[_Run]) -> None:
        now = time.monotonic()
        deadline = min((self._next_deadline(run) for run in runs), default=now + 0.1)
        timeout = max(0.005, min(deadline - now, 0.25))
        for key, events in sel.select(timeout):
            run: _Run = key.data
            fd = key.fd
            if fd == run.pidfd:
                run.leader_gone = True
                sel.unregister(fd)
                continue
            role, r = run.fd_role[fd]
            if role == "spec":
                self._write_spec(run, fd, sel)
            else:
                self._read(run, fd, role, r, sel)
        now = time.monotonic()
        for run in runs:
            self._police(run, now)

    def _write_spec(self, run: _Run, fd: int, sel) -> None:
        data = run.pending.get(fd)
        try:
            n = os.write(fd, data) if data else 0
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the rank is gone
            n = len(data or b"")
        data = data[n:] if data else None
        if data:
            run.pending[fd] = data
        else:
            run.pending.pop(fd, None)
            sel.unregister(fd)  # kept open: the rank waits for its EOF, i.e. for the end of the run
            run.writing.discard(fd)

    def _send_control(self, run: _Run, rank: int, message: dict) -> None:
        fd = run.spec_fd.get(rank)
        if fd is None or fd not in run.fd_role:
            return
        line = (json.dumps(message) + "\n").encode()
        run.pending[fd] = memoryview(bytes(run.pending.get(fd, b"")) + line)
        if fd not in run.writing and self._sel is not None:
            self._sel.register(fd, selectors.EVENT_WRITE, run)
            run.writing.add(fd)

    def _answer_seed(self, run: _Run, rank: int, call: Call) -> None:
        """A rank entered an operation that sends data in a perturbed run: answer with a fresh seed for
        this call's deltas, or none when this operation is not perturbed (see verify/perturb.py). The
        seeds never leave the supervisor before their operation runs."""
        seed = secrets.randbits(62) if run.request.perturbs(call.op) else None
        if seed is not None:
            run.outcome.seeds[(rank, call.seq)] = seed
            call.seed = seed
        self._send_control(run, rank, {"seq": call.seq, "seed": seed})

    def _read(self, run: _Run, fd: int, role: str, r: int, sel) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(fd)
            os.close(fd)
            del run.fd_role[fd]
            return
        self._feed(run, fd, role, r, chunk)

    def _handle(self, run: _Run, role: str, r: int, msg: dict) -> None:
        run.last_progress = time.monotonic()
        kind = msg.get("t")
        if role == "status":
            if kind == "exit" and isinstance(msg.get("rank"), int) and 0 <= msg["rank"] < len(run.outcome.ranks):
                record = run.outcome.ranks[msg["rank"]]
                record.exit = {k: msg[k] for k in ("code", "signal") if k in msg}
                if record.result is None and run.failfast_at is None:
                    run.failfast_at = time.monotonic() + FAILFAST_GRACE_S
            elif kind == "leader_error":
                run.outcome.error = f"sandbox could not be set up: {msg.get('error')}"
                run.set_stop("grader_error")
            return
        record = run.outcome.ranks[r]
        record.events += 1
        if kind == "call":
            try:
                call = Call.from_message(msg)
            except (KeyError, TypeError, ValueError):
                self._abort(run, "protocol", r)
                return
            if call.seq != len(record.calls):
                self._abort(run, "protocol", r)
                return
            call.rank, call.entered_at = r, record.events
            record.calls.append(call)
            if run.request.perturb and call.sends:
                self._answer_seed(run, r, call)
        elif kind in ("complete", "wait"):
            seq = msg.get("seq")
            if not isinstance(seq, int) or not 0 <= seq < len(record.calls):
                return
            call = record.calls[seq]
            if kind == "complete":
                call.complete(msg)
                call.completed_at = record.events
                if record.blocked == seq:
                    record.blocked = None
            else:
                call.waited = True
                if not call.completed:
                    record.blocked = seq
        elif kind == "snap":
            if isinstance(msg.get("locals"), dict):
                record.snapshot.update(msg["locals"])
        elif kind == "ready":
            record.ready = True
        elif kind == "note":
            record.notes.append(str(msg.get("what")))
        elif kind == "result" and record.result is None:
            record.result = msg
            record.blocked = None
            if msg.get("how") != "return" and run.failfast_at is None:
                run.failfast_at = time.monotonic() + FAILFAST_GRACE_S
        elif kind == "setup_error":
            record.setup_error = str(msg.get("error"))
            run.outcome.error = f"rank {r}: {record.setup_error}"
            run.set_stop("grader_error", r)
        elif kind == "end":
            record.done = True

    def _next_deadline(self, run: _Run) -> float:
        times = [run.started + run.limits.wall_s]
        if self._stuck(run):
            times.append(run.last_progress + DEADLOCK_GRACE_S)
        if run.failfast_at is not None:
            times.append(run.failfast_at)
        if run.stopping_since is not None:
            times.append(run.stopping_since + STOP_GRACE_S)
        return min(times)

    def _police(self, run: _Run, now: float) -> None:
        if run.stopping_since is not None:
            if not run.killed and now - run.stopping_since > STOP_GRACE_S:
                self._kill(run, signal.SIGKILL)
            return
        ranks = run.outcome.ranks
        if run.outcome.stop != "completed":
            self._stop(run)
        elif all(rec.finished for rec in ranks):
            self._stop(run)
        elif now - run.started > run.limits.wall_s:
            run.set_stop("timeout")
            self._stop(run)
        elif self._fork_bomb(run, now):
            run.set_stop("process_limit")
            self._stop(run)
        elif run.failfast_at is not None and now >= run.failfast_at:
            run.set_stop("failfast", next((rec.rank for rec in ranks if rec.failed), None))
            self._stop(run)
        elif self._stuck(run) and now - run.last_progress > DEADLOCK_GRACE_S:
            run.set_stop("deadlock")
            self._stop(run)

    @staticmethod
    def _fork_bomb(run: _Run, now: float) -> bool:
        """Half the uid's process budget in processes (not threads): a fork bomb. Counted twice a second, so
        it stops in about a second instead of spinning until the time limit (root mode only: the count is by
        the run's own uid)."""
        if run.uid is None or now - run.processes_checked < PROCESS_CHECK_S:
            return False
        run.processes_checked = now
        count = count_processes(run.uid)
        if count < run.limits.processes // 2:
            return False
        run.outcome.processes, run.outcome.process_limit_hit = count, True
        return True

    @staticmethod
    def _stuck(run: _Run) -> bool:
        """Every unfinished rank waits on an operation that cannot complete: some rank has finished, the
        ranks wait in different collectives (all_reduce on one, all_gather on another), or every rank
        waits on point-to-point operations none of which the others' pending operations can match
        (every rank blocked in a send, say: gloo does not buffer sends)."""
        ranks = run.outcome.ranks
        if not all(rec.finished or rec.inside is not None for rec in ranks):
            return False
        waiting = [rec.inside for rec in ranks if not rec.finished]
        if any(rec.finished for rec in ranks):
            return True
        if all(call.op in ("send", "recv") for call in waiting):
            return not _p2p_can_progress(ranks)
        return len({(call.op, call.method, call.group) for call in waiting}) > 1

    def _stop(self, run: _Run) -> None:
        if run.stopping_since is None:
            run.stopping_since = time.monotonic()
            run.outcome.elapsed = run.stopping_since - run.started
            if run.uid is not None and run.outcome.stop not in ("completed", "process_limit"):
                run.outcome.processes = count_processes(run.uid)
                run.outcome.process_limit_hit = run.outcome.processes >= run.limits.processes // 2
            self._kill(run, signal.SIGTERM)

    def _kill(self, run: _Run, sig: int) -> None:
        if sig == signal.SIGKILL:
            run.killed = True
        if run.pidfd is not None and not run.leader_gone:
            try:
                signal.pidfd_send_signal(run.pidfd, sig)
            except ProcessLookupError:
                pass

    def _drain(self, run: _Run) -> None:
        """After the leader is gone: read what the pipes still hold (bounded), without waiting."""
        for fd, (role, r) in list(run.fd_role.items()):
            if role in ("result", "output", "status"):
                for _ in range(64):
                    if fd not in run.fd_role:
                        break
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        chunk = b""
                    if not chunk:
                        break
                    self._feed(run, fd, role, r, chunk)

    def _feed(self, run: _Run, fd: int, role: str, r: int, chunk: bytes) -> None:
        """Take in what a rank wrote: output is kept up to a cap and counted; protocol lines are parsed."""
        if role == "output":
            record = run.outcome.ranks[r]
            record.output_total += len(chunk)
            room = run.limits.output_keep_kb * 1024 - len(record.output)
            if room > 0:
                record.output += chunk[:room]
            if record.output_total > run.limits.output_max_mb << 20:
                self._abort(run, "output_limit", r)
            return
        buf = run.buffers.setdefault(fd, bytearray())
        scanned = len(buf)  # no newline before here: a long line is scanned once, not once per chunk
        buf += chunk
        if role == "result":
            run.outcome.ranks[r].protocol_bytes += len(chunk)
            if run.outcome.ranks[r].protocol_bytes > MAX_PROTOCOL:
                self._abort(run, "protocol", r)
                return
        while (nl := buf.find(b"\n", scanned)) >= 0:
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            scanned = 0
            try:
                message = json.loads(line)
            except ValueError:
                if role == "result":
                    self._abort(run, "protocol", r)
                continue
            if isinstance(message, dict):
                self._handle(run, role, r, message)
        if len(buf) > MAX_LINE:
            buf.clear()
            self._abort(run, "protocol", r)

    def _abort(self, run: _Run, reason: str, rank: int) -> None:
        run.set_stop(reason, rank)
        self._stop(run)

    def _finish(self, run: _Run, sel) -> None:
        if run.stopping_since is None:
            run.outcome.elapsed = time.monotonic() - run.started
        if self.cgroup is not None and self.cgroup.oom_kills() > run.oom_before:
            run.outcome.oom_killed = True
        for fd in list(run.fd_role):
            try:
                sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        run.fd_role.clear()
        for fd in list(run.pending):
            run.pending.pop(fd)
        if run.pidfd is not None:
            try:
                sel.unregister(run.pidfd)
            except (KeyError, ValueError):
                pass
            os.close(run.pidfd)
            run.pidfd = None
        if run.outcome.stop == "completed" and not all(rec.finished for rec in run.outcome.ranks):
            run.outcome.stop = "grader_error"
            run.outcome.error = run.outcome.error or "the run ended before every rank reported"
        shutil.rmtree(run.workdir, ignore_errors=True)
