"""Notebooks as submissions (grader/notebook.py, through the real CLI) and the in-notebook check
(grader/nbcheck.py) without a kernel; tests/test_nbgrader_e2e.py runs it in a real one."""
from __future__ import annotations

import json

import pytest

from grader.integrations import nbcheck
from grader.submission import load, notebook
from grader.exercise import registry
from grader.feedback.messages import render
from grader.model import CellLines, CheckResult, GradingResult, Note, Outcome
from grader.feedback.render import title

from conftest import FIXTURES, ROOT, run_cli

NB = FIXTURES / "notebooks"
CLASS = NB / "class"
IMPORTS = "import torch\nimport torch.distributed as dist\n"


def problem_of(name: str):
    return load.load(NB / name).problem


# -- loading (no processes) ---------------------------------------------------------------------

def test_code_cells_only_with_magics_and_shell_neutralised():
    sub = load.load(NB / "correct.ipynb")
    assert sub.problem is None
    lines = sub.source.splitlines()
    assert lines[:3] == ["pass  # %matplotlib inline", "pass  # !nvidia-smi", "pass  # %pip install -q torch"]
    assert "echo this cell is shell" not in sub.source          # a %%bash cell is not Python
    assert "# 19." not in sub.source                              # markdown is not code
    compile(sub.source, "correct.ipynb", "exec")


@pytest.mark.parametrize("name, key", [
    ("bad_json.ipynb", "load.bad_notebook"),
    ("not_a_notebook.ipynb", "load.bad_notebook"),
    ("no_code.ipynb", "load.no_code_cells"),
    ("empty_cells.ipynb", "load.no_code_cells"),
    ("split_entry.ipynb", "load.split_entry"),
])
def test_corrupt_notebooks_are_problems_not_exceptions(name, key):
    assert problem_of(name).key == key


def test_split_entry_names_the_line_where_the_continuation_starts():
    sub = load.load(NB / "split_entry.ipynb")
    joined = "\n".join(c.rstrip("\n") + "\n" for c in (
        notebook.cell_source(cell) for cell in json.loads((NB / "split_entry.ipynb").read_text())["cells"]))
    line = sub.problem.params["line"]
    assert joined.splitlines()[line - 1].strip() == "local_feature = torch.full((128,), float(rank))"
    assert "(line 13)" in render("load.split_entry", sub.problem.params, "en")


def test_a_continuation_right_after_its_cell_is_one_function():
    sub = load.load(NB / "split_adjacent.ipynb")
    assert sub.problem is None
    compile(sub.source, "split_adjacent.ipynb", "exec")


def test_nbformat_3_notebooks_load():
    sub = load.load(NB / "nbformat3.ipynb")
    assert sub.problem is None and "def run_worker" in sub.source


@pytest.mark.parametrize("text", ["[" * 100_000, '{"cells": [{"cell_type": "code", "source": [1, 2]}]}',
                                  '{"cells": "abc"}', "", "null"])
def test_hostile_json_never_raises(text):
    source, problem = notebook.code_from_notebook(text)
    assert source is None and problem[0] in ("load.bad_notebook", "load.no_code_cells")


# -- the kernel's program (no processes) --------------------------------------------------------

def test_kernel_program_follows_the_kernel_not_the_page():
    answer = (CLASS / "alice.py").read_text()
    broken = "def run_worker(rank, world_size)\n    pass\n"           # never ran: a SyntaxError
    history = [IMPORTS, "%matplotlib inline\n!ls", "def run_worker(rank, world_size):\n    return None\n",
               answer, broken, "from grader.integrations import nbcheck\nnbcheck.report()"]
    source, key = nbcheck.kernel_program(history)
    assert "pass  # %matplotlib inline" not in source                # a cell with nothing to define
    assert "def run_worker(rank, world_size)\n    pass" not in source
    assert source.index("return None") < source.index("dist.all_reduce")  # kernel order: the answer last
    assert "nbcheck" not in source                                   # check cells define nothing
    # more check cells, a bench cell, or running the answer cell again, is the same program: graded once
    more = history + ['from grader.integrations import nbcheck\nnbcheck.check("ws2.all_reduce")', answer,
                      'from grader.integrations import bench\nbench.notebook("dist_primitives")',
                      'import grader.integrations.nbcheck as nbcheck\nnbcheck.check("ws2.all_gather")']
    assert nbcheck.kernel_program(more)[1] == key
    # a changed answer is a new program
    assert nbcheck.kernel_program(history + [answer.replace("1024", "512")])[1] != key


