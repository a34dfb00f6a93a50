"""Definitions only: what a rank executes of the submission's top level.

A rank runs the submission's top level except what starts processes or communicates: an `if __name__ ...`
block, a bare expression (a call: `main()`, `print(...)`), and a statement that calls a launcher or an
operation of torch.distributed (`_Actions`), directly or through the submission's own functions, classes
and methods (a function passed to a call counts as called, unless the call only wraps it: `scope.WRAPPERS`,
`step = torch.compile(step)`). Assignments, `for` loops and `if`/`try`/`with` blocks that only compute values
(constants, lookup tables, wrappers: `all_reduce = timed(dist.all_reduce)`, `run_worker = make_worker()`) run;
so does filling a container the module binds (`TABLE.append(...)`). A statement that reads a name only a
dropped statement binds is dropped too (`for p in procs: p.join()` after `procs = [mp.Process(...) ...]`).

Pure `ast`, no torch: the supervisor filters each submission once (compiled.py); a rank filters a file a
notebook cell wrote, when it loads one.
"""
from __future__ import annotations

import ast
import fnmatch
import sys

from ..comm import API_NAMES
from . import flow
from ..comm import GROUP_METHODS
from .scope import DEFS, WRAPPERS, Scope, bound_names, unwrapped

# Calls that start processes, by their origin where it is the standard library or torch (`os.system`, never
# `platform.system`); by their name alone where the origin is unknown (`ctx.Process(...)` of
# `ctx = mp.get_context("spawn")`, `get_ipython().system(...)`, another package's `launch`).
LAUNCHERS = {"spawn", "start_processes", "Process", "Pool", "ProcessPoolExecutor", "Popen", "system", "popen",
             "fork", "run", "call", "check_call", "check_output", "getoutput", "launch", "elastic_launch"}
LAUNCHER_ORIGINS = {
    "os": ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "exec*", "spawn*"),
    "subprocess": ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"),
    "multiprocessing": ("Process", "Pool"), "multiprocessing.pool": ("Pool",),
    "multiprocessing.context": ("Process", "SpawnProcess", "ForkProcess", "ForkServerProcess"),
    "torch.multiprocessing": ("spawn", "start_processes", "Process", "Pool"),
    "torch.multiprocessing.spawn": ("spawn", "start_processes"),
    "concurrent.futures": ("ProcessPoolExecutor",), "pty": ("spawn", "fork"),
    "asyncio": ("create_subprocess_exec", "create_subprocess_shell"),
    "torch.distributed.run": ("main", "run"), "torch.distributed.launch": ("main", "launch"),
    "torch.distributed.launcher": ("elastic_launch", "launch_agent"),
    "torch.distributed.launcher.api": ("elastic_launch", "launch_agent"),
}
KNOWN_MODULES = frozenset(sys.stdlib_module_names) | {"torch"}
# Setting up groups communicates as well (a module-level `GROUP = dist.new_group(...)` is not a definition).
GROUP_SETUP = {f"{module}.{name}" for module in ("torch.distributed", "torch.distributed.distributed_c10d")
               for name in ("init_process_group", "destroy_process_group", "new_group", "new_subgroups",
                            "new_subgroups_by_enumeration")} | {"torch.distributed.device_mesh.init_device_mesh"}
# Methods that fill a container the module binds: the only bare expressions a rank runs.
FILLERS = {"append", "extend", "insert", "update", "setdefault", "add"}
INITS = ("__init__", "__new__", "__post_init__")   # what calling a class runs
MAX_WORK = 200_000   # nodes one module's analysis looks at (past it, what is left is taken to act)
MAX_FOLLOWED = 64   # nested calls into the submission's own functions followed (each takes a few Python frames)


def is_launcher(qualified: str | None, name: str) -> bool:
    """Whether a call of `qualified` (where the name comes from; None when unknown), named `name`, starts
    processes."""
    if qualified is None:
        return name in LAUNCHERS
    module, _, last = qualified.rpartition(".")
    if module.split(".")[0] in KNOWN_MODULES:
        return any(fnmatch.fnmatchcase(last, pattern) for pattern in LAUNCHER_ORIGINS.get(module, ()))
    return last in LAUNCHERS


