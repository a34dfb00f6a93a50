"""Notebook kernels forked from one warm interpreter, for the nbgrader round trip (tests/test_nbgrader_e2e.py).

    python tests/tools/warm_kernel.py --serve SOCKET     the server: imports torch, ipykernel and the grader's
                                                         notebook modules once, then forks a kernel per request
    python tests/tools/warm_kernel.py -f CONNECTION ...  what the kernelspec runs (write_kernelspec below): asks
                                                         the server for a kernel and stands for it

An autograde starts one kernel per notebook, and every notebook imports torch: 1.5-2 CPU-s each, most of a
notebook's cost there. A fork of the server costs milliseconds. The kernel itself is ipykernel's own
(`ipykernel.kernelapp.launch_new_instance` with the arguments jupyter_client gave), in the launcher's working
folder and environment, on the launcher's stdin, stdout and stderr (passed over the socket, forkserver.py):
nbgrader runs it and talks to it as it would to `python -m ipykernel_launcher`.

The launcher is the process jupyter_client manages: a signal it gets (an interrupt, a terminate) goes on to
the kernel, the kernel's exit is its exit, and when the launcher dies (SIGKILL included) the kernel follows
(its lifeline pipe closes). The server forks only from its one thread, and runs no torch op before forking.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import forkserver   # tests/tools/forkserver.py (this folder is on sys.path: as a script, or as test_nbgrader_e2e imports it)

SOCKET_ENV = "WARM_KERNEL_SOCKET"


def write_kernelspec(root: Path, python: str, sock: str) -> None:
    """Make `root` a folder for JUPYTER_PATH whose `python3` kernelspec is this launcher (it comes before
    every other `python3` on that path, the one ipykernel installs included)."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, str(Path(__file__).resolve()), "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python",
        "env": {SOCKET_ENV: sock},
        # ipykernel's own spec says it takes CurveZMQ keys; so does this one (the kernel is ipykernel's)
        "metadata": {"debugger": False, "supported_encryption": ["curve"]}}))


# -- the server --------------------------------------------------------------------------------------

def _kernel(request: dict, fds: list[int]) -> None:
    """In the fork: become the launcher's kernel. Never returns."""
    try:
        forkserver.adopt(request, fds)   # stdin, stdout, stderr, the lifeline
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

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
    forkserver.finish(code)


def serve(path: str) -> None:
    import gc

    import torch  # noqa: F401  (the point: imported once, shared by every kernel)
    import torch.distributed  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import grader.integrations.nbcheck  # noqa: F401  (what the notebooks' check cells import)
    gc.freeze()
    forkserver.serve(path, _kernel)


# -- the launcher --------------------------------------------------------------------------------------

def launch(argv: list[str]) -> int:
    lifeline_read, lifeline_write = os.pipe()   # the write end stays here: the kernel watches the other
    conn, pid = forkserver.request(os.environ[SOCKET_ENV], {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)},
                                   [0, 1, 2, lifeline_read])
    os.close(lifeline_read)

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    code = forkserver.exit_code(conn)   # the kernel's exit
    if code is None:
        return 1
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(launch(sys.argv[1:]))

