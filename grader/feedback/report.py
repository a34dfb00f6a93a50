"""The readable report printed by `check` and `grade`."""
from __future__ import annotations

from .messages import layer, render
from ..model import GradingResult
from .render import check_lines, checks_of, note, title

OUTPUT_SHOWN = 2000  # characters of each rank's output in the report


def text_report(result: GradingResult, lang: str = "zh") -> str:
    lines = [f"== {result.submission}: " + render("summary.score", {"score": result.score, "max_score": result.max_score}, lang) + " =="]
    if result.grader_error:
        lines.append(render("summary.grader_failed", {}, lang))
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
    if result.layers:
        lines.append("")
        layers = render("list.comma", {}, lang).join(layer(layer_id, lang) for layer_id in result.layers)
        lines.append(render("summary.layers", {"layers": layers}, lang))
    return "\n".join(lines) + "\n"
