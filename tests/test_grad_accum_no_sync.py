"""The fourth exercise, grad_accum_no_sync (solutions/grad_accum_no_sync/), through its entry points.

Each fixture folder under tests/fixtures/grad_accum_no_sync/ is graded by ONE `batch` call (a module
fixture per folder): the honest styles (DDP with no_sync, by hand, functional collectives, a comm hook ...)
score 100; each mistake gets its exact score, outcomes and named causes (the exercise's, in Chinese, and
for a sample in English through `grade --lang en`); each cheat scores 0 on what it fakes. Then `list`,
`check`, the solution and the stub through `grade`, `batch` and the notebook check (nbgrader:
tests/test_nbgrader_e2e.py, one course for every exercise).
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil

import numpy as np
from types import SimpleNamespace
import pytest

import exercise_suite as suite
from conftest import FIXTURES, ROOT, run_cli
from grader.exercise import registry
from grader.feedback.messages import render
from grader.integrations import release

EX = "grad_accum_no_sync"
FIX = FIXTURES / EX
WS, HIDDEN_WS = (2, 3, 4), (3, 4)
EXERCISE = registry.get(EX)   # loading it adds its messages to the catalog under its name
_spec = importlib.util.spec_from_file_location("grad_accum_exercise", ROOT / "solutions" / EX / "exercise.py")
DECL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DECL)


def every(kind: str, outcome: str, sizes=WS) -> dict:
    return {f"ws{ws}.{kind}": outcome for ws in sizes}


def own(key: str) -> str:
    return f"{EX}.{key}"


COUNTS = {"one_all_reduce": ["cause.counts_more"]}
NEEDS_VALUE = ["cause.kind_needs_value"]
# (score, the checks that do not pass with their outcome, the causes each failing check of a kind names
# (at every world size; where N = K = 4 makes two causes alike, the extra one at ws 4))
MISTAKES = {
    # the right gradient through K all-reduces: the value points; the count names K all-reduces for 1
    "m01_all_reduce_every_micro_batch": (70, every("one_all_reduce", "wrong"), COUNTS, {}),
    "m02_ddp_without_no_sync": (70, every("one_all_reduce", "wrong"), COUNTS, {}),
    "m03_not_divided_by_k": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                             {"grad": [own("cause.not_divided_by_k")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m04_not_divided_by_world_size": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                      {"grad": [own("cause.not_divided_by_ws")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m05_ddp_divided_by_world_size_again": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                            {"grad": [own("cause.divided_by_ws_twice")], "one_all_reduce": NEEDS_VALUE},
                                            {"ws4.grad": own("cause.divided_by_k_twice")}),
    # ReduceOp.AVG divided already: its words, not DDP's
    "m12_average_then_divided": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                 {"grad": [own("cause.averaged_then_divided")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m13_sum_divided_twice": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                              {"grad": [own("cause.summed_divided_twice")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m06_zero_grad_every_micro_batch": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                        {"grad": [own("cause.last_micro_batch_only")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m07_no_sync_for_every_micro_batch": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                          {"grad": [own("cause.never_synced")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m08_no_sync_for_the_last_micro_batches": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                               {"grad": [own("cause.synced_too_early")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m09_divided_by_k_twice": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                               {"grad": [own("cause.divided_by_k_twice")], "one_all_reduce": NEEDS_VALUE}, {}),
    "m10_not_averaged_at_all": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                {"grad": [own("cause.not_averaged")], "one_all_reduce": NEEDS_VALUE}, {}),
    # the gradient synced once but cut into two buckets: proven through both (the value points), two all-reduces
    "m11_two_buckets": (70, every("one_all_reduce", "wrong"), COUNTS, {}),
    # the parameter all-reduced for its gradient: what the rank sent is named (exercise/linear.fit), and the
    # gradient left is its own
    "m15_weight_all_reduced_not_its_grad": (10, {**every("grad", "wrong"), **every("one_all_reduce", "wrong")},
                                            {"grad": [own("cause.sent_not_own"), own("cause.never_synced")],
                                             "one_all_reduce": NEEDS_VALUE}, {}),
    # raised before its division: the exception, and no cause read from the half-made sum in its locals
    "m14_raises_before_the_division": (10, {**every("grad", "exception"), **every("one_all_reduce", "wrong")},
                                       {"grad": ["fail.exception"], "one_all_reduce": NEEDS_VALUE}, {}),
}
# at N = K = 4, a rank that sent its mean / K (m09) or its gradient / N (m13) sent the same numbers: which
# division was one too many is not certain, and the cause says either
INSTEAD = {(name, "ws4.grad"): [own("cause.divided_once_too_often")]
           for name in ("m09_divided_by_k_twice", "m13_sum_divided_twice")}
CHEATS = ("c01_local_answer_dummy_all_reduce", "c02_launder_through_all_reduce", "c03_rank0_contributes_for_all",
          "c04_honest_all_reduce_local_answer")
# the red team's: the local answer (plus a correction in the rank's micro-gradient span) sent at 1e-6 of its
# size, once "fitted" under float32's absolute floor of 1e-5. Unproven, the clean run decides, where this code
# (not on gloo) computes the grader's formula from an unperturbed delivery: not the answer
TINY_LAUNDERS = ("c05_tiny_launder_under_an_absolute_floor", "c06_tiny_launder_one_percent_own_data")
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
    assert sorted(p.stem for p in (FIX / "cheats").glob("*.py")) == sorted(CHEATS + TINY_LAUNDERS)


# -- the fixtures, one batch per folder --------------------------------------------------------------

@pytest.mark.timeout(500)
def test_honest_styles_score_100(honest):
    for name, results in honest.items():
        assert results["score"] == 100 and suite.failing(results) == {}, (name, suite.failing(results))
    texts = {name: (FIX / "honest" / f"{name}.py").read_text(encoding="utf-8") for name in HONEST}
    # the library's ways are among them: DDP's no_sync, its comm hooks, functional collectives, AVG
    assert any("ddp.no_sync()" in t and "DDP(model)" in t for t in texts.values())
    assert any("register_comm_hook" in t and "gradient_as_bucket_view=True" in t for t in texts.values())
    assert any("funcol.all_reduce" in t for t in texts.values())
    assert any("ReduceOp.AVG" in t for t in texts.values())
    # the scales no fixed list holds: a DDP gradient divided by K afterwards, a sum divided by N x K
    assert "model.weight.grad / K" in texts["h03_ddp_divide_by_k_after"]
    assert "grad / (world_size * K)" in texts["h04_sum_divide_by_nk"]
    # DDP's own int32 all-reduce (find_unused_parameters=True) is no second sync of the gradient
    assert "find_unused_parameters=True" in texts["h09_ddp_require_backward_grad_sync_find_unused"]


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", list(MISTAKES))
def test_mistake_scores_and_names_its_cause(mistakes, name):
    score, failing, causes, extra = MISTAKES[name]
    results = mistakes[name]
    assert results["score"] == score and suite.failing(results) == failing, suite.failing(results)
    for check_id in failing:
        kind = check_id.split(".", 1)[1]
        wanted = set(INSTEAD.get((name, check_id)) or causes[kind]) | ({extra[check_id]} if check_id in extra else set())
        assert wanted <= suite.named(results, check_id), (check_id, suite.named(results, check_id))
        exercise_keys = {k for k in suite.named(results, check_id) if k.startswith(EX + ".")}
        assert exercise_keys == {k for k in wanted if k.startswith(EX + ".")}, (check_id, exercise_keys)
        text = suite.output_of(results, check_id)
        for key in wanted:
            if key.startswith(EX + "."):
                assert render(key, {}, "zh") in text, (check_id, text)
        assert "Traceback" not in text
        # DDP's own start-up broadcast is not "another operation in the all_reduce's place"
        assert not {"cause.other_op", "cause.op_missing"} & suite.named(results, check_id), (check_id, suite.named(results, check_id))


@pytest.mark.timeout(500)
def test_the_count_names_what_was_counted(mistakes):
    """Visible: the rank, the count and the one wanted; hidden: the same cause without its figures."""
    results = mistakes["m01_all_reduce_every_micro_batch"]
    visible = suite.output_of(results, "ws2.one_all_reduce")
    assert render("cause.counts_more", {"rank": 0, "op": "all_reduce", "count": 4, "expected": 1}, "zh") in visible
    assert "  进程 1：all_reduce 完成了 4 次" in visible
    for ws in HIDDEN_WS:
        hidden = suite.output_of(results, f"ws{ws}.one_all_reduce")
        assert render("cause.counts_more_generic", {"op": "all_reduce"}, "zh") in hidden and "4" not in hidden
        # the answer was right: the hint speaks of the count, not of a wrong result
        assert render("hint.wrong_counts", {}, "zh") in hidden and render("hint.wrong", {}, "zh") not in hidden
    needs_value = suite.output_of(mistakes["m03_not_divided_by_k"], "ws3.one_all_reduce")
    assert render("hint.wrong", {}, "zh") in needs_value and render("hint.wrong_counts", {}, "zh") not in needs_value


def test_the_account_compares_with_one_sync_per_micro_batch():
    """Syncing every micro-batch sends K times the whole gradient, however the step's all-reduces were cut."""
    from grader.records import RankRecord, RunOutcome, RunRequest
    from grader.switch import Call
    from grader.verify.teach import exercise_notes

    def call(seq, numel):
        return Call(rank=0, seq=seq, method="allreduce", op="all_reduce", group=(0, 1), sends=True, receives=True,
                    inputs=[{"dtype": "torch.float32", "numel": numel}], completed=True, ok=True)
    for cut in ([DECL.NUMEL], [17, DECL.NUMEL - 17], [DECL.NUMEL] * DECL.K):
        record = RankRecord(0)
        record.calls = [call(i, n) for i, n in enumerate(cut)]
        header, line = exercise_notes(EXERCISE, RunOutcome(RunRequest(world_size=2, source="", filename="s.py"), [record]))
        assert line.params == {"ws": 2, "rank": 0, "count": len(cut), "bytes": 4 * sum(cut), "k": DECL.K,
                               "every": DECL.K * 4 * DECL.NUMEL}, (cut, line)


