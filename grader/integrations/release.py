"""Student versions from instructor versions: solution regions replaced by the stub line.

    python -m grader.integrations.release --check        # every exercise's solution .py and notebook: refused if it would leak
    python -m grader.integrations.release --all          # every exercise: solutions/<name>/<name>.py -> assignments/
    python -m grader.integrations.release SRC DST        # one file

Same markers and the same stub text as nbgrader's ClearSolutions (see nbgrader_config.py), so the .py
and the notebook release agree; tests/test_release.py proves the committed stubs are generated.

A release never hands out an answer: a solution with no solution region, a marker the release would not
recognise (so the stub would still hold its region), an unbalanced region, or a notebook with no solution
cell and no region (nbgrader would release it as it is), is refused with its file and line, and nothing is written
(`make release` runs --check before nbgrader, and --all checks every file before it writes one).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("请先完成这里的 TODO / complete the TODO here first")'
# a line that means a marker however it is spelt or placed: `#BEGIN SOLUTION`, `### begin solution  (a)`, `x = 1  ### END SOLUTION`
MARKER_LIKE = re.compile(r"#\s*(BEGIN|END)\s+SOLUTION", re.I)
# the same for nbgrader's hidden tests in a notebook's grade cells: a misspelt one releases the hidden check
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
HIDDEN_LIKE = re.compile(r"#\s*(BEGIN|END)\s+HIDDEN\s+TESTS?", re.I)


class Refused(ValueError):
    """A release that would leak: `key` and `params` make the message (grader/feedback/messages.py)."""

    def __init__(self, key: str, **params):
        super().__init__(f"{key}: {params}")
        self.key, self.params = key, {"begin": BEGIN, "end": END, **params}


def _where(path, line: int, cell: int | None = None):
    if cell is None:
        return f"{path}:{line}"
    from ..model import Words   # (numpy, through the exercise spec: nbgrader_config.py imports STUB alone)
    return Words(f"{path} 第 {cell} 个单元格第 {line} 行", f"{path}, cell {cell}, line {line}")


def clear_solutions(source: str, stub: str = STUB, path: str = "<source>", cell: int | None = None,
                    required: bool = True) -> str:
    """The source with each solution region replaced by the stub line, at the region's indentation.
    `required`: a source with no region at all is refused (it would be released whole)."""
    out, opened, regions = [], None, 0
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if opened:
                raise Refused("release.nested", where=_where(path, number, cell), opened=opened)
            opened, regions = number, regions + 1
            indent = re.match(r"\s*", line).group(0)
            out.append(indent + stub + "\n")
        elif stripped == END:
            if not opened:
                raise Refused("release.unopened", where=_where(path, number, cell))
            opened = None
        elif MARKER_LIKE.search(line):
            raise Refused("release.stray_marker", where=_where(path, number, cell), text=stripped,
                          marker=BEGIN if "BEGIN" in line.upper() else END)
        elif not opened:
            out.append(line)
    if opened:
        raise Refused("release.unclosed", where=_where(path, opened, cell))
    if required and not regions:
        raise Refused("release.no_region", where=_where(path, _first_definition(source), cell))
    return "".join(out)


def _first_definition(source: str) -> int:
    """Where the answer would go out whole: the first function a file defines (else its first line)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 1
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return min(lines, default=1)


def check_notebook(path: Path) -> None:
    """A source notebook nbgrader would release with an answer in it: a marker its ClearSolutions would not
    recognise, or no solution anywhere (no solution cell, no region: nbgrader releases every cell as it is).
    Cells are counted as the notebook shows them, every cell."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    answers = 0
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", []))
        clear_solutions(source, path=str(path), cell=number, required=False)
        for line_number, line in enumerate(source.splitlines(), 1):
            if HIDDEN_LIKE.search(line) and line.strip() not in HIDDEN:
                raise Refused("release.stray_marker", where=_where(path, line_number, number), text=line.strip(),
                              marker=HIDDEN[0] if "BEGIN" in line.upper() else HIDDEN[1])
        answers += bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution")) or BEGIN in source
    if not answers:
        raise Refused("release.no_region", where=str(path))


def release_file(source: Path, target: Path) -> None:
    stub = clear_solutions(source.read_text(encoding="utf-8"), path=str(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(stub, encoding="utf-8")


def _exercises() -> list[tuple[str, Path, Path]]:
    """(name, solution .py, source notebook) of every exercise; an exercise that does not load is an
    error (never skipped quietly)."""
    from ..exercise import registry   # here, as below: nbgrader_config.py imports this module for STUB alone
    broken = registry.broken()
    if broken:
        raise next(iter(broken.values()))
    return [(name, Path(ex.folder) / f"{name}.py", Path(ex.folder) / f"{name}.ipynb")
            for name, ex in sorted(registry.available().items())]


def _check_all() -> list[tuple[Path, Path]]:
    """Every exercise's sources checked; the (.py, its stub) pairs to write."""
    from ..exercise import registry   # (nbgrader's configuration loads no exercise)
    pairs = []
    for name, py, notebook in _exercises():
        if py.is_file():
            clear_solutions(py.read_text(encoding="utf-8"), path=str(py))
            pairs.append((py, registry.ROOT / "assignments" / name / f"{name}.py"))
        if notebook.is_file():
            check_notebook(notebook)
    return pairs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader.integrations.release",
                                     description="Student versions of the solutions: each ### BEGIN SOLUTION region "
                                                 "becomes the stub line. A solution that would leak is refused.")
    parser.add_argument("--all", action="store_true", help="every exercise: solutions/<name>/<name>.py -> assignments/<name>/")
    parser.add_argument("--check", action="store_true",
                        help="check every exercise's solution .py and source notebook, write nothing (make release runs it "
                             "before nbgrader)")
    parser.add_argument("files", nargs="*", metavar="SRC DST", help="one solution file and the stub to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..exercise.registry import ExerciseError   # (nbgrader's configuration loads no exercise, nor the catalog)
    from ..feedback.messages import default_lang, render
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.all + args.check + bool(args.files) != 1 or (args.files and len(args.files) != 2):
        parser.error("give --all, --check, or SRC DST")
    try:
        if args.files:
            release_file(Path(args.files[0]), Path(args.files[1]))
            return 0
        pairs = _check_all()
        if args.all:
            for source, target in pairs:
                release_file(source, target)
        return 0
    except (Refused, ExerciseError) as err:
        print(render(err.key, err.params, default_lang()), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
