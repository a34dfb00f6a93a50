"""Isolation layers for rank processes, built from what Linux gives directly (no Docker).

A run is a small process tree forked from the zygote:

    init I (pid 1 of a new pid ns)       -- memory cgroup; unshare(net, mount, ipc, uts); loopback up;
                                            new_root(): a tmpfs holding the interpreter (read-only) and /tmp;
                                            fresh /proc, pivot_root into it; forks the ranks, hosts the
                                            run's store, reaps the ranks, reports their exits
      rank 0..N-1                        -- rlimits, a uid of its run's own, NO_NEW_PRIVS + seccomp
                                            (seccomp.py), then student code

As root, the zygote forks I straight into the new pid namespace (zygote.PidNamespaces), and I is a pod
(zygote.Pods) unless the run uses CUDA: kept for the zygote's next run once it has killed (kill(-1)) and
reaped every other process of its namespace, so two runs never share one at the same time (a pod hosts a
real-backend run's store in a child, in network and IPC namespaces it makes for that run). Without root, a
leader L above I enters a user namespace first (the pid namespace must belong to it) with the others,
builds the root, and forks I. Killing I tears the pid namespace down: every process in it dies,
double-forked daemons included.
Each layer is optional: `probe()` says which this machine allows, and the report lists those applied
(and names seccomp and NO_NEW_PRIVS when they are missing).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import resource
import socket
import stat
import struct
import sys
import tempfile
from dataclasses import dataclass

from . import seccomp

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_NODEV, ST_NOEXEC, ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 4, 8, 1024, 2048, 4096
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_THP_DISABLE = 1, 4, 41
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

# What a rank's root holds besides the interpreter's own folders (all read-only).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "host.conf", "gai.conf",
             "passwd", "group", "protocols", "services", "mime.types", "os-release", "alternatives")
HOSTNAME = "sandbox"
# Written, not bound: names resolve from these files only (a run has no network, and a DNS lookup that
# cannot reach a server makes c10d print a warning into the student's output).
ETC_WRITTEN = {"hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost {HOSTNAME}\n",
               "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\nnetworks: files\nprotocols: files\n"
                                "services: files\n"}
DEV_NODES = ("null", "zero", "full", "random", "urandom")

# Rank uids: a block of UID_BLOCK per grader process (claimed, see claim_uid_block), one new uid per run.
UID_BASE = 200_000
UID_BLOCKS = 4096
UID_BLOCK = 1_000_000

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    """Per-rank resource limits and per-run time and output limits (all configurable)."""
    wall_s: float = 15.0          # one run, all ranks, start to finish
    memory_mb: int = 2048         # address space per rank (torch with gloo fits in 2 GiB)
    cpu_s: int = 20               # CPU seconds per rank
    file_mb: int = 16             # largest file a rank may write
    open_files: int = 256
    processes: int = 32           # processes and threads of one rank's uid (a gloo rank uses ~4, one that runs
    #                               torch.compile's g++ ~10). A fork bomb fills it: each of its processes is a
    #                               copy of a torch-sized rank, and hundreds of them take the kernel seconds to end
    output_keep_kb: int = 64      # output kept per rank; the rest is counted and dropped
    output_max_mb: int = 8        # past this much output from one rank, the run is stopped
    tmp_mb: int = 64              # the run's /tmp (a tmpfs, shared by its ranks; also /var/tmp and /dev/shm)
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


def small_pages() -> None:
    """New memory of this process and its children in 4 KiB pages. A fork of the zygote inherits its malloc's
    huge-page tunable (launch.HUGE_HEAP_TUNABLE): each 2 MiB its heap grew by was zeroed whole, though a rank
    touches little of it (measured in a `grade`'s 4-rank run: ~6% of its CPU). What it shares with the zygote
    stays as it is."""
    _libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)   # Linux 3.15+; where it fails, nothing changes


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
    root: bool                    # can drop ranks to an unprivileged uid (a new one for every run)
    namespaces: bool              # pid + net + mount + ipc + uts namespaces and a new root per run
    user_namespace: bool          # namespaces obtained through an unprivileged user namespace
    seccomp: bool = False         # the seccomp filter of seccomp.py
    no_new_privs: bool = False

    def names(self, tmp_mb: int = 0) -> list[str]:
        """Layer ids, rendered through the message catalog (`layer.<id>`); missing protections are named too."""
        out = ["rlimits", "process_group"]
        if self.root:
            out.append("uid_per_run")
        if self.namespaces:
            out += ["pid_ns", "net_ns", "ipc_ns", "new_root", f"tmpfs:{tmp_mb}", "fresh_proc"]
            if self.user_namespace:
                out.append("user_ns")
        else:
            out.append("no_namespaces")
        out.append("no_new_privs" if self.no_new_privs else "no_new_privs_off")
        out.append("seccomp" if self.seccomp else "seccomp_off")
        return out


PROBE_NS, PROBE_ROOT, PROBE_NNP, PROBE_SECCOMP = 1, 2, 4, 8


def probe(workspace: str, code: list[str]) -> Layers:
    """Build one run's sandbox in a throwaway child (and its pid 1); never changes the caller.
    `workspace`: a folder for the probe's mount point; `code`: interpreter_paths()."""
    return Probe(workspace, code).layers()


class Probe:
    """probe(), started now and read later: the zygote starts it before it imports torch, so that the probe
    runs beside the import (and forks a small process, not a torch-sized one)."""

    def __init__(self, workspace: str, code: list[str]):
        self.target = tempfile.mkdtemp(prefix="probe-", dir=workspace)
        self.read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.read)
            _probe_child(self.target, code, write)
        os.close(write)

    def layers(self) -> Layers:
        data = os.read(self.read, 16)
        os.close(self.read)
        os.waitpid(self.pid, 0)
        try:
            os.rmdir(self.target)
        except OSError:
            pass
        bits = int(data or b"0")
        root = os.geteuid() == 0
        namespaces = bool(bits & PROBE_NS and bits & PROBE_ROOT)
        return Layers(root=root, namespaces=namespaces, user_namespace=namespaces and not root,
                      seccomp=bool(bits & PROBE_SECCOMP), no_new_privs=bool(bits & PROBE_NNP))


