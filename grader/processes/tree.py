"""A run's process tree, forked from the zygote: its leader, its pid 1, its ranks.

    leader L (no root only: enters a user namespace, builds the root, forks I)
      init I (pid 1 of the run's pid namespace: forks the ranks, reports each one's end, hosts a
              real-backend run's store, exits when every rank has)
        rank 0..N-1 (its own session, namespaces, limits and uid; seccomp; then rank.rank_main)

As root the zygote forks I straight into a new pid namespace (PidNamespaces), one process fewer per run; a
graded run's I is then usually a pod's (pods.py). The layers each process applies are sandbox.py's rooms.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

from .. import wire
from . import rank, seccomp, store
from .cgroup import join_cgroup
from .limits import Limits, apply_limits, drop_privileges, uid_budget
from .linux import CLONE_NEWPID, reuse_heap, set_parent_death_signal, setns, small_pages, unshare
from .namespaces import enter_namespaces, isolate_files, isolate_rank
from .root import enter_root, new_root
from .sandbox import Layers

# What a rank keeps of the grader's environment: nothing that could carry a TA's secrets.
KEEP_ENV = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "PYTHONIOENCODING", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
KEEP_PREFIXES = ("LC_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_")

# Set by the zygote as it starts serving, read by every run's processes (forks of it).
CODE: list[str] = []    # the interpreter's folders, placed read-only into every run's root
EMPTY: list[str] = []   # an empty folder: the second layer of a run's read-only overlays


LEADERS: set[int] = set()  # runs in flight (leader pids, not yet reaped)


def fork_held(fork=os.fork) -> int:
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
    def setup(cls, layers: Layers) -> None:
        if os.geteuid() != 0 or not layers.namespaces or layers.user_namespace:
            return
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                unshare(CLONE_NEWPID)
                setns(own, CLONE_NEWPID)
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
        unshare(CLONE_NEWPID)
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
            setns(cls.fd, CLONE_NEWPID)
        except OSError as err:  # checked at start-up; if it ever fails, a new zygote is safer than this one
            print(f"zygote: cannot restore its pid namespace: {err}", file=sys.stderr, flush=True)
            os._exit(70)

    @classmethod
    def close_in_child(cls) -> None:
        if cls.fd is not None:
            os.close(cls.fd)
            cls.fd = None


def init_process(req: dict, rank_fds: list[tuple[int, int]], status_fd: int) -> None:
    """pid 1 of the run's pid namespace: fork the ranks, report each one's end, exit when all have ended.
    In a real-backend run it also hosts the run's TCP store; a graded run has none (its ranks meet only at
    the grader's switch)."""
    set_parent_death_signal(signal.SIGKILL)
    if req["namespaces"]:
        try:
            enter_root(req["workdir"])
        except BaseException as err:
            os.write(status_fd, (json.dumps({"t": "leader_error", "error": f"new root: {err}"}) + "\n").encode())
            os._exit(71)
    listening = store.listening(req)
    pids = fork_ranks(req, rank_fds, status_fd, [] if listening is None else [listening])  # the store's: pid 1's
    hosted = store.host(req, listening)  # after the last fork: its server thread must never be copied into a child
    remaining = set(pids)
    while remaining:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid in remaining:
            remaining.discard(pid)
            report_exit(status_fd, pids[pid], status)
    del hosted, listening    # held until every rank has ended
    os._exit(0)  # as pid 1, this takes every leftover process of the run with it


def fork_ranks(req: dict, rank_fds: list[tuple[int, int]], status_fd: int, private: list) -> dict[int, int]:
    """Fork the run's ranks ({pid: rank}) and close their descriptors here. `private`: pid 1's own sockets
    and descriptors, closed in every rank."""
    pids = {}
    for r, (chan_fd, out_fd) in enumerate(rank_fds):
        pid = os.fork()
        if pid == 0:
            for item in private:
                item.close() if isinstance(item, socket.socket) else os.close(item)
            rank_process(req, r, chan_fd, out_fd, status_fd, rank_fds)
        pids[pid] = r
    for fds in rank_fds:
        for fd in fds:
            os.close(fd)
    return pids


def report_exit(status_fd: int, r: int, status: int) -> None:
    report = {"t": "exit", "rank": r}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["code"] = os.WEXITSTATUS(status)
    os.write(status_fd, (json.dumps(report) + "\n").encode())


def rank_process(req, r, chan_fd, out_fd, status_fd, all_fds) -> None:
    try:
        os.setsid()  # a rank that kills its own process group kills only itself
        set_parent_death_signal(signal.SIGKILL)
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
        limits = Limits(**req["limits"])
        if req["namespaces"] and req["mode"] == "switch":   # no shared network, /tmp, IPC or /proc with another rank
            isolate_rank(limits.tmp_mb, CODE)
        elif req["namespaces"]:   # a real-backend run: the network shared, files not
            isolate_files(limits.tmp_mb, shm=not req["cuda"], code=CODE)
        uid = req["uids"][r] if req.get("uids") else None
        apply_limits(limits, None if uid is None else uid_budget(limits, req["uids"]),
                             address_space=not req["cuda"])
        if uid is not None:
            drop_privileges(uid)
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


def leader(req: dict, fds: list[int], conn_fd: int, init: bool = False) -> None:
    """The run's leader: enter fresh namespaces, fork pid 1, and wait for it. SIGTERM stops the whole run.
    `init`: this process is pid 1 of the run's pid namespace already (PidNamespaces): it enters the other
    namespaces and is the run's pid 1 itself, one process fewer per run."""
    try:
        small_pages()   # pid 1 and every rank
        reuse_heap()    # and what it frees kept for reuse (linux.reuse_heap)
        os.close(conn_fd)
        PidNamespaces.close_in_child()
        os.setsid()
        status_fd = fds[-1]
        rank_fds = [tuple(fds[2 * r: 2 * r + 2]) for r in range(req["world_size"])]
        if req.get("cgroup"):  # before the new root: /sys is not in it (children inherit the cgroup)
            join_cgroup(req["cgroup"])
        if req["namespaces"]:
            enter_namespaces(req["user_namespace"], pid=not init)
            # a root whose every file is the run's own: then file locks carry nothing between runs
            req["own_files"] = new_root(req["workdir"], req["limits"]["tmp_mb"], CODE, cuda=req["cuda"],
                                                empty=EMPTY[0] if EMPTY else None)
            os.chdir("/")  # pid 1's pivot_root moves this process's root and cwd along
        if init:
            # pid 1 gets only the signals it handles: SIGTERM from the supervisor ends it, and with it the run
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            init_process(req, rank_fds, status_fd)
        child = os.fork()
        if child == 0:
            init_process(req, rank_fds, status_fd)
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
