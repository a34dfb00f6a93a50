"""End to end with the real tools, in ONE temporary course folder holding every exercise: nbgrader
generate_assignment (all of them at once, each equal to the committed release), a real kernel (nbclient)
running the release notebook, and one autograde over every assignment: each exercise's solution and its
untouched release, a few partial answers, and a class of four that comes through zip_collect; then
generate_feedback and export once.

Every nbgrader command runs as a child process in its own session, killed by process group when it
overruns, with this checkout on PYTHONPATH. nbclient's kernel is ipykernel's own `python3` (jupyter_client
turns its `python` into sys.executable); nbgrader's are the same ipykernel, forked from one warm interpreter
of the venv (warm_kernels: tests/tools/warm_kernel.py), so that the autograde's 15 notebooks import torch
once between them.
"""
from __future__ import annotations

import ast
import contextlib
import csv
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from grader.exercise import registry
from grader.model import CheckResult, Outcome
from grader.feedback.render import title

from conftest import FIXTURES, NO_IRI_FORMAT, PY, ROOT, stretched

import warm_kernel   # tests/tools/warm_kernel.py (conftest puts tests/tools on sys.path)

A = "dist_primitives"
CLASS = FIXTURES / "notebooks" / "class"
RELEASE = ROOT / "assignments" / A / f"{A}.ipynb"
EXPECTED = {"alice": 100.0, "bob": 70.0, "carol": 10.0, "dave": 55.0}
HIDDEN_IDS = ("ws3.all_reduce", "ws3.all_gather", "ws4.all_reduce", "ws4.all_gather")
CHECKS = registry.get(A).checks


def course_env(course: Path) -> dict:
    jupyter = course / ".jupyter-home"
    for sub in ("config", "data", "runtime", "ipython"):
        (jupyter / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        PATH=str(Path(PY).parent) + os.pathsep + env.get("PATH", ""),  # nbgrader runs `alembic` from PATH
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        JUPYTER_CONFIG_DIR=str(jupyter / "config"), JUPYTER_DATA_DIR=str(jupyter / "data"),
        JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"), IPYTHONDIR=str(jupyter / "ipython"),
        GRADER_LANG="en",   # Python's warnings shown, as a TA sees them: autograde and feedback must have none
        GRADER_TIME_LIMIT="5",   # carol's hang ends sooner (still well inside nbgrader's cell timeout)
    )
    if (course / WARM).is_dir():   # nbgrader's kernels: forks of one warm interpreter (warm_kernels below)
        env["JUPYTER_PATH"] = str(course / WARM) + (os.pathsep + env["JUPYTER_PATH"] if env.get("JUPYTER_PATH") else "")
    return env


WARM = ".warm-kernels"


