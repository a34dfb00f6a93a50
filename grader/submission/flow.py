"""Where a value named in the source goes, for the static check (static.py). Pure `ast`, no torch.

Two questions the static check asks of one scope (a function it walks, with everything nested in it):
  - `strings(expr)`: the constant strings an expression may hold: `"all_reduce"`, a name bound to one
    (`NAME = "all_reduce"`, `for name in ("all_reduce", ...)`), a dict literal of constant strings
    subscripted by a constant key (`OPS["feat"]`, `OPS.get("feat")`), `"all_" + "reduce"`. That is what
    `getattr(dist, ...)` names.
  - `used(node)`: whether the value of a reference is used: called, passed to a call (a callback,
    `functools.partial`, `map`, a helper's parameter), returned or yielded, a decorator, a base class or a
    default value, entered by `with`; or held in a list, tuple, dict, conditional expression ... whose value
    is used so (a method of a container, `OPS.get("k")(...)`, passes on what it returns), or computed with (`@`, `+`,
    a comparison, an index: `Copy.apply(x) @ w`); or bound to a name (an
    assignment, a `for` target, `:=`) that is used so. Stored on an attribute or as a class attribute counts
    as used (what reads it back is not followed).
A bare reference is not used: `f = dist.reduce_scatter_tensor` with `f` never used, or `dist.all_reduce` as
a statement of its own.
"""
from __future__ import annotations

import ast

