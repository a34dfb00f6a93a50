"""Starting a zygote, with the standard library only: `python -m grader grade|check` and each batch worker
start theirs before their own imports (numpy, the exercises, the report), so the zygote's `import torch`
runs beside them instead of after them. The first Runner of the process adopts it (runner.Runner).

A batch pays for `import torch` once, not once per worker: its parent starts a template zygote
(start_template), which imports and never runs anything; each worker asks it for a zygote of its own
(prestart), a fork of the template that serves that worker alone, exactly like a zygote started cold."""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

BASE_PREFIX = "grader-runs-"   # <prefix><supervisor pid>-...: runner._sweep_stale_bases finds the dead ones
ROOT = str(Path(__file__).resolve().parents[2])
TEMPLATE_ENV = "GRADER_TEMPLATE_FD"   # a batch worker's inherited socket to its parent's template zygote

_EARLY: tuple[Path, object, socket.socket] | None = None
_TEMPLATE: tuple[Path, subprocess.Popen, socket.socket] | None = None


class Forked:
    """A zygote forked from a template: not this process's child, so it is watched and stopped through the
    pidfd it sends with its hello (attach), never by a bare process id."""

    def __init__(self):
        self.pid: int | None = None
        self.pidfd: int | None = None

    def attach(self, pid: int, pidfd: int) -> None:
        self.pid, self.pidfd = pid, pidfd

    def poll(self) -> int | None:
        """None while it runs (or before its hello: its socket says when it is gone), else 0."""
        if self.pidfd is None:
            return None
        return 0 if select.select([self.pidfd], [], [], 0)[0] else None

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = 10) -> None:
        if self.pidfd is not None:
            select.select([self.pidfd], [], [], timeout)
            os.close(self.pidfd)
            self.pidfd = None


def stop_zygote(proc) -> None:
    """Kill a zygote (a cold one by its process group, a forked one by its pidfd) and wait for it."""
    if isinstance(proc, Forked):
        proc.kill()
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def new_base() -> Path:
    """The supervisor's folder for its zygote's log and its runs' roots (mode 711: ranks pass through)."""
    base = Path(tempfile.mkdtemp(prefix=f"{BASE_PREFIX}{os.getpid()}-"))
    os.chmod(base, 0o711)
    return base


def _start(args: list[str], pass_fd: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop(TEMPLATE_ENV, None)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as log:
        return subprocess.Popen([args[0], "-m", "grader.processes.zygote", *args[1:]], pass_fds=[pass_fd], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd=ROOT, start_new_session=True)


def zygote(base: Path, python: str) -> tuple[subprocess.Popen, socket.socket]:
    """Start a zygote serving `base`, without waiting for it; (its process, the supervisor's socket)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = _start([python, str(child.fileno()), str(base)], child.fileno(), base / "zygote.log")
    child.close()
    return proc, parent


def start_template() -> None:
    """A batch parent's template zygote (once per process): its workers' zygotes are forks of it."""
    global _TEMPLATE
    if _TEMPLATE is None:
        base = new_base()   # for its log only
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = _start([sys.executable, str(child.fileno()), str(base), "--template"], child.fileno(),
                          base / "zygote.log")
        except OSError:   # the workers start their own zygotes
            parent.close()
            shutil.rmtree(base, ignore_errors=True)
            return
        finally:
            child.close()
        _TEMPLATE = (base, proc, parent)
        atexit.register(stop_template)


def template_fd() -> int | None:
    """The template's socket, for a worker to inherit (pass_fds), or None when there is no template."""
    return None if _TEMPLATE is None else _TEMPLATE[2].fileno()


def stop_template() -> None:
    global _TEMPLATE
    template, _TEMPLATE = _TEMPLATE, None
    if template is not None:
        _stop(template)


def _from_template(base: Path) -> tuple[Forked, socket.socket] | None:
    """Ask the inherited template for a zygote of this process's own; None when there is none to ask."""
    raw = os.environ.pop(TEMPLATE_ENV, "")
    if not raw.isdigit():
        return None
    try:
        template = socket.socket(fileno=int(raw))
    except OSError:
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        socket.send_fds(template, [json.dumps({"t": "spawn", "base": str(base)}).encode()], [theirs.fileno()])
    except OSError:
        mine.close()
        return None
    finally:
        theirs.close()
        template.close()
    return Forked(), mine


def prestart() -> None:
    """Start this process's first zygote now (a fork of the batch's template when this is a batch worker).
    Discarded at exit if no Runner adopted it."""
    global _EARLY
    if _EARLY is None:
        base = new_base()
        forked = _from_template(base)
        _EARLY = (base, *(forked or zygote(base, sys.executable)))
        atexit.register(_discard)


def adopt(python: str) -> tuple[Path, object, socket.socket] | None:
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
    conn.close()   # a forked zygote that has not said hello yet exits when it finds its socket closed
    stop_zygote(proc)
    shutil.rmtree(base, ignore_errors=True)
