"""Time a student's all-reduce against the library's, separately from grading (which stays fast).

    python -m grader bench ring_allreduce.py [--exercise ring_allreduce] [--plot bench.png]

For an exercise whose traffic check declares a volume (`params["volume"]`, a comm.OPS name, and
`params["function"]`, the student's function(tensor, rank, world_size)), each world size up to 4 gets one
run on the grader's own Runner (zygote, sandbox, limits: the student's code is untrusted) in bench mode
(processes/bench_rank.py): a plain gloo process group, so the grader's observation copies cost nothing in
the times. Sizes 4 KiB .. 64 MiB (float32). Printed per size, with the nccl-tests definitions:

    algbw = S / t        busbw = algbw x OPS[volume].ring(N)      (all-reduce: 2(N-1)/N)

busbw is what each rank's link carried: a ring that reaches the library's busbw is as good as it gets.
The plot (matplotlib): busbw against size, one line per implementation and world size.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ..comm import OPS
from ..exercise import registry
from ..feedback.messages import default_lang, render
from ..records import BenchOptions, Mode, RunRequest, Stop
from ..submission import load as loader
from . import nbcheck

SIZES = [4 << 10 << (2 * k) for k in range(8)]      # 4 KiB, 16 KiB, ... 64 MiB
QUICK = [4 << 10 << (2 * k) for k in range(5)]      # up to 1 MiB (the notebook's inline plot)
WORLD_SIZES = (2, 3, 4)
BUDGET = 16 << 20                                   # bytes moved per measurement: reps = BUDGET / size (1..20)


def declared(exercise) -> tuple[str, str] | None:
    """(the student's function, the collective it stands for) from the exercise's traffic checks."""
    for check in exercise.checks:
        params = check.params or {}
        if check.kind == "traffic" and params.get("function") and params.get("volume") in OPS:
            return params["function"], params["volume"]
    return None


def run_bench(submission, exercise, *, sizes=SIZES, world_sizes=WORLD_SIZES, runner=None, wall_s: float = 40.0) -> dict:
    """{"rows": [{"ws", "impl", "bytes", "ms", "reps", "algbw", "busbw"}], "errors": [str], "function", "baseline"}."""
    # here, not at the top: ranks import this module (a notebook's `from grader.integrations import bench`) and
    # never run a bench; the zygote would otherwise hold the supervisor's modules for them (zygote.PRELOAD)
    from ..processes.limits import Limits
    from ..processes.runner import Runner
    function, baseline = declared(exercise)
    options = BenchOptions(sizes=tuple(sizes), baseline=baseline, budget=BUDGET)
    own = runner is None
    runner = runner or Runner(limits=Limits(wall_s=wall_s, cpu_s=int(wall_s * 2)), max_parallel=1)
    rows, errors = [], []
    try:
        for ws in world_sizes:
            request = RunRequest(world_size=ws, source=submission.source, filename=submission.filename, entry=function,
                                 label=f"bench-{ws}", mode=Mode.BENCH, bench=options)
            outcome = runner.run_many([request])[0]
            for note in outcome.ranks[0].notes:
                try:
                    row = json.loads(note)
                except ValueError:
                    continue
                if "error" in row:
                    errors.append(f"{ws}: {row['error']}")
                    continue
                seconds = row["ms"] / 1000
                algbw = row["bytes"] / seconds / 1e9 if seconds > 0 else 0.0
                rows.append({**row, "ws": ws, "algbw": algbw, "busbw": algbw * OPS[baseline].ring(ws)})
            if outcome.stop != Stop.COMPLETED:
                errors.append(f"{ws}: run stopped ({outcome.stop})")
    finally:
        if own:
            runner.close()
    return {"rows": rows, "errors": errors, "function": function, "baseline": baseline}


def table(result: dict, lang: str) -> str:
    lines = [render("bench.header", {"function": result["function"], "baseline": result["baseline"]}, lang),
             f"{'N':>2} {'size':>9} {'impl':>16} {'time (ms)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for row in sorted(result["rows"], key=lambda r: (r["ws"], r["bytes"], r["impl"])):
        impl = result["function"] if row["impl"] == "student" else f"dist.{row['impl']}"
        lines.append(f"{row['ws']:>2} {_size(row['bytes']):>9} {impl:>16} {row['ms']:>10.3f} {row['algbw']:>11.3f} {row['busbw']:>11.3f}")
    lines += [render("bench.error", {"error": e}, lang) for e in result["errors"]]
    return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def plot(result: dict, path: Path) -> Path:
    """busbw against size (log-log), one line per implementation and world size."""
    import matplotlib   # here: only a plot needs it (a second of imports), never a rank nor a bench's table
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, ws in enumerate(sorted({r["ws"] for r in result["rows"]})):
        for impl, style in (("student", "-o"), (result["baseline"], "--s")):   # one colour per N: solid = student
            rows = sorted((r for r in result["rows"] if r["ws"] == ws and r["impl"] == impl), key=lambda r: r["bytes"])
            if rows:
                label = f"{result['function'] if impl == 'student' else 'dist.' + impl}, N={ws}"
                ax.plot([r["bytes"] for r in rows], [r["busbw"] for r in rows], style, color=f"C{k}", label=label,
                        markersize=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size S (bytes)")
    ax.set_ylabel("busbw = S/t x 2(N-1)/N (GB/s)")
    ax.set_title("all-reduce bus bandwidth (gloo, plain process group)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def notebook(exercise: str, *, sizes=QUICK, world_sizes=(2,), lang: str | None = None):
    """The bench of this kernel's code (nbcheck.kernel_program): its table printed, its plot shown inline.
    Not run under nbgrader's autograder or validator (they set NBGRADER_EXECUTION)."""
    if os.environ.get("NBGRADER_EXECUTION"):
        print(render("bench.autograde", {}, nbcheck.language(lang)))
        return
    from IPython.display import Image, display   # here: only a notebook's kernel shows a plot
    source, _ = nbcheck.kernel_program()
    chosen = registry.get(exercise)
    result = run_bench(loader.from_source(source, nbcheck.FILENAME), chosen, sizes=sizes, world_sizes=world_sizes)
    print(table(result, nbcheck.language(lang)), end="")
    if result["rows"]:
        with tempfile.TemporaryDirectory() as folder:
            display(Image(data=plot(result, Path(folder) / "bench.png").read_bytes()))


def cmd_bench(args) -> int:
    lang = args.lang or default_lang()
    path = Path(args.submission)
    if not path.exists():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    submission = loader.load(path)
    try:
        exercise = registry.get(args.exercise) if args.exercise else \
            registry.infer(submission.path, submission.source, files=getattr(submission, "files", None))
    except registry.ExerciseError as err:
        print(render(err.key, err.params, lang), file=sys.stderr)
        return 2
    if declared(exercise) is None or submission.problem is not None:
        print(render("bench.none", {"name": exercise.name}, lang), file=sys.stderr)
        return 2
    started = time.monotonic()
    result = run_bench(submission, exercise, sizes=SIZES[: args.sizes], world_sizes=[ws for ws in WORLD_SIZES if ws <= args.max_ranks])
    sys.stdout.write(table(result, lang))
    if result["rows"]:
        png = Path(args.plot or f"{path.stem}_bench.png")
        plot(result, png)
        print(render("bench.plot", {"path": str(png), "seconds": time.monotonic() - started}, lang))
    return 0 if result["rows"] and not result["errors"] else 1


def register(subparsers, add_common_options) -> None:
    p = subparsers.add_parser("bench", help="time the student's ring against dist.all_reduce (algbw, busbw, a PNG plot)")
    p.add_argument("submission")
    p.add_argument("--plot", default=None, help="where to write the PNG (default: <file>_bench.png here)")
    p.add_argument("--sizes", type=int, default=len(SIZES), help="how many sizes from 4 KiB, x4 each (default %(default)s: up to 64 MiB)")
    p.add_argument("--max-ranks", type=int, default=max(WORLD_SIZES), help="largest world size (default %(default)s)")
    p.add_argument("--lang", choices=("zh", "en"), default=None)
    p.add_argument("--exercise", default=None)
    p.set_defaults(func=cmd_bench)
