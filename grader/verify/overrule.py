"""Verdicts the stronger evidence overrules: a check that passed through the switch loses its points where the
real-backend run shows the code does not work on real gloo (or NCCL) as it is; a static check is overruled by
what the runs observed (an operation the text does not show, reached; a forbidden one, run).
"""
from __future__ import annotations

from ..records import Stop

from ..exercise.spec import Check
from ..model import CheckResult, Note, Outcome
from . import causes, diagnose, outcomes
from .evidence import WorldSizeRuns
from .kinds.value import rank_value


def real_backend(judge, results: list[CheckResult], runs: dict) -> None:
    """A check that passed through the switch loses its points where the real-backend run of its world
    size shows the code does not work on real gloo (or NCCL) as it is: a value check, where that
    quantity is not right on every rank there (read as the switch run's values are: returned, or the
    entry function's locals when it raised); any other check, where the real run failed and the switch
    runs of that world size did not."""
    for ws, entry in runs.items():
        if entry.real is None or entry.real.stop == Stop.GRADER_ERROR:
            continue
        for i, result in enumerate(results):
            if result.spec.world_size != ws or result.spec.kind == "static" or not result.passed:
                continue
            problem = _real_problem(judge, entry, result.spec)
            if problem:
                results[i] = CheckResult(result.spec, Outcome.REAL_BACKEND, 0, notes=problem)


def _real_problem(judge, runs: WorldSizeRuns, check: Check) -> list[Note]:
    real, ws = runs.real, runs.world_size
    lead = Note("fail.real_backend", {"backend": real.request.backend})
    failures = [f for f in (outcomes.rank_failure(real, rec) for rec in real.ranks) if f is not None]
    failure = next((f[1] for f in failures if f[1].key != "fail.stopped"), failures[0][1] if failures else None)
    # what the real run shows failed, and where it ran out of time, an isend the switch saw never waited on
    failed = [] if failure is None else [failure]
    if failure is not None and failure.key.startswith("fail.timeout"):
        failed += _unwaited_sends(runs)
    if check.kind != "value":
        return [lead, *failed] if failed else []
    quantity = judge.exercise.quantity(check.quantity)
    for record in real.ranks:
        value, _ = judge.value(record, quantity.name)
        if judge.judge_clean(quantity, value, ws, record.rank)[0] is not Outcome.PASS:
            if failed:
                return [lead, *failed]
            return [lead, Note("real.differs", {"backend": real.request.backend, "quantity": quantity.name}),
                    rank_value(judge, quantity, ws, record.rank, value)]
    return []


def _unwaited_sends(runs: WorldSizeRuns) -> list[Note]:
    """A hung real run beside a switch run where a rank never waited on an isend's request: on gloo a
    request dropped before its receiver posts the receive is never delivered (measured on gloo), which the
    switch, delivering every send it was given, does not show."""
    for run in runs.switch_runs[:1]:
        for record in run.ranks:
            call = next((c for c in record.calls if c.op == "send" and c.completed and c.ok and not c.waited
                         and c.api == "isend"), None)
            if call is not None:
                return [Note("cause.isend_not_waited", {"rank": record.rank, **diagnose.at(call)})]
    return []


def overrule_static(judge, results: list[CheckResult], runs: dict) -> None:
    """Static checks against what the runs observed, the stronger evidence either way:
      - an operation the text does not show reached (DTensor's full_tensor / redistribute, getattr
        through a table of names): where every rank of a graded run completed it, called from the
        submission's code, the check passes after all;
      - an operation the text reaches that never ran: where every rank of some run completed normally, no
        rank of any run ever called it and nothing ran from the lines that reach it (both collectives under
        `if world_size < 0:` beside a formula), the check fails after all; code that stops before its calls
        (an exception, a hang) keeps its points;
      - no forbidden operation in the text, contradicted by the runs (a name built at run time, a
        group's own method): the operation ran, so the check fails after all."""
    for i, result in enumerate(results):
        spec = result.spec
        if spec.kind != "static" or not spec.op or result.passed or result.outcome not in (Outcome.NOT_CALLED, Outcome.TODO):
            continue
        seen = _completed_everywhere(spec.op, runs)
        if seen is not None:
            results[i] = CheckResult(spec, Outcome.PASS, spec.points, [Note("static.called_at_run", {
                "op": spec.op, "entry": judge.exercise.entry, "api": diagnose.op_name(seen), **diagnose.at(seen)})])
    for i, result in enumerate(results):
        spec = result.spec
        lines = next((n.params.get("lines") for n in result.notes if n.key == "static.called"), None)
        if spec.kind != "static" or not spec.op or not result.passed or not lines or \
                _never_ran(judge, spec.op, runs, lines) is None:
            continue
        results[i] = CheckResult(spec, Outcome.NOT_CALLED, 0, [Note("static.never_ran", {
            "op": spec.op, "entry": judge.exercise.entry, "lines": list(lines)})])
    for i, result in enumerate(results):
        spec = result.spec
        if spec.kind != "static" or not spec.forbid or not result.passed:
            continue
        used = next((c for ws_runs in runs.values() for run in ws_runs.switch_runs
                     for record in run.ranks for c in record.calls if c.op in spec.forbid), None)
        if used is not None:
            results[i] = CheckResult(spec, Outcome.FORBIDDEN, 0, [
                Note("static.forbidden_at_run", {"op": diagnose.op_name(used), **diagnose.at(used)}),
                *causes.forbidden_words(judge.exercise, used.op, diagnose.op_name(used))])


def _never_ran(judge, op: str, runs: dict, lines: list):
    """A switch run where every rank completed normally, when no rank of any switch run ever called `op`
    (completed or not) and no operation at all came from the `lines` that reach it (a module that calls it on
    the code's behalf and ran, DDP all of whose backward passes were in no_sync() say, still reaches it);
    None otherwise (or where no run was whole: a crash says nothing of what it skipped)."""
    switch = [run for ws_runs in runs.values() for run in ws_runs.switch_runs if run.stop != "grader_error" and run.ranks]
    calls = [c for run in switch for record in run.ranks for c in record.calls]
    if any(c.op == op or (c.line in lines and not c.file) for c in calls):
        return None
    return next((run for run in switch if judge.whole(run)), None)


def _completed_everywhere(op: str, runs: dict):
    """The first call of `op` in a graded switch run where every rank completed one from its code (not
    from the module's top level), or None."""
    for ws_runs in runs.values():
        for run in ws_runs.switch_runs:
            if run.stop == Stop.GRADER_ERROR or not run.ranks:
                continue
            found = [next((c for c in rec.calls if c.op == op and c.completed and c.ok and c.function != "<module>"), None)
                     for rec in run.ranks]
            if all(c is not None for c in found):
                return found[0]
    return None
