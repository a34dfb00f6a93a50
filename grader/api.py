"""The grading pipeline as keyword-only functions: load -> inspect -> run -> verify -> score.

The CLI, the batch grader and the notebook check all call `grade`; nothing else grades.
"""
from __future__ import annotations

import ast
import secrets
import time
import traceback
from pathlib import Path

from . import checks as rubric
from .submission import load as loader
from .verify import score
from .submission import static
from .verify import runtime as verify
from .model import CheckResult, GradingResult, Note, Outcome
from .processes.runner import Runner, RunRequest
from .feedback.teach import teaching_notes


def grade_path(path: Path, *, runner: Runner, include_hidden: bool = True, backend: str = "auto",
               show_output: bool = True) -> GradingResult:
    return grade(loader.load(path), runner=runner, include_hidden=include_hidden, backend=backend,
                 show_output=show_output)


def grade(submission: loader.Submission, *, runner: Runner, include_hidden: bool = True,
          backend: str = "auto", show_output: bool = True) -> GradingResult:
    """Grade one submission. Never raises: a failure of the grader itself becomes a zero with the traceback.

    show_output: also make the clean run of the visible world size, whose rank output the report shows
    (a perturbed run prints perturbed numbers). Batch grading, which shows no output, leaves it out."""
    started = time.monotonic()
    specs = list(rubric.selected(include_hidden))
    try:
        result = _grade(submission, specs, runner, backend, show_output)
    except Exception:
        result = GradingResult(submission.filename, [CheckResult(s, Outcome.GRADER_ERROR) for s in specs],
                               grader_error=traceback.format_exc())
    result.execution_time = time.monotonic() - started
    return result


def _grade(submission, specs, runner: Runner, backend: str, show_output: bool) -> GradingResult:
    result = GradingResult(submission.filename, [])
    static_specs = [s for s in specs if s.kind == "static"]
    runtime_specs = [s for s in specs if s.kind == "runtime"]
    if submission.problem is not None:
        note = Note(submission.problem.key, submission.problem.params)
        result.checks = score.blanket(specs, Outcome.NOT_SUBMITTED, note)
        result.summary.append(note)
        return result
    tree, problem = static.parse_source(submission.source, submission.filename)
    if problem is not None:
        note = Note(problem.key, problem.params)
        result.checks = score.blanket(specs, Outcome.SYNTAX_ERROR, note)
        result.summary.append(note)
        return result
    report = static.inspect_source(tree)
    if not report.has_entry:
        note = Note("static.no_entry")
        result.checks = score.blanket(specs, Outcome.NO_ENTRY, note)
        result.summary.append(note)
        return result
    result.checks = score.static_results(static_specs, report)
    if report.todo_left and not report.reached:
        result.summary.append(Note("static.todo"))
    result.layers = runner.layer_names()
    runs = _run_all(submission, rubric.world_sizes(runtime_specs), runner, backend, show_output)
    for spec in runtime_specs:
        ws_runs = runs.get(spec.world_size)
        if ws_runs is None:
            result.checks.append(CheckResult(spec, Outcome.GRADER_ERROR,
                                             notes=[Note("backend.nccl_unavailable", {"ws": spec.world_size, "gpus": runner.gpus})]))
            continue
        result.checks.append(verify.evaluate(spec, ws_runs))
    score.hardcoded_world_size(result.checks)
    result.runs = [_run_summary(run) for ws_runs in runs.values() for run in (ws_runs.clean, *ws_runs.perturbed)
                   if run is not None]
    if rubric.VISIBLE_WORLD_SIZE in runs:
        visible = runs[rubric.VISIBLE_WORLD_SIZE]
        result.teaching = teaching_notes(visible.clean or visible.perturbed[0])  # timings: either run will do
        if visible.clean is not None:
            result.outputs = [(rec.rank, rec.output_text(), rec.output_total) for rec in visible.clean.ranks
                              if rec.output_total]
    return result


def _run_summary(run) -> dict:
    """How one run ended, for staff (results.json extra_data): never rendered for students."""
    return {"world_size": run.request.world_size, "label": run.request.label, "stop": run.stop,
            "stop_rank": run.stop_rank, "error": run.error, "elapsed": round(run.elapsed, 3),
            "ranks": [{"how": (rec.result or {}).get("how"), "exit": rec.exit, "setup_error": rec.setup_error,
                       "inside": (rec.inside or {}).get("op"), "output_bytes": rec.output_total}
                      for rec in run.ranks]}


def _backend_for(ws: int, backend: str, gpus: int) -> str | None:
    if backend == "gloo":
        return "gloo"
    if backend == "nccl":
        return "nccl" if gpus >= ws else None
    return "nccl" if gpus >= ws else "gloo"


def _request(submission, ws: int, backend: str, perturb: tuple[str, ...], label: str) -> RunRequest:
    seeds = [secrets.randbits(62) for _ in range(ws)] if perturb else []
    return RunRequest(world_size=ws, source=submission.source, filename=submission.filename, backend=backend,
                      perturb=perturb, seeds=seeds, label=label)


def _run_all(submission, world_sizes, runner: Runner, backend: str, show_output: bool) -> dict[int, verify.WorldSizeRuns]:
    """Round 1, all at once: a perturbed run per world size, and (show_output) the clean run of the visible
    one, whose output the report shows. A world size whose perturbed run proves every value needs nothing
    more (verify.proven_by_perturbed): an honest submission costs 4 runs, or 3 in a batch.
    Round 2: the clean runs of the other world sizes, which diagnose what is wrong.
    Round 3 (rare): one run per collective whose perturbed value rounds 1-2 could not observe (an assert
    fired before it was computed)."""
    gpus = runner.gpus if backend != "gloo" else 0
    plan = {ws: _backend_for(ws, backend, gpus) for ws in world_sizes}
    plan = {ws: chosen for ws, chosen in plan.items() if chosen is not None}
    both = ("all_reduce", "all_gather")
    first = [_request(submission, ws, chosen, both, "perturbed") for ws, chosen in plan.items()]
    first += [_request(submission, ws, chosen, (), "clean") for ws, chosen in plan.items()
              if show_output and ws == rubric.VISIBLE_WORLD_SIZE]
    runs: dict[int, verify.WorldSizeRuns] = {}
    for outcome in runner.run_many(first):
        ws = outcome.request.world_size
        entry = runs.setdefault(ws, verify.WorldSizeRuns(ws, None))
        if outcome.request.perturb:
            entry.perturbed.append(outcome)
        else:
            entry.clean = outcome
    second = [_request(submission, ws, plan[ws], (), "clean") for ws, entry in runs.items()
              if entry.clean is None and not verify.proven_by_perturbed(entry.perturbed[0])]
    for outcome in runner.run_many(second) if second else []:
        runs[outcome.request.world_size].clean = outcome
    third = [_request(submission, ws, plan[ws], (family,), f"perturbed-{family}")
             for ws, entry in runs.items() if entry.clean is not None
             for family in verify.missing_observations(entry)]
    for outcome in runner.run_many(third) if third else []:
        runs[outcome.request.world_size].perturbed.append(outcome)
    return runs
