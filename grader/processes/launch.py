"""Starting a zygote, with the standard library only: `python -m grader grade|check` and each batch worker
start theirs before their own imports (numpy, the exercises, the report), so the zygote's `import torch`
runs beside them instead of after them. The first Runner of the process adopts it (runner.Runner).

A batch pays for `import torch` once, not once per worker: its parent starts a template zygote
(start_template), which imports and never runs anything; each worker asks it for a zygote of its own
(prestart), a fork of the template that serves that worker alone, exactly like a zygote started cold.

A template can also serve every grader process of a session (serve_template): it listens on a datagram
socket in a folder only its owner can enter, named by GRADER_TEMPLATE_SOCKET. A `grade`, `check` or `batch`
started with that variable set (and a notebook kernel's nbcheck) asks it for its zygote instead of importing
torch; the template forks one only for the same interpreter and checkout, and anything else (no template
there, another user, another interpreter) starts a zygote cold. The test suite shares one this way."""
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

BASE_PREFIX = "grader-runs-"   # <prefix><supervisor pid>-...: zygote_client._sweep_stale_bases finds the dead ones
ROOT = str(Path(__file__).resolve().parents[2])
TEMPLATE_ENV = "GRADER_TEMPLATE_FD"   # a batch worker's inherited socket to its parent's template zygote
TEMPLATE_SOCKET_ENV = "GRADER_TEMPLATE_SOCKET"   # the path of a session's template (serve_template)

_EARLY: tuple[Path, object, socket.socket] | None = None
_TEMPLATE: tuple[Path, subprocess.Popen, socket.socket] | None = None
_SESSION: tuple[Path, subprocess.Popen, socket.socket, str] | None = None   # serve_template's


class Forked:
    """A zygote forked from a template: not this process's child, so it is watched and stopped through the
    pidfd it sends with its hello (attach), never by a bare process id."""

    def __init__(self):
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.ended = False

    def attach(self, pid: int, pidfd: int) -> None:
        self.pid, self.pidfd = pid, pidfd

    def poll(self) -> int | None:
        """None while it runs (or before its hello: its socket says when it is gone), else 0."""
        if self.pidfd is None:
            return 0 if self.ended else None
        return 0 if select.select([self.pidfd], [], [], 0)[0] else None

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = 10) -> None:
        if self.pidfd is not None:
            self.ended = bool(select.select([self.pidfd], [], [], timeout)[0])
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


# glibc's malloc asks for transparent huge pages for the heap it grows (glibc 2.35+; older ones ignore the
# tunable): the ~150 MB that importing torch leaves in the zygote are then mostly in 2 MiB pages as they are
# made, and zygote._huge_pages collapses the rest in ~20 ms instead of copying it all (~0.4 s, before the
# first fork). Every fork then copies, and every exit unmaps, a page-table entry per 2 MiB there.
HUGE_HEAP_TUNABLE = "glibc.malloc.hugetlb=1"


def _huge_heap(tunables: str | None) -> str:
    """GLIBC_TUNABLES with malloc's huge pages on, unless it already says how malloc should use them."""
    if not tunables:
        return HUGE_HEAP_TUNABLE
    if "glibc.malloc.hugetlb=" in tunables:
        return tunables
    return f"{tunables}:{HUGE_HEAP_TUNABLE}"


