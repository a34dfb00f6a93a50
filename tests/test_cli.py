"""The command line's contract: exit codes, results.json always written, backends, languages."""
from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, ROOT, outcomes, run_cli, stretched

SOLUTION = ROOT / "solutions" / "dist_primitives" / "dist_primitives.py"
STUB = ROOT / "assignments" / "dist_primitives" / "dist_primitives.py"


@pytest.mark.timeout(60)
def test_check_exit_codes():
    ok = run_cli("check", str(SOLUTION), "--lang", "en")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Score: 40 / 40" in ok.stdout  # check runs only the visible checks
    todo = run_cli("check", str(STUB), "--lang", "en")
    assert todo.returncode == 1
    assert "complete TODO 1 (all_reduce) and TODO 2 (all_gather)" in todo.stdout


@pytest.mark.timeout(60)
def test_grade_exits_zero_whatever_the_score(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(STUB), "--results", str(results), "--lang", "en")
    assert proc.returncode == 0
    data = json.loads(results.read_text())
    assert data["score"] == 0
    assert {t["visibility"] for t in data["tests"]} == {"visible", "after_published"}


@pytest.mark.timeout(60)
def test_missing_path_is_a_usage_error_and_still_writes_results(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(tmp_path / "nope.py"), "--results", str(results), "--lang", "en")
    assert proc.returncode == 2
    data = json.loads(results.read_text())
    assert data["score"] == 0 and data["tests"][0]["name"] == "Autograder failed"
    assert run_cli("check", str(tmp_path / "nope.py")).returncode == 2
    assert run_cli("grade").returncode == 2  # argparse usage error


@pytest.mark.timeout(60)
def test_grader_failure_still_writes_results(tmp_path):
    """A broken torch makes the zygote fail at start-up: a visible 'autograder failed' test and a zero."""
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SOLUTION), "--results", str(results), "--lang", "en",
                   env={"PYTHONPATH": str(FIXTURES / "broken_torch")})
    assert proc.returncode == 0
    data = json.loads(results.read_text())
    assert data["score"] == 0
    assert data["tests"][0] == {"name": "Autograder failed", "score": 0, "max_score": 0, "status": "failed",
                                "output": "The autograder failed; this grade is 0 until a TA looks at it.",
                                "visibility": "visible"}
    assert "broken on purpose" in data["extra_data"]["grader_error"]
    assert "broken on purpose" not in "".join(t["output"] for t in data["tests"])


@pytest.mark.timeout(60)
def test_nccl_without_enough_gpus_says_so(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SOLUTION), "--results", str(results), "--lang", "en", "--backend", "nccl")
    data = json.loads(results.read_text())
    # graded runs need no GPU (CUDA tensors go through the switch by host copies): only the real-backend run
    # cannot be made, and the report says so
    assert data["score"] == 100
    assert "NCCL needs at least 2 visible GPUs; this machine shows 0: the code was not run on real NCCL" in proc.stdout


@pytest.mark.timeout(60)
def test_language_defaults_to_chinese_and_follows_lang(tmp_path):
    zh = run_cli("check", str(SOLUTION), env={"LANG": "", "LC_ALL": ""}, template=True)
    assert "得分：40 / 40" in zh.stdout
    en = run_cli("check", str(SOLUTION), env={"LANG": "en_US.UTF-8", "LC_ALL": ""}, template=True)
    assert "Score: 40 / 40" in en.stdout


@pytest.mark.timeout(60)
def test_odd_tensors_are_wrong_answers_not_grader_failures(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(FIXTURES / "bad" / "odd_tensors.py"), "--results", str(results), "--lang", "en")
    data = json.loads(results.read_text())
    runtime = {k: v for k, v in outcomes(data).items() if not k.startswith("static")}
    assert {v for k, v in runtime.items() if k.endswith("all_gather")} == {"wrong"}, proc.stdout
    assert {v for k, v in runtime.items() if k.endswith("all_reduce")} == {"pass"}, proc.stdout   # sparse, right values
    assert "full_feature does not have a floating dtype" in proc.stdout
    assert data["extra_data"]["grader_error"] is None


