"""Fixture submissions of the first exercise graded through the real command line: honest styles score
100, common mistakes get their partial scores and their causes named (in English and Chinese), attacks
score 0 on every check they fake, input that cannot be graded gets a clear message and 0.

Each folder of fixtures is graded by ONE `python -m grader batch` (parallel workers, one zygote each):
the same `api.grade` as `grade`, without the clean run whose output only `check` and `grade` show.
"""
from __future__ import annotations

import re

import pytest

from conftest import FIXTURES, ROOT, graded_folder, outcomes, results_of, run_cli
from grader.feedback.messages import render

HONEST = sorted((FIXTURES / "honest").glob("*.py"))
RUNTIME_IDS = [f"ws{ws}.{op}" for ws in (2, 3, 4) for op in ("all_reduce", "all_gather")]
STATIC_IDS = ["static.all_reduce", "static.all_gather"]


def ids(ws_list, op, outcome):
    return {f"ws{ws}.{op}": outcome for ws in ws_list}


def failing(results: dict) -> dict:
    return {k: v for k, v in outcomes(results).items() if v != "pass"}


def texts(results: dict) -> str:
    return results["output"] + "\n" + "\n".join(t["output"] for t in results["tests"])


_BATCHES: dict = {}
ZH_SAMPLE = ("m01_summed_not_averaged", "m09_only_rank0_gathers", "m14_exception_rank1", "m16_reduce_op_max",
             "m18_rank_not_rank_plus_one", "m20_swapped_return", "m22_gather_then_sum", "m25_all_reduce_on_a_copy",
             "m26_gathered_in_reverse_order", "m27_feature_divided_by_world_size", "m28_own_slice_inserted_again",
             "m29_column_views_interleave", "m30_buffers_aliased_from_the_third", "m31_feature_todo_left_at_zeros",
             "m32_micro_batches_divided_twice", "m33_all_reduce_per_micro_batch", "m34_all_reduce_result_unused",
             "m35_broadcast_per_rank", "m10_extra_collective_rank0")


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """batch(folder, lang, *extra, only=names) -> {student: results.json}; each distinct call grades once
    (conftest.graded_folder: shared with the other test files that ask the same)."""
    def grade(folder: str, lang: str = "en", *extra: str, only: tuple = ()) -> dict:
        key = (folder, lang, extra, only)
        if key not in _BATCHES:
            _BATCHES[key] = results_of(graded_folder(tmp_path_factory, folder, "dist_primitives", lang, *extra, only=only))
        return _BATCHES[key]
    return grade


# ------------------------------------------------------------------------------------------------
# Honest styles: 100 (the engine issue's styles, h17-h34, and the first ones)

@pytest.mark.timeout(420)
def test_every_honest_style_scores_100(batch):
    graded = batch("honest")
    assert sorted(graded) == [p.stem for p in HONEST]
    wrong = {name: failing(results) for name, results in graded.items() if results["score"] != 100}
    assert wrong == {}


# Operations the static analysis cannot see (DTensor's full_tensor and redistribute, getattr through a table
# or a name built at run time): every rank completed them in a graded run, the stronger evidence, so the
# static checks pass, saying so. (A static check the runs do not show stays failed: m03 below.)
REACHED_AT_RUN = {
    "h39_dtensor_partial_full_tensor": {"all_reduce": (10, "DTensor.full_tensor"), "all_gather": (12, "DTensor.full_tensor")},
    "h40_dtensor_redistribute_replicate": {"all_reduce": (11, "DTensor.redistribute"), "all_gather": (13, "DTensor.redistribute")},
    "h41_dtensor_distribute_tensor": {"all_reduce": (11, "DTensor.redistribute"), "all_gather": (16, "DTensor.full_tensor")},
    "h42_getattr_table": {"all_reduce": (14, "all_reduce"), "all_gather": (18, "all_gather")},
}


