"""Benchmark: batch grading against the seed-style harness, side by side in one run.

    .venv/bin/python bench/bench.py            (or: make bench)   -- about 4 minutes on 2 cores
    .venv/bin/python bench/bench.py --quick    -- smaller counts, for a smoke test

Prints (method in docs/bench.md):
  A. `batch --jobs 2` over N honest submissions (median of --batch-reps runs, fresh output folder each);
  B. the seed-style harness over the same N, 2 submissions at a time (bench/seed_harness.py: a cold
     interpreter + mp.spawn per world size 2, 3, 4), run once; the ratio B / A (goal: >= 40x);
  C. per-submission cost of `batch --jobs 2` at N and at --scale submissions;
  D. a single `grade` against `python -c "import torch"` (median of --reps runs each, interleaved);
  E. one all_reduce of 1,024, 1M and 16M float32 through the switch (plain and perturbed) against gloo, at 2
     and 4 ranks, in one Runner (bench/dataplane.py); `--dataplane-only` runs E alone;
  F. `grade` of a step compiled with torch.compile (tests/fixtures/compile/h51_...) against the same file
     without its `@torch.compile` line (median of --compile-reps each, interleaved, after one compiled
     grading that warms the machine's file cache up); `--compile-only`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# E runs the switch in this process: numpy's OpenBLAS with one thread, as `python -m grader` sets it up
# (grader/__main__.py), read when numpy loads; the commands this script starts get the environment as it was
_BLAS = os.environ.get("OPENBLAS_NUM_THREADS")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import dataplane  # noqa: E402  bench/dataplane.py, beside this script
if _BLAS is None:
    del os.environ["OPENBLAS_NUM_THREADS"]

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TIMEOUT = 900

# Honest submissions in the seed reference's style: each initialises (and destroys) its own process group
# on the seed's fixed port; the grader joins them to its own group, the baseline points them at a free port.
TEMPLATES = [
    """# student {i}: the seed's reference answer
import os
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        gradient = torch.full((1024,), float(rank + 1))
        dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
        gradient /= world_size
        local_feature = torch.full((128,), float(rank))
        gathered_list = [torch.zeros_like(local_feature) for _ in range(world_size)]
        dist.all_gather(gathered_list, local_feature)
        full_feature = torch.cat(gathered_list, dim=0)
        expected = torch.full_like(gradient, float(sum(range(1, world_size + 1))) / world_size)
        assert torch.allclose(gradient, expected), 'All-Reduce 结果不正确！'
    finally:
        dist.destroy_process_group()
""",
    """# student {i}: ReduceOp.AVG, returns both
import os
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    gradient = torch.full((1024,), rank + 1.0)
    dist.all_reduce(gradient, op=dist.ReduceOp.AVG)
    local_feature = torch.full((128,), float(rank))
    gathered_list = [torch.empty_like(local_feature) for _ in range(world_size)]
    dist.all_gather(gathered_list, local_feature)
    full_feature = torch.cat(gathered_list)
    dist.destroy_process_group()
    return gradient, full_feature
""",
    """# student {i}: ones * (rank + 1), default op
import os
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group(backend='gloo', rank=rank, world_size=world_size)
    gradient = torch.ones(1024) * (rank + 1)
    dist.all_reduce(gradient)
    gradient = gradient / world_size
    gathered = [torch.zeros(128) for _ in range(world_size)]
    dist.all_gather(gathered, torch.ones(128) * rank)
    full_feature = torch.cat(gathered, dim=0)
    dist.destroy_process_group()
    return gradient, full_feature
""",
]


def make_class(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"student{i:03d}.py").write_text(TEMPLATES[i % len(TEMPLATES)].format(i=i), encoding="utf-8")
    return folder


def timed(cmd: list[str], timeout: float = TIMEOUT, **kwargs) -> float:
    """Wall seconds of one command; killed by process group if it overruns; it must succeed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, **kwargs)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return elapsed


def grader_batch(folder: Path, out: Path, jobs: int) -> float:
    elapsed = timed([PY, "-m", "grader", "batch", str(folder), "--out", str(out), "--jobs", str(jobs), "--lang", "en"])
    totals = [line.split(",")[1] for line in (out / "grades.csv").read_text().splitlines()[1:]]
    assert totals and all(t == "100" for t in totals), f"not every honest submission got 100: {totals}"
    return elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_one(path: Path) -> float:
    started = time.perf_counter()
    for ws in (2, 3, 4):
        timed([PY, str(ROOT / "bench" / "seed_harness.py"), str(path), str(ws), str(free_port())], timeout=300)
    return time.perf_counter() - started


def seed_baseline(folder: Path, parallel: int) -> tuple[float, list[float]]:
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        each = list(pool.map(seed_one, sorted(folder.glob("*.py"))))
    return time.perf_counter() - started, each


def grade_vs_import(path: Path, reps: int, tmp: Path) -> tuple[list[float], list[float]]:
    grade, imp = [], []
    for _ in range(reps):
        imp.append(timed([PY, "-c", "import torch"]))
        grade.append(timed([PY, "-m", "grader", "grade", str(path), "--results", str(tmp / "r.json"), "--lang", "en"]))
    return grade, imp


