"""The second exercise, ring all-reduce from send/recv, through every entry point: `list`, `check`, the
release, the notebook check, `gradescope-zip`, and `bench` (nbgrader: tests/test_nbgrader_e2e.py, one course
for every exercise); and the traffic rules on synthetic figures.

Its fixtures (tests/fixtures/ring_allreduce/{honest,mistakes,cheats}/, each with what it is expected to get
beside it) are graded by tests/test_fixtures.py.
"""
from __future__ import annotations

import os
import re
import shutil
import sys

import nbformat
import pytest

import exercise_suite as suite
from conftest import FIXTURES, ROOT, run_cli, stretched
from grader.exercise import registry
from grader.feedback.messages import render
from grader.integrations.release import clear_solutions

EX = "ring_allreduce"
FIX = FIXTURES / EX
SOLUTION = ROOT / "solutions" / EX / f"{EX}.py"
CHECK_IDS = ["static.p2p_only", "ws2.p2p_only"] + [f"ws{ws}.{k}" for ws in (2, 3, 4, 5) for k in ("values", "ring", "traffic")]
registry.get(EX)   # loads the exercise's own messages into the catalog


def test_listed():
    proc = run_cli("list", "--lang", "en")
    assert proc.returncode == 0
    assert "ring_allreduce: Ring all-reduce, built from send/recv (100 points; visible world sizes 2)" in proc.stdout


# ------------------------------------------------------------------------------------------------
# The lessons the fixtures' causes teach, as the catalog words them (tests/test_fixtures.py grades the
# fixtures that name them)

def test_the_deadlock_and_forbidden_collective_lessons():
    lesson = render("cause.all_blocked_in_send", {}, "en")
    assert "every rank is blocked in send" in lesson and "Post the receive first (irecv)" in lesson and "rank parity" in lesson
    assert render("ring_allreduce.cause.forbidden", {}, "en").endswith(
        "this exercise builds all-reduce from send/recv: no collective may be called.")


# ------------------------------------------------------------------------------------------------
# Entry points

@pytest.mark.timeout(120)
def test_check_reports_traffic_beside_the_ring_bound():
    proc = run_cli("check", str(SOLUTION), "--lang", "en")
    assert proc.returncode == 0, proc.stdout
    assert "Score: 40 / 40" in proc.stdout
    assert "rank 0: 2 sends, 4124 bytes (to rank 1); 2 receives, 4124 bytes (from rank 1)" in proc.stdout
    assert ("ring bound (2 ranks, S = 1031 elements): each rank makes 2(N-1) = 2 sends of at most one chunk "
            "(516 elements), at most 1033 elements in all") in proc.stdout
    zh = run_cli("check", str(SOLUTION), "--lang", "zh")
    assert "环形上限（2 个进程，S = 1031 个元素）" in zh.stdout


def test_student_versions_are_generated_from_the_solution():
    released = ROOT / "assignments" / EX / f"{EX}.py"
    assert released.read_text(encoding="utf-8") == clear_solutions(SOLUTION.read_text(encoding="utf-8"))
    text = released.read_text(encoding="utf-8")
    assert "raise NotImplementedError" in text and "tensor_split(n)" not in text
    nb = nbformat.read(ROOT / "assignments" / EX / f"{EX}.ipynb", as_version=4)
    sources = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in sources and "HIDDEN TESTS" not in sources and "ws3" not in sources


@pytest.mark.timeout(150)
def test_gradescope_zip_grades_the_ring(tmp_path):
    from test_gradescope import build_root, run_autograder
    from conftest import PY
    root = build_root(tmp_path, EX)
    assert (root / "source" / "solutions" / EX / "exercise.py").is_file()
    assert not (root / "source" / "solutions" / EX / f"{EX}.py").exists()   # never the solution
    shutil.copy(FIX / "mistakes" / "m05_gather_to_root.py", root / "submission" / "ring.py")
    results = run_autograder(root, PY)
    assert results["score"] == 65 and len(results["tests"]) == len(CHECK_IDS)