@contextlib.contextmanager
def warm_kernels(course: Path) -> Iterator[None]:
    """While it lasts, every kernel an nbgrader command of this course starts is a fork of one interpreter
    that has imported torch, ipykernel and nbcheck (tests/tools/warm_kernel.py): 15 notebooks' `import
    torch` once instead of 15 times. The kernel is still ipykernel's, started with jupyter_client's arguments
    in the notebook's folder. The nbclient test below runs ipykernel's own `python3` (it does not use
    JUPYTER_PATH): a real kernel start stays covered."""
    sock = Path(tempfile.mkdtemp(prefix="wk-")) / "s"   # a short path: AF_UNIX allows 108 bytes
    server = subprocess.Popen([PY, warm_kernel.__file__, "--serve", str(sock)], cwd=course, env=course_env(course),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([server.stdout], [], [], 60)
        assert ready and server.stdout.readline().strip() == "ready", "the warm kernel server did not start"
        warm_kernel.write_kernelspec(course / WARM, PY, str(sock))
        yield
    finally:
        shutil.rmtree(course / WARM, ignore_errors=True)
        try:
            os.killpg(server.pid, signal.SIGKILL)   # the server and any kernel still running (its process group)
        except ProcessLookupError:
            pass
        server.wait()
        server.stdout.close()
        shutil.rmtree(sock.parent, ignore_errors=True)


def nbgrader(course: Path, *args: str, timeout: float = 120) -> str:
    main = f"{NO_IRI_FORMAT}; from nbgrader.apps.nbgraderapp import main; main()"   # `python -m nbgrader`
    proc = subprocess.Popen([PY, "-c", main, *args], cwd=course, env=course_env(course),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=stretched(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, out
    return out


EXERCISES = sorted(p.parent.name for p in (ROOT / "solutions").glob("*/exercise.py"))


def release_in(root: Path, *exercises: str) -> dict[str, Path]:
    """A course folder at `root`: this repository's nbgrader_config.py and the exercises' solutions/
    folders, then ONE generate_assignment over them all. {exercise: generated notebook}, each checked equal
    to the committed release."""
    root.mkdir(exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", root)
    for exercise in exercises:
        shutil.copytree(ROOT / "solutions" / exercise, root / "solutions" / exercise)
    nbgrader(root, "generate_assignment", exercises[0] if len(exercises) == 1 else "*")
    generated = {}
    for exercise in exercises:
        generated[exercise] = root / "assignments" / exercise / f"{exercise}.ipynb"
        committed = ROOT / "assignments" / exercise / f"{exercise}.ipynb"
        assert json.loads(generated[exercise].read_text(encoding="utf-8")) == json.loads(committed.read_text(encoding="utf-8")), exercise
    return generated


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("course")
    release_in(root, *EXERCISES)
    with warm_kernels(root):
        yield root


def cell(nb, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_answer(answer: Path):
    """The release notebook with a student's run_worker typed into the solution cell."""
    nb = nbformat.read(RELEASE, as_version=4)
    cell(nb, "run_worker").source = answer.read_text(encoding="utf-8")
    return nb


def hidden_title(check_id: str) -> str:
    checks = registry.get(A).checks
    spec = next(s for s in checks if s.id == check_id)
    return title(CheckResult(spec, Outcome.WRONG), "en", checks)


def text_of(c) -> str:
    parts = []
    for out in c.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts += [out.ename, out.evalue, *out.traceback]
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_committed_release_is_what_generate_assignment_makes(course):
    # each generated notebook is checked equal to the committed one by release_in; the .py solution next
    # to the source notebook is not copied into the release (answer included)
    for exercise in EXERCISES:
        released = course / "assignments" / exercise
        assert sorted(p.name for p in released.iterdir()) == [f"{exercise}.ipynb"], exercise


@pytest.mark.timeout(180)
def test_release_notebook_checks_run_worker_with_two_real_ranks(course, tmp_path):
    nb = with_answer(CLASS / "alice.py")
    at = nb.cells.index(cell(nb, "run_worker")) + 1
    # the seed's own harness in the same kernel, for contrast: its children cannot unpickle a function
    # defined in a cell (they write why on the kernel's fd 2, which this cell reads back)
    nb.cells.insert(at, nbformat.v4.new_code_cell(SPAWN_PROBE))
    env = course_env(course)
    with pytest.MonkeyPatch.context() as mp:
        for key in ("PATH", "PYTHONPATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                    "IPYTHONDIR", "GRADER_LANG"):
            mp.setenv(key, env[key])
        from nbclient import NotebookClient   # here, not at collection (every xdist worker collects this file)
        NotebookClient(nb, timeout=int(stretched(90)), kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()

    spawn = text_of(nb.cells[at])
    assert "mp.spawn failed" in spawn and "Can't get attribute 'run_worker'" in spawn
    report = text_of(next(c for c in nb.cells if "nbcheck.report(" in c.source))
    assert "Score: 40 / 40" in report, report
    assert "Gradient averaged with all_reduce (2 ranks)" in report and "Communication cost (2 ranks, gloo)" in report
    assert "rank 0 all_reduce" in report and "rank 1 all_reduce" in report and "rank 2" not in report
    assert "Can't get attribute" not in report and "Traceback" not in report
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader.grade_id for c in tests] == [
        "test_static_all_reduce", "test_static_all_gather", "test_ws2_all_reduce", "test_ws2_all_gather",
        "test_hidden_all_reduce_1", "test_hidden_all_gather_1", "test_hidden_all_reduce_2", "test_hidden_all_gather_2"]
    for c in tests[:4]:  # visible: each prints its verdict, nothing on stderr, no error (ipykernel may send
        # one print in two stream messages when its flush timer fires between the text and the newline)
        assert c.outputs and all(o.output_type == "stream" and o.name == "stdout" for o in c.outputs), c.outputs
        assert "".join(o.text for o in c.outputs).startswith("[PASS]")
    for c in tests[4:]:  # hidden tests are not in the release: these cells run nothing
        assert c.outputs == [] and "nbcheck" not in c.source


SPAWN_PROBE = """
import os, tempfile
import torch.multiprocessing as mp
log, saved = tempfile.TemporaryFile(), os.dup(2)
os.dup2(log.fileno(), 2)
try:
    mp.spawn(run_worker, args=(2,), nprocs=2, join=True)
except Exception as err:
    failure = type(err).__name__
finally:
    os.dup2(saved, 2)
log.seek(0)
print("mp.spawn failed:", failure, log.read().decode(errors="replace")[-400:])
"""


def changed_checksums(log: str) -> dict[tuple[str, str], set[str]]:
    """(student, assignment) -> the cells autograde reported with a changed checksum (it sanitizes one
    notebook at a time)."""
    found: dict[tuple[str, str], set[str]] = {}
    where = None
    for line in log.splitlines():
        if "Sanitizing " in line:
            where = tuple(Path(line.split("Sanitizing ", 1)[1].strip()).parts[-3:-1])
        elif "Attribute 'checksum' for cell " in line:
            found.setdefault(where, set()).add(line.split("for cell ", 1)[1].split()[0])
    return found


def tamper(nb) -> None:
    """Dave's tricks against his failing all_reduce cells: edit one (and claim 1000 points), blank one,
    delete one."""
    edited = cell(nb, "test_ws2_all_reduce")
    edited.source = 'print("all good")'
    edited.metadata.nbgrader["points"] = 1000
    cell(nb, "test_hidden_all_reduce_1").source = "pass"
    nb.cells.remove(cell(nb, "test_hidden_all_reduce_2"))


def answer_cell(nb):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))


def solution_answer(exercise: str) -> str:
    """The solution notebook's answer cell as a student would type it (nbgrader's markers taken out)."""
    nb = nbformat.read(ROOT / "solutions" / exercise / f"{exercise}.ipynb", as_version=4)
    return "\n".join(line for line in answer_cell(nb).source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def same_code(a: str, b: str) -> bool:
    """The same statements, docstrings and comments aside."""
    def code(source):
        tree = ast.parse(source)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:]
        return ast.dump(tree)
    return code(a) == code(b)


@pytest.fixture(scope="module")
def autograded(course):
    """ONE autograde over every assignment of the course, then generate_feedback and export: (course,
    autograde's log, {(student, assignment): {grade cell: (score, max_score)}}, {(student, assignment):
    export's row})."""
    archive = course / "downloaded" / A / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "lms-download.zip", "w") as zf:
        for student in EXPECTED:
            nb = with_answer(CLASS / f"{student}.py")
            if student == "dave":
                tamper(nb)
            zf.writestr(f"{student}_{A}.ipynb", nbformat.writes(nb))
    nbgrader(course, "zip_collect", A)
    for student in EXPECTED:
        assert (course / "submitted" / student / A / f"{A}.ipynb").is_file()

    # alice's answer is dist_primitives' solution: she stands for it
    answers = {**{("sol", ex): solution_answer(ex) for ex in EXERCISES if ex != A}, **{("stub", ex): None for ex in EXERCISES}}
    for (student, ex), answer in answers.items():
        nb = nbformat.read(ROOT / "assignments" / ex / f"{ex}.ipynb", as_version=4)
        if answer is not None:
            answer_cell(nb).source = answer
        dest = course / "submitted" / student / ex / f"{ex}.ipynb"
        dest.parent.mkdir(parents=True)
        nbformat.write(nb, dest)

    log = nbgrader(course, "autograde", "*", timeout=560)
    feedback_log = nbgrader(course, "generate_feedback", "*")
    # no warning a TA would have to learn to ignore: every one autograde prints is dave's tampering (the
    # kernel's "running over TCP without encryption", SQLAlchemy's "not in session" and generate_feedback's
    # "display_data_priority not recognized" are answered at their source: docs/nbgrader.md)
    warned, where = {}, None
    for line in log.splitlines():
        if "Sanitizing " in line:
            where = tuple(Path(line.split("Sanitizing ", 1)[1].strip()).parts[-3:-1])
        elif re.search(r"warn", line, re.I):
            warned.setdefault(where, []).append(line)
    assert set(warned) <= {("dave", A)}, warned
    tampering = ("Attribute 'points' for cell ", "Attribute 'checksum' for cell ", "Missing grade cell ")
    assert all(any(t in line for t in tampering) for line in warned.get(("dave", A), [])), warned
    assert not re.search(r"warn", feedback_log, re.I), feedback_log
    nbgrader(course, "export")
    with open(course / "grades.csv", newline="") as fh:
        rows = {(row["student_id"], row["assignment"]): row for row in csv.DictReader(fh)}
    cells = {}
    from nbgrader.api import Gradebook   # here, not at collection
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student, ex in [*answers, *((s, A) for s in EXPECTED)]:
            sub = gb.find_submission_notebook(ex, ex, student)
            cells[student, ex] = {g.name: (g.score, g.max_score) for g in sub.grades}
    return course, log, cells, rows


@pytest.mark.timeout(600)
@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_solution_100_and_every_untouched_release_0_through_autograde(autograded, exercise):
    course, log, cells, rows = autograded
    sol = "alice" if exercise == A else "sol"
    assert same_code(solution_answer(A), (CLASS / "alice.py").read_text(encoding="utf-8"))
    assert {s: float(rows[s, exercise]["score"]) for s in (sol, "stub")} == {sol: 100.0, "stub": 0.0}
    assert {float(rows[s, exercise]["max_score"]) for s in (sol, "stub")} == {100.0}
    # every grade cell (one per check, hidden ones included) in full for the solution, none for the stub
    assert len(cells[sol, exercise]) == len(registry.get(exercise).checks)
    assert {score == top for score, top in cells[sol, exercise].values()} == {True}
    assert {score for score, _ in cells["stub", exercise].values()} == {0}
    # an untouched release (its hidden cells included) and an honest answer: autograde warns of nothing
    assert ("stub", exercise) not in changed_checksums(log) and (sol, exercise) not in changed_checksums(log)


@pytest.mark.timeout(600)
def test_class_through_zip_collect_autograde_feedback_export(autograded):
    course, log, cells, rows = autograded
    # An untouched test cell is restored without a tampering alarm, hidden ones included (nbgrader alone
    # warns "Attribute 'checksum' ... has changed!" for every hidden cell: grader/integrations/nbhidden.py);
    # dave's edited and blanked cells are still reported, and nobody else's in any assignment.
    assert changed_checksums(log) == {("dave", A): {"test_ws2_all_reduce", "test_hidden_all_reduce_1"}}, log
    assert {s: float(rows[s, A]["score"]) for s in EXPECTED} == EXPECTED
    assert {float(rows[s, A]["max_score"]) for s in EXPECTED} == {100.0}
    dave, bob, carol = cells["dave", A], cells["bob", A], cells["carol", A]
    # tampering gained nothing: the edited, blanked and deleted cells were restored, run and scored 0 of 15
    for name in ("test_ws2_all_reduce", "test_hidden_all_reduce_1", "test_hidden_all_reduce_2"):
        assert dave[name] == (0, 15), (name, dave)
    assert dave["test_ws2_all_gather"] == (15, 15)
    assert sum(score for score, _ in bob.values()) == 70
    assert bob["test_hidden_all_gather_1"] == (0, 15) and bob["test_ws2_all_gather"] == (15, 15)
    assert carol["test_static_all_reduce"] == (5, 5) and carol["test_ws2_all_reduce"] == (0, 15)

    graded = {s: nbformat.read(course / "autograded" / s / A / f"{A}.ipynb", as_version=4) for s in EXPECTED}
    restored = graded["dave"]
    assert cell(restored, "test_ws2_all_reduce").source == cell(nbformat.read(RELEASE, as_version=4), "test_ws2_all_reduce").source
    assert cell(restored, "test_ws2_all_reduce").metadata.nbgrader["points"] == 15
    # the hang was ended by the grader's own time limit, with its verdict, not by nbgrader's cell timeout
    hang = text_of(cell(graded["carol"], "test_ws2_all_reduce"))
    assert "Time limit" in hang and "CellTimeoutError" not in hang
    for nb in graded.values():
        assert all("CellTimeoutError" not in text_of(c) for c in nb.cells)

    for student in EXPECTED:
        html = (course / "feedback" / student / A / f"{A}.html").read_text(encoding="utf-8")
        assert "HIDDEN TESTS" not in html
        for check_id in HIDDEN_IDS:
            assert check_id not in html, (student, check_id)
        # no expected value of a hidden check: the shapes at 3 and 4 ranks, the expected averages
        for leak in ("(384,)", "(512,)", "expected shape (384", "values 2.5", "values 2.0"):
            assert leak not in html, (student, leak)
    bob_html = (course / "feedback" / "bob" / A / f"{A}.html").read_text(encoding="utf-8")
    assert hidden_title("ws3.all_gather") in bob_html and hidden_title("ws4.all_gather") in bob_html
    assert "Your code raised an exception in this test" in bob_html
    dave_html = (course / "feedback" / "dave" / A / f"{A}.html").read_text(encoding="utf-8")
    assert "world_size times the mean" in dave_html  # the visible check explains the mistake


@pytest.mark.timeout(600)
def test_reports_bench_and_feedback_of_the_solutions_through_autograde(autograded):
    """The report cell, the ring's inline bench cell and the feedback of the solution notebooks: the ring's
    bound and the ZeRO lines in the student's own run; no hidden check's id in any feedback."""
    course, log, cells, rows = autograded

    def autograded_nb(ex):
        sol = "alice" if ex == A else "sol"
        return nbformat.read(course / "autograded" / sol / ex / f"{ex}.ipynb", as_version=4)

    def report_of(ex):
        return text_of(next(c for c in autograded_nb(ex).cells if f'nbcheck.report("{ex}")' in c.source))

    ring = report_of("ring_allreduce")
    assert "Score: 40 / 40" in ring and "ring bound (2 ranks, S = 1031 elements)" in ring, ring
    bench = next(c for c in autograded_nb("ring_allreduce").cells if 'bench.notebook("ring_allreduce")' in c.source)
    assert "Not timed while autograding" in text_of(bench)   # a class's autograde spends nothing on timing
    zero = report_of("zero_sharded_step")
    assert "ZeRO" in zero and "1030" in zero, zero
    for ex in EXERCISES:
        assert re.search(r"Score: (\d+) / \1\b", report_of(ex)), (ex, report_of(ex))   # every visible point
        for student in ("alice" if ex == A else "sol", "stub"):
            html = (course / "feedback" / student / ex / f"{ex}.html").read_text(encoding="utf-8")
            assert "HIDDEN TESTS" not in html
            leaked = [c.id for c in registry.get(ex).checks if c.hidden and c.id in html]
            assert leaked == [], (ex, student)   # no hidden check's id (nor its code)
