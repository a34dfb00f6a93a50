"""Scores decided before any run: static checks from the source, and verdicts for input that cannot run."""
from __future__ import annotations

from ..exercise.spec import Check, Exercise
from ..model import CheckResult, Note, Outcome, Words
from ..submission.static import StaticReport
from .diagnose import forbidden_words


def static_results(exercise: Exercise, checks: list[Check], report: StaticReport) -> list[CheckResult]:
    out = []
    for check in checks:
        if check.forbid:
            used = {op: lines for op, lines in report.reached.items() if op in check.forbid}
            if used:
                op, lines = sorted(used.items())[0]
                words = forbidden_words(exercise, op, op)
                out.append(CheckResult(check, Outcome.FORBIDDEN, 0, [Note("static.forbidden", {
                    "op": op, "lines": list(lines), "exercise": exercise.name}), *words]))
                continue
            if not check.op:  # with an op as well, the check also needs that op reached (below)
                out.append(CheckResult(check, Outcome.PASS, check.points, [Note("static.not_used", {
                    "ops": list(check.forbid)})]))
                continue
        lines = report.reached.get(check.op)
        if lines:
            out.append(CheckResult(check, Outcome.PASS, check.points, [Note("static.called", {
                "op": check.op, "entry": exercise.entry, "lines": list(lines)})]))
            continue
        notes = [Note("static.not_called", {"op": check.op, "entry": exercise.entry})]
        if report.todo_left:
            notes.append(Note("static.todo", {"entry": exercise.entry, "todo": Words(*exercise.todo)}))
        out.append(CheckResult(check, Outcome.TODO if report.todo_left else Outcome.NOT_CALLED, 0, notes))
    return out


def blanket(checks, outcome: Outcome, note: Note) -> list[CheckResult]:
    """Every check fails for the same reason (nothing could be graded)."""
    return [CheckResult(check, outcome, 0.0, [note]) for check in checks]
