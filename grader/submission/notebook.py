"""Notebooks as submissions: the code cells of an `.ipynb`, as the Python that Jupyter runs.

Each code cell goes through IPython's own `TransformerManager` (the code Jupyter runs for line and cell
magics, `!cmd`, `x = !cmd`, `obj?`), then:
  - a cell magic whose body IPython runs as Python in the notebook's namespace (`%%time`, `%%capture`,
    `%%prun`, `%%debug`) is graded as its body;
  - `%%writefile NAME` (`%%file`) writes its body to NAME when the cell runs: the file is kept
    (`NotebookCode.files`, `-a` appends) for the ranks to write into their folder, so that a later
    `from dist_worker import run_worker` (the usual way around mp.spawn not pickling notebook functions)
    works as in Jupyter; a name that is not a plain relative path inside the folder becomes a note;
  - `%%timeit` runs its body in a scope of its own (nothing it defines is kept) and any other cell magic
    (`%%bash`, `%%html` ...) is not Python: the cell is left out, with a note the student sees;
  - `%time STMT` / `%prun STMT` become STMT; every other line magic or shell line becomes `pass`, on its
    own line, so line numbers (tracebacks, messages) still point at the student's lines.
Without IPython (an environment that lacks it) cells are read the same way by a small fallback, which
leaves `%time STMT` out with a note.

Cells are joined with one blank line between them; `NotebookCode.lines` says where each line of the
joined code (and of each written file) is in the notebook: (cell, counted from 1 over every cell, markdown
included, as the notebook shows them; line in that cell), for messages the student can find.

`read_notebook` never raises: a notebook that cannot be graded becomes a (catalog key, values) problem --
bad JSON, no code cells, or `run_worker` split over cells with other top-level code between its parts
(joined, such cells parse as something the student never wrote; run one by one, as Jupyter does, the
continuation is an IndentationError). Text is split into lines on "\n" only, as Python's tokenizer does
(str.splitlines also splits on characters such as \x1c, which a comment may hold).
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import warnings
from dataclasses import dataclass, field

ENTRY_DEF = re.compile(r"^(?:async[ \t]+)?def[ \t]+run_worker\b", re.MULTILINE)
NAMESPACE_CELL_MAGICS = {"time", "capture", "prun", "debug"}  # IPython runs the body in the user namespace
LOCAL_CELL_MAGICS = {"timeit"}                                 # runs the body in a scope of its own
STATEMENT_LINE_MAGICS = {"time", "prun", "debug"}              # `%time STMT` runs STMT in the user namespace
WRITEFILE_MAGICS = {"writefile", "file"}                       # `%%file` is IPython's alias of `%%writefile`
MAX_FILE_BYTES = 256 * 1024   # a file a cell writes; more is not part of this exercise
MAX_FILES = 32
SAFE_PART = re.compile(r"\w[\w.\-]*")                          # one folder or file name: no leading dot, no ..
_TRANSFORMER: list = []


def _lines(text: str) -> list[str]:
    """Lines with their ends, split on "\n" only."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _transformer():
    """IPython's TransformerManager, or None where IPython is not installed."""
    if not _TRANSFORMER:
        try:   # here, once: a large import, paid only where a notebook is read
            from IPython.core.inputtransformer2 import TransformerManager
            _TRANSFORMER.append(TransformerManager())
        except Exception:  # ImportError, or a broken IPython
            _TRANSFORMER.append(None)
    return _TRANSFORMER[0]


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _ipython_call(node: ast.AST) -> tuple[str, list] | None:
    """(method, constant args) of `get_ipython().method(...)`, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "get_ipython"):
        return node.func.attr, [a.value if isinstance(a, ast.Constant) else None for a in node.args]
    return None


def _cell_magic(src: str) -> tuple[str, str, str] | None:
    """(name, arguments, body) when the cell starts with a cell magic (`%%name` on its first line)."""
    if not src.startswith("%%"):
        return None
    first, _, body = src.partition("\n")
    name, _, args = first[2:].strip().partition(" ")
    return name, args.strip(), body


def _cell(src: str, depth: int = 0) -> tuple[str, list[tuple[str, dict]]]:
    """One cell as Python with the same number of lines, and its notes (a "line" param: 1-based, in the cell)."""
    magic = _cell_magic(src)
    if magic is not None and depth < 3:
        name, _, body = magic
        if name in NAMESPACE_CELL_MAGICS:
            code, notes = _cell(body, depth + 1)
            return f"# %%{name}\n" + code, [(key, {**params, "line": params["line"] + 1}) if "line" in params
                                             else (key, params) for key, params in notes]
        key = "note.magic_local" if name in LOCAL_CELL_MAGICS else "note.magic_ignored"
        return "\n" * src.count("\n"), [(key, {"magic": name})]
    if not any(ch in src for ch in "%!?"):
        return src, []
    manager = _transformer()
    if manager is None:
        return _fallback(src)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = manager.transform_cell(src)
    except Exception:
        return _fallback(src)
    lines, original = _lines(code), _lines(src)
    if len(lines) != len(original) and not (len(lines) == len(original) + 1 and lines[-1] == "\n"):
        return _fallback(src)  # a line continuation was merged: keep the student's line numbers instead
    tree = _parse(code)
    if tree is None:
        return _fallback(src)
    out = list(original)
    for stmt in ast.walk(tree):
        if not isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)) or stmt.value is None:
            continue
        call = _ipython_call(stmt.value)
        if call is None:
            continue
        first, last = stmt.lineno - 1, (stmt.end_lineno or stmt.lineno) - 1
        indent = original[first][: len(original[first]) - len(original[first].lstrip())]
        method, args = call
        replacement = None
        if isinstance(stmt, ast.Expr) and method == "run_line_magic" and len(args) == 2 \
                and args[0] in STATEMENT_LINE_MAGICS and isinstance(args[1], str) and "\n" not in args[1] \
                and _parse(args[1]) is not None:
            replacement = indent + args[1].strip()
        if replacement is None:
            replacement = indent + "pass  # " + original[first].strip()
        out[first] = replacement + "\n"
        for i in range(first + 1, last + 1):
            out[i] = "\n"
    text = "".join(out)
    return (text if src.endswith("\n") or not text.endswith("\n") else text[:-1]), []


_SHELL_ASSIGN = re.compile(r"^[\w.\[\], ]+=\s*[!%]")  # x = !ls, x = %sx ls
_HELP = re.compile(r"^[\w.]+\?{1,2}\s*$")          # obj?, obj??


def _fallback(src: str) -> tuple[str, list[tuple[str, dict]]]:
    """Without IPython: every magic, shell or help line becomes `pass`, in place (with the lines a trailing
    backslash continues it onto); `%time STMT` is noted, since it is not run."""
    out, notes, continued = [], [], None
    for number, line in enumerate(_lines(src), 1):
        stripped = line.lstrip()
        body = stripped.rstrip("\n")
        end = "\n" if line.endswith("\n") else ""
        if continued is not None:
            out.append(continued + "pass  # " + body + end)
            continued = continued if body.endswith("\\") else None
            continue
        if stripped.startswith(("%", "!")) or _SHELL_ASSIGN.match(body) or _HELP.match(body):
            name = stripped[1:].split(None, 1)[0] if stripped.startswith("%") and stripped[1:].strip() else ""
            if name in STATEMENT_LINE_MAGICS:
                notes.append(("note.magics_unavailable", {"line": number, "magic": name}))
            indent = line[: len(line) - len(stripped)]
            out.append(indent + "pass  # " + body + end)
            continued = indent if body.endswith("\\") else None
        else:
            out.append(line)
    return "".join(out), notes


def _cell_text(cell: dict) -> str:
    src = cell.get("source", cell.get("input", ""))  # "input": nbformat 3
    if isinstance(src, list):
        if not all(isinstance(part, str) for part in src):
            raise ValueError("cell source is not text")
        src = "".join(src)
    if not isinstance(src, str):
        raise ValueError("cell source is not text")
    return src


def cell_code(cell: dict) -> tuple[str, list[tuple[str, dict]]]:
    """The Python a code cell holds (see the module's docstring) and its notes."""
    return _cell(_cell_text(cell))


def cell_source(cell: dict) -> str:
    return cell_code(cell)[0]


def _cells(nb: dict) -> list | None:
    if isinstance(nb.get("cells"), list):
        return nb["cells"]
    sheets = nb.get("worksheets")  # nbformat 3
    if isinstance(sheets, list) and sheets and isinstance(sheets[0], dict) and isinstance(sheets[0].get("cells"), list):
        return [c for sheet in sheets if isinstance(sheet, dict) for c in sheet.get("cells", []) if isinstance(sheet.get("cells"), list)]
    return None


def _first_code_line(code: str) -> tuple[int, bool] | None:
    """(0-based line, indented?) of the first line that is neither blank nor a comment."""
    for i, line in enumerate(_lines(code)):
        line = line.rstrip("\n")
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return i, line[:1] in (" ", "\t")
    return None


def _parses(code: str) -> bool:
    return _parse(code) is not None


def _code_lines(code: str) -> list[str]:
    lines = (ln.rstrip("\n") for ln in _lines(code))
    return [ln for ln in lines if ln.strip() and not ln.strip().startswith("#")]


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


@dataclass(frozen=True)
class LineMap:
    """Where the lines the grader reads were in the notebook: (code cell, from 1; line in that cell)."""
    source: dict[int, tuple[int, int]] = field(default_factory=dict)   # line of the joined code -> (cell, line)
    files: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)   # per written file, its lines
    entry_files: dict[str, str] = field(default_factory=dict)   # function -> the written file ranks take it from


