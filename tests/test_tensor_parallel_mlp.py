"""The seventh exercise, tensor_parallel_mlp (solutions/tensor_parallel_mlp/): its reference step against a plain
torch model, its mistakes told apart, and the solution and the stub through `check`.

Its fixtures (tests/fixtures/tensor_parallel_mlp/: the honest styles by hand, with
torch.distributed.nn.functional, Megatron's f and g, functional collectives, DTensor's parallelize_module, async,
coalesced, float64 score 100; each mistake and cheat gets what its sidecar says) are graded by the fixture tests.
"""
from __future__ import annotations

import ast
import importlib.util
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, run_cli
from grader.exercise import SentAs, reference, registry

EX = "tensor_parallel_mlp"
EXERCISE = registry.get(EX)
WS = (2, 3, 4)


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DECL = _module(ROOT / "solutions" / EX / "exercise.py", "tp_exercise")
STUDENT = _module(ROOT / "solutions" / EX / f"{EX}.py", "tp_solution")   # its helpers, as students get them


def torch_reference(ws: int) -> list[dict]:
    """Each rank's values from the unsplit model with autograd, in float64: Y, dX, and the rank's slices of the
    full weights' gradients."""
    x = STUDENT.make_input().double().requires_grad_()
    a, b = (w.double().requires_grad_() for w in STUDENT.make_weights())
    y = F.gelu(x @ a) @ b
    (0.5 * ((y - STUDENT.make_target().double()) ** 2).sum()).backward()
    s = STUDENT.H // ws
    return [{"y": y.detach(), "dx": x.grad, "dA": a.grad[:, r * s:(r + 1) * s], "dB": b.grad[r * s:(r + 1) * s]}
            for r in range(ws)]


def test_the_declarations_data_is_the_students():
    for mine, theirs in ((DECL.X, STUDENT.make_input()), (DECL.T, STUDENT.make_target()),
                         (DECL.A, STUDENT.make_weights()[0]), (DECL.B, STUDENT.make_weights()[1])):
        assert np.array_equal(mine, theirs.double().numpy())
    u = torch.linspace(-3, 3, 101, dtype=torch.float64, requires_grad=True)
    F.gelu(u).sum().backward()
    assert np.allclose(DECL.gelu(u.detach().numpy()), F.gelu(u).detach().numpy(), rtol=1e-12, atol=1e-12)
    assert np.allclose(DECL.gelu_grad(u.detach().numpy()), u.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert np.allclose(STUDENT.gelu_grad(u.detach()).numpy(), u.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ws", WS)
def test_the_reference_step_is_the_unsplit_model_with_autograd(ws):
    ideal = reference.outcome(DECL.step, ws)
    for rank, expected in enumerate(torch_reference(ws)):
        for name, value in expected.items():
            assert np.allclose(ideal[rank][name], value.numpy().reshape(-1), rtol=1e-12, atol=1e-12), (ws, rank, name)
    sends = reference.sent(DECL.step, ws)   # two all-reduces of the activation's size, no more
    assert [(op, x.size) for op, x in sends[0]] == [("all_reduce", 32), ("all_reduce", 32)]


@pytest.mark.parametrize("ws", WS)
def test_every_mistake_of_the_step_is_wrong_and_those_alike_are_told_apart_by_their_sends(ws):
    right = reference.outcome(DECL.step, ws)
    variants = [m for m in EXERCISE.mistakes if m.knobs]
    for mistake in variants:
        wrong = reference.outcome(DECL.step, ws, **mistake.knobs)
        names = [mistake.quantity] if mistake.quantity else [q.name for q in EXERCISE.quantities]
        assert any(not np.allclose(wrong[0][n], right[0][n]) for n in names), mistake
        assert mistake.tie == (SentAs(mistake.knobs),)
    alike = 0
    for one in variants:   # two mistakes whose numbers agree differ in what a rank sends (the same knobs: both named)
        for other in variants:
            if one.cause != other.cause and one.knobs != other.knobs and all(
                    np.allclose(reference.outcome(DECL.step, ws, **one.knobs)[0][n],
                                reference.outcome(DECL.step, ws, **other.knobs)[0][n]) for n in ("y", "dx", "dA", "dB")):
                mine, theirs = reference.sent(DECL.step, ws, **one.knobs)[0], reference.sent(DECL.step, ws, **other.knobs)[0]
                assert len(mine) != len(theirs) or any(not np.allclose(a, b) for (_, a), (_, b) in zip(mine, theirs))
                alike += 1
    assert alike or ws != 2   # at 2 ranks, dY summed over the ranks doubles it, as a loss without the 0.5 does


@pytest.mark.timeout(240)
def test_check_passes_the_solution_with_the_megatron_account_and_fails_the_stub_cleanly():
    solution = run_cli("check", str(ROOT / "solutions" / EX / f"{EX}.py"), "--lang", "en", "--backend", "none")
    assert solution.returncode == 0 and solution.stdout.startswith(f"== {EX}.py: Score: 40 / 40 =="), solution.stdout
    assert ("  rank 1: 2 all_reduce, 256 bytes sent (S = 128 bytes each; a ring sends about 128 per call, 2(N-1)/N x S); "
            "this rank holds 96 of the 192 weight-gradient elements.") in solution.stdout
    stub = run_cli("check", str(ROOT / "assignments" / EX / f"{EX}.py"), "--lang", "en", "--backend", "none")
    assert stub.returncode == 1 and stub.stdout.startswith(f"== {EX}.py: Score: 0 / 40 =="), stub.stdout
    assert "complete TODO 1 (forward: all-reduce the partial outputs) and TODO 2" in stub.stdout
    assert "Traceback" not in stub.stdout + stub.stderr


def test_the_notebook_holds_the_solutions_functions_and_names_hidden_checks_by_order():
    cells = json.loads((ROOT / "solutions" / EX / f"{EX}.ipynb").read_text(encoding="utf-8"))["cells"]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}
    functions = lambda text: {n.name: ast.dump(n) for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}  # noqa: E731
    ours = functions((ROOT / "solutions" / EX / f"{EX}.py").read_text(encoding="utf-8"))
    given = functions(by_id["given"])
    assert set(given) == {"_grid", "make_input", "make_target", "make_weights", "gelu_grad"}
    assert {**given, **functions(by_id["run_worker"])} == {n: ours[n] for n in (*given, "run_worker")}
    hidden = sorted({c.world_size for c in EXERCISE.checks if c.hidden})
    assert [gid for gid in by_id if gid and gid.startswith("test_")] == [
        f"test_hidden_{c.id.split('.', 1)[1]}_{hidden.index(c.world_size) + 1}" if c.hidden else "test_" + c.id.replace(".", "_")
        for c in EXERCISE.checks]
