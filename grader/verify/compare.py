"""Values compared within their dtype's tolerance: what "the same numbers" means to every cause."""
from __future__ import annotations

import numpy as np


def close(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("torch.float16", "torch.bfloat16"):
        return np.abs(a - b) <= 2e-2 + 1e-2 * np.abs(b)
    return np.abs(a - b) <= 1e-6 + 1e-5 * np.abs(b)


def all_close(values: np.ndarray | None, expected: np.ndarray, dtype: str) -> bool:
    return values is not None and values.shape == expected.shape and bool(np.all(close(values, expected, dtype)))
