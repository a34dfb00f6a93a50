"""Isolation layers for rank processes, built from what Linux gives directly (no Docker).

A run is a small process tree forked from the zygote:

    leader L (root, old namespaces)      -- unshare(pid, net, mount, ipc, uts); loopback up; private /tmp
      init I (pid 1 of the new pid ns)   -- fresh /proc; forks the ranks, reaps them, reports their exits
        rank 0..N-1                      -- rlimits, then an unprivileged uid, then student code

Killing I tears the pid namespace down: every process in it dies, double-forked daemons included.
Each layer is optional: `probe()` says which this machine allows, and the report lists those applied.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import socket
import stat
import struct
import sys
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
UID_BASE = 200_000

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    """Per-rank resource limits and per-run time and output limits (all configurable)."""
    wall_s: float = 15.0          # one run, all ranks, start to finish
    memory_mb: int = 2048         # address space per rank (torch with gloo fits in 2 GiB)
    cpu_s: int = 20               # CPU seconds per rank
    file_mb: int = 16             # largest file a rank may write
    open_files: int = 256
    processes: int = 64           # processes and threads of one run's uid (a gloo rank uses ~4)
    output_keep_kb: int = 64      # output kept per rank; the rest is counted and dropped
    output_max_mb: int = 8        # past this much output from one rank, the run is stopped
    total_mb: int = 0             # all ranks of one grader together (memory cgroup); 0: 3/4 of the machine


def machine_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def default_total_mb(graders: int = 1) -> int:
    """Memory for every rank of one grader: 3/4 of the machine, shared by `graders` graders running at once."""
    return max(1024, machine_memory_mb() * 3 // 4 // max(1, graders))


class MemoryCgroup:
    """A cgroup (v1 memory controller) holding every rank of one Runner, so that many ranks at their
    per-rank limit at once cannot exhaust the machine: the kernel's OOM killer then picks a rank of
    this cgroup, and the verdict is "memory limit". Best effort: None where cgroups cannot be made."""

    ROOT = "/sys/fs/cgroup/memory"

    def __init__(self, path: str, limit_mb: int):
        self.path, self.limit_mb = path, limit_mb

    @classmethod
    def create(cls, name: str, limit_mb: int) -> MemoryCgroup | None:
        """`name` starts with "grader-<pid>-": cgroups of graders that died are removed on the way."""
        try:
            with open("/proc/self/cgroup") as f:
                rel = next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] == "memory")
            parent = os.path.join(cls.ROOT, rel.lstrip("/"))
            cls._sweep(parent)
            path = os.path.join(parent, name)
            os.mkdir(path)
            with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit_mb << 20))
            return cls(path, limit_mb)
        except (OSError, StopIteration, IndexError):
            return None

    @staticmethod
    def _sweep(parent: str) -> None:
        for entry in os.scandir(parent):
            pid = entry.name.split("-")[1] if entry.name.startswith("grader-") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(entry.path)
                except OSError:
                    pass

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_kills(self) -> int:
        try:
            with open(os.path.join(self.path, "memory.oom_control")) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def remove(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:  # processes still leaving
                import time
                time.sleep(0.05)


def join_cgroup(procs_file: str) -> None:
    """Called by a rank, still root: move itself into the grader's memory cgroup."""
    with open(procs_file, "w") as f:
        f.write(str(os.getpid()))


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def set_parent_death_signal(sig: int) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PDEATHSIG)")