@dataclass(frozen=True)
class NotebookCode:
    source: str | None                       # the code cells, joined (None on a problem)
    problem: tuple[str, dict] | None = None
    notes: tuple = ()                        # (key, params) each
    files: dict[str, str] = field(default_factory=dict)   # relative name -> text, as the cells write them
    lines: LineMap = field(default_factory=LineMap)


def safe_name(name: str) -> str | None:
    """A name a cell may write, as a plain relative path (`./a/b.py` is `a/b.py`), or None: absolute, `~`,
    `..`, a hidden part, a variable IPython would expand (`$x`, `{x}`), a backslash or a control character."""
    if not name or len(name) > 200 or name.startswith(("/", "~")) or any(c in name for c in "\\$\x00"):
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or len(parts) > 4 or not all(SAFE_PART.fullmatch(part) and part.isprintable() for part in parts):
        return None
    return "/".join(parts)


def _writefile(args: str) -> tuple[str | None, bool]:
    """(the name as written, append?) of `%%writefile [-a] NAME`; None for the name when it cannot be told."""
    try:
        words = shlex.split(args)
    except ValueError:
        return None, False
    append = any(w in ("-a", "--append") for w in words)
    names = [w for w in words if w not in ("-a", "--append")]
    return (names[0] if len(names) == 1 and not names[0].startswith("-") else None), append