@pytest.mark.timeout(60)
def test_values_that_overflow_are_wrong_answers_with_nothing_on_stderr(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(FIXTURES / "bad" / "overflowing_values.py"), "--exercise", "fp16_allreduce",
                   "--results", str(results), "--lang", "en")
    data = json.loads(results.read_text())
    assert data["extra_data"]["grader_error"] is None and data["score"] < 50, proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_failing_rank_is_placed_in_its_collectives(lang):
    """Each failure verdict names the rank and the last collective it entered (or that it entered none)."""
    from grader.feedback.messages import render
    raised = run_cli("check", str(FIXTURES / "dist_primitives" / "mistakes" / "m14_exception_rank1.py"), "--lang", lang)
    assert render("detail.last_collective", {"rank": 1, "op": "all_reduce", "n": 1, "line": 13}, lang) in raised.stdout
    exited = run_cli("check", str(FIXTURES / "sandbox" / "os_exit.py"), "--lang", lang)
    assert render("detail.no_collective", {"rank": 0}, lang) in exited.stdout


def test_list_shows_exercises_points_and_visible_world_sizes_only():
    proc = run_cli("list", "--lang", "en")
    assert proc.returncode == 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("dist_primitives:"))
    assert "100 points" in line and "visible world sizes 2)" in line
    assert "3" not in line.split("(")[-1]   # the hidden world sizes stay hidden
    zh = run_cli("list", "--lang", "zh")
    assert "dist_primitives：" in zh.stdout and "可见进程数 2" in zh.stdout


@pytest.mark.timeout(60)
def test_an_unknown_exercise_is_a_clear_usage_error(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SOLUTION), "--exercise", "no_such", "--results", str(results), "--lang", "en")
    assert proc.returncode == 2
    assert "There is no exercise called no_such. Exercises:" in proc.stdout
    assert json.loads(results.read_text())["score"] == 0
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_odd_returned_objects_and_huge_calls_never_break_the_grader():
    """A list subclass whose __len__ and __iter__ raise is read by position; a 32 MiB collective before
    the real work is more than the grader records of one call, and costs the student nothing."""
    proc = run_cli("check", str(FIXTURES / "bad" / "odd_return.py"), "--lang", "en")
    assert proc.returncode == 0 and "Score: 40 / 40" in proc.stdout, proc.stdout + proc.stderr
    assert "Autograder failed" not in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_a_zygote_started_early_never_outlives_its_command(tmp_path):
    """`grade` and `check` start their zygote before their own imports, and `batch` its template zygote; a
    command that never grades (a missing file or folder, --help) removes it and its folder on the way out."""
    import os
    import subprocess
    import sys
    import tempfile
    import time
    for args in (["grade", str(tmp_path / "missing.py"), "--results", str(tmp_path / "r.json")], ["check", "--help"],
                 ["batch", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]):
        proc = subprocess.Popen([sys.executable, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        proc.communicate(timeout=stretched(50))
        assert proc.returncode in (0, 2)
        mark = f"grader-runs-{proc.pid}-"
        time.sleep(0.2)
        assert not [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(mark)], args
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    assert mark.encode() not in fh.read(), (args, pid)
            except OSError:
                pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path, lang, first", [
    (FIXTURES / "notebooks" / "cells_syntax_error.ipynb", "en", "Syntax error at cell 4, line 4: invalid syntax"),
    (FIXTURES / "bad" / "b01_syntax_error.py", "zh", "语法错误，第 5 行：expected ':'"),
    (FIXTURES / "bad" / "b02_no_run_worker.py", "en",
     "The code defines none of the functions the exercises start from (run_worker). Keep the function's name."),
    (FIXTURES / "bad" / "b02_no_run_worker.py", "zh", "代码里没有定义任何练习的入口函数（run_worker）。请不要修改函数名。"),
    (FIXTURES / "bad" / "b03_empty.py", "en", "b03_empty.py is empty: complete the code and submit it."),
])
def test_when_the_exercise_cannot_be_told_the_submissions_own_problem_is_all_it_says(path, lang, first):
    """Several exercises, a file whose name and code name none because it is empty, does not parse or starts
    none of them: its own problem, and no "cannot tell which exercise" (choosing one would not help), no
    score out of 0 (nothing was graded, nothing passed)."""
    proc = run_cli("check", str(path), "--lang", lang)
    assert proc.returncode == 1, proc.stdout + proc.stderr        # the submission's problem, not a usage error
    lines = proc.stdout.splitlines()
    assert lines[0] == f"== {path.name} ==" and "0 / 0" not in proc.stdout
    assert lines[1:] == [first], proc.stdout