COMPILED = ROOT / "tests" / "fixtures" / "compile" / "h51_torch_compile_step_communicates.py"


def compiled_vs_plain(reps: int, tmp: Path) -> tuple[list[float], list[float]]:
    source = COMPILED.read_text(encoding="utf-8")
    assert "@torch.compile\n" in source
    compiled, plain = tmp / "compiled.py", tmp / "plain.py"
    compiled.write_text(source, encoding="utf-8")
    plain.write_text(source.replace("@torch.compile\n", ""), encoding="utf-8")

    def grade(path: Path) -> float:
        results = tmp / f"{path.stem}.json"
        elapsed = timed([PY, "-m", "grader", "grade", str(path), "--results", str(results), "--lang", "en"])
        score = json.loads(results.read_text(encoding="utf-8"))["score"]
        assert score == 100, f"{path.name}: {score}"
        return elapsed
    grade(compiled)   # the first import of dynamo's ~800 modules reads them from disk (once)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        times[0].append(grade(compiled))
        times[1].append(grade(plain))
    return times


def report_compile(reps: int, tmp: Path) -> None:
    compiled, plain = compiled_vs_plain(reps, tmp)
    c, p = statistics.median(compiled), statistics.median(plain)
    print(f"F  `grade` of a torch.compile'd step: median {c:.2f} s over {reps} (runs {', '.join(f'{x:.2f}' for x in compiled)}); "
          f"uncompiled: median {p:.2f} s; ratio {c / p:.1f}x (goal <= 4x)", flush=True)


def machine() -> str:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, torch {torch.__version__}, {platform.platform()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=12, help="submissions for A and B (default %(default)s)")
    ap.add_argument("--scale", type=int, default=200, help="submissions for the scaling run (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch-reps", type=int, default=3, help="runs of A (median)")
    ap.add_argument("--reps", type=int, default=5, help="runs of D, each side (median)")
    ap.add_argument("--no-baseline", action="store_true", help="skip B (about 2 minutes on 2 cores)")
    ap.add_argument("--quick", action="store_true", help="--n 4 --scale 12 --batch-reps 1 --reps 2")
    ap.add_argument("--dataplane-only", action="store_true", help="only E: the switch's data plane against gloo")
    ap.add_argument("--dataplane-rounds", type=int, default=dataplane.ROUNDS, help="runs of each kind in E (median)")
    ap.add_argument("--compile-only", action="store_true", help="only F: a torch.compile'd step against the same uncompiled")
    ap.add_argument("--compile-reps", type=int, default=3, help="gradings of each side in F (median)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.scale, args.batch_reps, args.reps = 4, 12, 1, 2
    print(f"machine: {machine()}", flush=True)
    if args.dataplane_only:
        dataplane.run(rounds=args.dataplane_rounds)
        return 0
    if args.compile_only:
        with tempfile.TemporaryDirectory(prefix="grader-bench-") as tmp_name:
            report_compile(args.compile_reps, Path(tmp_name))
        return 0
    with tempfile.TemporaryDirectory(prefix="grader-bench-") as tmp_name:
        tmp = Path(tmp_name)
        small = make_class(tmp / "small", args.n)
        runs = [grader_batch(small, tmp / f"out-small-{r}", args.jobs) for r in range(args.batch_reps)]
        a = statistics.median(runs)
        print(f"A  grader `batch --jobs {args.jobs}`, {args.n} honest: {a:.2f} s wall "
              f"(runs {', '.join(f'{x:.2f}' for x in runs)}), {a / args.n:.3f} s per submission", flush=True)
        if not args.no_baseline:
            b, each = seed_baseline(small, args.jobs)
            print(f"B  seed-style harness, {args.jobs} at a time, same {args.n}: {b:.1f} s wall, {b / args.n:.2f} s per submission "
                  f"(one submission, ws 2+3+4 cold: median {statistics.median(each):.1f} s)", flush=True)
            print(f"   ratio B / A = {b / a:.1f}x  (goal >= 40x)", flush=True)
        big = make_class(tmp / "big", args.scale)
        c = grader_batch(big, tmp / "out-big", args.jobs)
        print(f"C  scaling, `batch --jobs {args.jobs}`: {args.n} -> {a / args.n:.3f} s/submission; "
              f"{args.scale} -> {c:.1f} s wall, {c / args.scale:.3f} s/submission; "
              f"marginal {(c - a) / (args.scale - args.n):.3f} s/submission", flush=True)
        grade, imp = grade_vs_import(small / "student000.py", args.reps, tmp)
        g, i = statistics.median(grade), statistics.median(imp)
        print(f"D  single `grade`: median {g:.2f} s over {args.reps}; `python -c \"import torch\"`: median {i:.2f} s; "
              f"ratio {g / i:.2f}x (goal <= 1.1x)", flush=True)
        report_compile(args.compile_reps, tmp)
    dataplane.run(rounds=args.dataplane_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
