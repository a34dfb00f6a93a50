"""The sixth exercise, hierarchical_allreduce (solutions/hierarchical_allreduce/), through its entry points.

Each fixture folder under tests/fixtures/hierarchical_allreduce/ is graded by ONE `batch` call: the honest
hierarchies (new_group, the chapter's all-reduce inside the node, new_subgroups, a DeviceMesh, reduce-scatter
shards, a 2-D all-reduce, functional collectives) score 100 at 4, 6 and 8 ranks; each mistake gets its exact
score, outcomes and causes; each cheat scores 0 on what it fakes. A flat all-reduce is right and not
hierarchical: the groups check names what crossed the node boundary.
"""
from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest

import exercise_suite as suite
from conftest import FIXTURES, ROOT, run_cli
from grader.exercise import registry
from grader.feedback.messages import render
from grader.integrations import release

EX = "hierarchical_allreduce"
FIX = FIXTURES / EX
WS, HIDDEN_WS = (4, 6, 8), (6, 8)
EXERCISE = registry.get(EX)
_spec = importlib.util.spec_from_file_location("hierarchical_exercise", ROOT / "solutions" / EX / "exercise.py")
DECL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DECL)
ALLOWED = r"0, 2, 4|group_src=0|dst=0|写 0 |0 works|rank 0\b|0 号进程"   # the causes' own fixed words


def every(kind: str, outcome: str, sizes=WS) -> dict:
    return {f"ws{ws}.{kind}": outcome for ws in sizes}


def own(key: str) -> str:
    return f"{EX}.{key}"


def wrong_sum(cause: str, outcome: str = "wrong") -> tuple:
    return (10, {**every("total", outcome), **every("hierarchy", "wrong")},
            {"total": [own(cause)], "hierarchy": ["cause.kind_needs_value"]})


MISTAKES = {
    # the right sum, not hierarchical: the value points, not the hierarchy's
    "m01_flat_all_reduce": (70, every("hierarchy", "wrong"), {"hierarchy": ["cause.groups_flat"]}),
    "m02_everyone_across_nodes": wrong_sum("cause.counted_per_node"),
    "m03_leaders_are_the_wrong_ranks": wrong_sum("cause.node_sum_only"),
    "m04_no_broadcast": wrong_sum("cause.no_broadcast"),
    "m05_broadcast_from_the_wrong_rank": wrong_sum("cause.broadcast_wrong_root"),
    "m06_dst_zero_in_a_node_group": wrong_sum("cause.global_rank_in_group", "exception"),
    "m07_averaged": wrong_sum("cause.averaged"),
    # the right sum, the node's steps over every rank: the first one named (the reduce, across nodes)
    # (and no all_reduce in its text: the static check's 10)
    "m08_reduce_and_broadcast_over_every_rank": (60, {"static.all_reduce": "not_called", **every("hierarchy", "wrong")},
                                                 {"all_reduce": [], "hierarchy": ["cause.groups_inside", "cause.groups_flat"]}),
    # the right sum through send and recv, every rank to every rank: each node's two ranks send across nodes
    # (and no all_reduce anywhere: the static check's 10)
    "m09_point_to_point_across_nodes": (60, {"static.all_reduce": "not_called", **every("hierarchy", "wrong")},
                                        {"all_reduce": [], "hierarchy": ["cause.groups_flat_p2p"]}),
    # new_group called by each group's own ranks only: two nodes' groups under one name, found at the switch
    # (real gloo pairs ranks of both groups, or hangs)
    "m10_groups_made_by_their_ranks_only": (10, {**every("total", "exception"), **every("hierarchy", "wrong")},
                                            {"total": ["cause.group_name"], "hierarchy": ["cause.kind_needs_value"]}),
    # the leaders' all_reduce on the default group: the non-leaders never call it, and the run deadlocks
    "m11_leaders_all_reduce_on_the_default_group": (10, {**every("total", "deadlock"), **every("hierarchy", "wrong")},
                                                    {"total": ["cause.mismatch"], "hierarchy": ["cause.kind_needs_value"]}),
    # send/recv everywhere, the leaders' all-reduce a ring of their own: the sum proven (a leader adds two
    # peers' data, its follower's and its ring neighbour's, before it sends on) and hierarchical; only the
    # static check's 10 (no dist.all_reduce in its text)
    "m12_point_to_point_ring_across_leaders": (90, {"static.all_reduce": "not_called"}, {"all_reduce": []}),
    # every rank all-gathers with every other rank through 2-rank groups: one rank per node in each operation,
    # but ranks 0 and 1 both exchange data across nodes with the same ranks: flat, judged across the run (and
    # no all_reduce anywhere: the static check's 10). At 8 ranks the tracer does not follow the sum through its
    # 28 pair groups (the engine's limit; the hierarchy then needs the value first)
    "m13_pairwise_all_gather_no_hierarchy": (40, {"static.all_reduce": "not_called", **every("hierarchy", "wrong"),
                                                  "ws8.total": "not_collective"},
                                             {"all_reduce": [], "total": [], "hierarchy": ["cause.groups_linked"],
                                              "ws8.hierarchy": ["cause.kind_needs_value"]}),
}
CHEATS = ("c01_local_sum_dummy_hierarchy", "c02_launder_through_the_leaders", "c03_leader_sends_its_node")
HONEST = sorted(p.stem for p in (FIX / "honest").glob("*.py"))


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    return suite.batch(EX, "honest", tmp_path_factory)


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    return suite.batch(EX, "mistakes", tmp_path_factory)


