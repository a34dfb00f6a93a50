"""What one rank may use and who it is (isolate's limits and uid handling): its rlimits, the process budget of
its uid, and a uid of its run's own, from a block of uids that no other live grader holds."""
from __future__ import annotations

import os
import resource
import socket
from dataclasses import dataclass

from .linux import PR_SET_DUMPABLE, libc

# Rank uids: a block of UID_BLOCK per grader process (claimed, see claim_uid_block), one new uid per run.
UID_BASE = 200_000
UID_BLOCKS = 4096
UID_BLOCK = 1_000_000


@dataclass(frozen=True)
class Limits:
    """Per-rank resource limits and per-run time and output limits (all configurable)."""
    wall_s: float = 15.0          # one run, all ranks, start to finish
    memory_mb: int = 2048         # address space per rank (torch with gloo fits in 2 GiB)
    cpu_s: int = 20               # CPU seconds per rank
    file_mb: int = 16             # largest file a rank may write
    open_files: int = 256
    processes: int = 32           # processes and threads of one rank's uid (a gloo rank uses ~4, one whose
    #                               inductor runs g++ ~10). A fork bomb fills it: each of its processes is a
    #                               copy of a torch-sized rank, and hundreds of them take the kernel seconds to end
    output_keep_kb: int = 64      # output kept per rank; the rest is counted and dropped
    output_max_mb: int = 8        # past this much output from one rank, the run is stopped
    tmp_mb: int = 64              # the run's /tmp (a tmpfs, shared by its ranks; also /var/tmp and /dev/shm)
    total_mb: int = 0             # all ranks of one grader together (memory cgroup); 0: 3/4 of the machine


def apply_limits(limits: Limits, processes: int | None, address_space: bool = True) -> None:
    """Per-rank rlimits. `processes`: RLIMIT_NPROC, for a uid of the grader's own (uid_budget); None for any
    other uid (the limit counts every process of the uid). `address_space` is off for CUDA ranks: a CUDA
    context reserves tens of GiB of virtual addresses, so RLIMIT_AS would stop the driver rather than the
    student."""
    def cap(which, value):
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))

    if address_space:
        cap(resource.RLIMIT_AS, limits.memory_mb << 20)
    cap(resource.RLIMIT_CPU, limits.cpu_s)
    cap(resource.RLIMIT_FSIZE, limits.file_mb << 20)
    cap(resource.RLIMIT_NOFILE, limits.open_files)
    cap(resource.RLIMIT_CORE, 0)
    if processes is not None:
        cap(resource.RLIMIT_NPROC, processes)


def uid_budget(limits: Limits, uids) -> int:
    """RLIMIT_NPROC of a rank: `limits.processes` for each rank that has the uid (the ranks of a real NCCL run
    share one, for their shared memory)."""
    if not uids:
        return limits.processes
    return limits.processes * max(list(uids).count(uid) for uid in set(uids))


def processes_by_uid() -> dict[int, int]:
    """{uid: processes (not threads) alive now}, from one walk of /proc (~0.2 ms for a few hundred): tells a
    fork bomb from a plain endless loop."""
    counts: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            counts[uid] = counts.get(uid, 0) + 1
    return counts


def uid_range(block: int) -> tuple[int, int]:
    """The uids [low, high) of one grader process's block."""
    low = UID_BASE + block * UID_BLOCK
    return low, low + UID_BLOCK


def claim_uid_block(pid: int | None = None) -> tuple[int, socket.socket]:
    """A block of rank uids no other live grader uses: the block is held by binding an abstract unix socket
    named after it, which the kernel releases when this process dies (no file, no stale lock). The first
    try is pid % UID_BLOCKS, so a supervisor's uids can be found from its pid (tests do)."""
    start = (os.getpid() if pid is None else pid) % UID_BLOCKS
    for i in range(UID_BLOCKS):
        block = (start + i) % UID_BLOCKS
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(f"\0dist-primitives-grader/uids/{block}")
            return block, sock
        except OSError:
            sock.close()
    raise OSError("no free block of rank uids")


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from sibling ranks
