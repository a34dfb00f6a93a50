"""The zygote: one warm process that has imported torch, and forks each run's process tree from it.

    python -m grader.processes.zygote FD BASE        (started by runner.Runner or launch.prestart; FD is a
                                                      SOCK_SEQPACKET to the supervisor, BASE its runs' folder)
    python -m grader.processes.zygote FD BASE --template [--listen=FD] [--preload=MODULE,...]
                                                      (a template: forks a zygote per grader process, on
                                                      request; --listen: a session's datagram socket;
                                                      --preload: torch modules imported before any fork)

Ranks must not pay for their own cold `import torch` (about 2 s each); a fork of this process costs
milliseconds. The zygote runs no torch op and hosts no store (both make forked children hang; a run's store
is hosted inside the run, store.py), and never runs student code: that happens in the ranks, forks of the
run's pid 1, in the sandbox (tree.py: a run's process tree; sandbox.py: its layers).

Protocol: the supervisor sends one JSON request per run with the run's pipe ends attached (SCM_RIGHTS);
the zygote forks the run's first process (its pid 1, or the leader above it, see tree.py) and answers
{"id", "pid"} with a pidfd of it attached, which the supervisor uses to stop the run without any race on
process ids. The runner calls that process the run's leader either way. A graded run as root goes to a pod
(pods.py: a pid 1 kept from one run to the next) and the answer says {"pod": true}, with a socket to the pod
attached instead: its end of the run, and the way to stop it. {"t": "kill", "id"} (no answer) ends the pod
of run `id` if it still serves that run.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from . import inductor  # the standard library only, until warm_up()

inductor.set_environment()   # before torch: inductor reads it when imported

from . import sandbox  # noqa: E402  (the standard library only)
from .root import interpreter_paths  # noqa: E402

CHECKOUT = str(Path(__file__).resolve().parents[2])
# Which sandbox layers this machine allows, probed in a small child beside the import below rather than in a
# torch-sized one after it (~15 ms less before the first run); a template's forks share its result.
_LAYERS: list[sandbox.Layers] = []


def _early_probe() -> sandbox.Probe | None:
    try:
        return sandbox.Probe(sys.argv[2], interpreter_paths(CHECKOUT))
    except (OSError, IndexError):   # serve() probes again, and fails there with the zygote's own words
        return None


def _usage_unless_started_by_the_grader() -> None:
    """`--help` (or anything but FD BASE): the usage in this module's docstring, before the torch import."""
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        usage = __doc__.split("\n\n")[1]
        print("usage:\n" + usage, file=sys.stdout if sys.argv[1:2] in (["-h"], ["--help"]) else sys.stderr)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)


if __name__ == "__main__":
    _usage_unless_started_by_the_grader()
_PROBE = _early_probe() if __name__ == "__main__" else None

import torch  # noqa: E402,F401  (the point of the zygote: imported once, shared by every fork)
import torch.distributed  # noqa: F401

# What the CPU can do (cpuinfo: CPUID, which traps in a VM, and /proc/cpuinfo), which the first tensor
# operation of every rank would read again (~0.2 ms): read once here, inherited by every fork (no op runs
# and no thread starts in the zygote).
torch._C._get_cpu_capability()
inductor.eager_kernels()   # torch.compile's inductor backend runs with eager kernels in every rank (inductor.py)

from ..comm import PRELOAD_GRADER, PRELOAD_OTHER
from . import hooks, seccomp
from .pods import Pods
from .tree import CODE, EMPTY, LEADERS, PidNamespaces, fork_held, leader

if seccomp.supported():   # the filters each rank installs, assembled once for every fork
    seccomp.program(True), seccomp.program(False)

# Every grader module a rank uses, imported here before any fork: a rank's root holds the interpreter and
# its libraries, not the grader's checkout, so a rank can never import grader code lazily from disk.
# The grader modules an exercise notebook imports (nbcheck: its check cells; a rank loads a notebook's
# imports) are comm.PRELOAD_GRADER, imported by _preload for a submission that names them. (tests/test_sandbox.py
# checks both against every grader import reachable from rank.py and those of the exercise's notebooks.)
PRELOAD = ("grader.processes.rank", "grader.processes.hooks", "grader.processes.guard", "grader.processes.tree",
           "grader.processes.pods", "grader.processes.store", "grader.processes.sandbox", "grader.processes.linux",
           "grader.processes.cgroup", "grader.processes.limits", "grader.processes.namespaces",
           "grader.processes.root", "grader.processes.seccomp",
           "grader.submission.static", "grader.submission.scope", "grader.submission.reach", "grader.submission.program",
           "grader.submission.parse", "grader.submission.definitions", "grader.submission.compiled", "grader.wire")
for _name in PRELOAD:
    importlib.import_module(_name)


