"""An instructor adds an exercise without touching grader/: a folder with exercise.py, found through
--exercises-dir, graded end to end (an honest, a wrong and a locally computed submission)."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import ROOT, run_cli

EXERCISE = '''
"""Toy exercise: every rank ends with rank 0's vector, sent with a broadcast."""
from grader.exercise import Check, Exercise, Quantity

N = 64

def data(rank, ws):
    return [float(i * (rank + 3)) for i in range(N)]

EXERCISE = Exercise(
    name="toy_broadcast",
    title=("广播：每个进程都拿到 0 号进程的向量", "Broadcast: every rank ends with rank 0's vector"),
    entry="share",
    defines=("share",),
    quantities=(Quantity("vector", local=data, combine="root", root=0, through=("broadcast",)),),
    checks=(
        Check("static.broadcast", "static", 2, ("静态检查：用到了 broadcast", "Static: broadcast is used"), op="broadcast"),
        Check("ws2.vector", "value", 4, ("广播（{ws} 个进程）", "Broadcast ({ws} ranks)"), world_size=2, quantity="vector"),
        Check("ws3.vector", "value", 4, ("广播（{ws} 个进程）", "Broadcast ({ws} ranks)"), hidden=True, world_size=3, quantity="vector"),
    ),
    messages={"cause.own_vector": ("原因：{quantity} 还是本进程自己的向量。", "Cause: {quantity} is still this rank's own vector.")},
    diagnose=lambda name, values, ws, rank, ctx: (
        [("cause.own_vector", {"quantity": name})]
        if values is not None and rank and list(values) == data(rank, ws) else []),
    todo=("请完成 share", "complete share"),
)
'''

HONEST = '''
import torch
import torch.distributed as dist

def share(rank, world_size):
    vector = torch.arange(64, dtype=torch.float32) * (rank + 3)
    dist.broadcast(vector, src=0)
    return vector
'''

WRONG = '''
import torch
import torch.distributed as dist

def share(rank, world_size):
    vector = torch.arange(64, dtype=torch.float32) * (rank + 3)
    dist.broadcast(vector.clone(), src=0)     # broadcasts into a copy: vector is unchanged
    return vector
'''

LOCAL = '''
import torch
import torch.distributed as dist

def share(rank, world_size):
    dist.broadcast(torch.zeros(64), src=0)
    return torch.arange(64, dtype=torch.float32) * 3     # rank 0's data, computed locally
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    (root / "toy_broadcast").mkdir()
    (root / "toy_broadcast" / "exercise.py").write_text(textwrap.dedent(EXERCISE))
    subs = root / "class"
    subs.mkdir()
    for name, text in (("honest", HONEST), ("wrong", WRONG), ("local", LOCAL)):
        (subs / f"{name}.py").write_text(text)
    return root


def test_the_engine_knows_no_exercise():
    """The first exercise's words belong to its folder, not to grader/."""
    import subprocess
    found = subprocess.run(["grep", "-rnwE", "full_feature|local_feature|gradient", str(ROOT / "grader")],
                           capture_output=True, text=True)
    assert found.stdout == ""


def test_list_shows_the_toy_exercise(toy):
    proc = run_cli("list", "--exercises-dir", str(toy), "--lang", "en")
    assert "toy_broadcast: Broadcast: every rank ends with rank 0's vector (10 points; visible world sizes 2)" in proc.stdout


@pytest.mark.timeout(180)
def test_toy_exercise_graded_end_to_end(toy, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("batch", str(toy / "class"), "--out", str(out), "--exercises-dir", str(toy),
                   "--exercise", "toy_broadcast", "--lang", "en", timeout=170)
    assert proc.returncode == 0, proc.stderr
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    outcomes = {name: r["extra_data"]["outcomes"] for name, r in results.items()}
    assert outcomes["honest"] == {"static.broadcast": "pass", "ws2.vector": "pass", "ws3.vector": "pass"}
    assert results["honest"]["score"] == 10
    assert outcomes["wrong"] == {"static.broadcast": "pass", "ws2.vector": "wrong", "ws3.vector": "wrong"}
    wrong = "\n".join(t["output"] for t in results["wrong"]["tests"])
    assert "Cause: vector is still this rank's own vector." in wrong          # the exercise's own cause
    assert outcomes["local"] == {"static.broadcast": "pass", "ws2.vector": "not_collective", "ws3.vector": "not_collective"}
    assert results["local"]["score"] == 2
    # the exercise is inferred from the code when not named (its entry function is unique to it)
    single = run_cli("check", str(toy / "class" / "honest.py"), "--exercises-dir", str(toy), "--lang", "zh")
    assert single.returncode == 0 and "得分：6 / 6" in single.stdout
