"""Provenance by replay of a reference step (verify/replay.py) and an exercise's table of mistakes
(verify/mistakes.py), on records the grader's real switch made: no processes.

The ranks are played in-process against the switch (tests/switchsim.py), which adds its secret deltas to
what they send. The reference step below is a small ZeRO step: reduce-scatter a gradient (mean), update a
shard from it, all-gather the shards. Every honest way of running it must be proven; every answer that did
not travel, or a rank that fed the step something else, must not. The last tests replay a tensor-parallel
layer's shape: a value the step keeps replicated is followed through an all-reduce a rank made of it
(autograd's backward of torch.distributed.nn.functional.all_reduce on a loss divided by N) as well as without
one, and a value made before an operation the rank never made still stands.
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


# -- a value kept replicated, and an operation a rank never made (a tensor-parallel layer's forward and backward)

F32 = np.float32


def own(rank: int) -> np.ndarray:
    return np.arange(6.0) * (rank + 1) / 8 + 0.25


def mlp_step(comm, rank, ws):
    """A forward all-reduce, a gradient the same on every rank (replicated), a backward all-reduce of each
    rank's part of it: a tensor-parallel layer's shape."""
    y = comm.all_reduce(own(rank))
    dy = comm.replicated(y - 1.0)
    return {"y": y, "dy": dy, "dx": comm.all_reduce(dy * (rank + 2))}


def proofs(sim: Sim, values: list) -> dict:
    replays = Replays(RunView(sim.run()), mlp_step)
    return {(rank, name): replays.prove(rank, name, np.asarray(v, dtype=np.float64), "torch.float32").ok
            for rank, named in enumerate(values) for name, v in named.items()}


def forward(sim: Sim) -> list:
    return sim.all_reduce([own(r).astype(F32) for r in range(sim.ws)])


def test_a_replicated_value_is_proven_kept_or_all_reduced_into_its_mean():
    for all_reduced in (False, True):
        sim = Sim(3, perturb=("all_reduce",))
        ys = forward(sim)
        if all_reduced:   # each rank's share (y - 1) / N summed: the mean, with the switch's deltas in it
            dys = sim.all_reduce([((ys[r] - 1) / 3).astype(F32) for r in range(3)])
        else:
            dys = [(ys[r] - 1).astype(F32) for r in range(3)]
        dxs = sim.all_reduce([(dys[r] * (r + 2)).astype(F32) for r in range(3)])
        found = proofs(sim, [{"y": ys[r], "dy": dys[r], "dx": dxs[r]} for r in range(3)])
        assert all(found.values()), (all_reduced, found)


def test_a_value_made_from_local_numbers_beside_the_replicated_all_reduce_is_not_proven():
    sim = Sim(2, perturb=("all_reduce",))
    ys = forward(sim)
    sim.all_reduce([((ys[r] - 1) / 2).astype(F32) for r in range(2)])   # delivered, then ignored
    local = [(np.sum([own(q) for q in range(2)], axis=0) - 1).astype(F32) for _ in range(2)]
    dxs = sim.all_reduce([(local[r] * (r + 2)).astype(F32) for r in range(2)])
    found = proofs(sim, [{"y": ys[r], "dx": dxs[r]} for r in range(2)])
    assert all(found[(r, "y")] for r in range(2))
    assert not any(found[(r, "dx")] for r in range(2))


def test_a_value_made_before_an_operation_the_rank_never_made_still_stands():
    sim = Sim(2, perturb=("all_reduce",))
    ys = forward(sim)                                  # the backward all-reduce never happens
    dx_local = [(ys[r] - 1) * (r + 2) for r in range(2)]
    found = proofs(sim, [{"y": ys[r], "dy": ys[r] - 1, "dx": dx_local[r]} for r in range(2)])
    assert all(found[(r, "y")] and found[(r, "dy")] for r in range(2)), found
    assert not any(found[(r, "dx")] for r in range(2)), found


def test_a_value_not_from_the_communication_is_not_proven_where_an_operation_is_missing():
    sim = Sim(2, perturb=("all_reduce",))
    forward(sim)
    local = np.sum([own(q) for q in range(2)], axis=0)   # the right numbers, computed locally: no deltas
    found = proofs(sim, [{"y": local} for _ in range(2)])
    assert not any(found.values())


def test_an_operation_made_with_another_collective_is_missing_not_a_wrong_contribution_of_the_next():
    """The partials all-gathered and summed locally, then the backward all-reduce: that all-reduce is the step's
    second operation, never read as a wrong send of its first."""
    sim = Sim(2, perturb=("all_reduce", "all_gather"))
    gathered = sim.all_gather([own(r).astype(F32) for r in range(2)])
    ys = [g.reshape(2, -1).sum(axis=0) for g in gathered]
    dxs = sim.all_reduce([((ys[r] - 1) * (r + 2)).astype(F32) for r in range(2)])
    replays = Replays(RunView(sim.run()), mlp_step)
    for rank in range(2):
        for name, value in (("y", ys[rank]), ("dx", dxs[rank])):
            proof = replays.prove(rank, name, np.asarray(value, dtype=np.float64), "torch.float32")
            assert not proof.ok and proof.finding.key == "replay_missing", (rank, name, proof.finding)
            assert proof.finding.params["n"] == 1