def _gpu_count() -> int:
    """GPUs visible to ranks, counted in a throwaway child: CUDA must never be initialised in the zygote."""
    if not os.path.exists("/dev/nvidiactl"):
        return 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            count = torch.cuda.device_count()
        except BaseException:
            count = 0
        os.write(write, str(count).encode())
        os._exit(0)
    os.close(write)
    data = os.read(read, 32)
    os.close(read)
    os.waitpid(pid, 0)
    return int(data or b"0")


MADV_COLLAPSE, HUGE = 25, 1 << 21   # Linux 6.1+; 2 MiB pages on x86-64 and arm64 (4K base pages)
COLLAPSE_AFTER_RUNS = 8   # a cold zygote's huge pages (below): more runs than one grade's


def _huge_pages() -> None:
    """Back the zygote's private anonymous memory (the ~150 MB that importing torch leaves) with huge pages
    where the kernel can (MADV_COLLAPSE). A fork then copies one page-table entry per 2 MiB instead of 512,
    and unmaps as few at exit: each process of a run (leader, pid 1, every rank) is cheaper to start and to
    end (measured: 11 -> 8 ms of CPU per fork and exit of a rank-like child; 5.8 -> 3.2 ms for a bare one).
    A child's write still copies 4 KiB: the kernel splits a shared huge mapping on write. Most of the heap is
    in huge pages already when this runs (launch.HUGE_HEAP_TUNABLE: glibc's malloc marks what it grows
    MADV_HUGEPAGE, in a rank too), so this collapses the rest in ~20 ms (~0.4 s without the tunable). Where
    the kernel cannot (older than 6.1, THP off), nothing changes."""
    gc.freeze()   # what it holds now is what the forks share
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p" \
                or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        low, high = (low + HUGE - 1) & ~(HUGE - 1), high & ~(HUGE - 1)
        if high > low:
            madvise(low, high - low, MADV_COLLAPSE)   # errors (EINVAL: no THP here) change nothing


def _preload(modules) -> None:
    """Import torch modules a submission names (functional collectives import ~800 modules on first use),
    matplotlib's pyplot (comm.PRELOAD_OTHER) and the grader modules a notebook imports (comm.PRELOAD_GRADER),
    here, once, before forking its ranks: a cost of the grader must not count against a run's time."""
    for name in modules:
        if isinstance(name, str) and (name.split(".")[0] in ("torch", *PRELOAD_OTHER) or name in PRELOAD_GRADER) \
                and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (not a module: the rank will say what the student wrote)
                pass
    if "torch._dynamo" in sys.modules:
        try:
            inductor.skip_grader_frames()
        except Exception:  # noqa: BLE001  (a dynamo without that list: a compiled step may not call the group)
            pass
    # torch.compile: dynamo's first compile of a step that communicates, once, for every rank this zygote forks
    if "torch.compile" in modules and "torch._dynamo" in sys.modules:
        try:
            autograd = any(str(m).startswith(("torch.nn", "torch.autograd", "torch.optim")) for m in modules)
            inductor.warm_up(backward=autograd)
        except Exception:  # noqa: BLE001  (whatever went wrong there: ranks warm up on their own, never a lost zygote)
            pass


