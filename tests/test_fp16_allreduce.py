"""The fifth exercise, fp16_allreduce (solutions/fp16_allreduce/), through its entry points, and the
declaration's own pieces without processes.

Its fixtures (tests/fixtures/fp16_allreduce/: the honest styles (float16 and bfloat16 by hand, DDP's
fp16_compress_hook, a bfloat16 hook of one's own, functional collectives, async) score 100; each mistake gets
its exact score, outcomes and causes; each cheat scores 0 on what it fakes, as each sidecar says) are graded by
tests/test_fixtures.py. A float32 all-reduce is right (the value checks pass: the answer is within float16's
tolerance either way) and is told apart by the volume check alone.
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
from grader.verify.compare import all_close

EX = "fp16_allreduce"
FIX = FIXTURES / EX
WS = (2, 3, 4)
EXERCISE = registry.get(EX)
_spec = importlib.util.spec_from_file_location("fp16_exercise", ROOT / "solutions" / EX / "exercise.py")
DECL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DECL)
# the fixed words with digits its hidden checks may show (its fixtures' defaults.toml, tests/expectations.py)
ALLOWED = "|".join(expectations.defaults(EXERCISE)["hidden_may_show"])


def own(key: str) -> str:
    return f"{EX}.{key}"


HONEST = sorted(p.stem for p in (FIX / "honest").glob("*.py"))


# -- the fixtures (graded by tests/test_fixtures.py, each against its sidecar) -----------------------------

def test_the_honest_styles_cover_the_librarys_ways():
    texts = {name: (FIX / "honest" / f"{name}.py").read_text(encoding="utf-8") for name in HONEST}
    assert any("torch.bfloat16" in t for t in texts.values()) and any(".half()" in t for t in texts.values())
    assert any("default_hooks.fp16_compress_hook" in t for t in texts.values())
    assert any("funcol.all_reduce" in t for t in texts.values())
    assert not any("autocast" in t for t in texts.values())   # manual casts: autocast changes no communication
    assert ".chunk(4)" in texts["h08_float16_buckets"]   # the weights proven through four all-reduce buckets
    assert "find_unused_parameters=True" in texts["h09_ddp_hook_find_unused_parameters"]   # DDP's int32 map: not traffic


# -- entry points ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_list_names_the_exercise():
    proc = run_cli("list", "--lang", "en")
    assert ("  fp16_allreduce: Mixed-precision communication: all-reduce in float16, update the weights in float32 "
            "(100 points; visible world sizes 2)") in proc.stdout


@pytest.mark.timeout(120)
def test_check_in_chinese_infers_the_exercise_and_shows_the_bytes(tmp_path):
    path = tmp_path / f"{EX}.py"
    shutil.copy(FIX / "mistakes" / "m01_float32_all_reduce.py", path)
    proc = run_cli("check", str(path), "--lang", "zh")
    assert proc.returncode == 1 and proc.stdout.startswith(f"== {EX}.py: 得分：30 / 40 =="), proc.stdout
    assert "  进程 0：all_reduce 发送了 512 字节（torch.float32）；同样的元素用 float32 是 512 字节。" in proc.stdout


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_grade_and_batch(tmp_path):
    got = suite.solution_and_stub(EX, tmp_path)
    assert got["grade"] == {"solution": 100, "release": 0}
    assert got["batch"] == {"solution": "100", "stub": "0"}


@pytest.mark.timeout(300)
def test_solution_100_and_stub_0_through_the_notebook_check():
    got = suite.notebook_checks(EX)
    assert got["solution"].returncode == 0 and "Score: 40 / 40" in got["solution"].stdout, got["solution"].stdout
    assert "rank 1: all_reduce sent 256 bytes (torch.float16); the same elements in float32 are 512 bytes." in got["solution"].stdout
    assert got["release"].returncode == 1 and "Score: 0 / 40" in got["release"].stdout


# -- the release, the notebook, the words --------------------------------------------------------------

def test_student_versions_are_generated_from_the_solution():
    p = suite.paths(EX)
    assert p["release_py"].read_text(encoding="utf-8") == release.clear_solutions(p["solution_py"].read_text(encoding="utf-8"))
    stub = p["release_py"].read_text(encoding="utf-8")
    assert "TODO 1: half = model.weight.grad.half()" in stub and "grad = half.float() / world_size" not in stub


def test_notebook_cells_are_the_py_solution_and_the_rubric():
    suite.notebook_matches_solution(EX, ("make_model", "batch", "loss_fn"))


def test_exercise_messages_are_bilingual_and_hidden_safe():
    suite.messages_are_bilingual_and_hidden_safe(EX, ALLOWED)


# -- the declaration's own pieces, without processes --------------------------------------------------

def test_the_data_makes_float16_and_float32_answers_alike_to_the_value_check():
    """The float16 answer is not exact (it differs from the float32 mean everywhere) but is within float16's
    tolerance; the weights updated in float32 from it stay within float32's; in float16 they do not."""
    for ws in WS:
        mean = DECL.mean(ws)
        half = np.sum([DECL.gradient(q).astype(np.float16) for q in range(ws)], axis=0).astype(np.float64) / ws
        assert np.all(half != mean) and all_close(half, mean, "torch.float16") and not all_close(half, mean, "torch.float32")
        start = DECL.initial_weights().reshape(-1)
        assert all_close(start - DECL.LR * half, (DECL.initial_weights() - DECL.LR * DECL.mean(ws)), "torch.float32")
        in_half = (start.astype(np.float16) - (DECL.LR * half).astype(np.float16)).astype(np.float64)
        assert not all_close(in_half, (DECL.initial_weights() - DECL.LR * DECL.mean(ws)), "torch.float32")


