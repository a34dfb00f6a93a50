"""Notebooks as submissions: the code cells of an `.ipynb`, with IPython magics and shell lines removed."""
from __future__ import annotations

import json


def _strip_ipython(line: str) -> str:
    stripped = line.lstrip()
    if stripped.startswith(("%", "!")):
        # keep the line count, so tracebacks point at the student's lines
        return line[: len(line) - len(stripped)] + "pass  # " + stripped.rstrip("\n") + ("\n" if line.endswith("\n") else "")
    return line


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):
        src = "".join(src)
    if not isinstance(src, str):
        raise ValueError("cell source is not text")
    lines = src.splitlines(keepends=True)
    if lines and lines[0].lstrip().startswith("%%"):
        return ""  # a cell magic (%%bash, %%timeit ...) is not Python
    return "".join(_strip_ipython(line) for line in lines)


def code_from_notebook(text: str) -> tuple[str, None] | tuple[None, tuple[str, dict]]:
    """(source, None) or (None, (problem key, params))."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as err:
        return None, ("load.bad_notebook", {"error": f"line {err.lineno}: {err.msg}"})
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, ("load.bad_notebook", {"error": "no 'cells' list"})
    chunks = []
    try:
        for cell in nb["cells"]:
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                code = cell_source(cell)
                if code.strip():
                    chunks.append(code.rstrip("\n") + "\n")
    except ValueError as err:
        return None, ("load.bad_notebook", {"error": str(err)})
    if not chunks:
        return None, ("load.no_code_cells", {})
    return "\n".join(chunks), None
