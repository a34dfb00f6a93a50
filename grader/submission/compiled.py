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
import copy
import functools
import importlib.util
import marshal

from . import definitions

CHECK_HOOK = "__grader_check__"   # what a recorded check calls, in the module's globals (rank.py)
MAGIC = importlib.util.MAGIC_NUMBER.hex()   # the bytecode's version: marshal's code is one interpreter's


class RecordChecks(ast.NodeTransformer):
    """`assert test, msg` -> `if not test: __grader_check__(line, msg)` (msg evaluated only on failure)."""

    def visit_Assert(self, node: ast.Assert):
        call = ast.Call(ast.Name(CHECK_HOOK, ast.Load()), [ast.Constant(node.lineno), node.msg or ast.Constant(None)], [])
        made = ast.If(ast.UnaryOp(ast.Not(), node.test), [ast.Expr(call)], [])
        return ast.fix_missing_locations(ast.copy_location(made, node))


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
