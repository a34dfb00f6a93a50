"""The layers, as docs/design.md states them: the rank side imports nothing from verification or the switch (the
perturbation lives with the switch, in the supervisor), feedback imports no process module, and the wire
types both sides use are one module."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "grader"
RANK_SIDE = ("processes/rank.py", "processes/backend.py", "processes/channel.py", "processes/values.py",
             "processes/real.py", "processes/bench_rank.py")


def _imports(path: Path) -> set[str]:
    """The grader modules a module imports (absolute names), at any depth of its code."""
    package = "grader." + ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if module.startswith("grader"):
                out.add(module)
                out.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("grader"))
    return out


def _file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    if not parts:
        return ROOT / "__init__.py"
    rel = Path(*parts)
    for candidate in (ROOT / rel.with_suffix(".py"), ROOT / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _reachable(start: list[str]) -> set[str]:
    seen, todo = set(), [f"grader.{p[:-3].replace('/', '.')}" for p in start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _file(module)
        if path is not None:
            todo += [m for m in _imports(path) if _file(m) is not None]
    return seen


def test_the_rank_side_imports_nothing_from_verification_or_the_switch():
    reached = _reachable(list(RANK_SIDE))
    assert "grader.wire" in reached                     # the one module of wire types, shared
    assert not {m for m in reached if m.startswith(("grader.verify", "grader.switch"))}, sorted(reached)


def test_feedback_imports_no_process_module():
    for path in (ROOT / "feedback").glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("grader.processes")}, path.name
