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
process ids. The runner calls that process the run's leader either way. A graded run as root goes to a pod
(Pods: a pid 1 kept from one run to the next) and the answer says {"pod": true}, with a socket to the pod
attached instead: its end of the run, and the way to stop it. {"t": "kill", "id"} (no answer) ends the pod
of run `id` if it still serves that run.
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
    pids = _fork_ranks(req, rank_fds, status_fd, [] if listening is None else [listening])  # the store's: pid 1's
    store = _host_store(req, listening)  # after the last fork: its server thread must never be copied into a child
    remaining = set(pids)
    while remaining:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid in remaining:
            remaining.discard(pid)
            _report_exit(status_fd, pids[pid], status)
    del store, listening    # held until every rank has ended
    os._exit(0)  # as pid 1, this takes every leftover process of the run with it


def _fork_ranks(req: dict, rank_fds: list[tuple[int, int]], status_fd: int, private: list) -> dict[int, int]:
    """Fork the run's ranks ({pid: rank}) and close their descriptors here. `private`: pid 1's own sockets
    and descriptors, closed in every rank."""
    pids = {}
    for r, (chan_fd, out_fd) in enumerate(rank_fds):
        pid = os.fork()
        if pid == 0:
            for item in private:
                item.close() if isinstance(item, socket.socket) else os.close(item)
            _rank_process(req, r, chan_fd, out_fd, status_fd, rank_fds)
        pids[pid] = r
    for fds in rank_fds:
        for fd in fds:
            os.close(fd)
    return pids


def _report_exit(status_fd: int, r: int, status: int) -> None:
    report = {"t": "exit", "rank": r}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["code"] = os.WEXITSTATUS(status)
    os.write(status_fd, (json.dumps(report) + "\n").encode())


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
        # Nothing else either: whatever pid 1 holds besides (its own sockets) stays with it.
        os.closerange(3, chan_fd)
        os.closerange(chan_fd + 1, os.sysconf("SC_OPEN_MAX"))
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
        for name in [name for name in os.environ if name not in KEEP_ENV and not name.startswith(KEEP_PREFIXES)]:
            del os.environ[name]
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
        sandbox.small_pages()   # pid 1 and every rank
        os.close(conn_fd)
        PidNamespaces.close_in_child()
        Pods.close_in_child()
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