def test_the_latest_definition_is_the_one_graded():
    old = "def run_worker(rank, world_size):\n    raise NotImplementedError\n"
    new = (CLASS / "alice.py").read_text()
    source, _ = nbcheck.kernel_program([IMPORTS, old, new])
    assert source.index("raise NotImplementedError") < source.index("dist.all_gather")


CHECKS = registry.get("dist_primitives").checks
EX = "dist_primitives"


def test_hidden_failures_show_no_values_and_no_traceback():
    spec = next(s for s in CHECKS if s.id == "ws4.all_gather")
    check = CheckResult(spec, Outcome.WRONG, 0.0, notes=[Note("cause.gather_list_size", {"op": "all_gather"})],
                        details=[Note("detail.rank_value", {"rank": 0, "quantity": "full_feature",
                                                            "expected_shape": "(512,)", "expected": "[0.0, 1.0]",
                                                            "shape": "(256,)", "dtype": "float32", "values": "[0.0]"})])
    text = nbcheck.check_text(GradingResult("notebook.ipynb", [check]), check, "en")
    assert "(512,)" not in text and "expected" not in text and "ws4" not in text
    assert render("hint.wrong", {}, "en") in text and render("cause.gather_list_size", {"op": "all_gather"}, "en") in text
    err = nbcheck.CheckFailed(text)
    assert isinstance(err, AssertionError) and err._render_traceback_() == text.splitlines()


# -- the check with real ranks, without a kernel --------------------------------------------------

@pytest.mark.timeout(90)
def test_check_grades_once_and_is_quiet_on_a_correct_answer(monkeypatch, capsys):
    history = [IMPORTS, (CLASS / "alice.py").read_text()]
    monkeypatch.setattr(nbcheck, "kernel_cells", lambda: history)
    monkeypatch.setattr(nbcheck, "_CACHE", {})
    history.append(f"from grader.integrations import nbcheck\nnbcheck.report('{EX}')")  # the running cell is in the history
    nbcheck.report(EX, "en")
    for spec in CHECKS:
        history.append(f'from grader.integrations import nbcheck\nnbcheck.check("{spec.id}", "{EX}")')
        nbcheck.check(spec.id, EX, "en")
    out, err = capsys.readouterr()
    assert err == ""
    assert "Score: 40 / 40" in out and out.count("[PASS]") == 4 + len(CHECKS)
    assert len(nbcheck._CACHE) == 1


@pytest.mark.timeout(90)
def test_check_raises_the_checks_feedback(monkeypatch, capsys):
    monkeypatch.setattr(nbcheck, "kernel_cells", lambda: [IMPORTS, (CLASS / "dave.py").read_text()])
    monkeypatch.setattr(nbcheck, "_CACHE", {})
    nbcheck.check("ws2.all_gather", EX, "en")
    with pytest.raises(nbcheck.CheckFailed) as failed:
        nbcheck.check("ws2.all_reduce", EX, "en")
    assert "world_size times the mean" in failed.value.text
    with pytest.raises(nbcheck.CheckFailed) as hidden:
        nbcheck.check("ws3.all_reduce", EX, "en")
    assert title(CheckResult(next(s for s in CHECKS if s.id == "ws3.all_reduce"), Outcome.WRONG), "en", CHECKS) in hidden.value.text
    assert "expected" not in hidden.value.text and "ws3" not in hidden.value.text
    with pytest.raises(ValueError):
        nbcheck.check("ws9.all_reduce", EX)
    assert capsys.readouterr().err == ""


# -- through the CLI ----------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["correct.ipynb", "split_adjacent.ipynb", "nbformat3.ipynb"])
def test_cli_grades_notebooks(grade, name):
    results, proc = grade(NB / name)
    assert results["score"] == 100, results
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_cli_check_takes_a_notebook():
    proc = run_cli("check", str(NB / "correct.ipynb"), "--lang", "en")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Score: 40 / 40" in proc.stdout


@pytest.mark.timeout(120)
def test_cli_check_on_the_release_notebook_says_todo():
    proc = run_cli("check", str(ROOT / "assignments" / "dist_primitives" / "dist_primitives.ipynb"), "--lang", "en")
    assert proc.returncode == 1
    assert "run_worker still raises NotImplementedError" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, key, params", [
    ("bad_json.ipynb", "load.bad_notebook", None),
    ("not_a_notebook.ipynb", "load.bad_notebook", {"error": "no 'cells' list"}),
    ("no_code.ipynb", "load.no_code_cells", {}),
    ("split_entry.ipynb", "load.split_entry", {"line": CellLines(((4, 1),))}),   # line 13 of the joined cells
])
def test_cli_gives_corrupt_notebooks_a_message_and_zero(grade, name, key, params):
    results, proc = grade(NB / name, "--exercise", EX, lang="zh")
    assert results["score"] == 0 and results["extra_data"]["grader_error"] is None
    expected = render(key, params if params is not None else problem_of(name).params, "zh")
    assert expected in results["output"]
    assert "Traceback" not in proc.stdout + proc.stderr


