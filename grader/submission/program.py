"""A submission as modules: its own code and the files its notebook cells write (`%%writefile dist_worker.py`),
each with its aliases, functions and what its top level binds; and where the entry function lives
(`entry_origin`: the submission's own def, or a written file's function it imports or runs)."""
from __future__ import annotations

import ast
import functools

from ..comm import PRELOAD_GRADER, PRELOAD_OTHER, PRELOAD_WITH
from . import flow
from .parse import parse_source
from .reach import bound_operations
from .scope import DEFS, Scope, bound_names, live_nodes, live_statements, unwrapped

ENTRY = "run_worker"


class Module:
    """One module of the submission (its own code, or a file a notebook cell writes): its imports and
    aliases, its top-level functions and classes, and what its top level binds."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        statements = list(live_statements(tree.body))
        self.scope = Scope()
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
                # `step = torch.compile(step)`, `sync = functools.partial(sync_grads, ...)`, `run_worker =
                # _run_worker`: the function itself
                inner = unwrapped(stmt.value, self.scope)
                wrapped = self.functions.get(inner.id) if isinstance(inner, ast.Name) else None
                for name in (n for t in stmt.targets for n in flow.target_names(t)):
                    if wrapped is not None and isinstance(stmt.targets[0], ast.Name):
                        self.functions[name] = wrapped
                        self.made.pop(name, None)
                    elif own and isinstance(stmt.targets[0], ast.Name):
                        self.made[name] = stmt.value
                    else:
                        self.made.pop(name, None)
        self.parents = flow.parents(tree)
        top = [node for stmt in statements for node in live_nodes(stmt, stop=DEFS)]
        self.flow = flow.Flow(top, self.parents)
        self.values = bound_operations([n for n in top if isinstance(n, ast.stmt)], self.scope, self.flow)

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
        for node in live_nodes(factory):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id in nested:
                return nested[node.value.id], [factory]
        return None, []


class Program:
    """The submission and the files its notebook cells write (`%%writefile dist_worker.py`), each parsed
    when first needed."""

    def __init__(self, tree: ast.Module, files: dict[str, str] | None):
        self.main = Module(tree)
        self.files = dict(files or {})
        self.modules = written_modules(self.files)
        self._parsed: dict[str, Module | None] = {}

    def module(self, file: str) -> Module | None:
        if file not in self._parsed:
            tree, _ = parse_source(self.files[file], file)
            self._parsed[file] = Module(tree) if tree is not None else None
        return self._parsed[file]

    def lookup(self, qualified: str | None) -> tuple[Module, str] | None:
        """(the written module, the name in it) of a qualified name such as `dist_worker.run_worker`."""
        found = _split(qualified, self.modules)
        module = self.module(found[0]) if found else None
        return (module, found[1]) if module is not None else None

    def torch_modules(self) -> list[str]:
        found = set(torch_modules_of(self.main.tree))
        for file in self.modules.values():
            module = self.module(file)
            found.update(torch_modules_of(module.tree) if module else ())
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
    scope, origin, bound = Scope(), None, False
    for stmt in live_statements(tree.body):
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
    for stmt in live_statements(tree.body) if tree is not None else ():
        if isinstance(stmt, DEFS):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
            names |= bound_names(stmt)
    return frozenset(names)


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in stmt.names)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(name in flow.target_names(t) for t in targets)
    return False


def torch_modules_of(tree: ast.Module) -> list[str]:
    """torch modules the submission imports or names (`torch.distributed._functional_collectives`,
    `dist.nn.functional`), matplotlib's (comm.PRELOAD_OTHER) and the grader's that a notebook imports
    (comm.PRELOAD_GRADER): the zygote imports them before forking the ranks."""
    found: set[str] = set()
    aliases = Scope()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases.bind(node)
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(n for n in names if n.startswith("torch.") or n.split(".")[0] in PRELOAD_OTHER)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                found.update(f"{node.module}.{a.name}" for a in node.names)
            if isinstance(node, ast.ImportFrom) and node.module:   # from grader.integrations import nbcheck
                names = names + [f"{node.module}.{a.name}" for a in node.names]
            found.update(g for g in PRELOAD_GRADER if any(n == g or n.startswith(g + ".") for n in names))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            qualified = aliases.qualify(node)
            if qualified and qualified.startswith("torch."):
                parts = qualified.split(".")
                found.update(".".join(parts[:k]) for k in range(2, len(parts)))
                if qualified in PRELOAD_WITH:   # torch.compile: a function, whose first use imports dynamo
                    found.add(qualified)
            elif node.attr == "compile" and isinstance(node.ctx, ast.Load) and qualified is None:
                found.add("torch.compile")      # `model.compile()`: nn.Module's, compiled as torch.compile
            elif qualified and qualified.startswith("grader."):   # `import grader` ... grader.integrations.nbcheck
                found.update(g for g in PRELOAD_GRADER if qualified == g or qualified.startswith(g + "."))
    for name in list(found):
        found.update(PRELOAD_WITH.get(name, ()))
    return sorted(found)[:48]