def _fork_held(fork=os.fork) -> int:
    """fork() with SIGCHLD blocked here until the caller unblocks it, holding the child (no reaping in
    between: its pid cannot be reused); the child gets SIGCHLD back as a plain process has it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    pid = fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return pid


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


class _Pod:
    def __init__(self, pid: int, ctrl: socket.socket, key: tuple):
        self.pid, self.ctrl, self.key = pid, ctrl, key
        self.run: int | None = None   # the id of the run it serves; None: idle


class Pods:
    """Pid 1s kept from one graded run to the next. A run's pid 1 costs ~9 ms of CPU (a fork of the zygote,
    its namespaces, its root, its exit): a fifth of a 2-rank run. A pod is such a pid 1 (PidNamespaces) that,
    once its run is over, kills what is left of it (kill(-1): every process of its pid namespace), reaps it,
    and waits for the zygote's next run, in the same pid namespace and root. Nothing of a run outlives it:
    every rank of a graded run makes a network, mount (its own /tmp) and IPC namespace of its own, a
    real-backend run gets a network and an IPC namespace of its own from the pod (its ranks share them, and
    a child of the pod hosts its store), every rank has a uid never used before, and the root is read-only. Where pods do
    not apply (no root: a user namespace; CUDA), each run has a pid 1 of its own, as before.

    The supervisor (runner.py) gets a socket instead of a pidfd: the pod closes its end once the run's last
    process is reaped (the run's end, as a pid 1's exit is), and a byte written to it stops the run (SIGTERM
    to a pid 1). SIGKILL, which would end the pod, goes through the zygote ({"t": "kill", "id"}), which
    kills the pod only while it still serves that run: a signal can never reach the run that came after."""
    live: dict[int, _Pod] = {}   # pid -> pod; each is in _LEADERS too
    generation = 0               # pods of an older one are not reused (the zygote imported more, or collapsed)
    made = 0

    @classmethod
    def key(cls, req: dict) -> tuple | None:
        if req.get("mode") not in ("switch", "real") or req.get("cuda") or not PidNamespaces.applies(req):
            return None
        return (req.get("cgroup"), req["limits"].get("tmp_mb"), cls.generation)

    @classmethod
    def start(cls, req: dict, fds: list[int], conn: socket.socket, base: str) -> bool:
        """Hand the run to an idle pod (a new one if none is idle); False: not a pod's run (or the pod was
        lost before it took it), the caller forks a pid 1 for it."""
        key = cls.key(req)
        if key is None:
            return False
        cls.check()
        pod = next((p for p in cls.live.values() if p.run is None and p.key == key), None) or cls._new(conn, base, key)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(pod.ctrl, [json.dumps(req).encode()], [*fds, theirs.fileno()])
        except OSError:
            mine.close()
            theirs.close()
            cls.end(pod)
            return False
        pod.run = req["id"]
        theirs.close()
        for fd in fds:
            os.close(fd)
        socket.send_fds(conn, [json.dumps({"t": "started", "id": req["id"], "pid": pod.pid, "pod": True}).encode()],
                        [mine.fileno()])
        mine.close()
        return True

    @classmethod
    def _new(cls, conn: socket.socket, base: str, key: tuple) -> _Pod:
        folder = os.path.join(base, f"pod-{cls.made}")
        cls.made += 1
        os.makedirs(folder, mode=0o700, exist_ok=True)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = _fork_held(PidNamespaces.fork)
        if pid == 0:
            mine.close()
            _pod_main(theirs, folder, conn.fileno())
        _LEADERS.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        theirs.close()
        pod = cls.live[pid] = _Pod(pid, mine, key)
        return pod

    @classmethod
    def check(cls) -> None:
        """Take in the pods' notices that their run is over; a pod that is gone, or of an older generation
        once idle, is ended."""
        for pod in list(cls.live.values()):
            if pod.run is not None:
                try:
                    notice = pod.ctrl.recv(64, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    notice = b""
                if notice != b"idle":
                    cls.end(pod)
                    continue
                pod.run = None
            if pod.key[-1] != cls.generation:
                cls.end(pod)

    @classmethod
    def stop_run(cls, run_id) -> None:
        """SIGKILL for run `run_id`: its pod ends with it, if the pod still serves it."""
        cls.check()
        for pod in list(cls.live.values()):
            if pod.run is not None and pod.run == run_id:
                cls.end(pod)

    @classmethod
    def retire(cls) -> None:
        cls.generation += 1
        cls.check()

    @classmethod
    def end(cls, pod: _Pod) -> None:
        cls.live.pop(pod.pid, None)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            if pod.pid in _LEADERS:   # not reaped yet: the pid is still this pod's
                os.kill(pod.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        pod.ctrl.close()

    @classmethod
    def forget(cls, pid: int) -> None:
        """A pod reaped (killed, or its setup failed)."""
        pod = cls.live.pop(pid, None)
        if pod is not None:
            pod.ctrl.close()

    @classmethod
    def close_in_child(cls) -> None:
        for pod in cls.live.values():
            pod.ctrl.close()
        cls.live = {}


def _pod_main(ctrl: socket.socket, folder: str, conn_fd: int) -> None:
    """A pod (Pods): its namespaces and root are made with its first run (whose status pipe hears any
    failure), then it serves runs until the zygote closes its socket. Never returns."""
    try:
        sandbox.small_pages()   # the pod and every rank
        os.close(conn_fd)
        PidNamespaces.close_in_child()
        Pods.close_in_child()
        # and what else the zygote held as it forked this pod: the descriptors of the run it was handed
        # (sent on to the pod, which gets its own copies), never to be inherited by any later run's rank
        os.closerange(3, ctrl.fileno())
        os.closerange(ctrl.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        sandbox.set_parent_death_signal(signal.SIGKILL)
        # pid 1 gets only the signals it handles: SIGTERM from the zygote ends it, and with it its run
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    except BaseException:  # noqa: BLE001
        os._exit(71)
    own_files, home = None, None
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 256)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)   # the zygote is gone
        req = json.loads(data)
        ws = req["world_size"]
        status_fd, done = fds[2 * ws], fds[2 * ws + 1]
        if own_files is None:
            try:
                if req.get("cgroup"):  # before the new root: /sys is not in it (children inherit the cgroup)
                    sandbox.join_cgroup(req["cgroup"])
                sandbox.enter_namespaces(req["user_namespace"], pid=False)
                # the pod's own network and IPC namespaces, to come back to after a real-backend run's
                home = tuple(os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in ("net", "ipc"))
                own_files = sandbox.new_root(folder, req["limits"]["tmp_mb"], _CODE, cuda=False,
                                             empty=_EMPTY[0] if _EMPTY else None)
                os.chdir("/")
                sandbox.enter_root(folder)
            except BaseException as err:  # noqa: BLE001
                os.write(status_fd, (json.dumps({"t": "leader_error", "error": f"new root: {err}"}) + "\n").encode())
                os._exit(71)
        req["own_files"] = own_files
        _pod_run(req, [tuple(fds[2 * r: 2 * r + 2]) for r in range(ws)], status_fd, done, ctrl, home)


def _store_process(req: dict, ctrl: socket.socket) -> bool:
    """A real-backend run's TCP store, in a pod: hosted by a child of the pod that runs no student code and
    lives until the pod ends the run (a store's server thread never runs in the pod, which forks again).
    True: the pod has moved into the run's own network and IPC namespaces (_pod_run leaves them after it)."""
    if (req.get("store") or {}).get("kind") != "tcp":
        return False
    # a network and an IPC namespace of the run's own, as a fresh pid 1's (its ranks share them: gloo's
    # connections); the pod leaves them with the run, and nothing the kernel keeps past a process (a SysV
    # segment, a message queue, a connection in TIME_WAIT) outlives them
    sandbox.unshare(sandbox.CLONE_NEWNET | sandbox.CLONE_NEWIPC)
    sandbox.loopback_up()
    listening = _store_socket(req)
    if listening is None:
        return True
    if os.fork() == 0:
        keep = listening.fileno()
        ctrl.close()
        os.closerange(3, keep)   # the run's descriptors are the pod's and its ranks'
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        store = _host_store(req, listening)  # noqa: F841  (held until the pod kills this process)
        while True:
            signal.pause()
    listening.close()
    return True


def _pod_run(req: dict, rank_fds: list[tuple[int, int]], status_fd: int, done: int, ctrl: socket.socket,
             home: tuple[int, int]) -> None:
    """One run in a pod: its ranks, each one's exit reported as pid 1 reports it, until every rank has ended
    or the supervisor writes to `done`; then every process of the namespace but the pod is killed and
    reaped, the zygote told, and `done` closed: the supervisor's sign that the run is over."""
    gc.freeze()
    try:
        moved = _store_process(req, ctrl)
    except BaseException as err:  # noqa: BLE001  (the run's ranks could not meet: said as pid 1 says it)
        os.write(status_fd, (json.dumps({"t": "leader_error", "error": f"store: {err}"}) + "\n").encode())
        os._exit(71)
    pids = _fork_ranks(req, rank_fds, status_fd, [ctrl, done])
    waiting = {}
    for pid, r in pids.items():
        try:
            waiting[os.pidfd_open(pid)] = pid
        except OSError:   # cannot be (a child, not reaped): waited for below all the same
            pass
    while waiting:
        ready = select.select([done, *waiting], [], [])[0]
        if done in ready:
            break   # stopped (a byte, or the supervisor's end closed): no more reports, as pid 1's SIGTERM
        for fd in ready:
            pid = waiting.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            _report_exit(status_fd, pids[pid], status)
    for fd in waiting:
        os.close(fd)
    try:
        os.kill(-1, signal.SIGKILL)   # as pid 1: every other process of this pid namespace, none outside it
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if moved:   # back home: the run's namespaces, with whatever its ranks left in them, are gone
        try:
            sandbox.setns(home[0], sandbox.CLONE_NEWNET)
            sandbox.setns(home[1], sandbox.CLONE_NEWIPC)
        except OSError:
            os._exit(72)   # a pod that cannot leave them serves no other run (the zygote forgets it)
    os.close(status_fd)
    try:   # idle before the supervisor hears the run is over: the zygote may hand the pod its next run at once
        ctrl.send(b"idle")
    except OSError:
        os._exit(0)   # the zygote is gone
    os.close(done)


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
        if req.get("t") == "kill":   # a pod's run, which SIGKILL would end with its pod (Pods)
            for fd in fds:
                os.close(fd)
            Pods.stop_run(req.get("id"))
            continue
        loaded = len(sys.modules)
        _preload(req.get("preload") or ())
        if len(sys.modules) != loaded:   # the pods' ranks would import these from disk: new pods
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
        pid = _fork_held(PidNamespaces.fork if init else os.fork)
        if pid == 0:
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
            Pods.retire()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _LEADERS.discard(pid)
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
    pid = _fork_held()
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
