"""NO_NEW_PRIVS and a seccomp filter for rank processes: a hand-written classic-BPF program, installed with prctl.

The filter answers EPERM (never kills: a student sees an ordinary OSError) for the system calls a rank never
needs and that could reach past its sandbox or another run:

  ptrace, process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise   -- other processes' memory
  keyctl, add_key, request_key                                          -- the kernel keyring (no namespace)
  mount, umount2, pivot_root, chroot, the new mount API, unshare, setns -- the filesystem view, namespaces
  clone with a CLONE_NEW* flag                                          -- namespaces (user ones included)
  bpf, perf_event_open, userfaultfd, io_uring_*, syslog                 -- kernel attack surface, timing
  kexec_*, init/finit/delete_module, swapon/off, reboot, acct, quotactl -- the machine itself
  flock; fcntl F_*LK*, F_OFD_*, F_SETLEASE, F_NOTIFY; inotify, fanotify -- signals between runs through
                                                                           files they share read-only
clone3 answers ENOSYS instead: its flags live in memory a filter cannot read, and glibc falls back to clone
(whose flags the filter does check) on ENOSYS. A system call of another ABI than the filter's (i386 or x32 on
x86_64) is answered EPERM, so the numbers below cannot be bypassed.

    install(deny_locks=True)   # after the uid change, right before student code; raises OSError if refused

Why not libseccomp, which writes such filters per architecture: its Python binding (`seccomp`) is not on
PyPI. Debian ships it (python3-seccomp, for Debian's own python3 only): with it rules of the same kinds (arguments
masked, clone3 ENOSYS, other ABIs EPERM through ACT_BADARCH) built and loaded in a forked process, but a
project's dependencies cannot name a Debian package, and the grader runs in a venv of its own, in a
Gradescope image and on students' machines where `check` must work. PyPI's ctypes port (pyseccomp, last
released in 2021) still needs the system's libseccomp.so and is not maintained. So the program below is
written by hand for the two architectures the grader runs on (x86_64, aarch64; elsewhere no filter, and the
report says so), assembled once in the zygote (no code generation per rank), and its effect is tested
(tests/test_redteam.py: each denied call answers EPERM in a rank).
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_GET_SECCOMP = 38, 39, 22, 21
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38

# classic BPF opcodes
LD_W_ABS = 0x20          # BPF_LD | BPF_W | BPF_ABS
JEQ_K, JGE_K, JSET_K = 0x15, 0x35, 0x45
RET_K = 0x06
OFF_NR, OFF_ARCH = 0, 4


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument i in struct seccomp_data (little-endian)."""
    return 16 + 8 * i


CLONE_NEW_FLAGS = 0x7E020000   # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
X32_SYSCALL_BIT = 0x40000000
LOCK_FCNTL_CMDS = (5, 6, 7, 12, 13, 14, 36, 37, 38,   # F_GETLK/SETLK/SETLKW (and the *64 forms), F_OFD_*
                   1024, 1025, 1026)                    # F_SETLEASE, F_GETLEASE, F_NOTIFY


