"""Provenance on records the grader's switch made (verify/observe.py, verify/provenance.py): no processes.

The ranks are played in-process against the real switch (tests/switchsim.py): what each sends, the
secret deltas the switch adds, and what it delivers. The Tracer must prove every honest shape of the
computation and refuse every answer that did not travel.
"""
from __future__ import annotations

import numpy as np
import pytest

from grader.exercise.spec import Quantity
from grader.verify.observe import RunView
from grader.switch import perturb
from grader.verify import provenance
from grader.verify.provenance import Tracer
from switchsim import Sim

N = 8  # elements per rank's data (small: the logic is the same)


def gradient(rank, ws):
    return [rank + 1.0] * N


def ramp(rank, ws):
    return np.arange(N, dtype=float) * (rank + 1)


MEAN = Quantity("gradient", local=gradient, combine="mean", through=("all_reduce",))
CONCAT = Quantity("feature", local=lambda r, ws: [float(r)] * N, combine="concat", through=("all_gather",))
RING = Quantity("tensor", local=ramp, combine="sum", through=("send", "recv"))


def prove(sim: Sim, quantity: Quantity, finals: list):
    view = RunView(sim.run())
    return [Tracer(view, quantity).prove(r, np.asarray(f, dtype=np.float64)) for r, f in enumerate(finals)]


def assert_proven(proofs):
    assert all(p.ok for p in proofs), [p.finding for p in proofs]


def assert_refused(proofs, key):
    assert not any(p.ok for p in proofs)
    assert {p.finding.key for p in proofs} <= {key, "not_delivered", "contribution", "weights"}
    assert key in {p.finding.key for p in proofs}, [p.finding for p in proofs]


# ------------------------------------------------------------------------------------------------
# honest shapes of the computation

@pytest.mark.parametrize("ws", [2, 3, 4])
def test_sum_then_divide(ws):
    sim = Sim(ws)
    out = sim.all_reduce([gradient(r, ws) for r in range(ws)])
    assert_proven(prove(sim, MEAN, [o / ws for o in out]))


def test_a_warm_up_full_of_chance_matches_does_not_hide_the_answer():
    """Warm-up all-reduces of ones deliver far more than 64 values equal to each element of the answer (the
    deltas are multiples of 1/256 of 1 + |x|: sums of perturbed ones and of perturbed 1s and 2s fall on the
    same grid): the search tries first the delivered values whose next element matches too, so the answer's
    own operation is found."""
    sim, n = Sim(2), 1 << 14
    for _ in range(6):
        sim.all_reduce([np.ones(n), np.ones(n)])
    out = sim.all_reduce([gradient(r, 2) for r in range(2)])
    assert_proven(prove(sim, MEAN, [o / 2 for o in out]))


def test_avg_and_divide_first():
    sim = Sim(3)
    out = sim.all_reduce([gradient(r, 3) for r in range(3)], reduce="AVG")
    assert_proven(prove(sim, MEAN, out))
    sim = Sim(3)
    out = sim.all_reduce([np.array(gradient(r, 3)) / 3 for r in range(3)])
    assert_proven(prove(sim, MEAN, out))


def test_chunks_and_a_bucket_at_an_offset():
    ws = 2
    sim = Sim(ws)
    first = sim.all_reduce([gradient(r, ws)[:3] for r in range(ws)])
    second = sim.all_reduce([gradient(r, ws)[3:] for r in range(ws)])
    assert_proven(prove(sim, MEAN, [np.concatenate([a, b]) / ws for a, b in zip(first, second)]))
    sim = Sim(ws)
    bucket = sim.all_reduce([np.concatenate([np.arange(5.0), gradient(r, ws), [7.0]]) for r in range(ws)])
    assert_proven(prove(sim, MEAN, [b[5:5 + N] / ws for b in bucket]))


def test_divisor_that_is_itself_all_reduced():
    ws = 3
    sim = Sim(ws)
    summed = sim.all_reduce([gradient(r, ws) for r in range(ws)])
    count = sim.all_reduce([[1.0] for _ in range(ws)])
    assert_proven(prove(sim, MEAN, [s / c[0] for s, c in zip(summed, count)]))


def test_all_gather_concatenated():
    sim = Sim(3)
    assert_proven(prove(sim, CONCAT, sim.all_gather([[float(r)] * N for r in range(3)])))


