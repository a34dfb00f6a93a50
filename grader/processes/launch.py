"""Starting a zygote, with the standard library only: `python -m grader grade|check` and each batch worker
start theirs before their own imports (numpy, the exercises, the report), so the zygote's `import torch`
runs beside them instead of after them. The first Runner of the process adopts it (runner.Runner)."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

BASE_PREFIX = "grader-runs-"   # <prefix><supervisor pid>-...: runner._sweep_stale_bases finds the dead ones
ROOT = str(Path(__file__).resolve().parents[2])

_EARLY: tuple[Path, subprocess.Popen, socket.socket] | None = None


def new_base() -> Path:
    """The supervisor's folder for its zygote's log and its runs' roots (mode 711: ranks pass through)."""
    base = Path(tempfile.mkdtemp(prefix=f"{BASE_PREFIX}{os.getpid()}-"))
    os.chmod(base, 0o711)
    return base


def zygote(base: Path, python: str) -> tuple[subprocess.Popen, socket.socket]:
    """Start a zygote serving `base`, without waiting for it; (its process, the supervisor's socket)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(base / "zygote.log", "ab") as log:
        proc = subprocess.Popen([python, "-m", "grader.processes.zygote", str(child.fileno()), str(base)],
                                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd=ROOT, start_new_session=True)
    child.close()
    return proc, parent


def prestart() -> None:
    """Start this process's first zygote now. Discarded at exit if no Runner adopted it."""
    global _EARLY
    if _EARLY is None:
        base = new_base()
        _EARLY = (base, *zygote(base, sys.executable))
        atexit.register(_discard)


def adopt(python: str) -> tuple[Path, subprocess.Popen, socket.socket] | None:
    """The prestarted zygote, once, for a Runner using this interpreter."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None and python != sys.executable:
        _stop(early)
        return None
    return early


def _discard() -> None:
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None:
        _stop(early)


def _stop(early) -> None:
    base, proc, conn = early
    conn.close()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    shutil.rmtree(base, ignore_errors=True)
