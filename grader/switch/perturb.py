"""The secret perturbation: what the switch adds to every element a rank sends in a perturbed operation.

The switch draws fresh deltas for each tensor a rank sends, adds them to its own copy of what the rank
sent, and computes the operation on the perturbed data: what is delivered carries them, and no rank ever
holds a delta before (or apart from) what it was delivered. Numbers a rank computes locally carry none.

Every element of every floating tensor is perturbed, whatever its size (one-element tensors included), in an
operation that moves or sums data (a MAX, MIN or product proves nothing and is left as sent: honest code
branches on one, GradScaler's found_inf all-reduced with MAX):
x + c (1 + |x|), c a positive multiple of 1/256 up to 1 (of 1/8 for bfloat16, whose rounding would swallow
smaller steps; for float16 a multiple of 1/32 from 1/8 to 1/4, so that a sum an honest float16 all-reduce
keeps in range, up to 4/5 of float16's largest 65504, stays in range perturbed): far beyond the comparison
tolerance of its dtype (2% for 16-bit floats), and positive, so deltas never cancel across ranks.

Integer tensors (int32, int64) are perturbed only in an integer SUM the student's own code makes
(`student_sum`: a summing operation called through a public torch.distributed function from the
submission's code, not by a library on its behalf) of more than one element: counts summed over the ranks,
then cast to float and divided, are data a value may be made of. Their deltas are whole numbers,
ceil(c (1 + |x|)) with c as for float32 (at least 1: an integer sum cannot carry less), on tensors whose
values stay below LIMIT, so that no perturbed sum of up to 64 ranks leaves the dtype (nor float64's exact
integers, which verification reads them in). Everything else travels as it was sent: a one-element flag or
count (honest code branches on an all-reduced "found" flag, or divides by an all-reduced count: the tracer
knows a count, verify/provenance.py), bool and byte tensors, and torch's own integer traffic (DDP's
all-gathered parameter shapes and its unused-parameter map, which its C++ reducer all-reduces on its own;
the sizes of the *_object collectives): perturbing those would break honest programs, and no value is proven
from data that travelled unperturbed (verification reads as evidence only elements that entered with deltas).

What a rank can learn from integer deltas is what it can already learn from floating ones: a rank that
sums a tensor of its own and compares the result with what it expects tells a perturbed run from a clean
one either way (a two-element float32 probe does it as well as a two-element int64 one), so integer deltas
open no new way to tell the runs apart; the deltas are fresh for every tensor and never leave the switch
but inside the sum, and which integer tensors are perturbed depends only on what the rank itself sent and
how it called (never on anything secret), as this text says.

The switch records what entered each operation (record.Call.perturbed), so verification reads the
deltas from the record; nothing here is secret but the generator's state, which lives in the grader.
"""
from __future__ import annotations

import secrets

import numpy as np

from .. import comm

STEPS = {"torch.float64": 256, "torch.float32": 256, "torch.float16": 32, "torch.bfloat16": 8,
         "torch.complex64": 256, "torch.complex128": 256}
LOWEST = {"torch.float16": 4}   # c from LOWEST / STEPS (else 1 / STEPS) ...
HIGHEST = {"torch.float16": 8}  # ... to HIGHEST / STEPS (else 1)
# integer dtypes an integer sum of the student's own is perturbed in, each with the largest |x| perturbed: the
# perturbed values (at most 2 |x| + 1) summed over 64 ranks stay inside int32, and inside float64's exact
# integers for int64 (bool, uint8 and int8 wrap or saturate within a few additions: never perturbed)
LIMIT = {"torch.int32": 1 << 23, "torch.int64": 1 << 46}
SUMS = ("all_reduce", "reduce", "reduce_scatter")   # operations whose integer SUM may be perturbed
# the public functions a student sums with (dist.all_reduce, dist.reduce_scatter_tensor, functional
# all_reduce ...): the name the rank's record gives of the torch.distributed function it called through
REDUCING_APIS = frozenset(name.rsplit(".", 1)[-1] for name, op in comm.API_NAMES.items()
                           if op in SUMS and name.startswith("torch.distributed."))


# the largest finite value of each floating dtype a sum may reach: past it, a perturbed sum may be inf
LARGEST = {"torch.float16": 65504.0, "torch.bfloat16": 3.3895313892515355e38,
           "torch.float32": 3.4028234663852886e38, "torch.float64": 1.7976931348623157e308}


def reach(dtype: str) -> float:
    """The largest c of `dtype`'s deltas: a value x enters as at most x + c (1 + |x|)."""
    steps = STEPS[dtype]
    return HIGHEST.get(dtype, steps) / steps


