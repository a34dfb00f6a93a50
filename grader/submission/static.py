"""Static inspection of a submission: which operations the entry function can reach.

Pure `ast`, no torch: it runs in the supervisor (for the static checks); what a rank executes of the
submission's top level is definitions.py's.
An operation is reached through any form that names it (comm.API_NAMES): an attribute, an alias, a
from-import, `getattr(module, NAME)` where NAME holds a constant string (`"all_reduce"`, `OPS["feat"]` of a
dict literal, a constant-valued name), `functools.partial(...)`, a lambda, a helper function or method of
the submission, functional collectives, `torch.distributed.nn.functional`, the `_into_tensor` / `_single` /
`_base` variants, or a process group's own method. A reference counts when its value is used: called,
passed on, returned, held in a container or a name that is used (flow.py); `f = dist.reduce_scatter_tensor`
alone reaches nothing; `all_reduce = timed(dist.all_reduce)`, a wrapper the submission's own function makes,
reaches all_reduce. Dead code (`if False:`, code after `return`) counts for nothing. The entry function is
the submission's def, or what its own factory or wrapper makes (`run_worker = make_worker()`); in a notebook
it may live in a file one of its cells writes (`%%writefile dist_worker.py`, then `from dist_worker import
run_worker`, or `!python dist_worker.py`): `inspect_source(tree, entry, files=...)` follows it there
(`entry_origin`).
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from ..comm import API_NAMES, PRELOAD_OTHER, PRELOAD_WITH
from . import flow

ENTRY = "run_worker"
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Process-group methods whose names say what they are (`send`, `reduce` ... are too common a word), unless the
# submission defines a function of that name (its own class's `allreduce` method is not a process group's).
GROUP_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
                 "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
                 "reduce_scatter_tensor_coalesced": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
                 "alltoall": "all_to_all", "alltoall_base": "all_to_all"}


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
    entry_file: str | None = None    # the file a notebook cell writes that holds the entry function, if any


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
        self.defined: set[str] = parent.defined if parent is not None else set()   # the module's own functions

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


def _live_nodes(node: ast.AST, stop: tuple = ()):
    """Every node below `node` that can run, pruning statically dead branches; nodes of the `stop` types
    are yielded but not entered (the top level of a module without its functions' bodies)."""
    if isinstance(node, (ast.If, ast.While)) and _const_truth(node.test) is not None:
        return  # handled by _live_statements of the enclosing block
    yield node
    if stop and isinstance(node, stop):
        return
    for name, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            for stmt in _live_statements(value):
                yield from _live_nodes(stmt, stop)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield from _live_nodes(item, stop)
        elif isinstance(value, ast.AST):
            if isinstance(node, ast.IfExp) and name in ("body", "orelse"):
                truth = _const_truth(node.test)
                if truth is not None and (name == "body") != truth:
                    continue
            yield from _live_nodes(value, stop)


def _is_not_implemented_raise(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


class _Module:
    """One module of the submission (its own code, or a file a notebook cell writes): its imports and
    aliases, its top-level functions and classes, and what its top level binds."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        statements = list(_live_statements(tree.body))
        self.scope = _Scope()
        self.scope.defined = {node.name for node in ast.walk(tree)
                              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.functions: dict[str, ast.AST] = {}
        self.made: dict[str, ast.Call] = {}   # names last bound to what a function of its own returns
        for stmt in statements:
            self.scope.bind(stmt)
            if isinstance(stmt, DEFS):
                self.functions[stmt.name] = stmt
                self.made.pop(stmt.name, None)
            elif isinstance(stmt, ast.Assign):
                own = isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) \
                    and isinstance(self.functions.get(stmt.value.func.id), (ast.FunctionDef, ast.AsyncFunctionDef))
                for name in (n for t in stmt.targets for n in flow.target_names(t)):
                    if own and isinstance(stmt.targets[0], ast.Name):
                        self.made[name] = stmt.value
                    else:
                        self.made.pop(name, None)
        self.parents = flow.parents(tree)
        top = [node for stmt in statements for node in _live_nodes(stmt, stop=DEFS)]
        self.flow = flow.Flow(top, self.parents)
        self.values = _values([n for n in top if isinstance(n, ast.stmt)], self.scope, self.flow)

    def entry(self, name: str) -> tuple[ast.AST | None, list[ast.AST]]:
        """The function `name` is, and the functions to walk for what it reaches: its def; or, where the top
        level binds it to what a function of the submission returns, the function that one wraps
        (`run_worker = timed(_run_worker)`: it and the wrapper) or the function it defines and returns
        (`run_worker = make_worker()`: the factory, with everything it defines)."""
        call = self.made.get(name)
        if call is None:
            fn = self.functions.get(name)
            return (fn, [fn]) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else (None, [])
        factory = self.functions[call.func.id]
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            wrapped = self.functions.get(arg.id) if isinstance(arg, ast.Name) else None
            if isinstance(wrapped, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return wrapped, [wrapped, factory]
        nested = {n.name: n for n in ast.walk(factory)
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not factory}
        for node in _live_nodes(factory):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id in nested:
                return nested[node.value.id], [factory]
        return None, []


class _Program:
    """The submission and the files its notebook cells write (`%%writefile dist_worker.py`), each parsed
    when first needed."""

    def __init__(self, tree: ast.Module, files: dict[str, str] | None):
        self.main = _Module(tree)
        self.files = dict(files or {})
        self.modules = written_modules(self.files)
        self._parsed: dict[str, _Module | None] = {}

    def module(self, file: str) -> _Module | None:
        if file not in self._parsed:
            tree, _ = parse_source(self.files[file], file)
            self._parsed[file] = _Module(tree) if tree is not None else None
        return self._parsed[file]

    def lookup(self, qualified: str | None) -> tuple[_Module, str] | None:
        """(the written module, the name in it) of a qualified name such as `dist_worker.run_worker`."""
        found = _split(qualified, self.modules)
        module = self.module(found[0]) if found else None
        return (module, found[1]) if module is not None else None

    def torch_modules(self) -> list[str]:
        found = set(_torch_modules(self.main.tree))
        for file in self.modules.values():
            module = self.module(file)
            found.update(_torch_modules(module.tree) if module else ())
        return sorted(found)[:48]


def written_modules(files: dict[str, str] | None) -> dict[str, str]:
    """Module name -> file name of the Python files a notebook writes (`utils/comm.py` is `utils.comm`)."""
    return {name[:-3].replace("/", "."): name for name in (files or {}) if name.endswith(".py")}


def _split(qualified: str | None, modules: dict[str, str]) -> tuple[str, str] | None:
    """(file, name) of `module.name` where module is a written one, else None."""
    module, _, name = (qualified or "").rpartition(".")
    return (modules[module], name) if module in modules and name else None


def entry_origin(tree: ast.Module, entry: str = ENTRY, files: dict[str, str] | None = None) -> tuple[str, str] | None:
    """Where the entry function is when a notebook cell writes it into a file: (the file, the function's name
    in it). Found from the binding of `entry` at the top level (`from dist_worker import run_worker`, `...
    import f as run_worker`, `run_worker = dist_worker.f`, `from dist_worker import *`; the last binding wins,
    as when Python runs it); when nothing there binds `entry`, from an import of it anywhere (in the function
    that mp.spawn starts), or from `import dist_worker` and a reference to `dist_worker.run_worker`
    (`mp.spawn(dist_worker.run_worker, ...)`); when nothing names it either, the one written file that
    defines it (a script the notebook runs: `!python dist_worker.py`). None: the submission defines it
    itself, or nothing does."""
    modules = written_modules(files)
    if not modules:
        return None
    scope, origin, bound = _Scope(), None, False
    for stmt in _live_statements(tree.body):
        scope.bind(stmt)
        if isinstance(stmt, DEFS) and stmt.name == entry:
            origin, bound = None, True
        elif _binds(stmt, entry):
            origin, bound = _split(scope.names.get(entry), modules), True
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module in modules and not entry.startswith("_") \
                and any(a.name == "*" for a in stmt.names) and entry in _top_names(files[modules[stmt.module]]):
            origin, bound = (modules[stmt.module], entry), True
    if bound:
        return origin
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules \
                and any(a.name == entry for a in node.names):
            return modules[node.module], entry
        if isinstance(node, ast.Import) and not any(scope.lookup((a.asname or a.name).split(".")[0]) for a in node.names):
            scope.bind(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == entry and isinstance(node.ctx, ast.Load):
            found = _split(scope.qualify(node), modules)
            if found is not None:
                return found
    defining = [file for file in modules.values() if entry in _top_names(files[file])]
    return (defining[0], entry) if len(defining) == 1 else None


@functools.lru_cache(maxsize=64)
def _top_names(source: str) -> frozenset[str]:
    """The names a written file binds at its top level (functions, classes, assignments, imports)."""
    tree, _ = parse_source(source, "written.py")
    names: set[str] = set()
    for stmt in _live_statements(tree.body) if tree is not None else ():
        if isinstance(stmt, DEFS):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
            names |= _bound_names(stmt)
    return frozenset(names)


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in stmt.names)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(name in flow.target_names(t) for t in targets)
    return False


def inspect_source(tree: ast.Module, entry_name: str = ENTRY, files: dict[str, str] | None = None) -> StaticReport:
    """Find the entry function and the operations it reaches, also through the submission's own code.
    `files`: the files a notebook's cells write (Submission.files); an entry function imported from one of
    them is analysed there (`entry_origin`), and so are the functions of theirs that the code uses (their
    lines are then reported at the line that calls into them)."""
    report = StaticReport()
    program = _Program(tree, files)
    report.torch_modules = program.torch_modules()
    module, name = program.main, entry_name
    origin = entry_origin(tree, entry_name, files)
    if origin is not None:
        report.entry_file, name = origin
        module = program.module(origin[0])
        if module is None:   # the file does not parse: the ranks' import of it says why
            report.has_entry = True
            return report
    entry, roots = module.entry(name)
    if entry is None:
        return report
    report.has_entry = True
    report.entry_line = entry.lineno
    report.entry_params = len(entry.args.posonlyargs) + len(entry.args.args)
    report.todo_left = any(_is_not_implemented_raise(s) for s in _live_statements(entry.body))

    reached: dict[str, set[int]] = {}
    visited: set[int] = set()

    def walk(fn: ast.AST, parent_scope: _Scope, outer: flow.Flow, mod: _Module, site: int | None) -> None:
        """`site`: in a module other than the entry's, the line of the entry's module that led there."""
        if id(fn) in visited:
            return
        visited.add(id(fn))
        scope = _Scope(parent_scope)
        local_defs: dict[str, ast.AST] = {}
        nodes = list(_live_nodes(fn))
        for node in nodes:
            if isinstance(node, ast.stmt) and node is not fn:
                scope.bind(node)
            if isinstance(node, DEFS) and node is not fn:
                local_defs[node.name] = node
        here = flow.Flow(nodes, mod.parents, outer)
        local_values = _values([n for n in nodes if isinstance(n, ast.stmt) and n is not fn], scope, here, mod.values)

        def record(ops, node) -> None:
            for op in ops:
                reached.setdefault(op, set()).add(site or node.lineno)

        for node in nodes:
            if _checks_itself(node):
                report.self_checks = True
            ops = _ops_named(node, scope, here)
            if ops and here.used(node):
                record(ops, node)
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load) or not here.used(node):
                continue
            # a name bound to something that reaches an operation (`reduce = functools.partial(dist.all_reduce)`)
            if isinstance(node, ast.Name):
                bound = local_values.get(node.id) or mod.values.get(node.id)
                if bound:
                    record(_select(bound, flow.constant_key(node, here.parent)), node)
                # a function or class of the submission, called or passed on (a callback), is walked
                target = local_defs.get(node.id) or mod.functions.get(node.id)
                if target is not None and target is not fn:
                    local = node.id in local_defs
                    walk(target, scope if local else mod.scope, here if local else mod.flow, mod, site)
                    continue
            # a function (or a bound value) of a file a notebook cell writes
            found = program.lookup(scope.qualify(node))
            if found is not None and found[0] is not mod:
                other, other_name = found
                if isinstance(other.functions.get(other_name), DEFS):
                    walk(other.functions[other_name], other.scope, other.flow, other, site or node.lineno)
                elif other.values.get(other_name):
                    record(_select(other.values[other_name], None), node)

    for root in roots:
        walk(root, module.scope, module.flow, module, None)
    report.reached = {op: sorted(lines) for op, lines in reached.items() if lines}
    return report


def _values(statements: list, scope: _Scope, here: flow.Flow, outer: dict | None = None) -> dict[str, dict]:
    """Names assigned a value that names an operation (a partial, a lambda, another such name, a dict of
    collectives), as {name: {constant key, or None for the whole value: operations}}."""
    out: dict[str, dict] = {}

    def ops_in(expr: ast.AST) -> set[str]:
        found: set[str] = set()
        for sub in ast.walk(expr):
            if not _carried(sub, expr, here.parent, scope.defined):
                continue
            found |= _ops_named(sub, scope, here)
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                bound = out.get(sub.id) or (outer or {}).get(sub.id)
                if bound:
                    found |= _select(bound, flow.constant_key(sub, here.parent))
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


def _carried(node: ast.AST, root: ast.AST, parent_of, own: set[str] = frozenset()) -> bool:
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
            (_dotted(parent.func) or [""])[-1] == "partial" or isinstance(parent.func, ast.Name) and parent.func.id in own)
        if not (partial or isinstance(parent, flow.HELD_IN + (ast.keyword,))
                or isinstance(parent, ast.Dict) and child in parent.values
                or isinstance(parent, ast.IfExp) and child is not parent.test):
            return False
    return True


def _select(bound: dict, key: str | None) -> set[str]:
    """The operations a bound value reaches when read with `key` (a dict literal's constant key), or all.
    Bucket None: a value that is not a dict literal, or its items under keys that are not constants."""
    if key is None:
        return set().union(*bound.values())
    return set(bound.get(key, ())) | set(bound.get(None, ()))


def _ops_named(node: ast.AST, scope: _Scope, here: flow.Flow) -> set[str]:
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
    `dist.nn.functional`), and matplotlib's (comm.PRELOAD_OTHER): the zygote imports them before forking the
    ranks."""
    found: set[str] = set()
    aliases = _Scope()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases.bind(node)
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(n for n in names if n.startswith("torch.") or n.split(".")[0] in PRELOAD_OTHER)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                found.update(f"{node.module}.{a.name}" for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            qualified = aliases.qualify(node)
            if qualified and qualified.startswith("torch."):
                parts = qualified.split(".")
                found.update(".".join(parts[:k]) for k in range(2, len(parts)))
                if qualified in PRELOAD_WITH:   # torch.compile: a function, whose first use imports inductor
                    found.add(qualified)
    for name in list(found):
        found.update(PRELOAD_WITH.get(name, ()))
    return sorted(found)[:48]


def _bound_names(stmt: ast.AST) -> set[str]:
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


def own_problem(source: str | None, filename: str, entries: list[str], files: dict | None = None) -> Problem | None:
    """What is wrong with a submission before any exercise is known: its code does not parse, or defines
    none of the functions the exercises start from (`entries`). None when neither."""
    if source is None:
        return None
    tree, problem = parse_source(source, filename)
    if problem is not None:
        return problem
    if entries and not any(inspect_source(tree, entry, files).has_entry for entry in entries):
        return Problem("static.no_entry_any", {"entries": list(entries)})
    return None


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
    try:   # what parses but Python still refuses to run (`return` outside a function, `nonlocal` of nothing;
        # a notebook cell's top-level `await` runs in Jupyter)
        compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as err:
        return None, Problem("static.syntax_error", {"line": err.lineno or "?", "message": err.msg or str(err)})
    except (ValueError, RecursionError, MemoryError) as err:
        return None, Problem("static.too_complex", {"line": "?", "message": str(err)[:200]})
    return tree, None