def test_the_numpy_data_is_what_torch_computes():
    import torch.nn.functional as F
    namespace: dict = {}
    exec(compile(suite.paths(EX)["release_py"].read_text(encoding="utf-8"), "stub", "exec"), namespace)
    for rank in range(4):
        model = namespace["make_model"]()
        x, y = namespace["batch"](rank)
        F.mse_loss(model(x), y).backward()
        assert np.allclose(model.weight.grad.double().numpy().reshape(-1), DECL.gradient(rank), rtol=1e-5, atol=1e-7)
    assert np.allclose(namespace["make_model"]().weight.detach().double().numpy(), DECL.initial_weights().reshape(DECL.OUT_FEATURES, DECL.IN_FEATURES), rtol=2e-7, atol=0)


def test_diagnosis_names_each_mistake_from_its_values():
    for ws in WS:
        mean, start = DECL.mean(ws), DECL.initial_weights().reshape(-1)
        assert suite.diagnose(EXERCISE, "grad", mean, ws, 1) == []
        assert suite.diagnose(EXERCISE, "weights", (DECL.initial_weights() - DECL.LR * DECL.mean(ws)), ws, 1) == []
        assert suite.diagnose(EXERCISE, "grad", ws * mean, ws, 1) == ["cause.not_divided"]
        assert suite.diagnose(EXERCISE, "grad", mean / ws, ws, 1) == ["cause.divided_twice"]
        assert suite.diagnose(EXERCISE, "weights", start - DECL.LR * ws * mean, ws, 1) == ["cause.not_divided"]
        assert suite.diagnose(EXERCISE, "weights", start - DECL.LR * DECL.gradient(1), ws, 1) == ["cause.local_gradient"]
        assert suite.diagnose(EXERCISE, "weights", start, ws, 1) == ["cause.no_update"]
        half = (start.astype(np.float16) - (DECL.LR * mean).astype(np.float16)).astype(np.float64)
        assert suite.diagnose(EXERCISE, "weights", half, ws, 1) == ["cause.weights_in_half"]
        assert suite.diagnose(EXERCISE, "weights", (DECL.initial_weights() - DECL.LR * DECL.mean(ws)), ws, 1, dtype="torch.float16") == [
            "cause.weights_in_half"]
        # the rank's own gradient after an all_reduce that completed: its result (on a .half() copy) never read;
        # without the all_reduce, nothing is said of a copy
        from types import SimpleNamespace
        reduced = [SimpleNamespace(op="all_reduce", completed=True, ok=True)]
        own = DECL.gradient(1)
        for values in (own / ws, own):
            assert suite.diagnose(EXERCISE, "grad", values, ws, 1, reduced) == ["cause.half_copy_dropped"]
            assert suite.diagnose(EXERCISE, "grad", values, ws, 1) == []
        assert suite.diagnose(EXERCISE, "weights", start - DECL.LR * own / ws, ws, 1, reduced) == ["cause.half_copy_dropped"]


# -- exercise/linear.fit: what a rank sent in half precision is its own gradient, relative to its size ----

def _half(values: np.ndarray, dtype: str = "torch.float16") -> np.ndarray:
    """`values` as a rank sends them in `dtype` (torch rounds them: bfloat16 too), back in float64."""
    import torch
    return torch.from_numpy(np.asarray(values, dtype=np.float64)).to(getattr(torch, dtype.split(".")[1])).double().numpy()


HALF_DTYPES = ("torch.float16", "torch.bfloat16")


def test_fit_reads_honest_half_sends_at_any_scale():
    """The gradient scaled by anything (1/N before or after the cast, a loss scale, 2^15), rounded once or
    twice in float16 or bfloat16: its own data, with the scale as coefficient."""
    from grader.verify.linear import fit
    for rank in range(4):
        g = DECL.gradient(rank)
        for dtype in HALF_DTYPES:
            for scale in (1.0, 1 / 2, 1 / 3, 1 / 4, 1024.0, 2.0 ** 15, 1e-2):
                sends = [_half(scale * g, dtype),                                   # scaled, then cast
                         _half(_half(g, dtype) * scale, dtype)]                     # cast, then scaled in half
                for sent in sends:
                    coef = fit(sent, [g], dtype)
                    assert coef is not None and abs(coef[0] / scale - 1) < 1e-2, (rank, dtype, scale, coef)


