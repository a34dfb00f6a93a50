"""Static inspection of a submission: which operations the entry function can reach, and its definitions.

Pure `ast`, no torch: it runs in the supervisor (for the static checks) and in every rank (to load
only the submission's definitions, never its top-level launch calls such as `test_distributed()`).
An operation is reached through any form that names it (comm.API_NAMES): an attribute, an alias, a
from-import, `getattr(module, "name")`, `functools.partial(...)`, a lambda, a helper function or
method of the submission, functional collectives, `torch.distributed.nn.functional`, the
`_into_tensor` / `_single` / `_base` variants, or a process group's own method. Dead code (`if False:`,
code after `return`) counts for nothing.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import NamedTuple

from ..comm import API_NAMES, PRELOAD_WITH

ENTRY = "run_worker"
# Process-group methods whose names say what they are (`send`, `reduce` ... are too common a word).
GROUP_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
                 "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
                 "reduce_scatter_tensor_coalesced": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
                 "alltoall": "all_to_all", "alltoall_base": "all_to_all"}
# Calls that start processes: a top-level assignment that makes one is a launch, not a definition.
LAUNCHERS = {"spawn", "start_processes", "Process", "Popen", "system", "fork", "run", "call",
             "check_call", "check_output", "launch", "elastic_launch"}


@dataclass
class StaticReport:
    """What the supervisor learns from the source alone."""
    has_entry: bool = False
    entry_line: int | None = None
    entry_params: int = 0
    reached: dict[str, list[int]] = field(default_factory=dict)  # operation -> lines of reaching references
    todo_left: bool = False          # the entry function still raises NotImplementedError (the stub)
    torch_modules: list[str] = field(default_factory=list)  # torch modules the submission names (preloaded)
    self_checks: bool = False        # the entry function (or code it reaches) asserts or raises on its own


def _const_truth(test: ast.expr) -> bool | None:
    """The truth of an `if` test that is a literal constant (`if False:`), else None."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _const_truth(test.operand)
        return None if inner is None else not inner
    return None


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


class _Scope:
    """Names bound by imports or plain aliases (`d = torch.distributed`), mapped to qualified names."""

    def __init__(self, parent: _Scope | None = None):
        self.names: dict[str, str] = {}
        self.parent = parent

    def lookup(self, name: str) -> str | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None

    def qualify(self, node: ast.expr) -> str | None:
        parts = _dotted(node)
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