@pytest.mark.timeout(420)
def test_static_checks_pass_where_every_rank_ran_the_operation(batch):
    graded = batch("honest")
    for name, ops in REACHED_AT_RUN.items():
        results = graded[name]
        assert results["score"] == 100, (name, failing(results))
        for op, (line, api) in ops.items():
            text = next(t["output"] for t in results["tests"] if t["name"] == f"Static: run_worker calls dist.{op}")
            params = {"op": op, "entry": "run_worker", "api": api, "line": line}
            assert text == render("static.called_at_run", params, "en"), (name, text)
            assert re.search(r"[\u4e00-\u9fff]", render("static.called_at_run", params, "zh"))


def test_there_are_enough_honest_styles():
    assert len(HONEST) >= 30


# ------------------------------------------------------------------------------------------------
# Common mistakes: exact partial scores, outcome per check, and the cause named in both languages.
# (name, score, non-passing outcomes, messages (catalog key, values) the feedback must hold)

MISTAKES = [
    ("m01_summed_not_averaged", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.summed_not_averaged", {"quantity": "gradient"})]),
    ("m02_integer_gradient", 10, {i: "exception" for i in RUNTIME_IDS},
     [("cause.integer_dtype", {"quantity": "gradient", "dtype": "torch.int64"})]),
    ("m03_reduce_not_all_reduce", 50, {"static.all_reduce": "not_called", **ids((2, 3, 4), "all_reduce", "not_collective")},
     [("cause.rooted_op", {"op": "reduce"}), ("static.not_written", {"op": "all_reduce", "entry": "run_worker"}),
      ("cause.other_op", {"quantity": "gradient", "ops": ["all_reduce"], "used": ["reduce"], "line": 7})]),
    ("m04_shared_buffers", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.shared_buffers", {})]),
    ("m05_gather_list_too_short", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("cause.gather_list_size", {"op": "all_gather"})]),
    ("m06_empty_gather_list", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("cause.gather_list_size", {"op": "all_gather"})]),
    ("m07_stack_not_cat", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.stack_not_cat", {})]),
    ("m08_hardcoded_world_size", 40, {**ids((3, 4), "all_reduce", "exception"), **ids((3, 4), "all_gather", "exception")},
     [("cause.gather_list_size", {"op": "all_gather"})]),
    ("m09_only_rank0_gathers", 55, ids((2, 3, 4), "all_gather", "deadlock"),
     [("fail.deadlock_inside", {"rank": 0, "op": "all_gather", "n": 2, "line": 13}),
      ("cause.mismatch", {"calls": [{"rank": 0, "ops": ["all_reduce(1024)", "all_gather(128)"]},
                                    {"rank": 1, "ops": ["all_reduce(1024)"]}]})]),
    # gloo aborted rank 0 (SIGABRT) on the sizes that do not fit; the switch names the two calls on both ranks
    ("m10_extra_collective_rank0", 10, {i: "exception" for i in RUNTIME_IDS},
     [("cause.mismatch", {"calls": [{"rank": 0, "ops": ["all_reduce(1)"]}, {"rank": 1, "ops": ["all_reduce(1024)"]}]}),
      # the switch's error each rank raised, in the report's own words (never its English text in a zh report)
      ("fail.mismatch_raised", {"rank": 0, "type": "RuntimeError", "op": "all_reduce",
                                "frames": [{"line": 8, "function": "run_worker", "text": "dist.all_reduce(loss)"}]})]),
    ("m11_assign_collective_result", 10, {i: "exception" for i in RUNTIME_IDS},
     [("cause.assigned_none", {"op": "all_reduce"})]),
    ("m12_async_without_wait", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.async_no_wait", {"op": "all_gather"})]),
    ("m13_no_return", 10, {i: "missing" for i in RUNTIME_IDS},
     [("fail.missing", {"rank": 0, "quantity": "gradient", "entry": "run_worker",
                        "names": ["gradient", "full_feature"], "returned": "NoneType"})]),
    ("m14_exception_rank1", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("fail.exception", {"rank": 1, "type": "NameError", "message": "name 'factor' is not defined", "frames": [
         {"line": 15, "function": "run_worker", "text": "local_feature = scale(torch.full((128,), float(rank)), rank)"},
         {"line": 7, "function": "scale", "text": "return tensor * factor                          # NameError on rank 1 only"}]}),
      ("fail.stopped", {"rank": 0, "other": 1})]),
    ("m15_endless_loop", 10, {i: "timeout" for i in RUNTIME_IDS},
     [("fail.timeout_outside", {"rank": 1}), ("fail.timeout_inside", {"rank": 0, "op": "all_gather", "n": 2, "line": 13})]),
    ("m16_reduce_op_max", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.reduce_op", {"op": "all_reduce", "reduce": "MAX", "line": 7})]),
    ("m17_avg_then_divided", 55, ids((2, 3, 4), "all_reduce", "wrong"), [("cause.averaged_twice", {"quantity": "gradient"})]),
    ("m18_rank_not_rank_plus_one", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.contribution", {"quantity": "gradient", "rank": 0, "op": "all_reduce", "line": 7,
                              "sent": "[0 x1024]", "own": "[1 x1024]"})]),
    ("m19_floor_division", 55, ids((2, 3, 4), "all_reduce", "wrong"), [("cause.floor_division", {"quantity": "gradient"})]),
    ("m20_swapped_return", 10, {i: "wrong" for i in RUNTIME_IDS},
     [("cause.swapped", {"quantity": "gradient", "other": "full_feature"}),
      ("cause.swapped", {"quantity": "full_feature", "other": "gradient"})]),
    ("m21_cat_before_wait", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.read_before_wait", {"quantity": "full_feature", "op": "all_gather"})]),
    # the data has landed by the read, but no wait() came before it: still read before wait, on every run
    ("m22_sleep_then_read_before_wait", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.read_before_wait", {"quantity": "full_feature", "op": "all_gather"})]),
    ("m22_gather_then_sum", 50, {"static.all_reduce": "not_called", **ids((2, 3, 4), "all_reduce", "not_collective")},
     [("cause.other_op", {"quantity": "gradient", "ops": ["all_reduce"], "used": ["all_gather"], "line": 10})]),
    ("m23_all_gather_object", 55, ids((2, 3, 4), "all_gather", "not_collective"),
     [("cause.object_collective", {"op": "all_gather_object"})]),
    # once an honest style (the old grader flattened the output before gloo saw it): gloo refuses the stacked
    # form torch's docstring allows (NCCL takes it), as the switch and the real-backend run both show
    ("m24_stacked_output_on_gloo", 55, ids((2, 3, 4), "all_gather", "exception"),
     [("cause.stacked_output", {"op": "all_gather_single"})]),
    ("m25_all_reduce_on_a_copy", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.own_data_divided", {"quantity": "gradient", "op": "all_reduce"})]),
    ("m26_gathered_in_reverse_order", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.concat_order", {"quantity": "full_feature"})]),
    ("m27_feature_divided_by_world_size", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.concat_divided", {"quantity": "full_feature"})]),
    ("m28_own_slice_inserted_again", 55, ids((2, 3, 4), "all_gather", "wrong"),
     [("cause.own_slice_again", {"quantity": "full_feature"})]),
    ("m29_column_views_interleave", 55, ids((2, 3, 4), "all_gather", "wrong"), [("cause.interleaved", {"quantity": "full_feature"})]),
    # wrong at world size 4 only, a hidden one: the cause carries no values, so the hidden check names it
    ("m30_buffers_aliased_from_the_third", 85, {"ws4.all_gather": "wrong"}, [("cause.shared_buffers_some", {"quantity": "full_feature"})]),
    ("m31_feature_todo_left_at_zeros", 50, {"static.all_gather": "not_called", **ids((2, 3, 4), "all_gather", "wrong")},
     [("cause.op_missing", {"quantity": "full_feature", "ops": ["all_gather"]})]),
    ("m32_micro_batches_divided_twice", 55, ids((2, 3, 4), "all_reduce", "wrong"), [("cause.divided_twice", {"quantity": "gradient"})]),
    ("m33_all_reduce_per_micro_batch", 55, ids((2, 3, 4), "all_reduce", "not_collective"),
     [("fail.not_collective_derived", {"rank": 0, "quantity": "gradient", "ops": ["all_reduce"]})]),
    ("m34_all_reduce_result_unused", 55, ids((2, 3, 4), "all_reduce", "wrong"),
     [("cause.unchanged", {"quantity": "gradient", "op": "all_reduce"})]),
    # a broadcast per rank in place of all_gather: the op named (not the gradient's all_reduce beside it)
    ("m35_broadcast_per_rank", 50, {"static.all_gather": "not_called", **ids((2, 3, 4), "all_gather", "not_collective")},
     [("static.not_written", {"op": "all_gather", "entry": "run_worker"}),
      ("cause.other_op", {"quantity": "full_feature", "ops": ["all_gather"], "used": ["broadcast"], "line": 14}),
      ("cause.other_op_generic", {"quantity": "full_feature", "ops": ["all_gather"], "used": ["broadcast"]})]),   # hidden
    # right values, the student's own assert (the perturbed data fails it), then a bug: what the code returns
    # counts at every world size (the locals at the assert are not the answer), so each gets its clean run
    ("m36_bug_after_own_assert", 10, {**ids((2, 3, 4), "all_reduce", "wrong"), **ids((2, 3, 4), "all_gather", "wrong")}, []),
    # its own check stops it at any world size but 2: the perturbed run records the check and goes on (its
    # values are right), but nothing was made where the check failed, so the clean runs decide: it raised
    ("m37_asserts_two_ranks", 40, {**ids((3, 4), "all_reduce", "exception"), **ids((3, 4), "all_gather", "exception")}, []),
    # numpy arrays returned: what came back is named (a numpy.ndarray), not an empty shape
    ("m38_returns_numpy_arrays", 10, {**ids((2, 3, 4), "all_reduce", "bad_type"), **ids((2, 3, 4), "all_gather", "bad_type")},
     [("detail.rank_value_other", {"rank": 0, "quantity": "gradient", "expected_shape": "[1024]",
                                   "expected": "[1.5 x1024]", "type": "numpy.ndarray"})]),
    # right variables, other (wrong) tensors returned with a third item: what is returned is judged
    ("m39_returns_other_tensors_than_its_variables", 10,
     {**ids((2, 3, 4), "all_reduce", "wrong"), **ids((2, 3, 4), "all_gather", "wrong")}, []),
]
# causes a mistake must not be said to have (each was once said of it, falsely)
NOT_SAID = {
    "m25_all_reduce_on_a_copy": ("cause.divided_twice", "cause.averaged_twice"),   # its value is no sum, divided or not
    "m31_feature_todo_left_at_zeros": ("cause.other_op",),                         # its all_reduce is the gradient's
    "m09_only_rank0_gathers": ("cause.other_op",),                                 # rank 1's all_reduce is the gradient's
    "m32_micro_batches_divided_twice": ("cause.hardcoded_ws",),                     # K = 4 micro-batches is no divisor
    "m33_all_reduce_per_micro_batch": ("fail.not_collective",),                     # it did use what was delivered
    "m19_floor_division": ("cause.own_data_divided",),                              # one rank's floor equals its data / 2
    "m35_broadcast_per_rank": ("fail.not_collective",),                             # it used what the broadcasts delivered
}
BY_NAME = {m[0]: m for m in MISTAKES}
# "hard-coded world size" is said only where the value follows a constant of the source
NEVER_HARDCODED = {"m01_summed_not_averaged", "m16_reduce_op_max", "m17_avg_then_divided", "m18_rank_not_rank_plus_one",
                   "m19_floor_division", "m32_micro_batches_divided_twice"}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_mistakes_score_and_are_named(lang, batch):
    """Every mistake in English; in Chinese, a sample covering the kinds of feedback (the same code
    renders both: tests/test_teach_messages.py checks the catalog itself)."""
    if lang == "en":
        graded = batch("mistakes", lang, "--time-limit", "2")
        assert sorted(graded) == sorted(BY_NAME) == sorted(p.stem for p in (FIXTURES / "mistakes").glob("*.py"))
    else:
        graded = batch("mistakes", lang, "--time-limit", "2", only=ZH_SAMPLE)
    for name, score, expected, messages in [m for m in MISTAKES if m[0] in graded]:
        results = graded[name]
        assert (results["score"], failing(results)) == (score, expected), name
        text = texts(results)
        for key, params in messages:
            assert render(key, params, lang) in text, (name, key, text)
        named = {c["key"] for causes in results["extra_data"]["causes"].values() for c in causes}
        assert not named & set(NOT_SAID.get(name, ())), (name, named & set(NOT_SAID[name]))
        if lang == "zh":
            assert "the ranks called different operations" not in text, name
        if name in NEVER_HARDCODED:
            assert render("cause.hardcoded_ws", {"quantity": "gradient", "k": 2}, lang).split("2")[0] not in text, name
        assert_hidden_reveals_nothing(results)


@pytest.mark.timeout(420)
def test_visible_notes_show_the_clean_runs_values(batch):
    """The tracer works on a perturbed run; the numbers a student reads are the clean run's, what the code
    computes (m22's gradient is right: 1.5 at 2 ranks, not 1.5 plus the grader's deltas)."""
    results = batch("mistakes", "en", "--time-limit", "2")["m22_gather_then_sum"]
    test = next(t for t in results["tests"] if t["name"] == "Gradient averaged with all_reduce (2 ranks)")
    assert render("why.not_delivered_value", {"rank": 0, "quantity": "gradient", "element": 0, "value": 1.5,
                                              "ops": ["all_reduce"]}, "en") in test["output"], test["output"]


def test_there_are_enough_mistakes():
    assert len(MISTAKES) >= 20


SAFE_TOKENS = re.compile(r"float32|int64|float\(rank \+ 1\)|\(rank \+ 1\)|\(\(n,\), rank \+ 1\)|dim=0|2-D|1/world_size|"
                         r"all_\w+|Hidden check [12]|隐藏测试 [12]")


def assert_hidden_reveals_nothing(results: dict) -> None:
    """Hidden checks: a verdict, a hint and named mistakes; no numbers (world sizes, expected values,
    shapes, ranks), no code lines, no per-rank details."""
    hidden = [t for t in results["tests"] if t["visibility"] == "after_published"]
    assert len(hidden) == 4
    for test in hidden:
        text = SAFE_TOKENS.sub("", test["name"] + "\n" + test["output"])
        assert not re.search(r"\d", text), test
        for word in ("expected", "期望", "line ", "第", "rank 0", "rank 1", "进程 0", "进程 1"):
            assert word not in test["output"], test


# ------------------------------------------------------------------------------------------------
# Attacks: 0 on every check they fake (the static points stay: the code does call the collectives)

CHEATS = {
    "c01_local_compute_throwaway": "not_collective",
    "c02_patch_comparisons": "wrong",
    "c03_tensor_subclass": "bad_type",
    "c04_fake_output": "missing",
    "c05_patch_collectives": "not_collective",
    "c06_grader_state": "not_collective",
    "c07_exit_before_checks": "early_exit",
    "c08_forge_shift_from_seeds": "not_collective",          # no seed is in the rank before its operation
    "c09_probe_perturbation_with_zeros": "not_collective",
    # answers added to buffers in flight: lost when the data lands after the edit (a wrong value), or kept
    # when it landed before (the right numbers, not what was delivered): 0 either way
    "c10_async_probe_edit_before_wait": {"not_collective", "wrong"},
    "c11_async_probe_edit_after_sleep": {"not_collective", "wrong"},
    "c13_one_rank_for_all": "not_collective",
    "c14_racing_thread": "not_collective",
    "c15_torch_function_mode": "wrong",                     # the grader's reads ignore the student's mode
    # switches the perturbation off inside its rank: what was delivered no longer matches what was sent
    "c16_disable_the_perturbation": "not_collective",
    # the grader's copies and records ignore the student's dispatch mode: what the rank really sent (zeros)
    # is reported, and summed (see below)
    "c17_torch_dispatch_mode": "wrong",
    # torch's AsyncCollectiveTensor is read as the tensor it waits for (h44); a subclass of it is not, and
    # torch's class wrapped around a local answer waits for nothing the communication delivered
    "c18_forged_async_tensor": {"bad_type", "not_collective"},
}


@pytest.mark.timeout(420)
def test_every_attack_scores_zero_on_what_it_fakes(batch):
    graded = batch("cheats")
    for name, outcome in CHEATS.items():
        results = graded[name]
        assert results["score"] == 10, (name, failing(results))
        allowed = outcome if isinstance(outcome, set) else {outcome}
        assert set(failing(results)) == set(RUNTIME_IDS) and set(failing(results).values()) <= allowed, name
    # laundering fakes the gradient only: its feature is honest
    laundered = graded["c12_launder_local_average"]
    assert failing(laundered) == ids((2, 3, 4), "all_reduce", "not_collective")
    assert render("why.contribution", {"rank": 0, "n": 1, "op": "all_reduce", "line": 10, "sent": "[1.5 x1024]",
                                       "own": "[1 x1024]"}, "en") in texts(laundered)
    # a dispatch mode that forges reshapes and copies: the report still shows what was sent (it once read the
    # sent tensor through the student's mode and said "[1.5 x1024]", a forged record)
    assert "rank 0 sent [0 x1024] in all_reduce (line 31)" in texts(graded["c17_torch_dispatch_mode"])


def test_there_are_enough_cheats():
    assert len(CHEATS) + 1 == len(list((FIXTURES / "cheats").glob("*.py"))) >= 15


# ------------------------------------------------------------------------------------------------
# One submission at a time, through `grade` and `check`

@pytest.mark.timeout(60)
def test_visible_checks_show_expected_and_actual_per_rank(grade):
    results, _ = grade(FIXTURES / "mistakes" / "m01_summed_not_averaged.py")
    test = next(t for t in results["tests"] if t["name"] == "Gradient averaged with all_reduce (2 ranks)")
    assert test["output"].splitlines() == [
        "Cause: gradient is world_size times the mean: after the sum (SUM), divide by world_size.",
        "Rank 0: gradient has wrong values.",
        "Rank 1: gradient has wrong values.",
        "  rank 0 gradient: expected shape [1024], values [1.5 x1024]; got shape [1024], dtype torch.float32, values [3 x1024]",
        "  rank 1 gradient: expected shape [1024], values [1.5 x1024]; got shape [1024], dtype torch.float32, values [3 x1024]",
    ]
    results, _ = grade(FIXTURES / "mistakes" / "m07_stack_not_cat.py", lang="zh")
    test = next(t for t in results["tests"] if t["name"] == "All-Gather 拼接特征（2 个进程）")
    assert ("  进程 1 的 full_feature：期望形状 [256]、数值 [0 x128, 1 x128]；"
            "实际形状 [2, 128]、dtype torch.float32、数值 [0 x128, 1 x128]") in test["output"]


@pytest.mark.timeout(60)
def test_exception_shows_only_the_students_frames_in_the_reports_language(grade):
    results, proc = grade(FIXTURES / "mistakes" / "m14_exception_rank1.py", lang="zh")
    for grader_frame in ("rank.py", "grader/", "zygote", "runner.py", "site-packages", "line 15 in"):
        assert grader_frame not in proc.stdout
    assert "（第 15 行，run_worker 中：local_feature = scale(torch.full((128,), float(rank)), rank)；第 7 行，scale 中：" in proc.stdout


@pytest.mark.timeout(60)
def test_fake_output_and_fake_results_change_nothing(grade):
    results, proc = grade(FIXTURES / "cheats" / "c04_fake_output.py")
    assert results["score"] == 10 and len(results["tests"]) == 8
    assert proc.stdout.startswith("== c04_fake_output.py: Score: 10 / 100 ==")
    # the fake report lines appear only inside the quoted output of the rank
    assert "  | == submission.py: Score: 100 / 100 ==" in proc.stdout
    assert not (ROOT / "results.json").exists()


BAD = [
    ("b01_syntax_error.py", "syntax_error", ("static.syntax_error", {"line": 5, "message": "expected ':'"})),
    ("b02_no_run_worker.py", "no_entry", ("static.no_entry", {"entry": "run_worker"})),
    ("b03_empty.py", "not_submitted", ("load.empty", {"file": "b03_empty.py"})),
    ("b04_not_utf8.py", "not_submitted", ("load.not_utf8", {"file": "b04_not_utf8.py", "offset": 29})),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("filename, outcome, message", BAD, ids=[b[0] for b in BAD])
def test_ungradable_input_gets_a_clear_message_and_zero(filename, outcome, message, grade):
    for lang in ("en", "zh"):
        results, proc = grade(FIXTURES / "bad" / filename, "--exercise", "dist_primitives", lang=lang)
        assert results["score"] == 0
        assert set(outcomes(results).values()) == {outcome}
        text = render(*message, lang)
        assert text in proc.stdout and text in results["output"]
        assert proc.returncode == 0
        assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_unchanged_stub_scores_zero_with_a_todo_message(grade):
    results, proc = grade(ROOT / "assignments" / "dist_primitives" / "dist_primitives.py", lang="zh")
    assert results["score"] == 0
    assert set(failing(results).values()) == {"todo"}
    assert "run_worker 仍然抛出 NotImplementedError：请先完成 TODO 1（all_reduce）、TODO 2（all_gather）。" in results["output"]
    assert render("fail.todo", {"rank": 0}, "zh") in proc.stdout


@pytest.mark.timeout(60)
def test_solution_scores_100_and_teaches_the_ring_volumes(grade):
    results, proc = grade(ROOT / "solutions" / "dist_primitives" / "dist_primitives.py")
    assert results["score"] == 100 and failing(results) == {}
    assert "Communication cost (2 ranks, gloo):" in proc.stdout
    # each call timed on real gloo, labelled as the first call it is; no bandwidth from a first call of a few KiB
    for rank in (0, 1):
        assert re.search(rf"rank {rank} all_reduce: [\d.]+ ms \(its first call, set-up included\); 4096 bytes of data, "
                         rf"a ring sends about 4096 bytes per rank \(2\(2-1\)/2 x 4096\)\n", proc.stdout), proc.stdout
        assert re.search(rf"rank {rank} all_gather: [\d.]+ ms \(its first call, set-up included\); 1024 bytes of data, "
                         rf"a ring sends about 512 bytes per rank \(\(2-1\)/2 x 1024\)\n", proc.stdout), proc.stdout
    assert "B/s" not in proc.stdout
    assert "No bandwidth is given for a first call" in proc.stdout and "python -m grader bench measures" in proc.stdout


@pytest.mark.timeout(240)
def test_torch_compile_in_the_ranks_scores_every_visible_point():
    """torch.compile (inductor) for the local arithmetic: each rank compiles in its own /tmp, whose file
    lock inductor takes while it checks the C++ toolchain. Through `check` (the visible world size, switch and
    real backend): every rank compiles afresh, so the hidden world sizes would only cost more of the same."""
    proc = run_cli("check", str(FIXTURES / "compile" / "h50_torch_compile.py"), "--lang", "en", timeout=220)
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout, proc.stdout + proc.stderr


def test_check_runs_only_visible_checks_and_sets_the_exit_code():
    proc = run_cli("check", str(FIXTURES / "mistakes" / "m08_hardcoded_world_size.py"), "--lang", "en")
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout  # hard-coded 2 passes what students see
    proc = run_cli("check", str(FIXTURES / "mistakes" / "m07_stack_not_cat.py"), "--lang", "zh")
    assert proc.returncode == 1 and render("cause.stack_not_cat", {}, "zh") in proc.stdout