def _start(args: list[str], pass_fds: tuple[int, ...], log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["GLIBC_TUNABLES"] = _huge_heap(env.get("GLIBC_TUNABLES"))
    env.pop(TEMPLATE_ENV, None)
    env.pop(TEMPLATE_SOCKET_ENV, None)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as log:
        return subprocess.Popen([args[0], "-m", "grader.processes.zygote", *args[1:]], pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd=ROOT, start_new_session=True)


def zygote(base: Path, python: str) -> tuple[subprocess.Popen, socket.socket]:
    """Start a zygote serving `base`, without waiting for it; (its process, the supervisor's socket)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = _start([python, str(child.fileno()), str(base)], (child.fileno(),), base / "zygote.log")
    child.close()
    return proc, parent


def start_template() -> None:
    """A batch parent's template zygote (once per process): its workers' zygotes are forks of it. None where
    a session's template (GRADER_TEMPLATE_SOCKET) serves them already."""
    global _TEMPLATE
    if _TEMPLATE is None and not os.environ.get(TEMPLATE_SOCKET_ENV):
        _TEMPLATE = _template()
        if _TEMPLATE is not None:
            atexit.register(stop_template)


def template_fd() -> int | None:
    """The template's socket, for a worker to inherit (pass_fds), or None when there is no template."""
    return None if _TEMPLATE is None else _TEMPLATE[2].fileno()


def stop_template() -> None:
    global _TEMPLATE
    template, _TEMPLATE = _TEMPLATE, None
    if template is not None:
        _stop(template)


def serve_template(preload: tuple[str, ...] = ()) -> str:
    """A template for every grader process that inherits GRADER_TEMPLATE_SOCKET (set here, in os.environ):
    its socket's path, in a folder of mode 700. It ends with this process, or with stop_serving. `preload`:
    torch modules it imports before its first fork, as a zygote imports what a run names (comm.PRELOAD_WITH),
    for a session whose gradings mostly need them: every zygote forked from it shares them instead of
    importing them again (torch._dynamo: ~800 modules, 1.5-2 CPU-s a zygote)."""
    global _SESSION
    if _SESSION is None:
        # mode 700: only this uid reaches the socket; named like a supervisor's folder, so that a later grader
        # sweeps it away if this process dies without removing it (zygote_client._sweep_stale_bases)
        folder = tempfile.mkdtemp(prefix=f"{BASE_PREFIX}{os.getpid()}-template-")
        path = os.path.join(folder, "socket")
        listen = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            listen.bind(path)   # bound before the template has started: requests wait in its queue
            started = _template(listen, preload)
        finally:
            listen.close()
        if started is None:
            shutil.rmtree(folder, ignore_errors=True)
            raise OSError("the template zygote could not start")
        _SESSION = (*started, path)
        atexit.register(stop_serving)
    os.environ[TEMPLATE_SOCKET_ENV] = _SESSION[3]
    return _SESSION[3]


def stop_serving() -> None:
    global _SESSION
    session, _SESSION = _SESSION, None
    if session is not None:
        _stop(session[:3])
        if os.environ.get(TEMPLATE_SOCKET_ENV) == session[3]:
            del os.environ[TEMPLATE_SOCKET_ENV]
        shutil.rmtree(os.path.dirname(session[3]), ignore_errors=True)


def _template(listen: socket.socket | None = None,
              preload: tuple[str, ...] = ()) -> tuple[Path, subprocess.Popen, socket.socket] | None:
    """Start a template zygote (listening on `listen` too, if given; importing `preload` first): (its folder,
    process, socket)."""
    base = new_base()   # for its log only
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    args = [sys.executable, str(child.fileno()), str(base), "--template"]
    fds = (child.fileno(),) + (() if listen is None else (listen.fileno(),))
    args += [f"--listen={listen.fileno()}"] if listen is not None else []
    args += [f"--preload={','.join(preload)}"] if preload else []
    try:
        proc = _start(args, fds, base / "zygote.log")
    except OSError:   # the workers start their own zygotes
        parent.close()
        shutil.rmtree(base, ignore_errors=True)
        return None
    finally:
        child.close()
    return base, proc, parent


def _from_template(base: Path) -> tuple[Forked, socket.socket] | None:
    """Ask a template for a zygote of this process's own: the batch's (inherited, once) or the session's
    (GRADER_TEMPLATE_SOCKET); None when there is none to ask. A template that will not fork one (another
    interpreter or checkout) closes the socket it was sent: the Runner then starts a zygote cold."""
    raw = os.environ.pop(TEMPLATE_ENV, "")
    path = os.environ.get(TEMPLATE_SOCKET_ENV, "")
    if not raw.isdigit() and not path:
        return None
    request = json.dumps({"t": "spawn", "base": str(base), "python": sys.executable, "root": ROOT}).encode()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if raw.isdigit():
            with socket.socket(fileno=int(raw)) as template:
                socket.send_fds(template, [request], [theirs.fileno()])
        else:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as template:
                template.settimeout(5)
                template.connect(path)
                socket.send_fds(template, [request], [theirs.fileno()])
    except OSError:
        mine.close()
        return None
    finally:
        theirs.close()
    return Forked(), mine


def start_zygote(base: Path, python: str, template: bool = True):
    """(process, socket) of a zygote serving `base`: a template's fork where one serves this interpreter,
    else a cold start. Neither waits for the zygote."""
    forked = _from_template(base) if template and python == sys.executable else None
    return forked or zygote(base, python)


def forget_parent() -> None:
    """In a process forked from a grader process (a batch's worker): what the parent started (its template,
    its zygote, its session's template) is the parent's to stop. Their sockets are detached, not closed: a
    descriptor this process was meant to keep (the template's, for prestart) stays open."""
    global _EARLY, _TEMPLATE, _SESSION
    for held in (_EARLY, _TEMPLATE, _SESSION):
        if held is not None:
            held[2].detach()
    _EARLY = _TEMPLATE = _SESSION = None


def prestart() -> None:
    """Start this process's first zygote now (a fork of a template where one serves this process).
    Discarded at exit if no Runner adopted it."""
    global _EARLY
    if _EARLY is None:
        base = new_base()
        _EARLY = (base, *start_zygote(base, sys.executable))
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
