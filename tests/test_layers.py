"""The layers, as docs/design.md states them: the rank side imports nothing from verification or the switch (the
perturbation lives with the switch, in the supervisor), feedback and verification import no process module,
the wire types both sides use are one module, and so are a run's records. And the package's shape: no import
cycle, no file over MAX_LINES lines."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "grader"
RANK_SIDE = ("processes/rank.py", "processes/hooks.py", "processes/guard.py", "processes/backend.py",
             "processes/channel.py", "processes/values.py", "processes/real.py", "processes/bench_rank.py")


MAX_LINES = 500   # a module read in one sitting


def _imports(path: Path) -> set[str]:
    """The grader modules a module imports (absolute names), at any depth of its code."""
    package = ".".join(("grader",) + path.relative_to(ROOT).parts[:-1])
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
    for path in (ROOT / "feedback").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("grader.processes")}, path.name


def test_verification_imports_no_process_module():
    """Policy is judged on records (grader/records.py), never by loading the supervisor: not from a module of
    verify/ at any depth of its code, nor through anything those modules import."""
    for path in (ROOT / "verify").glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("grader.processes")}, path.name
    reached = _reachable([str(p.relative_to(ROOT)) for p in (ROOT / "verify").glob("*.py")])
    assert "grader.records" in reached
    assert not {m for m in reached if m.startswith("grader.processes")}, sorted(reached)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("grader",) + (parts[:-1] if parts[-1] == "__init__" else parts))


def _edges(path: Path) -> set[str]:
    """The grader modules a module's imports execute (module-level and inside functions alike): for
    `from a.b import c`, a.b.c where c is a module, a.b where it is a name defined there, and the packages
    above it (Python runs a package before its modules). Its own packages are left out: they are begun
    before it (`from . import x` finds its package there)."""
    me = _module(path)
    out = set()
    for name in _imports(path):
        target = _file(name)
        if target is None:
            continue
        parts = _module(target).split(".")
        out.update(".".join(parts[:n]) for n in range(2, len(parts) + 1))
    return {m for m in out if not f"{me}.".startswith(f"{m}.")}


def test_no_import_cycle():
    graph = {_module(path): _edges(path) for path in ROOT.rglob("*.py")}
    # Tarjan's strongly connected components: a component of more than one module is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "; ".join(" <-> ".join(c) for c in cycles)


def test_no_file_over_the_size_limit():
    """Every file of the package, code or not, holds one idea at a readable size."""
    long = {}
    for path in ROOT.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            lines = len(path.read_bytes().splitlines())
            if lines > MAX_LINES:
                long[str(path.relative_to(ROOT))] = lines
    assert not long, ", ".join(f"{name}: {n}" for name, n in sorted(long.items()))
