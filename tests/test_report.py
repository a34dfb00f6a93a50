"""The text report (grader/feedback/report.py): which exercise, the points hidden checks hold, the
sandbox line; called directly, then through `python -m grader check`."""
from __future__ import annotations

import pytest

from conftest import ROOT, run_cli
from grader.exercise import registry
from grader.feedback.report import text_report
from grader.feedback.results import to_gradescope
from grader.model import CheckResult, GradingResult, Note, Outcome

EX = registry.get("dist_primitives")
FULL = ["rlimits", "uid_per_run", "pid_ns", "net_ns", "new_root", "no_new_privs", "seccomp"]


def visible_result(layers=()) -> GradingResult:
    checks = [CheckResult(c, Outcome.PASS, c.points) for c in EX.selected(include_hidden=False)]
    return GradingResult("s.py", checks, exercise=EX.name, layers=list(layers), exercise_title=EX.title,
                         exercise_total=EX.total, entry=EX.entry)


@pytest.mark.parametrize("lang, title, hidden", [
    ("en", "Exercise: " + EX.title[1], "60 more points are in hidden checks: check runs the visible checks only"),
    ("zh", "练习：" + EX.title[0], "另有 60 分在隐藏测试中：check 只运行可见测试"),
])
def test_the_report_names_the_exercise_and_the_points_of_its_hidden_checks(lang, title, hidden):
    lines = text_report(visible_result(), lang).splitlines()
    assert lines[1] == title and lines[2].startswith(hidden)
    everything = visible_result()
    everything.checks = [CheckResult(c, Outcome.PASS, c.points) for c in EX.checks]   # `grade`: hidden ones ran
    assert hidden not in text_report(everything, lang)


@pytest.mark.parametrize("weaker", [
    [layer if layer != "seccomp" else "seccomp_off" for layer in FULL],
    [layer if layer != "no_new_privs" else "no_new_privs_off" for layer in FULL],
    ["rlimits", "process_group", "no_namespaces", "no_new_privs", "seccomp"],
])
def test_the_sandbox_line_is_for_staff_unless_a_layer_is_missing(weaker):
    assert "Sandbox:" not in text_report(visible_result(FULL), "en")
    assert "Sandbox: rlimits, " in text_report(visible_result(FULL), "en", staff=True)
    assert "Sandbox: rlimits, " in text_report(visible_result(weaker), "en")
    assert to_gradescope(visible_result(FULL), "en")["extra_data"]["sandbox"] == FULL     # kept for staff


def test_nothing_graded_has_no_score():
    result = GradingResult("s.py", [])
    assert text_report(result, "en").startswith("== s.py ==\n")
    assert "0 / 0" not in to_gradescope(result, "en")["output"]


@pytest.mark.timeout(90)
def test_check_names_the_exercise_and_the_hidden_points():
    proc = run_cli("check", str(ROOT / "solutions" / "dist_primitives" / "dist_primitives.py"), "--lang", "en")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "== dist_primitives.py: Score: 40 / 40 =="
    assert lines[1] == f"Exercise: {EX.title[1]}" and lines[2].startswith("60 more points are in hidden checks")
    assert "Sandbox:" not in proc.stdout or any(k in proc.stdout for k in ("no seccomp", "not applied", "no namespaces"))


@pytest.mark.timeout(90)
def test_check_in_chinese_writes_formulas_with_the_chinese_times_sign():
    import re
    proc = run_cli("check", str(ROOT / "solutions" / "dist_primitives" / "dist_primitives.py"), "--lang", "zh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[1] == f"练习：{EX.title[0]}"
    assert "环形算法每个进程发送约 4096 字节（2(2-1)/2 × 4096）" in proc.stdout
    assert not re.search(r"[\dNS)] x [\dNS(]", proc.stdout)


def test_a_ranks_control_characters_are_shown_escaped_never_sent_to_the_terminal():
    # a rank's output and exception message with ANSI sequences (clear the screen, print a forged score, hide
    # the rest) and a bidirectional override: shown as escapes in the report and in results.json
    forged = "\x1b[2J\x1b[H\x1b[32mScore: 100 / 100\x1b[0m\x1b[8m \u202eneddih"
    result = visible_result()
    result.checks[0] = CheckResult(result.checks[0].spec, Outcome.EXCEPTION, 0, notes=[
        Note("fail.exception", {"rank": 0, "type": "RuntimeError", "message": forged})])
    result.outputs = [(0, forged + "\r\x07\n", len(forged))]
    report, results = text_report(result, "en"), to_gradescope(result, "en")
    shown = [report, results["output"], *(t["output"] for t in results["tests"])]
    assert not any(c in text for text in shown for c in "\x1b\x07\r\u202e")
    assert report.count("\\x1b[2J\\x1b[H\\x1b[32mScore: 100 / 100") == 2 and "\\u202eneddih" in report
    assert "\\x1b[2J" in results["tests"][0]["output"]
