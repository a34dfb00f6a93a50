"""The readable report printed by `check` and `grade`."""
from __future__ import annotations

from .messages import layer, render
from ..model import GradingResult, Words
from .render import check_lines, checks_of, note, title, visible

OUTPUT_SHOWN = 2000  # characters of each rank's output in the report
MISSING_LAYERS = ("seccomp_off", "no_new_privs_off", "no_namespaces")   # the sandbox line shows for these


def text_report(result: GradingResult, lang: str = "zh", staff: bool = False) -> str:
    """`staff` (`grade`, for TAs): the sandbox line always; a student's report (`check`) shows it only when
    a layer is missing."""
    lines = [_header(result, lang)]
    if result.grader_error:
        lines.append(render("summary.grader_failed", {}, lang))
    if any(result.exercise_title):
        lines.append(render("summary.exercise", {"title": Words(*result.exercise_title)}, lang))
    hidden_points = result.exercise_total - result.max_score
    if result.checks and hidden_points > 0:   # `check` runs the visible checks only
        lines.append(render("summary.hidden_points", {"points": hidden_points}, lang))
    lines += [note(n, lang) for n in result.summary]
    for check in result.checks:
        mark = "PASS" if check.passed else "FAIL"
        lines.append(f"[{mark}] {check.score:g}/{check.spec.points:g}  {title(check, lang, checks_of(result))}")
        lines += ["       " + line for text in check_lines(check, lang) for line in text.splitlines()]
    if result.teaching:
        lines.append("")
        lines += [note(n, lang) for n in result.teaching]
    for rank, text, total in result.outputs:
        lines.append("")
        lines.append(render("summary.output", {"rank": rank, "kept": min(len(text), OUTPUT_SHOWN), "total": total}, lang))
        lines += ["  | " + line for line in text[:OUTPUT_SHOWN].splitlines()]
    if staff and result.staff:
        lines.append("")
        lines += [note(n, lang) for n in result.staff]
    if result.layers and (staff or any(layer_id in MISSING_LAYERS for layer_id in result.layers)):
        lines.append("")
        layers = render("list.comma", {}, lang).join(layer(layer_id, lang) for layer_id in result.layers)
        lines.append(render("summary.layers", {"layers": layers}, lang))
    return visible("\n".join(lines)) + "\n"


def _header(result: GradingResult, lang: str) -> str:
    """`== file: Score: 20 / 40 ==`; without a score when no exercise was graded (nothing was out of 0)."""
    if not result.checks and not result.exercise:
        return f"== {result.submission} =="
    return f"== {result.submission}: " + render("summary.score", {"score": result.score, "max_score": result.max_score}, lang) + " =="
