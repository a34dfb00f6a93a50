"""Transport: start runs on the zygote, carry every rank's frames, host each graded run's switch, enforce
limits, stop runs cleanly.

The supervisor never imports torch and never unpickles anything. Each rank has one socket to it (frames of
wire.py) and a pipe for its output. In a graded run (Mode.SWITCH) every operation a rank starts goes to the
run's switch.Switch, which pairs, perturbs, computes and answers it: the supervisor is the only channel
between the ranks. A real-backend run (Mode.REAL) and a bench run (Mode.BENCH) run torch's own gloo / NCCL
between ranks that share the run's network; their ranks only report to the supervisor. Decisions here are
about processes only (time, output, liveness, deadlock); what the values mean is verify's.

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
from dataclasses import asdict, replace
from pathlib import Path

from .. import wire
from ..records import How, Mode, RankRecord, RankResult, RunOutcome, RunRequest, Stop
from ..submission import compiled
from ..switch import MAX_OPS, MAX_OUTPUT, ProtocolError, Switch, TrafficLimit
from . import launch
from .launch import BASE_PREFIX
from .sandbox import Limits, MemoryCgroup, claim_uid_block, default_total_mb, processes_by_uid, uid_budget, uid_range

FAILFAST_GRACE_S = 0.5   # after one rank fails, the others get this long to report (less if they cannot move)
DEADLOCK_GRACE_S = 0.25  # every live rank waits on an operation the switch cannot complete, nothing arrives
STOP_GRACE_S = 3.0       # SIGTERM to the run's leader (its pid 1, or the leader above it), then SIGKILL
PROCESS_CHECK_S = 0.1    # how often a run's processes are counted (one walk of /proc serves every run in flight:
#                          Runner._processes): a fork bomb's processes spin on every core until it is counted
MAX_REPORTS = 128 << 20  # what one rank may send besides its operations: answers (values.BUDGET_BYTES), snapshots
#                          (values.SNAPSHOT_BYTES) and the frames around them (MAX_OPS snapshots at most)
MAX_SNAPSHOT_NAMES = 512  # locals a rank's snapshot keeps (the entry function's, as it enters an operation)
MAX_CHECKS = 16           # failed checks of the student's own a rank's record keeps, with their values
MAX_UNREAD = MAX_OUTPUT + (8 << 20)   # what the switch may owe a rank that has not read it (its reader reads
                                      # at once: more is a rank that stopped reading, and it is stopped)
READ_CHUNK = 1 << 18


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


class _Run:
    """One run in flight: its sockets and pipes, its leader's pidfd, its switch, its records."""

    def __init__(self, request: RunRequest, slot: int, workdir: Path, limits: Limits, uids: list[int] | None):
        self.request, self.slot, self.workdir, self.limits, self.uids = request, slot, workdir, limits, uids
        self.outcome = RunOutcome(request, [RankRecord(r) for r in range(request.world_size)])
        self.switch = Switch(request.world_size, request.perturb) if not request.real else None
        if self.switch is not None:
            for record, calls in zip(self.outcome.ranks, self.switch.calls):
                record.calls = calls
        self.readers: dict[int, wire.FrameReader] = {}
        self.lines: dict[int, bytearray] = {}           # the status pipe: JSON lines from the run's pid 1
        self.fd_role: dict[int, tuple[str, int]] = {}
        self.channel: dict[int, int] = {}               # rank -> its socket
        self.pending: dict[int, list] = {}              # socket -> buffers still to write
        self.pidfd: int | None = None   # its leader's pidfd; a pod's run: its socket to the pod (zygote.Pods)
        self.pod = False
        self.zid = 0                     # the zygote's id of the run
        self.started = time.monotonic()
        self.last_progress = self.started
        self.failfast_at: float | None = None
        self.stopping_since: float | None = None
        self.leader_gone = False
        self.killed = False
        self.oom_before = 0
        self.processes_checked = self.started  # when the run's processes were last counted (fork bombs)

    def set_stop(self, reason: Stop, rank: int | None = None) -> None:
        if self.outcome.stop == Stop.COMPLETED and self.stopping_since is None:
            self.outcome.stop, self.outcome.stop_rank = reason, rank


