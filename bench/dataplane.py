"""Benchmark part E: one all_reduce of float32 through the switch against torch's gloo, in the same run.

    .venv/bin/python bench/bench.py --dataplane-only      (part E alone, about 2 minutes on 2 cores)

One `Runner` (the grader's own: same zygote, same sandbox, same limits) runs one program three ways for each
world size and size: on gloo (a real-backend run), through the switch, and through the switch with the
all_reduce perturbed (as graded runs are). Each rank makes one all_reduce to warm up, then times 5, each from
the call to its return; a call's time is its slowest rank's, and a row shows the median of the 5. The ratio
is the perturbed switch's over gloo's. Method and results: docs/bench.md.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grader.processes.limits import Limits  # noqa: E402
from grader.processes.runner import Runner  # noqa: E402
from grader.records import RunRequest  # noqa: E402

SIZES = (1024, 1 << 20, 1 << 24)   # float32 elements: 4 KiB, 4 MiB, 64 MiB
WORLD_SIZES = (2, 4)
REPS = 5

# The buffer is named `x`, not a quantity the run reports (`t`): a graded rank sends a snapshot of a
# quantity's tensor as it enters each operation, which is not the data plane's cost.
PROGRAM = """
import time
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    x = torch.full(({numel},), float(rank + 1))
    dist.all_reduce(x)
    times = []
    for _ in range({reps}):
        started = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - started)
    return torch.tensor(times, dtype=torch.float64)
"""


def _median_ms(runner: Runner, world_size: int, numel: int, mode: str, perturb: tuple) -> float:
    request = RunRequest(world_size=world_size, source=PROGRAM.format(numel=numel, reps=REPS),
                         filename="dataplane.py", quantities=("t",), mode=mode, perturb=perturb)
    [out] = runner.run_many([request])
    if out.stop != "completed" or not all(r.result and r.result.values.get("t", {}).get("array") is not None
                                          for r in out.ranks):
        detail = "; ".join(bytes(r.output[-300:]).decode(errors="replace") for r in out.ranks)
        raise RuntimeError(f"{mode} run of {numel} elements at {world_size} ranks: {out.stop} {out.error or ''} {detail}")
    per_rank = [r.result.values["t"]["array"] for r in out.ranks]
    return statistics.median(max(times) for times in zip(*per_rank)) * 1000


def run(sizes=SIZES, world_sizes=WORLD_SIZES) -> list[dict]:
    """Print and return one row per world size and size."""
    print(f"E  one all_reduce of float32, gloo against the switch (median of {REPS} after a warm-up, slowest rank; "
          f"goal: perturbed / gloo <= 2x at 1,048,576):",
          flush=True)
    print(f"   {'ranks':>5} {'elements':>11} {'gloo':>10} {'switch':>10} {'perturbed':>10} {'perturbed / gloo':>17}",
          flush=True)
    rows = []
    # what the largest size needs: 64 MiB buffers, 5 + 1 operations through the switch
    with Runner(limits=Limits(wall_s=300, cpu_s=300)) as runner:
        for ws in world_sizes:
            for numel in sizes:
                gloo = _median_ms(runner, ws, numel, "real", ())
                switch = _median_ms(runner, ws, numel, "switch", ())
                perturbed = _median_ms(runner, ws, numel, "switch", ("all_reduce",))
                rows.append({"ranks": ws, "elements": numel, "gloo": gloo, "switch": switch, "perturbed": perturbed})
                print(f"   {ws:>5} {numel:>11,} {gloo:>7.2f} ms {switch:>7.2f} ms {perturbed:>7.2f} ms "
                      f"{perturbed / gloo:>16.2f}x", flush=True)
    return rows


if __name__ == "__main__":
    run()
