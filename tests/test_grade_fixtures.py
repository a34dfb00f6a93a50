"""Fixture submissions graded through the real CLI (`python -m grader grade`): honest styles score 100,
common mistakes get the partial scores and the named causes below (in English and Chinese), cheats
score at most the static 10 points, unreadable input gets a clear message and 0.

Each grading costs ~2 s (world sizes 2, 3 and 4, a clean and a perturbed run each).
"""
from __future__ import annotations

import re

import pytest

from conftest import FIXTURES, ROOT, outcomes, run_cli
from grader.feedback.messages import render

HONEST = sorted((FIXTURES / "honest").glob("*.py"))
RUNTIME_IDS = [f"ws{ws}.{op}" for ws in (2, 3, 4) for op in ("all_reduce", "all_gather")]
ALL_IDS = ["static.all_reduce", "static.all_gather", *RUNTIME_IDS]


def ids(ws_list, op, outcome):
    return {f"ws{ws}.{op}": outcome for ws in ws_list}


def failing(results: dict) -> dict:
    return {k: v for k, v in outcomes(results).items() if v != "pass"}


def assert_no_traceback(proc):
    assert "Traceback" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------------
# Honest styles: 100

@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_style_scores_100(path, grade):
    results, proc = grade(path)
    assert results["score"] == 100, proc.stdout
    assert failing(results) == {}
    assert proc.returncode == 0


def test_there_are_enough_honest_styles():
    assert len(HONEST) >= 12


# ------------------------------------------------------------------------------------------------
# Common mistakes: exact partial scores, outcome per check, and the cause named in both languages.
# (name, score, non-passing outcomes, messages (catalog key, values) the report must hold, extra CLI args)

