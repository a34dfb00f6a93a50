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


def setns(fd: int, nstype: int) -> None:
    check(libc.setns(fd, nstype), "setns")