def may_overflow(positive: np.ndarray, terms: int, dtype: str) -> bool:
    """Whether some draw of deltas could take a sum past `dtype`'s largest value: `positive` holds, per
    delivered element, the sum of the positive parts of what went into it, over `terms` contributions. A
    positive x enters as at most x (1 + c) + c, a negative one moves toward zero: no partial sum of the
    perturbed data, in any order, exceeds sum(max(x, 0)) (1 + c) + terms c. Decided by what was sent alone,
    never by the draw, so that a sum near the limit gets the same verdict in every grading (a sum within
    4/5 of float16's 65504 never overflows; past it, some draw may)."""
    largest = LARGEST.get(dtype)
    if largest is None or not positive.size:
        return False
    c = reach(dtype)
    # a margin of 1/256 for the rounding of each partial sum (half a unit in the last place at most)
    return bool(float(np.max(positive)) * (1 + c) + terms * c > largest * (1 - 1 / 256))


def generator() -> np.random.Generator:
    """A fresh generator seeded from the system's secrets (one per run)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def children(rng: np.random.Generator, n: int) -> list[np.random.Generator]:
    """`n` generators of their own, each seeded with 128 bits drawn from `rng` (for work on two threads:
    twocores.py); as secret as `rng` itself."""
    return [np.random.Generator(np.random.PCG64(rng.bit_generator.random_raw(2))) for _ in range(n)]


CHUNK = 1 << 18


def perturbable(dtype: str) -> bool:
    """A floating dtype: perturbed in every operation that moves or sums data."""
    return dtype in STEPS


def student_sum(call) -> bool:
    """An integer SUM the student's own code made: a summing operation (`SUMS`) called from the submission
    (its frame found: `function`) through a public reducing function (`api`), not by a library on its
    behalf (`via`: DDP's start-up; its reducer's all-reduce of the unused-parameter map comes from C++, with
    no torch.distributed function on the way). These are the rank's words, used only to leave data as sent:
    a rank that hides its call from them gets its integers unperturbed, and proven from nothing."""
    return (call.op in SUMS and (call.reduce or "SUM") == "SUM" and call.function is not None
            and call.via is None and call.api in REDUCING_APIS)


def perturbed(values: np.ndarray, dtype: str, rng: np.random.Generator, call=None) -> np.ndarray | None:
    """`values` (as wire.tensor gives them for `dtype`) plus fresh deltas, in the same array type; None for
    what travels unperturbed (an integer tensor: unless `call` is the student's own integer sum and it has
    more than one element, its values within LIMIT)."""
    from ..wire import round_to
    steps = STEPS.get(dtype)
    if steps is None:
        if dtype in LIMIT and call is not None and values.size > 1 and student_sum(call) \
                and float(np.max(np.abs(values.astype(np.float64)))) < LIMIT[dtype]:
            c = rng.integers(1, STEPS["torch.float32"] + 1, size=values.shape)
            delta = -((-c * (1 + np.abs(values.astype(np.int64)))) // STEPS["torch.float32"])   # the ceiling, >= 1
            return (values.astype(np.int64) + delta).astype(values.dtype)
        return None
    flat = values.reshape(-1)
    out = np.empty_like(flat)
    complex_ = np.iscomplexobj(values)
    # float32 and float64 in their own dtype (each step rounded there: what entered is recorded, whatever
    # its last bit); the others through float64 (complex128), rounded to the dtype once
    direct = dtype in ("torch.float32", "torch.float64")
    real = flat.dtype if direct else np.dtype(np.float64)
    low, high = LOWEST.get(dtype, 1), HIGHEST.get(dtype, steps)
    # in slices, through temporaries made once: they stay in cache, and no pass allocates (1M float32: ~1 ms)
    size = min(CHUNK, flat.size)
    mag, c = np.empty(size, real), np.empty(size, real)
    wide = None if direct else np.empty(size, np.complex128 if complex_ else np.float64)
    with np.errstate(over="ignore", invalid="ignore"):   # past the dtype's range: inf, as torch gives
        for at in range(0, flat.size, CHUNK):
            m = min(CHUNK, flat.size - at)
            if direct:
                part = flat[at:at + m]
            else:
                part = wide[:m]
                part[...] = flat[at:at + m]
            _steps(rng, low, high, c[:m])
            c[:m] *= real.type(1 / steps)            # exact: steps is a power of two
            np.abs(part, out=mag[:m])
            mag[:m] += 1
            mag[:m] *= c[:m]                         # c (1 + |x|)
            if direct:
                np.add(part, mag[:m], out=out[at:at + m])
            else:
                part += mag[:m]
                out[at:at + m] = part.astype(values.dtype) if complex_ else round_to(part, dtype)
    return out.reshape(values.shape)


def _steps(rng: np.random.Generator, low: int, high: int, c: np.ndarray) -> None:
    """Fill `c` (floating) with integers drawn uniformly from low..high. A span of a power of two up to 256
    (every dtype's but float16's) is cut from the generator's raw 64-bit words: a tenth of `integers`' cost."""
    span = high - low + 1
    if span & (span - 1) or span > 256:
        c[...] = rng.integers(low, high + 1, size=c.size)
        return
    raw = rng.bit_generator.random_raw(-(-c.size // 8)).view(np.uint8)[:c.size]
    if span < 256:
        raw = raw & np.uint8(span - 1)
    c[...] = raw
    c += low
