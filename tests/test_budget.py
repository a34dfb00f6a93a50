"""The supervisor's verification work per submission is bounded (verify/budget.py), and a coalesced call of
many one-element tensors is traced as one run (verify/provenance.py): no processes, the ranks played
in-process against the real switch (tests/switchsim.py).

The bounds are CPU seconds; the tests set them to zero, so that what is asserted is the verdict past a
bound, never a duration."""
from __future__ import annotations

import numpy as np
import pytest

from grader.exercise import registry
from grader.exercise.spec import Check
from grader.model import Outcome
from grader.records import How, RankRecord, RankResult, RunOutcome, Stop
from grader.verify import budget
from grader.verify.evidence import WorldSizeRuns
from grader.verify.judge import Judge
from grader.verify.observe import RunView
from switchsim import Sim

N = 1024
EXERCISE = registry.get("dist_primitives")
GRADIENT = EXERCISE.quantity("gradient")
CHECK = next(c for c in EXERCISE.checks if c.id == "ws2.all_reduce")


def _coalesced(ws: int, perturb: bool) -> tuple[Sim, list[np.ndarray]]:
    """Each rank all-reduces 1,024 one-element tensors of rank + 1 and a count of 1 in one coalesced call,
    and divides the sums by the count: the exercise's mean gradient."""
    sim = Sim(ws, perturb=perturb)
    for r in range(ws):
        parts = [np.array([r + 1.0]) for _ in range(N)] + [np.array([1.0])]
        sim.op(r, "allreduce_coalesced", parts, [(1,)] * (N + 1), reduce="SUM")
    finals = []
    for r in range(ws):
        out = sim.delivered(r)
        finals.append(np.concatenate(out[:N]) / out[N][0])
    return sim, finals


def _run(sim: Sim, finals: list[np.ndarray]):
    run = sim.run()
    run.stop = Stop.COMPLETED
    for record, final in zip(run.ranks, finals):
        record.done = True
        record.result = RankResult(How.RETURN, values={"gradient": {
            "kind": "tensor", "plain": True, "dtype": "torch.float32", "shape": [N],
            "array": final.astype(np.float32)}})
    return run


def _runs(ws: int = 2) -> WorldSizeRuns:
    return WorldSizeRuns(ws, clean=_run(*_coalesced(ws, perturb=False)), perturbed=[_run(*_coalesced(ws, perturb=True))])


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_a_coalesced_call_of_one_element_tensors_is_proven_as_one_run(ws):
    """Each delivered value is one element of its own tensor: matched one by one, any chance equality of
    two perturbed sums (the deltas fall on a grid of 1/256) could take another element's source and leave
    a later element unexplained. Laid end to end as the call reduced them, the value is one run."""
    runs = _runs(ws)
    judge = Judge(EXERCISE, "")
    for rank in range(ws):
        proof = judge.proof(runs.perturbed[0], GRADIENT, rank)
        assert proof.ok, proof.finding
    assert RunView(runs.perturbed[0]).divisors(0), "the count's sum is the scale the value was divided by"


def test_a_proof_past_its_budget_is_a_named_verdict_for_the_check(monkeypatch):
    monkeypatch.setattr(budget, "PROOF_SECONDS", 0.0)
    judge = Judge(EXERCISE, "")
    result = judge.evaluate(CHECK, _runs())
    assert result.outcome is Outcome.NOT_COLLECTIVE
    keys = [n.key for n in result.notes]
    assert keys.count("fail.over_budget") == 2, keys       # each rank's value, by name
    note = next(n for n in result.notes if n.key == "fail.over_budget")
    assert note.params["seconds"] == 0.0 and note.params["quantity"] == "gradient"


def test_a_check_past_its_budget_is_a_named_verdict_and_the_next_check_is_judged(monkeypatch):
    monkeypatch.setattr(budget, "CHECK_SECONDS", 0.0)
    judge = Judge(EXERCISE, "")
    runs = _runs()
    result = judge.evaluate(CHECK, runs)
    assert result.outcome is Outcome.NOT_COLLECTIVE
    assert [n.key for n in result.notes] == ["fail.check_over_budget"]
    monkeypatch.setattr(budget, "CHECK_SECONDS", 60.0)
    assert judge.evaluate(CHECK, runs).outcome is Outcome.PASS   # nothing half made was kept


def test_a_submission_past_its_budget_proves_nothing_more(monkeypatch):
    judge = Judge(EXERCISE, "")
    judge.work.spent = judge.work.seconds               # as if its earlier proofs had used it all
    proof = judge.proof(_runs().perturbed[0], GRADIENT, 0)
    assert not proof.ok and proof.finding.key == "over_budget"
    assert proof.finding.params["seconds"] == budget.SUBMISSION_SECONDS


