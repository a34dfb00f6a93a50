"""`python -m grader batch`: isolation, determinism, worker death, SIGKILL and resume (real commands)."""
from __future__ import annotations

import csv
import json
import re
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, PY, ROOT, run_cli
from grader.integrations import batch
from grader.exercise import registry

BATCH = FIXTURES / "batch"


def make_class(folder: Path, students: dict[str, str]) -> Path:
    """students: name -> fixture (a file under tests/fixtures/batch, or the notebook folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, fixture in students.items():
        src = BATCH / fixture
        if src.is_dir():
            shutil.copytree(src, folder / name)
        else:
            shutil.copy(src, folder / f"{name}{src.suffix}")
    return folder


def read_csv(path: Path) -> dict[str, dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def no_temporaries(out: Path) -> bool:
    """Nothing of a batch's own is left in OUT: write_atomic's temporaries, the workers' logs."""
    return not list(out.glob(".*.tmp")) and not list(out.glob(batch.WORKER_LOGS + "*"))


# -- pure functions -------------------------------------------------------------------------------
def test_discover_names_students_and_skips_the_rest(tmp_path):
    cls = make_class(tmp_path / "cls", {"alice": "honest.py", "bob": "notebook"})
    (cls / "alice.ipynb").write_text("{}")          # same student name as alice.py
    (cls / "notes.txt").write_text("not a submission")
    (cls / ".hidden.py").write_text("")
    students, skipped = batch.discover(cls, tmp_path / "out")
    assert [s.name for s in students] == ["alice", "bob"]
    assert any("alice.ipynb" in s for s in skipped) and any("notes.txt" in s for s in skipped)


def test_content_hash_follows_the_entry_file(tmp_path):
    cls = make_class(tmp_path / "cls", {"bob": "notebook"})
    before = batch.content_hash(cls / "bob")
    assert batch.content_hash(cls / "bob") == before
    nb = cls / "bob" / "assignment.ipynb"
    nb.write_text(nb.read_text() + " ")
    assert batch.content_hash(cls / "bob") != before


def test_verdict_is_the_first_failing_outcome_in_rubric_order():
    exercise = registry.get("dist_primitives")
    outcomes = {c.id: "pass" for c in exercise.checks}
    assert batch.verdict({"extra_data": {"outcomes": outcomes}}, exercise) == "pass"
    outcomes["ws4.all_gather"], outcomes["ws3.all_reduce"] = "timeout", "wrong"
    assert batch.verdict({"extra_data": {"outcomes": outcomes}}, exercise) == "wrong"
    assert batch.verdict({"extra_data": {"grader_error": "boom"}}, exercise) == "grader_failed"


# -- the real command -----------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_gradebook_is_the_same_whatever_jobs(tmp_path):
    cls = make_class(tmp_path / "cls", {"alice": "honest.py", "bob": "summed.py", "carol": "ws2.py",
                                        "dave": "cheater.py", "erin": "broken.py", "frank": "notebook"})
    one = run_cli("batch", str(cls), "--out", str(tmp_path / "j1"), "--jobs", "1", "--lang", "en")
    two = run_cli("batch", str(cls), "--out", str(tmp_path / "j2"), "--jobs", "2", "--lang", "en")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert (tmp_path / "j1" / "grades.csv").read_bytes() == (tmp_path / "j2" / "grades.csv").read_bytes()
    rows = read_csv(tmp_path / "j2" / "grades.csv")
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin", "frank"]
    assert {n: r["verdict"] for n, r in rows.items()} == {
        "alice": "pass", "bob": "wrong", "carol": rows["carol"]["verdict"], "dave": "not_collective",
        "erin": "syntax_error", "frank": "pass"}
    assert rows["carol"]["ws2.all_reduce"] == "15" and rows["carol"]["ws3.all_reduce"] == "0"
    assert rows["alice"]["total"] == "100" and rows["erin"]["total"] == "0"
    # each OUT/<student>.json is grade's results.json, plus the content hash
    alice = json.loads((tmp_path / "j2" / "alice.json").read_text())
    assert alice["score"] == 100 and {"tests", "output", "execution_time"} <= set(alice)
    assert alice["extra_data"]["batch"]["content_hash"] == batch.content_hash(cls / "alice.py")
    assert "pass: 2" in two.stdout and "Totals:" in two.stdout and "median" in two.stdout