def _live_statements(body: list[ast.stmt]):
    """Statements of a block that can run: skips `if False:` bodies and code after return/raise."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            truth = _const_truth(stmt.test)
            if truth is None:
                yield stmt
            else:
                yield from _live_statements(stmt.body if truth else stmt.orelse)
            continue
        if isinstance(stmt, ast.While) and _const_truth(stmt.test) is False:
            yield from _live_statements(stmt.orelse)
            continue
        yield stmt
        if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
            return


def _live_nodes(node: ast.AST):
    """Every node below `node` that can run, pruning statically dead branches."""
    if isinstance(node, (ast.If, ast.While)) and _const_truth(node.test) is not None:
        return  # handled by _live_statements of the enclosing block
    yield node
    for name, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            for stmt in _live_statements(value):
                yield from _live_nodes(stmt)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield from _live_nodes(item)
        elif isinstance(value, ast.AST):
            if isinstance(node, ast.IfExp) and name in ("body", "orelse"):
                truth = _const_truth(node.test)
                if truth is not None and (name == "body") != truth:
                    continue
            yield from _live_nodes(value)


def _is_not_implemented_raise(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def inspect_source(tree: ast.Module, entry_name: str = ENTRY) -> StaticReport:
    """Find the entry function and the operations it reaches, also through the submission's own code."""
    report = StaticReport()
    module_scope = _Scope()
    functions: dict[str, ast.AST] = {}
    for stmt in _live_statements(tree.body):
        module_scope.bind(stmt)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            functions[stmt.name] = stmt
    report.torch_modules = _torch_modules(tree)
    entry = functions.get(entry_name)
    if not isinstance(entry, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return report
    report.has_entry = True
    report.entry_line = entry.lineno
    report.entry_params = len(entry.args.posonlyargs) + len(entry.args.args)
    report.todo_left = any(_is_not_implemented_raise(s) for s in _live_statements(entry.body))

    reached: dict[str, set[int]] = {}
    visited: set[int] = set()
    module_values = _values_reaching(list(_live_statements(tree.body)), module_scope)

    def walk(fn: ast.AST, parent_scope: _Scope) -> None:
        if id(fn) in visited:
            return
        visited.add(id(fn))
        scope = _Scope(parent_scope)
        local_defs: dict[str, ast.AST] = {}
        nodes = list(_live_nodes(fn))
        for node in nodes:
            if isinstance(node, ast.stmt) and node is not fn:
                scope.bind(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn:
                local_defs[node.name] = node
        local_values = _values_reaching([n for n in nodes if isinstance(n, ast.stmt) and n is not fn], scope)
        for node in nodes:
            if _checks_itself(node):
                report.self_checks = True
            op = _names_op(node, scope)
            if op is not None:
                reached.setdefault(op, set()).add(node.lineno)
            # a name bound to something that reaches an operation (`reduce = functools.partial(dist.all_reduce)`)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                for op in local_values.get(node.id) or module_values.get(node.id, ()):
                    reached.setdefault(op, set()).add(node.lineno)
            # A reference to a function of the submission (called, or passed as a callback) reaches it.
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                target = local_defs.get(node.id) or functions.get(node.id)
                if target is not None and target is not fn:
                    walk(target, scope if node.id in local_defs else module_scope)

    walk(entry, module_scope)
    report.reached = {name: sorted(lines) for name, lines in reached.items() if lines}
    return report


def _values_reaching(statements: list, scope: _Scope) -> dict[str, set[str]]:
    """Names assigned a value that names an operation: a partial, a lambda, a dict of collectives ..."""
    out: dict[str, set[str]] = {}
    for stmt in statements:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            ops = {op for sub in ast.walk(stmt.value) if (op := _names_op(sub, scope)) is not None}
            if ops:
                out.setdefault(stmt.targets[0].id, set()).update(ops)
    return out


def _names_op(node: ast.AST, scope: _Scope) -> str | None:
    """The operation a node names: a reference to a public API (any use: a call, a callback, a partial),
    `getattr(module, "name")` with a constant, or a process group's own method."""
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
        qualified = scope.qualify(node)
        if qualified in API_NAMES:
            return API_NAMES[qualified]
        if isinstance(node, ast.Attribute) and node.attr in GROUP_METHODS:
            return GROUP_METHODS[node.attr]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        base = scope.qualify(node.args[0])
        if base is not None:
            return API_NAMES.get(f"{base}.{node.args[1].value}")
    return None


def _checks_itself(node: ast.AST) -> bool:
    """An assert, a raise (other than the stub's NotImplementedError) or an assert_* call (assert_close,
    assert_allclose ...): code that may stop on values a perturbed run changes."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Raise):
        return not _is_not_implemented_raise(node)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name.startswith("assert")
    return False


def _torch_modules(tree: ast.Module) -> list[str]:
    """torch modules the submission imports or names (`torch.distributed._functional_collectives`,
    `dist.nn.functional`): the zygote imports them before forking the ranks."""
    found: set[str] = set()
    aliases = _Scope()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases.bind(node)
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(n for n in names if n.startswith("torch."))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                found.update(f"{node.module}.{a.name}" for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            qualified = aliases.qualify(node)
            if qualified and qualified.startswith("torch."):
                parts = qualified.split(".")
                found.update(".".join(parts[:k]) for k in range(2, len(parts)))
    for name in list(found):
        found.update(PRELOAD_WITH.get(name, ()))
    return sorted(found)[:48]


# ---------------------------------------------------------------------------------------------
# Definitions only: what a rank executes of the submission.

def _calls_in(node: ast.AST) -> list[str]:
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            parts = _dotted(sub.func)
            if parts:
                names.append(parts[-1])
    return names


def _is_main_guard(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test))


def _keep(stmt: ast.stmt, own_functions: set[str]) -> ast.stmt | None:
    """The statement as a rank should run it, or None when it is a launch or other top-level action."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = stmt.value
        if value is None:
            return stmt
        called = _calls_in(value)
        if any(name in own_functions or name in LAUNCHERS for name in called):
            return None
        return stmt
    if isinstance(stmt, ast.If):
        if _is_main_guard(stmt.test):
            return None
        return _with_bodies(stmt, own_functions, ("body", "orelse"))
    if isinstance(stmt, ast.Try):
        return _with_bodies(stmt, own_functions, ("body", "orelse", "finalbody"), handlers=True)
    if isinstance(stmt, ast.With):
        return _with_bodies(stmt, own_functions, ("body",))
    return None  # bare expressions (calls), loops, asserts, raises ...


def _filter_block(body: list[ast.stmt], own_functions: set[str]) -> list[ast.stmt]:
    return [k for k in (_keep(s, own_functions) for s in body) if k is not None]


def _with_bodies(stmt, own_functions, fields, handlers=False):
    for name in fields:
        block = getattr(stmt, name)
        if block:
            kept = _filter_block(block, own_functions)
            if name == "body" and not kept:
                kept = [ast.copy_location(ast.Pass(), block[0])]
            setattr(stmt, name, kept)
    if handlers:
        for handler in stmt.handlers:
            handler.body = _filter_block(handler.body, own_functions) or [ast.copy_location(ast.Pass(), handler)]
    return stmt


def definitions_only(tree: ast.Module) -> ast.Module:
    """The module keeping imports, functions, classes and constants, not launch calls. Filters `tree` in
    place (callers pass a fresh parse: a deep copy costs a rank more than the parse itself)."""
    own = {s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    tree.body = _filter_block(tree.body, own)
    return tree


# ---------------------------------------------------------------------------------------------
# Diagnostics: mistakes visible in the source (used only to explain a failed check).

def assigned_results(tree: ast.Module) -> list[tuple[str, int]]:
    """Operations of torch.distributed whose return value is assigned (`t = dist.all_reduce(t)`) without
    async_op=True: they work in place and return None, so the name ends up None. (operation, line) pairs."""
    scope = _Scope()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign)):
            scope.bind(node)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(node.value, ast.Call):
            continue
        call = node.value
        qualified = scope.qualify(call.func) or ""
        op = API_NAMES.get(qualified)
        if op is None or not qualified.startswith(("torch.distributed.all", "torch.distributed.reduce",
                                                   "torch.distributed.broadcast", "torch.distributed.distributed_c10d.")):
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue  # *args / **kwargs: cannot tell
        async_op = next((k.value for k in call.keywords if k.arg == "async_op"), None)
        if async_op is None and len(call.args) > 3:  # all_reduce(t, op, group, async_op)
            async_op = call.args[3]
        if async_op is None or isinstance(async_op, ast.Constant) and async_op.value is False:
            found.add((op, node.lineno))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Parsing: whatever the source holds, a problem for the student, never an exception for the grader.

MAX_TREE_DEPTH = 200  # deeper trees break recursive consumers (copy.deepcopy, compile) before any check runs


class Problem(NamedTuple):
    """Why a submission cannot be graded: a message catalog key and its values (load.Problem is this)."""
    key: str
    params: dict


def tree_depth(tree: ast.AST) -> int:
    """Nesting depth of an AST, measured without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_source(source: str, filename: str) -> tuple[ast.Module, None] | tuple[None, Problem]:
    """`ast.parse`, with every way parsing can fail on a student's text turned into a Problem: syntax errors,
    null bytes (ValueError), expressions nested too deep for the parser (RecursionError, MemoryError) or for
    the steps after it (a tree deeper than MAX_TREE_DEPTH)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as err:
        message = err.msg or str(err)
        if "too many nested" in message or "too complex" in message:
            return None, Problem("static.too_complex", {"line": err.lineno or "?", "message": message})
        return None, Problem("static.syntax_error", {"line": err.lineno or "?", "message": message})
    except ValueError as err:
        return None, Problem("static.syntax_error", {"line": "?", "message": str(err)[:200]})
    except RecursionError as err:
        return None, Problem("static.too_complex", {"line": "?", "message": str(err)[:200]})
    except MemoryError:
        return None, Problem("static.parse_memory", {})
    depth = tree_depth(tree)
    if depth > MAX_TREE_DEPTH:
        line = max((getattr(n, "lineno", 0) for n in ast.walk(tree)), default="?")
        return None, Problem("static.too_complex", {"line": line, "message": f"nesting depth {depth} > {MAX_TREE_DEPTH}"})
    return tree, None