def _stop_all_runs() -> None:
    """The supervisor is gone: nobody enforces time limits any more, so stop every run now."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(LEADERS):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(30):
            _reap()
            if not LEADERS:
                return
            time.sleep(0.1)


def serve(conn: socket.socket, base: str, forked: bool = False) -> None:
    CODE[:] = interpreter_paths(CHECKOUT)
    empty = os.path.join(base, "empty")
    os.makedirs(empty, mode=0o755, exist_ok=True)
    EMPTY[:] = [empty]
    if not _LAYERS:
        _LAYERS.append(sandbox.probe(base, CODE))
    layers = _LAYERS[0]
    PidNamespaces.setup(layers)
    hooks.install()
    hello = json.dumps({"t": "hello", "pid": os.getpid(), "gpus": _gpu_count(),
                        "layers": {"root": layers.root, "namespaces": layers.namespaces,
                                   "user_namespace": layers.user_namespace, "seccomp": layers.seccomp,
                                   "no_new_privs": layers.no_new_privs}}).encode()
    if forked:  # not the supervisor's child: it watches and stops this zygote through a pidfd
        pidfd = os.pidfd_open(os.getpid())
        socket.send_fds(conn, [hello], [pidfd])
        os.close(pidfd)
    else:
        conn.send(hello)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    # Collapsing what malloc left in 4 KiB pages saves ~3 ms per process. A template's fork shares what the
    # template collapsed before forking it (_template); a cold zygote, whose `grade` makes about 4 runs,
    # collapses its own only once it has served more than that.
    served = 0
    for data, fds in _requests(conn, 64):
        req = json.loads(data)
        if req.get("t") == "kill":   # a pod's run, which SIGKILL would end with its pod (Pods)
            for fd in fds:
                os.close(fd)
            Pods.stop_run(req.get("id"))
            continue
        loaded = len(sys.modules)
        _preload(req.get("preload") or ())
        if len(sys.modules) != loaded:   # the pods' ranks would import these from disk: new pods
            if forked or served >= COLLAPSE_AFTER_RUNS:
                # what the import left (dynamo: ~800 modules) in huge pages too, as the template's heap is: a
                # batch worker's zygote forks every rank of its later students from it (fixture classes of the
                # course, most of which import dynamo: ~6% less CPU in all)
                _huge_pages()
            Pods.retire()
        # Everything the zygote holds goes to the collector's permanent generation: a fork's collections
        # then never walk (and so never copy-on-write) the torch heap the children share.
        gc.freeze()
        if Pods.start(req, fds, conn, base):
            served += 1
            if served == COLLAPSE_AFTER_RUNS and not forked:
                _huge_pages()
                Pods.retire()
            continue
        # No reaping between fork and pidfd_open: the pid cannot be reused before we hold its pidfd.
        init = PidNamespaces.applies(req)
        pid = fork_held(PidNamespaces.fork if init else os.fork)
        if pid == 0:
            Pods.close_in_child()   # the pods' sockets are the zygote's: no run's process holds one
            leader(req, fds, conn.fileno(), init)
        LEADERS.add(pid)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        socket.send_fds(conn, [json.dumps({"t": "started", "id": req["id"], "pid": pid}).encode()], [pidfd])
        os.close(pidfd)
        served += 1
        if served == COLLAPSE_AFTER_RUNS and not forked:
            _huge_pages()
            Pods.retire()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        LEADERS.discard(pid)
        Pods.forget(pid)


def _requests(conn: socket.socket, max_fds: int):
    """(message, attached fds) as they come on `conn`, until the other end has closed it."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, max_fds)
        except InterruptedError:
            continue
        if not data:
            return
        yield data, fds


def _template(conn: socket.socket, listen: socket.socket | None = None,
              preload: list[str] | None = None) -> tuple[socket.socket, str] | None:
    """A template: it has imported (above, and `preload`) and never serves runs. For each request {"t":
    "spawn", "base", "python", "root"} with a grader process's socket attached, it forks a zygote for that
    process. Requests come on `conn` (a batch's workers inherit its other end) and, for a session's template,
    as datagrams on `listen` (launch.serve_template). Returns in that fork (the socket and the folder);
    returns None in the template once every holder of `conn` has closed it."""
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    _preload(preload or ())   # torch modules only, as for a run's preload
    _huge_pages()   # once, here: every fork shares them
    sources = [conn] if listen is None else [conn, listen]
    while True:
        for source in select.select(sources, [], [])[0]:
            try:
                data, fds, _flags, _addr = socket.recv_fds(source, 1 << 16, 1)
            except (InterruptedError, BlockingIOError):
                continue
            if source is conn and not data:
                return None
            spawned = _spawn(data, fds, sources)
            if spawned is not None:
                return spawned


def _spawn(data: bytes, fds: list[int], sources) -> tuple[socket.socket, str] | None:
    """Fork a zygote for one request; in the fork: (its socket, its folder). A request for another
    interpreter or checkout gets no fork: its socket is closed, and its sender starts a zygote cold."""
    try:
        req = json.loads(data)
        base = req["base"]
        same = req.get("python", sys.executable) == sys.executable and req.get("root", CHECKOUT) == CHECKOUT
    except (ValueError, KeyError, TypeError, AttributeError):
        base, same = None, False
    if not isinstance(base, str) or len(fds) != 1 or not same:
        for fd in fds:
            os.close(fd)
        return None
    pid = fork_held()
    if pid == 0:
        os.setsid()
        for source in sources:
            source.close()
        try:  # its own log, where the worker's Runner looks for it
            log = os.open(os.path.join(base, "zygote.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
        except OSError:
            pass
        return socket.socket(fileno=fds[0]), base
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    os.close(fds[0])
    return None


def main() -> None:
    if _PROBE is not None:   # before any fork: the probe's child is this process's to reap
        _LAYERS.append(_PROBE.layers())
    conn, base, forked = socket.socket(fileno=int(sys.argv[1])), sys.argv[2], False
    if sys.argv[3:4] == ["--template"]:   # BASE holds its log only; a session's template: its socket's fd
        options = dict(arg[2:].split("=", 1) for arg in sys.argv[4:] if arg.startswith("--") and "=" in arg)
        listen = socket.socket(fileno=int(options["listen"])) if options.get("listen", "").isdigit() else None
        spawned = _template(conn, listen, [m for m in options.get("preload", "").split(",") if m])
        if spawned is None:
            os._exit(0)
        (conn, base), forked = spawned, True
    try:
        serve(conn, base, forked)
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    _stop_all_runs()
    shutil.rmtree(base, ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    main()
