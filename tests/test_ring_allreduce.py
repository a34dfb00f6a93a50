"""The second exercise, ring all-reduce from send/recv, through every entry point.

Fixtures under tests/fixtures/ring_allreduce/ are graded with ONE `batch` call per folder (honest, mistakes,
cheats); the tests assert on the results.json files it writes. Also: `list`, `check`, the release, the
notebook check, `gradescope-zip`, and `bench` (nbgrader: tests/test_nbgrader_e2e.py, one course for every exercise).
"""
from __future__ import annotations

import os
import re
import shutil
import sys

import nbformat
import pytest

import exercise_suite as suite

from conftest import FIXTURES, ROOT, graded_folder, outcomes, results_of, run_cli
from grader.exercise import registry
from grader.feedback.messages import render
from grader.integrations.release import clear_solutions

EX = "ring_allreduce"
FIX = FIXTURES / EX
SOLUTION = ROOT / "solutions" / EX / f"{EX}.py"
CHECK_IDS = ["static.p2p_only", "ws2.p2p_only"] + [f"ws{ws}.{k}" for ws in (2, 3, 4, 5) for k in ("values", "ring", "traffic")]
CJK = re.compile(r"[\u4e00-\u9fff]")
registry.get(EX)   # loads the exercise's own messages into the catalog


def batch(folder: str, tmp_path_factory) -> dict:
    """{student: results.json} of one `batch` call over a fixture folder (shared: conftest.graded_folder)."""
    return results_of(graded_folder(tmp_path_factory, f"ring_allreduce/{folder}", EX, "en"))


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    return batch("honest", tmp_path_factory)


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    return batch("mistakes", tmp_path_factory)


@pytest.fixture(scope="module")
def cheats(tmp_path_factory):
    return batch("cheats", tmp_path_factory)


def causes(results: dict, check_id: str) -> list[str]:
    return [c["key"] for c in results["extra_data"]["causes"].get(check_id, [])]


def test_listed():
    proc = run_cli("list", "--lang", "en")
    assert proc.returncode == 0
    assert "ring_allreduce: Ring all-reduce, built from send/recv (100 points; visible world sizes 2)" in proc.stdout


# ------------------------------------------------------------------------------------------------
# Honest styles: 100 each

@pytest.mark.timeout(420)
def test_honest_styles_score_100(honest):
    names = sorted(p.stem for p in (FIX / "honest").glob("*.py"))
    assert len(names) >= 8 and sorted(honest) == names
    for name, results in honest.items():
        assert results["score"] == 100, (name, {k: v for k, v in outcomes(results).items() if v != "pass"})
        assert sorted(outcomes(results)) == sorted(CHECK_IDS)


# ------------------------------------------------------------------------------------------------
# Mistakes: exact scores, and each named (zh and en). (score, {check: causes it must name})

