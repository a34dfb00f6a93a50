"""Notebook kernels forked from one warm interpreter, for the nbgrader round trip (tests/test_nbgrader_e2e.py).

    python tests/tools/warm_kernel.py --serve SOCKET     the server: imports torch, ipykernel and the grader's
                                                         notebook modules once, then forks a kernel per request
    python tests/tools/warm_kernel.py -f CONNECTION ...  what the kernelspec runs (write_kernelspec below): asks
                                                         the server for a kernel and stands for it

An autograde starts one kernel per notebook, and every notebook imports torch: 1.5-2 CPU-s each, most of a
notebook's cost there. A fork of the server costs milliseconds. The kernel itself is ipykernel's own
(`ipykernel.kernelapp.launch_new_instance` with the arguments jupyter_client gave), in the launcher's working
folder and environment, on the launcher's stdin, stdout and stderr (passed over the socket): nbgrader runs
it and talks to it as it would to `python -m ipykernel_launcher`.

The launcher is the process jupyter_client manages: a signal it gets (an interrupt, a terminate) goes on to
the kernel, the kernel's exit is its exit, and when the launcher dies (SIGKILL included) the kernel follows
(its lifeline pipe closes). The server forks only from its one thread, and runs no torch op before forking.
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
from pathlib import Path

SOCKET_ENV = "WARM_KERNEL_SOCKET"


def write_kernelspec(root: Path, python: str, sock: str) -> None:
    """Make `root` a folder for JUPYTER_PATH whose `python3` kernelspec is this launcher (it comes before
    every other `python3` on that path, the one ipykernel installs included)."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, str(Path(__file__).resolve()), "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python",
        "env": {SOCKET_ENV: sock}, "metadata": {"debugger": False}}))


# -- the server --------------------------------------------------------------------------------------

def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return json.loads(msg), list(fds)


def _kernel(request: dict, fds: list[int]) -> None:
    """In the fork: become the launcher's kernel. Never returns."""
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]   # none of them overwritten by another's dup2
        for target, fd in enumerate(high):   # stdin, stdout, stderr, the lifeline
            os.dup2(fd, target)
        os.closerange(4, 1 << 16)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

        def watch():   # the launcher is gone: so is its kernel
            try:
                os.read(3, 1)
            finally:
                os._exit(1)

        import threading
        threading.Thread(target=watch, daemon=True).start()
        sys.argv = ["ipykernel_launcher", *request["argv"]]   # sys.stdout and sys.stderr write to fds 1 and 2
        from ipykernel import kernelapp
        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


def serve(path: str) -> None:
    import gc

    import torch  # noqa: F401  (the point: imported once, shared by every kernel)
    import torch.distributed  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import grader.integrations.nbcheck  # noqa: F401  (what the notebooks' check cells import)
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    kernels: dict[int, socket.socket] = {}   # kernel pid -> its launcher's connection
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
                _kernel(request, fds)
            for fd in fds:
                os.close(fd)
            kernels[pid] = conn
            conn.send(json.dumps({"pid": pid}).encode())
        while kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = kernels.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()


# -- the launcher --------------------------------------------------------------------------------------

def launch(argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(os.environ[SOCKET_ENV])
    lifeline_read, lifeline_write = os.pipe()   # the write end stays here: the kernel watches the other
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    fds = array.array("i", [0, 1, 2, lifeline_read])
    conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
    os.close(lifeline_read)
    pid = json.loads(conn.recv(4096))["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    data = conn.recv(4096)   # the kernel's exit (a signal forwarded meanwhile does not interrupt it: PEP 475)
    if not data:
        return 1
    code = json.loads(data)["exit"]
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(launch(sys.argv[1:]))