@pytest.mark.parametrize("ws, direction", [(2, 1), (3, 1), (4, -1), (5, 1)])
def test_a_ring_of_sends_and_receives(ws, direction):
    """Reduce-scatter then all-gather over a ring, uneven chunks: every hop is explained."""
    sim = Sim(ws)
    data = [ramp(r, ws).copy() for r in range(ws)]
    bounds = np.array_split(np.arange(N), ws)
    for step in range(ws - 1):
        sent = {r: data[r][bounds[(r - direction * step) % ws]].copy() for r in range(ws)}
        for r in range(ws):
            dst = (r + direction) % ws
            got = sim.send_recv(r, dst, sent[r])
            data[dst][bounds[(r - direction * step) % ws]] += got
    for step in range(ws - 1):
        sent = {r: data[r][bounds[(r - direction * step + direction) % ws]].copy() for r in range(ws)}
        for r in range(ws):
            dst = (r + direction) % ws
            data[dst][bounds[(r - direction * step + direction) % ws]] = sim.send_recv(r, dst, sent[r])
    assert_proven(prove(sim, RING, data))


def test_a_root_that_adds_what_everyone_sent():
    ws = 3
    sim = Sim(ws)
    total = ramp(0, ws) + sum(sim.send_recv(r, 0, ramp(r, ws)) for r in range(1, ws))
    finals = [total] + [sim.send_recv(0, r, total) for r in range(1, ws)]
    assert_proven(prove(sim, RING, finals))


# ------------------------------------------------------------------------------------------------
# answers that did not travel, or not from each rank's own data

def test_computed_locally():
    sim = Sim(2)
    sim.all_reduce([gradient(r, 2) for r in range(2)])           # called, result ignored
    assert_refused(prove(sim, MEAN, [np.full(N, 1.5)] * 2), "not_delivered")


def test_local_answer_plus_a_probe_on_zeros():
    sim = Sim(2)
    probe = sim.all_reduce([np.zeros(N)] * 2)
    assert_refused(prove(sim, MEAN, [1.5 + p / 2 for p in probe]), "not_delivered")


def test_laundered_average_and_one_rank_for_all():
    sim = Sim(2)
    out = sim.all_reduce([np.full(N, 1.5)] * 2)                  # every rank feeds the answer
    assert_refused(prove(sim, MEAN, [o / 2 for o in out]), "contribution")
    sim = Sim(2)
    out = sim.all_reduce([np.full(N, 3.0), np.zeros(N)])        # rank 0 contributes for everyone
    assert_refused(prove(sim, MEAN, [o / 2 for o in out]), "contribution")


def test_buffer_edited_after_completion():
    sim = Sim(2)
    out = sim.all_reduce([gradient(r, 2) for r in range(2)])
    edited = [o / 2 for o in out]
    edited[0][3] = 1.5                                          # one element overwritten afterwards
    proofs = prove(sim, MEAN, edited)
    assert not proofs[0].ok and proofs[1].ok


def test_unperturbed_data_proves_nothing():
    """Without the secret deltas a delivered value is predictable, so matching it proves nothing."""
    sim = Sim(2, perturb=False)
    out = sim.all_reduce([gradient(r, 2) for r in range(2)])
    assert_refused(prove(sim, MEAN, [o / 2 for o in out]), "not_delivered")


def test_max_is_not_a_sum():
    sim = Sim(2)
    out = sim.all_reduce([gradient(r, 2) for r in range(2)], reduce="MAX")
    assert not any(p.ok for p in prove(sim, MEAN, [o / 2 for o in out]))


def test_own_data_added_twice_is_named():
    ws = 2
    sim = Sim(ws)
    got = [sim.send_recv(r, 1 - r, ramp(r, ws)) for r in range(ws)]      # each rank sends all its data
    finals = [2 * ramp(d, ws) + got[1 - d] for d in range(ws)]           # own data added a second time
    weights = [p.finding for p in prove(sim, RING, finals)]
    assert all(w.key == "weights" and w.params["twice"] == [w.params["rank"]] for w in weights), weights


def test_a_rank_missing_from_a_sum_is_named():
    ws = 3
    sim = Sim(ws)
    total = ramp(0, ws) + sim.send_recv(1, 0, ramp(1, ws))     # rank 2's data never arrives
    weights = prove(sim, RING, [total, total, total])[0].finding
    assert weights.key == "weights" and weights.params["missing"] == [2]


def test_a_record_that_does_not_hold_together_is_refused():
    """What was delivered must be what entered the operation, combined as the switch records it: a record
    edited afterwards (the plain sum, no deltas) proves nothing."""
    sim = Sim(2)
    sim.all_reduce([gradient(r, 2) for r in range(2)])
    for rec in sim.records:
        rec.calls[0].delivered_arrays = [np.full(N, 3.0, dtype=np.float32)]
        rec.calls[0].__dict__.pop("_delivered64", None)
    proofs = prove(sim, MEAN, [np.full(N, 1.5)] * 2)
    assert {p.finding.key for p in proofs} == {"inconsistent"}