def _probe_child(target: str, code: list[str], write: int) -> None:
    """The probe's throwaway child: which layers can be built here, as bits on `write`. Never returns."""
    bits = 0
    try:
        enter_namespaces(use_userns=os.geteuid() != 0)
        bits |= PROBE_NS
        new_root(target, 1, code)
        init = os.fork()
        if init == 0:
            got = 0
            try:
                enter_root(target)
                if os.path.isdir(sys.base_prefix) and os.listdir("/proc"):
                    got |= PROBE_ROOT
                try:
                    seccomp.install()
                    got |= PROBE_NNP | PROBE_SECCOMP
                except OSError:
                    seccomp.set_no_new_privs()
                    got |= PROBE_NNP
            except BaseException:
                pass
            os._exit(got)
        _, status = os.waitpid(init, 0)
        bits |= os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 0
    except BaseException:
        pass
    if not bits & PROBE_SECCOMP:  # no working sandbox root: can this machine still filter system calls?
        try:
            seccomp.install(deny_locks=False)
            bits |= PROBE_NNP | PROBE_SECCOMP
        except BaseException:
            try:
                seccomp.set_no_new_privs()
                bits |= PROBE_NNP
            except BaseException:
                pass
    os.write(write, str(bits).encode())
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# The run's namespaces (entered by its init, or by its leader without root); a new root that holds only the
# interpreter (read-only) and the run's own tmpfs

