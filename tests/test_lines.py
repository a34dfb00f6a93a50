"""Line numbers in a notebook's cells (grader/feedback/lines.py): the rewrite called directly, then the
report of `python -m grader check` on notebooks."""
from __future__ import annotations

import pytest

from conftest import FIXTURES, run_cli
from grader.exercise import registry
from grader.feedback.lines import in_cells
from grader.feedback.messages import render
from grader.model import CellLines, CheckResult, GradingResult, Note, Outcome
from grader.submission import load
from grader.submission.notebook import LineMap

NB = FIXTURES / "notebooks"
CHECKS = registry.get("dist_primitives").checks
MAP = LineMap(source={1: (1, 1), 2: (1, 2), 4: (2, 1), 5: (2, 2), 6: (2, 3)},
              files={"dist_worker.py": {1: (3, 2), 2: (3, 3), 3: (4, 2)}}, entry_files={"run_worker": "dist_worker.py"})


def result_with(*notes: Note, entry: str = "run_worker") -> GradingResult:
    check = CheckResult(CHECKS[0], Outcome.EXCEPTION, notes=list(notes), details=list(notes))
    return GradingResult("nb.ipynb", [check], summary=list(notes), entry=entry)


def test_every_line_reference_is_put_in_its_cell():
    frames = [{"line": 6, "function": "run_worker", "text": "x = 1 / 0"}, {"line": 3, "function": "h", "text": ""},
              {"line": 2, "function": "w", "text": "", "file": "dist_worker.py"}]
    out = in_cells(result_with(Note("static.syntax_error", {"line": 5, "message": "m"}),
                               Note("fail.exception", {"rank": 0, "type": "E", "message": "m", "frames": frames}),
                               Note("fail.timeout_inside", {"rank": 1, "n": 2, "op": "all_reduce", "line": "?"})), MAP)
    syntax, exception, timeout = out.summary
    assert syntax.params["line"] == CellLines(((2, 2),))
    assert [f["line"] for f in exception.params["frames"]] == [CellLines(((2, 3),)), 3, CellLines(((3, 3),))]  # 3: between cells
    assert timeout.params["line"] == "?"
    assert out.checks[0].notes == out.summary == out.checks[0].details
    assert render(exception.key, exception.params, "en") == (
        "Rank 0 raised E: m (cell 2, line 3 in run_worker: x = 1 / 0; line 3 in h: ; cell 3, line 3 in w: )")
    assert render(syntax.key, syntax.params, "zh") == "语法错误，第 2 个单元格第 2 行：m"


def test_the_static_checks_lines_are_those_of_the_file_the_entry_is_in():
    called = Note("static.called", {"entry": "run_worker", "op": "all_reduce", "lines": [1, 3]})
    assert in_cells(result_with(called), MAP).summary[0].params["lines"] == CellLines(((3, 2), (4, 2)))
    in_notebook = Note("static.called", {"entry": "main", "op": "all_reduce", "lines": [1, 4]})   # main: the notebook's own
    assert in_cells(result_with(in_notebook, entry="main"), MAP).summary[0].params["lines"] == CellLines(((1, 1), (2, 1)))
    text = render("static.called", in_cells(result_with(called), MAP).summary[0].params, "en")
    assert text == "run_worker reaches all_reduce (cell 3, line 2; cell 4, line 2)."
    two = render("static.called", {"entry": "run_worker", "op": "all_reduce", "lines": CellLines(((2, 1), (2, 3)))}, "zh")
    assert two == "run_worker 用到了 all_reduce（第 2 个单元格第 1、3 行）。"


def test_a_py_submission_keeps_plain_line_numbers():
    note = Note("static.syntax_error", {"line": 5, "message": "m"})
    assert in_cells(result_with(note), None).summary == [note]
    assert load.load(FIXTURES / "bad" / "b01_syntax_error.py").line_map is None


# -- through the command line -----------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang, words", [("en", "Syntax error at cell 4, line 4: invalid syntax"),
                                         ("zh", "语法错误，第 4 个单元格第 4 行：invalid syntax")])
def test_check_names_the_cell_and_line_of_a_syntax_error(lang, words):
    """Cells counted as the student sees them: the markdown cell above the code is cell 1."""
    proc = run_cli("check", str(NB / "cells_syntax_error.ipynb"), "--exercise", "dist_primitives", "--lang", lang)
    assert proc.returncode == 1 and words in proc.stdout, proc.stdout
    assert "line 10" not in proc.stdout and "第 10 行" not in proc.stdout      # the joined code's line


@pytest.mark.timeout(120)
def test_check_names_the_cells_of_an_exceptions_frames():
    proc = run_cli("check", str(NB / "cells_exception.ipynb"), "--exercise", "dist_primitives", "--lang", "en")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "raised KeyError: 2 (cell 3, line 4 in run_worker: gradient = scale(gradient, world_size); " \
           "cell 2, line 5 in scale: " in proc.stdout, proc.stdout
    assert "run_worker reaches all_reduce (cell 3, line 3)." in proc.stdout