# -- %%writefile cells and where each line is (issue 19; no processes) ------------------------------

def test_writefile_cells_are_kept_as_the_files_jupyter_writes():
    sub = load.load(NB / "writefile_worker.ipynb")
    assert sub.problem is None and sub.notes == ()
    assert sub.source.startswith("import torch.multiprocessing as mp\nfrom dist_worker import run_worker\n")
    worker = sub.files["dist_worker.py"]
    assert list(sub.files) == ["dist_worker.py"] and worker.endswith("return torch.cat(gathered)\n")
    assert worker.index("def run_worker") < worker.index("def gather_all")          # -a appends
    compile(worker, "dist_worker.py", "exec")
    # each line of the file is where the student sees it: the cell that wrote it, below its %%writefile line
    # (every cell counted, as Jupyter shows them: the notebook opens with a markdown cell)
    assert sub.line_map.files["dist_worker.py"][5] == (2, 6) and worker.splitlines()[4].startswith("def run_worker")
    assert sub.line_map.files["dist_worker.py"][15] == (3, 6) and "dist.all_gather" in worker.splitlines()[14]
    assert sub.line_map.source[2] == (4, 2) and sub.line_map.entry_files["run_worker"] == "dist_worker.py"


def test_writefile_names_outside_the_folder_are_notes_never_files():
    sub = load.load(NB / "writefile_bad_names.ipynb")
    assert sub.problem is None
    assert sub.files == {"utils/helpers.py": "def helper():\n    return 1\n", "notes.txt": "first\nsecond\n"}
    assert [(n.key, n.params["cell"]) for n in sub.notes] == [("note.writefile_bad_name", c) for c in range(1, 6)] + [
        ("note.magic_ignored", 9)]
    assert [n.params["file"] for n in sub.notes[:5]] == ["/tmp/evil.py", "../up.py", "{name}.py", "'unterminated.py", ".hidden.py"]
    for n in sub.notes[:5]:
        assert render(n.key, n.params, "zh") != n.key and "%%writefile" in render(n.key, n.params, "en")


@pytest.mark.parametrize("name, safe", [("a.py", "a.py"), ("./pkg/a.py", "pkg/a.py"), ("工具.py", "工具.py"),
                                        ("/etc/passwd", None), ("a/../../b.py", None), ("~/x.py", None),
                                        ("a\\b.py", None), ("$x.py", None), ("a\x00.py", None), ("", None), (".", None)])
def test_safe_names(name, safe):
    assert notebook.safe_name(name) == safe


