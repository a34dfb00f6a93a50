"""Load a submission from disk: a `.py` file, a notebook, or a folder holding one of them.

Loading never raises for bad input: a problem becomes a `Problem` (a message key and its values)
that the score step turns into a clear message and a zero. The size is checked before anything is
read (a sparse file can claim 200 GB), only regular files are read (never a FIFO or a device), and a
student's folder is searched without following symbolic links, to a bounded depth.
"""
from __future__ import annotations

import ast
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from . import notebook
from .notebook import LineMap
from .parse import Problem, parse_source
from .program import entry_origin, written_modules

MAX_BYTES = 1 << 20  # a submission of more than 1 MiB is not a solution to this exercise
SUFFIXES = (".py", ".ipynb")
MAX_DEPTH = 32       # folders below a student's folder searched for the submission
MAX_ENTRIES = 10_000  # entries looked at in one student's folder
FUNCTION_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)

__all__ = ["MAX_BYTES", "SUFFIXES", "Problem", "Submission", "display_name", "find_entry", "load", "from_source", "read_limited"]


@dataclass(frozen=True)
class Submission:
    path: Path
    filename: str            # what tracebacks and messages call the file
    source: str | None       # Python source (a notebook's code cells, joined) or None on a problem
    problem: Problem | None = None
    raw: bytes = b""         # the bytes read, for content hashes
    notes: tuple = ()        # non-fatal notes for the student: Problem(key, params) each (ignored %%bash cells ...)
    files: dict[str, str] = field(default_factory=dict)   # what a notebook's %%writefile cells write: name -> text
    line_map: LineMap | None = None   # a notebook's: where each line of `source` (and of `files`) is in its cells


def _walk(folder: Path, truncated: list | None = None):
    """(file, depth) below `folder`, breadth first, without following symbolic links; folders
    that cannot be read are skipped. Depth-limited and count-limited: never recursion, never a loop.
    Appends True to `truncated` when it stopped at a limit."""
    truncated = [] if truncated is None else truncated
    queue, seen = [(folder, 1)], 0
    while queue:
        current, depth = queue.pop(0)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                truncated.append(True)
                return
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if entry.name.startswith("."):
                        continue
                    if depth < MAX_DEPTH:
                        queue.append((Path(entry.path), depth + 1))
                    else:
                        truncated.append(True)
                elif entry.is_file(follow_symlinks=False):
                    yield Path(entry.path), depth
            except OSError:
                continue


MAX_MODULES = 16   # .py files beside a folder's solution carried as its modules
MAX_READ = 32      # files of a student's folder read to find the one that defines the entry


def find_entry(folder: Path, truncated: list | None = None, entry: str = "run_worker") -> Path | None:
    """The one submission file inside a student's folder (nbgrader's submitted/<student>/<assignment>/): of
    the files that define the entry function (`def run_worker(`), else of all, a notebook if there is one,
    else a .py; the first by path (a helper module beside the solution is not it). Hidden files and folders,
    symbolic links and anything deeper than MAX_DEPTH are not considered."""
    candidates = sorted((p.suffix != ".ipynb", p.relative_to(folder).parts, p) for p, _ in _walk(folder, truncated)
                        if p.suffix in SUFFIXES and not p.name.startswith("."))
    # the first few in that order are read (at most MAX_READ of them: a folder of thousands of files costs no more)
    defining = next((p for _, _, p in candidates[:MAX_READ] if _defines(p, entry)), None)
    return defining or (candidates[0][2] if candidates else None)


def _defines(path: Path, entry: str) -> bool:
    """Whether the file's text has `def <entry>(` (a notebook's too: its JSON holds the code as text)."""
    raw, problem = read_limited(path)
    return problem is None and f"def {entry}(".encode() in raw


def _modules(entry: Path) -> dict[str, str]:
    """The other .py files beside a folder's solution (its own helper modules, `import helpers`): written in
    every rank's working folder, as a notebook's %%writefile files are."""
    out: dict[str, str] = {}
    try:
        siblings = sorted(p for p in entry.parent.iterdir() if p.suffix == ".py" and p != entry
                          and not p.name.startswith(".") and p.name.isascii() and p.stem.isidentifier())
    except OSError:
        return out
    for path in siblings[:MAX_MODULES]:
        raw, problem = (None, True) if path.is_symlink() else read_limited(path)
        try:
            if problem is None:
                out[path.name] = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            pass   # not text: left out, as an unreadable file would be
    return out


