"""What names stand for and which code can run, in one module of a submission (pure `ast`).

`Scope` maps the names that imports and plain aliases bind (`d = torch.distributed`) to qualified names;
`live_statements` / `live_nodes` skip what can never run (`if False:` bodies, code after `return`), which
counts for nothing in the static checks.
"""
from __future__ import annotations

import ast

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Calls that return their first argument wrapped, never calling it (`step = torch.compile(step)`,
# `sync = functools.partial(sync_grads, group=g)`): the name they bind stands for the function they wrap.
WRAPPERS = frozenset({"torch.compile", "torch.compiler.disable", "torch._dynamo.disable", "functools.partial",
                      "functools.cache", "functools.lru_cache"})


def const_truth(test: ast.expr) -> bool | None:
    """The truth of an `if` test that is a literal constant (`if False:`), else None."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = const_truth(test.operand)
        return None if inner is None else not inner
    return None


def dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


class Scope:
    """Names bound by imports or plain aliases (`d = torch.distributed`), mapped to qualified names."""

    def __init__(self, parent: Scope | None = None):
        self.names: dict[str, str] = {}
        self.parent = parent
        self.defined: set[str] = parent.defined if parent is not None else set()   # the module's own functions

    def lookup(self, name: str) -> str | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None

    def qualify(self, node: ast.expr) -> str | None:
        parts = dotted(node)
        if not parts:
            return None
        base = self.lookup(parts[0])
        if base is None:
            return None
        return ".".join([base, *parts[1:]])

    def bind(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    self.names[alias.asname] = alias.name
                else:  # `import torch.distributed` binds `torch`
                    top = alias.name.split(".")[0]
                    self.names[top] = top
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            for alias in stmt.names:
                self.names[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            qualified = self.qualify(stmt.value)
            if qualified is not None:
                self.names[stmt.targets[0].id] = qualified


def unwrapped(value: ast.AST, scope: Scope) -> ast.AST:
    """What calls of WRAPPERS wrap, however deep (`torch.compile(functools.partial(step, g))`: `step`); the
    expression itself when it is no such call."""
    while isinstance(value, ast.Call) and value.args and scope.qualify(value.func) in WRAPPERS:
        value = value.args[0]
    return value


def live_statements(body: list[ast.stmt]):
    """Statements of a block that can run: skips `if False:` bodies and code after return/raise."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            truth = const_truth(stmt.test)
            if truth is None:
                yield stmt
            else:
                yield from live_statements(stmt.body if truth else stmt.orelse)
            continue
        if isinstance(stmt, ast.While) and const_truth(stmt.test) is False:
            yield from live_statements(stmt.orelse)
            continue
        yield stmt
        if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
            return


def live_nodes(node: ast.AST, stop: tuple = ()):
    """Every node below `node` that can run, pruning statically dead branches; nodes of the `stop` types
    are yielded but not entered (the top level of a module without its functions' bodies)."""
    if isinstance(node, (ast.If, ast.While)) and const_truth(node.test) is not None:
        return  # handled by live_statements of the enclosing block
    yield node
    if stop and isinstance(node, stop):
        return
    for name, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            for stmt in live_statements(value):
                yield from live_nodes(stmt, stop)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield from live_nodes(item, stop)
        elif isinstance(value, ast.AST):
            if isinstance(node, ast.IfExp) and name in ("body", "orelse"):
                truth = const_truth(node.test)
                if truth is not None and (name == "body") != truth:
                    continue
            yield from live_nodes(value, stop)


def raises_not_implemented(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def bound_names(stmt: ast.AST) -> set[str]:
    """The names a statement binds where it runs (not inside its functions, lambdas or comprehensions)."""
    names: set[str] = set()
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        if isinstance(node, DEFS) and node is not stmt:
            names.add(node.name)
            continue
        if node is not stmt and isinstance(node, DEFS + (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                                          ast.GeneratorExp)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    if isinstance(stmt, DEFS):
        names.add(stmt.name)
    return names