MISTAKES = {
    "m01_chunk_off_by_one": (20, {"ws2.values": ["ring_allreduce.cause.chunk_mixup"], "ws4.values": ["ring_allreduce.cause.chunk_mixup"],
                                  "ws2.ring": ["cause.traffic_needs_value"]}),
    "m02_no_all_gather": (20, {"ws2.values": ["ring_allreduce.cause.no_all_gather"], "ws5.values": ["ring_allreduce.cause.no_all_gather"]}),
    "m03_only_divisible": (20, {"ws2.values": ["ring_allreduce.cause.uneven"], "ws3.values": ["ring_allreduce.cause.uneven"]}),
    # every rank blocked in its first send: send/recv never completed, so the run-time "used" check fails too
    "m04_deadlock_send_first": (10, {"ws2.values": ["fail.deadlock_inside", "cause.all_blocked_in_send"],
                                     "ws5.values": ["cause.all_blocked_in_send"]}),
    "m05_gather_to_root": (65, {"ws2.traffic": ["cause.traffic_sends"], "ws4.ring": ["cause.traffic_gather"],
                                "ws4.traffic": ["cause.traffic_sends", "cause.traffic_whole"]}),
    "m06_own_chunk_twice": (20, {"ws2.values": ["ring_allreduce.cause.own_twice", "why.weights"]}),
    "m07_wrong_neighbour": (40, {"ws3.values": ["cause.p2p_unmatched"], "ws5.values": ["cause.p2p_unmatched"]}),
    "m08_whole_tensor_each_step": (80, {"ws2.traffic": ["cause.traffic_whole"], "ws5.traffic": ["cause.traffic_whole"]}),
    "m09_pass_whole_around": (80, {"ws2.traffic": ["cause.traffic_sends"], "ws3.traffic": ["cause.traffic_sends", "cause.traffic_whole"]}),
    # the switch fails both calls of the message that does not fit (gloo would abort the receiver): the
    # receive never completed, so the run-time "uses" check fails too
    "m10_recv_buffer_size": (10, {"ws2.values": ["cause.p2p_too_long"]}),
    # view(world_size, -1) raises on a length no world size divides: named, not only the RuntimeError
    "m11_view_needs_a_divisible_length": (10, {"ws2.values": ["fail.exception", "ring_allreduce.cause.view_uneven"],
                                               "ws5.values": ["ring_allreduce.cause.view_uneven"]}),
    "m12_copy_instead_of_add": (20, {"ws2.values": ["ring_allreduce.cause.copy_not_add"], "ws4.values": ["ring_allreduce.cause.copy_not_add"]}),
    "m13_ring_on_a_clone": (20, {"ws2.values": ["cause.unchanged_p2p"], "ws5.values": ["cause.unchanged_p2p"]}),
    "m14_send_to_rank_plus_two": (10, {"ws2.values": ["ring_allreduce.cause.send_to_self"], "ws4.values": ["ring_allreduce.cause.not_neighbour"]}),
    "m15_send_to_self": (10, {"ws2.values": ["ring_allreduce.cause.send_to_self"], "ws3.values": ["ring_allreduce.cause.send_to_self"]}),
    "m16_recv_buffer_too_long": (10, {"ws2.values": ["cause.p2p_too_short"], "ws4.values": ["cause.p2p_too_short"]}),
    "m17_recv_buffer_float64": (10, {"ws2.values": ["cause.p2p_dtype"], "ws3.values": ["cause.p2p_dtype"]}),
    "m18_dist_all_reduce": (0, {"static.p2p_only": ["static.forbidden", "ring_allreduce.cause.forbidden"],
                                "ws2.p2p_only": ["fail.forbidden_op", "ring_allreduce.cause.forbidden"]}),
    # right sums, wrong traffic: the value points stay, the traffic's are named by the figures
    "m19_all_gather_twice": (80, {"ws2.traffic": ["cause.traffic_sends", "cause.traffic_bytes"], "ws5.traffic": ["cause.traffic_bytes"]}),
    # two elements more than the largest chunk of an even cut (S - (N-1) x floor(S/N)) at every world size
    "m20_unbalanced_chunks": (80, {"ws2.traffic": ["cause.traffic_chunk"], "ws4.traffic": ["cause.traffic_chunk"],
                                   "ws5.traffic": ["cause.traffic_chunk"]}),
    "m21_send_float64": (80, {"ws2.traffic": ["cause.traffic_dtype"], "ws3.traffic": ["cause.traffic_dtype"]}),
    "m22_two_rings_both_ways": (65, {"ws3.ring": ["cause.traffic_peers"], "ws5.ring": ["cause.traffic_peers"],
                                     "ws3.traffic": ["cause.traffic_sends"]}),
    "m23_ring_with_stride_two": (95, {"ws5.ring": ["cause.traffic_not_neighbour"]}),
    # receives with tag 0, sends with the phase's and step's: a deadlock, the two tags named
    "m24_tags_differ": (20, {"ws2.values": ["fail.deadlock_inside", "cause.p2p_tag"], "ws5.values": ["cause.p2p_tag"]}),
    # every rank receives first: named as such, not as a peer that "never sends to it"
    "m25_deadlock_recv_first": (10, {"ws2.values": ["fail.deadlock_inside", "cause.all_blocked_in_recv"],
                                     "ws5.values": ["cause.all_blocked_in_recv"]}),
}
# causes each was once told, falsely
NOT_SAID = {
    "m12_copy_instead_of_add": ("ring_allreduce.cause.chunk_mixup",),
    "m13_ring_on_a_clone": ("cause.unchanged", "ring_allreduce.cause.chunk_mixup"),   # "the result of isend was not used"
    "m14_send_to_rank_plus_two": ("cause.unchanged",),
    "m15_send_to_self": ("cause.unchanged",),
    "m22_two_rings_both_ways": ("cause.traffic_gather",),   # at 3 ranks every rank hears from both others: no gather
    "m25_deadlock_recv_first": ("cause.p2p_unmatched",),
}


