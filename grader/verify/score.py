"""Scores decided before any run: static checks from the source, and verdicts for input that cannot run."""
from __future__ import annotations

from ..exercise.spec import Check, Exercise
from ..feedback.messages import LANGS, render
from ..model import CheckResult, Note, Outcome, Words
from ..submission.static import StaticReport
from .causes import forbidden_words


def static_results(exercise: Exercise, checks: list[Check], report: StaticReport, source: str) -> list[CheckResult]:
    """`source`: the submission's text, to tell an operation written where it never runs (a comment, a
    string, a dead branch) from one that is not written at all."""
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
        absent = check.op not in source
        notes = [Note("static.not_written" if absent else "static.not_called", {"op": check.op, "entry": exercise.entry})]
        todo = todo_note(exercise, report)
        if todo is not None:
            notes.append(todo)
        out.append(CheckResult(check, Outcome.TODO if report.todo_left else Outcome.NOT_CALLED, 0, notes))
    return out


def todo_note(exercise: Exercise, report: StaticReport) -> Note | None:
    """While the entry function still raises NotImplementedError: the TODOs still open, by their names
    (a TODO is done when its operation, or every operation of its quantity, is reached); a single
    `todo=(zh, en)` as it is written; when every TODO looks done, that the raise line is left."""
    if not report.todo_left:
        return None
    if not exercise.todos:
        if any(exercise.todo):
            return Note("static.todo", {"entry": exercise.entry, "todo": Words(*exercise.todo)})
        return Note("static.todo_raise", {"entry": exercise.entry})

    def done(todo) -> bool:
        ops = (todo.op,) if todo.op else exercise.quantity(todo.quantity).through if todo.quantity else ()
        return bool(ops) and all(op in report.reached for op in ops)
    left = [todo for todo in exercise.todos if not done(todo)]
    if not left:
        return Note("static.todo_raise", {"entry": exercise.entry})
    names = Words(*(_and([todo.words[i] for todo in left], lang) for i, lang in enumerate(LANGS)))
    todos = Words(*(render("todo.open", {"todos": names}, lang) for lang in LANGS))
    return Note("static.todo", {"entry": exercise.entry, "todo": todos})


def _and(items: list[str], lang: str) -> str:
    """"a", "a and b", "a, b and c" (zh: 、)."""
    if len(items) == 1:
        return items[0]
    rest = render("list.comma", {}, lang).join(items[:-1])
    return render("list.and", {"rest": rest, "last": items[-1]}, lang)


def blanket(checks, outcome: Outcome, note: Note) -> list[CheckResult]:
    """Every check fails for the same reason (nothing could be graded)."""
    return [CheckResult(check, outcome, 0.0, [note]) for check in checks]
