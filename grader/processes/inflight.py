"""One run in flight, as the supervisor holds it: its rank sockets, output pipes and status pipe, its leader's
pidfd (or its socket to a pod), its switch, its clocks, and the record (records.RunOutcome) it fills in."""
from __future__ import annotations

import time
from pathlib import Path

from .. import wire
from ..records import RankRecord, RunOutcome, RunRequest, Stop
from ..switch import Switch
from .limits import Limits, uid_budget
from .ring import Ring

FAILFAST_GRACE_S = 0.5   # after one rank fails, the others get this long to report (less if they cannot move)


class InFlight:
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
        self.rings: dict[int, Ring] = {}                # rank -> its shared memory (a graded run's ranks)
        self.pidfd: int | None = None   # its leader's pidfd; a pod's run: its socket to the pod (pods.Pods)
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

    def fail_soon(self) -> None:
        """A rank failed: the others get FAILFAST_GRACE_S to report (less if they cannot move)."""
        if self.failfast_at is None:
            self.failfast_at = time.monotonic() + FAILFAST_GRACE_S

    @property
    def bomb_threshold(self) -> int:
        """Processes of one uid that make a fork bomb: half its budget, which is every rank's that shares the
        uid (one uid for all the ranks of a real NCCL run: limits.uid_budget)."""
        return uid_budget(self.limits, self.uids) // 2
