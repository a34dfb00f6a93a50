"""The Linux calls the sandbox makes that Python's os module lacks (unshare, setns, mount, prctl), through
ctypes, with their constants: an OSError with the call's errno where one fails. isolate's util.c, for this
grader."""
from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_NODEV, ST_NOEXEC, ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 4, 8, 1024, 2048, 4096
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_THP_DISABLE = 1, 4, 41

libc = ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    check(libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def set_parent_death_signal(sig: int) -> None:
    check(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PDEATHSIG)")


def small_pages() -> None:
    """New memory of this process and its children in 4 KiB pages. A fork of the zygote inherits its malloc's
    huge-page tunable (launch.HUGE_HEAP_TUNABLE): each 2 MiB its heap grew by was zeroed whole, though a rank
    touches little of it (measured in a `grade`'s 4-rank run: ~6% of its CPU). What it shares with the zygote
    stays as it is."""
    libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)   # Linux 3.15+; where it fails, nothing changes


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_MMAP_THRESHOLD = 128 << 20   # larger than any frame (wire.MAX_FRAME): a frame's buffer comes from the heap
HEAP_TRIM_THRESHOLD = 256 << 20   # free memory at the heap's top past which malloc gives it back (all of it)


def reuse_heap() -> None:
    """This process's malloc (and its children's) keeps what is freed for reuse, until more than
    HEAP_TRIM_THRESHOLD lies free at the heap's top (then glibc gives all of that back but 128 KiB),
    instead of returning it and faulting it in anew, page by page, at the next allocation of the same size
    (an operation's frame in a rank: 4 MiB for 1M float32, ~1,000 page faults for each of a run's first
    four). What a process holds at its peak does not change."""
    libc.mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)   # glibc only; elsewhere nothing changes
    libc.mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD)


def supervisor_memory() -> None:
    """The supervisor's memory for operations of MiBs, each of which allocates its frames, deltas and results
    anew (the records keep the previous ones a while). Measured with one all_reduce of 1M float32 at 2 ranks:
      - numpy asks for transparent huge pages for every array of 4 MiB or more (madvise), and where the kernel
        compacts memory on such a fault (defrag "madvise", this machine's) the fault waits for it: the
        operation that completed an all_reduce took 20-35 ms instead of 2.5, until the records' windows were
        full and memory was reused. Off here: 4 KiB pages, faulted as they are written;
      - glibc served each buffer from a fresh mapping, whose pages the kernel zeroed and faulted in one by one
        (~1,400 faults per perturbed operation); kept in the heap and reused instead (reuse_heap), ~500-800."""
    reuse_heap()
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:   # numpy 1.x
        from numpy.core.multiarray import _set_madvise_hugepage
    _set_madvise_hugepage(False)


def setns(fd: int, nstype: int) -> None:
    check(libc.setns(fd, nstype), "setns")
