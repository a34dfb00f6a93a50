"""The grading pipeline as keyword-only functions: load -> inspect -> run -> verify -> score.

The CLI, the batch grader and the notebook check all call `grade`; nothing else grades. The exercise is
a parameter (exercise/spec.py): the pipeline knows none.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np

from .exercise import registry
from .exercise.spec import Exercise
from .model import CheckResult, GradingResult, Note, Outcome
from .processes.runner import Runner
from .submission import load as loader
from .submission import static
from .verify import score
from .verify.judge import Judge
from . import plan
from .verify.teach import exercise_notes, teaching_notes
from .feedback import lines


def choose_exercise(submission: loader.Submission, name: str | None, extra: list[str] | None = None) -> Exercise:
    """The exercise named, or the one the submission is for (registry.infer). Raises ExerciseError."""
    if name:
        return registry.get(name, extra)
    return registry.infer(submission.path, submission.source, extra, getattr(submission, "files", None))


def grade_path(path: Path, *, runner: Runner, exercise: str | Exercise | None = None, include_hidden: bool = True,
               backend: str = "auto", show_output: bool = True, real_backend: bool = True,
               exercises_dir: list[str] | None = None, timeline: bool = False) -> GradingResult:
    return grade(loader.load(path), runner=runner, exercise=exercise, include_hidden=include_hidden,
                 backend=backend, show_output=show_output, real_backend=real_backend, exercises_dir=exercises_dir,
                 timeline=timeline)


def grade(submission: loader.Submission, *, runner: Runner, exercise: str | Exercise | None = None,
          include_hidden: bool = True, backend: str = "auto", show_output: bool = True, real_backend: bool = True,
          exercises_dir: list[str] | None = None, timeline: bool = False) -> GradingResult:
    """Grade one submission. Never raises: a failure of the grader itself becomes a zero with the traceback.

    show_output: someone waits for this grading and reads its output (`check`, `grade`): the runs that may
    be needed start at once (plan.py). real_backend: run the code once on torch's own gloo / NCCL at the
    visible world size too (its output, its real times; failing there costs that world size's points).
    timeline: keep the visible world size's run as a picture's data (result.timeline, feedback/runview.py)."""
    started = time.monotonic()
    try:
        chosen = exercise if isinstance(exercise, Exercise) else choose_exercise(submission, exercise, exercises_dir)
    except registry.ExerciseError as err:
        # nothing to grade either way: the submission's own problem first (it cannot be read, does not parse,
        # defines no exercise's entry function), then the exercises to choose from
        try:
            entries = sorted({ex.entry for ex in registry.available(exercises_dir).values()})
        except registry.ExerciseError:
            entries = []
        own = submission.problem or static.own_problem(submission.source, submission.filename, entries,
                                                       getattr(submission, "files", None))
        # a file that is empty, does not parse or starts no exercise cannot tell its exercise either: its own
        # problem is the news, and choosing an exercise would not change it (an unknown --exercise still is)
        said = [Note(err.key, err.params)] if own is None or err.key != "exercise.ambiguous" else []
        result = GradingResult(submission.filename, [], summary=[Note(p.key, p.params) for p in (own,) if p] + said)
        result.execution_time = time.monotonic() - started
        return lines.in_cells(result, getattr(submission, "line_map", None))
    checks = list(chosen.selected(include_hidden))
    try:
        # a student's numbers may overflow or be NaN: the checks judge them, numpy need not warn on stderr
        with np.errstate(all="ignore"):
            result = _grade(submission, chosen, checks, runner, backend, show_output, real_backend, timeline)
    except Exception:
        result = GradingResult(submission.filename, [CheckResult(c, Outcome.GRADER_ERROR) for c in checks],
                               exercise=chosen.name, grader_error=traceback.format_exc())
    result.execution_time = time.monotonic() - started
    result.exercise_title, result.exercise_total, result.entry = chosen.title, chosen.total, chosen.entry
    return lines.in_cells(result, getattr(submission, "line_map", None))  # a notebook's lines in its cells


def _grade(submission, exercise: Exercise, checks, runner: Runner, backend: str, show_output: bool,
           real_backend: bool, timeline: bool = False) -> GradingResult:
    result = GradingResult(submission.filename, [], exercise=exercise.name)
    result.summary += [Note(n.key, n.params) for n in getattr(submission, "notes", ())]
    static_checks = [c for c in checks if c.kind == "static"]
    runtime_checks = [c for c in checks if c.kind != "static"]
    if submission.problem is not None:
        note = Note(submission.problem.key, submission.problem.params)
        result.checks = score.blanket(checks, Outcome.NOT_SUBMITTED, note)
        result.summary.append(note)
        return result
    tree, problem = static.parse_source(submission.source, submission.filename)
    if problem is not None:
        note = Note(problem.key, problem.params)
        result.checks = score.blanket(checks, Outcome.SYNTAX_ERROR, note)
        result.summary.append(note)
        return result
    report = static.inspect_source(tree, exercise.entry, getattr(submission, "files", None))  # %%writefile files
    if not report.has_entry:
        note = Note("static.no_entry", {"entry": exercise.entry})
        result.checks = score.blanket(checks, Outcome.NO_ENTRY, note)
        result.summary.append(note)
        return result
    written = "\n".join([submission.source, *(getattr(submission, "files", None) or {}).values()])   # %%writefile files too
    result.checks = score.static_results(exercise, static_checks, report, written)
    todo = score.todo_note(exercise, report)   # names only the TODOs still open
    if todo is not None:
        result.summary.append(todo)
    result.layers = runner.layer_names()
    judge = Judge(exercise, submission.source)
    runs = plan.run_all(submission, exercise, judge, exercise.world_sizes(runtime_checks), runner, backend=backend,
                        show_output=show_output, real=real_backend, preload=tuple(report.torch_modules),
                        self_checks=report.self_checks)
    for check in runtime_checks:
        result.checks.append(judge.evaluate(check, runs[check.world_size]))
    for check in result.checks:      # an exercise's own code that failed is for staff, never in a check's words
        result.staff += [n for n in check.notes if n.key.startswith("staff.")]
        check.notes[:] = [n for n in check.notes if not n.key.startswith("staff.")]
    judge.overrule_static(result.checks, runs)
    judge.real_backend(result.checks, runs)
    result.runs = [_run_summary(run) for ws_runs in runs.values()
                   for run in ws_runs.switch_runs + ([ws_runs.real] if ws_runs.real is not None else [])]
    visible = exercise.visible_world_sizes
    if visible and visible[0] in runs:
        ws_runs = runs[visible[0]]
        measured = ws_runs.clean or ws_runs.perturbed[0]   # sizes and traffic: the switch's either way
        teaching = teaching_notes(measured, exercise, ws_runs.real) + exercise_notes(exercise, measured)
        result.teaching = [n for n in teaching if not n.key.startswith("staff.")]
        result.staff += [n for n in teaching if n.key.startswith("staff.")]
        shown = ws_runs.real or ws_runs.clean   # what the student's code printed (never a perturbed run's numbers)
        if shown is not None:
            result.outputs = [(rec.rank, rec.output_text(), rec.output_total) for rec in shown.ranks if rec.output_total]
        if timeline:
            result.timeline = _picture(ws_runs, submission)
        if real_backend and backend == "nccl" and ws_runs.real is None and plan.backend_for(visible[0], backend, runner.gpus) is None:
            result.summary.append(Note("backend.nccl_unavailable", {"ws": visible[0], "gpus": runner.gpus}))
    return result


def _picture(ws_runs, submission):
    """The visible run a student may see: the clean run where there is one (what the code does unperturbed),
    else the perturbed run, of which the picture keeps sizes and times, never a value. Imported only here:
    a grading that draws nothing loads nothing of it."""
    from .feedback import runview
    run = ws_runs.clean or (ws_runs.perturbed[0] if ws_runs.perturbed else None)
    return None if run is None else runview.view(run, lines.placer(getattr(submission, "line_map", None)))


def _run_summary(run) -> dict:
    """How one run ended, for staff (results.json extra_data): never rendered for students."""
    return {"world_size": run.request.world_size, "label": run.request.label, "stop": run.stop,
            "stop_rank": run.stop_rank, "error": run.error, "elapsed": round(run.elapsed, 3),
            "ranks": [{"how": rec.how, "exit": rec.exit, "setup_error": rec.setup_error,
                       "inside": rec.inside.op if rec.inside is not None else None, "calls": len(rec.calls),
                       "output_bytes": rec.output_total} for rec in run.ranks]}