MISTAKES = [
    ("m01_summed_not_averaged", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.summed_not_averaged", {})], ()),
    ("m02_integer_gradient", 10, {i: "exception" for i in RUNTIME_IDS},
     [("cause.integer_dtype", {})], ()),
    ("m03_reduce_not_all_reduce", 50, {"static.all_reduce": "not_called", **ids((2, 3, 4), "all_reduce", "not_collective")},
     [("cause.reduce_not_all_reduce", {}), ("static.not_called", {"op": "all_reduce"})], ()),
    ("m04_shared_buffers", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.shared_buffers", {})], ()),
    ("m05_gather_list_too_short", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("cause.gather_list_size", {})], ()),
    ("m06_empty_gather_list", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("cause.gather_list_size", {})], ()),
    ("m07_stack_not_cat", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.stack_not_cat", {})], ()),
    ("m08_hardcoded_world_size", 40, {**ids((3, 4), "all_reduce", "exception"), **ids((3, 4), "all_gather", "exception")},
     [("cause.hardcoded_ws", {}), ("cause.gather_list_size", {})], ()),
    ("m09_only_rank0_gathers", 55, ids((2, 3, 4), "all_gather", "deadlock"),
     [("fail.deadlock_inside", {"rank": 0, "op": "all_gather", "n": 1}),
      ("cause.mismatch", {"calls": "rank 0: all_reduce(1024), all_gather(2x, 128); rank 1: all_reduce(1024)"}),
      ("cause.mismatch_generic", {})], ()),
    ("m10_extra_collective_rank0", 10, {i: "crash" for i in RUNTIME_IDS},
     [("cause.mismatch", {"calls": "rank 0: all_reduce(1); rank 1: all_reduce(1024)"}),
      ("fail.signal", {"rank": 0, "signal": 6, "name": "SIGABRT"}), ("cause.mismatch_generic", {})], ()),
    ("m11_assign_collective_result", 10, {i: "exception" for i in RUNTIME_IDS},
     [("cause.assigned_none", {"op": "all_reduce"})], ()),
    ("m12_async_without_wait", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.async_no_wait", {})], ()),
    ("m13_no_return", 10, {i: "missing" for i in RUNTIME_IDS},
     [("fail.missing", {"rank": 0, "quantity": "gradient", "returned": "NoneType"}), ("hint.missing", {})], ()),
    ("m14_exception_rank1", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("fail.exception", {"rank": 1, "type": "NameError", "message": "name 'factor' is not defined",
                          "where": "line 15 in run_worker: local_feature = scale(torch.full((128,), float(rank)), rank); "
                                   "line 7 in scale: return tensor * factor                          # NameError on rank 1 only"}),
      ("fail.stopped", {"rank": 0, "other": 1})], ()),
    ("m15_endless_loop", 10, {i: "timeout" for i in RUNTIME_IDS},
     [("fail.timeout_outside", {"rank": 1}), ("fail.timeout_inside", {"rank": 0, "op": "all_gather", "n": 1})],
     ("--time-limit", "4")),
]
BY_NAME = {m[0]: m for m in MISTAKES}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", list(BY_NAME))
def test_mistake_scores_and_is_named(name, lang, grade):
    _, score, expected_outcomes, messages, extra = BY_NAME[name]
    results, proc = grade(FIXTURES / "mistakes" / f"{name}.py", *extra, lang=lang)
    assert results["score"] == score, proc.stdout
    assert failing(results) == expected_outcomes
    for key, params in messages:
        assert render(key, params, lang) in proc.stdout, (key, proc.stdout)
    assert_no_traceback(proc)
    assert_hidden_reveals_nothing(results, lang)


def test_there_are_enough_mistakes():
    assert len(MISTAKES) >= 10 and len(list((FIXTURES / "mistakes").glob("*.py"))) == len(MISTAKES)


@pytest.mark.timeout(60)
def test_visible_checks_show_expected_and_actual_per_rank(grade):
    """Per rank: expected shape and values, what came back (shape, dtype, first values), and the cause."""
    results, _ = grade(FIXTURES / "mistakes" / "m01_summed_not_averaged.py")
    test = next(t for t in results["tests"] if t["name"] == "2 ranks: gradient averaged with all_reduce")
    assert test["output"].splitlines() == [
        "Cause: the gradient is world_size times too large: after all_reduce (SUM), divide by world_size.",
        "Rank 0: gradient has wrong values.",
        "Rank 1: gradient has wrong values.",
        "  rank 0 gradient: expected shape [1024], values [1.5 x1024]; got shape [1024], dtype torch.float32, values [3 x1024]",
        "  rank 1 gradient: expected shape [1024], values [1.5 x1024]; got shape [1024], dtype torch.float32, values [3 x1024]",
    ]
    results, _ = grade(FIXTURES / "mistakes" / "m07_stack_not_cat.py", lang="zh")
    test = next(t for t in results["tests"] if t["name"] == "2 个进程：All-Gather 拼接特征")
    assert ("  进程 1 的 full_feature：期望形状 [256]、数值 [0 x128, 1 x128]；"
            "实际形状 [2, 128]、dtype torch.float32、数值 [0 x128, 1 x128]") in test["output"]


@pytest.mark.timeout(60)
def test_exception_shows_only_the_students_frames(grade):
    _, proc = grade(FIXTURES / "mistakes" / "m14_exception_rank1.py")
    for grader_frame in ("rank.py", "grader/", "zygote", "runner.py", "site-packages"):
        assert grader_frame not in proc.stdout


SAFE_TOKENS = re.compile(r"float32|int64|float\(rank \+ 1\)|\(rank \+ 1\)|\(\(n,\), rank \+ 1\)|dim=0|2-D|Hidden check [12]|隐藏测试 [12]")


def assert_hidden_reveals_nothing(results: dict, lang: str) -> None:
    """Hidden checks: a verdict, a hint and named mistakes; no numbers (world sizes, expected values,
    shapes, ranks), no code lines, no per-rank details."""
    hidden = [t for t in results["tests"] if t["visibility"] == "after_published"]
    assert len(hidden) == 4
    for test in hidden:
        text = SAFE_TOKENS.sub("", test["name"] + "\n" + test["output"])
        assert not re.search(r"\d", text), test
        for word in ("expected", "期望", "line ", "rank 0", "rank 1", "进程 0", "进程 1"):
            assert word not in test["output"], test


# ------------------------------------------------------------------------------------------------
# Cheating: at most the static 10 points

CHEATS = [
    ("c01_local_compute_throwaway", "not_collective"),
    ("c02_patch_comparisons", "wrong"),
    ("c03_tensor_subclass", "bad_type"),
    ("c04_fake_output", "bad_type"),
    ("c05_patch_collectives", "not_collective"),
    ("c06_grader_state", "not_collective"),
    ("c07_exit_before_checks", "early_exit"),
    # reads its rank's perturbation state from the grader's module and swaps it with the other ranks:
    # there is nothing to read any more (the supervisor sends each call's deltas only when it is made)
    ("c08_forge_shift_from_seeds", "not_collective"),
    # learns the perturbation through collectives on zeros and adds it to local answers
    ("c09_probe_perturbation_with_zeros", "not_collective"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, outcome", CHEATS, ids=[c[0] for c in CHEATS])
def test_cheat_scores_at_most_the_static_points(name, outcome, grade, tmp_path):
    results, proc = grade(FIXTURES / "cheats" / f"{name}.py")
    assert results["score"] == 10, proc.stdout
    assert failing(results) == {i: outcome for i in RUNTIME_IDS}
    assert [t["score"] for t in results["tests"]] == [5, 5, 0, 0, 0, 0, 0, 0]


@pytest.mark.timeout(60)
def test_fake_output_and_fake_results_change_nothing(grade, tmp_path):
    results, proc = grade(FIXTURES / "cheats" / "c04_fake_output.py")
    assert results["score"] == 10 and len(results["tests"]) == 8
    assert proc.stdout.startswith("== c04_fake_output.py: Score: 10 / 100 ==")
    # the fake report lines appear only inside the quoted output of the rank
    assert "  | == submission.py: Score: 100 / 100 ==" in proc.stdout
    assert not (ROOT / "results.json").exists()


def test_there_are_enough_cheats():
    assert len(CHEATS) >= 6


# ------------------------------------------------------------------------------------------------
# Input that cannot be graded: a clear message and 0, never a traceback

BAD = [
    ("b01_syntax_error.py", "syntax_error", ("static.syntax_error", {"line": 5, "message": "expected ':'"})),
    ("b02_no_run_worker.py", "no_entry", ("static.no_entry", {})),
    ("b03_empty.py", "not_submitted", ("load.empty", {"file": "b03_empty.py"})),
    ("b04_not_utf8.py", "not_submitted", ("load.not_utf8", {"file": "b04_not_utf8.py", "offset": 29})),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("filename, outcome, message", BAD, ids=[b[0] for b in BAD])
def test_ungradable_input_gets_a_clear_message_and_zero(filename, outcome, message, lang, grade):
    results, proc = grade(FIXTURES / "bad" / filename, "--exercise", "dist_primitives", lang=lang)  # nothing to infer it from
    assert results["score"] == 0
    assert set(outcomes(results).values()) == {outcome}
    text = render(*message, lang)
    assert text in proc.stdout and text in results["output"]
    assert proc.returncode == 0
    assert_no_traceback(proc)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_unchanged_stub_scores_zero_with_a_todo_message(lang, grade):
    results, proc = grade(ROOT / "assignments" / "dist_primitives" / "dist_primitives.py", lang=lang)
    assert results["score"] == 0
    assert set(failing(results).values()) == {"todo"}
    assert render("static.todo", {}, lang) in results["output"]
    assert render("fail.todo", {"rank": 0}, lang) in proc.stdout
    assert_no_traceback(proc)


@pytest.mark.timeout(60)
def test_solution_scores_100_and_teaches_the_ring_volumes(grade):
    results, proc = grade(ROOT / "solutions" / "dist_primitives" / "dist_primitives.py")
    assert results["score"] == 100 and failing(results) == {}
    assert "Communication cost (2 ranks, gloo):" in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"rank {rank} all_reduce: [\d.]+ ms; 4096 bytes of data, a ring sends about 4096 bytes "
                         rf"per rank \(2\(2-1\)/2 x 4096\), about [\d.]+ [KMG]?B/s", proc.stdout), proc.stdout
        assert re.search(rf"rank {rank} all_gather: [\d.]+ ms; 1024 bytes of data, a ring sends about 512 bytes "
                         rf"per rank \(\(2-1\)/2 x 1024\), about [\d.]+ [KMG]?B/s", proc.stdout), proc.stdout


@pytest.mark.timeout(60)
def test_check_runs_only_visible_checks_and_sets_the_exit_code():
    proc = run_cli("check", str(FIXTURES / "mistakes" / "m08_hardcoded_world_size.py"), "--lang", "en")
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout  # hard-coded 2 passes what students see
    proc = run_cli("check", str(FIXTURES / "mistakes" / "m07_stack_not_cat.py"), "--lang", "zh")
    assert proc.returncode == 1 and render("cause.stack_not_cat", {}, "zh") in proc.stdout