@pytest.fixture(scope="module")
def cheats(tmp_path_factory):
    return suite.batch(EX, "cheats", tmp_path_factory)


def test_enough_fixtures_of_each_kind():
    assert len(HONEST) >= 5 and len(MISTAKES) >= 6 and len(CHEATS) >= 3
    assert sorted(p.stem for p in (FIX / "mistakes").glob("*.py")) == sorted(MISTAKES)
    assert sorted(p.stem for p in (FIX / "cheats").glob("*.py")) == sorted(CHEATS)


# -- the fixtures, one batch per folder --------------------------------------------------------------

@pytest.mark.timeout(500)
def test_honest_hierarchies_score_100(honest):
    for name, results in honest.items():
        assert results["score"] == 100 and suite.failing(results) == {}, (name, suite.failing(results))
    texts = {name: (FIX / "honest" / f"{name}.py").read_text(encoding="utf-8") for name in HONEST}
    assert any("dist.new_group(" in t for t in texts.values()) and any("init_device_mesh(" in t for t in texts.values())
    assert any("dist.new_subgroups(" in t for t in texts.values())
    assert any("reduce_scatter_single" in t for t in texts.values())
    # a passed value names the operations the student used, not every one the exercise accepts
    value = suite.output_of(honest["h01_new_group_reduce_broadcast"], "ws4.total")
    assert render("pass.value", {"quantity": "total", "ops": ["reduce", "all_reduce", "broadcast"]}, "zh") in value, value
    # the leaders' hierarchy: only ranks 0 and 2 send across nodes, one node sum each
    passed = suite.output_of(honest["h01_new_group_reduce_broadcast"], "ws4.hierarchy")
    assert render("pass.groups", {"node": 2, "nodes": 2, "inside": ["broadcast", "reduce"], "crossed": 4096,
                                  "leaders": ["0", "2"], "size": 512}, "zh") in passed
    assert "  进程 1（节点 0）：跨节点发送 0 字节" in passed and "  进程 2（节点 1）：跨节点发送 2048 字节" in passed
    # the reduce-scatter hierarchy: every rank crosses with half the tensor, the same bytes in all
    shards = suite.output_of(honest["h05_reduce_scatter_shards"], "ws4.hierarchy")
    assert "共 4096 字节跨越了节点边界" in shards and "  进程 1（节点 0）：跨节点发送 1024 字节" in shards


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", list(MISTAKES))
def test_mistake_scores_and_names_its_cause(mistakes, name):
    score, failing, causes = MISTAKES[name]
    results = mistakes[name]
    assert results["score"] == score and suite.failing(results) == failing, suite.failing(results)
    for check_id in failing:
        wanted = set(causes.get(check_id, causes[check_id.split(".", 1)[1]]))   # one check's own, else its kind's
        found = suite.named(results, check_id)
        assert wanted <= found, (check_id, found)
        assert {k for k in found if k.startswith(EX + ".")} == {k for k in wanted if k.startswith(EX + ".")}
        text = suite.output_of(results, check_id)
        for key in wanted:
            if key.startswith(EX + "."):
                assert render(key, {}, "zh") in text, (check_id, text)
        assert "Traceback" not in text
        # a leader forwards its node's sum: that is no "rank did not send its own data"
        assert "cause.contribution" not in found
        # the non-leaders make no call on the leaders' group: no "the ranks called different collectives"
        # unless the mistake is one (a collective of every rank's group that only the leaders call)
        assert "cause.mismatch" not in found - wanted, (check_id, found)


