"""An instructor adds an exercise without touching grader/: a folder with exercise.py, found through
--exercises-dir, graded end to end (an honest, a wrong and a locally computed submission); one that declares
the check kinds measured at the switch (counts, volume, groups) with Quantity.tolerance; and one with its
fixtures beside it, which tests/test_fixtures.py tests with no edit to tests/."""
from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

import pytest

from conftest import PY, ROOT, run_cli, stretched

EXERCISE = '''
"""Toy exercise: every rank ends with rank 0's vector, sent with a broadcast."""
from grader.exercise import Check, Exercise, Mistake, Quantity

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
    mistakes=(Mistake("cause.own_vector", value=data, params={"quantity": "vector"}),),   # its own vector, unchanged
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


# -- the check kinds measured at the switch: counts, volume, groups (docs/exercises.md) -------------------

KINDS_EXERCISE = '''
"""Toy exercise: the sum over every rank, reduced in each node of 2 ranks, all-reduced in float16 across the
node leaders, broadcast back into the node."""
from grader.exercise import Check, Exercise, Quantity

N = 16

def data(rank, ws):
    return [float(i + rank) for i in range(N)]

def checks(ws, hidden):
    return (
        Check(f"ws{ws}.total", "value", 4, ("和（{ws} 个进程）", "Sum ({ws} ranks)"), hidden=hidden, world_size=ws,
              quantity="total"),
        Check(f"ws{ws}.one_broadcast", "counts", 1, ("一次 broadcast", "One broadcast"), hidden=hidden, world_size=ws,
              op="broadcast", quantity="total", params={"count": 1}),
        Check(f"ws{ws}.leaders_only", "counts", 1, ("只有 leader all_reduce", "Only the leaders all-reduce"), hidden=hidden,
              world_size=ws, op="all_reduce", quantity="total", params={"count": lambda ws: ws // 2, "per": "all"}),
        Check(f"ws{ws}.half", "volume", 1, ("半精度", "Half precision"), hidden=hidden, world_size=ws, op="all_reduce",
              quantity="total", params={"dtypes": ("torch.float16", "torch.bfloat16")}),
        Check(f"ws{ws}.nodes", "groups", 1, ("分层", "Hierarchy"), hidden=hidden, world_size=ws, quantity="total",
              params={"node": 2, "inside": ("reduce", "broadcast")}),
    )

EXERCISE = Exercise(
    name="toy_kinds",
    title=("分层求和", "A hierarchical sum"),
    entry="hier_sum",
    defines=("hier_sum",),
    quantities=(Quantity("total", local=data, combine="sum", through=("reduce", "all_reduce", "broadcast"),
                         tolerance="torch.float16"),),
    checks=(*checks(4, False), *checks(6, True)),
)
'''

HIER_SUM = '''
import torch
import torch.distributed as dist

def hier_sum(rank, world_size, dtype=torch.float16):
    total = torch.arange(16, dtype=torch.float32) + rank
    nodes = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world_size // 2)]
    leaders = dist.new_group(list(range(0, world_size, 2)))
    leader = rank - rank % 2
    dist.reduce(total, dst=leader, group=nodes[rank // 2])
    if rank == leader:
        half = total.to(dtype)
        dist.all_reduce(half, group=leaders)
        total = half.float()
    dist.broadcast(total, src=leader, group=nodes[rank // 2])
    return total
'''
HIER_SUM32 = HIER_SUM.replace("dtype=torch.float16", "dtype=torch.float32")
FLAT_SUM = '''
import torch
import torch.distributed as dist

def hier_sum(rank, world_size):
    total = torch.arange(16, dtype=torch.float32) + rank
    dist.all_reduce(total)
    return total
'''
LOCAL_SUM = HIER_SUM.replace("    return total\n", "    return sum(torch.arange(16, dtype=torch.float32) + r for r in range(world_size))\n")


@pytest.mark.timeout(240)
def test_counts_volume_and_groups_checks_graded_end_to_end(tmp_path):
    """An exercise declaring the three kinds, written into a temporary folder (grader/ untouched), and four
    submissions through one `batch`: each kind passes, or fails with its own cause, only where it should; beside
    a locally computed sum none of them counts."""
    course = tmp_path / "course"
    (course / "toy_kinds").mkdir(parents=True)
    (course / "toy_kinds" / "exercise.py").write_text(textwrap.dedent(KINDS_EXERCISE))
    subs = tmp_path / "class"
    subs.mkdir()
    for name, text in (("hier", HIER_SUM), ("hier32", HIER_SUM32), ("flat", FLAT_SUM), ("local", LOCAL_SUM)):
        (subs / f"{name}.py").write_text(text)
    listed = run_cli("list", "--exercises-dir", str(course), "--lang", "en")
    assert "  toy_kinds: A hierarchical sum (16 points; visible world sizes 4)" in listed.stdout
    out = tmp_path / "out"
    proc = run_cli("batch", str(subs), "--out", str(out), "--exercises-dir", str(course), "--exercise", "toy_kinds",
                   "--lang", "en", timeout=230)
    assert proc.returncode == 0, proc.stderr
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}

    def failing(name):
        return {k: v for k, v in results[name]["extra_data"]["outcomes"].items() if v != "pass"}

    def causes(name, check_id):
        return {c["key"] for c in results[name]["extra_data"]["causes"].get(check_id, [])}

    def text(name, check_id):
        ids = list(results[name]["extra_data"]["outcomes"])
        return results[name]["tests"][ids.index(check_id)]["output"]

    assert results["hier"]["score"] == 16 and failing("hier") == {}
    # the dtype it carried (float16), not every one the check allows (float16, bfloat16)
    assert "Passed: all_reduce carried torch.float16, at most 32 bytes per rank, within the bound of 32 bytes." \
        in text("hier", "ws4.half")
    assert ("every operation across nodes takes one rank per node (the ranks that communicated across nodes: 0, 2): 64 "
            "bytes crossed the node boundary") in text("hier", "ws4.nodes")
    # float32 across the leaders: right, hierarchical, not compressed (the value compared with float16's tolerance)
    assert failing("hier32") == {"ws4.half": "wrong", "ws6.half": "wrong"}
    assert causes("hier32", "ws4.half") == {"cause.volume_dtype", "cause.volume_bytes"}
    assert "Cause: rank 0 sent 64 bytes in 1 all_reduce, over the bound of 32 bytes." in text("hier32", "ws4.half")
    # one flat all-reduce: the right sum; no broadcast, every rank all-reduces, float32, across nodes
    assert failing("flat") == {f"ws{ws}.{k}": "wrong" for ws in (4, 6) for k in ("one_broadcast", "leaders_only", "half", "nodes")}
    assert causes("flat", "ws4.one_broadcast") == {"cause.counts_fewer"}
    assert "Cause: rank 0 completed broadcast 0 times; wanted: 1." in text("flat", "ws4.one_broadcast")
    assert "Cause: the ranks completed all_reduce 4 times in all; wanted: 2." in text("flat", "ws4.leaders_only")
    assert causes("flat", "ws4.nodes") == {"cause.groups_flat"}
    # hidden: the same causes without their figures
    hidden = text("flat", "ws6.leaders_only") + text("flat", "ws6.nodes") + text("flat", "ws6.half")
    assert "Cause: the ranks' number of all_reduce in all is not the one wanted." in hidden
    assert "Cause: all_reduce crossed nodes with more than one rank of a node" in hidden
    assert not re.search(r"\d", hidden.replace("Hidden check", ""))
    # a locally computed sum: not derived from the communication, and no kind counts beside it
    assert results["local"]["score"] == 0
    assert failing("local") == {"ws4.total": "not_collective", "ws6.total": "not_collective",
                                **{f"ws{ws}.{k}": "wrong" for ws in (4, 6) for k in ("one_broadcast", "leaders_only", "half", "nodes")}}
    assert causes("local", "ws4.half") == {"cause.kind_needs_value"}


# -- a new exercise with its fixtures: the per-exercise tests find it, tests/ and grader/ untouched ---------

SIDECARS = {
    "wrong": '''# broadcasts into a copy: the result is unused, and the exercise's own cause says what the vector still is
score = 2

[outcomes]
"ws*.vector" = "wrong"

[causes]
"ws*.vector" = ["cause.unchanged", "toy_broadcast.cause.own_vector"]

[[says]]
text = "Cause: vector is still this rank's own vector."
check = "ws2.vector"
''',
    "local": '''# rank 0's data computed locally: the right numbers, not derived from the communication
score = 2

[outcomes]
"ws*.vector" = "not_collective"

[causes]
"ws*.vector" = ["fail.not_collective"]
''',
}


UNCOVERED = EXERCISE.replace('name="toy_broadcast"', 'name="toy_uncovered"').replace('entry="share"', 'entry="share_all"') \
    .replace('defines=("share",)', 'defines=("share_all",)')


@pytest.mark.timeout(600)
def test_a_new_exercise_with_its_fixtures_is_tested_without_an_edit_to_the_tests(tmp_path):
    """An instructor's exercise in a folder of their own (its declaration with a cause of its own, its
    solution, its fixtures beside it with their sidecars): tests/test_fixtures.py, run as it is on that
    folder (GRADER_EXERCISES), grades and checks it as it checks the course's. It fails where a sidecar says
    what the grading does not, and where an exercise's cause is named for no mistake (a second exercise whose
    only mistake's sidecar leaves it out: its fixtures are not graded here)."""
    course = tmp_path / "course"
    for name, declaration, sidecars in (("toy_broadcast", EXERCISE, SIDECARS), ("toy_uncovered", UNCOVERED, {
            "wrong": SIDECARS["wrong"].replace(', "toy_broadcast.cause.own_vector"', "")})):
        folder = course / name
        folder.mkdir(parents=True)
        (folder / "exercise.py").write_text(textwrap.dedent(declaration))
        (folder / f"{name}.py").write_text(HONEST)
        for kind, stem, text in (("honest", "h01_broadcast", HONEST), ("mistakes", "wrong", WRONG), ("cheats", "local", LOCAL)):
            (folder / "fixtures" / kind).mkdir(parents=True, exist_ok=True)
            (folder / "fixtures" / kind / f"{stem}.py").write_text(text)
            if stem in sidecars:
                (folder / "fixtures" / kind / f"{stem}.toml").write_text(sidecars[stem])
    said_wrong = course / "toy_broadcast" / "fixtures" / "mistakes" / "wrong_said_to_score_10"
    said_wrong.with_suffix(".py").write_text(WRONG)
    said_wrong.with_suffix(".toml").write_text(SIDECARS["wrong"].replace("score = 2", "score = 10"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GRADER_"))}
    env["GRADER_EXERCISES"] = str(course)
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-rA", "-n", "0", "-p", "no:cacheprovider", "tests/test_fixtures.py",
                           "-k", "toy_broadcast or (toy_uncovered and named_for_one_of_its_mistakes)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=stretched(500))
    out = proc.stdout
    test = "tests/test_fixtures.py::test_"
    failed = sorted(line.split(" ", 1)[1].split(" - ")[0] for line in out.splitlines() if line.startswith("FAILED "))
    assert failed == [f"{test}every_cause_an_exercise_declares_is_named_for_one_of_its_mistakes[toy_uncovered]",
                      f"{test}fixture_gets_what_its_sidecar_says[toy_broadcast/mistakes/wrong_said_to_score_10]"], out[-4000:]
    assert "score 2, expected 10" in out and "toy_uncovered.cause.own_vector" in out, out[-4000:]
    for passed in ("fixture_gets_what_its_sidecar_says[toy_broadcast/honest/h01_broadcast]",
                   "fixture_gets_what_its_sidecar_says[toy_broadcast/mistakes/wrong]",
                   "fixture_gets_what_its_sidecar_says[toy_broadcast/cheats/local]",
                   "every_cause_an_exercise_declares_is_named_for_one_of_its_mistakes[toy_broadcast]",
                   "every_exercise_has_fixtures_of_each_kind_each_with_its_sidecar[toy_broadcast]"):
        assert f"PASSED {test}{passed}" in out, out[-4000:]
