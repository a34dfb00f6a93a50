"""Line numbers as a notebook's reader finds them: "cell 3, line 29", not a line of the joined code.

A notebook's code cells are joined before grading (submission/notebook.py), so a line the grader names (a
syntax error, where an operation was called, an exception's frames) is a line of a text the student never
sees. `in_cells(result, line_map)` gives back the result with each such reference as model.CellLines,
which the catalog words as "cell 3, line 29" / "第 3 个单元格第 29 行" (messages.render): the params `line`
and `lines` of every note, and the `line` of each frame of a `frames` param. Lines of a file a cell writes
(`%%writefile`) are mapped through that file's own lines: the static check's (`lines` of static.called and
static.forbidden, when the entry function is in that file), and a note's or a frame's that names its
`file`. A line the map does not hold ("?", the blank line between cells) stays as it is; a .py submission
(no map) keeps plain line numbers.
"""
from __future__ import annotations

from dataclasses import replace

from ..model import CellLines, GradingResult, Note

STATIC_LINES = ("static.called", "static.forbidden")   # lines of the file the entry function is in


def in_cells(result: GradingResult, line_map) -> GradingResult:
    """`result` with its line references in cells (see the module's docstring); unchanged without a map."""
    if line_map is None:
        return result
    entry_file = line_map.entry_files.get(result.entry)

    def table(params: dict, key: str = "") -> dict:
        named = params.get("file")
        if isinstance(named, str) and named in line_map.files:
            return line_map.files[named]
        if key in STATIC_LINES and entry_file in line_map.files:
            return line_map.files[entry_file]
        return line_map.source

    def note(n: Note) -> Note:
        lines = table(n.params, n.key)
        params = {k: _place(v, lines) if k in ("line", "lines") else v for k, v in n.params.items()}
        if isinstance(params.get("frames"), (list, tuple)):
            params["frames"] = [{**f, "line": _place(f.get("line"), table(f))} if isinstance(f, dict) else f
                                for f in params["frames"]]
        return Note(n.key, params)

    checks = [replace(c, notes=[note(n) for n in c.notes], details=[note(n) for n in c.details]) for c in result.checks]
    return replace(result, checks=checks, summary=[note(n) for n in result.summary],
                   teaching=[note(n) for n in result.teaching])


def placer(line_map):
    """place(line, file): a line the switch recorded as the student sees it (in a notebook, CellLines through
    the file a cell wrote, or the joined cells); without a map, the line as it is."""
    if line_map is None:
        return lambda line, file: line
    return lambda line, file: _place(line, line_map.files.get(file, line_map.source) if isinstance(file, str)
                                     else line_map.source)


def _place(value, lines: dict):
    """A line (or a list of lines) as CellLines, when the map holds every one of them."""
    numbers = value if isinstance(value, (list, tuple)) else [value]
    if not numbers or not all(isinstance(n, int) and not isinstance(n, bool) and n in lines for n in numbers):
        return value
    return CellLines(tuple(lines[n] for n in numbers))