def display_name(name: str) -> str:
    """A file name as text that can always be encoded (undecodable bytes shown as \\xNN)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def read_limited(path: Path, limit: int = MAX_BYTES) -> tuple[bytes | None, Problem | None]:
    """The bytes of a regular file of at most `limit` bytes, or the problem. Opens without blocking (a FIFO
    would wait for a writer), checks the type and size with fstat, then reads at most limit + 1 bytes."""
    name = display_name(path.name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            return None, Problem("load.too_deep", {"file": name, "limit": MAX_DEPTH})
        return None, Problem("load.unreadable", {"file": name, "error": err.strerror or str(err)})
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "folder" if stat.S_ISDIR(st.st_mode) else "FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "socket"
            return None, Problem("load.not_a_file", {"file": name, "kind": kind})
        if st.st_size > limit:
            return None, Problem("load.too_large", {"file": name, "size": st.st_size})
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        raw = b"".join(chunks)
        if len(raw) > limit:  # grew since fstat
            return None, Problem("load.too_large", {"file": name, "size": len(raw)})
        return raw, None
    except OSError as err:
        return None, Problem("load.unreadable", {"file": name, "error": err.strerror or str(err)})
    finally:
        os.close(fd)


def load(path: Path) -> Submission:
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError as err:  # a name too long for the system (a file 1000 folders deep), a loop ...
        name = display_name(path.name)
        key = "load.too_deep" if err.errno == errno.ENAMETOOLONG else "load.unreadable"
        return Submission(path, name, None, Problem(key, {"file": name, "limit": MAX_DEPTH,
                                                          "error": err.strerror or str(err)}))
    if is_dir:
        truncated: list[bool] = []
        entry = find_entry(path, truncated)
        if entry is None:
            name = display_name(path.name)
            if truncated:
                return Submission(path, name, None, Problem("load.too_deep", {"file": name, "limit": MAX_DEPTH}))
            return Submission(path, name, None, Problem("load.no_file", {"folder": name}))
        path = entry
    name = display_name(path.name)
    raw, problem = read_limited(path)
    if problem is not None:
        return Submission(path, name, None, problem)
    modules = _modules(path) if is_dir and path.suffix == ".py" else {}
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return Submission(path, name, None, Problem("load.not_utf8", {"file": name, "offset": err.start}), raw)
    if path.suffix == ".ipynb":
        return _notebook(path, name, text, raw)
    if not text.strip():
        return Submission(path, name, None, Problem("load.empty", {"file": name}), raw)
    return Submission(path, name, text, None, raw, files=modules)


def _notebook(path: Path, name: str, text: str, raw: bytes) -> Submission:
    code = notebook.read_notebook(text)
    notes = tuple(Problem(key, params) for key, params in code.notes)
    lines = LineMap(code.lines.source, code.lines.files, _entry_files(code.source, code.files))
    if code.problem is not None:
        return Submission(path, name, None, Problem(*code.problem), raw, notes, code.files, lines)
    if not code.source.strip():
        return Submission(path, name, None, Problem("load.empty", {"file": name}), raw, notes, code.files, lines)
    return Submission(path, name, code.source, None, raw, notes, code.files, lines)


def _entry_files(source: str | None, files: dict[str, str]) -> dict[str, str]:
    """For each function a written file defines: the file ranks take it from when the notebook's code
    names it as its entry (static.entry_origin), so that messages about it point at that file's cell."""
    tree = parse_source(source, "notebook")[0] if source and written_modules(files) else None
    if tree is None:
        return {}
    out = {}
    for file in written_modules(files).values():
        module = parse_source(files[file], file)[0]
        for stmt in module.body if module is not None else ():
            origin = entry_origin(tree, stmt.name, files) if isinstance(stmt, FUNCTION_DEFS) else None
            if origin is not None:
                out[stmt.name] = origin[0]
    return out


def from_source(source: str, filename: str = "submission.py") -> Submission:
    """A submission given as text (the in-notebook check)."""
    if not source.strip():
        return Submission(Path(filename), filename, None, Problem("load.empty", {"file": filename}))
    return Submission(Path(filename), filename, source, None, source.encode())
