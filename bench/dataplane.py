"""Benchmark part E: one all_reduce of float32 through the switch against torch's gloo, in the same run.

    .venv/bin/python bench/bench.py --dataplane-only      (part E alone, about 2 minutes on 2 cores)

One `Runner` (the grader's own: same zygote, same sandbox, same limits) runs one program three ways for each
world size and size: on gloo (a real-backend run), through the switch, and through the switch with the
all_reduce perturbed (as graded runs are). Each rank makes one all_reduce to warm up, then times 5, each from
the call to its return; a call's time is its slowest rank's, and a run's figure the median of the 5. The three
kinds of run are interleaved, ROUNDS times; a row shows the median of each kind's figures and the ratio of the
perturbed switch's to gloo's. A switch run must keep its last operation's values in the record (evidence).
Method and results: docs/bench.md.
"""
from __future__ import annotations

import gc
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
ROUNDS = 5

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


def _median_ms(runner: Runner, world_size: int, numel: int, mode: str, perturb: tuple) -> float | str:
    """The median call's time in ms, or why the run gave none (its stop, or "evidence lost": a switch run
    whose last operation's values the record did not keep)."""
    request = RunRequest(world_size=world_size, source=PROGRAM.format(numel=numel, reps=REPS),
                         filename="dataplane.py", quantities=("t",), mode=mode, perturb=perturb)
    [out] = runner.run_many([request])
    if out.stop != "completed" or not all(r.result and r.result.values.get("t", {}).get("array") is not None
                                          for r in out.ranks):
        return str(out.stop)
    if mode == "switch" and not all(r.calls and r.calls[-1].retained for r in out.ranks):
        return "evidence lost"
    per_rank = [r.result.values["t"]["array"] for r in out.ranks]
    del out
    gc.collect()   # the run's records (calls refer to their partners: cycles) freed before the next run's
    return statistics.median(max(times) for times in zip(*per_rank)) * 1000


def _cell(value) -> str:
    return f"{value:>7.2f} ms" if isinstance(value, float) else f"{value:>10}"


def run(sizes=SIZES, world_sizes=WORLD_SIZES, rounds: int = ROUNDS) -> list[dict]:
    """Print and return one row per world size and size: each figure the median over `rounds` runs, the three
    kinds of run interleaved (a busy machine's slow phases then fall on all three alike)."""
    print(f"E  one all_reduce of float32, gloo against the switch (median of {REPS} after a warm-up, slowest rank; "
          f"median of {rounds} rounds; goal: perturbed / gloo <= 2x at 1,048,576):", flush=True)
    print(f"   {'ranks':>5} {'elements':>11} {'gloo':>10} {'switch':>10} {'perturbed':>10} {'perturbed / gloo':>17}",
          flush=True)
    rows = []
    kinds = {"gloo": ("real", ()), "switch": ("switch", ()), "perturbed": ("switch", ("all_reduce",))}
    # what the largest size needs: 64 MiB buffers, 5 + 1 operations through the switch
    with Runner(limits=Limits(wall_s=300, cpu_s=300)) as runner:
        for ws in world_sizes:
            for numel in sizes:
                got: dict[str, list] = {kind: [] for kind in kinds}
                for _ in range(rounds):
                    for kind, (mode, perturb) in kinds.items():
                        got[kind].append(_median_ms(runner, ws, numel, mode, perturb))
                row = {"ranks": ws, "elements": numel}
                for kind, values in got.items():
                    failed = [v for v in values if isinstance(v, str)]
                    row[kind] = failed[0] if failed else statistics.median(values)
                timed = all(isinstance(row[k], float) for k in ("gloo", "perturbed"))
                ratio = row["perturbed"] / row["gloo"] if timed else None
                rows.append(row)
                print(f"   {ws:>5} {numel:>11,} {_cell(row['gloo'])} {_cell(row['switch'])} {_cell(row['perturbed'])} "
                      f"{f'{ratio:.2f}x' if ratio is not None else '-':>17}", flush=True)
    return rows


if __name__ == "__main__":
    run()
