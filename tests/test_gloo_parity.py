"""Programs that run on the switch as on torch's gloo: one fixture for each way the switch once did not
(tests/fixtures/gloo_parity/: empty tensors of any shape, a root out of range caught, what gloo refuses,
ranks that differ in the reduce op, a bool SUM's count, torch's profiler, bfloat16, anomaly mode and
checkpoint), graded through the command line; what each must score and say is in expected.json beside them.
A valid program scores what it scores on gloo (full marks); one gloo cannot run fails here too, in gloo's
words, on the rank that made the call.
"""
from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, graded_folder, outcomes, results_of
from grader.feedback.messages import render

FOLDER = FIXTURES / "gloo_parity"
EXPECTED = json.loads((FOLDER / "expected.json").read_text())


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return results_of(graded_folder(tmp_path_factory, "gloo_parity", "dist_primitives"))


def test_every_fixture_has_its_expectation():
    assert sorted(EXPECTED) == sorted(p.stem for p in FOLDER.glob("*.py"))


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_program_behaves_as_on_gloo(graded, name):
    results, expected = graded[name], EXPECTED[name]
    assert results["score"] == expected["score"], [(t["name"], t["output"][:300]) for t in results["tests"]
                                                   if t["status"] != "passed"]
    failed = {check: outcome for check, outcome in outcomes(results).items() if outcome != "pass"}
    assert failed == expected.get("outcomes", {})
    text = "\n".join(t["output"] for t in results["tests"])
    for words in expected.get("says", []):
        assert words in text


@pytest.mark.timeout(300)
def test_the_profiler_runs_in_every_rank_of_a_graded_run_and_on_gloo(grade):
    """The first profile() imports inductor (hasattr(torch, "_inductor")): preloaded once by the zygote, not
    4-8 s in each rank, so the ranks finish well within their limits, the real-backend run included."""
    results, _ = grade(FOLDER / "p6_profiler_record_function.py")
    assert results["score"] == 100, [(t["name"], t["output"][:300]) for t in results["tests"]
                                     if t["status"] != "passed"]


@pytest.mark.timeout(300)
def test_what_differs_between_the_ranks_calls_is_said_in_the_reports_language(tmp_path_factory):
    """The switch's error is English, as gloo's are; a zh report words it itself, with each rank's call."""
    graded = results_of(graded_folder(tmp_path_factory, "gloo_parity", "dist_primitives", "zh",
                                      only=("p4_ranks_differ_in_the_reduce_op",)))
    text = "\n".join(t["output"] for t in graded["p4_ranks_differ_in_the_reduce_op"]["tests"])
    assert render("mismatch.reduce", {}, "zh") in text and "进程 1：all_reduce(float32(1024), op=MAX)" in text
    assert "the ranks called" not in text
