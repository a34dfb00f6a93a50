"""Grade a list of students on N workers: every student gets a results dict, whatever happens to the workers.

A student whose worker dies or overruns is graded again once in a fresh worker, then gets a "grader failed"
result; an entry that cannot be graded at all, or that the grader failed around, gets its own row.
"""
from __future__ import annotations

import selectors
import tempfile
import time
from pathlib import Path

from ...feedback.results import failed_results, to_gradescope
from ...model import CheckResult, GradingResult, Note, Outcome
from ..gradebook import printable
from .discover import Student
from .resume import WORKER_LOGS, save
from .worker import Worker

MAX_ATTEMPTS = 2                 # a student whose worker dies is graded once more, in a fresh worker


def problem_results(student: Student, key: str, params: dict, lang: str, exercise) -> dict:
    """The results of an entry that cannot be graded at all (a symbolic link, a FIFO): every check fails
    with the reason, exactly as `grade` reports a submission it cannot load."""
    note = Note(key, params)
    result = GradingResult(printable(student.path.name), [CheckResult(spec, Outcome.NOT_SUBMITTED, 0.0, [note])
                                                          for spec in exercise.checks], summary=[note])
    data = to_gradescope(result, lang)
    data["extra_data"].update(problem=key, scores={c.id: 0 for c in exercise.checks})
    return data


def entry_failed(student: Student, error: str, lang: str, exercise) -> dict:
    """A failure of the grader around one entry (hashing it, a worker lost twice): its own 'grader failed' row."""
    data = failed_results(printable(student.path.name), error, lang)
    data["extra_data"]["scores"] = {c.id: 0 for c in exercise.checks}
    return data


# -- scheduling -------------------------------------------------------------------------------------
def grade_all(todo: list[Student], args, out: Path, progress, results: dict[str, dict] | None = None) -> dict[str, dict]:
    """Grade `todo` on args.jobs workers; every student gets a results dict, whatever happens to workers.
    `results` (filled in as students finish) stays valid if this raises: run() still writes the gradebook."""
    results = {} if results is None else results
    queue = list(todo)
    budget = 60 + 4 * args.time_limit       # two rounds of runs of at most time_limit each, with margins
    log_dir = Path(tempfile.mkdtemp(prefix=WORKER_LOGS, dir=out))
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()

    def finish(student: Student, data: dict, timeline: str | None = None, also: dict | None = None) -> None:
        """Save a student's results; `also`: the same in each --also-lang language, as the worker sent them."""
        also = {lang: got if isinstance(got := (also or {}).get(lang), dict)
                else entry_failed(student, "the worker sent no results in this language", lang, args.exercise_spec)
                for lang in args.langs[1:]}
        results[student.name] = save(out, student, data, args.lang, args.exercise_spec, timeline, also)
        progress.advance(printable(student.name))

    def worker_lost(worker: Worker) -> None:
        student, worker.student = worker.student, None
        sel.unregister(worker.proc.stdout)
        timed_out = student is not None and time.monotonic() > worker.deadline
        worker.kill()
        why = f"grading took longer than {budget:.0f} s; the worker was killed" if timed_out else worker.why_dead()
        workers.remove(worker)
        if student is not None and student.name not in results:
            student.errors.append(why)
            if student.attempts < MAX_ATTEMPTS:
                queue.insert(0, student)
            else:
                error = "\n\n".join(f"attempt {i + 1}: {e}" for i, e in enumerate(student.errors))
                failed = {lang: entry_failed(student, error, lang, args.exercise_spec) for lang in args.langs}
                finish(student, failed.pop(args.lang), also=failed)

    try:
        while queue or any(w.student for w in workers):
            while len(workers) < min(args.jobs, len(queue) + sum(1 for w in workers if w.student)):
                worker = Worker(args, log_dir, len(workers))
                workers.append(worker)
                sel.register(worker.proc.stdout, selectors.EVENT_READ, worker)
            for worker in list(workers):
                if worker.student is None and queue:
                    student = queue.pop(0)
                    student.attempts += 1
                    if not worker.assign(student, budget):
                        worker_lost(worker)
            now = time.monotonic()
            busy = [w for w in workers if w.student]
            timeout = max(0.0, min((w.deadline for w in busy), default=now + 1) - now)
            for key, _ in sel.select(min(timeout, 1.0)):
                worker: Worker = key.data
                lines, eof = worker.read_lines()
                for msg in lines:
                    if worker.student and msg.get("name") == worker.student.name and isinstance(msg.get("results"), dict):
                        student, worker.student = worker.student, None
                        finish(student, msg["results"], msg.get("timeline") if isinstance(msg.get("timeline"), str) else None,
                               msg.get("also") if isinstance(msg.get("also"), dict) else None)
                if eof:
                    worker_lost(worker)
            now = time.monotonic()
            for worker in [w for w in workers if w.student and now > w.deadline]:
                worker_lost(worker)
            progress.tick()
    finally:
        for worker in workers:   # every idle worker winds down at once (its zygote, its runs' folders)
            if worker.student is None:
                worker.ask_to_stop()
        for worker in workers:
            if worker.student is None:
                worker.stop()
            else:
                worker.kill()
        sel.close()
        for log in log_dir.glob("*"):
            log.unlink()
        log_dir.rmdir()
    return results
