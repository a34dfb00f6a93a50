"""The transport on its own: runs, isolation between gradings, output caps, zygote recovery."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from conftest import FIXTURES, PY, ROOT
from grader.processes.protocol import values
from grader.processes.runner import Runner, RunRequest
from grader.processes.sandbox import Limits
from grader.verify.perturb import delta_values

ECHO = """
import torch, torch.distributed as dist
def run_worker(rank, world_size):
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    print("rank", rank, "says", t.tolist())
    return t, None
"""

CHATTY = """
def run_worker(rank, world_size):
    for _ in range(3000):
        print("x" * 99)
    return None, None
"""


@pytest.fixture(scope="module")
def runner():
    with Runner(limits=Limits(wall_s=10)) as r:
        yield r


@pytest.mark.timeout(60)
def test_ranks_report_calls_values_and_output(runner):
    [out] = runner.run_many([RunRequest(world_size=3, source=ECHO, filename="echo.py", quantities=("t", "u"))])
    assert out.stop == "completed"
    for rec in out.ranks:
        assert rec.result["how"] == "return" and rec.result["source"] == "return"
        assert values(rec.result["values"]["t"]).tolist() == [6.0] * 4
        assert rec.result["values"]["u"] is None
        [call] = rec.calls
        assert (call.op, call.method, call.api, call.line, call.sends, call.receives) == ("all_reduce", "allreduce", "all_reduce", 5, True, True)
        assert call.completed and call.ok and call.waited and call.seed is None   # a clean run: nothing perturbed
        assert call.sent_values()[0].tolist() == [rec.rank + 1.0] * 4               # what this rank contributed
        assert call.delivered_values()[0].tolist() == [6.0] * 4                     # what the network delivered
        assert f"rank {rec.rank} says [6.0, 6.0, 6.0, 6.0]" in rec.output_text()


@pytest.mark.timeout(60)
def test_a_perturbed_run_adds_secret_deltas_the_supervisor_keeps(runner):
    [out] = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"),
                                        perturb=("all_reduce",))])
    seeds = [rec.calls[0].seed for rec in out.ranks]
    assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    assert out.seeds == {(0, 0): seeds[0], (1, 0): seeds[1]}
    deltas = [delta_values(s, 4, "torch.float32") for s in seeds]
    delivered = out.ranks[0].calls[0].delivered_values()[0]
    assert delivered.tolist() == (3.0 + deltas[0] + deltas[1]).tolist()           # exact: powers of two
    assert out.ranks[0].calls[0].sent_values()[0].tolist() == [1.0] * 4           # the student's tensor, untouched


@pytest.mark.timeout(60)
def test_output_is_capped_and_counted(runner):
    small = Limits(wall_s=10, output_keep_kb=4)
    with Runner(limits=small) as r:
        [out] = r.run_many([RunRequest(world_size=2, source=CHATTY, filename="chatty.py")])
    rec = out.ranks[0]
    assert len(rec.output) == 4 * 1024
    assert rec.output_total == 3000 * 100


@pytest.mark.timeout(60)
def test_zygote_death_is_survived(runner):
    """If the zygote dies between runs (OOM killer, a stray signal), the next run starts a new one."""
    os.killpg(runner.proc.pid, signal.SIGKILL)
    runner.proc.wait()
    first = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])[0]
    if first.stop == "grader_error":  # the run that found the zygote dead is reported, not lost
        assert "zygote" in (first.error or "") or "could not start" in (first.error or "")
    second = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])[0]
    assert second.stop == "completed"


@pytest.mark.timeout(90)
def test_two_gradings_at_once_with_the_same_fixed_port(tmp_path):
    """The seed's reference sets MASTER_PORT=12355 and inits its own group: two gradings side by side
    must not join each other's group (the grader owns the group; each run has its own store)."""
    seed_style = FIXTURES / "sandbox" / "fixed_port.py"
    procs = [subprocess.Popen([PY, "-m", "grader", "grade", str(seed_style), "--results", str(tmp_path / f"r{i}.json")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for i in range(2)]
    try:
        for p in procs:
            p.wait(timeout=80)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for i in range(2):
        assert json.loads((tmp_path / f"r{i}.json").read_text())["score"] == 100
