"""The message catalog: every sentence the engine says, in Chinese and English, keyed by outcome.

Logic never builds sentences; it emits model.Note(key, params) and the report renders them here.
Chinese text is Chinese throughout (full-width punctuation; code identifiers stay as code). Structured
parameters are worded here too: an exception's frames, a listing of operations per rank, Words.
An exercise adds its own keys (spec.Exercise.messages) under its name: `<exercise>.<key>`.
"""
from __future__ import annotations

import os
import re

from ..model import CellLines, Words
from .catalog import causes, exercise, measures, reports, runs, submission

LANGS = ("zh", "en")

# Every key, from the catalog's parts (grader/feedback/catalog/, by what the words are about); an exercise's
# own keys join them when it loads (add).
CATALOG: dict[str, tuple[str, str]] = {}
for _part in (exercise, submission, runs, causes, measures, reports):
    assert not CATALOG.keys() & _part.MESSAGES.keys(), "a key in two parts of the catalog"
    CATALOG.update(_part.MESSAGES)


def add(prefix: str, messages: dict) -> None:
    """An exercise's own messages, under its name (registry.py calls this when it loads one)."""
    for key, pair in (messages or {}).items():
        if isinstance(pair, (tuple, list)) and len(pair) == 2:
            CATALOG[f"{prefix}.{key}"] = (str(pair[0]), str(pair[1]))


def layer(layer_id: str, lang: str) -> str:
    """A sandbox layer id ("pid_ns", "memory_cgroup:2048") in words."""
    name, _, value = layer_id.partition(":")
    return render(f"layer.{name}", {"mb": value}, lang)


def default_lang() -> str:
    lang = os.environ.get("LANG", "") or os.environ.get("LC_ALL", "")
    return "en" if lang.lower().startswith("en") else "zh"


def _word(value, lang: str):
    """A structured parameter in words: bilingual Words, an exception's frames, operations per rank."""
    if isinstance(value, Words):
        return value.zh if lang == "zh" else value.en
    if isinstance(value, CellLines):
        return _cell_words(value, lang)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and "line" in v and "function" in v for v in value):
        return render("list.sep", {}, lang).join(render("frame", f, lang) for f in value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and "ops" in v for v in value):
        comma = render("list.comma", {}, lang)
        return render("list.sep", {}, lang).join(
            render("calls.rank", {"rank": v.get("rank"), "ops": comma.join(v.get("ops") or ["-"])}, lang) for v in value)
    if isinstance(value, (list, tuple)) and not value:
        return render("frames.none", {}, lang)
    if isinstance(value, (list, tuple)) and list(value) == ["-"]:   # a list of ranks or names with nothing in it
        return render("list.none", {}, lang)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return render("list.comma", {}, lang).join(map(str, value))
    return value


def _cell_words(value: CellLines, lang: str) -> str:
    """"cell 3, line 29" / "第 3 个单元格第 29 行"; several lines grouped by cell, in their order."""
    cells: dict[int, list[str]] = {}
    for cell, line in value.places:
        cells.setdefault(cell, []).append(str(line))
    comma = render("list.comma", {}, lang)
    return render("list.sep", {}, lang).join(
        render("where.cell_lines" if len(lines) > 1 else "where.cell_line", {"cell": cell, "line": comma.join(lines)}, lang)
        for cell, lines in cells.items())


def _in_cells(template: str, params: dict) -> str:
    """A template whose line is given in a notebook's cells: "line {line}" / "第 {line} 行" become "{line}",
    the words of CellLines saying line and cell."""
    for name, value in params.items():
        if isinstance(value, CellLines):
            template = re.sub(r"\b[Ll]ines? (\{%s[:}])|第 ?(\{%s\}) ?行" % (name, name), lambda m: m.group(1) or m.group(2), template)
    return template


# Formulas (comm.OPS, an exercise's traffic params) are written "2(N-1)/N x S": English keeps x, Chinese
# shows × (as its catalog writes them).
FORMULA_PARAMS = ("formula", "vformula", "sformula")
# English: after a count of 1, the noun it counts is singular ("1 send", "sent 1 time"). Not after an id
# ("rank 1 sends to rank 2": a verb).
SINGULAR = {"times": "time", "sends": "send", "receives": "receive", "ranks": "rank", "students": "student",
            "submissions": "submission", "points": "point", "operations": "operation", "checks": "check",
            "bytes": "byte", "elements": "element", "temporary files": "temporary file",
            "up-to-date results": "up-to-date result", "GPUs": "GPU", "files": "file", "more points": "more point",
            "hidden checks": "hidden check"}
NOT_COUNTS = {"rank", "peer", "other", "source", "sender", "to", "frm", "n", "element", "line", "cell", "ws_id"}


def _agree(template: str, values: dict) -> str:
    """English: the nouns counted by a value of 1 in the singular (see SINGULAR)."""
    def fix(match):
        name, noun = match.group(1), match.group(3)
        value = values.get(name)
        one = isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1
        return match.group(0)[:-len(noun)] + SINGULAR[noun] if one and name not in NOT_COUNTS else match.group(0)
    nouns = "|".join(re.escape(n) for n in sorted(SINGULAR, key=len, reverse=True))
    return re.sub(r"\{(\w+)(:[^}]*)?\} (%s)\b" % nouns, fix, template)


def render(key: str, params: dict | None = None, lang: str = "zh") -> str:
    zh, en = CATALOG.get(key, (key, key))
    template = _in_cells(en if lang == "en" else zh, params or {})
    if lang == "en":
        template = _agree(template, params or {})
    values = {k: _word(v, lang) for k, v in (params or {}).items()}
    if lang != "en":
        values.update({k: v.replace(" x ", " × ") for k, v in values.items() if k in FORMULA_PARAMS and isinstance(v, str)})
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return _partial(template, values)


def _partial(template: str, values: dict) -> str:
    """Fill what can be filled (a value of the wrong type for its format spec stays as text)."""
    def fill(match):
        name, spec = match.group(1), match.group(2) or ""
        if name not in values:
            return match.group(0)
        try:
            return format(values[name], spec)
        except (TypeError, ValueError):
            return str(values[name])
    return re.sub(r"\{(\w+)(?::([^}]*))?\}", fill, template)


def placeholders(key: str) -> set[str]:
    zh, en = CATALOG.get(key, ("", ""))
    return set(re.findall(r"\{(\w+)", zh + en))
