"""`python -m grader ...` forked from one warm interpreter, for the tests' run_cli (tests/conftest.py).

    python tests/tools/warm_cli.py SOCKET     the server: imports the grader's command line once (numpy, the
                                              exercises' engine; never torch), then forks a command per request

The suite runs the command line about 180 times; a fresh interpreter spends ~0.2 s of CPU on the same imports
each time, a fork of this server milliseconds. The child runs grader/__main__.py itself (runpy, as `-m`
does), with the client's arguments, working folder, environment, stdin, stdout and stderr, in a session of
its own: its exit code and output are those of `python -m grader`. Only a client whose environment is the
server's uses it (a module may read a variable when it is imported); the others start a fresh interpreter.
"""
from __future__ import annotations

import gc
import os
import runpy
import signal
import sys
from pathlib import Path

import forkserver   # tests/tools/forkserver.py (this folder is on sys.path: as a script, or imported by conftest)

ROOT = Path(__file__).resolve().parents[2]


def _command(request: dict, fds: list[int]) -> None:
    """In the fork: `python -m grader ARGV`. Never returns."""
    code = 1
    try:
        os.setsid()   # as run_cli's start_new_session: its process group is its own
        forkserver.adopt(request, fds)   # stdin, stdout, stderr
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.argv = [str(ROOT / "grader" / "__main__.py"), *request["argv"]]
        try:
            runpy.run_module("grader", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
            if not isinstance(err.code, (int, type(None))):
                print(err.code, file=sys.stderr)
        import atexit
        atexit._run_exitfuncs()   # what the interpreter runs at its exit (the grader's zygote stop among them)
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
    forkserver.finish(code)


def serve(path: str) -> None:
    sys.path[0] = str(ROOT)   # as `python -m grader` from the checkout: its folder first on the path
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # what grader/__main__.py sets before numpy is imported
    import grader.cli  # noqa: F401  (the point: imported once, shared by every command)
    import grader.processes.launch  # noqa: F401
    gc.freeze()
    forkserver.serve(path, _command)


if __name__ == "__main__":
    serve(sys.argv[1])