@pytest.mark.timeout(420)
def test_mistakes_score_and_name_their_cause(mistakes):
    assert sorted(mistakes) == sorted(MISTAKES) == sorted(p.stem for p in (FIX / "mistakes").glob("*.py"))
    for name, (score, named) in MISTAKES.items():
        results = mistakes[name]
        assert results["score"] == score, (name, {k: v for k, v in outcomes(results).items() if v != "pass"})
        said = {key for check_id in results["extra_data"]["causes"] for key in causes(results, check_id)}
        assert not said & set(NOT_SAID.get(name, ())), (name, said & set(NOT_SAID[name]))
        for check_id, keys in named.items():
            assert set(keys) <= set(causes(results, check_id)), (name, check_id, causes(results, check_id))
            for key in keys:   # each cause has its own words in both languages
                zh, en = render(key, {}, "zh"), render(key, {}, "en")
                assert zh != key and en != key and zh != en and CJK.search(zh) and not CJK.search(en), key


@pytest.mark.timeout(420)
def test_hidden_checks_of_a_failed_run_say_what_happened(mistakes):
    """A run that raised (view on a length no world size divides): every hidden check says the code raised,
    the ring and traffic checks too (their points count for a correct sum only), never just "the result is
    wrong"; and the cause is named there, without values."""
    results = mistakes["m11_view_needs_a_divisible_length"]
    hidden = [t for t in results["tests"] if t["name"].startswith("Hidden check")]
    assert len(hidden) == 9
    said = render("status.failed", {}, "en") + ": " + render("hint.exception", {}, "en")
    assert all(t["output"].splitlines()[0] == said for t in hidden), [t["output"] for t in hidden]
    cause = render("ring_allreduce.cause.view_uneven", {}, "en")
    assert all(cause in t["output"] for t in hidden if "values" in t["name"])


@pytest.mark.timeout(420)
def test_wrong_traffic_keeps_the_value_points_and_names_the_figures(mistakes):
    gather = mistakes["m05_gather_to_root"]
    assert {k: v for k, v in outcomes(gather).items() if v != "pass"} == {
        "ws2.traffic": "wrong", **{f"ws{ws}.{k}": "wrong" for ws in (3, 4, 5) for k in ("ring", "traffic")}}
    texts = {c["key"]: c["text"] for c in gather["extra_data"]["causes"]["ws4.ring"]}
    assert texts["cause.traffic_gather"] == "Cause: rank 0 received 3 x S from 3 ranks: a gather to one rank, not a ring."
    whole = mistakes["m08_whole_tensor_each_step"]["extra_data"]["causes"]["ws2.traffic"][0]["text"]
    assert "rank 0 sent the whole tensor at each of its 2 sends (2062 elements = 2 x S)" in whole and "1 x S" in whole
    # hidden checks show what went wrong, never a figure or a world size
    hidden = next(t for t in gather["tests"] if t["name"].startswith("Hidden check 2: Ring all-reduce: a ring"))
    assert "a gather to one rank, not a ring" in hidden["output"] and "3 x S" not in hidden["output"]


