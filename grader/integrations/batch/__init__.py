"""Grade a whole class: one results file per student, a gradebook, resumable after any kill.

    python -m grader batch DIR --out OUT [--jobs N] [--lang zh|en]

Each entry of DIR is one student (discover.py). Writes OUT/<student>.json (the results.json of `grade`, plus
`extra_data.batch` with the submission's content hash) and OUT/grades.csv.

Processes: this parent never imports torch and never runs student code. It forks N workers (worker.py), each
owning one Runner (one zygote), and hands each a student at a time (schedule.py). Only the parent writes
files, each atomically, so a SIGKILL at any moment leaves whole files only; a rerun skips every student whose
results hold the same content hash (and language and rubric) and sweeps stale temporary files (resume.py).

No entry can stop the class: discovery reads the folder with lstat only, sizes are checked before reading
(load.py), any failure while hashing, grading or writing one student becomes that student's row, and
grades.csv is always written. Gradebook cells cannot start a spreadsheet formula; names printed on the
terminal have their control characters escaped (output.py).

The rooms: discover.py (students and their results files' names), resume.py (the reuse of results, the lock,
the sweep), worker.py (a worker and the parent's view of it), schedule.py (students over workers), output.py
(the progress line and the summary); this module is the verb.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from ...exercise import registry
from ...feedback.messages import default_lang, render
from ...feedback.results import write_atomic
from ...processes import launch
from ...submission import load as loader
from .. import classreport
from ..gradebook import gradebook, printable, verdict
from .discover import MAX_RESULT_NAME, SAFE_NAME, Student, discover, results_name
from .output import NAME_COLUMNS, Progress, summary
from .resume import (WORKER_LOGS, content_hash, lock, read_results, save, save_in_every_language, sweep_temporaries,
                     up_to_date, up_to_date_in_every_language)
from .schedule import MAX_ATTEMPTS, entry_failed, grade_all, problem_results
from .worker import FAULT_ENV, ROOT, Worker, worker_main

# what `batch.<name>` has always offered its callers (the tests, scripts), whichever room defines it now
__all__ = ["FAULT_ENV", "MAX_ATTEMPTS", "MAX_RESULT_NAME", "NAME_COLUMNS", "Progress", "ROOT", "SAFE_NAME", "Student",
           "WORKER_LOGS", "Worker", "class_exercise", "content_hash", "discover", "entry_failed", "grade_all", "lock",
           "printable", "problem_results", "read_results", "register", "results_name", "run", "save", "summary",
           "save_in_every_language", "sweep_temporaries", "up_to_date", "up_to_date_in_every_language", "verdict",
           "worker_main"]


def run(args) -> int:
    folder, out = Path(args.folder), Path(args.out)
    if not folder.is_dir():
        print(f"not a folder: {folder}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    held = lock(out)
    if held is None:
        print(f"another batch is writing {out}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with held:
        swept = sweep_temporaries(out)
        try:
            students, skipped = discover(folder, out)
        except SystemExit as err:
            print(err, file=sys.stderr)
            return 2
        for why in skipped:
            print(f"skipped: {why}", file=sys.stderr)
        try:
            exercise = args.exercise_spec = class_exercise(folder, students, args)
        except registry.ExerciseError as err:
            print(render(err.key, err.params, args.lang), file=sys.stderr)
            return 2
        todo, rows, graded = [], [], {}
        for student in students:
            if student.problem is not None:  # a symbolic link, a FIFO ...: its row says why, nothing is read
                graded[student.name] = save_in_every_language(
                    out, student, args.langs, exercise, lambda lang: problem_results(student, *student.problem, lang, exercise))
                continue
            try:
                student.digest = content_hash(student.path)
                data = read_results(out / results_name(student.name))
            except Exception:
                error = traceback.format_exc()
                graded[student.name] = save_in_every_language(
                    out, student, args.langs, exercise, lambda lang: entry_failed(student, error, lang, exercise))
                continue
            if up_to_date_in_every_language(out, student, data, args.langs, exercise):
                rows.append((student.name, data))
            else:
                todo.append(student)
        reused = len(rows)
        progress = Progress(len(todo))
        try:
            if todo:
                launch.start_template()   # one import torch for every worker's zygote (started early by __main__)
                grade_all(todo, args, out, progress, graded)
        except Exception:  # a fault of the batch itself: the students it reached keep their rows
            print(traceback.format_exc(), file=sys.stderr)
        finally:
            launch.stop_template()
            for student in todo:
                if student.name not in graded:
                    graded[student.name] = entry_failed(student, "the batch stopped before grading this entry",
                                                        args.lang, exercise)
            rows += list(graded.items())
            write_atomic(out / "grades.csv", gradebook(rows, exercise))
            report = classreport.build(rows, exercise, args.lang)   # what the class got wrong
            causes_csv, report_html = out / "causes.csv", out / "report.html"
            write_atomic(causes_csv, classreport.causes_csv(report))
            # here, not at the top: Jinja2's import (~60 ms) is a batch's report's alone, never every `check`'s
            # and `grade`'s (the command line imports this package to register the verb)
            from .. import classpage
            write_atomic(report_html, classpage.page(report))
    sys.stdout.write(summary(rows, args.lang, exercise))
    sys.stdout.write(classreport.terminal(report))
    print(render("classreport.written", {"html": report_html, "csv": causes_csv}, args.lang))
    print(render("batch.done", {"graded": len(graded), "reused": reused, "swept": swept,
                                "seconds": time.monotonic() - started, "csv": out / "grades.csv"}, args.lang))
    return 0


def class_exercise(folder: Path, students: list[Student], args):
    """The exercise of the whole class: --exercise; else the one the class folder names; else the one
    most submissions are for (inferred from each file, its folder and its code)."""
    if args.exercise:
        return registry.get(args.exercise, args.exercises_dir)
    try:
        return registry.infer(Path(os.path.abspath(folder)), None, args.exercises_dir)
    except registry.ExerciseError:
        pass
    votes: dict[str, int] = {}
    found = {}
    for student in students:
        if student.problem is not None:
            continue
        try:
            submission = loader.load(student.path)
            exercise = registry.infer(submission.path, submission.source, args.exercises_dir,
                                      getattr(submission, "files", None))
        except Exception:  # noqa: BLE001  (this entry tells nothing; its own grading will say why)
            continue
        votes[exercise.name] = votes.get(exercise.name, 0) + 1
        found[exercise.name] = exercise
    if not votes:
        raise registry.ExerciseError("exercise.ambiguous", known=", ".join(sorted(registry.available(args.exercises_dir))))
    return found[max(sorted(votes), key=votes.get)]


def register(subparsers, add_common_options) -> None:
    p = subparsers.add_parser("batch", help="grade every submission in a folder: OUT/<student>.json and OUT/grades.csv")
    p.add_argument("folder", help="one entry per student: alice.py, bob.ipynb or a folder carol/")
    p.add_argument("--out", required=True, help="output folder (reused: only missing or changed submissions are graded)")
    p.add_argument("--jobs", type=int, default=2, help="submissions graded at once, one worker process each (default %(default)s)")
    p.add_argument("--also-lang", choices=["zh", "en"], help="also write each student's results in this language, "
                   "OUT/<LANG>/<student>.json: one grading, reported in both languages")
    add_common_options(p)
    p.set_defaults(func=lambda args: run(_normalized(args)))


def _normalized(args):
    args.lang = args.lang or default_lang()
    args.langs = list(dict.fromkeys([args.lang, *([args.also_lang] if args.also_lang else [])]))
    args.jobs = max(1, args.jobs)
    return args