# System call numbers per architecture: (AUDIT_ARCH, {name: number}).
_ARCHES = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "process_madvise": 440, "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 272, "setns": 308, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "syslog": 103, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
        "quotactl": 179, "name_to_handle_at": 303, "open_by_handle_at": 304, "flock": 73, "inotify_init": 253,
        "inotify_init1": 294, "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301,
        "clone": 56, "clone3": 435, "fcntl": 72,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "process_madvise": 440, "keyctl": 219, "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 97, "setns": 268, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "syslog": 116, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89,
        "quotactl": 60, "name_to_handle_at": 264, "open_by_handle_at": 265, "flock": 32,
        "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_init": 262, "fanotify_mark": 263,
        "clone": 220, "clone3": 435, "fcntl": 25,
    }),
}
_SPECIAL = ("clone", "clone3", "fcntl")
LOCK_CALLS = ("flock", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark")


def syscall_number(name: str) -> int | None:
    return _ARCHES.get(platform.machine(), (0, {}))[1].get(name)


def supported() -> bool:
    return platform.machine() in _ARCHES


def denied_calls(deny_locks: bool = True, machine: str | None = None) -> list[str]:
    """Names of the system calls answered EPERM outright (clone, clone3 and fcntl are filtered by argument)."""
    names = _ARCHES.get(machine or platform.machine(), (0, {}))[1]
    return sorted(n for n in names if n not in _SPECIAL and (deny_locks or n not in LOCK_CALLS))


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


@functools.lru_cache(maxsize=None)   # made once in the zygote (it calls both), shared by every fork
def program(deny_locks: bool = True, machine: str | None = None) -> bytes:
    """The filter as bytes of struct sock_filter. Layout:

        arch != ours              -> EPERM
        x32 call (x86_64)         -> EPERM
        nr in DENIED              -> EPERM
        nr == clone3              -> ENOSYS
        nr == clone, flags & NEW  -> EPERM
        nr == fcntl, cmd in LOCK  -> EPERM   (deny_locks)
        otherwise                 -> ALLOW
    """
    machine = machine or platform.machine()
    audit_arch, numbers = _ARCHES[machine]
    deny = [numbers[n] for n in denied_calls(deny_locks, machine)]
    eperm, enosys, allow = RET_ERRNO | EPERM, RET_ERRNO | ENOSYS, RET_ALLOW
    if deny_locks:
        fcntl_block = [("ld", _arg(1))] + [("jeq_deny", cmd) for cmd in LOCK_FCNTL_CMDS] + [("ret", allow)]
    else:
        fcntl_block = [("ret", allow)]
    clone_block = [("ld", _arg(0)), ("jset_deny", CLONE_NEW_FLAGS), ("ret", allow)]
    head = [("ld", OFF_ARCH), ("jne_deny", audit_arch), ("ld", OFF_NR)]
    if machine == "x86_64":
        head.append(("jge_deny", X32_SYSCALL_BIT))
    head += [("jeq_deny", nr) for nr in deny]
    head += [("jeq_enosys", numbers["clone3"]),
             ("jeq_to", numbers["clone"], "clone"),
             ("jeq_to", numbers["fcntl"], "fcntl"),
             ("ret", allow)]
    labels_blocks = [("clone", clone_block), ("fcntl", fcntl_block)]
    ops = list(head)
    labels = {}
    for label, block in labels_blocks:
        labels[label] = len(ops)
        ops += block
    deny_at = len(ops)
    ops.append(("ret", eperm))
    enosys_at = len(ops)
    ops.append(("ret", enosys))
    out = []
    for i, op in enumerate(ops):
        kind = op[0]

        def rel(target: int) -> int:
            offset = target - i - 1
            if not 0 <= offset <= 255:
                raise ValueError("seccomp program too long for a jump")
            return offset
        if kind == "ld":
            out.append(_insn(LD_W_ABS, op[1]))
        elif kind == "ret":
            out.append(_insn(RET_K, op[1]))
        elif kind == "jeq_deny":
            out.append(_insn(JEQ_K, op[1], rel(deny_at), 0))
        elif kind == "jne_deny":
            out.append(_insn(JEQ_K, op[1], 0, rel(deny_at)))
        elif kind == "jge_deny":
            out.append(_insn(JGE_K, op[1], rel(deny_at), 0))
        elif kind == "jset_deny":
            out.append(_insn(JSET_K, op[1], rel(deny_at), 0))
        elif kind == "jeq_enosys":
            out.append(_insn(JEQ_K, op[1], rel(enosys_at), 0))
        elif kind == "jeq_to":
            out.append(_insn(JEQ_K, op[1], rel(labels[op[2]]), 0))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    ret = _libc.prctl(option, arg2, arg3, 0, 0)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")
    return ret


def set_no_new_privs() -> None:
    """execve can never grant privileges again (setuid bits, file capabilities): needed for an unprivileged filter."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def install(deny_locks: bool = True) -> None:
    """NO_NEW_PRIVS, then the filter, for this thread and everything it starts. Raises OSError if refused."""
    if not supported():
        raise OSError(ENOSYS, f"no seccomp filter for {platform.machine()}")
    set_no_new_privs()
    code = program(deny_locks)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))


def status() -> dict:
    """This process's NoNewPrivs and Seccomp lines of /proc/self/status (for tests and the probe)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("NoNewPrivs", "Seccomp"):
                out[key] = int(value.strip())
    return out
