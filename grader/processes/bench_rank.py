"""Inside one rank of a bench run: time the student's function against a collective, on a plain gloo group.

A run whose request has `mode = Mode.BENCH` (records.py; its `bench` options in the spec) comes here instead of grading (rank.run dispatches). The
rank joins a plain gloo process group over the run's store: no grader backend, so no observation copies
and no reporting cost in the times. It loads the submission's definitions (as graded runs do) and, for
each size in the options, times `entry(tensor, rank, world_size)` (a float32 tensor of size/4 elements,
summed in place) and `dist.<baseline>(tensor)` (after a warm-up call up to 1 MiB):

    barrier; t0; `reps` calls; barrier-free t1; time = max over ranks of (t1 - t0) / reps

(the slowest rank decides, as a collective is only done when every rank is). The student's first result is
checked: every element must equal N(N+1)/2 when rank r starts from r + 1; a wrong sum or an
exception stops the student's side of the bench and is reported. Each measurement goes back as soon as it is
made, as a "note" whose `what` is JSON ({"impl", "bytes", "ms", "reps"}, or {"error"}), so a run stopped
at its time limit (a student's ring that hangs at some size) keeps what it measured.
"""
from __future__ import annotations

import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .real import make_store


def options(spec: dict) -> dict:
    """{"sizes", "baseline", "budget"}: the request's records.BenchOptions."""
    return spec.get("bench") or {}


def _reps(nbytes: int, budget: int) -> int:
    return max(1, min(20, budget // max(1, nbytes)))


def _timed(fn, numel: int, rank: int, reps: int):
    """(seconds per call, the slowest rank's; the first tensor, for checking). Every rank calls the same
    number of times; each call gets a fresh tensor holding rank + 1."""
    tensors = [torch.full((numel,), float(rank + 1)) for _ in range(reps)]
    dist.barrier()
    t0 = time.perf_counter()
    for t in tensors:
        fn(t)
    elapsed = torch.tensor([(time.perf_counter() - t0) / reps], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()), tensors[0]


def run(spec: dict, channel, load, init) -> None:
    """`load(spec)`: the submission's module; `init(**kwargs)`: torch's own init_process_group."""
    rank, ws = spec["rank"], spec["world_size"]
    opts = options(spec)
    timeout = timedelta(seconds=spec["timeout"])
    store = make_store(spec, ws)
    init(backend="gloo", store=store, rank=rank, world_size=ws, timeout=timeout)
    store.set(f"connected/{rank}", "1")
    store.wait([f"connected/{r}" for r in range(ws)], timeout)
    channel.send({"t": "ready"})
    error = None
    try:
        fn = getattr(load(spec), spec["entry"])
    except BaseException as err:  # noqa: BLE001
        fn, error = None, f"{type(err).__name__}: {err}"[:300]
    baseline = getattr(dist, opts.get("baseline", "all_reduce"))
    expected = ws * (ws + 1) / 2
    def report(**row):
        channel.send({"t": "note", "what": json.dumps(row)})

    if error:
        report(error=error)
    student_ok = fn is not None
    name = opts.get("baseline", "all_reduce")
    for nbytes in opts.get("sizes", [4096]):
        numel = max(1, nbytes // 4)
        reps = _reps(nbytes, opts.get("budget", 16 << 20))
        ok = torch.tensor([1 if student_ok else 0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)   # every rank runs the student's side, or none does
        if ok.item():
            try:
                seconds, first = _timed(lambda t: fn(t, rank, ws), numel, rank, reps)
                if torch.allclose(first, torch.full_like(first, expected)):
                    report(impl="student", bytes=numel * 4, ms=seconds * 1000, reps=reps)
                else:
                    student_ok = False
                    report(error=f"wrong sum at {nbytes} bytes")
            except BaseException as err:  # noqa: BLE001
                student_ok = False
                report(error=f"{type(err).__name__}: {err}"[:300])
        if nbytes <= 1 << 20:
            baseline(torch.ones(numel))              # warm-up (large sizes warm up on the way)
        seconds, _ = _timed(baseline, numel, rank, reps)
        report(impl=name, bytes=numel * 4, ms=seconds * 1000, reps=reps)
    channel.send({"t": "result", "how": "return", "values": {}})
