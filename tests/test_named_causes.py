"""The engine's rules behind this issue's fixtures, where a fixture cannot show them alone: an integer sum of the
student's own is evidence, while one-element flags, MAX, int8 and torch's own integers travel as sent (on
records the real switch made: tests/switchsim.py); every cause has a value-free form a hidden check shows; a
rooted quantity's pass words and its wrong root come from the engine, with no message of the exercise's.

The fixtures themselves (a float16 head and a float32 tail; collectives in a dead branch; int64 counts
all-reduced; a constant world size; a sum divided by the node size; an integer cast; bytes viewed as another
dtype; a cast that overflowed before any sum; one number all-reduced beside a local answer; a DDP step thrown
away ...) are graded against their sidecars, in zh and en, by tests/test_fixtures.py.
"""
from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from conftest import results_of, run_cli
from grader.exercise import registry
from grader.feedback.messages import CATALOG, render
from grader.feedback.render import HIDDEN_VARIANTS, hidden_safe
from grader.switch import perturb
from grader.exercise.spec import Quantity
from grader.verify.observe import RunView
from grader.verify.provenance import Tracer
from switchsim import Sim

LANGS = ("zh", "en")


# -- an integer sum of the student's own is evidence; torch's own integers and flags travel as sent ---------

N = 8
COUNTS = Quantity("counts", local=lambda rank, ws: [float(rank + 1)] * N, combine="mean", through=("all_reduce",))
STUDENT = {"api": "all_reduce", "function": "run_worker"}


def _int_sum(values, reduce: str = "SUM", dtype: str = "torch.int64", **words) -> Sim:
    """Two ranks all-reduce integer tensors, with the words a rank's record gives of the call (`api`, the
    public function it went through; `function`, the submission's; `via`, a library's)."""
    sim = Sim(2, dtype=dtype)
    for rank, v in enumerate(values):
        sim.op(rank, "allreduce", [np.asarray(v)], [tuple(np.shape(v))], reduce=reduce, **words)
    return sim


def test_an_integer_sum_of_the_students_own_proves_its_value():
    sim = _int_sum([[1] * N, [2] * N], **STUDENT)
    delivered = [sim.delivered(r)[0] for r in range(2)]
    assert all(np.all(d > 3) and np.all(d == np.round(d)) for d in delivered)   # whole deltas, at least 1 each
    view = RunView(sim.run())
    assert all(Tracer(view, COUNTS).prove(r, delivered[r] / 2).ok for r in range(2))
    assert not any(Tracer(view, COUNTS).prove(r, np.full(N, 1.5)).ok for r in range(2))   # the answer computed locally


@pytest.mark.parametrize("case", ["one element", "max", "no public function", "ddp", "int8"])
def test_flags_maxima_and_torchs_own_integers_travel_as_sent(case):
    """A one-element flag, a MAX, a call that went through no public torch.distributed function (DDP's C++
    reducer all-reducing its unused-parameter map, a process group's own method), DDP's start-up and an int8
    tensor are not perturbed, and prove nothing: honest code that branches on them keeps working."""
    size = 1 if case == "one element" else N
    values = [[1] * size, [2] * size]
    words = {"no public function": {"function": "run_worker"}, "ddp": {**STUDENT, "via": "DistributedDataParallel"}}
    sim = _int_sum(values, reduce="MAX" if case == "max" else "SUM", dtype="torch.int8" if case == "int8" else "torch.int64",
                   **words.get(case, STUDENT))
    expect = np.max(values, axis=0) if case == "max" else np.sum(values, axis=0)
    assert all(np.array_equal(sim.delivered(r)[0], expect) for r in range(2))
    assert all(c.perturbed is None for calls in sim.switch.calls for c in calls)


def test_integers_past_the_limit_travel_as_sent():
    big = perturb.LIMIT["torch.int64"]
    sim = _int_sum([[big, 1], [big, 1]], **STUDENT)
    assert np.array_equal(sim.delivered(0)[0], [2 * big, 2])


# -- every cause teaches in a hidden check ---------------------------------------------------------------

# grader limits, not mistakes of the student's: hidden checks show their hint alone
LIMITS = {"why.layout", "why.too_complex", "why.too_deep", "why.unobserved", "why.over_budget"}


