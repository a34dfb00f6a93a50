"""Red team of the grader's own time and memory: submissions (tests/fixtures/limits/d*.py) that attack the
supervisor's memory or the tracer's time, measured one at a time, bounded.

The attacks on verification (forged frames, laundering, racing threads ...) are fixtures of their exercise,
tests/fixtures/<exercise>/cheats/a*.py, each with the score it deserves in its sidecar; tests/test_fixtures.py
grades them. An attack that succeeds is kept with `xfail = "the hole, in one line"` in its sidecar (strict:
a fix makes it pass, and the mark must go).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import FIXTURES, PY, ROOT, run_cli, slowdown, stretched

LIMITS = FIXTURES / "limits"

# ------------------------------------------------------------------------------------------------
# The grader's own time and memory (the d* fixtures), one at a time, bounded

PEAK = r"""
import json, resource, sys
from grader import plan
from grader.exercise import registry
from grader.processes.limits import Limits
from grader.processes.runner import Runner
from grader.records import RunRequest
ex = registry.get(sys.argv[2])
source = open(sys.argv[1], encoding="utf-8").read()
# this process is the supervisor: its peak memory is the switch's; a run's time, stretched as the machine is slower
with Runner(limits=Limits(wall_s=Limits.wall_s * float(sys.argv[3]))) as runner:
    runner.run_many([RunRequest(world_size=2, source="def run_worker(rank, world_size):\n    return None\n",
                                filename="/warm.py")])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = runner.run_many([RunRequest(world_size=2, source=source, filename="/submission.py",
                                      quantities=tuple(q.name for q in ex.quantities),
                                      perturb=plan.perturbed_ops(ex))])[0]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"stop": out.stop, "grew_mib": (after - before) / 1024, "unread": [r.unread for r in out.ranks]}))
"""


def _supervisor_growth(fixture: str, exercise: str = "dist_primitives") -> dict:
    proc = subprocess.run([PY, "-c", PEAK, str(LIMITS / fixture), exercise, str(slowdown())], cwd=ROOT,
                          capture_output=True, text=True, timeout=stretched(240))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_one_operation_cannot_make_the_supervisor_build_far_more_than_was_sent():
    # K inputs of 16 KiB, K lists of K x N outputs (64 MiB at two ranks): refused before anything is built
    grown = _supervisor_growth("d02_allgather_output_amplification.py")
    assert grown["stop"] == "traffic_limit"
    assert grown["grew_mib"] < 64, grown     # 720 KiB sent per rank


@pytest.mark.timeout(300)
def test_a_rank_that_stops_reading_cannot_make_the_supervisor_hold_its_answers():
    # 16 MiB owed per all-gather: the rank is stopped once it leaves more than MAX_UNREAD (72 MiB) unread.
    # What the supervisor holds meanwhile is bounded per rank, whatever the number of operations: what its
    # operations not yet completed sent (MAX_IN_FLIGHT, 64 MiB, and its perturbed copy), its latest
    # snapshot (here 24 MiB of locals) and the frame being read
    grown = _supervisor_growth("d03_stalled_reader.py")
    assert grown["stop"] == "traffic_limit" and grown["unread"] == [True, False], grown
    assert grown["grew_mib"] < 400, grown


@pytest.mark.timeout(300)
def test_reports_cannot_make_the_supervisor_keep_far_more_than_their_budget():
    grown = _supervisor_growth("d04_snapshot_flood.py")
    assert grown["stop"] in ("completed", "protocol"), grown
    assert grown["grew_mib"] < 64, grown     # 2000 frames per rank: 500 KiB of report budget each


@pytest.mark.timeout(180)
def test_verification_of_a_run_is_bounded_in_time(tmp_path):
    # four identical delivered copies make every match tie: the tracer's work budget ends the search
    results = tmp_path / "results.json"
    proc = run_cli("grade", str(LIMITS / "d01_backtracking_bomb.py"), "--results", str(results),
                   "--exercise", "dist_primitives", "--lang", "en", timeout=150)
    assert proc.returncode == 0
    assert json.loads(results.read_text(encoding="utf-8"))["score"] == 55   # static + the honest gradient
