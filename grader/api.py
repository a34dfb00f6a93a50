"""The grading pipeline as keyword-only functions: load -> inspect -> run -> verify -> score.

The CLI, the batch grader and the notebook check all call `grade`; nothing else grades. The exercise is
a parameter (exercise/spec.py): the pipeline knows none.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

from .exercise import registry
from .exercise.spec import Exercise
from .model import CheckResult, GradingResult, Note, Outcome, Words
from .processes.runner import Runner, RunRequest
from .submission import load as loader
from .submission import static
from .verify import score
from .verify.judge import Judge, WorldSizeRuns
from .feedback.teach import exercise_notes, teaching_notes
from .feedback import lines


def choose_exercise(submission: loader.Submission, name: str | None, extra: list[str] | None = None) -> Exercise:
    """The exercise named, or the one the submission is for (registry.infer). Raises ExerciseError."""
    if name:
        return registry.get(name, extra)
    return registry.infer(submission.path, submission.source, extra)


def grade_path(path: Path, *, runner: Runner, exercise: str | Exercise | None = None, include_hidden: bool = True,
               backend: str = "auto", show_output: bool = True, exercises_dir: list[str] | None = None) -> GradingResult:
    return grade(loader.load(path), runner=runner, exercise=exercise, include_hidden=include_hidden,
                 backend=backend, show_output=show_output, exercises_dir=exercises_dir)


def grade(submission: loader.Submission, *, runner: Runner, exercise: str | Exercise | None = None,
          include_hidden: bool = True, backend: str = "auto", show_output: bool = True,
          exercises_dir: list[str] | None = None) -> GradingResult:
    """Grade one submission. Never raises: a failure of the grader itself becomes a zero with the traceback.

    show_output: also make the clean run of the visible world size, whose rank output the report shows
    (a perturbed run prints perturbed numbers). Batch grading, which shows no output, leaves it out."""
    started = time.monotonic()
    try:
        chosen = exercise if isinstance(exercise, Exercise) else choose_exercise(submission, exercise, exercises_dir)
    except registry.ExerciseError as err:
        # nothing to grade either way: the submission's own problem first (it cannot be read, does not parse,
        # defines no exercise's entry function), then the exercises to choose from (issue 19)
        try:
            entries = sorted({ex.entry for ex in registry.available(exercises_dir).values()})
        except registry.ExerciseError:
            entries = []
        own = submission.problem or static.own_problem(submission.source, submission.filename, entries,
                                                       getattr(submission, "files", None))
        result = GradingResult(submission.filename, [], summary=[Note(p.key, p.params) for p in (own,) if p] + [Note(err.key, err.params)])
        result.execution_time = time.monotonic() - started
        return lines.in_cells(result, getattr(submission, "line_map", None))
    checks = list(chosen.selected(include_hidden))
    try:
        result = _grade(submission, chosen, checks, runner, backend, show_output)
    except Exception:
        result = GradingResult(submission.filename, [CheckResult(c, Outcome.GRADER_ERROR) for c in checks],
                               exercise=chosen.name, grader_error=traceback.format_exc())
    result.execution_time = time.monotonic() - started
    result.exercise_title, result.exercise_total, result.entry = chosen.title, chosen.total, chosen.entry  # issue 19
    return lines.in_cells(result, getattr(submission, "line_map", None))  # issue 19: a notebook's lines in its cells


def _grade(submission, exercise: Exercise, checks, runner: Runner, backend: str, show_output: bool) -> GradingResult:
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
    report = static.inspect_source(tree, exercise.entry, getattr(submission, "files", None))  # issue 19: %%writefile files
    if not report.has_entry:
        note = Note("static.no_entry", {"entry": exercise.entry})
        result.checks = score.blanket(checks, Outcome.NO_ENTRY, note)
        result.summary.append(note)
        return result
    result.checks = score.static_results(exercise, static_checks, report)
    if report.todo_left and not report.reached:
        result.summary.append(Note("static.todo", {"entry": exercise.entry, "todo": Words(*exercise.todo)}))
    result.layers = runner.layer_names()
    judge = Judge(exercise, submission.source)
    runs = _run_all(submission, exercise, judge, exercise.world_sizes(runtime_checks), runner, backend, show_output,
                    tuple(report.torch_modules), report.self_checks)
    for check in runtime_checks:
        ws_runs = runs.get(check.world_size)
        if ws_runs is None:
            result.checks.append(CheckResult(check, Outcome.GRADER_ERROR, notes=[
                Note("backend.nccl_unavailable", {"ws": check.world_size, "gpus": runner.gpus})]))
            continue
        result.checks.append(judge.evaluate(check, ws_runs))
    judge.overrule_static(result.checks, runs)
    result.runs = [_run_summary(run) for ws_runs in runs.values() for run in (ws_runs.clean, *ws_runs.perturbed)
                   if run is not None]
    visible = exercise.visible_world_sizes
    if visible and visible[0] in runs:
        ws_runs = runs[visible[0]]
        shown = ws_runs.clean or ws_runs.perturbed[0]  # timings and volumes: either run will do
        result.teaching = teaching_notes(shown, exercise) + exercise_notes(exercise, shown)
        if ws_runs.clean is not None:
            result.outputs = [(rec.rank, rec.output_text(), rec.output_total) for rec in ws_runs.clean.ranks
                              if rec.output_total]
    return result


def _run_summary(run) -> dict:
    """How one run ended, for staff (results.json extra_data): never rendered for students."""
    return {"world_size": run.request.world_size, "label": run.request.label, "stop": run.stop,
            "stop_rank": run.stop_rank, "error": run.error, "elapsed": round(run.elapsed, 3),
            "ranks": [{"how": (rec.result or {}).get("how"), "exit": rec.exit, "setup_error": rec.setup_error,
                       "inside": rec.inside.op if rec.inside is not None else None, "calls": len(rec.calls),
                       "output_bytes": rec.output_total} for rec in run.ranks]}


def _backend_for(ws: int, backend: str, gpus: int) -> str | None:
    if backend == "gloo":
        return "gloo"
    if backend == "nccl":
        return "nccl" if gpus >= ws else None
    return "nccl" if gpus >= ws else "gloo"


def _perturbed_ops(exercise: Exercise) -> tuple[str, ...]:
    """The operations a perturbed run perturbs: those the quantities come through, and those the exercise
    forbids (a value that went through a forbidden operation can then still be shown right, if not
    allowed: the "uses" check says so)."""
    ops = []
    forbidden = [op for check in exercise.checks if check.kind == "uses" for op in check.forbid]
    for op in [op for quantity in exercise.quantities for op in quantity.through] + list(exercise.forbidden) + forbidden:
        ops += ["send", "recv"] if op in ("send", "recv") else [op]
    return tuple(dict.fromkeys(ops))


def _run_all(submission, exercise: Exercise, judge: Judge, world_sizes, runner: Runner, backend: str,
             show_output: bool, preload: tuple, self_checks: bool = False) -> dict[int, WorldSizeRuns]:
    """Round 1, all at once: a perturbed run per world size, and (show_output) the clean run of the visible
    one, whose output the report shows. A world size whose perturbed run proves every value needs nothing
    more (Judge.proven): an honest submission costs one run per world size, plus the visible clean run.
    Round 2: the clean runs of the other world sizes, which diagnose what is wrong.
    Round 3 (rare): a run perturbing only the operations of a quantity that rounds 1-2 could not observe
    (an honest assert fired before it was computed).
    `self_checks` (the code asserts or raises on its own values, which a perturbed run's deltas can make
    fail, so that round 2 follows): `grade` and `check`, which someone waits for, start round 2's clean runs
    in round 1; each is kept only where its perturbed run does not decide alone, as in two rounds."""
    gpus = runner.gpus if backend != "gloo" else 0
    plan = {ws: _backend_for(ws, backend, gpus) for ws in world_sizes}
    plan = {ws: chosen for ws, chosen in plan.items() if chosen is not None}
    names = tuple(q.name for q in exercise.quantities)

    def request(ws: int, perturb: tuple, label: str) -> RunRequest:
        return RunRequest(world_size=ws, source=submission.source, filename=submission.filename,
                          entry=exercise.entry, quantities=names, backend=plan[ws], perturb=perturb,
                          label=label, preload=preload)

    every = _perturbed_ops(exercise)
    visible = exercise.visible_world_sizes
    first = [request(ws, every, "perturbed") for ws in plan]
    first += [request(ws, (), "clean") for ws in plan if show_output and ws in visible[:1]]
    early = {ws for ws in plan if show_output and self_checks and ws not in visible[:1]}
    first += [request(ws, (), "clean") for ws in sorted(early)]
    runs: dict[int, WorldSizeRuns] = {}
    for outcome in runner.run_many(first):
        entry = runs.setdefault(outcome.request.world_size, WorldSizeRuns(outcome.request.world_size))
        if outcome.request.perturb:
            entry.perturbed.append(outcome)
        else:
            entry.clean = outcome
    for ws in early:
        if ws in runs and runs[ws].perturbed and judge.proven(runs[ws].perturbed[0]):
            runs[ws].clean = None   # not needed after all: the perturbed run decides alone, as without it
    second = [request(ws, (), "clean") for ws, entry in runs.items()
              if entry.clean is None and not judge.proven(entry.perturbed[0])]
    for outcome in runner.run_many(second) if second else []:
        runs[outcome.request.world_size].clean = outcome
    third = [request(ws, ops, "perturbed-" + "+".join(ops))
             for ws, entry in runs.items() for ops in judge.unobserved(entry)]
    for outcome in runner.run_many(third) if third else []:
        runs[outcome.request.world_size].perturbed.append(outcome)
    return runs