def test_every_cause_has_a_form_a_hidden_check_shows():
    registry.available()   # the exercises' own causes, in the catalog
    missing = [key for key in CATALOG if (".cause." in f".{key}" or key.startswith("why.")) and key not in LIMITS
               and not hidden_safe(HIDDEN_VARIANTS.get(key, key))]
    assert missing == []
    assert all(v in CATALOG for v in HIDDEN_VARIANTS.values())
    for key in ("cause.hardcoded_ws", "cause.sent_integer", "cause.sent_not_finite", "cause.wrong_root",
                "cause.carried_too_little", "cause.hardcoded_ws_ranks", "cause.reduce_op", "cause.integer_dtype"):
        generic = HIDDEN_VARIANTS[key]
        for lang in LANGS:
            assert not re.search(r"\d", render(generic, {"quantity": "q", "op": "all_reduce", "reduce": "MAX"}, lang))


# -- a rooted quantity: its pass words and its wrong root, with no message of the exercise ----------------

ROOTED = '''
"""An instructor's exercise: rank 0's parameters broadcast to every rank, then one all-reduce of the gradient."""
from grader.exercise import Check, Exercise, Quantity

N = 32

def params(rank, ws):
    return [0.5 * i + 7 * rank for i in range(N)]

def grad(rank, ws):
    return [float(rank + 1) * (i % 5) for i in range(N)]

EXERCISE = Exercise(
    name="broadcast_params",
    title=("广播参数，再平均梯度", "Broadcast the parameters, then average the gradient"),
    entry="step",
    defines=("step",),
    quantities=(Quantity("params", local=params, combine="root", root=0, through=("broadcast",)),
                Quantity("grad", local=grad, combine="mean", through=("all_reduce",))),
    checks=(
        Check("ws2.params", "value", 5, ("参数（{ws} 个进程）", "Parameters ({ws} ranks)"), world_size=2, quantity="params"),
        Check("ws2.grad", "value", 5, ("梯度（{ws} 个进程）", "Gradient ({ws} ranks)"), world_size=2, quantity="grad"),
        Check("ws3.params", "value", 5, ("参数（{ws} 个进程）", "Parameters ({ws} ranks)"), hidden=True, world_size=3,
              quantity="params"),
    ),
)
'''
ROOTED_STEP = '''
import torch
import torch.distributed as dist

def step(rank, world_size):
    params = torch.arange(32, dtype=torch.float32) * 0.5 + 7 * rank
    dist.broadcast(params, src=SRC)
    grad = (torch.arange(32) % 5).to(torch.float32) * (rank + 1)
    dist.all_reduce(grad)
    grad /= world_size
    return {"params": params, "grad": grad}
'''


@pytest.mark.timeout(2 * 280 + 60)   # two batches (zh, en), each given 280 s on a loaded machine
def test_a_rooted_quantity_has_its_own_pass_words_and_wrong_root(tmp_path):
    course = tmp_path / "course"
    (course / "broadcast_params").mkdir(parents=True)
    (course / "broadcast_params" / "exercise.py").write_text(textwrap.dedent(ROOTED))
    subs = tmp_path / "class"
    subs.mkdir()
    (subs / "honest.py").write_text(ROOTED_STEP.replace("SRC", "0"))
    (subs / "wrong_root.py").write_text(ROOTED_STEP.replace("SRC", "1"))
    for lang in LANGS:
        out = tmp_path / f"out-{lang}"
        proc = run_cli("batch", str(subs), "--out", str(out), "--exercises-dir", str(course), "--exercise",
                       "broadcast_params", "--lang", lang, timeout=280)
        assert proc.returncode == 0, proc.stderr
        results = results_of(out)
        honest, wrong = results["honest"], results["wrong_root"]
        assert honest["score"] == 15 and wrong["score"] == 5
        text = {t["name"]: t["output"] for t in honest["tests"]}
        params = next(v for k, v in text.items() if k.startswith(("Parameters (2", "参数（2")))
        assert render("pass.value_root", {"quantity": "params", "ops": ["broadcast"], "root": 0}, lang) in params
        assert render("pass.value", {"quantity": "params", "ops": ["broadcast"]}, lang) not in params
        causes = wrong["extra_data"]["causes"]
        assert {c["key"] for c in causes["ws2.params"]} == {"cause.wrong_root"}
        assert {c["key"] for c in causes["ws3.params"]} == {"cause.wrong_root"}
        outputs = dict(zip(wrong["extra_data"]["outcomes"], (t["output"] for t in wrong["tests"])))
        assert render("cause.wrong_root", {"quantity": "params", "op": "broadcast", "other": 1, "root": 0}, lang) \
            in outputs["ws2.params"]
        hidden = outputs["ws3.params"]
        assert render("cause.wrong_root_generic", {"quantity": "params", "op": "broadcast"}, lang) in hidden
        assert not re.search(r"\d", re.sub(r"隐藏测试 \d|Hidden check \d", "", hidden))