@pytest.mark.timeout(60)
def test_a_corrupt_notebook_says_only_that(tmp_path):
    path = tmp_path / "answer.ipynb"
    path.write_text("{bad json", encoding="utf-8")
    proc = run_cli("check", str(path), "--lang", "en")
    assert proc.returncode == 1 and proc.stdout.splitlines()[1:] == [
        "The notebook is corrupt and cannot be read: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"], proc.stdout


@pytest.mark.timeout(60)
def test_an_unknown_exercise_is_still_said_beside_the_files_own_problem():
    """--exercise naming no exercise is the student's other mistake: said after the file's own."""
    path = FIXTURES / "bad" / "b03_empty.py"
    proc = run_cli("check", str(path), "--lang", "en", "--exercise", "no_such_exercise")
    lines = proc.stdout.splitlines()
    assert lines[1] == "b03_empty.py is empty: complete the code and submit it."
    assert lines[2].startswith("There is no exercise called no_such_exercise"), proc.stdout


@pytest.mark.timeout(60)
def test_a_sound_file_for_no_known_exercise_is_a_usage_error(tmp_path):
    path = tmp_path / "answer.py"
    path.write_text("def run_worker(rank, world_size):\n    return None\n\ndef ring_all_reduce(t):\n    return t\n\n"
                    "def local_gradient(r):\n    return r\n\ndef initial_parameters():\n    return 0\n")
    proc = run_cli("check", str(path), "--lang", "en", "--exercise", "no_such_exercise")
    assert proc.returncode == 2 and proc.stdout.splitlines()[1].startswith("There is no exercise called no_such_exercise")


def run_labels(results: dict) -> list[tuple[int, str]]:
    return [(run["world_size"], run["label"]) for run in results["extra_data"]["runs"]]


@pytest.mark.timeout(120)
def test_a_perturbed_run_that_delivered_nothing_is_its_world_sizes_clean_run(tmp_path):
    """The stub raises before its first operation, and carol sleeps before hers until the time limit: the
    switch delivered nothing to any rank, so the perturbation never reached their code and no clean run
    repeats them (plan.py, Judge.untouched); their verdicts are a clean run's. A mistake whose operations
    delivered (summed, not averaged) still gets the clean runs that say what the code computes."""
    def grade(path, *extra):
        results = tmp_path / f"{path.stem}.json"
        proc = run_cli("grade", str(path), "--results", str(results), "--lang", "en", *extra)
        return json.loads(results.read_text()), proc.stdout

    stub, text = grade(ROOT / "assignments" / "dist_primitives" / "dist_primitives.py")
    assert run_labels(stub) == [(2, "perturbed"), (3, "perturbed"), (4, "perturbed")]
    assert stub["score"] == 0 and "Rank 0: your code raised NotImplementedError" in text, text
    hang, text = grade(FIXTURES / "notebooks" / "class" / "carol.py", "--time-limit", "2")
    assert run_labels(hang) == [(2, "perturbed"), (3, "perturbed"), (4, "perturbed")]
    assert {run["stop"] for run in hang["extra_data"]["runs"]} == {"timeout"} and hang["score"] == 0
    assert "Time limit: rank 0 never finished, outside any communication" in text, text
    summed, _ = grade(FIXTURES / "batch" / "summed.py")
    assert {label for _, label in run_labels(summed)} >= {"perturbed", "clean"}
    assert {ws for ws, label in run_labels(summed) if label == "clean"} == {2, 3, 4}