def test_a_sum_past_its_dtypes_largest_value_is_named_not_taken_for_a_mismatch():
    """A float16 sum near 65504 overflows once perturbed: what was delivered holds inf, which no delivery
    explains; the finding says so ("not_finite"), never "paired with another operation?" (inconsistent)."""
    sim = Sim(2, dtype="torch.float16")
    big = [np.full(N, 40000.0, dtype=np.float16), np.full(N, 25000.0, dtype=np.float16)]
    delivered = sim.all_reduce(big)
    assert not np.isfinite(delivered[0].astype(np.float64)).all()
    with np.errstate(all="ignore"):   # as api.grade judges: the student's numbers may be inf
        proofs = prove(sim, MEAN, [np.full(N, 32500.0)] * 2)
    assert {p.finding.key for p in proofs} == {"not_finite"}


def test_a_bandwidth_loop_beside_the_answer_is_not_searched_when_the_answer_proves_without_it():
    """The tracer searches a rank's smaller deliveries first (evidence._traced): a value proven there never
    sorts a warm-up's 256K-element buffers; a value that needs a large delivery (its bucket) is searched again
    in everything and proven there."""
    from grader.verify.evidence import _traced
    ws = 2
    sim = Sim(ws)
    for _ in range(2):
        sim.all_reduce([np.ones(1 << 18) for _ in range(ws)])                  # the bandwidth warm-up
    bucket = sim.all_reduce([np.concatenate([gradient(r, ws), np.ones(1 << 16)]) for r in range(ws)])
    out = sim.all_reduce([gradient(r, ws) for r in range(ws)])
    view = RunView(sim.run())
    for rank in range(ws):
        assert _traced(view, MEAN, rank, np.asarray(out[rank] / ws), "torch.float32").ok
    assert not any(key[0] == "pool" and key[2] is None for key in view.memo if isinstance(key, tuple))
    # from the bucket alone (N gradient values at the head of a 64K-element bucket): the whole pool proves it
    proof = _traced(view, MEAN, 0, np.asarray(bucket[0][:N] / ws), "torch.float32")
    assert proof.ok and ("pool", 0, None) in view.memo


# -- likely sums named without reading them ------------------------------------------------------------------

WIDE = Quantity("gradient", local=lambda r, ws: [r + 1.0] * 256, combine="mean", through=("all_reduce",))


def _likely_means(ws: int, count: int) -> np.ndarray:
    """The `count` most likely perturbed means of ranks' data r + 1 (a delta of k (r + 2) / STEPS each, k uniform
    in 1..STEPS): what a rank can name from the grader's public source alone, reading nothing."""
    steps = perturb.STEPS["torch.float32"]
    dist = np.array([1.0])
    for r in range(ws):
        poly = np.zeros(steps * (r + 2) + 1)
        poly[np.arange(1, steps + 1) * (r + 2)] = 1.0
        dist = np.convolve(dist, poly)
    best = np.argsort(-dist)[:count]
    return (ws * (ws + 1) / 2 + best / steps) / ws


def _ruled_out(monkeypatch, sim, quantity, finals, dtype="torch.float32"):
    """The findings of each rank's proof; then, with the bound on chance matches lifted, whether they pass."""
    view = RunView(sim.run())
    found = [Tracer(view, quantity, dtype).prove(r, np.asarray(f, np.float64)).finding for r, f in enumerate(finals)]
    monkeypatch.setattr(provenance, "AMBIGUOUS_MIN", 10 ** 9)
    lifted = [Tracer(RunView(sim.run()), quantity, dtype).prove(r, np.asarray(f, np.float64)).ok for r, f in enumerate(finals)]
    return [f.key if f else None for f in found], lifted


def test_likely_sums_returned_without_reading_what_was_delivered_prove_nothing(monkeypatch):
    """Each rank all-reduces a pool of its own data, interleaved with a far filler so that no two matches follow
    each other, and returns the most likely perturbed means, never reading what arrived: each element matches
    some delivered value, alone, a value that recurs in the pool. Not proven ("ambiguous"); with the bound
    lifted the same guess passes: the bound is what refuses it."""
    sim = Sim(2)
    for _ in range(12):
        sim.all_reduce([np.where(np.arange(16384) % 2 == 0, r + 1.0, 1e6) for r in range(2)])
    guess = np.tile(_likely_means(2, 128), 2)
    assert _ruled_out(monkeypatch, sim, WIDE, [guess, guess]) == (["ambiguous"] * 2, [True, True])


def test_a_value_laid_out_element_by_element_from_what_was_delivered_is_proven():
    """Honest, and every element a run of one: the delivered sum read with a stride (a ring's chunks taken as
    t[k::N], say). It draws on as much as it holds, where a value seldom recurs: evidence."""
    sim = Sim(2)
    out = sim.all_reduce([[r + 1.0] * 256 for r in range(2)])
    assert_proven(prove(sim, WIDE, [o.reshape(2, 128).T.reshape(-1) / 2 for o in out]))