@pytest.mark.timeout(120)
def test_hostile_students_change_nobody_elses_grade(tmp_path):
    cls = make_class(tmp_path / "cls", {"alice": "honest.py", "crash": "crash.py", "flood": "flood.py",
                                        "hang": "hang.py", "killer": "killparent.py", "zoe": "honest.py"})
    proc = run_cli("batch", str(cls), "--out", str(tmp_path / "out"), "--jobs", "2", "--time-limit", "3", "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(tmp_path / "out" / "grades.csv")
    assert set(rows) == {"alice", "crash", "flood", "hang", "killer", "zoe"}
    assert rows["alice"]["total"] == rows["zoe"]["total"] == "100"
    assert rows["hang"]["verdict"] == "timeout"
    for name in ("crash", "flood", "hang", "killer"):
        assert rows[name]["total"] == "10" and rows[name]["verdict"] not in ("pass", "grader_failed")


@pytest.mark.timeout(120)
def test_a_dying_worker_costs_only_its_student(tmp_path):
    cls = make_class(tmp_path / "cls", {"alice": "honest.py", "bob": "honest.py", "carol": "honest.py"})
    out = tmp_path / "out"
    proc = run_cli("batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "en", env={batch.FAULT_ENV: "bob"},
                   template=True)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out / "grades.csv")
    assert rows["alice"]["total"] == rows["carol"]["total"] == "100"
    assert (rows["bob"]["total"], rows["bob"]["verdict"]) == ("0", "grader_failed")
    error = json.loads((out / "bob.json").read_text())["extra_data"]["grader_error"]
    assert "attempt 1" in error and "attempt 2" in error and "exit code 3" in error
    # a grader failure is not a grade: the next run grades bob again, and only bob
    again = run_cli("batch", str(cls), "--out", str(out), "--lang", "en")
    assert "Graded 1, reused 2" in again.stdout
    assert read_csv(out / "grades.csv")["bob"]["total"] == "100"


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.timeout(150)
def test_sigkill_mid_batch_then_resume_grades_only_what_is_missing(tmp_path):
    names = [f"s{i:02d}" for i in range(10)]
    cls = make_class(tmp_path / "cls", {n: "slow.py" for n in names})
    out = tmp_path / "out"
    proc = subprocess.Popen([PY, "-m", "grader", "batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "en"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while len(list(out.glob("s*.json"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
            workers.update(_children(proc.pid))
            time.sleep(0.02)
        workers.update(_children(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)          # the batch only: its workers must follow by themselves
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    done = sorted(p.stem for p in out.glob("s*.json"))
    assert 3 <= len(done) < len(names), "the batch was not killed mid-way"
    for path in out.glob("s*.json"):
        json.loads(path.read_text())               # whole files only
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = [w for w in workers if Path(f"/proc/{w}").exists() and "grader" in Path(f"/proc/{w}/cmdline").read_text(errors="replace")]
    for w in leftover:
        os.kill(w, signal.SIGKILL)
    assert not leftover, "workers outlived the killed batch"

    assert list(out.glob(batch.WORKER_LOGS + "*")), "the killed batch left no worker logs: what does resume sweep?"
    kept = {n: (out / f"{n}.json").stat() for n in done}
    changed = done[0]
    with open(cls / f"{changed}.py", "a") as f:
        f.write("\n# edited after the first run\n")
    (out / f".{done[1]}.json.half.tmp").write_text('{"score": ')   # as if killed inside write_atomic
    again = run_cli("batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "en")
    assert again.returncode == 0, again.stderr
    assert f"Graded {len(names) - len(done) + 1}, reused {len(done) - 1}" in again.stdout
    for n, st in kept.items():
        now = (out / f"{n}.json").stat()
        assert (now.st_ino == st.st_ino and now.st_mtime_ns == st.st_mtime_ns) == (n != changed), n
    assert no_temporaries(out)
    rows = read_csv(out / "grades.csv")
    assert list(rows) == names and all(r["total"] == "100" for r in rows.values())


@pytest.mark.timeout(120)
def test_also_lang_reports_one_grading_in_both_languages_and_resumes_each(tmp_path):
    """--also-lang: OUT/<lang>/<student>.json holds the same grading in the other language (the same scores and
    outcomes, its own words); a rerun reuses a student only while both files are current."""
    cls = make_class(tmp_path / "cls", {"good": "honest.py", "stack": "summed.py"})
    (cls / "linked.py").symlink_to(cls / "good.py")   # graded as a problem, in both languages too
    out = tmp_path / "out"
    proc = run_cli("batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "zh", "--also-lang", "en",
                   "--exercise", "dist_primitives")
    assert proc.returncode == 0, proc.stderr
    linked = [json.loads((folder / "linked.json").read_text(encoding="utf-8")) for folder in (out, out / "en")]
    assert [d["score"] for d in linked] == [0, 0] and [d["extra_data"]["batch"]["lang"] for d in linked] == ["zh", "en"]
    for name in ("good", "stack"):
        zh, en = (json.loads((folder / f"{name}.json").read_text(encoding="utf-8")) for folder in (out, out / "en"))
        assert zh["score"] == en["score"] and zh["extra_data"]["outcomes"] == en["extra_data"]["outcomes"]
        assert (zh["extra_data"]["batch"]["lang"], en["extra_data"]["batch"]["lang"]) == ("zh", "en")
        assert re.search(r"[\u4e00-\u9fff]", zh["tests"][0]["output"]) and not re.search(r"[\u4e00-\u9fff]", en["tests"][0]["output"])
    assert json.loads((out / "stack.json").read_text())["score"] < 100
    assert not (out / "en" / "grades.csv").exists() and not list((out / "en").glob("*.html"))
    (out / "en" / "stack.json").unlink()
    again = run_cli("batch", str(cls), "--out", str(out), "--jobs", "2", "--lang", "zh", "--also-lang", "en",
                    "--exercise", "dist_primitives")
    # stack graded again (its English results gone), good reused, the link written again (never graded)
    assert "本次评分 2 份，沿用已有结果 1 份" in again.stdout, again.stdout   # the batch speaks --lang
    assert (out / "en" / "stack.json").exists()


@pytest.mark.timeout(90)
def test_the_summary_table_aligns_wide_and_long_names(tmp_path):
    """Names in Chinese (two columns a character), with a combining accent, or too long for the column: the
    totals line up on the terminal, and a long name is cut with an ellipsis."""
    from grader.integrations.gradebook import width
    long = "a_very_long_student_name_" * 4
    names = ["bob", "张三", "李四四五", "Zoe\u0301", long]
    cls = make_class(tmp_path / "cls", {name: "empty.py" for name in names})
    proc = run_cli("batch", str(cls), "--out", str(tmp_path / "out"), "--exercise", "dist_primitives", "--jobs", "1",
                   "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("student "))
    table = lines[start:start + 1 + len(names)]
    before_verdict = {width(line.rsplit("  ", 1)[0]) for line in table}      # name, total: the same columns
    assert len(before_verdict) == 1, table
    assert all(line.rsplit("  ", 1)[0].endswith("0") for line in table[1:])
    shown = [line for line in table if line.startswith("a_very")]
    assert shown and long not in "\n".join(table) and "..." in shown[0]
    assert width(shown[0].split(" ")[0]) == batch.NAME_COLUMNS
