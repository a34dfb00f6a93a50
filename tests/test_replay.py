"""Provenance by replay of a reference step (verify/replay.py) and an exercise's table of mistakes
(verify/mistakes.py), on records the grader's real switch made: no processes.

The ranks are played in-process against the switch (tests/switchsim.py), which adds its secret deltas to
what they send. The reference step below is a small ZeRO step: reduce-scatter a gradient (mean), update a
shard from it, all-gather the shards. Every honest way of running it must be proven; every answer that did
not travel, or a rank that fed the step something else, must not.
"""
from __future__ import annotations

import numpy as np

from grader.exercise import reference
from grader.exercise.reference import StepError
from grader.verify.observe import RunView
from grader.verify.replay import Replays
from switchsim import Sim

WS, N = 2, 8                       # ranks; gradient elements (a shard of N / WS each)
S = N // WS


def grad(rank: int) -> np.ndarray:
    return np.arange(N, dtype=float) * (rank + 1) + 0.25


def step(comm, rank, ws, lr=0.5):
    """The reference: mean gradient shard, the shard of ones updated from it, the shards gathered."""
    shard = comm.reduce_scatter(grad(rank), op="mean")
    full = comm.all_gather(np.ones(S) - lr * shard)
    return {"full": full, "shard": shard}


def _values(sim: Sim, rank: int, seq: int = -1) -> np.ndarray:
    return np.concatenate(sim.delivered(rank, seq))


def _prove(sim: Sim, answers: dict) -> dict:
    """{(rank, quantity): proven} for each rank's reported answers."""
    replays = Replays(RunView(sim.run()), step)
    return {(r, name): replays.prove(r, name, np.asarray(v, dtype=float), "torch.float32").ok
            for r, values in answers.items() for name, v in values.items()}


def _honest(sim: Sim, average: bool = False, buckets: int = 1, own_copy: bool = False) -> dict:
    """Each rank sends its gradient (or / N summed; or in buckets of every chunk), updates, gathers."""
    m = S // buckets
    parts: dict = {r: [] for r in range(WS)}
    for b in range(buckets):
        for r in range(WS):
            mine = grad(r) if average else grad(r) / WS
            piece = np.concatenate([mine[q * S + b * m:q * S + (b + 1) * m] for q in range(WS)])
            sim.op(r, "_reduce_scatter_base", piece, (m,), reduce="AVG" if average else "SUM")
        for r in range(WS):
            parts[r].append(sim.delivered(r)[0])
    answers = {}
    for r in range(WS):
        shard = np.concatenate(parts[r])
        new = np.ones(S) - 0.5 * shard
        sim.op(r, "_allgather_base", new, (N,))
        answers[r] = {"shard": shard, "new": new}
    out = {}
    for r in range(WS):
        full = sim.delivered(r)[0].copy()
        if own_copy:
            full[r * S:(r + 1) * S] = answers[r]["new"]
        out[r] = {"full": full, "shard": answers[r]["shard"]}
    return out


def test_the_ideal_run_is_the_reference():
    values = reference.outcome(step, WS)
    mean = np.mean([grad(q) for q in range(WS)], axis=0)
    assert np.allclose(values[1]["shard"], mean[S:]) and np.allclose(values[0]["full"], 1 - 0.5 * mean)


def test_honest_forms_are_proven():
    for kwargs in ({}, {"average": True}, {"buckets": 2}, {"buckets": 4}, {"own_copy": True}):
        sim = Sim(WS, seed=3)
        proven = _prove(sim, _honest(sim, **kwargs))
        assert all(proven.values()), (kwargs, proven)


def test_an_all_reduce_stands_in_for_the_reduce_scatter():
    sim = Sim(WS, seed=4)
    for r in range(WS):
        sim.op(r, "allreduce", [grad(r)], [(N,)], reduce="SUM")
    shards = {r: _values(sim, r)[r * S:(r + 1) * S] / WS for r in range(WS)}
    for r in range(WS):
        sim.op(r, "_allgather_base", np.ones(S) - 0.5 * shards[r], (N,))
    proven = _prove(sim, {r: {"full": _values(sim, r), "shard": shards[r]} for r in range(WS)})
    assert all(proven.values()), proven


def test_local_answers_beside_the_operations_are_not_proven():
    sim = Sim(WS, seed=5)
    honest = _honest(sim)
    mean = np.mean([grad(q) for q in range(WS)], axis=0)
    local = {r: {"full": 1 - 0.5 * mean, "shard": mean[r * S:(r + 1) * S]} for r in range(WS)}
    assert np.allclose(local[0]["full"], reference.outcome(step, WS)[0]["full"])   # right numbers ...
    proven = _prove(sim, local)
    assert not any(proven.values()), proven                                        # ... that did not travel
    assert all(_prove(sim, honest).values())


def test_a_rank_that_sends_for_all_is_named_and_what_rests_on_it_unproven():
    """Rank 0 feeds the reduce-scatter the mean it computed; rank 1 zeros: the deliveries hold the right
    numbers, but no rank sent its own gradient."""
    sim = Sim(WS, seed=6)
    mean = np.mean([grad(q) for q in range(WS)], axis=0)
    sent = {0: mean, 1: np.zeros(N)}
    for r in range(WS):
        sim.op(r, "_reduce_scatter_base", sent[r], (S,), reduce="SUM")
    shards = {r: sim.delivered(r)[0] for r in range(WS)}
    for r in range(WS):
        sim.op(r, "_allgather_base", np.ones(S) - 0.5 * shards[r], (N,))
    replays = Replays(RunView(sim.run()), step)
    proof = replays.prove(1, "shard", shards[1], "torch.float32")
    assert not proof.ok and proof.finding.key == "contribution" and proof.finding.params["op"] == "reduce_scatter"
    assert not replays.prove(0, "full", _values(sim, 0), "torch.float32").ok


def test_garbage_where_only_padding_goes_spoils_only_what_holds_it():
    """A step whose gradient is padded: what a rank sends in the padding lands in the last shard only, so the
    first rank's shard stands while the last rank's, which holds the padding, does not."""
    def padded_step(comm, rank, ws):
        shard = comm.reduce_scatter(np.concatenate([grad(rank)[:N - 2], np.zeros(2)]), op="sum")
        return {"shard": shard}
    sim = Sim(WS, seed=7)
    for r in range(WS):
        sim.op(r, "_reduce_scatter_base", np.concatenate([grad(r)[:N - 2], np.full(2, 9.0 + r)]), (S,), reduce="SUM")
    replays = Replays(RunView(sim.run()), padded_step)
    assert replays.prove(0, "shard", sim.delivered(0)[0], "torch.float32").ok
    last = replays.prove(1, "shard", sim.delivered(1)[0], "torch.float32")
    assert not last.ok and last.finding.key == "contribution"


def test_a_step_that_cannot_run_is_an_instructors_error():
    def broken(comm, rank, ws):
        return {"x": comm.all_reduce(np.ones(rank + 1))}   # sizes differ across ranks
    try:
        reference.ideal(broken, 2)
    except StepError as err:
        assert "different sizes" in str(err)
    else:
        raise AssertionError("a step with different sizes ran")