@pytest.mark.timeout(200)
def test_mistakes_in_english(tmp_path):
    """The same causes in English: two mistakes through one `batch --lang en`."""
    folder = tmp_path / "class"
    folder.mkdir()
    for name in ("m02_ddp_without_no_sync", "m03_not_divided_by_k"):
        shutil.copy(FIX / "mistakes" / f"{name}.py", folder)
    proc = run_cli("batch", str(folder), "--out", str(tmp_path / "out"), "--exercise", EX, "--lang", "en", timeout=190)
    assert proc.returncode == 0, proc.stderr
    results = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in (tmp_path / "out").glob("m0*.json")}
    assert results["m03_not_divided_by_k"]["score"] == 10
    assert render(own("cause.not_divided_by_k"), {}, "en") in suite.output_of(results["m03_not_divided_by_k"], "ws3.grad")
    assert render(own("cause.not_divided_by_k"), {}, "en").startswith("Cause: the gradient is the sum of the K micro-batch")
    counted = suite.output_of(results["m02_ddp_without_no_sync"], "ws2.one_all_reduce")
    assert "Cause: rank 0 completed all_reduce 4 times; wanted: 1." in counted
    assert "Cause: a rank ran all_reduce more times than wanted" in suite.output_of(results["m02_ddp_without_no_sync"],
                                                                                   "ws4.one_all_reduce")


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", CHEATS)
def test_cheat_scores_0_on_what_it_fakes(cheats, name):
    """A gradient not derived from the all-reduce: no value points, and no count points beside it."""
    results = cheats[name]
    assert suite.failing(results) == {**every("grad", "not_collective"), **every("one_all_reduce", "wrong")}
    assert results["score"] == 10
    assert all(suite.scores(results)[f"ws{ws}.{kind}"] == 0 for ws in WS for kind in ("grad", "one_all_reduce"))
    # a local answer stays the same when the data in flight changes; a laundered one, or one rank's data
    # for all, follows that data, though not as the exercise asks: each is told what it did
    key = "fail.not_collective_derived" if name in ("c02_launder_through_all_reduce", "c03_rank0_contributes_for_all") \
        else "fail.not_collective"
    assert render(key, {"rank": 0, "quantity": "grad", "ops": ["all_reduce"]}, "zh") in suite.output_of(results, "ws2.grad")


