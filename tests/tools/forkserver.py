"""A fork server for the tests, with the standard library only: one warm interpreter that has done its
imports forks a child per request (tests/tools/warm_kernel.py: notebook kernels; tests/tools/warm_cli.py:
`python -m grader`).

A client connects to the server's SOCK_SEQPACKET socket and sends one JSON request with its file descriptors
attached (SCM_RIGHTS: the child's stdin, stdout, stderr, and whatever else the child expects). The server
forks, answers {"pid"}, and sends {"exit": code} on the same connection once the child has ended (code as
os.waitstatus_to_exitcode gives it: negative for a signal). The server forks only from its one thread.
"""
from __future__ import annotations

import array
import fcntl
import json
import os
import select
import signal
import socket
import sys
from typing import Callable


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return json.loads(msg), list(fds)


def serve(path: str, child: Callable[[dict, list[int]], None]) -> None:
    """Listen on `path` forever; `child(request, fds)` runs in each fork and never returns."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    children: dict[int, socket.socket] = {}   # child pid -> its client's connection
    read_end, write_end = os.pipe()           # SIGCHLD wakes the loop
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, read_end], [], [], 1.0)
        if read_end in ready:
            os.read(read_end, 4096)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for fd in (read_end, write_end):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                child(request, fds)
                os._exit(1)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.send(json.dumps({"pid": pid}).encode())
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()


def adopt(request: dict, fds: list[int]) -> None:
    """In the fork: the client's descriptors as 0, 1, 2, ... (every other one closed), and its working
    folder and environment."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]   # none of them overwritten by another's dup2
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), 1 << 16)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])


def finish(code: int) -> None:
    """In the fork: flush what the child printed and end with its exit code."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


def request(path: str, payload: dict, fds: list[int]) -> tuple[socket.socket, int]:
    """Ask the server at `path` for a child: (the connection its exit comes on, the child's pid)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        conn.sendmsg([json.dumps(payload).encode()],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        return conn, json.loads(conn.recv(4096))["pid"]
    except BaseException:
        conn.close()
        raise


def exit_code(conn: socket.socket) -> int | None:
    """The child's exit, once it has ended (None: the server is gone). A signal meanwhile does not interrupt
    the wait (PEP 475)."""
    data = conn.recv(4096)
    return json.loads(data)["exit"] if data else None
