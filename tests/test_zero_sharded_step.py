"""The third exercise, zero_sharded_step (solutions/zero_sharded_step/), through its entry points: `check`
(Chinese) on a mistake, `gradescope-zip` with run_autograder (which runs `grade`) on the solution, and the
report's ZeRO lines, which are the chapter's claim in the student's own run (nbgrader:
tests/test_nbgrader_e2e.py, one course for every exercise).

Its fixtures (tests/fixtures/zero_sharded_step/{honest,mistakes,cheats}/: honest styles score 100, each mistake
gets its exact outcomes and its cause, each cheat scores 0 on the checks it fakes, as each sidecar says) are
graded by tests/test_fixtures.py.
"""
from __future__ import annotations

import ast
import re
import shutil
import zipfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

import expectations
from conftest import FIXTURES, PY, ROOT, run_cli, stretched
from exercise_suite import expected_grade_id
from grader.exercise import registry
from grader.feedback.messages import CATALOG, render
from grader.integrations import release

EX = "zero_sharded_step"
FIX = FIXTURES / EX
SOLUTION_PY = ROOT / "solutions" / EX / f"{EX}.py"
SOLUTION_NB = ROOT / "solutions" / EX / f"{EX}.ipynb"
RELEASE_PY = ROOT / "assignments" / EX / f"{EX}.py"
RELEASE_NB = ROOT / "assignments" / EX / f"{EX}.ipynb"
WS = (2, 3, 4)
EXERCISE = registry.get(EX)   # loading it adds its messages to the catalog under its name


HONEST = sorted(p.stem for p in (FIX / "honest").glob("*.py"))


# -- the fixtures (graded by tests/test_fixtures.py, each against its sidecar) -----------------------------

def test_honest_styles_use_the_names_torch_recommends_and_the_older_ones():
    """The names torch 2.13 recommends, and the older ones it warns about (h01): the fixtures hold both, so
    both are graded (and earn full marks: their folder's grading)."""
    texts = [(FIX / "honest" / f"{name}.py").read_text(encoding="utf-8") for name in HONEST]
    assert any("dist.reduce_scatter_single(" in t and "dist.all_gather_single(" in t for t in texts)
    assert any("dist.reduce_scatter_tensor(" in t and "dist.all_gather_into_tensor(" in t for t in texts)


# -- entry points ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_list_names_the_exercise():
    proc = run_cli("list", "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    assert ("  zero_sharded_step: A ZeRO-style sharded optimizer step: reduce-scatter and all-gather "
            "(100 points; visible world sizes 2)") in proc.stdout
    assert "dist_primitives" in proc.stdout


@pytest.mark.timeout(120)
def test_check_in_chinese_names_the_cause_and_infers_the_exercise(tmp_path):
    """`check` on a file named after the exercise (no --exercise): the visible checks only, in Chinese."""
    path = tmp_path / f"{EX}.py"
    shutil.copy(FIX / "mistakes" / "m04_full_momentum.py", path)
    proc = run_cli("check", str(path), "--lang", "zh")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(f"== {EX}.py: 得分：30 / 40 ==")
    assert render(f"{EX}.cause.full_momentum", {}, "zh") in proc.stdout
    assert "  进程 1：保存 1030 个动量元素，也就是全部 1030 个：优化器状态没有分片。" in proc.stdout
    assert not re.search(r"隐藏测试 \d", proc.stdout) and "Traceback" not in proc.stdout + proc.stderr   # no hidden check shown


