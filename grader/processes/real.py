"""Inside a rank of a real-backend run: the run's TCP store, and the student's calls timed on real gloo / NCCL.

A real-backend run (`check` and `grade` make one at the visible world size, bench runs are another kind)
runs the student's code on torch's own process groups, whose ranks share the run's network namespace and
the store its pid 1 hosts. Nothing of it is proof of anything: its answers are compared with the proven
ones, and the times it reports (each call of a process-group method, from the call to the completion of its
work, as the rank measured it) are shown as what the chapter measures, the real communication cost.
"""
from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch.distributed as dist

from .. import comm

FILENAMES: set = set()   # the student's files: where a call comes from
SNAPSHOT: list = []      # the rank's snapshot of its entry function's tensors, taken as a call starts
_perf = time.perf_counter


def make_store(spec: dict, world_size: int):
    """The run's rendezvous store, as the runner described it in the spec."""
    store = spec["store"]  # {"kind": "tcp", "host", "port"}: the run's pid 1 hosts it; {"kind": "file", "path"}
    if isinstance(store, dict) and store.get("kind") == "tcp":
        return dist.TCPStore(store["host"], store["port"], world_size, False, timedelta(seconds=spec["timeout"]))
    path = store["path"] if isinstance(store, dict) else store
    return dist.FileStore(path, world_size)


def _where() -> dict:
    frame = sys._getframe(2)
    api = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename in FILENAMES:
            return {"line": frame.f_lineno, "api": api}
        if "torch/distributed" in code.co_filename:
            qualname = getattr(code, "co_qualname", code.co_name)
            if "<locals>" not in qualname and not qualname.startswith("_") and "._" not in qualname:
                api = qualname
        frame = frame.f_back
    return {"line": None, "api": api}


def _bytes(value) -> int:
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _timed(name: str, original, channel):
    spec = comm.METHODS[name]

    def method(self, *args, **kwargs):
        where = _where()
        for snapshot in SNAPSHOT:
            snapshot()
        try:   # where a rank that never finishes last called the group (gloo's p2p work has no future to time)
            channel.send({"t": "timing_start", "op": spec.op, **where})
        except BaseException:  # noqa: BLE001  (the run is over)
            pass
        started = _perf()
        work = original(self, *args, **kwargs)
        named = dict(zip(spec.params, args))
        row = {"t": "timing", "op": spec.op, "method": name, **where,
               "bytes": _bytes(named.get(spec.sends)) if spec.sends else 0}

        def done(_future=None):
            try:
                channel.send({**row, "ms": round((_perf() - started) * 1000, 4)})
            except BaseException:  # noqa: BLE001  (the run is over)
                pass
        try:
            work.get_future().add_done_callback(done)
        except BaseException:  # noqa: BLE001  (a work without a future: timed at enqueue)
            done()
        return work
    method.__name__ = name
    return method


def install(channel) -> None:
    """Time every process-group method called from Python (dist.*, and what calls the group's methods)."""
    for name in comm.METHODS:
        original = getattr(dist.ProcessGroup, name, None)
        if original is not None and not getattr(original, "_grader_timed", False):
            method = _timed(name, original, channel)
            method._grader_timed = True
            setattr(dist.ProcessGroup, name, method)