@pytest.mark.timeout(120)
def test_bench_times_the_ring_against_all_reduce(tmp_path):
    png = tmp_path / "bench.png"
    proc = run_cli("bench", str(SOLUTION), "--sizes", "2", "--max-ranks", "3", "--plot", str(png), "--lang", "en", timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plain gloo process group" in proc.stdout and "busbw = algbw x 2(N-1)/N" in proc.stdout
    rows = re.findall(r"^ ?(\d) +([\d.]+ KiB) +(\S+) +([\d.]+) +([\d.]+) +([\d.]+)$", proc.stdout, re.M)
    assert {(ws, size, impl) for ws, size, impl, *_ in rows} == {
        (ws, size, impl) for ws in "23" for size in ("4 KiB", "16 KiB") for impl in ("ring_all_reduce", "dist.all_reduce")}
    for ws, size, impl, ms, algbw, busbw in rows:
        n = int(ws)
        assert float(ms) > 0
        assert abs(float(busbw) - float(algbw) * 2 * (n - 1) / n) <= 0.0015 + 0.01 * float(busbw)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


INLINE_BENCH = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shown = []
shell = InteractiveShell.instance()
shell.display_pub.publish = lambda data, *a, **k: shown.append(sorted(data))
answer = open(sys.argv[1], encoding="utf-8").read()
imports = "import torch\\nimport torch.distributed as dist\\nLENGTH = 1031\\n"
for code in (imports, answer, "from grader.integrations import bench\\nbench.notebook('ring_allreduce', sizes=[4096, 16384])"):
    shell.run_cell(code, store_history=True).raise_error()
print("SHOWN", shown)
"""


@pytest.mark.timeout(120)
def test_notebook_bench_prints_the_table_and_shows_the_plot_inline():
    """bench.notebook in a real IPython shell: the kernel's code timed, the table printed, a PNG displayed."""
    import subprocess
    proc = subprocess.run([sys.executable, "-c", INLINE_BENCH, str(FIX / "honest" / "h02_batch_isend_irecv.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=stretched(110),
                          env={**os.environ, "GRADER_LANG": "en", "NBGRADER_EXECUTION": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "busbw" in proc.stdout and "ring_all_reduce" in proc.stdout, proc.stdout
    assert re.search(r"^ *2 +16 KiB +ring_all_reduce +[\d.]+ +[\d.]+ +[\d.]+$", proc.stdout, re.M), proc.stdout
    assert "SHOWN [['image/png', 'text/plain']]" in proc.stdout, proc.stdout


def test_traffic_rules_on_synthetic_exchanges():
    """verify/kinds/traffic.py on hand-made per-rank traffic (no processes): shape and volume causes."""
    from grader.verify.kinds.traffic import RankTraffic, shape_causes, volume_causes

    def ring(n, d, sizes=None, dtype="torch.float32"):
        sizes = sizes or [100] * 2 * (n - 1)
        return [RankTraffic(r, sends=len(sizes), sent=sum(sizes), sizes=sizes, dtypes=[dtype] * len(sizes),
                            recvs=len(sizes), received=sum(sizes), to=[(r + d) % n], frm=[(r - d) % n]) for r in range(n)]

    def keys(notes):
        return [n.key for n in notes]

    for n in (2, 3, 5):
        for d in (1, -1):
            assert shape_causes(ring(n, d), n, 400) == []
    mixed = ring(4, 1)
    mixed[2].to, mixed[2].frm = [1], [3]
    assert keys(shape_causes(mixed, 4, 400)) == ["cause.traffic_direction"]
    skip = ring(4, 1)
    for t in skip:
        t.to = [(t.rank + 2) % 4]
    assert keys(shape_causes(skip, 4, 400)) == ["cause.traffic_not_neighbour"]
    same = ring(3, 1)
    for t in same:
        t.frm = [(t.rank + 1) % 3]
    assert keys(shape_causes(same, 3, 400)) == ["cause.traffic_same_side"]
    star = [RankTraffic(0, sends=3, sent=1200, sizes=[400] * 3, recvs=3, received=1200, to=[1, 2, 3], frm=[1, 2, 3])] + \
           [RankTraffic(r, sends=1, sent=400, sizes=[400], recvs=1, received=400, to=[0], frm=[0]) for r in (1, 2, 3)]
    (gather,) = shape_causes(star, 4, 400)
    assert gather.key == "cause.traffic_gather" and gather.params == {"rank": 0, "k": "3", "m": 3}
    assert keys(shape_causes([RankTraffic(0), *ring(2, 1)[1:]], 2, 400)) == ["cause.traffic_none"]

    params = {"sends": lambda n: 2 * (n - 1), "sends_formula": "2(N-1)", "volume": "all_reduce"}
    # S = 1031 elements, counted as elements whatever the dtype: chunks of 258 and 257 at 4 ranks; 6 sends of
    # the larger still fit (one element each for the rounding)
    f32 = "torch.float32"
    assert volume_causes(ring(4, 1, [258] * 6), params, 4, 1031, f32) == []
    over = volume_causes(ring(4, 1, [259] * 6), params, 4, 1031, f32)
    assert keys(over) == ["cause.traffic_bytes"] and over[0].params["bound"] == 1546 + 6
    whole = volume_causes(ring(3, 1, [1031] * 4), params, 3, 1031, f32)
    assert keys(whole) == ["cause.traffic_whole"] and whole[0].params["k"] == "4"
    few = volume_causes(ring(3, 1, [1031] * 2), params, 3, 1031, f32)
    assert keys(few) == ["cause.traffic_sends", "cause.traffic_whole"] and few[0].params["count"] == 2
    # within the total, but one message of more than a chunk (a whole vector sent once, padding sends after)
    padded = volume_causes(ring(4, 1, [1031, 1, 1, 1, 1, 1]), params, 4, 1031, f32)
    assert keys(padded) == ["cause.traffic_chunk"] and padded[0].params["largest"] == 1031
    # narrowing the wire type saves nothing when elements are counted, and is named
    narrow = volume_causes(ring(4, 1, [258] * 6, dtype="torch.int16"), params, 4, 1031, f32)
    assert keys(narrow) == ["cause.traffic_dtype"] and narrow[0].params == {"rank": 0, "sent": "torch.int16", "dtype": f32}
    # a wider one is named as wider (no precision lost, twice the bytes), never "narrower"
    wide = volume_causes(ring(4, 1, [258] * 6, dtype="torch.float64"), params, 4, 1031, f32)
    assert keys(wide) == ["cause.traffic_dtype_wider"] and wide[0].params["sent"] == "torch.float64"


def _ring_sends(sizes: list[int], d: int = 1) -> list[list[int]]:
    """Per rank, the elements of each of its 2(N-1) sends in a ring turning d (+1 or -1) over chunks of `sizes`:
    the reduce-scatter sends chunk (r - d s) % N at step s, the all-gather chunk (r + d - d s) % N."""
    n = len(sizes)
    return [[sizes[(r - d * s) % n] for s in range(n - 1)] + [sizes[(r + d - d * s) % n] for s in range(n - 1)]
            for r in range(n)]


def _common_layouts(size: int, n: int) -> dict[str, list[int]]:
    """The chunk sizes of the ways students cut `size` elements into n contiguous chunks."""
    import numpy as np
    import torch
    base, extra = divmod(size, n)
    c = -(-size // n)
    out = {"tensor_split": [t.numel() for t in torch.arange(size).tensor_split(n)],
           "np.array_split": [len(a) for a in np.array_split(np.arange(size), n)],
           "floor, the last takes the rest": [base] * (n - 1) + [size - (n - 1) * base],
           "floor, the first takes the rest": [size - (n - 1) * base] + [base] * (n - 1),
           "k * S // N offsets": [(k + 1) * size // n - k * size // n for k in range(n)],
           "ceil offsets, the last shorter": [max(0, min(c, size - k * c)) for k in range(n)]}
    chunked = [t.numel() for t in torch.arange(size).chunk(n)]
    if len(chunked) == n:   # torch.chunk gives fewer than n chunks when size is short (S = 10, N = 8: 5)
        out["torch.chunk"] = chunked
    assert all(sum(v) == size for v in out.values()), out
    return out


def _traffic(per_rank: list[list[int]], dtype: str = "torch.float32"):
    from grader.verify.kinds.traffic import RankTraffic
    n = len(per_rank)
    return [RankTraffic(r, sends=len(sizes), sent=sum(sizes), sizes=list(sizes), dtypes=[dtype] * len(sizes), recvs=len(sizes),
                        received=sum(sizes), to=[(r + 1) % n], frm=[(r - 1) % n]) for r, sizes in enumerate(per_rank)]


def test_every_common_chunk_layout_is_within_the_traffic_bound():
    """Each send at most the largest chunk of S cut into N contiguous chunks (S // N each, one chunk taking the
    remainder: S - (N-1) x floor(S/N)), the total at most 2(N-1)/N x S plus one element per send: every layout
    students use fits, at the exercise's S = 1031 and hidden world sizes and beyond (a tester's ring with
    `numel // N` chunks and the remainder in the last lost the 4-rank traffic points: its last chunk holds 260
    elements, ceil(S/N) is 258)."""
    from grader.verify.kinds.traffic import bound, largest_chunk, volume_causes
    params = {"sends": lambda n: 2 * (n - 1), "sends_formula": "2(N-1)", "volume": "all_reduce"}
    assert [largest_chunk(1031, n) for n in (2, 3, 4, 5)] == [516, 345, 260, 207]
    assert [bound(params, n, 1031)[1:3] for n in (2, 3, 4, 5)] == [(1033, 516), (1378, 345), (1552, 260), (1657, 207)]
    for size in (1031, 1030, 1029, 97, 10, 7):
        for n in range(2, 9):
            for name, sizes in _common_layouts(size, n).items():
                assert max(sizes) <= largest_chunk(size, n), (size, n, name, sizes)
                for sends in (_ring_sends(sizes, 1), _ring_sends(sizes, -1)):
                    assert volume_causes(_traffic(sends), params, n, size, "torch.float32") == [], (size, n, name, sizes)
    # the tester's figures: rank 0 at 4 ranks sends 257, 260, 257, 257, 257, 260 = 1548 elements, bound 1552
    assert _ring_sends([257, 257, 257, 260])[0] == [257, 260, 257, 257, 257, 260]


def test_a_send_over_the_largest_chunk_still_fails():
    """The per-send cap is what stops a whole vector (or most of it) in one send beside padding sends that keep
    the count and the total in bounds: one element over the largest chunk fails, whatever the total."""
    from grader.verify.kinds.traffic import volume_causes
    params = {"sends": lambda n: 2 * (n - 1), "sends_formula": "2(N-1)", "volume": "all_reduce"}
    f32 = "torch.float32"
    for n, largest in ((2, 516), (3, 345), (4, 260), (5, 207)):
        small = 1031 // n - 1
        at = [[largest] + [small] * (2 * n - 3)] * n
        assert volume_causes(_traffic(at), params, n, 1031, f32) == [], n
        (over,) = volume_causes(_traffic([[largest + 1] + [small] * (2 * n - 3)] * n), params, n, 1031, f32)
        assert over.key == "cause.traffic_chunk" and over.params["largest"] == largest + 1 and over.params["chunk"] == largest, n
    # every send the largest chunk: the count and each send fit, the total does not
    (total,) = volume_causes(_traffic([[260] * 6] * 4), params, 4, 1031, f32)
    assert total.key == "cause.traffic_bytes" and total.params["sent"] == 1560 and total.params["bound"] == 1552
    # half the vector in one send, the rest spread thin: within the total and the count, over the chunk
    (half,) = volume_causes(_traffic([[516, 206, 206, 206, 206, 206]] * 4), params, 4, 1031, f32)
    assert half.key == "cause.traffic_chunk" and half.params["largest"] == 516
    # a narrower dtype to squeeze a larger message through is still named, and so is its size
    narrow = volume_causes(_traffic([[300] + [250] * 5] * 4, dtype="torch.float16"), params, 4, 1031, f32)
    assert [n.key for n in narrow] == ["cause.traffic_dtype", "cause.traffic_chunk"]
    # the cause names the rule in the student's terms, with the figures when visible, without them hidden
    en = render("cause.traffic_chunk", over.params | {"rank": 0}, "en")
    zh = render("cause.traffic_chunk", over.params | {"rank": 0}, "zh")
    assert "sent 208 elements in one send, more than one chunk" in en and "S - (N-1) x floor(S/N) = 207 elements" in en
    assert "208 个元素" in zh and "S - (N-1) × floor(S/N) = 207 个元素" in zh
    for lang in ("zh", "en"):
        generic = render("cause.traffic_chunk_generic", {}, lang)
        assert "floor(S/N)" in generic and not re.search(r"\d{3}", generic)


def test_the_mistakes_table_knows_the_floor_layouts():
    """A ring with `numel // N` chunks (the remainder in the last, or the first) that stops after the
    reduce-scatter is named as such, like one cut with tensor_split: the reference step with the all-gather
    left out, in each layout and direction."""
    sys.path.insert(0, str(ROOT))
    from solutions.ring_allreduce import exercise as ex
    from grader.exercise.reference import outcome
    from grader.verify.kinds.traffic import largest_chunk
    exercise = registry.get("ring_allreduce")
    for ws in (3, 4, 5):
        layouts = ex.layouts(ws)
        assert all(max(b - a for a, b in layout) <= largest_chunk(ex.LENGTH, ws) for layout in layouts)
        base = ex.LENGTH // ws
        for sizes in ([base] * (ws - 1) + [ex.LENGTH - (ws - 1) * base], [ex.LENGTH - (ws - 1) * base] + [base] * (ws - 1)):
            layout = [(sum(sizes[:k]), sum(sizes[:k + 1])) for k in range(ws)]
            k = layouts.index(layout)
            for rank in range(ws):
                data = outcome(exercise.step, ws, layout=k, gather=False)[rank]["tensor"]
                assert suite.diagnose(exercise, "tensor", data, ws, rank) == ["cause.no_all_gather"], (ws, sizes, rank)


@pytest.mark.timeout(120)
def test_unchanged_stub_scores_zero():
    proc = run_cli("check", str(ROOT / "assignments" / EX / f"{EX}.py"), "--lang", "en")
    assert proc.returncode == 1
    assert "Score: 0 / 40" in proc.stdout and "raised NotImplementedError" in proc.stdout
    assert "send/recv was never used (none completed)." in proc.stdout and "was not used" not in proc.stdout
