"""What one rank was delivered that can prove something, sorted once per run: every output of a perturbed
operation it received that carries deltas (floating ones, and the integer sums the switch perturbs:
RunView.evidence), for the tracer's lookups (provenance.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass
class Pool:
    """Delivered vectors on one rank that can prove something: (call, output index, values), every one the
    rank received in a perturbed operation, sorted once per run. A search filters the entries it may use:
    the quantity's operations (`Tracer.usable`), and what arrived before some message (`done`)."""
    entries: list
    done: np.ndarray       # completed_at of each entry
    starts: np.ndarray     # where each entry begins in the concatenation of them all
    order: np.ndarray      # the concatenated values, sorted
    index: np.ndarray      # the position in the concatenation of each sorted value
    flat: np.ndarray       # the concatenated values, in order

    @functools.cached_property
    def entry_of(self) -> np.ndarray:
        """The entry each element of `flat` belongs to."""
        return np.searchsorted(self.starts, np.arange(self.flat.size), "right") - 1

    @functools.cached_property
    def ends(self) -> np.ndarray:
        """Where each entry ends in `flat`."""
        return np.append(self.starts[1:], self.flat.size)


def pool(view, rank: int, limit: int | None = None) -> Pool:
    """The pool of one rank of a run (`limit`: only the outputs of at most that many elements)."""
    entries = []
    for call in view.calls[rank]:
        if not (call.completed and call.ok and call.receives and call.delivered):
            continue
        if not view.perturbed(call):
            continue
        for k, data in enumerate(call.delivered_values()):
            # evidence is perturbed elements only (integers that travelled as sent are not)
            if data is not None and data.size and (limit is None or data.size <= limit) and view.evidence(call, k):
                entries.append((call, k, data))
    if entries:
        flat = np.concatenate([e[2] for e in entries])
        index = np.argsort(flat)   # ties are ordered at lookup (quicksort: a fifth of a stable sort's time)
        starts = np.cumsum([0] + [e[2].size for e in entries[:-1]])
        return Pool(entries, np.array([e[0].completed_at for e in entries]), starts, flat[index], index, flat)
    return Pool([], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0),
                np.zeros(0, dtype=np.int64), np.zeros(0))


def largest(view, rank: int) -> int:
    """The most elements one output delivered to this rank holds (0: none): whether a pool of the smaller ones
    leaves anything out."""
    return max((data.size for call in view.calls[rank] if call.completed and call.ok and call.receives
                for data in call.delivered_values() if data is not None), default=0)