HELD_IN = (ast.List, ast.Tuple, ast.Set, ast.Starred, ast.BoolOp)   # the value goes on to the parent's value
RETURNED = (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Lambda, ast.withitem, ast.keyword,
            ast.arguments, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # returned, entered, passed ...
COMPUTED_WITH = (ast.BinOp, ast.UnaryOp, ast.Compare)   # `Fn.apply(x) @ w`: what a call returned, computed with
MAX_STRINGS = 64   # constant strings one expression may hold (a product of concatenations stays small)


def parents(tree: ast.AST) -> dict[int, ast.AST]:
    """Each node's parent, by id."""
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def target_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`)."""
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def constant_key(node: ast.AST, parent_of) -> str | None:
    """The constant key a loaded name is read with: `D["k"]` or `D.get("k", ...)`, else None."""
    parent = parent_of(node)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return _const(parent.slice)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parent_of(parent)
        if isinstance(call, ast.Call) and call.func is parent and call.args:
            return _const(call.args[0])
    return None


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class Flow:
    """Answers for one scope: `nodes` are its live nodes (scope.live_nodes), `outer` the module's Flow."""

    def __init__(self, nodes: list[ast.AST], parent_map: dict[int, ast.AST], outer: Flow | None = None):
        self.parent_map, self.outer = parent_map, outer
        self.loads: dict[str, list[ast.Name]] = {}
        self.consts: dict[str, set[str]] = {}          # NAME -> the constant strings bound to it
        self.sequences: dict[str, set[str]] = {}       # NAMES -> the strings of the tuple or list bound to it
        self.tables: dict[str, dict[str, set[str]]] = {}   # OPS -> {constant key: constant strings}
        self._visiting: set[tuple[str, str | None]] = set()
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.setdefault(node.id, []).append(node)
        for node in nodes:
            self._bind_constants(node)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parent_map.get(id(node))

    # -- constant strings ----------------------------------------------------------------------------
    def _bind_constants(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in (t.id for t in targets if isinstance(t, ast.Name)):
                value = node.value
                if isinstance(value, ast.Dict):
                    table = self.tables.setdefault(name, {})
                    for key, item in zip(value.keys, value.values):
                        if key is not None and _const(key) is not None and self.strings(item):
                            table.setdefault(_const(key), set()).update(self.strings(item))
                elif isinstance(value, (ast.Tuple, ast.List, ast.Set)):
                    self.sequences.setdefault(name, set()).update(*(self.strings(e) for e in value.elts))
                elif self.strings(value):
                    self.consts.setdefault(name, set()).update(self.strings(value))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name):
            found = self.items(node.iter)
            if found:
                self.consts.setdefault(node.target.id, set()).update(found)

    def items(self, node: ast.AST) -> set[str]:
        """The constant strings a loop over `node` may bind: a literal tuple or list, or a name bound to one."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.strings(e) for e in node.elts))
        if isinstance(node, ast.Name):
            return set(self._lookup("sequences", node.id))
        return set()

    def strings(self, node: ast.AST) -> set[str]:
        """The constant strings `node` may hold (empty: unknown)."""
        if _const(node) is not None:
            return {node.value}
        if isinstance(node, ast.Name):
            return set(self._lookup("consts", node.id))
        base = node.value if isinstance(node, ast.Subscript) else getattr(getattr(node, "func", None), "value", None)
        if isinstance(node, (ast.Subscript, ast.Call)) and isinstance(base, ast.Name):
            key = constant_key(base, self.parent)
            return set(self._lookup("tables", base.id).get(key, ())) if key is not None else set()
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.strings(node.left), self.strings(node.right)
            return {a + b for a in left for b in right} if len(left) * len(right) <= MAX_STRINGS else set()
        if isinstance(node, ast.IfExp):
            return self.strings(node.body) | self.strings(node.orelse)
        return set()

    def _lookup(self, kind: str, name: str):
        """What this scope, or else the module, binds `name` to (kind: consts, sequences or tables)."""
        flow: Flow | None = self
        while flow is not None:
            found = getattr(flow, kind).get(name)
            if found:
                return found
            flow = flow.outer
        return {}

    # -- whether a value is used ---------------------------------------------------------------------
    def used(self, node: ast.AST, key: str | None = None) -> bool:
        """Whether the value of `node` is used (see the module's docstring). `key`: the constant key under
        which a dict literal holds it, when the reference is one of its values."""
        child = node
        while True:
            parent = self.parent(child)
            if parent is None:
                return False
            if isinstance(parent, ast.Call) or isinstance(parent, RETURNED):
                return True                             # called, passed as an argument, returned ...
            if isinstance(child, ast.Call) and (isinstance(parent, COMPUTED_WITH)
                                                or isinstance(parent, ast.Subscript) and child is parent.slice):
                return True                             # what a method of it returned, computed with or an index
            if isinstance(parent, ast.Attribute):       # `held.get(...)`, `held.values()`: what the call returns goes on
                call = self.parent(parent)
                if not (isinstance(call, ast.Call) and call.func is parent):
                    return False                        # an attribute of it (`f.__name__`) is not it
                child = call
                continue
            if isinstance(parent, HELD_IN + (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                child = parent
                continue
            if isinstance(parent, ast.Dict):
                if child not in parent.values:
                    return False
                index = parent.values.index(child)
                key = key if key is not None else _const(parent.keys[index]) if parent.keys[index] else None
                child = parent
                continue
            if isinstance(parent, ast.IfExp) and child is not parent.test:
                child = parent
                continue
            if isinstance(parent, ast.Subscript) and child is parent.value:
                child, key = parent, None
                continue
            if isinstance(parent, ast.NamedExpr):
                if self.name_used(parent.target.id, key):
                    return True
                child = parent
                continue
            if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                if child is not parent.value:
                    return False
                if isinstance(self.parent(parent), ast.ClassDef):
                    return True                         # a class attribute, read back through the class
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                return any(self._target_used(t, key) for t in targets)
            if isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)) and child is parent.iter:
                return any(self.name_used(name) for name in target_names(parent.target))
            return False

    def _target_used(self, target: ast.AST, key: str | None) -> bool:
        if isinstance(target, ast.Name):
            return self.name_used(target.id, key)
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            return self.name_used(target.value.id)
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(self._target_used(e, None) for e in target.elts)
        if isinstance(target, ast.Starred):
            return self._target_used(target.value, None)
        return True                                     # an attribute: stored on an object

    def name_used(self, name: str, key: str | None = None) -> bool:
        """Whether some load of `name` in this scope is used; `key`: only loads that may read that key."""
        if (name, key) in self._visiting:
            return False
        self._visiting.add((name, key))
        try:
            for load in self.loads.get(name, ()):
                read = constant_key(load, self.parent)
                if key is not None and read is not None and read != key:
                    continue
                if self.used(load):
                    return True
            return False
        finally:
            self._visiting.discard((name, key))
