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

Here: the walk from the entry function (`inspect_source`) and the source's own diagnostics. Beside it:
scope.py (what names stand for, which code can run), reach.py (what a reference reaches), program.py (the
submission's modules and where its entry function lives), parse.py (parsing a student's text safely).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..comm import API_NAMES
from . import flow
from .parse import MAX_TREE_DEPTH, Problem, parse_source, tree_depth
from .program import ENTRY, Module, Program, entry_origin, written_modules
from .reach import bound_operations, ops_named, select
from .scope import DEFS, Scope, live_nodes, live_statements, raises_not_implemented

# the names other modules and the tests read here, whichever room of the static check defines them
__all__ = ["DEFS", "ENTRY", "MAX_TREE_DEPTH", "Problem", "StaticReport", "assigned_results", "entry_origin",
           "inspect_source", "own_problem", "parse_source", "tree_depth", "written_modules"]


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


def inspect_source(tree: ast.Module, entry_name: str = ENTRY, files: dict[str, str] | None = None) -> StaticReport:
    """Find the entry function and the operations it reaches, also through the submission's own code.
    `files`: the files a notebook's cells write (Submission.files); an entry function imported from one of
    them is analysed there (`entry_origin`), and so are the functions of theirs that the code uses (their
    lines are then reported at the line that calls into them)."""
    report = StaticReport()
    program = Program(tree, files)
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
    report.todo_left = any(raises_not_implemented(s) for s in live_statements(entry.body))

    reached: dict[str, set[int]] = {}
    visited: set[int] = set()

    def walk(fn: ast.AST, parent_scope: Scope, outer: flow.Flow, mod: Module, site: int | None) -> None:
        """`site`: in a module other than the entry's, the line of the entry's module that led there."""
        if id(fn) in visited:
            return
        visited.add(id(fn))
        scope = Scope(parent_scope)
        local_defs: dict[str, ast.AST] = {}
        nodes = list(live_nodes(fn))
        for node in nodes:
            if isinstance(node, ast.stmt) and node is not fn:
                scope.bind(node)
            if isinstance(node, DEFS) and node is not fn:
                local_defs[node.name] = node
        here = flow.Flow(nodes, mod.parents, outer)
        local_values = bound_operations([n for n in nodes if isinstance(n, ast.stmt) and n is not fn], scope, here, mod.values)

        def record(ops, node) -> None:
            for op in ops:
                reached.setdefault(op, set()).add(site or node.lineno)

        for node in nodes:
            if _checks_itself(node):
                report.self_checks = True
            ops = ops_named(node, scope, here)
            if ops and here.used(node):
                record(ops, node)
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load) or not here.used(node):
                continue
            # a name bound to something that reaches an operation (`reduce = functools.partial(dist.all_reduce)`)
            if isinstance(node, ast.Name):
                bound = local_values.get(node.id) or mod.values.get(node.id)
                if bound:
                    record(select(bound, flow.constant_key(node, here.parent)), node)
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
                    record(select(other.values[other_name], None), node)

    for root in roots:
        walk(root, module.scope, module.flow, module, None)
    report.reached = {op: sorted(lines) for op, lines in reached.items() if lines}
    return report


def _checks_itself(node: ast.AST) -> bool:
    """An assert, a raise (other than the stub's NotImplementedError) or an assert_* call (assert_close,
    assert_allclose ...): code that may stop on values a perturbed run changes."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Raise):
        return not raises_not_implemented(node)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name.startswith("assert")
    return False



# ---------------------------------------------------------------------------------------------
# Diagnostics: mistakes visible in the source (used only to explain a failed check).

def assigned_results(tree: ast.Module) -> list[tuple[str, int]]:
    """Operations of torch.distributed whose return value is assigned (`t = dist.all_reduce(t)`) without
    async_op=True: they work in place and return None, so the name ends up None. (operation, line) pairs."""
    scope = Scope()
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
