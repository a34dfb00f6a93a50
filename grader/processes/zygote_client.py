"""The supervisor's side of its zygote (zygote.py): start it (a template's fork, or cold), wait for its hello
(the sandbox layers this machine allows, its GPUs), ask it for each run's process tree, start a new one when
it died, and give back what it held (its folder, the rank uids, the memory cgroup) on close."""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from .. import wire
from ..records import Mode, RunRequest
from ..submission import compiled
from . import launch, ring
from .cgroup import MemoryCgroup, default_total_mb
from .inflight import InFlight
from .launch import BASE_PREFIX
from .limits import Limits, claim_uid_block, uid_range
from .sandbox import Layers


def _sweep_stale_bases() -> None:
    """Remove run folders of supervisors that died without cleaning up (their pid is in the name)."""
    for path in Path(tempfile.gettempdir()).glob(f"{BASE_PREFIX}*-*"):
        pid = path.name[len(BASE_PREFIX):].split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


START_SECONDS = 30      # the zygote's answer to a run it is asked to start
PRELOAD_SECONDS = 600   # ... when it imports modules it was never asked for first (and warms torch.compile up)

class GraderError(RuntimeError):
    """The grader itself could not run (not the student's fault)."""


class ZygoteClient:
    """A supervisor's zygote and what its runs need of the machine: the zygote process and its socket, the
    layers and GPUs it found, a block of rank uids, the memory cgroup of every rank, the runs' folders."""

    def __init__(self, *, limits: Limits | None = None, sandbox: bool = True, python: str | None = None):
        self.limits = limits or Limits()
        self.use_sandbox = sandbox
        self.python = python or sys.executable
        self.conn: socket.socket | None = None
        self.proc: subprocess.Popen | launch.Forked | None = None
        self.hello: dict | None = None
        _sweep_stale_bases()
        early = launch.adopt(self.python)   # a zygote this process started before its imports
        self.base = early[0] if early is not None else launch.new_base()
        self._ids = 0
        self._compiled: dict[tuple, bytes | None] = {}   # _code's, a few submissions' worth
        # Rank uids: a block of this process's own (no other live grader, batch workers included, holds it),
        # and a new uid from it for every run, never reused while this Runner lives (up to UID_BLOCK runs).
        self.uid_block, self._uid_claim = claim_uid_block() if sandbox and os.geteuid() == 0 else (None, None)
        self._uids = 0
        self.cgroup: MemoryCgroup | None = None
        if sandbox and os.geteuid() == 0:
            self.cgroup = MemoryCgroup.create(f"grader-{os.getpid()}-{id(self) % 10000}",
                                              self.limits.total_mb or default_total_mb())
        self.start(early[1:] if early is not None else None)

    def start(self, started=None, cold: bool = False) -> None:
        """Start the zygote without waiting for it: its torch import overlaps the supervisor's work.
        `started`: (process, socket) of one launch.prestart() began (a process, or a launch.Forked).
        `cold`: never a template's fork (the template would not or could not fork one)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:   # a zygote that died: reaped, and its socket closed
            launch.stop_zygote(self.proc)
            self.conn.close()
        self.proc, self.conn = started if started is not None else \
            launch.start_zygote(self.base, self.python, template=not cold)
        self.hello = None
        self.asked: set = set()   # modules this zygote was asked to preload (imported by now)

    def _ready(self) -> dict:
        if self.hello is None:
            self.conn.settimeout(120)
            try:
                data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, 1)
            except (socket.timeout, OSError) as err:
                raise GraderError(f"zygote did not start: {err}; see {self.base / 'zygote.log'}") from err
            if not data and isinstance(self.proc, launch.Forked):  # no template forked one: start cold
                self.conn.close()
                self.proc = None
                self.start(cold=True)
                return self._ready()
            if not data:
                raise GraderError(f"zygote exited at start-up; see {self.base / 'zygote.log'}: "
                                  + self._zygote_log_tail())
            self.hello = json.loads(data)
            if fds and isinstance(self.proc, launch.Forked):
                self.proc.attach(self.hello["pid"], fds.pop())
            for fd in fds:
                os.close(fd)
            self.conn.settimeout(START_SECONDS)
        return self.hello

    def _zygote_log_tail(self) -> str:
        try:
            return (self.base / "zygote.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    @property
    def layers(self) -> dict:
        return self._ready()["layers"]

    @property
    def gpus(self) -> int:
        return self._ready()["gpus"]

    def next_uid(self) -> int:
        low, high = uid_range(self.uid_block)
        uid = low + self._uids % (high - low)
        self._uids += 1
        return uid

    def layer_names(self) -> list[str]:
        """The layers each run gets here, as catalog ids; seccomp and NO_NEW_PRIVS are named when missing."""
        lay, on = self.layers, self.use_sandbox
        layers = Layers(root=lay["root"] and on, namespaces=lay["namespaces"] and on,
                        user_namespace=lay["user_namespace"] and on, seccomp=lay.get("seccomp", False) and on,
                        no_new_privs=lay.get("no_new_privs", False) and on)
        names = layers.names(self.limits.tmp_mb)
        if self.cgroup is not None:
            names.append(f"memory_cgroup:{self.cgroup.limit_mb}")
        return names

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            launch.stop_zygote(self.proc)
            self.proc = None
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self._uid_claim is not None:
            self._uid_claim.close()
            self._uid_claim = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _launch(self, request: RunRequest, slot: int) -> InFlight:
        layers = self._ready()["layers"]
        namespaces = layers["namespaces"] and self.use_sandbox
        drop = layers["root"] and self.use_sandbox and self.uid_block is not None
        # A uid for each rank (no rank can signal, trace or read another, or see it in /proc); one for all the
        # ranks of a real NCCL run (its shared memory between them).
        uids = None
        if drop:
            uids = [self.next_uid() for _ in range(request.world_size)] if not request.cuda or not request.real \
                else [self.next_uid()] * request.world_size
        # With namespaces: the mount point of the run's new root (its /tmp is a tmpfs in there). Without:
        # the ranks' working folder itself, on the host's disk.
        workdir = Path(tempfile.mkdtemp(prefix=f"run{slot}-", dir=self.base))
        if uids is not None and not namespaces:
            os.chown(workdir, uids[0], uids[0])
        os.chmod(workdir, 0o700 if namespaces or uids is None else 0o711)
        limits = self.limits if request.time_scale == 1.0 else replace(
            self.limits, wall_s=self.limits.wall_s * request.time_scale, cpu_s=int(self.limits.cpu_s * request.time_scale))
        run = InFlight(request, slot, workdir, limits, uids)
        cwd = "/tmp" if namespaces else str(workdir)
        # A real-backend run's rendezvous store. In the run's own network namespace: a TCPStore that the
        # run's pid 1 hosts on loopback (no file locks, so the seccomp filter can deny them; the port is free,
        # the namespace is the run's). Without one: a FileStore in the run's folder. A graded run has none.
        store = None
        if request.real:
            store = ({"kind": "tcp", "host": "127.0.0.1", "port": random.randrange(20000, 32000)} if namespaces
                     else {"kind": "file", "path": f"{cwd}/.store"})
        mode = request.mode
        record = bool(request.perturb) and compiled.recorded(request.source, request.filename)
        code = self._code(request, record) if mode is Mode.SWITCH else None
        bench = asdict(request.bench) if request.bench is not None else None
        send_fds, keep = [], []
        for r in range(request.world_size):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            for end in (mine, theirs):
                _widen(end)
            mine.setblocking(False)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(out_r, False)
            chan = mine.detach()
            send_fds += [theirs.detach(), out_w]
            spec = {"t": "spec", "rank": r, "world_size": request.world_size, "source": request.source,
                    "code": 0 if code is not None else None, "code_magic": compiled.MAGIC,
                    "filename": request.filename, "entry": request.entry, "quantities": list(request.quantities),
                    "backend": request.backend, "mode": mode, "bench": bench, "store": store, "timeout": limits.wall_s,
                    "files": dict(request.files),
                    # a perturbed run records the student's own failed checks and goes on (rank.py): its data
                    # fails them by design; every other run raises, as Python does
                    "checks": "record" if record else "raise"}
            frame = wire.pack(spec, [code] if code is not None else [])
            if mode is Mode.SWITCH:   # its shared memory with the supervisor (ring.py), with the frame's first bytes
                _share(run, r, chan, frame)
            run.pending[chan] = frame
            run.channel[r] = chan
            run.readers[chan] = wire.FrameReader()
            run.fd_role.update({chan: ("chan", r), out_r: ("output", r)})
            keep += [chan, out_r]
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(status_r, False)
        send_fds.append(status_w)
        run.fd_role[status_r] = ("status", -1)
        run.lines[status_r] = bytearray()
        self._ids += 1
        req = {"id": self._ids, "world_size": request.world_size, "uids": uids, "cwd": cwd, "mode": mode,
               "workdir": str(workdir), "namespaces": namespaces, "user_namespace": layers["user_namespace"],
               "seccomp": layers.get("seccomp", False) and self.use_sandbox, "store": store,
               "no_new_privs": layers.get("no_new_privs", False) and self.use_sandbox,
               "limits": asdict(limits), "cuda": request.cuda,
               "cgroup": self.cgroup.procs if self.cgroup is not None else None, "preload": list(request.preload)}
        try:
            socket.send_fds(self.conn, [json.dumps(req).encode()], send_fds)
            # modules new to this zygote: it imports them (and, for torch.compile, compiles a step of its own)
            # before it answers, which a loaded machine can take minutes over;
            # a plain start, or modules it imported for an earlier run, answers within START_SECONDS
            self.conn.settimeout(PRELOAD_SECONDS if set(request.preload) - self.asked else START_SECONDS)
            try:
                data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, 1)
            finally:
                self.conn.settimeout(START_SECONDS)
            if not data or not fds:
                raise GraderError("zygote closed the connection")
            self.asked |= set(request.preload)
        except (OSError, GraderError) as err:
            for fd in send_fds + keep:
                os.close(fd)
            for shared in run.rings.values():
                shared.close()
            self.start()  # a fresh zygote for the next run
            raise GraderError(f"could not start a run: {err}") from err
        for fd in send_fds:
            os.close(fd)
        run.pidfd, run.zid = fds[0], self._ids
        for fd in fds[1:]:
            os.close(fd)
        try:
            run.pod = json.loads(data).get("pod") is True
        except (ValueError, AttributeError):
            pass
        run.started = run.last_progress = time.monotonic()
        run.oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        return run

    def _code(self, request: RunRequest, record: bool) -> bytes | None:
        """The submission as its ranks execute it (compiled.py), made once per source and mode (`record`: its
        failed checks recorded); None for a zygote of another interpreter (its ranks compile for themselves)
        or what cannot be compiled."""
        if self.python != sys.executable:
            return None
        key = (request.source, request.filename, record)
        if key not in self._compiled:
            if len(self._compiled) >= 8:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = compiled.rank_bytes(request.source, request.filename, record)
        return self._compiled[key]


SOCKET_BUFFER = 4 << 20   # what a rank's socket holds each way (the kernel's default, ~200 KiB, cut a MiB-sized
#                           operation into tens of reads and writes, each a wake-up of the other side)
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


def _share(run: InFlight, r: int, chan: int, frame: list) -> None:
    """Rank `r`'s memfd (ring.py), mapped here and passed with the first bytes of its spec `frame` (taken off
    it) on its socket `chan`, whose buffer is still empty: this never blocks. Where memfds cannot be made or
    mapped, the rank gets none, and every blob travels inline."""
    try:
        shared = ring.make()
    except OSError:
        return
    sock = socket.socket(fileno=chan)
    try:
        run.rings[r] = ring.Ring(shared, "grader")
        sent = socket.send_fds(sock, [frame[0]], [shared])
        frame[0] = memoryview(frame[0])[sent:]   # all of it (8 bytes): the rest, if ever, with the frame
    except (OSError, ValueError):
        mapped = run.rings.pop(r, None)
        if mapped is not None:
            mapped.close()
    finally:
        sock.detach()
        os.close(shared)


def _widen(sock: socket.socket) -> None:
    """SOCKET_BUFFER for the socket's sends (past net.core.wmem_max where the supervisor may: root)."""
    for option in (_SO_SNDBUFFORCE, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            return
        except OSError:
            continue