@pytest.mark.timeout(180)
def test_gradescope_zip_for_the_exercise_grades_a_submission(tmp_path):
    """gradescope-zip --exercise: the exercise's definition in the zip, run_autograder runs `grade` on the
    submission folder; the report's ZeRO lines come with it."""
    proc = run_cli("gradescope-zip", "--exercise", EX, "--out", str(tmp_path / "a.zip"), "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert f"solutions/{EX}/exercise.py" in zf.namelist()
        assert "solutions/dist_primitives/exercise.py" not in zf.namelist()
        assert f"--exercise {EX}".encode() in zf.read("run_autograder")
        zf.extractall(root / "source")
    (root / "submission").mkdir()
    shutil.copy(SOLUTION_PY, root / "submission" / "answer.py")
    from test_gradescope import run_autograder
    results = run_autograder(root, PY)
    assert results["score"] == 100 and len(results["tests"]) == 11
    assert results["extra_data"]["exercise"] == EX


# -- the report: the chapter's claim, in the student's own run ----------------------------------

def test_teach_lines_are_the_chapters_numbers():
    """Per rank and step: reduce-scatter and all-gather each (N-1)/N x S, together one all-reduce's
    2(N-1)/N x S; the momentum elements held beside the unsharded count (a synthetic run, no processes)."""
    from grader.switch import Call
    from grader.records import RankRecord, RankResult, RunOutcome, RunRequest
    from grader.verify.teach import exercise_notes
    exercise = registry.get(EX)

    def call(rank, seq, op, numel):
        c = Call(rank=rank, seq=seq, method="-", op=op, group=(0, 1, 2, 3), sends=True, receives=True,
                 inputs=[{"dtype": "torch.float32", "numel": numel if op != "all_gather" else 258}],
                 completed=True, ok=True,
                 delivered=[{"dtype": "torch.float32", "numel": 258 if op == "reduce_scatter" else numel}])
        return c

    ranks = []
    for rank in range(4):
        rec = RankRecord(rank)
        rec.calls = [call(rank, 0, "reduce_scatter", 1032), call(rank, 1, "all_gather", 1032),
                     call(rank, 2, "reduce_scatter", 1032), call(rank, 3, "all_gather", 1032)]
        shape = [258] if rank else [1030]
        rec.result = RankResult(how="return", values={"momentum": {"kind": "tensor", "shape": shape}})
        ranks.append(rec)
    notes = exercise_notes(exercise, RunOutcome(RunRequest(world_size=4, source="", filename="s.py"), ranks))
    lines = [render(n.key, n.params, "en") for n in notes]
    assert lines[0].startswith("ZeRO's account (4 ranks)")
    # S = 1032 float32 = 4128 bytes: (4-1)/4 x 4128 = 3096 each, 6192 together = 2(4-1)/4 x 4128
    assert lines[1] == ("  rank 0, each step: reduce_scatter sends about 3096 bytes and all_gather about 3096, 6192 in all "
                        "((N-1)/N x S each, S = 4128 bytes); one all_reduce of the same gradient sends about 6192 (2(N-1)/N x S).")
    assert lines[2] == "  rank 0: holds 1030 momentum elements, all 1030 of them: the optimizer state is not sharded."
    assert lines[4] == ("  rank 1: holds 258 momentum elements (optimizer state) where an unsharded optimizer holds 1030: "
                        "about 1/4.")
    assert render(notes[4].key, notes[4].params, "zh") == "  进程 1：保存 258 个动量元素（优化器状态），不分片时是 1030 个：约 1/4。"


# -- the exercise's table of mistakes, on synthetic values (no processes) ------------------------------

def _named(quantity: str, values, ws: int, rank: int = 1, right: dict | None = None) -> list[str]:
    """The causes the engine names from the exercise's mistakes for a wrong value (verify/mistakes.py)."""
    from grader.verify import mistakes
    from grader.verify.observe import Value
    values = np.asarray(values, float)
    value = Value("tensor", True, "Tensor", "torch.float32", [int(values.size)], values)
    notes = mistakes.named(EXERCISE, EXERCISE.quantity(quantity), value, ws, rank, [], None, True,
                           "torch.float32", right or {})
    return [n.key.split(".", 1)[1] for n in notes]


def test_the_mistakes_table_names_each_mistake_from_the_values_alone():
    from grader.exercise.reference import outcome
    step = EXERCISE.step
    for ws in WS:
        s = -(-1030 // ws)

        def both(**knobs):
            values = outcome(step, ws, **knobs)[1]
            return values["params"], values["momentum"]
        right_params, right_momentum = both()
        assert _named("params", right_params * 1.5, ws) == []           # wrong in no way the table knows
        assert _named("params", both(divide=False)[0], ws) == ["cause.not_divided"]
        assert _named("momentum", both(divide=False)[1], ws) == ["cause.not_divided"]
        assert _named("params", both(carry=False)[0], ws) == ["cause.momentum_reset"]
        assert _named("params", both(carry=False)[0], ws, right={"momentum": True}) == ["cause.update_with_gradient"]
        assert _named("params", both(own_gradient=True)[0], ws) == ["cause.local_update"]
        for knobs in ({"first": True}, {"base": 1}, {"base": -1}):
            assert _named("params", both(**knobs)[0], ws) == ["cause.wrong_shard"], knobs
        assert _named("params", both(steps=1)[0], ws) == ["cause.one_step"]
        assert _named("momentum", both(steps=1)[1], ws) == ["cause.one_step"]
        assert _named("params", both(sign=-1.0)[0], ws) == ["cause.sign_flipped"]
        assert _named("momentum", -right_momentum, ws) == ["cause.sign_flipped"]
        assert _named("params", both(reuse=True)[0], ws) == ["cause.gradient_reused"]
        assert _named("momentum", both(reuse=True)[1], ws) == ["cause.gradient_reused"]
        assert _named("momentum", np.zeros(1030), ws) == ["cause.full_momentum"]
        if 1030 % ws:
            assert _named("momentum", np.zeros(1030 // ws), ws) == ["cause.padding"]
            assert _named("params", np.zeros(s * ws), ws) == ["cause.padding_kept"]
            stale_tail = right_params.copy()
            stale_tail[-1] += 1.0
            assert _named("params", stale_tail, ws) == ["cause.padding"]
        garbage = outcome(step, ws)[ws - 1]["momentum"].copy()   # the last rank's shard holds the padding
        garbage[-1] = 7.0
        assert _named("momentum", garbage, ws, rank=ws - 1) == (["cause.padding_not_zero"] if 1030 % ws else [])


# -- the first exercise pays nothing for this one ------------------------------------------------------

def test_the_first_exercise_path_is_unchanged():
    """What bench measures (dist_primitives) costs what it did: its submissions are still told apart from
    this exercise's without running anything, no teaching hook or preload is added to them, the runs
    planned for them perturb the same operations, and loading every exercise imports no torch (the
    supervisor never does)."""
    import subprocess
    from grader import plan
    from grader.submission import static
    probe = "import sys; from grader.exercise import registry; registry.available(); print('torch' in sys.modules)"
    assert subprocess.run([PY, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=stretched(60)).stdout == "False\n"
    first = registry.available()["dist_primitives"]
    assert not first.teach and not first.mistakes and first.diagnose is None
    assert plan.perturbed_ops(first) == ("all_reduce", "all_gather")
    bench_src = (ROOT / "bench" / "bench.py").read_text(encoding="utf-8")
    templates = ast.literal_eval(next(node.value for node in ast.parse(bench_src).body
                                      if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TEMPLATES"))
    for template in templates:
        source = template.format(i=0)
        assert registry.infer(Path("student.py"), source).name == "dist_primitives"
        assert "torch._dynamo" not in static.inspect_source(ast.parse(source)).torch_modules
    for path in sorted((FIXTURES / "dist_primitives" / "honest").glob("*.py")):
        assert registry.infer(path, path.read_text(encoding="utf-8")).name == "dist_primitives", path
    for path in sorted(FIX.glob("*/[hmc]*.py")):   # the red team's attacks (a*) need not look like an answer
        assert registry.infer(Path("answer.py"), path.read_text(encoding="utf-8")).name == EX, path


# -- student versions ----------------------------------------------------------------------------------

def _cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def test_student_versions_are_generated_from_the_solution():
    assert RELEASE_PY.read_text(encoding="utf-8") == release.clear_solutions(SOLUTION_PY.read_text(encoding="utf-8"))
    stub = RELEASE_PY.read_text(encoding="utf-8")   # the names torch 2.13 recommends (FutureWarning on the others)
    assert "TODO 1: dist.reduce_scatter_single(...)" in stub and "TODO 3: dist.all_gather_single(...)" in stub
    assert [c.title[1] for c in EXERCISE.checks if c.kind == "static"] == [
        "Static: run_worker calls dist.reduce_scatter_single", "Static: run_worker calls dist.all_gather_single"]
    released = RELEASE_NB.read_text(encoding="utf-8")
    for secret in ("BEGIN SOLUTION", "HIDDEN TESTS", "reduce_scatter_single(grad_shard, grad, op", 'check(\\"ws3', 'check(\\"ws4'):
        assert secret not in released, secret


def test_notebook_cells_are_the_py_solution_and_the_rubric():
    exercise = registry.get(EX)
    cells = _cells(SOLUTION_NB)
    by_id = {_grade_id(c): c for c in cells if _grade_id(c)}
    solution = ast.parse(SOLUTION_PY.read_text(encoding="utf-8"))
    ours = {n.name: ast.dump(n) for n in solution.body if isinstance(n, ast.FunctionDef)}
    for grade_id, names in (("run_worker", ("run_worker",)), ("given", ("initial_parameters", "local_gradient"))):
        cell = ast.parse(by_id[grade_id].source)
        theirs = {n.name: ast.dump(n) for n in cell.body if isinstance(n, ast.FunctionDef)}
        assert {n: theirs[n] for n in names} == {n: ours[n] for n in names}
    assert by_id["run_worker"].metadata.nbgrader["solution"] and by_id["given"].metadata.nbgrader["locked"]
    graded = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [_grade_id(c) for c in graded] == [expected_grade_id(exercise, c) for c in exercise.checks]
    for cell, check in zip(graded, exercise.checks):
        assert cell.metadata.nbgrader["points"] == check.points
        call = f'nbcheck.check("{check.id}", "{EX}")'
        assert call in cell.source and (("### BEGIN HIDDEN TESTS" in cell.source) == check.hidden)
        if check.hidden:
            assert "nbcheck" not in cell.source.split("### BEGIN HIDDEN TESTS")[0]
    assert sum(c.points for c in exercise.checks) == 100
    assert any(f'nbcheck.report("{EX}")' in c.source for c in cells)
    for cell in cells:
        if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("locked"):
            assert re.search(r"[\u4e00-\u9fff]", cell.source) and sum(ch.isascii() and ch.isalpha() for ch in cell.source) > 100


def test_exercise_messages_are_bilingual_and_hidden_safe():
    exercise = registry.get(EX)
    from grader.feedback.render import hidden_safe
    for key, (zh, en) in exercise.messages.items():
        assert CATALOG[f"{EX}.{key}"] == (zh, en)
        assert re.search(r"[\u4e00-\u9fff]", zh) and en.isascii(), key
        assert set(re.findall(r"\{(\w+)", zh)) == set(re.findall(r"\{(\w+)", en)), key
        if key.startswith("cause."):   # hidden checks show them: names only, no numbers
            assert hidden_safe(f"{EX}.{key}"), key
            assert not re.search(r"\d", re.sub("|".join(expectations.defaults(EXERCISE)["hidden_may_show"]), "", zh + en)), key
