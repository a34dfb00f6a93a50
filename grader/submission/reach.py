"""What a reference reaches: the operations a node names (comm.API_NAMES, a process group's own method,
`getattr(module, NAME)` of constant strings), and the names bound to values that carry such a reference
(a partial, a lambda, a dict of collectives, a wrapper the submission's own function makes)."""
from __future__ import annotations

import ast

from ..comm import API_NAMES, GROUP_METHODS
from . import flow
from .scope import Scope, dotted


def bound_operations(statements: list, scope: Scope, here: flow.Flow, outer: dict | None = None) -> dict[str, dict]:
    """Names assigned a value that names an operation (a partial, a lambda, another such name, a dict of
    collectives), as {name: {constant key, or None for the whole value: operations}}."""
    out: dict[str, dict] = {}

    def ops_in(expr: ast.AST) -> set[str]:
        found: set[str] = set()
        for sub in ast.walk(expr):
            if not carried(sub, expr, here.parent, scope.defined):
                continue
            found |= ops_named(sub, scope, here)
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                bound = out.get(sub.id) or (outer or {}).get(sub.id)
                if bound:
                    found |= select(bound, flow.constant_key(sub, here.parent))
        return found

    for stmt in statements:
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        pairs = []
        for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            if isinstance(target, ast.Name):
                pairs.append((target.id, stmt.value))
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(stmt.value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(stmt.value.elts):
                pairs += [(t.id, v) for t, v in zip(target.elts, stmt.value.elts) if isinstance(t, ast.Name)]
        for name, value in pairs:
            items = zip(value.keys, value.values) if isinstance(value, ast.Dict) else [(None, value)]
            for key, item in items:
                ops = ops_in(item)
                if ops:
                    const = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
                    out.setdefault(name, {}).setdefault(const, set()).update(ops)
    return out


def carried(node: ast.AST, root: ast.AST, parent_of, own: set[str] = frozenset()) -> bool:
    """Whether the value bound to `root` holds `node` itself (not something computed from it): `node` is
    `root`, or sits in it inside a lambda, a container literal, a conditional expression, or as an argument
    of `functools.partial` or of one of the submission's own functions `own` (a wrapper it returns:
    `all_reduce = timed(dist.all_reduce)`)."""
    path, child = [], node
    while child is not root and child is not None:
        parent = parent_of(child)
        path.append((parent, child))
        child = parent
    if child is None or any(isinstance(parent, ast.Lambda) for parent, _ in path):
        return child is not None
    for parent, child in path:
        partial = isinstance(parent, ast.Call) and child is not parent.func and (
            (dotted(parent.func) or [""])[-1] == "partial" or isinstance(parent.func, ast.Name) and parent.func.id in own)
        if not (partial or isinstance(parent, flow.HELD_IN + (ast.keyword,))
                or isinstance(parent, ast.Dict) and child in parent.values
                or isinstance(parent, ast.IfExp) and child is not parent.test):
            return False
    return True


def select(bound: dict, key: str | None) -> set[str]:
    """The operations a bound value reaches when read with `key` (a dict literal's constant key), or all.
    Bucket None: a value that is not a dict literal, or its items under keys that are not constants."""
    if key is None:
        return set().union(*bound.values())
    return set(bound.get(key, ())) | set(bound.get(None, ()))


def ops_named(node: ast.AST, scope: Scope, here: flow.Flow) -> set[str]:
    """The operations a node names: a reference to a public API (comm.API_NAMES), a process group's own
    method, or `getattr(module, NAME)` where NAME holds constant strings (flow.Flow.strings)."""
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
        qualified = scope.qualify(node)
        if qualified in API_NAMES:
            return {API_NAMES[qualified]}
        if isinstance(node, ast.Attribute) and node.attr in GROUP_METHODS and node.attr not in scope.defined:
            return {GROUP_METHODS[node.attr]}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
        base, names = scope.qualify(node.args[0]), here.strings(node.args[1])
        ops = {API_NAMES.get(f"{base}.{name}") for name in names} if base is not None else set()
        own = {GROUP_METHODS[name] for name in names if name in GROUP_METHODS and name not in scope.defined}
        return (ops | own) - {None}
    return set()