@pytest.mark.timeout(420)
def test_deadlock_lesson_in_a_hidden_check(mistakes):
    results = mistakes["m04_deadlock_send_first"]
    assert outcomes(results)["ws5.values"] == "deadlock"
    hidden = [t for t in results["tests"] if t["name"].startswith("Hidden check") and "values" in t["name"]]
    assert len(hidden) == 3
    lesson = render("cause.all_blocked_in_send", {}, "en")
    assert "every rank is blocked in send" in lesson and "Post the receive first (irecv)" in lesson and "rank parity" in lesson
    assert all(lesson in t["output"] for t in hidden)
    # a wrong neighbour also deadlocks, with receives posted: not the same lesson
    wrong = mistakes["m07_wrong_neighbour"]
    assert "cause.all_blocked_in_send" not in causes(wrong, "ws3.values")
    assert outcomes(wrong)["ws2.values"] == "pass" and outcomes(wrong)["ws3.values"] == "deadlock"
    # receives and sends with different tags: the two tags, visible; the rule alone, hidden
    tags = mistakes["m24_tags_differ"]
    visible = next(t["output"] for t in tags["tests"] if t["name"] == "Ring all-reduce: values (2 ranks)")
    assert any(render("cause.p2p_tag", {"rank": r, "peer": 1 - r, "line": 26, "tag": 0, "sent_tag": 10}, "en") in visible
               for r in (0, 1)), visible
    hidden = [t["output"] for t in tags["tests"] if t["name"].startswith("Hidden check") and "values" in t["name"]]
    assert all(render("cause.p2p_tag_generic", {}, "en") in h and "10" not in h for h in hidden), hidden


# ------------------------------------------------------------------------------------------------
# Cheats: 0 on every check they fake

CHEATS = {  # the checks each one fakes
    "c01_collective_in_disguise": CHECK_IDS,
    # the ring's results are thrown away: the answer stays the same when the data in flight changes, so the
    # run-time check that send/recv were used fails too (the tensor did not come through them)
    "c02_forged_ring_local_values": [c for c in CHECK_IDS if c.split(".")[1] in ("values", "ring", "traffic") or c == "ws2.p2p_only"],
    "c03_local_answer_sent_around": [c for c in CHECK_IDS if c.split(".")[1] in ("values", "ring", "traffic")],
    "c04_collective_on_private_group": CHECK_IDS,
    # there is no real gloo group inside a rank any more: its all-reduce has nothing to run on, and what is
    # left is a token ring of send/recv and no collective, which the run-time "uses" check measures as such
    "c05_inner_gloo_group": [c for c in CHECK_IDS if c != "ws2.p2p_only"],
}


@pytest.mark.timeout(420)
def test_cheats_score_0_on_what_they_fake(cheats):
    assert sorted(cheats) == sorted(CHEATS) == sorted(p.stem for p in (FIX / "cheats").glob("*.py"))
    for name, faked in CHEATS.items():
        scores = {t["name"]: t["score"] for t in cheats[name]["tests"]}
        assert len(scores) == len(CHECK_IDS)
        assert all(v == "pass" for k, v in outcomes(cheats[name]).items() if k not in faked), name
        assert [k for k in faked if outcomes(cheats[name])[k] == "pass"] == [], name
    assert "cause.result_unused" in causes(cheats["c02_forged_ring_local_values"], "ws2.p2p_only")
    inner = cheats["c05_inner_gloo_group"]
    assert outcomes(inner)["ws2.values"] == "exception"   # no real group to reach: its all-reduce has nothing to run on
    disguised = cheats["c01_collective_in_disguise"]
    assert outcomes(disguised)["static.p2p_only"] == "forbidden"   # the text hides it, the run does not
    assert "ring_allreduce.cause.forbidden" in causes(disguised, "ws2.p2p_only")
    assert render("ring_allreduce.cause.forbidden", {}, "en").endswith("this exercise builds all-reduce from send/recv: no collective may be called.")


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
                          cwd=ROOT, capture_output=True, text=True, timeout=110,
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