@pytest.mark.timeout(500)
@pytest.mark.parametrize("name", TINY_LAUNDERS)
def test_a_tiny_launder_scores_0_and_its_send_is_named(cheats, name):
    """What a rank sent is judged relative to its own size (exercise/linear.fit): 1e-6 x (mostly the local
    answer) is not the rank's micro-gradients, so nothing is proven; the value the code makes is wrong, and
    the cause says what was measured (what the rank sent), hidden checks too."""
    results = cheats[name]
    assert suite.failing(results) == {**every("grad", "wrong"), **every("one_all_reduce", "wrong")}
    assert results["score"] == 10
    for ws in WS:
        assert own("cause.sent_not_own") in suite.named(results, f"ws{ws}.grad"), ws
        assert render(own("cause.sent_not_own"), {}, "zh") in suite.output_of(results, f"ws{ws}.grad")
    # the launder through the full-size answer (c02) is named the same way
    assert own("cause.sent_not_own") in suite.named(cheats["c02_launder_through_all_reduce"], "ws2.grad")


@pytest.mark.timeout(500)
def test_hidden_checks_reveal_no_values(honest, mistakes, cheats):
    for group in (honest, mistakes, cheats):
        for name, results in group.items():
            assert suite.hidden_leaks(results, r"K - 1") == [], name