class _Files:
    """The files the cells write, in the order the cells run, with where each of their lines came from."""

    def __init__(self):
        self.texts: dict[str, str] = {}
        self.lines: dict[str, dict[int, tuple[int, int]]] = {}
        self.notes: list[tuple[str, dict]] = []

    def write(self, cell: int, args: str, body: str) -> None:
        written, append = _writefile(args)
        name = safe_name(written) if written is not None else None
        if name is None:
            self.notes.append(("note.writefile_bad_name", {"cell": cell, "file": (written or args)[:200]}))
            return
        if name not in self.texts and len(self.texts) >= MAX_FILES:
            self.notes.append(("note.writefile_too_many", {"cell": cell, "file": name, "limit": MAX_FILES}))
            return
        body = body if body.endswith("\n") or not body else body + "\n"
        before = self.texts.get(name, "") if append else ""
        if len((before + body).encode("utf-8", "replace")) > MAX_FILE_BYTES:
            self.notes.append(("note.writefile_too_large", {"cell": cell, "file": name, "limit": MAX_FILE_BYTES}))
            self.texts.pop(name, None)
            self.lines.pop(name, None)
            return
        lines = dict(self.lines.get(name, {})) if append else {}
        start = before.count("\n")
        lines.update({start + i: (cell, i + 1) for i in range(1, body.count("\n") + 1)})  # the body starts on line 2
        self.texts[name], self.lines[name] = before + body, lines


def read_notebook(text: str) -> NotebookCode:
    """The notebook as the grader reads it (see the module's docstring); never raises."""
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError) as err:
        # json's own words, whole: "Unterminated string starting at: line 31 column 5 (char 1234)"
        where = str(err)[:200]
        return NotebookCode(None, ("load.bad_notebook", {"error": where}))
    cells = _cells(nb) if isinstance(nb, dict) else None
    if cells is None:
        return NotebookCode(None, ("load.bad_notebook", {"error": "no 'cells' list"}))
    chunks, notes, line, number, files, where = [], [], 1, 0, _Files(), {}
    try:
        for cell in cells:
            number += 1   # every cell counts, markdown too: "cell 6" is the sixth cell the student sees
            if not (isinstance(cell, dict) and cell.get("cell_type") == "code"):
                continue
            src = _cell_text(cell)
            magic = _cell_magic(src)
            if magic is not None and magic[0] in WRITEFILE_MAGICS:
                files.write(number, magic[1], magic[2])
                notes += files.notes
                files.notes.clear()
                continue
            code, cell_notes = _cell(src)
            for key, params in cell_notes:
                params = {**params, "cell": number}
                if "line" in params:
                    params["line"] += line - 1
                notes.append((key, params))
            if code.strip():
                chunk = code.rstrip("\n") + "\n"
                chunks.append(chunk)
                where.update({line + i: (number, i + 1) for i in range(chunk.count("\n"))})
                line += chunk.count("\n") + 1  # chunks are joined with one blank line between
    except (ValueError, RecursionError, MemoryError) as err:
        return NotebookCode(None, ("load.bad_notebook", {"error": str(err)[:200]}))
    notes_out = tuple(notes)
    lines = LineMap(where, files.lines)
    if not chunks:
        return NotebookCode(None, ("load.no_code_cells", {}), notes_out, files.texts, lines)
    entry_line = split_entry_line(chunks)
    if entry_line is not None:
        return NotebookCode(None, ("load.split_entry", {"line": entry_line}), notes_out, files.texts, lines)
    return NotebookCode("\n".join(chunks), None, notes_out, files.texts, lines)


def notebook_code(text: str) -> tuple[str, None, tuple] | tuple[None, tuple[str, dict], tuple]:
    """(source, None, notes) or (None, (problem key, params), notes); notes are (key, params) each."""
    code = read_notebook(text)
    return code.source, code.problem, code.notes


def code_from_notebook(text: str) -> tuple[str, None] | tuple[None, tuple[str, dict]]:
    """(source, None) or (None, (problem key, params)): notebook_code without its notes."""
    source, problem, _ = notebook_code(text)
    return source, problem
