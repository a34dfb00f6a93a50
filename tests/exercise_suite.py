"""What every exercise's test file does through the real entry points (tests/test_grad_accum_no_sync.py,
tests/test_fp16_allreduce.py, tests/test_hierarchical_allreduce.py): the solution and the stub through `grade`,
`batch` and the notebook check (nbgrader: tests/test_nbgrader_e2e.py, one course for every exercise); the
notebook against the solution, the messages. Not collected by pytest (no test_ prefix); the assertions live
in the callers. (Every exercise's fixtures: tests/test_fixtures.py.)
"""
from __future__ import annotations

import ast
import csv
import re
import shutil
from pathlib import Path

import nbformat

from conftest import ROOT, grade_cli, run_cli

CJK = re.compile(r"[\u4e00-\u9fff]")


def paths(ex: str) -> dict[str, Path]:
    return {"solution_py": ROOT / "solutions" / ex / f"{ex}.py", "solution_nb": ROOT / "solutions" / ex / f"{ex}.ipynb",
            "release_py": ROOT / "assignments" / ex / f"{ex}.py", "release_nb": ROOT / "assignments" / ex / f"{ex}.ipynb"}


def solution_and_stub(ex: str, tmp_path: Path) -> dict:
    """The solution .py and the stub .py through `grade` (English), and together through one `batch`."""
    p = paths(ex)
    graded = {kind: grade_cli(p[f"{kind}_py"], tmp_path, "--exercise", ex)[0] for kind in ("solution", "release")}
    folder = tmp_path / "pair"
    folder.mkdir()
    shutil.copy(p["solution_py"], folder / "solution.py")
    shutil.copy(p["release_py"], folder / "stub.py")
    proc = run_cli("batch", str(folder), "--out", str(tmp_path / "out"), "--exercise", ex, "--jobs", "2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "grades.csv", newline="", encoding="utf-8") as fh:
        totals = {row["student"]: row["total"] for row in csv.DictReader(fh)}
    return {"grade": {k: v["score"] for k, v in graded.items()}, "batch": totals,
            "grade_results": graded}


def notebook_checks(ex: str) -> dict:
    """`check` on the solution notebook and on the released one (the visible checks, as nbcheck shows them)."""
    p = paths(ex)
    return {kind: run_cli("check", str(p[f"{kind}_nb"]), "--exercise", ex, "--lang", "en", timeout=200)
            for kind in ("solution", "release")}


def worker_source(path: Path) -> str:
    """The run_worker function of a .py file, as a notebook's answer cell holds it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return ast.unparse(next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_worker"))


def diagnose(exercise, quantity: str, values, ws: int, rank: int, calls=(), outcome: str = "wrong",
             dtype: str = "torch.float32", error=None) -> list[str]:
    """The causes the exercise's table of mistakes names for synthetic values (no processes): `calls` as the
    switch would record them (a SimpleNamespace needs only what the conditions read: op, sends, reduce,
    sent_values; it completed)."""
    import numpy as np
    from types import SimpleNamespace
    from grader.verify import mistakes
    from grader.verify.observe import Value
    data = np.asarray(values, dtype=float).reshape(-1)
    value = Value("tensor", True, "Tensor", dtype, [int(data.size)], data)
    recorded = [SimpleNamespace(**{"completed": True, "ok": True, "reduce": None, "sends": False, "inputs": [],
                                   "outputs": [], "sent_values": lambda: [], **vars(c)}) for c in calls]
    notes = mistakes.named(exercise, exercise.quantity(quantity), value, ws, rank, recorded, error,
                           outcome == "wrong", exercise.quantity(quantity).tolerance or "torch.float32", {})
    return [n.key.split(".", 1)[1] for n in notes]


def expected_grade_id(exercise, check) -> str:
    """A visible check's grade id names it (test_ws2_grad); a hidden one's names its order among the hidden
    world sizes, never the size (test_hidden_grad_1): grade ids are in the released notebook."""
    if not check.hidden:
        return "test_" + check.id.replace(".", "_")
    sizes = sorted({c.world_size for c in exercise.checks if c.hidden})
    return f"test_hidden_{check.id.split('.', 1)[1]}_{sizes.index(check.world_size) + 1}"


def notebook_matches_solution(ex: str, given_names: tuple[str, ...]) -> None:
    """The notebook's given cell and answer cell hold the .py solution's functions; its grade cells are the
    exercise's checks in order, with their points; hidden ones inside the hidden block."""
    from grader.exercise import registry
    exercise = registry.get(ex)
    p = paths(ex)
    cells = nbformat.read(p["solution_nb"], as_version=4).cells
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in cells if c.metadata.get("nbgrader")}
    ours = {n.name: ast.dump(n) for n in ast.parse(p["solution_py"].read_text(encoding="utf-8")).body
            if isinstance(n, ast.FunctionDef)}
    for grade_id, names in (("run_worker", ("run_worker",)), ("given", given_names)):
        theirs = {n.name: ast.dump(n) for n in ast.parse(by_id[grade_id].source).body if isinstance(n, ast.FunctionDef)}
        assert {n: theirs[n] for n in names} == {n: ours[n] for n in names}, grade_id
    assert by_id["run_worker"].metadata.nbgrader["solution"] and by_id["given"].metadata.nbgrader["locked"]
    graded = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader.grade_id for c in graded] == [expected_grade_id(exercise, c) for c in exercise.checks]
    for cell, check in zip(graded, exercise.checks):
        assert cell.metadata.nbgrader["points"] == check.points
        assert f'nbcheck.check("{check.id}", "{ex}")' in cell.source
        assert ("### BEGIN HIDDEN TESTS" in cell.source) == check.hidden
    assert sum(c.points for c in exercise.checks) == 100
    assert any(f'nbcheck.report("{ex}")' in c.source for c in cells)
    released = p["release_nb"].read_text(encoding="utf-8")
    for secret in ("BEGIN SOLUTION", "HIDDEN TESTS", *(f'check(\\"{c.id}\\"' for c in exercise.checks if c.hidden)):
        assert secret not in released, secret


def messages_are_bilingual_and_hidden_safe(ex: str, allowed: str = "") -> None:
    from grader.exercise import registry
    from grader.feedback.messages import CATALOG
    from grader.feedback.render import hidden_safe
    exercise = registry.get(ex)
    for key, (zh, en) in exercise.messages.items():
        assert CATALOG[f"{ex}.{key}"] == (zh, en)
        assert CJK.search(zh) and en.isascii(), key
        assert set(re.findall(r"\{(\w+)", zh)) == set(re.findall(r"\{(\w+)", en)), key
        if key.startswith("cause."):   # hidden checks show them: names only, no numbers
            assert hidden_safe(f"{ex}.{key}"), key
            assert zh.startswith("原因：") and en.startswith("Cause: "), key
            text = re.sub(allowed, "", zh + en) if allowed else zh + en
            assert not re.search(r"\d", text), key
