"""Programs that run on the switch as on torch's gloo: a fixture for each way the switch once did not (empty
tensors of any shape, a root out of range caught, a bool SUM's count, torch's profiler, bfloat16 everywhere,
anomaly mode and checkpoint: full marks; what gloo refuses, ranks that differ in the reduce op: what gloo's
own run would cost, said in gloo's words), each graded through `python -m grader grade` with its real-backend
run on gloo, and scoring what its sidecar says. (tests/test_fixtures.py compares them with their sidecars in
full, with the exercise's other fixtures.)
"""
from __future__ import annotations

import pytest

import expectations
from conftest import FIXTURES

FOLDER = FIXTURES / "dist_primitives"
PARITY = sorted([*FOLDER.glob("honest/h8?_gloo_*.py"), *FOLDER.glob("mistakes/m4?_*gloo*.py"),
                 *FOLDER.glob("mistakes/m41_ranks_differ_in_the_reduce_op.py")])


def test_every_finding_has_its_fixture():
    assert len(PARITY) == 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", PARITY, ids=lambda p: p.stem)
def test_each_program_scores_as_on_gloo(grade, path):
    sidecar = path.with_suffix(".toml")
    expected = expectations.tomllib.loads(sidecar.read_text())["score"] if sidecar.exists() else 100
    results, _ = grade(path)
    assert results["score"] == expected, [(t["name"], t["output"][:300]) for t in results["tests"]
                                          if t["status"] != "passed"]
