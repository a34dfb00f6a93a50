"""What a check judges, and how its failures are named, in zh and en, hidden checks included:

  - volume, counts and groups judge every operation that carried the quantity's elements, whatever its size,
    each in the dtype it travelled in (a float16 head and a float32 tail of one gradient fail the volume);
  - static points follow the runs (collectives written in a branch that never runs earn nothing);
  - an integer sum of the student's own is evidence (int64 counts all-reduced, then cast and divided, earn
    full marks), while one-element flags, MAX and torch's own integers travel as sent;
  - every cause has a value-free form that hidden checks show, and the mechanism of each fixture below is
    named: a constant world size, a sum divided by the node size, an integer cast, bytes viewed as another
    dtype, a cast that overflowed before any sum, one number all-reduced beside a local answer, a DDP step
    whose result was thrown away; a rooted quantity's own pass words and its wrong root, from the engine.

The fixtures are files under tests/fixtures/<exercise>/{honest,mistakes,cheats}/, each mistake and cheat with
its sidecar (<name>.toml: score, outcomes, the causes each check names, messages the report shows; the format
of docs/exercises.md), graded through `python -m grader batch` in each language the sidecar lists.
"""
from __future__ import annotations

import fnmatch
import json
import re
import textwrap

import numpy as np
import pytest

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: pytest's own dependency
    import tomli as tomllib

from conftest import FIXTURES, graded_folder, results_of, run_cli
from grader.exercise import registry
from grader.feedback.messages import CATALOG, render
from grader.feedback.render import HIDDEN_VARIANTS, hidden_safe
from grader.switch import perturb
from grader.exercise.spec import Quantity
from grader.verify.observe import RunView
from grader.verify.provenance import Tracer
from switchsim import Sim

# this issue's fixtures: (exercise, folder) -> names; each has a sidecar
NEW = {
    ("fp16_allreduce", "mistakes"): ("m15_float16_head_float32_tail", "m16_cast_to_int8", "m17_float32_bytes_as_float16",
                                     "m18_float32_bits_as_int8", "m19_scaled_past_65504_before_the_cast",
                                     "m20_divided_by_a_constant_2"),
    ("grad_accum_no_sync", "mistakes"): ("m16_divided_by_a_constant_2", "m17_small_tail_all_reduced_apart",
                                         "m18_loss_all_reduced_not_the_gradient"),
    ("grad_accum_no_sync", "cheats"): ("c07_one_number_all_reduced_local_answer", "c08_ddp_step_thrown_away"),
    ("hierarchical_allreduce", "mistakes"): ("m14_divided_by_the_node_size", "m15_world_size_written_as_4",
                                             "m16_strided_node_groups"),
    ("hierarchical_allreduce", "cheats"): ("c04_launder_the_sum_through_a_flat_all_reduce",),
    ("dist_primitives", "honest"): ("h60_int64_counts_all_reduced", "h61_branch_on_an_all_reduced_flag"),
    ("dist_primitives", "cheats"): ("c40_collectives_in_a_dead_branch",),
}
# the fixed words with digits each exercise's hidden checks may show (dtype names, the causes' own figures)
HIDDEN_MAY_SHOW = {"fp16_allreduce": r"b?float(16|32)|1e-4|2\^-10|65504|在 1 附近|near 1", "grad_accum_no_sync": r"K - 1",
                   "hierarchical_allreduce": r"0, 2, 4|group_src=0|dst=0|写 0 |0 works|rank 0\b|0 号进程"}
ACCOUNT = ("why.", "fail.stopped")   # what depends on the deltas drawn or on timing: checked only where listed
LANGS = ("zh", "en")
for _name in registry.available():
    registry.get(_name)   # the exercises' own messages, in the catalog


def _sidecar(exercise: str, folder: str, name: str) -> dict:
    path = FIXTURES / exercise / folder / f"{name}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _first(table: dict, check_id: str):
    return next((value for pattern, value in table.items() if fnmatch.fnmatchcase(check_id, pattern)), None)


