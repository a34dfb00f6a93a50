"""The code a rank executes for a submission, compiled once by the supervisor for every rank of a run.

A rank runs the submission's definitions only (definitions.definitions_only: never its launch calls), and in a
perturbed run the student's own checks are recorded instead of raised (its perturbed data fails an assert of
the expected values by design; processes/rank.py records the values as they stand there and goes on).
Parsing, filtering and compiling that in every rank cost each fresh fork 2-6 ms of CPU (its first use of the
parser and of this analysis); the supervisor does it once per submission and mode, and each rank loads the
result with marshal (~0.1 ms). A rank whose interpreter is not the supervisor's compiles the source itself,
as does any rank where the supervisor could not (the rank then reports the student's error as its own).

Pure `ast`, no torch: imported by the supervisor and, before any fork, by the zygote.
"""
from __future__ import annotations

import ast
import builtins
import copy
import functools
import importlib.util
import marshal

from . import definitions

# What a recorded check calls, in the module's globals (rank.py): a name no source can spell (it is no
# identifier), so no assignment of the submission's rebinds it; rank.py puts it back after the top level ran.
CHECK_HOOK = "grader check"
MAGIC = importlib.util.MAGIC_NUMBER.hex()   # the bytecode's version: marshal's code is one interpreter's


class RecordChecks(ast.NodeTransformer):
    """`assert test, msg` -> `if not test: __grader_check__(line, msg)` (msg evaluated only on failure)."""

    def visit_Assert(self, node: ast.Assert):
        call = ast.Call(ast.Name(CHECK_HOOK, ast.Load()), [ast.Constant(node.lineno), node.msg or ast.Constant(None)], [])
        made = ast.If(ast.UnaryOp(ast.Not(), node.test), [ast.Expr(call)], [])
        return ast.fix_missing_locations(ast.copy_location(made, node))


CATCH_ALL = {"AssertionError", "Exception", "BaseException"}
# Python's own exception classes that an AssertionError is not (KeyError, ValueError ...)
NARROW = {name for name, obj in vars(builtins).items()
          if isinstance(obj, type) and issubclass(obj, BaseException) and not issubclass(AssertionError, obj)}


@functools.lru_cache(maxsize=8)   # asked at each run's launch
def recorded(source: str, filename: str) -> bool:
    """Whether a perturbed run records this submission's failed checks: not where a handler of its own could
    catch the AssertionError a check raises (`except AssertionError`, `except Exception`, a bare `except`,
    `contextlib.suppress(...)`), since recording instead of raising would then change what the code does
    afterwards (its perturbed run would not be the clean run's twin). Its checks then raise, as before."""
    try:
        tree = _definitions(source, filename)
    except Exception:  # noqa: BLE001  (what cannot be parsed records nothing; the rank says why)
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and _catches_assertions(node.type):
            return False
        if isinstance(node, ast.Call) and "suppress" in ast.unparse(node.func):
            return False
    return True


def _catches_assertions(kind: ast.expr | None) -> bool:
    if kind is None:
        return True   # a bare except
    if isinstance(kind, ast.Tuple):
        return any(_catches_assertions(k) for k in kind.elts)
    if isinstance(kind, (ast.Name, ast.Attribute)):
        name = kind.id if isinstance(kind, ast.Name) else kind.attr
        return name in CATCH_ALL or name not in NARROW   # another name may stand for any of them
    return True       # an expression: it may name any of them


def rank_code(source: str, filename: str, record: bool):
    """The code object a rank executes for `source` (definitions only; checks recorded where `record`)."""
    tree = _definitions(source, filename)
    if record:
        tree = ast.fix_missing_locations(RecordChecks().visit(copy.deepcopy(tree)))
    return compile(tree, filename, "exec")


@functools.lru_cache(maxsize=4)
def _definitions(source: str, filename: str) -> ast.Module:
    """definitions.definitions_only of the source, made once for both modes (never changed: copied to transform)."""
    return definitions.definitions_only(ast.parse(source, filename))


def rank_bytes(source: str, filename: str, record: bool) -> bytes | None:
    """rank_code as marshal's bytes, or None where it cannot be made (the rank then compiles, and fails, itself)."""
    try:
        return marshal.dumps(rank_code(source, filename, record))
    except Exception:  # noqa: BLE001  (SyntaxError, RecursionError, MemoryError ...: the student's, said by the rank)
        return None