def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def enter_namespaces(use_userns: bool, pid: bool = True) -> None:
    """`pid`: also a new pid namespace for this process's children (False: this process is already pid 1 of
    one, see zygote.PidNamespaces)."""
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
    _check(_libc.sethostname(HOSTNAME.encode(), len(HOSTNAME)), "sethostname")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def interpreter_paths(checkout: str) -> list[str]:
    """Folders a rank may import from, as the interpreter names them: its prefixes and the folders of
    sys.path. Never the grader's checkout, a folder inside it (other than a venv that lives there), or
    a folder that holds it: ranks get the grader's modules from the zygote's memory, not from disk."""
    checkout = os.path.abspath(checkout)
    prefixes = {os.path.abspath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix) if p}
    prefixes = {p for p in prefixes if os.path.isdir(p) and not _inside(checkout, p)}
    paths = set(prefixes)
    for entry in sys.path:
        path = os.path.abspath(entry) if entry else ""
        if not path or not os.path.isdir(path) or _inside(checkout, path):
            continue
        if _inside(path, checkout) and not any(_inside(path, p) for p in prefixes):
            continue
        paths.add(path)
    return sorted(p for p in paths if not any(p != q and _inside(p, q) for q in paths))


def _readonly_flags(have: int, device_nodes: bool = False) -> int:
    """Read-only, nosuid (and nodev), keeping the flags a user namespace may not clear (noexec, atime):
    `have` is the statvfs f_flag of the mount being bound."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device_nodes else MS_NODEV)
    for st_flag, ms_flag in ((ST_NOEXEC, MS_NOEXEC), (ST_NOATIME, MS_NOATIME), (ST_NODIRATIME, MS_NODIRATIME),
                             (ST_RELATIME, MS_RELATIME), (ST_NODEV, MS_NODEV)):
        if have & st_flag:
            flags |= ms_flag
    return flags


COPY_BYTES = 1 << 20   # a file of the shared tree up to this size is copied into a run's root, not bound


@functools.lru_cache(maxsize=None)
def _host(path: str, symlink: bool) -> tuple | None:
    """How host `path` is placed in every run's root, looked up once per zygote (it builds a root for each
    run): None (missing), ("link", target), ("copy", bytes, mode) for a small regular file, ("device",
    st_rdev, mode), or ("bind", source, is_dir, statvfs flags of its mount). `symlink`: a symbolic link is
    copied as a link rather than followed."""
    if not os.path.lexists(path):
        return None
    if symlink and os.path.islink(path):
        return ("link", os.readlink(path))
    source = os.path.realpath(path)
    info = os.stat(source)
    if stat.S_ISCHR(info.st_mode):
        return ("device", info.st_rdev, stat.S_IMODE(info.st_mode), os.statvfs(source).f_flag)
    if stat.S_ISREG(info.st_mode) and info.st_size <= COPY_BYTES:
        try:
            with open(source, "rb") as f:
                return ("copy", f.read(COPY_BYTES + 1), stat.S_IMODE(info.st_mode))
        except OSError:
            pass
    return ("bind", source, stat.S_ISDIR(info.st_mode), os.statvfs(source).f_flag)


class Placement:
    """How a run's root was built: whether every file in it is the run's own (folders as read-only overlays,
    small files copied, device nodes made for the run). Then no inode is shared with another run, and a file
    lock in one run can never be seen from another (the seccomp filter lets locks through: torch.compile
    takes some)."""

    def __init__(self, overlays: bool, empty: str | None):
        self.overlays, self.empty = overlays, empty
        self.private = overlays

    def folder(self, source: str, target: str, have: int) -> None:
        if self.overlays:
            try:   # a read-only overlay: the files are the host's, the inodes the run's own
                mount("overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                      f"lowerdir={_escape(source)}:{_escape(self.empty)}")
                return
            except OSError:
                pass
        self.private = False
        mount(source, target, None, MS_BIND | MS_REC)
        mount(None, target, None, _readonly_flags(have))


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:").replace(",", "\\,")


def _place(path: str, root: str, how: Placement, device: bool = False, follow: bool = False) -> None:
    """Make host `path` appear read-only at the same path below `root`: a symlink is copied as a symlink
    (unless `follow`: then what it points to is placed at the link's path), a folder is an overlay of it
    (or bind-mounted, where overlays cannot be made), a small file is copied, a device node is made (or
    bound, without the privilege to make one). Missing paths are skipped."""
    host = _host(path, not (device or follow))
    if host is None:
        return
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    kind = host[0]
    if kind == "link":
        os.symlink(host[1], target)
        return
    if kind == "copy":
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, host[2] & 0o555)
        try:
            os.write(fd, host[1])
        finally:
            os.close(fd)
        return
    if kind == "device":
        try:
            os.mknod(target, stat.S_IFCHR | host[2], host[1])
            os.chmod(target, host[2])   # not the umask's
            return
        except OSError:   # no privilege to make one (a user namespace): the host's node, shared
            how.private = False
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            mount(path, target, None, MS_BIND)
            mount(None, target, None, _readonly_flags(host[3], device_nodes=True))
            return
    _, source, is_dir, have = host
    if is_dir:
        os.makedirs(target, exist_ok=True)
        how.folder(source, target, have)
        return
    how.private = False
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, _readonly_flags(have, device_nodes=device))


def new_root(target: str, tmp_mb: int, code: list[str], cuda: bool = False, empty: str | None = None) -> bool:
    """Build the ranks' whole filesystem on a tmpfs mounted at `target`, in this (private) mount namespace:
    the system folders, a few files of /etc, the interpreter's folders (`code`), all read-only; /tmp a tmpfs
    of `tmp_mb` MiB, also seen at /var/tmp and /dev/shm; /dev with null, zero, full, random, urandom.
    Nothing else: no checkout, no class folder, no results, no other run. enter_root() moves into it.
    `empty`: an empty host folder, the second layer of each read-only overlay. Returns whether every file of
    the root is the run's own (Placement): a CUDA run's /sys and GPU nodes are the host's."""
    how = Placement(overlays=empty is not None, empty=empty)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=2m")
    for name in SYSTEM_DIRS:
        _place(f"/{name}", target, how)
    for name in ETC_FILES:
        _place(f"/etc/{name}", target, how)
    os.makedirs(f"{target}/etc", exist_ok=True)
    for name, text in ETC_WRITTEN.items():
        with open(f"{target}/etc/{name}", "w") as f:
            f.write(text)
    tmp = f"{target}/tmp"
    os.mkdir(tmp)
    mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={max(1, int(tmp_mb))}m")
    dev = f"{target}/dev"
    os.makedirs(f"{target}/var/tmp")
    mount(tmp, f"{target}/var/tmp", None, MS_BIND)
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for node in DEV_NODES:
        _place(f"/dev/{node}", target, how, device=True)
    if cuda:
        how.private = False
        for name in sorted(os.listdir("/dev")):
            if name.startswith("nvidia"):
                _place(f"/dev/{name}", target, how, device=True)
        _place("/sys", target, how)
    os.mkdir(f"{dev}/shm")
    mount(tmp, f"{dev}/shm", None, MS_BIND)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(link, f"{dev}/{name}")
    # read-only once made: the nodes still read and write (they are devices), but nobody changes their times,
    # which would be a mark that the ranks of a run, or a pod's later runs, could read
    mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.mkdir(f"{target}/proc")
    for path in code:  # last: an interpreter may live below /tmp (a venv inside a checkout in /tmp)
        if not any(_inside(path, f"/{name}") for name in SYSTEM_DIRS):
            _place(path, target, how, follow=True)
    return how.private


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
            if any(_inside(path, top) for top in ("/tmp", *also)) and os.path.lexists(path)]
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
        mount(None, path, None, _readonly_flags(os.statvfs(path).f_flag))
        os.close(fd)


def _pivot_root(new: str, old: str) -> None:
    nr = seccomp.syscall_number("pivot_root")
    if nr is None:
        raise OSError(38, "pivot_root: unknown architecture")
    _check(_libc.syscall(nr, new.encode(), old.encode()), "pivot_root")


def enter_root(target: str) -> None:
    """Called by pid 1 of the run's pid namespace: a fresh /proc (only this run's processes), then `target`
    becomes / for this mount namespace and the old root is detached (unreachable from here on)."""
    try:   # a rank sees only its own uid's processes (each rank has a uid of its own)
        mount("proc", f"{target}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError:   # a kernel before 5.8: every process of the run
        mount("proc", f"{target}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(target)
    _pivot_root(".", ".")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


# ------------------------------------------------------------------------------------------------
# Rank: limits, then identity

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
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from sibling ranks