def _problems(expect: dict, results: dict, lang: str, exercise: str) -> list[str]:
    """Every way one grading differs from its sidecar (an honest fixture: full marks, every check passed, no
    cause); and a hidden check that shows a digit beyond the exercise's fixed words."""
    out = []
    extra = results["extra_data"]
    outcomes, causes = extra["outcomes"], extra.get("causes") or {}
    total = registry.get(exercise).total
    score = expect.get("score", total)
    if results["score"] != score:
        out.append(f"score {results['score']} != {score}")
    for check_id, outcome in outcomes.items():
        want = _first(expect.get("outcomes", {}), check_id) or "pass"
        if not (outcome == want or (want == "not pass" and outcome != "pass")):
            out.append(f"{check_id}: {outcome} != {want}")
        named = {c["key"] for c in causes.get(check_id, [])}
        listed = set(_first(expect.get("causes", {}), check_id) or [])
        if outcome == "pass" and not listed:
            continue
        if expect.get("causes_exact", True):
            seen = {k for k in named if not k.startswith(ACCOUNT) or k in listed}
            if seen != listed:
                out.append(f"{check_id} names {sorted(named)}, not {sorted(listed)}")
        elif not listed <= named:
            out.append(f"{check_id} names {sorted(named)}, without {sorted(listed - named)}")
    tests = {check_id: test for check_id, test in zip(outcomes, results["tests"])}
    for say in expect.get("says", []):
        text = render(say["key"], say.get("params", {}), lang)
        where = tests[say["check"]]["output"] if "check" in say else json.dumps(results, ensure_ascii=False)
        if (text in where) == bool(say.get("absent")):
            out.append(f"{say.get('check', 'the report')} {'shows' if say.get('absent') else 'lacks'}: {text}")
    allowed = HIDDEN_MAY_SHOW.get(exercise, "")
    for test in results["tests"]:
        if test["visibility"] == "after_published":
            shown = re.sub(r"隐藏测试 \d|Hidden check \d" + (f"|{allowed}" if allowed else ""), "", test["name"] + test["output"])
            if re.search(r"\d", shown):
                out.append(f"a hidden check shows a digit: {test['output']}")
    if "Traceback" in json.dumps(results):
        out.append("a traceback")
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """{(exercise, folder, name, lang): results.json}: one batch per exercise, folder and language, over this
    issue's fixtures only."""
    out = {}
    for (exercise, folder), names in NEW.items():
        for lang in LANGS:
            found = results_of(graded_folder(tmp_path_factory, f"{exercise}/{folder}", exercise, lang, only=names))
            out.update({(exercise, folder, name, lang): found[name] for name in names})
    return out


CASES = [(exercise, folder, name, lang) for (exercise, folder), names in NEW.items() for name in names for lang in LANGS]


def test_every_fixture_of_the_issue_has_its_sidecar():
    for (exercise, folder), names in NEW.items():
        for name in names:
            assert (FIXTURES / exercise / folder / f"{name}.py").exists(), name
            assert folder == "honest" or (FIXTURES / exercise / folder / f"{name}.toml").exists(), name
            langs = _sidecar(exercise, folder, name).get("lang", list(LANGS))
            assert sorted(langs) == sorted(LANGS), name   # asserted in both languages


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("exercise,folder,name,lang", CASES, ids=[f"{c[2]}-{c[3]}" for c in CASES])
def test_the_fixture_gets_what_its_sidecar_says(graded, exercise, folder, name, lang):
    expect = _sidecar(exercise, folder, name)
    assert _problems(expect, graded[(exercise, folder, name, lang)], lang, exercise) == []


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
LIMITS = {"why.layout", "why.too_complex", "why.too_deep", "why.unobserved"}


def test_every_cause_has_a_form_a_hidden_check_shows():
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


@pytest.mark.timeout(300)
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
