"""submission/compiled.py: what a rank executes, compiled once by the supervisor."""
from __future__ import annotations

import marshal

import pytest

from grader.submission import compiled

SOURCE = '''import os

def run_worker(rank, world_size):
    x = rank + 1
    assert x == 100, f"checked {x}"
    return x

os.system("echo launched")
'''


def _run(code, hook=None) -> dict:
    scope = {"__name__": "submission"}
    if hook is not None:
        scope[compiled.CHECK_HOOK] = hook
    exec(code, scope)
    return scope


def test_ranks_get_the_definitions_only_and_asserts_raise_outside_perturbed_runs():
    code = marshal.loads(compiled.rank_bytes(SOURCE, "s.py", record=False))
    scope = _run(code)          # the launch call at the top level is not in it
    with pytest.raises(AssertionError, match="checked 1"):
        scope["run_worker"](0, 2)


def test_a_perturbed_runs_code_records_a_failed_check_with_its_line_and_goes_on():
    seen = []
    scope = _run(marshal.loads(compiled.rank_bytes(SOURCE, "s.py", record=True)), lambda line, msg: seen.append((line, msg)))
    assert scope["run_worker"](1, 2) == 2
    assert seen == [(5, "checked 2")]   # the message is evaluated, as Python does, only when the check fails


def test_code_the_supervisor_cannot_compile_is_left_to_the_rank():
    assert compiled.rank_bytes("def f(:\n", "s.py", record=True) is None            # a syntax error
    assert compiled.rank_bytes("def f():\n    nonlocal x\n", "s.py", record=False) is None   # parses, no compile


@pytest.mark.timeout(30)
def test_lambdas_nested_30_deep_are_analysed_once_each_not_twice_per_level():
    """A called lambda's body is looked at once (it was looked at twice per level: 2^30 walks, the supervisor
    hung before any run); the constant it computes is kept, run in the rank."""
    nested = "1"
    for _ in range(30):
        nested = f"(lambda: {nested})()"
    source = f"SCALE = {nested}\n\ndef run_worker(rank, world_size):\n    return SCALE\n"
    scope = _run(marshal.loads(compiled.rank_bytes(source, "s.py", record=False)))
    assert scope["run_worker"](0, 2) == 1


@pytest.mark.parametrize("handler, records", [
    ("try:\n        assert x\n    finally:\n        pass", True),
    ("try:\n        assert x\n    except ValueError:\n        pass", True),
    ("try:\n        assert x\n    except AssertionError:\n        pass", False),
    ("try:\n        assert x\n    except (KeyError, Exception):\n        pass", False),
    ("try:\n        assert x\n    except:\n        pass", False),
    ("try:\n        assert x\n    except ERRORS:\n        pass", False),   # an expression: it may name any
    ("with contextlib.suppress(AssertionError):\n        assert x", False),
])
def test_checks_are_recorded_only_where_no_handler_of_the_students_can_catch_them(handler, records):
    """Recording a failed check instead of raising it changes nothing where nothing could have caught it;
    where a handler could (the code would go on differently after it), the checks raise as in a clean run."""
    source = f"import contextlib\n\ndef run_worker(rank, world_size):\n    x = rank\n    {handler}\n"
    assert compiled.recorded(source, "s.py") is records