def _run_nodes(node: ast.AST, in_function: bool = False):
    """The nodes below `node` that run when it runs: not the bodies of the functions and classes it defines,
    nor of its lambdas, except a lambda it calls or passes to a call (a callback), or, in a function, one it
    does not return."""
    stack: list[tuple[ast.AST, ast.AST | None]] = [(node, None)]
    while stack:
        current, parent = stack.pop()
        yield current
        if isinstance(current, DEFS):
            continue
        if isinstance(current, ast.Lambda):
            passed = isinstance(parent, (ast.Call, ast.keyword))
            if not (passed or in_function and not isinstance(parent, ast.Return)):
                continue
        stack.extend((child, current) for child in ast.iter_child_nodes(current))


class _Actions:
    """Whether running some code starts processes or communicates (`acts`): it calls a launcher, or passes one
    to a call (`functools.partial(mp.spawn, ...)`); or calls an operation (comm.API_NAMES) or sets up a group;
    or calls, or passes to a call, one of the submission's functions, classes or methods that does."""

    def __init__(self, tree: ast.Module):
        self.scope = Scope()
        self.functions: dict[str, ast.AST] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.methods: dict[str, list[ast.AST]] = {}
        for node in _run_nodes(tree):
            if isinstance(node, ast.stmt):
                self.scope.bind(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.methods.setdefault(item.name, []).append(item)
        self._done: dict[int, bool] = {}
        self._depth = 0
        self._work = 0                   # nodes looked at, within MAX_WORK

    def acts(self, node: ast.AST, scope: Scope | None = None, local: dict | None = None,
             in_function: bool = False) -> bool:
        scope, local = scope or self.scope, local or {}
        for sub in _run_nodes(node, in_function):
            self._work += 1
            if self._work > MAX_WORK:
                return True              # past the analysis's budget: taken to act (dropped, never run)
            if isinstance(sub, ast.Call) and self._call_acts(sub, scope, local):
                return True
        return False

    def _call_acts(self, call: ast.Call, scope: Scope, local: dict) -> bool:
        func = call.func
        if isinstance(func, ast.Lambda):
            return False                 # its body runs, and _run_nodes walks it with the call's own nodes
        qualified = scope.qualify(func)
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        own = isinstance(func, ast.Name) and (name in local or name in self.functions or name in self.classes)
        if qualified in API_NAMES or qualified in GROUP_SETUP:
            return True
        if isinstance(func, ast.Attribute) and name in GROUP_METHODS and name not in self.methods:
            return True
        if name and not own and is_launcher(qualified, name):
            return True
        if self._follows(func, scope, local):
            return True
        inner = unwrapped(func, scope)
        if inner is not func and self._follows(inner, scope, local):
            return True                  # `torch.compile(step)(x)` calls step
        wraps = qualified in WRAPPERS   # `step = torch.compile(step)` binds a function: it calls none
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            arg = arg.value if isinstance(arg, ast.Starred) else arg
            passed = scope.qualify(arg)
            if passed is not None and is_launcher(passed, passed.rpartition(".")[2]):
                return True
            if not wraps and self._follows(arg, scope, local):
                return True
        return False

    def _follows(self, ref: ast.AST, scope: Scope, local: dict) -> bool:
        """Whether the submission's own code that `ref` names acts when called: a function (nested in the one
        being followed, or the module's), a class (its __init__ ...), or any own method of that name."""
        if isinstance(ref, ast.Name) and scope.lookup(ref.id) is None:
            if ref.id in local:
                return self._function_acts(local[ref.id])
            if ref.id in self.functions:
                return self._function_acts(self.functions[ref.id])
            if ref.id in self.classes:
                return any(self._function_acts(item) for item in self.classes[ref.id].body
                           if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in INITS)
        if isinstance(ref, ast.Attribute) and scope.qualify(ref) is None:
            return any(self._function_acts(method) for method in self.methods.get(ref.attr, ()))
        return False

    def _function_acts(self, fn: ast.AST) -> bool:
        if id(fn) not in self._done:
            if self._depth > MAX_FOLLOWED:
                return True              # too deep a chain of calls to follow: taken to act
            self._depth += 1
            self._done[id(fn)] = False   # a recursive call adds nothing
            scope, local = Scope(self.scope), {}
            for stmt in fn.body:
                for node in _run_nodes(stmt, in_function=True):
                    if isinstance(node, ast.stmt):
                        scope.bind(node)
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        local[node.name] = node
            self._done[id(fn)] = any(self.acts(stmt, scope, local, in_function=True) for stmt in fn.body)
            self._depth -= 1
        return self._done[id(fn)]


def _is_main_guard(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test))