def test_fit_reads_small_honest_gradients_and_float16_subnormals():
    """A rank's own data can be small: the tolerance scales with it. Down to float16's subnormal range
    (below 2^-14 = 6.1e-5 every element is rounded to a multiple of 2^-24), an honest send still fits."""
    from grader.verify.linear import fit
    g = DECL.gradient(1)
    for small in (1e-2, 1e-3, 1e-4, 2e-5):
        own = small * g                          # the rank's own data, small
        sent = _half(own)
        assert np.any(np.abs(sent) < 2.0 ** -14) or small >= 1e-3
        coef = fit(sent, [own], "torch.float16")
        assert coef is not None and abs(coef[0] - 1) < 2e-2, (small, coef)
        assert fit(_half(own, "torch.bfloat16"), [own], "torch.bfloat16") is not None
    # so little that float16 keeps a few subnormal steps of it: not the rank's data to float16's precision
    assert fit(_half(1e-7 * g), [g], "torch.float16") is None


def test_fit_refuses_tiny_junk_whatever_its_size():
    """The red team's send (fixtures cheats/c06): one repeated constant, ~1e-3, that a fixed absolute
    tolerance of 2e-2 once credited as eps x the gradient. Relative to what was sent it is ~100% something
    else, at every size; so is rounding noise in float16's subnormal range."""
    from grader.verify.linear import fit
    for rank in range(4):
        g = DECL.gradient(rank)
        eps = 5e-4 * (g @ g) / g.sum()
        for dtype in HALF_DTYPES:
            for scale in (1.0, 1e-2, 1e-4, 1e2):
                assert fit(_half(scale * eps * np.ones(DECL.NUMEL), dtype), [g], dtype) is None, (rank, dtype, scale)
        noise = np.where(np.arange(DECL.NUMEL) % 3 == 0, 2.0 ** -24, 0.0)   # a few subnormal steps
        assert fit(noise, [g], "torch.float16") is None


def test_fit_refuses_sends_mostly_something_else():
    """Another rank's gradient, the mean (laundering), the weights, or the gradient with 10% of something
    else: none is this rank's gradient, at any scale."""
    from grader.verify.linear import fit
    g, other = DECL.gradient(0), DECL.gradient(1)
    mean = DECL.mean(2)
    for foreign in (other, mean, DECL.initial_weights().reshape(-1), g + 0.1 * np.linalg.norm(g) * np.sin(np.arange(g.size)) / 8):
        for dtype in HALF_DTYPES:
            for scale in (1.0, 1 / 4, 1e-3, 1024.0):
                assert fit(_half(scale * foreign, dtype), [g], dtype) is None, (dtype, scale)


def test_fit_is_the_same_at_every_scale():
    """The rule has no absolute floor (but float16's subnormal step): fit(s x sent) fits exactly when
    fit(sent) does, with s x its coefficients (float64 sends, no rounding)."""
    from grader.verify.linear import fit
    g, other = DECL.gradient(2), DECL.gradient(3)
    for sent in (3 * g, 0.999 * g + 1e-3 * other, g + 0.3 * other, np.ones(DECL.NUMEL)):
        verdicts = set()
        for scale in (1e-12, 1e-6, 1e-3, 1.0, 1e3, 1e6):
            coef = fit(scale * sent, [g], "torch.float64")
            verdicts.add(coef is None)
            if coef is not None:
                assert np.allclose(coef, scale * fit(sent, [g], "torch.float64"), rtol=1e-9)
        assert len(verdicts) == 1, sent[:3]


def test_foreign_sends_names_what_was_measured():
    """The exercise's cause (cause.sent_not_own) reads a run's records: an all_reduce of the gradient's
    size whose send is not the rank's gradient as fit() reads it; a loss all-reduced beside it is not one."""
    from grader.verify.linear import foreign_sends
    from grader.switch.record import Call

    def all_reduce(seq, values, at):
        values = np.asarray(values)
        return Call(rank=1, seq=seq, method="allreduce", op="all_reduce", group=(0, 1), sends=True, receives=True,
                    inputs=[{"dtype": f"torch.{values.dtype}", "shape": [values.size], "numel": values.size}],
                    sent=[values], delivered_arrays=[2 * values], completed=True, ok=True, entered_at=at, completed_at=at + 1)
    g = DECL.gradient(1)
    loss = all_reduce(0, np.array([0.5], dtype=np.float16), 0)
    honest = all_reduce(1, (1024 * g).astype(np.float16), 2)
    junk = all_reduce(1, np.full(DECL.NUMEL, 1e-3, dtype=np.float16), 2)
    assert foreign_sends([loss, honest], [g], DECL.NUMEL) == []
    assert foreign_sends([loss, junk], [g], DECL.NUMEL) == [junk]
    zeros = all_reduce(1, np.zeros(DECL.NUMEL, dtype=np.float16), 2)
    assert foreign_sends([zeros], [g], DECL.NUMEL) == [zeros]
    # synthetic calls that are not a run's records (the diagnosis tests'): nothing to read
    from types import SimpleNamespace
    assert foreign_sends([SimpleNamespace(op="all_reduce", completed=True, ok=True)], [g], DECL.NUMEL) == []