# -- entry points ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_list_names_the_exercise():
    proc = run_cli("list", "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    assert ("  grad_accum_no_sync: Gradient accumulation: one all-reduce for K micro-batches (no_sync) "
            "(100 points; visible world sizes 2)") in proc.stdout
    assert len(re.findall(r"^  \w+: .*\(100 points; visible world sizes", proc.stdout, re.M)) == len(registry.available())


@pytest.mark.timeout(120)
def test_check_in_chinese_infers_the_exercise_and_shows_the_count(tmp_path):
    path = tmp_path / f"{EX}.py"
    shutil.copy(FIX / "mistakes" / "m02_ddp_without_no_sync.py", path)
    proc = run_cli("check", str(path), "--lang", "zh")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(f"== {EX}.py: 得分：30 / 40 ==")
    assert "  进程 0：这一步完成了 4 次 all_reduce，共发送 512 字节；每个 micro-batch 都同步（4 次）要发送 512 字节。" in proc.stdout
    assert not re.search(r"隐藏测试 \d", proc.stdout) and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_grade_and_batch(tmp_path):
    got = suite.solution_and_stub(EX, tmp_path)
    assert got["grade"] == {"solution": 100, "release": 0}
    assert got["batch"] == {"solution": "100", "stub": "0"}
    stub = got["grade_results"]["release"]
    assert "TODO 1 (accumulate K micro-batch gradients without syncing)" in stub["tests"][0]["output"]


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_the_notebook_check():
    got = suite.notebook_checks(EX)
    assert got["solution"].returncode == 0 and "Score: 40 / 40" in got["solution"].stdout, got["solution"].stdout
    assert "rank 0: 1 all_reduce this step, 128 bytes sent; syncing every micro-batch (4 times) sends 512 bytes." \
        in got["solution"].stdout
    assert got["release"].returncode == 1 and "Score: 0 / 40" in got["release"].stdout


# -- the release, the notebook, the words --------------------------------------------------------------

def test_student_versions_are_generated_from_the_solution():
    p = suite.paths(EX)
    assert p["release_py"].read_text(encoding="utf-8") == release.clear_solutions(p["solution_py"].read_text(encoding="utf-8"))
    stub = p["release_py"].read_text(encoding="utf-8")
    assert "with ddp.no_sync(): ... backward()" in stub and "sync = contextlib.nullcontext()" not in stub


def test_notebook_cells_are_the_py_solution_and_the_rubric():
    suite.notebook_matches_solution(EX, ("make_model", "micro_batch", "loss_fn"))


def test_exercise_messages_are_bilingual_and_hidden_safe():
    suite.messages_are_bilingual_and_hidden_safe(EX, r"K - 1")


