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
tolerance of its dtype (2% for 16-bit floats), and positive, so deltas never cancel across ranks. Integer,
bool and byte tensors travel as they were sent: they are the control data of torch itself (DDP all-gathers
int64 parameter shapes and compares them with its own; the *_object collectives send sizes and pickles),
which perturbing would break in honest programs, and no value is ever proven from them (a quantity is
floating, and verification only reads perturbed elements as evidence: verify/provenance.py).

The switch records what entered each operation (record.Call.perturbed), so verification reads the
deltas from the record; nothing here is secret but the generator's state, which lives in the grader.
"""
from __future__ import annotations

import secrets

import numpy as np

STEPS = {"torch.float64": 256, "torch.float32": 256, "torch.float16": 32, "torch.bfloat16": 8,
         "torch.complex64": 256, "torch.complex128": 256}
LOWEST = {"torch.float16": 4}   # c from LOWEST / STEPS (else 1 / STEPS) ...
HIGHEST = {"torch.float16": 8}  # ... to HIGHEST / STEPS (else 1)


def generator() -> np.random.Generator:
    """A fresh generator seeded from the system's secrets (one per run)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


CHUNK = 1 << 18


def perturbable(dtype: str) -> bool:
    return dtype in STEPS


def perturbed(values: np.ndarray, dtype: str, rng: np.random.Generator) -> np.ndarray | None:
    """`values` (as wire.tensor gives them for `dtype`) plus fresh deltas, in the same array type; None for
    a dtype that travels unperturbed."""
    from ..wire import round_to
    steps = STEPS.get(dtype)
    if steps is None:
        return None
    flat = values.reshape(-1)
    out = np.empty_like(flat)
    wide = np.complex128 if np.iscomplexobj(values) else np.float64
    for at in range(0, flat.size, CHUNK):   # in slices: the wide temporaries stay small
        part = flat[at:at + CHUNK].astype(wide)
        c = rng.integers(LOWEST.get(dtype, 1), HIGHEST.get(dtype, steps) + 1, size=part.size) / steps
        part = part + c * (1.0 + np.abs(part))
        out[at:at + CHUNK] = part.astype(values.dtype) if np.iscomplexobj(values) else round_to(part, dtype)
    return out.reshape(values.shape)
