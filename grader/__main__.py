"""`python -m grader ...`: see cli.py."""
import atexit
import os
import sys

# numpy's OpenBLAS starts a thread pool in every process that imports it (the supervisor, batch workers, the
# zygote): ~0.1 s of CPU each, taken from the ranks beside it, for the small arrays the grader never hands to
# BLAS. One thread unless the caller chose otherwise (ranks get the zygote's OpenBLAS, set up at its import).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

if len(sys.argv) > 1 and sys.argv[1] in ("grade", "check", "batch"):
    from .processes import launch   # the zygote's torch import runs beside the imports below
    if sys.argv[1] == "batch":
        launch.start_template()     # its workers' zygotes are forks of this one
    else:
        launch.prestart()

from .cli import main  # noqa: E402


def _leave(code) -> None:
    """Exit as sys.exit would, after the atexit handlers (a zygote's stop, temporary folders), without the
    interpreter's teardown of every module it imported (~30 ms, after the work is done and written)."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: what is left unwritten cannot be written
            pass
    os._exit(code & 0xFF)


try:
    status = main()
except SystemExit as stop:
    status = stop.code
_leave(status)