class _Definitions:
    """Filters a module's top level (see above): `block` keeps, in order, the statements a rank runs."""

    def __init__(self, tree: ast.Module):
        self.actions = _Actions(tree)
        self.bound: set[str] = set()     # names kept statements bind
        self.dropped: set[str] = set()   # names only dropped statements bind
        self.values: set[str] = set()    # names kept assignments bind (containers a FILLERS call may fill)

    def block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        return [kept for kept in (self.keep(stmt) for stmt in body) if kept is not None]

    def keep(self, stmt: ast.stmt) -> ast.stmt | None:
        kept = self._keep(stmt)
        if kept is None:
            self.dropped |= bound_names(stmt) - self.bound
        elif isinstance(stmt, (ast.Import, ast.ImportFrom) + DEFS):
            self._bind(bound_names(stmt))
        return kept

    def _bind(self, names) -> None:
        self.bound |= set(names)
        self.dropped -= set(names)

    def _runs(self, *parts) -> bool:
        """Whether these parts of a statement may run in a rank: none acts, none reads a dropped name."""
        for part in parts:
            if part is None:
                continue
            if self.actions.acts(part):
                return False
            if any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in self.dropped
                   for n in _run_nodes(part)):
                return False
        return True

    def _keep(self, stmt: ast.stmt) -> ast.stmt | None:
        if isinstance(stmt, (ast.Import, ast.ImportFrom) + DEFS):
            return stmt
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            read = ast.Name(stmt.target.id, ast.Load()) if isinstance(stmt, ast.AugAssign) and \
                isinstance(stmt.target, ast.Name) else None
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if not self._runs(stmt.value, read, *(t for t in targets if not isinstance(t, ast.Name))):
                return None
            names = {name for t in targets for name in flow.target_names(t)}
            self._bind(names)
            self.values |= names
            return stmt
        if isinstance(stmt, ast.Expr):
            call = stmt.value
            filler = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and isinstance(call.func.value, ast.Name) and call.func.value.id in self.values \
                and call.func.attr in FILLERS
            return stmt if filler and self._runs(call) else None
        if isinstance(stmt, ast.If):
            if _is_main_guard(stmt.test) or not self._runs(stmt.test):
                return None
            return self._with_bodies(stmt, ("body", "orelse"))
        if isinstance(stmt, ast.Try):
            return self._with_bodies(stmt, ("body", "orelse", "finalbody"), handlers=True)
        if isinstance(stmt, ast.With):
            if not self._runs(*stmt.items):
                return None
            self._bind(name for item in stmt.items if item.optional_vars is not None
                       for name in flow.target_names(item.optional_vars))
            return self._with_bodies(stmt, ("body",))
        if isinstance(stmt, ast.For):   # a `while` loop is dropped: a `break` it needs may not run
            if not self._runs(stmt.iter):
                return None
            bound = set(self.bound)
            self._bind(flow.target_names(stmt.target))
            body = self.block(stmt.body)
            if not body:
                self.bound = bound   # nothing of it runs
                return None
            stmt.body, stmt.orelse = body, self.block(stmt.orelse)
            return stmt
        return None  # bare expressions (calls), asserts, raises, `del` ...

    def _with_bodies(self, stmt, fields, handlers=False):
        for name in fields:
            block = getattr(stmt, name)
            if block:
                kept = self.block(block)
                if name == "body" and not kept:
                    kept = [ast.copy_location(ast.Pass(), block[0])]
                setattr(stmt, name, kept)
        if handlers:
            for handler in stmt.handlers:
                handler.body = self.block(handler.body) or [ast.copy_location(ast.Pass(), handler)]
        return stmt


def definitions_only(tree: ast.Module) -> ast.Module:
    """The module as a rank runs it: its imports, functions, classes and values, not its launch calls (see
    above). Filters `tree` in place (callers pass a fresh parse: a deep copy costs a rank more than the parse
    itself)."""
    tree.body = _Definitions(tree).block(tree.body)
    return tree