# -- the declaration's own pieces, without processes --------------------------------------------------

def test_the_numpy_data_is_what_torch_computes():
    """micro_gradient (numpy, the supervisor's) against autograd on the stub's own model and batches."""
    import torch.nn.functional as F
    namespace: dict = {}
    exec(compile(suite.paths(EX)["release_py"].read_text(encoding="utf-8"), "stub", "exec"), namespace)
    for rank in range(4):
        for k in range(DECL.K):
            model = namespace["make_model"]()
            x, y = namespace["micro_batch"](rank, k)
            F.mse_loss(model(x), y).backward()
            assert np.array_equal(model.weight.grad.double().numpy().reshape(-1), DECL.micro_gradient(rank, k))


TWICE = {"cause.divided_by_ws_twice", "cause.averaged_then_divided", "cause.summed_divided_twice"}


def test_the_mistakes_table_names_each_mistake_from_its_values():
    by_hand = [SimpleNamespace(op="all_reduce", sends=True, reduce="SUM", sent_values=lambda: [DECL.own_mean(1)])]
    for ws in WS:
        assert suite.diagnose(EXERCISE, "grad", DECL.right(1, ws), ws, 1, outcome="not_collective") == []
        patterns = [(m.cause, m.value(1, ws)) for m in EXERCISE.mistakes if m.value is not None
                    and (m.ws is None or m.ws(ws))]
        for key, values in patterns:
            found = suite.diagnose(EXERCISE, "grad", values, ws, 1, by_hand if key == "cause.summed_divided_twice" else ())
            if ws != DECL.K:
                assert key in found and len(found) == 1 or key == "cause.averaged_then_divided", (ws, key, found)
            else:
                assert found, (ws, key, found)
        if ws != DECL.K:   # no two mistakes alike (the same cause may have two forms)
            for (k1, v1), (k2, v2) in zip(patterns, patterns[1:]):
                assert k1 == k2 or not np.allclose(v1, v2, rtol=1e-4, atol=1e-6) or {k1, k2} <= TWICE, (ws, k1, k2)


def test_at_n_equal_k_what_the_rank_sent_tells_the_factors_apart():
    """N = K = 4: a gradient 4 times too large is K's with DDP (it divides by N itself) or when the rank sent
    its sum; N's when it sent its own mean. One 4 times too small is N's when the rank sent its own mean, and
    either's when it sent its mean / 4."""
    ws, rank = 4, 1
    mean = DECL.own_mean(rank)

    def sent(values, op="all_reduce"):
        return SimpleNamespace(op=op, sends=True, sent_values=lambda: [values])
    big = DECL.K * DECL.right(rank, ws)
    broadcast = SimpleNamespace(op="broadcast", sends=False, sent_values=lambda: [])
    assert suite.diagnose(EXERCISE, "grad", big, ws, rank, [broadcast, sent(mean / ws)]) == ["cause.not_divided_by_k"]
    assert suite.diagnose(EXERCISE, "grad", big, ws, rank, [sent(DECL.K * mean)]) == ["cause.not_divided_by_k"]
    assert suite.diagnose(EXERCISE, "grad", big, ws, rank, [sent(mean)]) == ["cause.not_divided_by_ws"]
    small = DECL.right(rank, ws) / DECL.K
    # its mean / K is its mean / N too: one division too many, not which
    assert suite.diagnose(EXERCISE, "grad", small, ws, rank, [sent(mean / DECL.K)]) == ["cause.divided_once_too_often"]
    assert suite.diagnose(EXERCISE, "grad", small, ws, rank, [sent(mean)]) == ["cause.summed_divided_twice"]
    avg = SimpleNamespace(op="all_reduce", sends=True, reduce="AVG", sent_values=lambda: [mean])
    assert suite.diagnose(EXERCISE, "grad", small, ws, rank, [avg]) == ["cause.averaged_then_divided"]
    assert sorted(suite.diagnose(EXERCISE, "grad", small, ws, rank, [broadcast, sent(mean / ws)])) == [
        "cause.divided_by_k_twice", "cause.divided_by_ws_twice"]   # DDP: either division is one too many


