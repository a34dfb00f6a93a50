"""The gradebook of a batch: grades.csv, each student's verdict, and text that is safe to show.

Student names are untrusted: in a CSV cell they never become a formula, on a terminal or in a table they
never become a control sequence. Shared by the batch (grades.csv, the summary) and classreport.py.
"""
from __future__ import annotations

import csv
import io
import os
import unicodedata


def printable(text: str) -> str:
    """`text` for a terminal or a table: control, format and unassigned characters (newlines, ANSI escapes,
    bidi overrides) and undecodable bytes are shown escaped."""
    text = os.fsencode(text).decode("utf-8", "backslashreplace") if isinstance(text, str) else str(text)
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(repr(ch)[1:-1] if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out)


def width(text: str) -> int:
    """Columns `text` takes on a terminal: East Asian wide and fullwidth characters 2, combining marks 0."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
               for ch in text)


def fit(text: str, columns: int) -> str:
    """`text` padded to `columns` columns, or cut to fit them with an ellipsis ("...") at its end."""
    if width(text) > columns:
        kept, used = [], 0
        for ch in text:
            if used + width(ch) > columns - 3:
                break
            kept.append(ch)
            used += width(ch)
        text = "".join(kept) + "..."
    return text + " " * (columns - width(text))


def verdict(data: dict, exercise) -> str:
    """The first failing outcome in rubric order, or "pass"."""
    extra = data.get("extra_data") or {}
    if extra.get("grader_error"):
        return "grader_failed"
    if isinstance(extra.get("problem"), str):  # could not be graded: why (too_large, symlink, too_deep ...)
        return extra["problem"].split(".", 1)[-1]
    outcomes = extra.get("outcomes") or {}
    for spec in exercise.checks:
        outcome = outcomes.get(spec.id, "missing")
        if outcome != "pass":
            return outcome
    return "pass"


def number(x) -> str:
    return f"{float(x):g}"


def cell(value) -> str:
    """A gradebook cell that a spreadsheet shows as text: never a formula (a leading = + - @ tab or CR gets a
    quote before it, as OWASP advises), and on one line (control characters escaped, as on the terminal)."""
    text = str(value)
    return ("'" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else "") + printable(text)


def sorted_rows(rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    return sorted(rows, key=lambda row: os.fsencode(row[0]))


def gradebook(rows: list[tuple[str, dict]], exercise) -> str:
    """grades.csv: the same submissions give the same bytes (sorted by student, no times)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student", "total", *(c.id for c in exercise.checks), "verdict"])
    for name, data in sorted_rows(rows):
        scores = (data.get("extra_data") or {}).get("scores") or {}
        writer.writerow([cell(name), number(data.get("score", 0)), *(number(scores.get(c.id, 0)) for c in exercise.checks),
                         cell(verdict(data, exercise))])
    return buf.getvalue()
