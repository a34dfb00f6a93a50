"""Student versions are generated from the instructor's: the .py stub by grader.release, the notebook by
nbgrader (tests/test_nbgrader_e2e.py regenerates it); the notebook's autograder cells are the CLI's rubric."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from traitlets.config.loader import PyFileConfigLoader

from grader import checks
from grader.integrations import release
from grader.processes.sandbox import Limits

from conftest import ROOT

A = "dist_primitives"
SOLUTION_PY = ROOT / "solutions" / A / f"{A}.py"
SOLUTION_NB = ROOT / "solutions" / A / f"{A}.ipynb"
RELEASE_PY = ROOT / "assignments" / A / f"{A}.py"
RELEASE_NB = ROOT / "assignments" / A / f"{A}.ipynb"


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def nbgrader_meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def run_worker_of(text: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "run_worker")


def test_py_stub_is_generated_from_the_solution():
    assert RELEASE_PY.read_text(encoding="utf-8") == release.clear_solutions(SOLUTION_PY.read_text(encoding="utf-8"))


def test_nbgrader_config_uses_the_release_stub_and_folders():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert config.ClearSolutions.code_stub == {"python": release.STUB}
    assert config.CourseDirectory.source_directory == "solutions"
    assert config.CourseDirectory.release_directory == "assignments"
    assert Path(config.CourseDirectory.root) == ROOT
    assert "*.py" in config.CourseDirectory.ignore  # never copy the .py solution into the release
    # a hanging run_worker is ended by the grader (at most two rounds of runs) before nbgrader's cell timeout
    assert config.Execute.timeout >= 2 * Limits.wall_s + 20
    assert config.OverwriteCells.add_missing_cells is True


def test_notebook_autograder_cells_are_the_cli_rubric():
    graded = {nbgrader_meta(c)["grade_id"]: c for c in cells(SOLUTION_NB) if nbgrader_meta(c).get("grade")}
    assert list(graded) == ["test_" + spec.id.replace(".", "_") for spec in checks.CHECKS]
    for spec in checks.CHECKS:
        cell = graded["test_" + spec.id.replace(".", "_")]
        text = source(cell)
        assert nbgrader_meta(cell)["points"] == spec.points and nbgrader_meta(cell)["locked"]
        assert f'nbcheck.check("{spec.id}")' in text
        if spec.hidden:  # the whole check sits inside the hidden block
            inside = text.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            assert f'nbcheck.check("{spec.id}")' in inside
            assert "nbcheck" not in text.split("### BEGIN HIDDEN TESTS")[0]
        else:
            assert "HIDDEN TESTS" not in text
    points = [nbgrader_meta(c)["points"] for c in graded.values()]
    assert sum(points) == checks.TOTAL == 100
    assert sum(spec.points for spec in checks.CHECKS if spec.kind == "static") == 10


def test_solution_cell_is_the_py_solution():
    solution = [c for c in cells(SOLUTION_NB) if nbgrader_meta(c).get("solution")]
    assert len(solution) == 1 and nbgrader_meta(solution[0])["grade_id"] == "run_worker"
    assert ast.dump(run_worker_of(source(solution[0]))) == ast.dump(run_worker_of(SOLUTION_PY.read_text(encoding="utf-8")))


def test_release_notebook_has_no_answer_and_no_hidden_test():
    text = RELEASE_NB.read_text(encoding="utf-8")
    for secret in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "dist.all_reduce(gradient",
                   'check(\\"ws3', 'check(\\"ws4'):
        assert secret not in text, secret
    answer = next(c for c in cells(RELEASE_NB) if nbgrader_meta(c).get("grade_id") == "run_worker")
    # the notebook's stub is the .py stub: the same function, the same NotImplementedError
    assert ast.dump(run_worker_of(source(answer))) == ast.dump(run_worker_of(RELEASE_PY.read_text(encoding="utf-8")))
    assert release.STUB in source(answer)


def test_markdown_explains_in_chinese_and_english():
    locked_md = [source(c) for c in cells(SOLUTION_NB) if c["cell_type"] == "markdown" and nbgrader_meta(c).get("locked")]
    assert len(locked_md) >= 4
    for text in locked_md:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in text)           # Chinese
        assert sum(ch.isascii() and ch.isalpha() for ch in text) > 100   # with English