@pytest.mark.timeout(120)
def test_the_students_own_checks_are_recorded_in_a_perturbed_run_and_its_values_there_proven(tmp_path):
    """The perturbed data fails the student's own checks by design: a perturbed run records each failed check
    with the values as they stood there, and goes on. The seed's reference asserts both values once made: they
    are proven there and at the end, so its perturbed runs decide alone (no clean run). A bug after the assert
    (m36) leaves the final values unproven: the clean runs decide, and they are wrong. An assert of the
    gathered list's own slot (h61) fires before full_feature exists: the clean run says it is right, and the
    perturbed run, which went on, proves where it came from."""
    def grade(path):
        results = tmp_path / f"{path.stem}.json"
        run_cli("grade", str(path), "--results", str(results), "--lang", "en")
        return json.loads(results.read_text())

    seed = grade(FIXTURES / "dist_primitives" / "honest" / "h06_seed_reference.py")
    assert seed["score"] == 100, outcomes(seed)
    assert sorted(run_labels(seed)) == [(2, "perturbed"), (2, "real"), (3, "perturbed"), (4, "perturbed")]
    bug = grade(FIXTURES / "dist_primitives" / "mistakes" / "m36_bug_after_own_assert.py")
    assert bug["score"] == 10 and {ws for ws, label in run_labels(bug) if label == "clean"} == {2, 3, 4}
    slot = grade(FIXTURES / "dist_primitives" / "honest" / "h61_asserts_its_own_slot.py")
    assert slot["score"] == 100, outcomes(slot)
    assert {label for _, label in run_labels(slot)} == {"perturbed", "clean", "real"}


@pytest.mark.timeout(120)
def test_grade_of_an_answer_that_checks_its_own_values_starts_no_clean_run():
    """`grade` of code that checks its own values (show_output): the seed's reference, whose perturbed runs
    prove its values, makes no clean run at all, not one started and then dropped (three runs whose ranks cost
    as much as the perturbed ones). Where the perturbed run does not decide alone (m36 above), the clean run of
    its world size starts as that run ends (plan.py's watch)."""
    from grader import api
    from grader.processes.runner import Runner
    from grader.submission import load as loader
    launched: list[tuple[int, str]] = []

    class Counting(Runner):
        def _launch(self, request, slot):
            launched.append((request.world_size, request.label))
            return super()._launch(request, slot)

    with Counting() as runner:
        seed = api.grade(loader.load(FIXTURES / "dist_primitives" / "honest" / "h06_seed_reference.py"),
                         runner=runner, exercise="dist_primitives", show_output=True)
    assert seed.score == 100, [(c.spec.id, c.outcome) for c in seed.checks]
    assert sorted(launched) == [(2, "perturbed"), (2, "real"), (3, "perturbed"), (4, "perturbed")]


@pytest.mark.timeout(120)
def test_an_answer_whose_evidence_was_not_kept_fails_saying_so_not_accused():
    """An honest answer between a warm-up and a timing loop of its own size class, past the switch's budget
    for evidence: unproven (evidence lost never passes), and the report says the evidence was not kept, not
    that the answer was computed in some other way. (`check`: the visible world size tells it all.)"""
    from grader.feedback.messages import render
    proc = run_cli("check", str(FIXTURES / "limits" / "answer_between_loops_of_its_size.py"), "--lang", "en",
                   "--backend", "none")
    assert proc.stdout.startswith("== answer_between_loops_of_its_size.py: Score: 10 / 40 =="), proc.stdout[:2000]
    for quantity, op in (("gradient", "all_reduce"), ("full_feature", "all_gather")):
        for rank in (0, 1):
            params = {"rank": rank, "quantity": quantity, "ops": [op]}
            assert render("fail.evidence_dropped", params, "en") in proc.stdout, proc.stdout[:2000]
            assert render("fail.not_collective", params, "en") not in proc.stdout
    assert "Cause:" not in proc.stdout


@pytest.mark.timeout(120)
def test_code_stuck_on_real_gloo_loses_the_visible_world_size_after_a_second_try(tmp_path):
    """Right through the switch, stuck on gloo after the gradient and before the feature: the real-backend
    run runs out of time, is tried once more with twice the time (a loaded machine must not cost an honest
    student), and then costs the visible check whose value it did not reach, saying why (a value check is
    read on the real run as on the switch's: the gradient was right in its locals); the hidden world sizes
    keep their points."""
    from conftest import grade_cli
    from grader.feedback.messages import render
    results, proc = grade_cli(FIXTURES / "real_backend" / "hangs_on_gloo.py", tmp_path, "--exercise", "dist_primitives",
                              "--time-limit", "2")
    got = outcomes(results)
    assert (got["ws2.all_reduce"], got["ws2.all_gather"]) == ("pass", "real_backend"), got
    assert all(got[f"ws{ws}.{q}"] == "pass" for ws in (3, 4) for q in ("all_reduce", "all_gather")), got
    assert results["score"] == 85
    real = [r for r in results["extra_data"]["runs"] if r.get("label") == "real"]
    assert [r.get("stop") for r in real] == ["timeout"] and real[0]["elapsed"] >= 3.5, real   # the second, 2 x 2 s
    text = "\n".join(t["output"] for t in results["tests"])
    assert render("fail.real_backend", {"backend": "gloo"}, "en") in text


