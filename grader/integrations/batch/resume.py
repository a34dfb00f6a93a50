"""What a batch keeps between runs: a results file per student, reused while the submission, the language and
the rubric are the same; one batch per output folder; what a killed batch left, swept.

Only the parent writes files, each atomically (feedback.results.write_atomic), so a SIGKILL at any moment
leaves whole files only.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from ...feedback.results import write_atomic
from ...submission import load as loader
from ..gradebook import printable
from .discover import Student, results_name, timeline_name


def content_hash(path: Path) -> str:
    """sha256 of what would be graded: the entry file's name inside the student's folder and its bytes, or,
    when it cannot be read, the problem (so a file that becomes readable, or smaller, is graded again)."""
    submission = loader.load(path)
    entry = submission.path.relative_to(path).as_posix() if path.is_dir() and submission.path != path else ""
    problem = json.dumps(list(submission.problem), sort_keys=True, default=str) if submission.problem else ""
    return hashlib.sha256(os.fsencode(entry) + b"\0" + submission.raw + b"\0" + problem.encode()).hexdigest()


def read_results(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def up_to_date_in_every_language(out: Path, student: Student, data: dict | None, langs: list[str], exercise) -> bool:
    """OUT's results and each other language's (OUT/<lang>/) are of this submission, language and rubric."""
    name = results_name(student.name)
    return up_to_date(data, student.digest, langs[0], exercise) and all(
        up_to_date(read_results(out / lang / name), student.digest, lang, exercise) for lang in langs[1:])


def up_to_date(data: dict | None, digest: str, lang: str, exercise) -> bool:
    extra = (data or {}).get("extra_data") or {}
    batch = extra.get("batch") or {}
    return (batch.get("content_hash") == digest and batch.get("lang") == lang and batch.get("rubric") == exercise.rubric_key()
            and not extra.get("grader_error") and isinstance(extra.get("scores"), dict))


WORKER_LOGS = ".grader-workers-"   # OUT/<prefix>XXXX: the workers' logs while a batch runs


def sweep_temporaries(out: Path) -> int:
    """Remove what a killed batch leaves (the lock is held: no batch is using them): write_atomic's
    temporaries, killed between their write and their rename, and the workers' logs."""
    count = 0
    for tmp in out.glob(".*.tmp"):
        try:
            tmp.unlink()
            count += 1
        except FileNotFoundError:
            pass
    for logs in out.glob(WORKER_LOGS + "*"):
        if logs.is_dir() and not logs.is_symlink():
            shutil.rmtree(logs, ignore_errors=True)
            count += 1
    return count


def lock(out: Path):
    """One batch per output folder; the lock dies with the process, so a SIGKILL never leaves it held."""
    handle = open(out / ".batch.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def save_in_every_language(out: Path, student: Student, langs: list[str], exercise, make) -> dict:
    """`make(lang)`'s results for each of `langs`, saved: the first's in OUT (and returned), the others' in
    OUT/<lang>/ (--also-lang)."""
    first, *others = (make(lang) for lang in langs)
    return save(out, student, first, langs[0], exercise, also=dict(zip(langs[1:], others)))


def save(out: Path, student: Student, data: dict, lang: str, exercise, timeline: str | None = None,
         also: dict[str, dict] | None = None) -> dict:
    """Write OUT/<results_name>, and beside it the page of the student's visible run (OUT/<name>.timeline.html,
    named in the results: the class report links it); a failure to write is recorded in the row (the
    gradebook still lists it). `also`: the same grading's results in other languages (--also-lang), each
    written to OUT/<lang>/<results_name>."""
    for other, other_data in (also or {}).items():
        try:
            (out / other).mkdir(exist_ok=True)
        except OSError:
            pass
        save(out / other, student, other_data, other, exercise)
    extra = data.setdefault("extra_data", {})
    extra["batch"] = {"content_hash": student.digest, "lang": lang, "rubric": exercise.rubric_key(), "entry": printable(student.path.name)}
    page = out / timeline_name(student.name)
    try:
        if timeline is not None:
            write_atomic(page, timeline)
            extra["batch"]["timeline"] = page.name
        else:   # graded again without a run to draw: no page of an earlier grading stays beside it
            page.unlink(missing_ok=True)
    except OSError as err:
        extra["write_error"] = f"{type(err).__name__}: {err}"
    try:
        write_atomic(out / results_name(student.name), json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    except (OSError, ValueError) as err:
        extra["write_error"] = f"{type(err).__name__}: {err}"
    return data
