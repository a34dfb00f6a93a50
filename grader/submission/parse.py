"""Parsing a student's text: whatever the source holds, a Problem for the student, never an exception for the
grader."""
from __future__ import annotations

import ast
from typing import NamedTuple

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
    try:   # what parses but Python still refuses to run (`return` outside a function, `nonlocal` of nothing;
        # a notebook cell's top-level `await` runs in Jupyter)
        compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as err:
        return None, Problem("static.syntax_error", {"line": err.lineno or "?", "message": err.msg or str(err)})
    except (ValueError, RecursionError, MemoryError) as err:
        return None, Problem("static.too_complex", {"line": "?", "message": str(err)[:200]})
    return tree, None