@pytest.mark.timeout(500)
def test_point_to_point_is_judged_by_the_ranks_that_send_across_nodes(honest, mistakes):
    # to the leader and back inside the node, the leaders' all_reduce across: the hierarchy, by send and recv
    ok = suite.output_of(honest["h08_point_to_point_in_the_node"], "ws4.hierarchy")
    assert "跨节点的通信每个节点只有一个进程参加（进程 0、2）" in ok and "  进程 1（节点 0）：跨节点发送 0 字节" in ok
    # every rank to every rank: both ranks of each node send across; named once, with the node's ranks
    flat = suite.output_of(mistakes["m09_point_to_point_across_nodes"], "ws4.hierarchy")
    assert flat.count("原因：") == 1 and "进程 0、1 属于同一个节点（每个节点 2 个进程），却都向别的节点发送数据" in flat
    for ws in HIDDEN_WS:
        hidden = suite.output_of(mistakes["m09_point_to_point_across_nodes"], f"ws{ws}.hierarchy")
        assert render("cause.groups_flat_p2p_generic", {}, "zh") in hidden and "4096" not in hidden


@pytest.mark.timeout(500)
def test_one_rank_per_node_is_judged_across_the_run(honest, mistakes):
    """Pair groups give every operation one rank per node, yet both ranks of a node exchange data across nodes
    with the same ranks: named with the chain that links them (visible), the rule without ranks (hidden). The
    planes of h05 and h06 (one set of ranks per local index, one rank per node in each, kept apart) pass."""
    results = mistakes["m13_pairwise_all_gather_no_hierarchy"]
    visible = suite.output_of(results, "ws4.hierarchy")
    assert render("cause.groups_linked", {"op": "all_gather"}, "zh") in visible, visible
    assert "  进程 0 和 1 属于同一个节点（节点 0），跨节点的通信把它们连在了一起：" in visible
    assert "    进程 0 的 all_gather（第 26 行），进程组 0、2：与进程 2 交换数据" in visible
    assert "    进程 2 的 all_gather（第 26 行），进程组 1、2：与进程 1 交换数据" in visible
    assert all(f"  进程 {r}（节点 {r // 2}）：跨节点发送 4096 字节" in visible for r in range(4))
    hidden = suite.output_of(results, "ws6.hierarchy")
    assert render("cause.groups_linked", {"op": "all_gather"}, "zh") in hidden and "进程 0" not in hidden
    en = render("cause.groups_linked", {"op": "all_gather"}, "en")
    assert en.isascii() and en.startswith("Cause: ") and "all_gather" in en
    for name in ("h05_reduce_scatter_shards", "h06_two_dimensional_all_reduce"):
        assert all(suite.scores(honest[name])[f"ws{ws}.hierarchy"] == 10 for ws in WS), name


@pytest.mark.timeout(500)
def test_a_collective_only_the_leaders_call_is_named_on_its_group(mistakes):
    """The mismatch named is the default group's (ranks 1 and 3 never called its all_reduce), not the node
    group's, where rank 0 only stopped early, stuck in that all_reduce."""
    visible = suite.output_of(mistakes["m11_leaders_all_reduce_on_the_default_group"], "ws4.total")
    calls = [{"rank": r, "ops": ["all_reduce(512)"] if r % 2 == 0 else []} for r in range(4)]
    assert render("cause.mismatch", {"calls": calls}, "zh") in visible, visible


