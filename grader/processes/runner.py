"""Transport: start runs on the zygote, carry every rank's frames, host each graded run's switch, enforce
limits, stop runs cleanly.

The supervisor never imports torch and never unpickles anything. Each rank has one socket to it (frames of
wire.py) and a pipe for its output. In a graded run (Mode.SWITCH) every operation a rank starts goes to the
run's switch.Switch, which pairs, perturbs, computes and answers it: the supervisor is the only channel
between the ranks. A real-backend run (Mode.REAL) and a bench run (Mode.BENCH) run torch's own gloo / NCCL
between ranks that share the run's network; their ranks only report to the supervisor. Decisions here are
about processes only (time, output, liveness, deadlock); what the values mean is verify's.

Here: the event loop over every run in flight, and the policing of each (limits, fail-fast, deadlock, fork
bombs, stopping). Beside it: zygote_client.py (the zygote's lifecycle, and each run's start on it),
inflight.py (what the supervisor holds of one run), reports.py (what a rank reports, checked); the records
it fills in are grader/records.py's.

    with Runner() as runner:
        outcomes = runner.run_many([RunRequest(world_size=2, source=..., filename=...), ...])
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import time

from .. import twocores, wire
from ..records import RankRecord, RunOutcome, RunRequest, Stop
from ..switch import MAX_OUTPUT, ProtocolError, TrafficLimit
from . import reports
from .inflight import InFlight
from .limits import Limits, processes_by_uid
from .linux import supervisor_memory
from .zygote_client import GraderError, ZygoteClient

DEADLOCK_GRACE_S = 0.25  # every live rank waits on an operation the switch cannot complete, nothing arrives
STOP_GRACE_S = 3.0       # SIGTERM to the run's leader (its pid 1, or the leader above it), then SIGKILL
PROCESS_CHECK_S = 0.1    # how often a run's processes are counted (one walk of /proc serves every run in flight:
#                          Runner._processes): a fork bomb's processes spin on every core until it is counted
MAX_UNREAD = MAX_OUTPUT + (8 << 20)   # what the switch may owe a rank that has not read it (its reader reads
                                      # at once: more is a rank that stopped reading, and it is stopped)
READ_CHUNK = 1 << 18


class Runner(ZygoteClient):
    """Owns the zygote and every run's processes. Reuse one Runner for many submissions."""

    def __init__(self, *, limits: Limits | None = None, max_parallel: int = 9, sandbox: bool = True,
                 python: str | None = None):
        self.max_parallel = max_parallel
        self._sel = None
        self._process_counts: tuple[float | None, dict] = (None, {})   # (when, {uid: processes}): _processes
        self._scratch = memoryview(bytearray(READ_CHUNK))   # what a channel's read lands in, reused
        supervisor_memory()
        super().__init__(limits=limits, sandbox=sandbox, python=python)

    # -- runs ---------------------------------------------------------------------------------
    def run_many(self, requests: list[RunRequest], watch=None) -> list[RunOutcome]:
        """Run every request (up to max_parallel at once) and return their outcomes, in order.
        `watch(index, outcome)`, called as each run ends, may return indices of runs to cancel (stopped,
        or never started: their outcome says "cancelled") and requests to start too (their outcomes follow
        those of `requests`, in the order they were asked for). A run the grader itself could not make or
        finish (Stop.GRADER_ERROR: its zygote gone, a launch that failed) is made once more before its
        outcome counts: a grader's accident is not the student's result."""
        self._ready()
        requests = list(requests)
        queue = list(enumerate(requests))
        results: dict[int, RunOutcome] = {}
        active: dict[int, tuple[int, InFlight]] = {}
        free_slots = list(range(self.max_parallel))
        sel = self._sel = selectors.DefaultSelector()

        def react(answer) -> None:
            for item in answer or ():
                if isinstance(item, RunRequest):
                    requests.append(item)
                    queue.append((len(requests) - 1, item))
                else:
                    cancel(item)

        tried_again: set[int] = set()

        def again(i: int, request: RunRequest) -> bool:
            """Queue run i once more, first in line, unless it was already made twice."""
            if i in tried_again:
                return False
            tried_again.add(i)
            queue.insert(0, (i, request))
            return True

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
                        run = self._launch(request, slot)
                    except GraderError as err:
                        free_slots.append(slot)
                        if again(index, request):
                            continue
                        results[index] = RunOutcome(request, [RankRecord(r) for r in range(request.world_size)],
                                                    stop=Stop.GRADER_ERROR, error=str(err))
                        continue
                    self._watch(run, sel)
                    active[id(run)] = (index, run)
                self._pump(sel, [run for _, run in active.values()])
                for key, (index, run) in list(active.items()):
                    if run.leader_gone:
                        self._drain(run)
                        self._finish(run, sel)
                        free_slots.append(run.slot)
                        del active[key]
                        if run.outcome.stop == Stop.GRADER_ERROR and again(index, requests[index]):
                            continue
                        results[index] = run.outcome
                        if watch is not None:
                            react(watch(index, run.outcome))
        finally:
            for _, run in active.values():
                self._kill(run, signal.SIGKILL)
                self._finish(run, sel)
            sel.close()
            self._sel = None
        return [results[i] for i in range(len(requests))]

    @staticmethod
    def _watch(run: InFlight, sel) -> None:
        for fd in run.fd_role:
            sel.register(fd, selectors.EVENT_READ | (selectors.EVENT_WRITE if fd in run.pending else 0), run)
        sel.register(run.pidfd, selectors.EVENT_READ, run)

    # -- event loop -----------------------------------------------------------------------------
    def _pump(self, sel, runs: list[InFlight]) -> None:
        now = time.monotonic()
        deadline = min((self._next_deadline(run) for run in runs), default=now + 0.1)
        timeout = max(0.002, min(deadline - now, 0.25))
        for key, events in sel.select(timeout):
            run: InFlight = key.data
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

    def _watch_writes(self, run: InFlight, fd: int) -> None:
        if self._sel is not None and fd in run.fd_role:
            self._sel.modify(fd, selectors.EVENT_READ | (selectors.EVENT_WRITE if run.pending.get(fd) else 0), run)

    def _flush(self, run: InFlight, fd: int) -> None:
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

    def _send(self, run: InFlight, rank: int, frame: list) -> None:
        fd = run.channel.get(rank)
        if fd is None or fd not in run.fd_role:
            return
        run.pending.setdefault(fd, []).extend(frame)
        self._flush(run, fd)
        if sum(len(b) for b in run.pending.get(fd, ())) > MAX_UNREAD and run.outcome.stop == Stop.COMPLETED:
            run.outcome.ranks[rank].unread = True
            run.pending.pop(fd, None)
            self._abort(run, Stop.TRAFFIC_LIMIT, rank)

    def _read(self, run: InFlight, fd: int, role: str, r: int, sel) -> None:
        reader = run.readers.get(fd)
        if reader is not None:   # a channel: the rest of a large frame is read in place, the rest into scratch
            room = reader.room(READ_CHUNK)
            target = room if room is not None else self._scratch
            count = _read_into(fd, target)
            if count is None:
                return
            if count:
                self._frames(run, fd, r, (lambda: reader.filled(count)) if room is not None else
                             (lambda: reader.feed(target[:count])))   # feed copies what it keeps
                return
            chunk = b""
        else:
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

    def _feed(self, run: InFlight, fd: int, role: str, r: int, chunk: bytes) -> None:
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
                if isinstance(message, dict) and reports.status(run, message):
                    self._deliver(run)
            return
        reader = run.readers.get(fd)
        if reader is None:   # this rank broke the protocol: nothing more it says is read
            return
        self._frames(run, fd, r, lambda: reader.feed(chunk))

    def _frames(self, run: InFlight, fd: int, r: int, read) -> None:
        """Handle the frames `read()` completes (a rank's channel)."""
        try:
            frames = read()
        except wire.WireError:
            del run.readers[fd]
            self._abort(run, Stop.PROTOCOL, r)
            return
        for header, blobs in frames:
            run.last_progress = time.monotonic()
            try:
                if "shm" in header:   # its large blobs are in the rank's shared memory (ring.py): copied out
                    ring = run.rings.get(r)
                    if ring is None:
                        raise wire.WireError("shared-memory references without shared memory")
                    blobs = ring.take(header, blobs)
                if header.get("t") in ("op", "wait", "peek"):
                    if run.switch is None:
                        raise ProtocolError("operations outside a graded run")
                    run.switch.receive(r, header, blobs)
                else:
                    reports.take(run, r, header, blobs)
            except (ProtocolError, wire.WireError, TrafficLimit) as err:
                run.readers.pop(fd, None)
                self._abort(run, Stop.TRAFFIC_LIMIT if isinstance(err, TrafficLimit) else Stop.PROTOCOL, r)
                break
        if run.switch is not None:
            self._deliver(run)

    def _deliver(self, run: InFlight) -> None:
        """What the switch owes the ranks, and where each rank now waits."""
        outbox, run.switch.outbox = run.switch.outbox, []
        if len(outbox) > 1 and sum(memoryview(b).nbytes for _, _, blobs in outbox for b in blobs) >= twocores.LEAST:
            frames = self._pack_on_two_cores(run, outbox)
        else:
            frames = [(rank, self._pack(run, rank, header, blobs)) for rank, header, blobs in outbox]
        for rank, frame in frames:
            self._send(run, rank, frame)
        for record in run.outcome.ranks:
            record.inside = run.switch.waiting_on(record.rank)

    @staticmethod
    def _pack(run: InFlight, rank: int, header: dict, blobs: list) -> list:
        ring = run.rings.get(rank)   # its large blobs into the rank's shared memory (ring.py)
        return ring.pack(header, blobs) if ring is not None else wire.pack(header, blobs)

    def _pack_on_two_cores(self, run: InFlight, outbox: list) -> list:
        """Each rank's frames packed in order, the ranks' at once (twocores.py): one result delivered to every
        rank of an all_reduce is copied into each one's region."""
        ranks = list(dict.fromkeys(rank for rank, _, _ in outbox))
        packed = twocores.run_all([lambda r=r: [self._pack(run, r, h, b) for rank, h, b in outbox if rank == r]
                                   for r in ranks], twocores.LEAST)
        return [(rank, frame) for rank, frames in zip(ranks, packed) for frame in frames]

    def _next_deadline(self, run: InFlight) -> float:
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

    def _police(self, run: InFlight, now: float) -> None:
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

    def _fork_bomb(self, run: InFlight, now: float) -> bool:
        """Half a uid's process budget in processes (not threads): a fork bomb. Counted every PROCESS_CHECK_S,
        so it stops in well under a second instead of spinning until the time limit (root mode only: the
        count is by the run's own uids)."""
        if run.uids is None or now - run.processes_checked < PROCESS_CHECK_S:
            return False
        run.processes_checked = now
        count = self._processes(run.uids, now)
        if count < run.bomb_threshold:
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
    def _stuck(run: InFlight) -> bool:
        """The switch knows that every rank that has not finished waits on an operation it cannot complete, and
        each rank it counts as finished has ended: one whose channel closed while its process still runs (it
        closed its socket, it is dying) has not said how it ends, and its exit, not a deadlock, is the news (a
        loaded machine reaps it late; its exit wakes the loop, or the time limit ends the run)."""
        if run.switch is None or not run.switch.stuck():
            return False
        ranks = run.outcome.ranks
        return all(ranks[r].finished for r in run.switch.finished if r < len(ranks))

    def _stop(self, run: InFlight) -> None:
        if run.stopping_since is None:
            run.stopping_since = time.monotonic()
            run.outcome.elapsed = run.stopping_since - run.started
            if run.uids is not None and run.outcome.stop not in (Stop.COMPLETED, Stop.PROCESS_LIMIT, Stop.CANCELLED):
                run.outcome.processes = self._processes(run.uids)
                run.outcome.process_limit_hit = run.outcome.processes >= run.bomb_threshold
            self._kill(run, signal.SIGTERM)

    def _kill(self, run: InFlight, sig: int) -> None:
        if sig == signal.SIGKILL:
            run.killed = True
        if run.pidfd is None or run.leader_gone:
            return
        if run.pod:   # the pod serves other runs after this one (pods.Pods): stop this run, not the pod
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

    def _drain(self, run: InFlight) -> None:
        """After the leader is gone: read what the sockets and pipes still hold (bounded), without waiting."""
        for fd, (role, r) in list(run.fd_role.items()):
            for _ in range(64):
                chunk = _read_chunk(fd) if fd in run.fd_role else b""
                if not chunk:
                    break
                self._feed(run, fd, role, r, chunk)

    def _abort(self, run: InFlight, reason: Stop, rank: int) -> None:
        run.set_stop(reason, rank)
        self._stop(run)

    def _finish(self, run: InFlight, sel) -> None:
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
        for ring in run.rings.values():
            ring.close()
        run.rings.clear()
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


def _read_into(fd: int, room: memoryview) -> int | None:
    """Like _read_chunk, into `room`: the bytes read, None when nothing (yet), 0 at its end (or an error)."""
    try:
        return os.readv(fd, [room])
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return 0


def _read_chunk(fd: int) -> bytes | None:
    """What a non-blocking descriptor holds now: None when nothing (yet), b"" at its end (or an error)."""
    try:
        return os.read(fd, READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