def test_a_file_over_the_cap_or_one_too_many_is_a_note():
    def cell(text):
        return {"cell_type": "code", "source": text}
    big = "x = 1\n" * (notebook.MAX_FILE_BYTES // 6 + 1)
    cells = [cell("%%writefile big.py\n" + big), cell("%%writefile small.py\nx = 1")]
    cells += [cell(f"%%writefile f{i}.py\nx = {i}") for i in range(notebook.MAX_FILES)]
    cells += [cell("def run_worker(rank, world_size):\n    return None")]
    code = notebook.read_notebook(json.dumps({"cells": cells}))
    assert code.problem is None and "big.py" not in code.files and "small.py" in code.files
    assert len(code.files) == notebook.MAX_FILES
    assert [n[0] for n in code.notes] == ["note.writefile_too_large", "note.writefile_too_many"]
    assert code.notes[0][1] == {"cell": 1, "file": "big.py", "limit": notebook.MAX_FILE_BYTES}


def test_the_static_check_follows_the_entry_into_the_file_a_cell_writes():
    import ast
    from grader.submission import static
    for name in ("writefile_worker.ipynb", "writefile_module.ipynb"):
        sub = load.load(NB / name)
        tree = ast.parse(sub.source)
        assert not static.inspect_source(tree).has_entry                     # the notebook's code alone
        report = static.inspect_source(tree, "run_worker", files=sub.files)
        assert report.has_entry and report.entry_file == "dist_worker.py", name
        assert "reduce_scatter" not in report.reached                         # writefile_module's unused helper
    report = static.inspect_source(ast.parse(load.load(NB / "writefile_worker.ipynb").source), files=load.load(
        NB / "writefile_worker.ipynb").files)
    assert report.reached == {"all_reduce": [7], "all_gather": [15]}          # lines of dist_worker.py


def test_line_map_of_the_joined_cells():
    sub = load.load(NB / "cells_syntax_error.ipynb")
    joined = sub.source.splitlines()
    # cells counted as the student sees them, the markdown cell first among them: the third code cell is cell 4
    assert joined[9] == "    return gradient /" and sub.line_map.source[10] == (4, 4)
    assert sub.line_map.source[4] == (3, 1) and 3 not in sub.line_map.source    # the blank line between cells
    assert load.load(FIXTURES / "dist_primitives" / "honest" / "h01_aliased_imports.py").line_map is None


@pytest.mark.timeout(120)
def test_cli_check_finds_the_entry_in_the_file_a_cell_writes():
    """The static checks follow `from dist_worker import run_worker` into the %%writefile cells, and name
    the lines where those cells show them. (That the ranks then import dist_worker is the runner's side:
    each rank writes Submission.files into its folder.)"""
    proc = run_cli("check", str(NB / "writefile_worker.ipynb"), "--exercise", EX, "--lang", "en")
    assert "No function run_worker" not in proc.stdout, proc.stdout
    assert "[PASS] 5/5  Static: run_worker calls dist.all_reduce\n       run_worker reaches all_reduce (cell 2, line 8)." in proc.stdout
    assert "run_worker reaches all_gather (cell 3, line 6)." in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# -- a worker file the notebook imports in any way, or runs as a script ----------------------------

WORKER_NOTEBOOKS = ["writefile_star_import.ipynb",          # from dist_worker import *
                    "writefile_import_in_launcher.ipynb",   # the import is in the function mp.spawn starts
                    "writefile_bang_python.ipynb"]          # !python dist_primitives_worker.py: never imported


@pytest.mark.parametrize("name", WORKER_NOTEBOOKS)
def test_the_static_check_finds_an_entry_the_notebook_imports_anywhere_or_runs(name):
    import ast
    from grader.submission import static
    sub = load.load(NB / name)
    report = static.inspect_source(ast.parse(sub.source), "run_worker", files=sub.files)
    assert report.has_entry and report.entry_file in sub.files and report.entry_params == 2
    assert set(report.reached) == {"all_reduce", "all_gather"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WORKER_NOTEBOOKS)
def test_cli_grades_an_entry_the_notebook_imports_anywhere_or_runs(grade, name):
    """A file the notebook never imports (a script it runs with `!python`) is loaded in the ranks as the
    submission is, its definitions only: its top-level print, and its `if __name__ == "__main__":` mp.spawn,
    never run there."""
    results, proc = grade(NB / name, "--exercise", EX)
    assert results["score"] == 100, results
    assert "No function run_worker" not in results["output"]
    assert "worker.py: loaded" not in json.dumps(results) and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_the_exercise_is_inferred_from_the_functions_a_notebooks_written_files_define(grade):
    """The ring exercise's ring_all_reduce lives in a %%writefile'd module the notebook imports: without
    --exercise, it is the ring that is graded (not dist_primitives, which needs only run_worker)."""
    results, proc = grade(NB / "writefile_helpers_module.ipynb")
    assert results["extra_data"]["exercise"] == "ring_allreduce" and results["score"] == 100, proc.stdout[-2000:]


@pytest.mark.timeout(120)
def test_a_notebook_that_plots_loads_pyplot_in_the_zygote_not_in_every_rank(grade):
    """`import matplotlib.pyplot` in a cell: the zygote imports it once (a rank's own first import finds no font
    cache and no fontconfig in its sandbox: seconds, and a "Fontconfig error" on its output)."""
    results, proc = grade(NB / "writefile_reload_and_a_plot.ipynb", "--exercise", "hierarchical_allreduce")
    assert results["score"] == 100, proc.stdout[-2000:]
    assert "Fontconfig" not in json.dumps(results)


def test_a_truncated_notebook_says_where_its_json_stops():
    """json's own words whole (where the string starts), not cut after 'starting at'."""
    from grader.submission import notebook
    problem = notebook.read_notebook('{"cells": [{"source": "abc').problem
    assert problem[0] == "load.bad_notebook" and problem[1]["error"].endswith("line 1 column 23 (char 22)")