@pytest.mark.timeout(500)
def test_groups_under_one_name_are_named_without_a_mismatch(mistakes):
    """Which two groups shared a name, in the student's terms; not "the ranks called different collectives"
    (the ranks that used the name stopped there); hidden: the rule without ranks."""
    results = mistakes["m10_groups_made_by_their_ranks_only"]
    visible = suite.output_of(results, "ws4.total")
    assert "一个由进程 0、1 组成，一个由进程 2、3 组成" in visible or "一个由进程 2、3 组成，一个由进程 0、1 组成" in visible, visible
    assert "use_local_synchronization=True" in visible
    assert "cause.mismatch" not in suite.named(results, "ws4.total")
    for ws in HIDDEN_WS:
        assert render("cause.group_name_generic", {}, "zh") in suite.output_of(results, f"ws{ws}.total")


@pytest.mark.timeout(500)
def test_a_flat_all_reduce_is_named_with_what_crossed(mistakes):
    results = mistakes["m01_flat_all_reduce"]
    visible = suite.output_of(results, "ws4.hierarchy")
    assert "在进程组 0、1、2、3 上跨越节点，其中一个节点有 2 个进程参加（每个节点 2 个进程）" in visible
    assert all(f"  进程 {r}（节点 {r // 2}）：跨节点发送 2048 字节" in visible for r in range(4))
    for ws in HIDDEN_WS:
        hidden = suite.output_of(results, f"ws{ws}.hierarchy")
        assert render("cause.groups_flat_generic", {"op": "all_reduce"}, "zh") in hidden and "2048" not in hidden


@pytest.mark.timeout(200)
def test_mistakes_in_english(tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    for name in ("m01_flat_all_reduce", "m06_dst_zero_in_a_node_group"):
        shutil.copy(FIX / "mistakes" / f"{name}.py", folder)
    proc = run_cli("batch", str(folder), "--out", str(tmp_path / "out"), "--exercise", EX, "--lang", "en", timeout=190)
    assert proc.returncode == 0, proc.stderr
    results = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in (tmp_path / "out").glob("m0*.json")}
    assert "crosses nodes with 2 ranks of one node (nodes of 2 ranks)" in suite.output_of(results["m01_flat_all_reduce"], "ws4.hierarchy")
    dst = suite.output_of(results["m06_dst_zero_in_a_node_group"], "ws8.total")
    assert render(own("cause.global_rank_in_group"), {}, "en") in dst and dst.startswith("failed: ")


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", CHEATS)
def test_cheat_scores_0_on_what_it_fakes(cheats, name):
    results = cheats[name]
    assert suite.failing(results) == {**every("total", "not_collective"), **every("hierarchy", "wrong")}
    assert results["score"] == 10 and all(suite.scores(results)[f"ws{ws}.{k}"] == 0 for ws in WS for k in ("total", "hierarchy"))


@pytest.mark.timeout(500)
def test_hidden_checks_reveal_no_values(honest, mistakes, cheats):
    for group in (honest, mistakes, cheats):
        for name, results in group.items():
            assert suite.hidden_leaks(results, ALLOWED) == [], name


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
    broadcast = SimpleNamespace(op="broadcast", completed=True, ok=True)
    for ws in WS:
        for rank in range(ws):
            assert suite.diagnose(EXERCISE, "total", DECL.total(ws), ws, rank) == []
            for key, values in [(m.cause, m.value(rank, ws)) for m in EXERCISE.mistakes if m.value is not None]:
                calls = [broadcast] if key == "cause.broadcast_wrong_root" else []
                assert suite.diagnose(EXERCISE, "total", values, ws, rank, calls) == [key], (ws, rank, key)
            # its own data: no broadcast at all, or a broadcast from the wrong rank
            assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(rank), ws, rank) == ["cause.no_broadcast"]
    error = {"type": "ValueError", "message": "Global rank 0 is not part of group <...>", "frames": []}
    assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(2), 4, 2, outcome="wrong", error=error) == [
        "cause.global_rank_in_group"]
    assert suite.diagnose(EXERCISE, "total", DECL.local_tensor(2), 4, 2, outcome="exception",
                          error={"type": "RuntimeError", "message": "boom"}) == []
