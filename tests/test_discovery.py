"""Red team of issue 10, input half: no class entry can stop a batch, a student's own error is the student's
verdict, the gradebook and the TA's terminal cannot be forged, notebooks graded as Jupyter runs them.

Unit tests call discovery, loading and parsing directly on entries made in tmp_path (a FIFO, symbolic links,
hard links, a sparse 200 GB file and 1100-deep folders cannot live in git: tests/tools/deep.py makes the
deep ones without recursion); two end-to-end tests run the real `batch` and `grade` commands over them.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from grader.feedback.results import write_atomic
from grader.integrations import batch
from grader.exercise import registry
from grader.submission import load, notebook, static

from deep import make_deep, remove_deep   # tests/tools/deep.py (conftest puts tests/tools on sys.path)

HONEST = FIXTURES / "batch" / "honest.py"
LONG = "a" * 237 + ".py"                            # 240 bytes: legal, but name + ".json" + a temp suffix is not
FORMULA = '=HYPERLINK("http:&&evil","x").py'
FORGED = "mallory\nforged  100  pass\x1b[2K.py"      # a newline and an ANSI "erase line"


@pytest.fixture
def deep_dir(tmp_path):
    made = []

    def make(base: Path, depth: int, **kw) -> Path:
        made.append(base)
        return make_deep(base, depth, **kw)
    yield make
    for base in made:
        remove_deep(base)


# -- discovery ------------------------------------------------------------------------------------
def test_discovery_never_follows_links_grades_one_file_once_and_says_why(tmp_path):
    cls, outside = tmp_path / "cls", tmp_path / "outside"
    cls.mkdir()
    outside.mkdir()
    shutil.copy(HONEST, cls / "alice.py")
    (outside / "secret.py").write_text("x = 1\n")
    os.symlink("alice.py", cls / "copycat.py")                  # a classmate's file
    os.symlink(outside / "secret.py", cls / "escape.py")        # a file outside the class
    os.symlink(outside, cls / "away")                            # a folder outside the class
    os.symlink("loop2", cls / "loop1")
    os.symlink("loop1", cls / "loop2")                           # a loop
    os.symlink("alice.py", cls / "readme.txt")                   # not a student
    os.link(cls / "alice.py", cls / "twin.py")                   # the same file under a second name
    os.mkfifo(cls / "pipe.py")
    (cls / "__init__.py").write_text("")
    (cls / "__pycache__").mkdir()
    (cls / ".hidden.py").write_text("")
    students, skipped = batch.discover(cls, tmp_path / "out")
    problems = {s.name: s.problem[0] if s.problem else None for s in students}
    assert problems == {"alice": None, "away": "load.symlink", "copycat": "load.symlink", "escape": "load.symlink",
                        "loop1": "load.symlink", "loop2": "load.symlink", "pipe": "load.not_a_file"}
    text = "\n".join(skipped)
    for why in ("twin.py (the same file as alice.py", "__init__.py (starts with __", "__pycache__ (starts with __",
                ".hidden.py (hidden)", "readme.txt (a symbolic link: not followed)"):
        assert why in text, text


def test_results_names_are_safe_for_any_legal_name(tmp_path):
    names = ["alice", "张三", "a" * 255, "-rf", "=1+1", "x\ny", "\x1b[2K", "a/b".replace("/", "\u2215"),
             os.fsdecode(b"\xff\xfe")]
    files = {batch.results_name(n) for n in names}
    assert len(files) == len(names) and batch.results_name("alice") == "alice.json"
    for name in files:
        assert len(name.encode()) <= batch.MAX_RESULT_NAME and name.isprintable() and not name.startswith((".", "-"))
        write_atomic(tmp_path / name, "{}")                       # temporary names fit too
    assert not list(tmp_path.glob(".*.tmp"))
    write_atomic(tmp_path / ("b" * 250 + ".json"), "{}")          # write_atomic on its own: any legal name
    assert (tmp_path / ("b" * 250 + ".json")).read_text() == "{}"


def test_gradebook_cells_cannot_be_formulas_and_the_terminal_sees_escapes():
    rows = [(n, {"score": 0, "extra_data": {"grader_error": "x"}})
            for n in ("=cmd|' /C calc'!A0", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "ok")]
    parsed = list(csv.reader(io.StringIO(batch.gradebook(rows, registry.get("dist_primitives")), newline="")))
    assert sorted(row[0] for row in parsed[1:]) == sorted(["'=cmd|' /C calc'!A0", "'+1", "'-1", "'@SUM(A1)", "'\\tx",
                                                           "'\\rx", "ok"])
    text = batch.summary([("mallory\nforged 100 pass\x1b[2K\u202e", {"score": 0})], "en", registry.get("dist_primitives"))
    assert "\x1b" not in text and "\u202e" not in text and "mallory\\nforged" in text
    assert not any(line.startswith("forged") for line in text.splitlines())


# -- loading: sizes before reading, bounded walks, no special files --------------------------------
def test_a_sparse_200_gb_file_is_refused_before_reading(tmp_path):
    huge = tmp_path / "huge.py"
    with open(huge, "wb") as f:
        f.truncate(200 << 30)
    sub = load.load(huge)
    assert sub.problem.key == "load.too_large" and sub.problem.params["size"] == 200 << 30 and sub.raw == b""
    assert batch.content_hash(huge)  # hashing does not read it either


def test_special_and_unreadable_files_are_problems(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe.py")
    assert load.load(tmp_path / "pipe.py").problem == ("load.not_a_file", {"file": "pipe.py", "kind": "FIFO"})
    (tmp_path / "locked.py").write_text("x = 1\n")
    real_open = os.open

    def refuse(path, *args, **kwargs):  # as root nothing is unreadable: the kernel's answer is simulated
        if str(path).endswith("locked.py"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", refuse)
    assert load.load(tmp_path / "locked.py").problem == ("load.unreadable", {"file": "locked.py", "error": "Permission denied"})


def test_a_student_folder_1100_levels_deep_is_too_deep_not_a_crash(tmp_path, deep_dir):
    student = tmp_path / "carol"
    student.mkdir()
    deep_dir(student, 1100, file="answer.py", data=HONEST.read_bytes())
    sub = load.load(student)
    assert sub.problem.key == "load.too_deep"
    assert batch.content_hash(student)


def test_a_folder_submission_ignores_links_and_checkpoints(tmp_path):
    student = tmp_path / "dave"
    (student / ".ipynb_checkpoints").mkdir(parents=True)
    (student / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text("{}")
    os.symlink(HONEST, student / "link.py")
    assert load.find_entry(student) is None
    shutil.copy(HONEST, student / "z.py")
    assert load.find_entry(student) == student / "z.py"


# -- parsing: the student's verdict ---------------------------------------------------------------
@pytest.mark.parametrize("source, key", [
    ("x = " + "a." * 5000 + "b\n", "static.too_complex"),
    ("x = " + "-" * 5000 + "1\n", "static.too_complex"),
    ("x = " + "(" * 300 + ")" * 300 + "\n", "static.too_complex"),
    ("x = " + "-" * 300 + "1\n", "static.too_complex"),                 # parses, but deeper than later steps take
    ("def f(:\n", "static.syntax_error"),
    ("a\x00b\n", "static.syntax_error"),
])
def test_parse_source_turns_every_parser_failure_into_a_problem(source, key):
    tree, problem = static.parse_source(source, "s.py")
    assert tree is None and problem.key == key


def test_parse_source_memory_error_is_the_students(monkeypatch):
    def boom(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(static.ast, "parse", boom)
    assert static.parse_source("x = 1", "s.py")[1].key == "static.parse_memory"


def test_a_notebook_with_x1c_and_a_5000_deep_chain_loads_and_is_the_students_error():
    sub = load.load(FIXTURES / "batch" / "x1c_deep_chain.ipynb")
    assert sub.problem is None
    assert static.parse_source(sub.source, sub.filename)[1].key == "static.too_complex"


# -- notebooks: cell magics -------------------------------------------------------------------------
def test_python_cell_magics_are_graded_and_others_are_noted():
    sub = load.load(FIXTURES / "notebooks" / "cell_magics.ipynb")
    assert sub.problem is None
    compile(sub.source, sub.filename, "exec")
    lines = sub.source.splitlines()
    assert lines[0] == "# %%time" and "import torch.distributed as dist" in lines
    assert "    dist.all_gather(gathered, local_feature)" in lines          # %time STMT runs STMT
    assert "    pass  # !echo rank {rank} done" in lines
    assert "echo this cell is shell" not in sub.source and "return None" not in sub.source
    assert [(n.key, n.params) for n in sub.notes] == [
        ("note.magic_ignored", {"magic": "bash", "cell": 3}), ("note.magic_local", {"magic": "timeit", "cell": 6})]   # cells as shown
    assert sub.files == {"notes.txt": "def run_worker(rank, world_size):\n    return None\n"}   # written, as Jupyter does


def test_without_ipython_the_fallback_keeps_lines_and_says_what_it_did_not_run(monkeypatch):
    monkeypatch.setattr(notebook, "_TRANSFORMER", [None])
    sub = load.load(FIXTURES / "notebooks" / "cell_magics.ipynb")
    compile(sub.source, sub.filename, "exec")
    assert sub.source.splitlines()[11] == "    pass  # %time dist.all_gather(gathered, local_feature)"
    assert ("note.magics_unavailable", {"line": 12, "magic": "time", "cell": 4}) in [(n.key, n.params) for n in sub.notes]
    source, _ = notebook._fallback("x = !ls\ntorch?\n%ls \\\n -l\ny = 1\n")
    assert source == "pass  # x = !ls\npass  # torch?\npass  # %ls \\\npass  # -l\ny = 1\n"


# -- the real commands ----------------------------------------------------------------------------
@pytest.mark.timeout(150)
def test_batch_survives_every_hostile_entry_and_writes_the_gradebook(tmp_path, deep_dir):
    cls = tmp_path / "cls"
    cls.mkdir()
    for name in ("alice.py", LONG, FORMULA, FORGED):
        shutil.copy(HONEST, cls / name)
    shutil.copy(FIXTURES / "batch" / "x1c_deep_chain.ipynb", cls / "x1c.ipynb")
    shutil.copy(FIXTURES / "bad" / "b05_deep_expression.py", cls / "deep_expr.py")
    shutil.copy(HONEST, cls / "crasher.py")
    with open(cls / "huge.py", "wb") as f:
        f.truncate(200 << 30)
    (cls / "deep").mkdir()
    deep_dir(cls / "deep", 1100, file="x.py", data=HONEST.read_bytes())
    os.symlink("loop2", cls / "loop1")
    os.symlink("loop1", cls / "loop2")
    os.symlink("alice.py", cls / "copycat.py")
    os.link(cls / "alice.py", cls / "twin.py")
    os.mkfifo(cls / "pipe.py")
    (cls / "__init__.py").write_text("")
    out = tmp_path / "out"
    proc = run_cli("batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "en", "--tmp-mb", "16",
                   env={batch.FAULT_ENV: "crasher"}, template=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    verdicts = {name: (row["total"], row["verdict"]) for name, row in rows.items()}
    assert verdicts == {
        "alice": ("100", "pass"), LONG[:-3]: ("100", "pass"), "'" + FORMULA[:-3]: ("100", "pass"),
        batch.printable(FORGED[:-3]): ("100", "pass"),
        "x1c": ("0", "syntax_error"), "deep_expr": ("0", "syntax_error"), "crasher": ("0", "grader_failed"),
        "huge": ("0", "too_large"), "deep": ("0", "too_deep"), "loop1": ("0", "symlink"), "loop2": ("0", "symlink"),
        "copycat": ("0", "symlink"), "pipe": ("0", "not_a_file")}
    assert json.loads((out / batch.results_name(LONG[:-3])).read_text())["score"] == 100
    for line in proc.stdout.splitlines():                      # the forged name cannot forge a row
        assert not line.startswith("forged") and "\x1b" not in line
    assert "mallory\\nforged" in proc.stdout
    for why in ("twin.py (the same file as alice.py", "__init__.py (starts with __"):
        assert why in proc.stderr
    x1c = json.loads((out / "x1c.json").read_text())
    assert x1c["extra_data"]["grader_error"] is None and "nested too deep" in x1c["output"]
    # a rerun reuses every grade, regrades the grader's failure (the crasher, now without the fault) and
    # writes the rows of the four entries that cannot be graded again
    again = run_cli("batch", str(cls), "--out", str(out), "--jobs", "1", "--lang", "en")
    assert again.returncode == 0 and "Graded 5, reused 8" in again.stdout, again.stdout[-1500:]


@pytest.mark.timeout(60)
def test_grade_and_gradescope_upload_of_a_very_deep_file(tmp_path, deep_dir):
    """A .py 1100 folders down: given directly, it is graded; inside an uploaded folder (Gradescope's
    /autograder/submission), it is the student's "too deep", never "the autograder failed"."""
    upload = tmp_path / "submission"
    upload.mkdir()
    bottom = deep_dir(upload, 1100, file="answer.py", data=HONEST.read_bytes())
    direct = tmp_path / "direct.json"
    run_cli("grade", str(bottom / "answer.py"), "--results", str(direct), "--lang", "en")
    assert json.loads(direct.read_text())["score"] == 100
    folder = tmp_path / "folder.json"
    proc = run_cli("grade", str(upload), "--results", str(folder), "--lang", "en")
    data = json.loads(folder.read_text())
    assert proc.returncode == 0 and data["extra_data"]["grader_error"] is None, proc.stderr
    assert data["score"] == 0 and "nested too deep (more than 32 levels)" in data["output"]


@pytest.mark.timeout(60)
def test_cell_magic_notebook_grades_full_marks(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(FIXTURES / "notebooks" / "cell_magics.ipynb"), "--results", str(results), "--lang", "en")
    assert json.loads(results.read_text())["score"] == 100, proc.stdout


@pytest.mark.timeout(120)
def test_a_folder_with_a_helper_module_grades_the_file_that_defines_the_entry(tmp_path):
    """carol/ holds a_helpers.py (first by name) and dist_primitives.py (defines run_worker, imports the
    helper): the solution is the file that defines the entry, and the helper travels with it as a module."""
    folder = Path(__file__).parent / "fixtures" / "folders" / "carol"
    assert load.find_entry(folder) == folder / "dist_primitives.py"
    submission = load.load(folder)
    assert submission.problem is None and set(submission.files) == {"a_helpers.py"}
    from conftest import run_cli
    proc = run_cli("grade", str(folder), "--exercise", "dist_primitives", "--lang", "en")
    assert "dist_primitives.py: Score: 100 / 100" in proc.stdout, proc.stdout + proc.stderr