def loopback_up() -> None:
    """`ip link set lo up` without a subprocess: gloo needs loopback in the new network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


# ------------------------------------------------------------------------------------------------
# What the machine allows

@dataclass(frozen=True)
class Layers:
    root: bool             # can drop ranks to an unprivileged uid
    namespaces: bool       # pid + net + mount + ipc + uts namespaces per run
    user_namespace: bool   # namespaces obtained through an unprivileged user namespace

    def names(self) -> list[str]:
        """Layer ids, rendered through the message catalog (`layer.<id>`)."""
        out = ["rlimits", "process_group"]
        if self.root:
            out.append("uid")
        if self.namespaces:
            out += ["pid_ns", "net_ns", "private_tmp", "fresh_proc"]
            if self.user_namespace:
                out.append("user_ns")
        return out


def probe() -> Layers:
    """Try the namespace layers in a throwaway child; never changes the caller."""
    root = os.geteuid() == 0
    for use_userns in ((False,) if root else (True,)):
        pid = os.fork()
        if pid == 0:
            try:
                enter_namespaces(use_userns)
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            return Layers(root=root, namespaces=True, user_namespace=use_userns)
    return Layers(root=root, namespaces=False, user_namespace=False)


# ------------------------------------------------------------------------------------------------
# Leader: namespaces and mounts

def enter_namespaces(use_userns: bool) -> None:
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    unshare(flags | (CLONE_NEWUSER if use_userns else 0))
    if use_userns:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    loopback_up()
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def _blocked_ancestor(path: str) -> str | None:
    """The highest ancestor of `path` that others cannot enter (e.g. /root, mode 700), if any."""
    current = "/"
    for part in [p for p in os.path.abspath(path).split("/") if p][:-1]:
        current = os.path.join(current, part)
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return current
    return None


def expose_interpreter() -> None:
    """Make the interpreter's files readable for an unprivileged uid inside this mount namespace.

    The Python of these machines lives in /root (mode 700). Instead of loosening /root, we cover the
    blocked folder with an empty tmpfs and bind the interpreter's own folders back, read-only.
    """
    needed = sorted({p for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, *sys.path)
                     if p and os.path.isdir(p)})
    by_block: dict[str, list[str]] = {}
    for path in needed:
        block = _blocked_ancestor(os.path.join(path, "x"))
        if block is not None:
            by_block.setdefault(block, []).append(path)
    for block, paths in by_block.items():
        # keep only the outermost of nested paths
        paths = [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths]
        mount("tmpfs", block, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for path, fd in zip(paths, fds):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
            os.close(fd)


def _code_paths() -> list[str]:
    """Folders the interpreter may still import from: its prefixes, sys.path and this package's checkout."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, here, *sys.path}
    return sorted(os.path.realpath(p) for p in paths if p and os.path.isdir(p))


def private_tmp(workdir: str) -> None:
    """The run's working folder becomes /tmp, /var/tmp and /dev/shm: the only places ranks can write.

    Code that lives below one of them (a checkout in /tmp, its .venv) is bound back read-only at its
    own path, so lazy imports in the ranks still find it."""
    fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)  # the path itself may be under /tmp
    try:
        for target in WORLD_WRITABLE:
            if not os.path.isdir(target) or os.path.islink(target):
                continue
            inside = [p for p in _code_paths() if p.startswith(target.rstrip("/") + "/")]
            inside = [p for p in inside if not any(p != q and p.startswith(q + "/") for q in inside)]
            keep = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in inside]
            mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
            for path, path_fd in keep:
                os.makedirs(path, exist_ok=True)
                mount(f"/proc/self/fd/{path_fd}", path, None, MS_BIND | MS_REC)
                mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
                os.close(path_fd)
    finally:
        os.close(fd)


def fresh_proc() -> None:
    """Called by pid 1 of the new namespace: /proc shows only this run's processes."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


# ------------------------------------------------------------------------------------------------
# Rank: limits, then identity

def apply_limits(limits: Limits, uid_limits: bool, address_space: bool = True) -> None:
    """Per-rank rlimits. `address_space` is off for CUDA ranks: a CUDA context reserves tens of GiB of
    virtual addresses, so RLIMIT_AS would stop the driver rather than the student."""
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
    if uid_limits:  # RLIMIT_NPROC counts every process of the uid: only meaningful for a uid of our own
        cap(resource.RLIMIT_NPROC, limits.processes)


def count_processes(uid: int) -> int:
    """Processes (not threads) of `uid` alive now: tells a fork bomb from a plain endless loop."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from sibling ranks
