"""A run's filesystem (isolate's rules.c): a new root on a tmpfs that holds only the system folders, a few
files of /etc, the interpreter's folders (all read-only), /dev's harmless nodes and the run's own /tmp;
entered by pivot_root, the old root detached. Never the grader's checkout: ranks get the grader's modules
from the zygote's memory."""
from __future__ import annotations

import functools
import os
import stat
import sys

from . import seccomp
from .linux import (MNT_DETACH, MS_BIND, MS_NOATIME, MS_NODEV, MS_NODIRATIME, MS_NOEXEC, MS_NOSUID, MS_RDONLY,
                    MS_REC, MS_RELATIME, MS_REMOUNT, ST_NOATIME, ST_NODEV, ST_NODIRATIME, ST_NOEXEC, ST_RELATIME,
                    check, libc, mount)

# What a rank's root holds besides the interpreter's own folders (all read-only).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "host.conf", "gai.conf",
             "passwd", "group", "protocols", "services", "mime.types", "os-release", "alternatives")
HOSTNAME = "sandbox"
# Written, not bound: names resolve from these files only (a run has no network, and a DNS lookup that
# cannot reach a server makes c10d print a warning into the student's output). The v4-mapped loopback is
# named too: c10d's sockets are dual-stack, so it looks up ::ffff:127.0.0.1, and a rank forked from a zygote
# whose imports read the host's nsswitch.conf (torch._dynamo asks for the user name) keeps the host's "dns"
# after that line: glibc never reloads it once the root has changed.
ETC_WRITTEN = {"hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost {HOSTNAME}\n::ffff:127.0.0.1 localhost {HOSTNAME}\n",
               "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\nnetworks: files\nprotocols: files\n"
                                "services: files\n"}
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def interpreter_paths(checkout: str) -> list[str]:
    """Folders a rank may import from, as the interpreter names them: its prefixes and the folders of
    sys.path. Never the grader's checkout, a folder inside it (other than a venv that lives there), or
    a folder that holds it: ranks get the grader's modules from the zygote's memory, not from disk."""
    checkout = os.path.abspath(checkout)
    prefixes = {os.path.abspath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix) if p}
    prefixes = {p for p in prefixes if os.path.isdir(p) and not inside(checkout, p)}
    paths = set(prefixes)
    for entry in sys.path:
        path = os.path.abspath(entry) if entry else ""
        if not path or not os.path.isdir(path) or inside(checkout, path):
            continue
        if inside(path, checkout) and not any(inside(path, p) for p in prefixes):
            continue
        paths.add(path)
    return sorted(p for p in paths if not any(p != q and inside(p, q) for q in paths))


def readonly_flags(have: int, device_nodes: bool = False) -> int:
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
        mount(None, target, None, readonly_flags(have))


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
            mount(None, target, None, readonly_flags(host[3], device_nodes=True))
            return
    _, source, is_dir, have = host
    if is_dir:
        os.makedirs(target, exist_ok=True)
        how.folder(source, target, have)
        return
    how.private = False
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, readonly_flags(have, device_nodes=device))


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
        if not any(inside(path, f"/{name}") for name in SYSTEM_DIRS):
            _place(path, target, how, follow=True)
    return how.private


def _pivot_root(new: str, old: str) -> None:
    nr = seccomp.syscall_number("pivot_root")
    if nr is None:
        raise OSError(38, "pivot_root: unknown architecture")
    check(libc.syscall(nr, new.encode(), old.encode()), "pivot_root")


def enter_root(target: str) -> None:
    """Called by pid 1 of the run's pid namespace: a fresh /proc (only this run's processes), then `target`
    becomes / for this mount namespace and the old root is detached (unreachable from here on)."""
    try:   # a rank sees only its own uid's processes (each rank has a uid of its own)
        mount("proc", f"{target}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError:   # a kernel before 5.8: every process of the run
        mount("proc", f"{target}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(target)
    _pivot_root(".", ".")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
