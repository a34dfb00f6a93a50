"""Load a submission from disk: a `.py` file, a notebook, or a folder holding one of them.

Loading never raises for bad input: a problem becomes a `Problem` (a message key and its values)
that the score step turns into a clear message and a zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import notebook

MAX_BYTES = 1 << 20  # a submission of more than 1 MiB is not a solution to this exercise
SUFFIXES = (".py", ".ipynb")


@dataclass(frozen=True)
class Problem:
    key: str                 # message catalog key
    params: dict


@dataclass(frozen=True)
class Submission:
    path: Path
    filename: str            # what tracebacks and messages call the file
    source: str | None       # Python source (a notebook's code cells, joined) or None on a problem
    problem: Problem | None = None
    raw: bytes = b""         # the bytes read, for content hashes


def find_entry(folder: Path) -> Path | None:
    """The one submission file inside a student's folder (nbgrader's submitted/<student>/<assignment>/)."""
    candidates = sorted(p for p in folder.rglob("*")
                        if p.is_file() and p.suffix in SUFFIXES
                        and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not candidates:
        return None
    notebooks = [p for p in candidates if p.suffix == ".ipynb"]
    return (notebooks or candidates)[0]


def load(path: Path) -> Submission:
    path = Path(path)
    if path.is_dir():
        entry = find_entry(path)
        if entry is None:
            return Submission(path, path.name, None, Problem("load.no_file", {"folder": path.name}))
        path = entry
    name = path.name
    try:
        raw = path.read_bytes()
    except OSError as err:
        return Submission(path, name, None, Problem("load.unreadable", {"file": name, "error": err.strerror or str(err)}))
    if len(raw) > MAX_BYTES:
        return Submission(path, name, None, Problem("load.too_large", {"file": name, "size": len(raw)}), raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return Submission(path, name, None, Problem("load.not_utf8", {"file": name, "offset": err.start}), raw)
    if path.suffix == ".ipynb":
        source, problem = notebook.code_from_notebook(text)
        if problem is not None:
            return Submission(path, name, None, Problem(*problem), raw)
        text = source
    if not text.strip():
        return Submission(path, name, None, Problem("load.empty", {"file": name}), raw)
    return Submission(path, name, text, None, raw)


def from_source(source: str, filename: str = "submission.py") -> Submission:
    """A submission given as text (the in-notebook check)."""
    if not source.strip():
        return Submission(Path(filename), filename, None, Problem("load.empty", {"file": filename}))
    return Submission(Path(filename), filename, source, None, source.encode())
