"""The fourth exercise, grad_accum_no_sync (solutions/grad_accum_no_sync/), through its entry points: `list`,
`check`, the solution and the stub through `grade`, `batch` and the notebook check (nbgrader:
tests/test_nbgrader_e2e.py, one course for every exercise); and the declaration's own pieces, without processes.

Its fixtures (tests/fixtures/grad_accum_no_sync/: the honest styles (DDP with no_sync, by hand, functional
collectives, a comm hook ...) score 100; each mistake gets its exact score, outcomes and named causes; each
cheat scores 0 on what it fakes, as each sidecar says) are graded by tests/test_fixtures.py.
"""
from __future__ import annotations

import importlib.util
import re
import shutil

import numpy as np
from types import SimpleNamespace
import pytest

import exercise_suite as suite
import expectations
from conftest import FIXTURES, ROOT, run_cli
from grader.exercise import registry
from grader.integrations import release

EX = "grad_accum_no_sync"
FIX = FIXTURES / EX
WS = (2, 3, 4)
EXERCISE = registry.get(EX)   # loading it adds its messages to the catalog under its name
_spec = importlib.util.spec_from_file_location("grad_accum_exercise", ROOT / "solutions" / EX / "exercise.py")
DECL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DECL)
# the fixed words with digits its hidden checks may show (its fixtures' defaults.toml, tests/expectations.py)
ALLOWED = "|".join(expectations.defaults(EXERCISE)["hidden_may_show"])


def own(key: str) -> str:
    return f"{EX}.{key}"


HONEST = sorted(p.stem for p in (FIX / "honest").glob("*.py"))


# -- the fixtures (graded by tests/test_fixtures.py, each against its sidecar) -----------------------------

def test_the_honest_styles_cover_the_librarys_ways_and_other_scales():
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
    suite.messages_are_bilingual_and_hidden_safe(EX, ALLOWED)


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
            else:   # N = K: two causes leave these numbers; without what the rank sent neither is certain, so at
                # most one is named (what it sent tells them apart: the test below)
                assert len(found) <= 1, (ws, key, found)
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
