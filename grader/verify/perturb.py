"""The secret perturbation added to what a rank sends through a collective in a perturbed run.

Rank r adds pattern(seed_r, op, k) to its contribution to its k-th call of `op`. The seeds stay in the
supervisor: when a rank enters the call, the runner answers with that call's deltas (runner.py), so no
secret is in the rank before the collective runs. Values that really came through the collective move
by a shift the supervisor computes from all the seeds (verify.py); numbers computed locally cannot move.
Deltas are positive multiples of a power of two, so they add exactly and never cancel across ranks.

Pure Python, no torch: the supervisor never imports torch.
"""
from __future__ import annotations

import random

PERTURBED_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
                 "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather"}
INT_DTYPES = {"torch.int8", "torch.uint8", "torch.int16", "torch.int32", "torch.int64"}
FLOAT_STEPS = {"torch.float64": 256, "torch.float32": 256, "torch.float16": 4, "torch.bfloat16": 4}
PATTERN = 4096  # longer tensors repeat the pattern


def pattern(seed: int, op: str, call: int, numel: int, dtype: str) -> list | None:
    """The first min(numel, PATTERN) deltas; element i gets pattern[i % len(pattern)]. None: not perturbable."""
    if numel <= 0:
        return None
    rng = random.Random(f"{seed}:{op}:{call}")
    n = min(numel, PATTERN)
    if dtype in INT_DTYPES:
        return [rng.randrange(1, 8) for _ in range(n)]
    steps = FLOAT_STEPS.get(dtype)
    if steps is None:
        return None
    return [rng.randrange(1, steps + 1) / steps for _ in range(n)]


def expand(pat: list, numel: int) -> list:
    reps = -(-numel // len(pat))
    return (pat * reps)[:numel]
