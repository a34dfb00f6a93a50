"""The students of a class folder: one per entry, read with lstat only.

Each entry is one student: `alice.py`, `bob.ipynb`, or a folder `carol/` holding one submission (nbgrader's
submitted/<student>/<assignment>/ works as is). A symbolic link is never followed (not to a classmate's
file, not out of the folder, not into a loop); one file under two names (hard links) is graded once; an entry
that cannot be graded at all keeps a row that says why. Results files get a name that is safe for any legal
entry name.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ...submission import load as loader
from ..gradebook import printable


@dataclass
class Student:
    name: str
    path: Path
    digest: str = ""
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    problem: tuple[str, dict] | None = None   # cannot be graded at all (a symbolic link ...): its row says why


SAFE_NAME = re.compile(r"[\w][\w.\-]*")
MAX_RESULT_NAME = 120  # bytes of a results file's name; any legal entry name (up to 255 bytes) fits
NAME_COLUMNS = 32      # the widest student name the terminal summary shows whole


def results_name(student: str) -> str:
    """OUT/<this>: `<student>.json` when the name is plain and short; otherwise a readable part of it plus a
    hash of the whole name, so that every legal name (newlines, escapes, 255 bytes, undecodable bytes) maps to
    a distinct, harmless file name that write_atomic's temporary names can extend."""
    if SAFE_NAME.fullmatch(student) and len(os.fsencode(student)) <= MAX_RESULT_NAME - 5 and student.isprintable():
        return f"{student}.json"
    digest = hashlib.sha256(os.fsencode(student)).hexdigest()[:16]
    readable = re.sub(r"[^\w.\-]+", "_", os.fsencode(student).decode("utf-8", "replace")).strip("._-")
    while len(readable.encode()) > 48:
        readable = readable[:-1]
    return f"{readable}-{digest}.json" if readable else f"{digest}.json"


def timeline_name(student: str) -> str:
    """OUT/<this>: the page of the student's visible run, named after its results file."""
    return results_name(student)[:-len(".json")] + ".timeline.html"


def _student_name(entry_name: str, is_dir: bool) -> str | None:
    """The student an entry of the class folder stands for, or None when it does not look like one."""
    if is_dir:
        return entry_name
    suffix = os.path.splitext(entry_name)[1]
    return entry_name[: -len(suffix)] if suffix in loader.SUFFIXES and entry_name[: -len(suffix)] else None


def discover(folder: Path, out: Path) -> tuple[list[Student], list[str]]:
    """Students in `folder`, sorted by name; and what was skipped, with why. Reads the folder with lstat
    only: nothing here follows a symbolic link or opens a file."""
    students, skipped, seen, inodes = [], [], {}, {}
    try:
        out_id = os.stat(out)
        out_key = (out_id.st_dev, out_id.st_ino)
    except OSError:
        out_key = None
    try:
        entries = sorted(os.scandir(folder), key=lambda e: os.fsencode(e.name))
    except OSError as err:
        raise SystemExit(f"cannot read the class folder {folder}: {err.strerror or err}")
    for entry in entries:
        name = entry.name
        shown = printable(name)
        if name.startswith("."):
            skipped.append(f"{shown} (hidden)")
            continue
        if name.startswith("__"):
            skipped.append(f"{shown} (starts with __: Python's own, such as __pycache__)")
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as err:
            student = _student_name(name, False) or name
            students.append(Student(student, Path(entry.path), problem=("load.unreadable", {"file": shown, "error": err.strerror or str(err)})))
            continue
        if (st.st_dev, st.st_ino) == out_key:
            skipped.append(f"{shown} (the output folder)")
            continue
        if stat.S_ISLNK(st.st_mode):
            student = _student_name(name, not os.path.splitext(name)[1])
            if student is None:
                skipped.append(f"{shown} (a symbolic link: not followed)")
                continue
            problem = ("load.symlink", {"file": shown})
        elif stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            student = _student_name(name, stat.S_ISDIR(st.st_mode))
            if student is None:
                skipped.append(f"{shown} (not a .py, .ipynb or folder)")
                continue
            problem = None
            if stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in inodes:
                    skipped.append(f"{shown} (the same file as {printable(inodes[key])}: a hard link, graded once)")
                    continue
                inodes[key] = name
        else:
            student = _student_name(name, False)
            if student is None:
                skipped.append(f"{shown} (not a regular file or folder)")
                continue
            problem = ("load.not_a_file", {"file": shown, "kind": "FIFO" if stat.S_ISFIFO(st.st_mode) else "special file"})
        if student in seen or student == "grades":
            taken = printable(seen.get(student, "grades.csv"))
            skipped.append(f"{shown} (student {printable(student)!r} already taken by {taken})")
            continue
        seen[student] = name
        students.append(Student(student, Path(entry.path), problem=problem))
    by_result = {}
    for student in students:  # distinct students never share a results file (hashed names, in theory)
        by_result.setdefault(results_name(student.name), []).append(student)
    clashes = {id(s) for group in by_result.values() for s in group[1:]}
    for student in [s for s in students if id(s) in clashes]:
        skipped.append(f"{printable(student.path.name)} (its results file name is taken by another student)")
    students = [s for s in students if id(s) not in clashes]
    return sorted(students, key=lambda s: os.fsencode(s.name)), skipped
