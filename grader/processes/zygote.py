"""The zygote: one warm process that has imported torch, and forks each run's process tree from it.

    python -m grader.processes.zygote FD BASE        (started by runner.Runner or launch.prestart; FD is a
                                                      SOCK_SEQPACKET to the supervisor, BASE its runs' folder)
    python -m grader.processes.zygote FD BASE --template [LISTEN]  (a template: forks a zygote per grader
                                                      process, on request; LISTEN: a session's datagram socket)

Ranks must not pay for their own cold `import torch` (about 2 s each); a fork of this process costs
milliseconds. The zygote runs no torch op and hosts no store (both make forked children hang; a run's store
is hosted by that run's pid 1, after its last fork), and never runs student code: that happens in the ranks,
forks of the run's pid 1, in the sandbox (see sandbox.py for the tree).

Protocol: the supervisor sends one JSON request per run with the run's pipe ends attached (SCM_RIGHTS);
the zygote forks the run's first process (its pid 1, or the leader above it, see sandbox.py) and answers
{"id", "pid"} with a pidfd of it attached, which the supervisor uses to stop the run without any race on
process ids. The runner calls that process the run's leader either way.
"""
from __future__ import annotations

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

# torch.compile in a rank: no precompiled header (hundreds of MB, past a rank's file-size limit), no pool of
# compile workers (processes a rank's budget has no room for), and scalar C++ kernels (the vectorized ones
# take g++ ~10 s per rank to compile, the scalar ones ~2 s: a grading's tensors are small). Read when
# inductor is imported; every run compiles afresh, in its own /tmp (no cache is shared between runs).
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

from . import sandbox  # noqa: E402  (the standard library only)

CHECKOUT = str(Path(__file__).resolve().parents[2])
# Which sandbox layers this machine allows, probed in a small child beside the import below rather than in a
# torch-sized one after it (~15 ms less before the first run); a template's forks share its result.
_LAYERS: list[sandbox.Layers] = []


def _early_probe() -> sandbox.Probe | None:
    try:
        return sandbox.Probe(sys.argv[2], sandbox.interpreter_paths(CHECKOUT))
    except (OSError, IndexError):   # serve() probes again, and fails there with the zygote's own words
        return None


_PROBE = _early_probe() if __name__ == "__main__" else None

import torch  # noqa: E402,F401  (the point of the zygote: imported once, shared by every fork)
import torch.distributed  # noqa: F401

# What the CPU can do (cpuinfo: CPUID, which traps in a VM, and /proc/cpuinfo), which the first tensor
# operation of every rank would read again (~0.2 ms): read once here, inherited by every fork (no op runs
# and no thread starts in the zygote).
torch._C._get_cpu_capability()

from .. import wire
from ..comm import PRELOAD_OTHER
from . import rank, seccomp

if seccomp.supported():   # the filters each rank installs, assembled once for every fork
    seccomp.program(True), seccomp.program(False)

# Every grader module a rank uses, imported here before any fork: a rank's root holds the interpreter and
# its libraries, not the grader's checkout, so a rank can never import grader code lazily from disk.
# nbcheck: the exercise notebook's check cells import it, and a rank loads a notebook's imports.
# (tests/test_sandbox.py checks this list against every grader import reachable from rank.py and the
# grader imports of the exercise's notebooks.)
PRELOAD = ("grader.processes.rank", "grader.processes.sandbox", "grader.processes.seccomp",
           "grader.submission.static", "grader.submission.definitions", "grader.submission.compiled", "grader.wire",
           "grader.integrations.nbcheck",
           "grader.integrations.bench")  # the notebooks import these two: ranks load a notebook's imports
for _name in PRELOAD:
    importlib.import_module(_name)

# What a rank keeps of the grader's environment: nothing that could carry a TA's secrets.
KEEP_ENV = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "PYTHONIOENCODING", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
KEEP_PREFIXES = ("LC_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_")


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


