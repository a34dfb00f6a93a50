"""The first exercise, dist_primitives, through its entry points: one honest submission and one mistake
through `grade` and `check` (the report as printed, the students' own frames only, the exit code), input
that cannot be graded (a clear message and 0), the stub and the solution, torch.compile in the ranks.

Its fixture submissions (tests/fixtures/dist_primitives/{honest,mistakes,cheats}/) and what each is expected to
get (its sidecar) are graded by tests/test_fixtures.py, as every exercise's.
"""
from __future__ import annotations

import re

import pytest

from conftest import FIXTURES, ROOT, outcomes, run_cli
from grader.feedback.messages import render

FIX = FIXTURES / "dist_primitives"


def failing(results: dict) -> dict:
    return {k: v for k, v in outcomes(results).items() if v != "pass"}


# ------------------------------------------------------------------------------------------------
# One submission at a time, through `grade` and `check`

@pytest.mark.timeout(60)
def test_exception_shows_only_the_students_frames_in_the_reports_language(grade):
    results, proc = grade(FIX / "mistakes" / "m14_exception_rank1.py", lang="zh")
    for grader_frame in ("rank.py", "grader/", "zygote", "runner.py", "site-packages", "line 15 in"):
        assert grader_frame not in proc.stdout
    assert "（第 15 行，run_worker 中：local_feature = scale(torch.full((128,), float(rank)), rank)；第 7 行，scale 中：" in proc.stdout


@pytest.mark.timeout(60)
def test_fake_output_and_fake_results_change_nothing(grade):
    results, proc = grade(FIX / "cheats" / "c04_fake_output.py")
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


@pytest.mark.timeout(150)
def test_torch_compile_of_the_step_that_communicates_scores_every_visible_point():
    """torch.compile (its default backend) of the step, the collective inside it: dynamo traces it into the
    graph as a functional all-reduce (`_c10d_functional.all_reduce` on the group by name), which the switch
    measures and perturbs as any other, and the division runs in the compiled graph (eager kernels: processes/
    inductor.py). Through `check` (the visible world size, switch and real backend, where the same program
    gives the same values)."""
    proc = run_cli("check", str(FIXTURES / "compile" / "h51_torch_compile_step_communicates.py"), "--lang", "en",
                   timeout=130)
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout, proc.stdout + proc.stderr


def test_check_runs_only_visible_checks_and_sets_the_exit_code():
    proc = run_cli("check", str(FIX / "mistakes" / "m08_hardcoded_world_size.py"), "--lang", "en")
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout  # hard-coded 2 passes what students see
    proc = run_cli("check", str(FIX / "mistakes" / "m07_stack_not_cat.py"), "--lang", "zh")
    assert proc.returncode == 1 and render("cause.stack_not_cat", {}, "zh") in proc.stdout
