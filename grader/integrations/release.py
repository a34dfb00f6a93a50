"""Student versions from instructor versions: solution regions replaced by the stub line.

    python -m grader.integrations.release --all          # every exercise: solutions/<name>/<name>.py -> assignments/
    python -m grader.integrations.release SRC DST        # one file

Same markers and the same stub text as nbgrader's ClearSolutions (see nbgrader_config.py), so the .py
and the notebook release agree; tests/test_release.py proves the committed stubs are generated.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("请先完成这里的 TODO / complete the TODO here first")'


def clear_solutions(source: str, stub: str = STUB) -> str:
    out, inside = [], False
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
            indent = re.match(r"\s*", line).group(0)
            out.append(indent + stub + "\n")
        elif stripped == END:
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "".join(out)


def release_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(clear_solutions(source.read_text(encoding="utf-8")), encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--all"]:
        from ..exercise import registry
        from ..feedback.messages import default_lang, render
        broken = registry.broken()
        for err in broken.values():   # an exercise that does not load is never skipped quietly
            print(render(err.key, err.params, default_lang()), file=sys.stderr)
        if broken:
            return 1
        for name, exercise in sorted(registry.available().items()):
            source = Path(exercise.folder) / f"{name}.py"
            if source.is_file():
                release_file(source, registry.ROOT / "assignments" / name / f"{name}.py")
        return 0
    release_file(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