def _store_socket(req: dict) -> socket.socket | None:
    """The store's listening socket, bound before the ranks exist: a rank's first connection then waits in
    the backlog instead of being refused. (Refused, torch's client retries with a backoff of hundreds of
    milliseconds: measured 480 ms against 6 ms per run.)"""
    where = req.get("store") or {}
    if where.get("kind") != "tcp":
        return None
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((where["host"], where["port"]))
        sock.listen(128)
        return sock
    except OSError:  # the store below tries again on its own
        return None


def _host_store(req: dict, sock: socket.socket | None):
    """The run's TCP rendezvous store, hosted by pid 1, which runs no student code and outlives every rank:
    a rank that exits at once can never cut another rank's store operation short (as a store hosted by
    rank 0 could)."""
    where = req.get("store") or {}
    if where.get("kind") != "tcp":
        return None
    from datetime import timedelta
    try:
        return torch.distributed.TCPStore(where["host"], where["port"], req["world_size"], True,
                                          timedelta(seconds=req["limits"]["wall_s"] + 5), wait_for_workers=False,
                                          master_listen_fd=None if sock is None else sock.fileno())
    except BaseException:  # noqa: BLE001  (the ranks cannot connect and report it as a setup error)
        return None


def _init_process(req: dict, rank_fds: list[tuple[int, int]], status_fd: int) -> None:
    """pid 1 of the run's pid namespace: fork the ranks, report each one's end, exit when all have ended.
    In a real-backend run it also hosts the run's TCP store; a graded run has none (its ranks meet only at
    the grader's switch)."""
    sandbox.set_parent_death_signal(signal.SIGKILL)
    if req["namespaces"]:
        try:
            sandbox.enter_root(req["workdir"])
        except BaseException as err:
            os.write(status_fd, (json.dumps({"t": "leader_error", "error": f"new root: {err}"}) + "\n").encode())
            os._exit(71)
    listening = _store_socket(req)
    pids = {}
    for r, (chan_fd, out_fd) in enumerate(rank_fds):
        pid = os.fork()
        if pid == 0:
            if listening is not None:  # the store's socket is pid 1's alone
                listening.close()
            _rank_process(req, r, chan_fd, out_fd, status_fd, rank_fds)
        pids[pid] = r
    for fds in rank_fds:
        for fd in fds:
            os.close(fd)
    store = _host_store(req, listening)  # after the last fork: its server thread must never be copied into a child
    remaining = set(pids)
    while remaining:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid in remaining:
            remaining.discard(pid)
            report = {"t": "exit", "rank": pids[pid]}
            if os.WIFSIGNALED(status):
                report["signal"] = os.WTERMSIG(status)
            else:
                report["code"] = os.WEXITSTATUS(status)
            os.write(status_fd, (json.dumps(report) + "\n").encode())
    del store, listening    # held until every rank has ended
    os._exit(0)  # as pid 1, this takes every leftover process of the run with it