@pytest.mark.timeout(120)
def test_a_real_run_after_the_zygote_read_the_name_service_shows_no_c10d_warning(tmp_path):
    """An honest program that builds an optimizer (tests/fixtures/real_backend/optimizer_built.py says why
    that matters): full marks, and its real-backend run's output holds what the student printed (nothing),
    not a c10d warning about a hostname that could not be looked up."""
    from conftest import grade_cli
    results, proc = grade_cli(FIXTURES / "real_backend" / "optimizer_built.py", tmp_path, "--exercise", "dist_primitives")
    assert results["score"] == 100, outcomes(results)
    assert [r["stop"] for r in results["extra_data"]["runs"] if r.get("label") == "real"] == ["completed"]
    assert "[c10d]" not in proc.stdout and "hostname" not in proc.stdout, proc.stdout


@pytest.mark.timeout(120)
def test_an_isend_request_dropped_hangs_on_gloo_and_is_named(tmp_path):
    """The switch delivers every send it is given; gloo drops the message of an isend request freed before the
    receiver posts its recv: the real run hangs. The visible checks name the last call each stuck rank made
    (not "outside any communication": the real run has no switch to say where a rank waits) and the isend
    never waited on; the hidden world sizes keep their points."""
    from conftest import grade_cli
    results, proc = grade_cli(FIXTURES / "real_backend" / "isend_request_dropped.py", tmp_path,
                              "--exercise", "ring_allreduce", "--time-limit", "2")
    got = outcomes(results)
    assert results["score"] == 70 and {got[k] for k in got if k.startswith("ws2.")} == {"real_backend"}, got
    keys = [c["key"] for c in results["extra_data"]["causes"]["ws2.values"]]
    assert "fail.timeout_real" in keys and "cause.isend_not_waited" in keys and "fail.timeout_outside" not in keys, keys
    text = next(t["output"] for t in results["tests"] if t["name"].startswith("Ring all-reduce: values (2"))
    assert "the last communication it called was recv (line " in text and "its isend (line 1" in text, text


@pytest.mark.timeout(60)
def test_a_file_python_refuses_to_compile_is_a_syntax_error_though_it_parses(tmp_path):
    """`return` outside a function parses (ast.parse) but does not compile: Python refuses the whole file, and
    so does the grader, with the line, whatever part of the file its ranks would have run."""
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(FIXTURES / "bad" / "b06_return_outside_a_function.py"), "--results", str(results),
                   "--lang", "en", "--exercise", "dist_primitives")
    data = json.loads(results.read_text())
    assert data["score"] == 0 and "'return' outside function" in proc.stdout and "Syntax error at line" in proc.stdout


@pytest.mark.timeout(120)
def test_a_rank_that_closed_its_channel_ends_the_run_by_its_exit_not_a_deadlock(tmp_path):
    """Rank 0 closes its socket after the all-reduce and exits a second later: the others wait in all_gather
    meanwhile, and the verdict waits for rank 0's exit (code 3) instead of calling the wait a deadlock."""
    results = tmp_path / "r.json"
    run_cli("grade", str(FIXTURES / "limits" / "close_socket_then_exit_late.py"), "--exercise", "dist_primitives",
            "--results", str(results), "--lang", "en", "--backend", "none")
    data = json.loads(results.read_text())
    runs = data["extra_data"]["runs"]
    assert runs and all(run["stop"] != "deadlock" for run in runs), runs
    assert any(c["key"] == "fail.os_exit" for c in data["extra_data"]["causes"].get("ws2.all_gather", [])), data