def test_nested_blocks_charge_each_budget_once_and_the_outer_bound_is_the_outer_verdict(monkeypatch):
    clock = iter(np.arange(0.0, 100.0, 1.0))     # every reading of the CPU clock one second later
    monkeypatch.setattr(budget.time, "process_time", lambda: float(next(clock)))
    monkeypatch.setattr(budget, "_EVERY", 1)
    outer, inner = budget.Budget(100.0), budget.Budget(100.0)
    with budget.spending(outer):                 # reads 0
        with budget.spending(inner, outer):      # reads 1, then 2 at its end
            pass
    assert (inner.spent, outer.spent) == (1.0, 3.0)   # outer: 0 to 3, once
    short = budget.Budget(1.0)
    with pytest.raises(budget.OverBudget) as over:
        with budget.spending(short) as scope:    # reads 4: its deadline is 5
            with budget.spending(budget.Budget(50.0)):   # reads 5
                budget.tick()                     # reads 6: past the outer deadline
    assert over.value.scope is scope


def _warmed_up(ws: int, perturb: bool) -> tuple[Sim, list[np.ndarray]]:
    """A bandwidth warm-up first (six all-reduces of 1M float32, averaged), then the exercise's mean gradient:
    an honest program whose runs the switch keeps millions of values of."""
    sim = Sim(ws, perturb=perturb)
    buffer = [np.ones(1 << 20, dtype=np.float32) for _ in range(ws)]
    for _ in range(6):
        buffer = [b.astype(np.float32) / ws for b in sim.all_reduce(buffer)]
    summed = sim.all_reduce([np.full(N, r + 1.0, dtype=np.float32) for r in range(ws)])
    return sim, [s / ws for s in summed]


def test_what_the_switch_kept_of_an_honest_run_widens_every_bound(monkeypatch):
    """Reading back what a run kept (sorting it for the tracer's lookups, finding divisors in it) grows with
    the data the ranks sent: a warm-up of 4 MB repeated before the answer costs ~1 s at 4 ranks, more on a
    loaded machine. With the search's own bounds at zero, the kept values' allowance alone proves the value;
    without the allowance the same proof is past its bound."""
    for name in ("PROOF_SECONDS", "CHECK_SECONDS", "SUBMISSION_SECONDS"):
        monkeypatch.setattr(budget, name, 0.0)
    runs = WorldSizeRuns(2, clean=_run(*_warmed_up(2, perturb=False)), perturbed=[_run(*_warmed_up(2, perturb=True))])
    assert RunView(runs.perturbed[0]).kept > 1_000_000
    result = Judge(EXERCISE, "").evaluate(CHECK, runs)
    assert result.outcome is Outcome.PASS, result.notes
    monkeypatch.setattr(budget, "SECONDS_PER_MILLION_KEPT", 0.0)
    result = Judge(EXERCISE, "").evaluate(CHECK, runs)
    assert result.outcome is Outcome.NOT_COLLECTIVE and [n.key for n in result.notes] == ["fail.check_over_budget"]


# -- a grader's accident is not the student's result ----------------------------------------------------

def test_a_perturbed_run_the_grader_could_not_make_is_its_failure_not_the_students():
    """The clean run shows the right mean gradient; the perturbed run, the only one that could prove it, was
    lost to the grader (its zygote gone: the runner makes such a run twice before it counts, and both were
    lost). The check says the grader failed and why, never that the value "could not be confirmed"."""
    right = _runs()
    lost = RunOutcome(right.perturbed[0].request, [RankRecord(r) for r in range(2)], stop=Stop.GRADER_ERROR,
                      error="the zygote exited")
    result = Judge(EXERCISE, "").evaluate(CHECK, WorldSizeRuns(2, clean=right.clean, perturbed=[lost]))
    assert result.outcome is Outcome.GRADER_ERROR and result.score == 0, result.notes
    assert {n.key for n in result.notes} == {"fail.grader_run"}
    assert [n.params["error"] for n in result.notes][0] == "the zygote exited"
    # a check of how the value travelled needs the value: it says the same, not that the traffic was wrong
    traffic = Check("ws2.traffic", "traffic", 10, ("流量", "traffic"), world_size=2, quantity="gradient")
    result = Judge(EXERCISE, "").evaluate(traffic, WorldSizeRuns(2, clean=right.clean, perturbed=[lost]))
    assert result.outcome is Outcome.GRADER_ERROR and {n.key for n in result.notes} == {"fail.grader_run"}