def _rank_process(req, r, chan_fd, out_fd, status_fd, all_fds) -> None:
    try:
        os.setsid()  # a rank that kills its own process group kills only itself
        sandbox.set_parent_death_signal(signal.SIGKILL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = {0, 1, 2, chan_fd}
        for fds in all_fds:
            for fd in fds:
                if fd not in keep:
                    os.close(fd)
        for fd in (devnull, status_fd):   # the run's status pipe is pid 1's: no rank ever holds it
            os.close(fd)
        limits = sandbox.Limits(**req["limits"])
        if req["namespaces"] and req["mode"] == "switch":   # no shared network, /tmp, IPC or /proc with another rank
            sandbox.isolate_rank(limits.tmp_mb, _CODE)
        elif req["namespaces"]:   # a real-backend run: the network shared, files not
            sandbox.isolate_files(limits.tmp_mb, shm=not req["cuda"], code=_CODE)
        uid = req["uids"][r] if req.get("uids") else None
        sandbox.apply_limits(limits, None if uid is None else sandbox.uid_budget(limits, req["uids"]),
                             address_space=not req["cuda"])
        if uid is not None:
            sandbox.drop_privileges(uid)
        if req.get("seccomp"):
            # File locks are a channel between runs through a file they share: denied, unless every file of this
            # run's root is its own (then torch.compile's locks work), or its file store needs them (no sandbox).
            seccomp.install(deny_locks=not req.get("own_files") and (req.get("store") or {}).get("kind") != "file")
        elif req.get("no_new_privs"):
            seccomp.set_no_new_privs()
        os.chdir(req["cwd"])
        kept = {k: v for k, v in os.environ.items() if k in KEEP_ENV or k.startswith(KEEP_PREFIXES)}
        os.environ.clear()
        os.environ.update(kept)
        os.environ.update({"HOME": req["cwd"], "TMPDIR": req["cwd"], "GLOO_SOCKET_IFNAME": "lo",
                           "NCCL_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
        sys.stdout.reconfigure(line_buffering=True)
    except BaseException as err:
        os.write(chan_fd, b"".join(bytes(b) for b in wire.pack({"t": "setup_error", "error": f"sandbox: {err}"})))
        os._exit(70)
    rank.rank_main(chan_fd)


def _leader(req: dict, fds: list[int], conn_fd: int, init: bool = False) -> None:
    """The run's leader: enter fresh namespaces, fork pid 1, and wait for it. SIGTERM stops the whole run.
    `init`: this process is pid 1 of the run's pid namespace already (PidNamespaces): it enters the other
    namespaces and is the run's pid 1 itself, one process fewer per run."""
    try:
        os.close(conn_fd)
        PidNamespaces.close_in_child()
        os.setsid()
        status_fd = fds[-1]
        rank_fds = [tuple(fds[2 * r: 2 * r + 2]) for r in range(req["world_size"])]
        if req.get("cgroup"):  # before the new root: /sys is not in it (children inherit the cgroup)
            sandbox.join_cgroup(req["cgroup"])
        if req["namespaces"]:
            sandbox.enter_namespaces(req["user_namespace"], pid=not init)
            # a root whose every file is the run's own: then file locks carry nothing between runs
            req["own_files"] = sandbox.new_root(req["workdir"], req["limits"]["tmp_mb"], _CODE, cuda=req["cuda"],
                                                empty=_EMPTY[0] if _EMPTY else None)
            os.chdir("/")  # pid 1's pivot_root moves this process's root and cwd along
        if init:
            # pid 1 gets only the signals it handles: SIGTERM from the supervisor ends it, and with it the run
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            _init_process(req, rank_fds, status_fd)
        child = os.fork()
        if child == 0:
            _init_process(req, rank_fds, status_fd)
        for fd in fds:
            os.close(fd)

        def stop(signum, frame):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not req["namespaces"]:  # no pid namespace: the session is the best handle we have
                try:
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                except ProcessLookupError:
                    pass

        signal.signal(signal.SIGTERM, stop)
        while True:
            try:
                os.waitpid(child, 0)
                break
            except ChildProcessError:
                break
        os._exit(0)
    except BaseException as err:
        try:
            os.write(fds[-1], (json.dumps({"t": "leader_error", "error": str(err)}) + "\n").encode())
        finally:
            os._exit(71)


_LEADERS: set[int] = set()  # runs in flight (leader pids, not yet reaped)


class PidNamespaces:
    """As root, the zygote forks each run's pid 1 directly into a new pid namespace: unshare(CLONE_NEWPID)
    applies to the zygote's next child only until setns() puts the zygote's own namespace back. The
    run then needs no leader process above its pid 1 (a fork and an exit of a torch-sized process fewer,
    about 5% of an honest batch's CPU). Checked once in a throwaway child; where it fails (no root: the
    pid namespace must then belong to the run's user namespace), each run keeps its leader."""
    fd: int | None = None

    @classmethod
    def setup(cls, layers: sandbox.Layers) -> None:
        if os.geteuid() != 0 or not layers.namespaces or layers.user_namespace:
            return
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                sandbox.unshare(sandbox.CLONE_NEWPID)
                sandbox.setns(own, sandbox.CLONE_NEWPID)
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            cls.fd = own
        else:
            os.close(own)

    @classmethod
    def applies(cls, req: dict) -> bool:
        return cls.fd is not None and req["namespaces"] and not req["user_namespace"]

    @classmethod
    def fork(cls) -> int:
        """fork() whose child is pid 1 of a new pid namespace; the zygote's own children stay in its own."""
        sandbox.unshare(sandbox.CLONE_NEWPID)
        try:
            pid = os.fork()
        except BaseException:
            cls._restore()
            raise
        if pid:
            cls._restore()
        return pid

    @classmethod
    def _restore(cls) -> None:
        try:
            sandbox.setns(cls.fd, sandbox.CLONE_NEWPID)
        except OSError as err:  # checked at start-up; if it ever fails, a new zygote is safer than this one
            print(f"zygote: cannot restore its pid namespace: {err}", file=sys.stderr, flush=True)
            os._exit(70)

    @classmethod
    def close_in_child(cls) -> None:
        if cls.fd is not None:
            os.close(cls.fd)
            cls.fd = None


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
    import ctypes
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
    """Import torch modules a submission names (functional collectives import ~800 modules on first use), and
    matplotlib's pyplot (comm.PRELOAD_OTHER), here, once, before forking its ranks: a cost of the grader must
    not count against a run's time."""
    import importlib
    for name in modules:
        if isinstance(name, str) and name.split(".")[0] in ("torch", *PRELOAD_OTHER) and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (not a module: the rank will say what the student wrote)
                pass


def _stop_all_runs() -> None:
    """The supervisor is gone: nobody enforces time limits any more, so stop every run now."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(_LEADERS):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(30):
            _reap()
            if not _LEADERS:
                return
            time.sleep(0.1)


_CODE: list[str] = []  # the interpreter's folders, placed read-only into every run's root
_EMPTY: list[str] = []  # an empty folder: the second layer of a run's read-only overlays


def serve(conn: socket.socket, base: str, forked: bool = False) -> None:
    _CODE[:] = sandbox.interpreter_paths(CHECKOUT)
    empty = os.path.join(base, "empty")
    os.makedirs(empty, mode=0o755, exist_ok=True)
    _EMPTY[:] = [empty]
    if not _LAYERS:
        _LAYERS.append(sandbox.probe(base, _CODE))
    layers = _LAYERS[0]
    PidNamespaces.setup(layers)
    rank.install_hooks()
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
        _preload(req.get("preload") or ())
        # Everything the zygote holds goes to the collector's permanent generation: a fork's collections
        # then never walk (and so never copy-on-write) the torch heap the children share.
        gc.freeze()
        # No reaping between fork and pidfd_open: the pid cannot be reused before we hold its pidfd.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        init = PidNamespaces.applies(req)
        pid = PidNamespaces.fork() if init else os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            _leader(req, fds, conn.fileno(), init)
        _LEADERS.add(pid)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        socket.send_fds(conn, [json.dumps({"t": "started", "id": req["id"], "pid": pid}).encode()], [pidfd])
        os.close(pidfd)
        served += 1
        if served == COLLAPSE_AFTER_RUNS and not forked:
            _huge_pages()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _LEADERS.discard(pid)


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


def _template(conn: socket.socket, listen: socket.socket | None = None) -> tuple[socket.socket, str] | None:
    """A template: it has imported (above) and never serves runs. For each request {"t": "spawn", "base",
    "python", "root"} with a grader process's socket attached, it forks a zygote for that process. Requests
    come on `conn` (a batch's workers inherit its other end) and, for a session's template, as datagrams
    on `listen` (launch.serve_template). Returns in that fork (the socket and the folder); returns None in the
    template once every holder of `conn` has closed it."""
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
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
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
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
        listen = socket.socket(fileno=int(sys.argv[4])) if sys.argv[4:] else None
        spawned = _template(conn, listen)
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
