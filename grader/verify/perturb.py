"""The secret perturbation: what a perturbed run adds to each tensor a rank sends.

In a perturbed run, when a rank enters an operation the supervisor answers with a fresh seed (the
secret never sits in the rank before the operation runs), and the backend adds `delta_values(seed + k,
...)` to its private copy of the k-th tensor the rank sends (processes/backend.py). What the network
delivers then carries these deltas, and the supervisor, which keeps the seeds, knows them exactly:
numbers computed locally never carry them. Deltas are positive multiples of a power of two, small
enough to add exactly, and they never cancel across ranks.

numpy only: the supervisor never imports torch; the ranks call the same function.
"""
from __future__ import annotations

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it lazily: imported here, the zygote holds it; ~12 ms per rank otherwise)

INT_DTYPES = {"torch.int16", "torch.int32", "torch.int64"}   # bytes (int8, uint8) carry pickled objects
FLOAT_STEPS = {"torch.float64": 256, "torch.float32": 256, "torch.float16": 4, "torch.bfloat16": 4}


def delta_values(seed: int, numel: int, dtype: str) -> np.ndarray | None:
    """Deltas for one sent tensor of `numel` elements (float64), or None when the dtype is not perturbed."""
    if numel <= 0:
        return None
    rng = np.random.Generator(np.random.PCG64(seed & ((1 << 63) - 1)))
    if dtype in INT_DTYPES:
        return rng.integers(1, 8, size=numel).astype(np.float64)
    steps = FLOAT_STEPS.get(dtype)
    if steps is None:
        return None
    return rng.integers(1, steps + 1, size=numel).astype(np.float64) / steps


def perturbable(dtype: str, numel: int) -> bool:
    """The rule the backend applies (backend.perturbable): floats always; integers of more than one element
    (a one-element integer is a count or a size: perturbing it changes what the program does, not what
    it computes); never bytes (all_gather_object sends pickles in uint8 tensors)."""
    if dtype in FLOAT_STEPS:
        return True
    return dtype in INT_DTYPES and numel > 1
