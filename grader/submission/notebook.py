"""Notebooks as submissions: the code cells of an `.ipynb`, with IPython magics and shell lines removed.

`code_from_notebook` never raises: a notebook that cannot be graded becomes a (catalog key, values)
problem -- bad JSON, no code cells, or `run_worker` split over cells with other top-level code between
its parts (joined, such cells parse as something the student never wrote; run one by one, as Jupyter
does, the continuation is an IndentationError).
"""
from __future__ import annotations

import ast
import json
import re

ENTRY_DEF = re.compile(r"^(?:async[ \t]+)?def[ \t]+run_worker\b", re.MULTILINE)


def _strip_ipython(line: str) -> str:
    stripped = line.lstrip()
    if stripped.startswith(("%", "!")):
        # keep the line count, so tracebacks point at the student's lines
        return line[: len(line) - len(stripped)] + "pass  # " + stripped.rstrip("\n") + ("\n" if line.endswith("\n") else "")
    return line


def cell_source(cell: dict) -> str:
    src = cell.get("source", cell.get("input", ""))  # "input": nbformat 3
    if isinstance(src, list):
        if not all(isinstance(part, str) for part in src):
            raise ValueError("cell source is not text")
        src = "".join(src)
    if not isinstance(src, str):
        raise ValueError("cell source is not text")
    lines = src.splitlines(keepends=True)
    if lines and lines[0].lstrip().startswith("%%"):
        return ""  # a cell magic (%%bash, %%timeit ...) is not Python
    return "".join(_strip_ipython(line) for line in lines)


def _cells(nb: dict) -> list | None:
    if isinstance(nb.get("cells"), list):
        return nb["cells"]
    sheets = nb.get("worksheets")  # nbformat 3
    if isinstance(sheets, list) and sheets and isinstance(sheets[0], dict) and isinstance(sheets[0].get("cells"), list):
        return [c for sheet in sheets if isinstance(sheet, dict) for c in sheet.get("cells", []) if isinstance(sheet.get("cells"), list)]
    return None


def _first_code_line(code: str) -> tuple[int, bool] | None:
    """(0-based line, indented?) of the first line that is neither blank nor a comment."""
    for i, line in enumerate(code.splitlines()):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return i, line[:1] in (" ", "\t")
    return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _code_lines(code: str) -> list[str]:
    return [ln for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _leaves_entry_open(code: str) -> bool:
    """The cell ends inside `run_worker`'s body: its last top-level line is the def, its last line indented."""
    lines = _code_lines(code)
    top = [ln for ln in lines if ln[:1] not in (" ", "\t")]
    return bool(top) and ENTRY_DEF.match(top[-1]) is not None and lines[-1][:1] in (" ", "\t")


def split_entry_line(chunks: list[str]) -> int | None:
    """The line (1-based, in the joined source) where a continuation of `run_worker` starts after other
    top-level code, or None. A continuation is a cell that starts indented and does not parse on its own;
    one that directly follows the cell it continues is accepted (joined, it is what the student meant)."""
    line, entry_seen, entry_open = 1, False, False
    for chunk in chunks:
        start, line = line, line + chunk.count("\n") + 1  # chunks are joined with one blank line between
        first = _first_code_line(chunk)
        if first is None:
            continue
        if first[1] and not _parses(chunk):
            if entry_seen and not entry_open:
                return start + first[0]
            entry_open = entry_open and _code_lines(chunk)[-1][:1] in (" ", "\t")
            continue
        if ENTRY_DEF.search(chunk):
            entry_seen = True
        entry_open = _leaves_entry_open(chunk)
    return None


def code_from_notebook(text: str) -> tuple[str, None] | tuple[None, tuple[str, dict]]:
    """(source, None) or (None, (problem key, params))."""
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError) as err:
        where = f"line {err.lineno}: {err.msg}" if isinstance(err, json.JSONDecodeError) else str(err)[:200]
        return None, ("load.bad_notebook", {"error": where})
    cells = _cells(nb) if isinstance(nb, dict) else None
    if cells is None:
        return None, ("load.bad_notebook", {"error": "no 'cells' list"})
    chunks = []
    try:
        for cell in cells:
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                code = cell_source(cell)
                if code.strip():
                    chunks.append(code.rstrip("\n") + "\n")
    except ValueError as err:
        return None, ("load.bad_notebook", {"error": str(err)})
    if not chunks:
        return None, ("load.no_code_cells", {})
    line = split_entry_line(chunks)
    if line is not None:
        return None, ("load.split_entry", {"line": line})
    return "\n".join(chunks), None
