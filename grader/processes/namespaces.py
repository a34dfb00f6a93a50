"""The run's namespaces, entered by its pid 1 (or by its leader, without root), and each rank's own on top:
pid, network, mount, IPC and UTS, in a user namespace where the grader is not root; loopback up in a new
network namespace; a rank's own /tmp (isolate's namespace handling, in its isolate.c)."""
from __future__ import annotations

import fcntl
import os
import socket
import struct

from .linux import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS, MS_BIND,
                    MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, check, libc, mount, unshare)
from .root import HOSTNAME, inside, readonly_flags

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def enter_namespaces(use_userns: bool, pid: bool = True) -> None:
    """`pid`: also a new pid namespace for this process's children (False: this process is already pid 1 of
    one, see tree.PidNamespaces)."""
    uid, gid = os.geteuid(), os.getegid()
    flags = (CLONE_NEWPID if pid else 0) | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    unshare(flags | (CLONE_NEWUSER if use_userns else 0))
    if use_userns:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    loopback_up()
    check(libc.sethostname(HOSTNAME.encode(), len(HOSTNAME)), "sethostname")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def loopback_up() -> None:
    """`ip link set lo up` without a subprocess: gloo needs loopback in the new network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def isolate_rank(tmp_mb: int, code: list[str] = ()) -> None:
    """Called by a rank of a graded run, still privileged, before its uid changes: a network namespace, a
    mount namespace with a /tmp of its own (also /var/tmp and /dev/shm) and an IPC namespace of its own (the
    run's /proc shows a rank only its own uid's processes: enter_root). Its socket to the grader, inherited,
    is then the only way it has to another rank: no shared network, file, store or memory."""
    unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC)
    loopback_up()
    _own_tmp(tmp_mb, ("/var/tmp", "/dev/shm"), code)


def isolate_files(tmp_mb: int, shm: bool, code: list[str] = ()) -> None:
    """Called by a rank of a real-backend run (its ranks share the run's loopback network, which gloo needs):
    a /tmp of its own (and /var/tmp; /dev/shm too unless `shm` is False: NCCL's shared-memory transport
    needs it shared), so that files two ranks both write (a notebook's %%writefile /tmp/x, say) do not clash
    between their uids."""
    unshare(CLONE_NEWNS)
    _own_tmp(tmp_mb, ("/var/tmp", "/dev/shm") if shm else ("/var/tmp",), code)


def _own_tmp(tmp_mb: int, also: tuple, code=()) -> None:
    """A fresh tmpfs at /tmp (and bound at `also`). The interpreter's folders that the run's root placed
    below them (`code`: a venv inside a checkout in /tmp, say) are held open first and bound back, read-only,
    at their paths in the new /tmp: the rank still imports what it finds there lazily."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    held = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in code
            if any(inside(path, top) for top in ("/tmp", *also)) and os.path.lexists(path)]
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={max(1, int(tmp_mb))}m")
    for path in also:
        if os.path.isdir(path):
            mount("/tmp", path, None, MS_BIND)
    for path, fd in held:
        source = f"/proc/self/fd/{fd}"
        if os.path.isdir(source):
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        mount(source, path, None, MS_BIND | MS_REC)
        mount(None, path, None, readonly_flags(os.statvfs(path).f_flag))
        os.close(fd)