# -- exercise/linear.fit: what a rank sent is its own micro-batch gradients, relative to its size --------

def _micro(rank: int) -> list[np.ndarray]:
    return [DECL.micro_gradient(rank, k) for k in range(DECL.K)]


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float64)


def _tiny_launder(rank: int, ws: int, eps: float, lam: float = 1.0) -> np.ndarray:
    """The red team's send (fixtures cheats/c05, c06): eps x (the local answer T + the part of the rank's
    micro-gradient span that makes the least-squares fit find lam on each micro-batch)."""
    own = np.stack(_micro(rank), axis=1)
    answer = DECL.right(rank, ws)
    return _f32(eps * (answer + own @ (lam * np.ones(DECL.K) - np.linalg.pinv(own) @ answer)))


def test_fit_reads_honest_float32_sends():
    """The micro-batch gradients summed in any order, divided by K, N or N K before or after, in float32;
    or added to what an earlier all-reduce delivered (an all-reduce per micro-batch): its own data."""
    from grader.verify.linear import fit
    for ws in (2, 3, 4):
        for rank in range(ws):
            micro = _micro(rank)
            for order in (range(DECL.K), reversed(range(DECL.K)), (2, 0, 3, 1)):
                total = np.float32(0)
                for k in order:
                    total = _f32(total + np.float32(1) * micro[k].astype(np.float32))
                for scale, sent in ((1.0, total), (1 / DECL.K, _f32(total / DECL.K)), (1 / ws, _f32(total / ws)),
                                    (1 / (ws * DECL.K), _f32(_f32(total / ws) / DECL.K))):
                    coef = fit(sent, micro, "torch.float32")
                    assert coef is not None and np.allclose(coef, scale, rtol=1e-5), (ws, rank, scale, coef)
            delivered = _f32(np.sin(np.arange(DECL.NUMEL) * (rank + 1.3)) * 2.5)   # deltas and all
            coef = fit(_f32(delivered + micro[1] / DECL.K), micro + [delivered], "torch.float32")
            assert coef is not None and np.allclose(coef, [0, 1 / DECL.K, 0, 0, 1], atol=1e-6), coef


def test_fit_reads_small_honest_gradients():
    """A rank's own data can be small (1e-6, 1e-20 of these): the tolerance scales with it, so its
    float32 sum still fits with the same coefficients."""
    from grader.verify.linear import fit
    for small in (1e-3, 1e-6, 1e-20):
        micro = [small * m for m in _micro(1)]
        sent = _f32(sum(m.astype(np.float32) for m in micro) / DECL.K)
        coef = fit(sent, micro, "torch.float32")
        assert coef is not None and np.allclose(coef, 1 / DECL.K, rtol=1e-4), (small, coef)


def test_fit_refuses_the_tiny_launder_at_every_size():
    """cheats/c05 and c06 once fitted under float32's absolute floor of 1e-5: at 1e-6 of the answer's
    size, the part outside the rank's micro-gradients (~10% of the send, or ~99%) sat below it. Relative
    to what was sent it is far beyond float32's rounding, at 1e-6 as at 1."""
    from grader.verify.linear import fit
    for ws in (2, 3, 4):
        for rank in range(ws):
            for lam in (1.0, 0.01):
                for eps in (1e-9, 1e-6, 1e-3, 1.0):
                    assert fit(_tiny_launder(rank, ws, eps, lam), _micro(rank), "torch.float32") is None, (ws, rank, lam, eps)


def test_fit_refuses_sends_mostly_something_else():
    """The local answer (laundering), another rank's micro-batches, the weight, or the own sum with 1% of
    something else: none is this rank's data, at any scale (float32 allows 1e-4 of the send)."""
    from grader.verify.linear import fit
    micro = _micro(0)
    own = sum(micro) / DECL.K
    for foreign in (DECL.right(0, 2), sum(_micro(1)), DECL.initial_weight().reshape(-1),
                    own + 1e-2 * np.linalg.norm(own) * np.cos(np.arange(own.size))):
        for scale in (1e-8, 1e-3, 1.0, 1e4):
            assert fit(_f32(scale * foreign), micro, "torch.float32") is None, scale
