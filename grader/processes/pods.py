"""Pods: pid 1s kept from one graded run to the next, in the zygote.

A run's pid 1 costs ~9 ms of CPU (a fork of the zygote, its namespaces, its root, its exit): a fifth of a
2-rank run. A pod is such a pid 1 (tree.PidNamespaces) that, once its run is over, kills what is left of it
and waits for the zygote's next run, in the same pid namespace and root (Pods says what keeps runs apart).
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket

from . import store
from .cgroup import join_cgroup
from .linux import CLONE_NEWIPC, CLONE_NEWNET, reuse_heap, set_parent_death_signal, setns, small_pages, unshare
from .namespaces import enter_namespaces, loopback_up
from .root import enter_root, new_root
from .tree import CODE, EMPTY, LEADERS, PidNamespaces, fork_held, fork_ranks, report_exit


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
    live: dict[int, _Pod] = {}   # pid -> pod; each is in LEADERS too
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
        pid = fork_held(PidNamespaces.fork)
        if pid == 0:
            mine.close()
            _pod_main(theirs, folder, conn.fileno())
        LEADERS.add(pid)
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
            if pod.pid in LEADERS:   # not reaped yet: the pid is still this pod's
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
        small_pages()   # the pod and every rank
        reuse_heap()    # and what it frees kept for reuse (linux.reuse_heap)
        os.close(conn_fd)
        PidNamespaces.close_in_child()
        Pods.close_in_child()
        # and what else the zygote held as it forked this pod: the descriptors of the run it was handed
        # (sent on to the pod, which gets its own copies), never to be inherited by any later run's rank
        os.closerange(3, ctrl.fileno())
        os.closerange(ctrl.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        set_parent_death_signal(signal.SIGKILL)
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
                    join_cgroup(req["cgroup"])
                enter_namespaces(req["user_namespace"], pid=False)
                # the pod's own network and IPC namespaces, to come back to after a real-backend run's
                home = tuple(os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in ("net", "ipc"))
                own_files = new_root(folder, req["limits"]["tmp_mb"], CODE, cuda=False,
                                             empty=EMPTY[0] if EMPTY else None)
                os.chdir("/")
                enter_root(folder)
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
    unshare(CLONE_NEWNET | CLONE_NEWIPC)
    loopback_up()
    listening = store.listening(req)
    if listening is None:
        return True
    if os.fork() == 0:
        keep = listening.fileno()
        ctrl.close()
        os.closerange(3, keep)   # the run's descriptors are the pod's and its ranks'
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        hosted = store.host(req, listening)  # noqa: F841  (held until the pod kills this process)
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
    pids = fork_ranks(req, rank_fds, status_fd, [ctrl, done])
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
            report_exit(status_fd, pids[pid], status)
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
            setns(home[0], CLONE_NEWNET)
            setns(home[1], CLONE_NEWIPC)
        except OSError:
            os._exit(72)   # a pod that cannot leave them serves no other run (the zygote forgets it)
    os.close(status_fd)
    try:   # idle before the supervisor hears the run is over: the zygote may hand the pod its next run at once
        ctrl.send(b"idle")
    except OSError:
        os._exit(0)   # the zygote is gone
    os.close(done)