def _bomb_threshold(run: _Run) -> int:
    """Processes of one uid that make a fork bomb: half its budget, which is every rank's that shares the uid
    (one uid for all the ranks of a real NCCL run: sandbox.uid_budget)."""
    return uid_budget(run.limits, run.uids) // 2


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
        self._compiled: dict[tuple, bytes | None] = {}   # _code's, a few submissions' worth
        self._sel = None
        self._process_counts: tuple[float | None, dict] = (None, {})   # (when, {uid: processes}): _processes
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
    def start(self, started=None, cold: bool = False) -> None:
        """Start the zygote without waiting for it: its torch import overlaps the supervisor's work.
        `started`: (process, socket) of one launch.prestart() began (a process, or a launch.Forked).
        `cold`: never a template's fork (the template would not or could not fork one)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:   # a zygote that died: reaped, and its socket closed
            launch.stop_zygote(self.proc)
            self.conn.close()
        self.proc, self.conn = started if started is not None else \
            launch.start_zygote(self.base, self.python, template=not cold)
        self.hello = None

    def _ready(self) -> dict:
        if self.hello is None:
            self.conn.settimeout(120)
            try:
                data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, 1)
            except (socket.timeout, OSError) as err:
                raise GraderError(f"zygote did not start: {err}; see {self.base / 'zygote.log'}") from err
            if not data and isinstance(self.proc, launch.Forked):  # no template forked one: start cold
                self.conn.close()
                self.proc = None
                self.start(cold=True)
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
    def run_many(self, requests: list[RunRequest], watch=None, parallel: int | None = None) -> list[RunOutcome]:
        """Run every request (up to max_parallel at once, or `parallel`) and return their outcomes, in order.
        `watch(index, outcome)`, called as each run ends, may return indices of runs to cancel (stopped,
        or never started: their outcome says "cancelled") and requests to start too (their outcomes follow
        those of `requests`, in the order they were asked for)."""
        self._ready()
        requests = list(requests)
        queue = list(enumerate(requests))
        results: dict[int, RunOutcome] = {}
        active: dict[int, tuple[int, _Run]] = {}
        free_slots = list(range(min(self.max_parallel, parallel or self.max_parallel)))
        sel = self._sel = selectors.DefaultSelector()

        def react(answer) -> None:
            for item in answer or ():
                if isinstance(item, RunRequest):
                    requests.append(item)
                    queue.append((len(requests) - 1, item))
                else:
                    cancel(item)

        def cancel(i: int) -> None:
            if i in results:
                return
            waiting = next((item for item in queue if item[0] == i), None)
            if waiting is not None:
                queue.remove(waiting)
                results[i] = RunOutcome(requests[i], [RankRecord(r) for r in range(requests[i].world_size)],
                                        stop=Stop.CANCELLED)
            for index, run in active.values():
                if index == i:
                    run.set_stop(Stop.CANCELLED)
                    self._stop(run)
        try:
            while queue or active:
                while queue and free_slots:
                    index, request = queue.pop(0)
                    slot = free_slots.pop(0)
                    try:
                        run = self._launch(request, slot, sel)
                    except GraderError as err:
                        results[index] = RunOutcome(request, [RankRecord(r) for r in range(request.world_size)],
                                                    stop=Stop.GRADER_ERROR, error=str(err))
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
                        if watch is not None:
                            react(watch(index, run.outcome))
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
        # A uid for each rank (no rank can signal, trace or read another, or see it in /proc); one for all the
        # ranks of a real NCCL run (its shared memory between them).
        uids = None
        if drop:
            uids = [self.next_uid() for _ in range(request.world_size)] if not request.cuda or not request.real \
                else [self.next_uid()] * request.world_size
        # With namespaces: the mount point of the run's new root (its /tmp is a tmpfs in there). Without:
        # the ranks' working folder itself, on the host's disk.
        workdir = Path(tempfile.mkdtemp(prefix=f"run{slot}-", dir=self.base))
        if uids is not None and not namespaces:
            os.chown(workdir, uids[0], uids[0])
        os.chmod(workdir, 0o700 if namespaces or uids is None else 0o711)
        limits = self.limits if request.time_scale == 1.0 else replace(
            self.limits, wall_s=self.limits.wall_s * request.time_scale, cpu_s=int(self.limits.cpu_s * request.time_scale))
        run = _Run(request, slot, workdir, limits, uids)
        cwd = "/tmp" if namespaces else str(workdir)
        # A real-backend run's rendezvous store. In the run's own network namespace: a TCPStore that the
        # run's pid 1 hosts on loopback (no file locks, so the seccomp filter can deny them; the port is free,
        # the namespace is the run's). Without one: a FileStore in the run's folder. A graded run has none.
        store = None
        if request.real:
            store = ({"kind": "tcp", "host": "127.0.0.1", "port": random.randrange(20000, 32000)} if namespaces
                     else {"kind": "file", "path": f"{cwd}/.store"})
        mode = request.mode
        record = bool(request.perturb) and compiled.recorded(request.source, request.filename)
        code = self._code(request, record) if mode is Mode.SWITCH else None
        bench = asdict(request.bench) if request.bench is not None else None
        send_fds, keep = [], []
        for r in range(request.world_size):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            mine.setblocking(False)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(out_r, False)
            chan = mine.detach()
            send_fds += [theirs.detach(), out_w]
            spec = {"t": "spec", "rank": r, "world_size": request.world_size, "source": request.source,
                    "code": 0 if code is not None else None, "code_magic": compiled.MAGIC,
                    "filename": request.filename, "entry": request.entry, "quantities": list(request.quantities),
                    "backend": request.backend, "mode": mode, "bench": bench, "store": store, "timeout": limits.wall_s,
                    "files": dict(request.files),
                    # a perturbed run records the student's own failed checks and goes on (rank.py): its data
                    # fails them by design; every other run raises, as Python does
                    "checks": "record" if record else "raise"}
            run.pending[chan] = wire.pack(spec, [code] if code is not None else [])
            run.channel[r] = chan
            run.readers[chan] = wire.FrameReader()
            run.fd_role.update({chan: ("chan", r), out_r: ("output", r)})
            keep += [chan, out_r]
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(status_r, False)
        send_fds.append(status_w)
        run.fd_role[status_r] = ("status", -1)
        run.lines[status_r] = bytearray()
        self._ids += 1
        req = {"id": self._ids, "world_size": request.world_size, "uids": uids, "cwd": cwd, "mode": mode,
               "workdir": str(workdir), "namespaces": namespaces, "user_namespace": layers["user_namespace"],
               "seccomp": layers.get("seccomp", False) and self.use_sandbox, "store": store,
               "no_new_privs": layers.get("no_new_privs", False) and self.use_sandbox,
               "limits": asdict(limits), "cuda": request.cuda,
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
        run.pidfd, run.zid = fds[0], self._ids
        for fd in fds[1:]:
            os.close(fd)
        try:
            run.pod = json.loads(data).get("pod") is True
        except (ValueError, AttributeError):
            pass
        run.started = run.last_progress = time.monotonic()
        run.oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        for fd, (role, _) in run.fd_role.items():
            sel.register(fd, selectors.EVENT_READ | (selectors.EVENT_WRITE if fd in run.pending else 0), run)
        sel.register(run.pidfd, selectors.EVENT_READ, run)
        return run

    def _code(self, request: RunRequest, record: bool) -> bytes | None:
        """The submission as its ranks execute it (compiled.py), made once per source and mode (`record`: its
        failed checks recorded); None for a zygote of another interpreter (its ranks compile for themselves)
        or what cannot be compiled."""
        if self.python != sys.executable:
            return None
        key = (request.source, request.filename, record)
        if key not in self._compiled:
            if len(self._compiled) >= 8:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = compiled.rank_bytes(request.source, request.filename, record)
        return self._compiled[key]

    # -- event loop -----------------------------------------------------------------------------
    def _pump(self, sel, runs: list[_Run]) -> None:
        now = time.monotonic()
        deadline = min((self._next_deadline(run) for run in runs), default=now + 0.1)
        timeout = max(0.002, min(deadline - now, 0.25))
        for key, events in sel.select(timeout):
            run: _Run = key.data
            fd = key.fd
            if fd == run.pidfd:
                run.leader_gone = True
                sel.unregister(fd)
                continue
            if fd not in run.fd_role:
                continue
            role, r = run.fd_role[fd]
            if events & selectors.EVENT_WRITE:
                self._flush(run, fd)
            if events & selectors.EVENT_READ and fd in run.fd_role:
                self._read(run, fd, role, r, sel)
        now = time.monotonic()
        for run in runs:
            self._police(run, now)

    def _watch_writes(self, run: _Run, fd: int) -> None:
        if self._sel is not None and fd in run.fd_role:
            self._sel.modify(fd, selectors.EVENT_READ | (selectors.EVENT_WRITE if run.pending.get(fd) else 0), run)

    def _flush(self, run: _Run, fd: int) -> None:
        """Write what a rank's socket can take now (never blocking: the other runs go on meanwhile)."""
        buffers = run.pending.get(fd)
        while buffers:
            try:
                sent = os.writev(fd, buffers[:512])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the rank is gone: what it was owed is moot
                buffers.clear()
                break
            while buffers and sent >= len(buffers[0]):
                sent -= len(buffers[0])
                buffers.pop(0)
            if buffers and sent:
                buffers[0] = memoryview(buffers[0])[sent:]
        if not buffers:
            run.pending.pop(fd, None)
        self._watch_writes(run, fd)

    def _send(self, run: _Run, rank: int, frame: list) -> None:
        fd = run.channel.get(rank)
        if fd is None or fd not in run.fd_role:
            return
        run.pending.setdefault(fd, []).extend(frame)
        self._flush(run, fd)
        if sum(len(b) for b in run.pending.get(fd, ())) > MAX_UNREAD and run.outcome.stop == Stop.COMPLETED:
            run.outcome.ranks[rank].unread = True
            run.pending.pop(fd, None)
            self._abort(run, Stop.TRAFFIC_LIMIT, rank)

    def _read(self, run: _Run, fd: int, role: str, r: int, sel) -> None:
        chunk = _read_chunk(fd)
        if chunk is None:
            return
        if not chunk:
            sel.unregister(fd)
            os.close(fd)
            del run.fd_role[fd]
            run.pending.pop(fd, None)
            if role == "chan" and run.switch is not None:
                run.switch.finish(r)
            return
        self._feed(run, fd, role, r, chunk)

    def _feed(self, run: _Run, fd: int, role: str, r: int, chunk: bytes) -> None:
        """Take in what a rank wrote: output is kept up to a cap and counted; frames are parsed and handled."""
        if role == "output":
            record = run.outcome.ranks[r]
            record.output_total += len(chunk)
            room = run.limits.output_keep_kb * 1024 - len(record.output)
            if room > 0:
                record.output += chunk[:room]
            if record.output_total > run.limits.output_max_mb << 20:
                self._abort(run, Stop.OUTPUT_LIMIT, r)
            return
        if role == "status":
            buf = run.lines[fd]
            buf += chunk
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    self._status(run, message)
            return
        reader = run.readers.get(fd)
        if reader is None:   # this rank broke the protocol: nothing more it says is read
            return
        try:
            frames = reader.feed(chunk)
        except wire.WireError:
            del run.readers[fd]
            self._abort(run, Stop.PROTOCOL, r)
            return
        for header, blobs in frames:
            try:
                self._handle(run, r, header, blobs)
            except (ProtocolError, wire.WireError, TrafficLimit) as err:
                run.readers.pop(fd, None)
                self._abort(run, Stop.TRAFFIC_LIMIT if isinstance(err, TrafficLimit) else Stop.PROTOCOL, r)
                break
        if run.switch is not None:
            self._deliver(run)

    def _deliver(self, run: _Run) -> None:
        """What the switch owes the ranks, and where each rank now waits."""
        outbox, run.switch.outbox = run.switch.outbox, []
        for rank, frame in outbox:
            self._send(run, rank, frame)
        for record in run.outcome.ranks:
            record.inside = run.switch.waiting_on(record.rank)

    def _status(self, run: _Run, msg: dict) -> None:
        """What the run's pid 1 says: how each rank ended, or that the sandbox could not be built."""
        kind = msg.get("t")
        if kind == "exit" and isinstance(msg.get("rank"), int) and 0 <= msg["rank"] < len(run.outcome.ranks):
            record = run.outcome.ranks[msg["rank"]]
            record.exit = {k: msg[k] for k in ("code", "signal") if k in msg}
            if run.switch is not None:
                run.switch.finish(record.rank)
                self._deliver(run)
            if record.result is None and run.failfast_at is None:
                run.failfast_at = time.monotonic() + FAILFAST_GRACE_S
        elif kind == "leader_error":
            run.outcome.error = f"sandbox could not be set up: {msg.get('error')}"
            run.set_stop(Stop.GRADER_ERROR)

    def _handle(self, run: _Run, r: int, header: dict, blobs: list) -> None:
        run.last_progress = time.monotonic()
        record = run.outcome.ranks[r]
        kind = header.get("t")
        if kind in ("op", "wait"):
            if run.switch is None:
                raise ProtocolError("operations outside a graded run")
            run.switch.receive(r, header, blobs)
            return
        record.report_bytes += sum(len(b) for b in blobs) + 256
        if record.report_bytes > MAX_REPORTS:
            raise ProtocolError("too much reported")
        if kind == "snap":
            if isinstance(header.get("locals"), dict):
                taken = list(header["locals"].items())[:256]
                # a name costs its text and a descriptor, and the snapshot keeps MAX_SNAPSHOT_NAMES of them
                record.report_bytes += sum(len(str(k)) + 64 for k, _ in taken)
                if record.report_bytes > MAX_REPORTS:
                    raise ProtocolError("too much reported")
                for k, v in taken:
                    name = str(k)[:100]
                    if name in record.snapshot or len(record.snapshot) < MAX_SNAPSHOT_NAMES:
                        record.snapshot[name] = wire.value(v, blobs)
        elif kind == "check":
            if len(record.checks) >= MAX_CHECKS or not isinstance(header.get("locals"), dict):
                record.checks_dropped += 1
            else:
                names = list(run.request.quantities)
                found = header["locals"]
                line = header.get("line")
                record.checks.append({"line": line if type(line) is int and 0 < line < 1 << 31 else None,
                                      "values": {n: wire.value(found[n], blobs) for n in names if n in found}})
        elif kind == "ready":
            record.ready = True
        elif kind == "memory":   # the rank ends now (channel.Channel.out_of_memory)
            record.out_of_memory = True
            if run.failfast_at is None:
                run.failfast_at = time.monotonic() + FAILFAST_GRACE_S
        elif kind == "note":
            if len(record.notes) < 64:
                record.notes.append(str(header.get("what"))[:2000])
        elif kind == "timing_start" and run.request.real:
            record.last_started = {k: header[k] if type(header[k]) is int else header[k][:80]
                                   for k in ("op", "line", "api") if type(header.get(k)) in (int, str)}
        elif kind == "timing" and run.request.real and len(record.timings) < MAX_OPS:
            record.timings.append({k: header.get(k) for k in ("op", "method", "line", "api", "ms", "bytes")
                                   if isinstance(header.get(k), (int, float, str))})
        elif kind == "result" and record.result is None:
            found = header.get("values") if isinstance(header.get("values"), dict) else {}
            names = list(run.request.quantities)
            how = header.get("how")
            source = header.get("source")
            record.result = RankResult(how=How(how) if how in tuple(How) else How.RAISE,
                                       error=_error(header.get("error")),
                                       values={n: wire.value(found.get(n), blobs) if n in found else None for n in names},
                                       source=source if source in ("return", "locals") else "return",
                                       returned_type=str(header.get("returned_type", "?"))[:80])
            if run.switch is not None:
                run.switch.finish(r)
            if not record.result.returned and run.failfast_at is None:
                run.failfast_at = time.monotonic() + FAILFAST_GRACE_S
        elif kind == "setup_error" and not record.ready:
            # before "ready" no student code has run: the grader's own failure to set the rank up
            record.setup_error = str(header.get("error"))[:2000]
            run.outcome.error = f"rank {r}: {record.setup_error}"
            run.set_stop(Stop.GRADER_ERROR, r)
        elif kind == "setup_error":
            # after it, the student's code has broken the grader's code inside its rank (patched modules ...)
            record.broken = _one_line(header.get("error"))
            raise ProtocolError("the grader's code inside the rank was broken")
        elif kind == "end":
            if record.result is None:
                raise ProtocolError("an end before any result")
            record.done = True
            if run.switch is not None:
                run.switch.finish(r)
        elif kind != "result":
            raise ProtocolError(f"unexpected frame {str(kind)[:40]!r}")

    def _next_deadline(self, run: _Run) -> float:
        times = [run.started + run.limits.wall_s]
        if run.uids is not None and run.stopping_since is None:
            times.append(run.processes_checked + PROCESS_CHECK_S)
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
        stuck = self._stuck(run) and now - run.last_progress > DEADLOCK_GRACE_S
        if run.outcome.stop != Stop.COMPLETED:
            self._stop(run)
        elif all(rec.finished for rec in ranks):
            self._stop(run)
        elif now - run.started > run.limits.wall_s:
            run.set_stop(Stop.TIMEOUT)
            self._stop(run)
        elif self._fork_bomb(run, now):
            run.set_stop(Stop.PROCESS_LIMIT)
            self._stop(run)
        elif run.failfast_at is not None and (now >= run.failfast_at or stuck):
            run.set_stop(Stop.FAILFAST, next((rec.rank for rec in ranks if rec.failed), None))
            self._stop(run)
        elif stuck and not any(rec.failed for rec in ranks):
            run.set_stop(Stop.DEADLOCK)
            self._stop(run)

    def _fork_bomb(self, run: _Run, now: float) -> bool:
        """Half a uid's process budget in processes (not threads): a fork bomb. Counted every PROCESS_CHECK_S,
        so it stops in well under a second instead of spinning until the time limit (root mode only: the
        count is by the run's own uids)."""
        if run.uids is None or now - run.processes_checked < PROCESS_CHECK_S:
            return False
        run.processes_checked = now
        count = self._processes(run.uids, now)
        if count < _bomb_threshold(run):
            return False
        run.outcome.processes, run.outcome.process_limit_hit = count, True
        return True

    def _processes(self, uids, now: float | None = None) -> int:
        """The most processes any of `uids` has now. One walk of /proc serves every run policed at the same
        moment (`now`); None: walk it afresh."""
        if now is None or self._process_counts[0] != now:
            self._process_counts = (now, processes_by_uid())
        counts = self._process_counts[1]
        return max((counts.get(uid, 0) for uid in set(uids)), default=0)

    @staticmethod
    def _stuck(run: _Run) -> bool:
        """The switch knows that every rank that has not finished waits on an operation it cannot complete."""
        return run.switch is not None and run.switch.stuck()

    def _stop(self, run: _Run) -> None:
        if run.stopping_since is None:
            run.stopping_since = time.monotonic()
            run.outcome.elapsed = run.stopping_since - run.started
            if run.uids is not None and run.outcome.stop not in (Stop.COMPLETED, Stop.PROCESS_LIMIT, Stop.CANCELLED):
                run.outcome.processes = self._processes(run.uids)
                run.outcome.process_limit_hit = run.outcome.processes >= _bomb_threshold(run)
            self._kill(run, signal.SIGTERM)

    def _kill(self, run: _Run, sig: int) -> None:
        if sig == signal.SIGKILL:
            run.killed = True
        if run.pidfd is None or run.leader_gone:
            return
        if run.pod:   # the pod serves other runs after this one (zygote.Pods): stop this run, not the pod
            try:
                if sig == signal.SIGKILL:
                    self.conn.send(json.dumps({"t": "kill", "id": run.zid}).encode())
                else:
                    os.write(run.pidfd, b"s")
            except OSError:   # the pod is gone already, or the zygote: the run is over either way
                pass
            return
        try:
            signal.pidfd_send_signal(run.pidfd, sig)
        except ProcessLookupError:
            pass

    def _drain(self, run: _Run) -> None:
        """After the leader is gone: read what the sockets and pipes still hold (bounded), without waiting."""
        for fd, (role, r) in list(run.fd_role.items()):
            for _ in range(64):
                chunk = _read_chunk(fd) if fd in run.fd_role else b""
                if not chunk:
                    break
                self._feed(run, fd, role, r, chunk)

    def _abort(self, run: _Run, reason: Stop, rank: int) -> None:
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
        run.pending.clear()
        if run.pidfd is not None:
            try:
                sel.unregister(run.pidfd)
            except (KeyError, ValueError):
                pass
            os.close(run.pidfd)
            run.pidfd = None
        if run.switch is not None:
            for record in run.outcome.ranks:
                record.inside = run.switch.waiting_on(record.rank)
        if run.outcome.stop == Stop.COMPLETED and not all(rec.finished for rec in run.outcome.ranks):
            run.outcome.stop = Stop.GRADER_ERROR
            run.outcome.error = run.outcome.error or "the run ended before every rank reported"
        shutil.rmtree(run.workdir, ignore_errors=True)


def _one_line(text) -> str:
    """A rank's words shown as data: one line, printable, short."""
    return "".join(c if c.isprintable() else " " for c in str(text))[:300]


def _read_chunk(fd: int) -> bytes | None:
    """What a non-blocking descriptor holds now: None when nothing (yet), b"" at its end (or an error)."""
    try:
        return os.read(fd, READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def _error(error) -> dict | None:
    """An exception as the rank described it: its type, message and the student's frames, checked."""
    if not isinstance(error, dict):
        return None
    frames = []
    for frame in (error.get("frames") or [])[:8] if isinstance(error.get("frames"), list) else []:
        if isinstance(frame, dict):
            frames.append({"line": frame.get("line") if type(frame.get("line")) is int else None,
                           "function": str(frame.get("function", ""))[:100], "text": str(frame.get("text", ""))[:200],
                           **({"file": str(frame["file"])[:100]} if isinstance(frame.get("file"), str) else {})})
    return {"type": str(error.get("type", "?"))[:100], "message": str(error.get("message", ""))[:2000], "frames": frames}
