"""The sixth exercise, hierarchical_allreduce (solutions/hierarchical_allreduce/), through its entry points,
and the declaration's own pieces without processes.

Its fixtures (tests/fixtures/hierarchical_allreduce/: the honest hierarchies (new_group, the chapter's
all-reduce inside the node, new_subgroups, a DeviceMesh, reduce-scatter shards, a 2-D all-reduce, functional
collectives) score 100 at 4, 6 and 8 ranks; each mistake gets its exact score, outcomes and causes; each cheat
scores 0 on what it fakes, as each sidecar says) are graded by tests/test_fixtures.py. A flat all-reduce is
right and not hierarchical: the groups check names what crossed the node boundary.
"""
from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest

import exercise_suite as suite
import expectations
from conftest import FIXTURES, ROOT, run_cli
from grader.exercise import registry
from grader.integrations import release

EX = "hierarchical_allreduce"
FIX = FIXTURES / EX
WS = (4, 6, 8)
EXERCISE = registry.get(EX)
_spec = importlib.util.spec_from_file_location("hierarchical_exercise", ROOT / "solutions" / EX / "exercise.py")
DECL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DECL)
# the fixed words with digits its hidden checks may show (its fixtures' defaults.toml, tests/expectations.py)
ALLOWED = "|".join(expectations.defaults(EXERCISE)["hidden_may_show"])


HONEST = sorted(p.stem for p in (FIX / "honest").glob("*.py"))


# -- the fixtures (graded by tests/test_fixtures.py, each against its sidecar) -----------------------------

def test_the_honest_hierarchies_cover_the_librarys_ways():
    texts = {name: (FIX / "honest" / f"{name}.py").read_text(encoding="utf-8") for name in HONEST}
    assert any("dist.new_group(" in t for t in texts.values()) and any("init_device_mesh(" in t for t in texts.values())
    assert any("dist.new_subgroups(" in t for t in texts.values())
    assert any("reduce_scatter_single" in t for t in texts.values())


# -- entry points ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_list_names_the_exercise():
    proc = run_cli("list", "--lang", "en")
    assert ("  hierarchical_allreduce: Hierarchical all-reduce: reduce in the node, all-reduce across the leaders, "
            "broadcast in the node (100 points; visible world sizes 4)") in proc.stdout


@pytest.mark.timeout(120)
def test_check_in_chinese_infers_the_exercise_and_shows_the_crossing(tmp_path):
    path = tmp_path / f"{EX}.py"
    shutil.copy(FIX / "mistakes" / "m01_flat_all_reduce.py", path)
    proc = run_cli("check", str(path), "--lang", "zh")
    assert proc.returncode == 1 and proc.stdout.startswith(f"== {EX}.py: 得分：30 / 40 =="), proc.stdout
    assert "  跨节点发送的数据：8192 字节；一次扁平的 all_reduce 让每个进程都跨节点发送，共 8192 字节（每个进程 2048 字节）。" in proc.stdout


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_grade_and_batch(tmp_path):
    got = suite.solution_and_stub(EX, tmp_path)
    assert got["grade"] == {"solution": 100, "release": 0}
    assert got["batch"] == {"solution": "100", "stub": "0"}


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_the_notebook_check():
    got = suite.notebook_checks(EX)
    assert got["solution"].returncode == 0 and "Score: 40 / 40" in got["solution"].stdout, got["solution"].stdout
    assert "  data sent across nodes: 4096 bytes; one flat all_reduce makes every rank send across nodes, 8192 bytes" \
        in got["solution"].stdout
    assert got["release"].returncode == 1 and "Score: 0 / 40" in got["release"].stdout


# -- the release, the notebook, the words --------------------------------------------------------------

def test_student_versions_are_generated_from_the_solution():
    p = suite.paths(EX)
    assert p["release_py"].read_text(encoding="utf-8") == release.clear_solutions(p["solution_py"].read_text(encoding="utf-8"))
    stub = p["release_py"].read_text(encoding="utf-8")
    assert "TODO 3: if rank == leader: dist.all_reduce(total, group=leaders)" in stub
    assert "my_node = node_groups[rank // NODE_SIZE]" not in stub


def test_notebook_cells_are_the_py_solution_and_the_rubric():
    suite.notebook_matches_solution(EX, ("local_tensor",))


def test_exercise_messages_are_bilingual_and_hidden_safe():
    suite.messages_are_bilingual_and_hidden_safe(EX, ALLOWED)


def test_the_docstring_says_what_the_chapter_means():
    doc = DECL.__doc__
    assert "机内 All-Reduce" in doc and "an all-reduce inside the node (the chapter's wording)" in " ".join(doc.split())


# -- the declaration's own pieces, without processes --------------------------------------------------

def test_the_numpy_data_is_what_torch_computes():
    namespace: dict = {}
    exec(compile(suite.paths(EX)["release_py"].read_text(encoding="utf-8"), "stub", "exec"), namespace)
    for rank in range(8):
        assert np.allclose(namespace["local_tensor"](rank).double().numpy(), DECL.local_tensor(rank), rtol=2e-7, atol=2e-7)


def test_diagnosis_names_each_mistake_from_its_values():
    from types import SimpleNamespace
    for ws in WS:
        for rank in range(ws):
            # a broadcast from the node's second rank, of its own data: the wrong root is named on the rank that was
            # it (the others received it)
            broadcast = SimpleNamespace(op="broadcast", completed=True, ok=True, sends=rank == DECL.node_of(rank)[1],
                                        sent_values=lambda rank=rank: [DECL.local_tensor(rank)])
            assert suite.diagnose(EXERCISE, "total", DECL.total(ws), ws, rank) == []
            for key, values in [(m.cause, m.value(rank, ws)) for m in EXERCISE.mistakes
                                if m.value is not None and (m.ws is None or m.ws(ws))]:
                calls = [broadcast] if key == "cause.broadcast_wrong_root" else []
                wrong_root = key == "cause.broadcast_wrong_root" and rank != DECL.node_of(rank)[1]
                assert suite.diagnose(EXERCISE, "total", values, ws, rank, calls) == ([] if wrong_root else [key]), (ws, rank, key)
            # its own data: no broadcast at all, or a broadcast from the wrong rank
            assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(rank), ws, rank) == ["cause.no_broadcast"]
    # 2 nodes of 2: the sum over NODE_SIZE is also the sum over the number of nodes, so neither is said
    assert all(suite.diagnose(EXERCISE, "total", DECL.total(4) / DECL.NODE_SIZE, 4, rank) == [] for rank in range(4))
    error = {"type": "ValueError", "message": "Global rank 0 is not part of group <...>", "frames": []}
    assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(2), 4, 2, outcome="wrong", error=error) == [
        "cause.global_rank_in_group"]
    assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(2), 4, 2, outcome="exception",
                          error={"type": "RuntimeError", "message": "boom"}) == []
