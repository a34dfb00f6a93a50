"""Scores: static checks from the source, and whole-submission verdicts for input that cannot run."""
from __future__ import annotations

from ..checks import CheckSpec
from ..model import CheckResult, Note, Outcome
from ..submission.static import StaticReport


def static_results(specs: list[CheckSpec], report: StaticReport) -> list[CheckResult]:
    out = []
    for spec in specs:
        lines = report.reached.get(spec.collective)
        if lines:
            out.append(CheckResult(spec, Outcome.PASS, spec.points,
                                   [Note("static.called", {"op": spec.collective, "lines": ", ".join(map(str, lines))})]))
            continue
        notes = [Note("static.not_called", {"op": spec.collective})]
        if report.todo_left:
            notes.append(Note("static.todo"))
        out.append(CheckResult(spec, Outcome.TODO if report.todo_left else Outcome.NOT_CALLED, 0, notes))
    return out


def blanket(specs, outcome: Outcome, note: Note) -> list[CheckResult]:
    """Every check fails for the same reason (nothing could be graded)."""
    return [CheckResult(spec, outcome, 0.0, [note]) for spec in specs]


def hardcoded_world_size(results: list[CheckResult]) -> None:
    """Right at the visible world size, wrong at a hidden one: say so, without saying which."""
    visible_ok = {r.spec.collective for r in results
                  if r.spec.kind == "runtime" and not r.spec.hidden and r.passed}
    for result in results:
        if (result.spec.hidden and result.spec.collective in visible_ok
                and result.outcome in (Outcome.WRONG, Outcome.EXCEPTION, Outcome.DEADLOCK, Outcome.TIMEOUT)
                and not any(n.key == "cause.hardcoded_ws" for n in result.notes)):
            result.notes.append(Note("cause.hardcoded_ws"))
