"""What the switch measured of one operation of one rank: the record verification reads.

Everything here is measured at the switch (what the rank sent, what entered the operation after the
secret perturbation, what was delivered to it and where each delivered element came from, when), except
the fields marked as the rank's own words: where in its code it called from, and whether it waited. Those
only ever explain; no verdict rests on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..wire import as_float64, element_size


@dataclass(frozen=True)
class Piece:
    """Delivered elements [start, start + length) of one output of a call are made of these sources,
    summed: (sender's group rank, index of the sender's input tensor, first element there); `Call.weight`
    scales the sum (1 for a sum, 1/N for an average; None: not a sum at all, MAX say)."""
    start: int
    length: int
    sources: tuple[tuple[int, int, int], ...]


@dataclass
class Call:
    rank: int                       # global rank
    seq: int                        # this rank's operations, in the order the switch received them
    method: str                     # the process-group method (comm.METHODS)
    op: str                         # its operation (comm.OPS)
    group: tuple[int, ...]          # the global ranks of its group, in group-rank order
    gname: str = ""                 # the group's name (two groups of the same ranks are two groups)
    root: int | None = None         # group rank of the root (rooted operations)
    reduce: str | None = None       # "SUM", "AVG", "MAX" ...
    peer: int | None = None         # group rank of the peer (point-to-point)
    tag: int | None = None
    sends: bool = False             # this rank contributed data
    receives: bool = False          # data is delivered to this rank
    inputs: list = field(default_factory=list)    # descriptors {"dtype", "shape", "numel"} of what it sent
    outputs: list = field(default_factory=list)   # descriptors of its output buffers
    splits: list | None = None      # all_to_all: [output splits, input splits] as given
    device: str = "cpu"
    sent: list = field(default_factory=list, repr=False)        # arrays, in their own dtype
    perturbed: list | None = field(default=None, repr=False)    # what entered the operation (perturbed runs)
    completed: bool = False
    ok: bool = False
    error: str | None = None
    problem: dict | None = None     # a message that did not fit its receive buffer: the figures (ops.check_message)
    source: int | None = None       # a receive from any source: the sender's group rank
    posted: int = 0                 # point-to-point: the order the switch took it in (pairing)
    sent_bytes_held: int = field(default=0, repr=False)   # what the switch holds for it until it completes
    retain_bytes: int = field(default=0, repr=False)      # what keeping its values costs (sent, entered, delivered)
    delivered: list = field(default_factory=list)               # descriptors of what was delivered
    delivered_arrays: list = field(default_factory=list, repr=False)
    pieces: list = field(default_factory=list, repr=False)      # per output: [Piece]
    weight: float | None = 1.0
    partners: dict = field(default_factory=dict, repr=False)    # group rank -> the Call it was paired with
    index: int = -1                 # the k-th collective of its rank on its group
    entered_at: int = 0             # the switch's clock when it arrived / when it was delivered:
    completed_at: int = 1 << 62     # what a rank was delivered before it sent something may feed it
    retained: bool = True           # False: over the grader's memory budget, sizes kept but not values
    # the rank's own words (hints for feedback, never evidence)
    line: int | None = None
    file: str | None = None         # a file a notebook cell wrote (None: the submission itself)
    function: str | None = None
    api: str | None = None
    via: str | None = None          # a library that made the call on its own ("DistributedDataParallel")
    async_op: bool | None = None
    waited: bool = False
    peeked: bool = False            # its outputs read (result()) before any wait
    ms: float = 0.0                 # real-backend runs only: the rank's own timing

    def sent_values(self) -> list[np.ndarray | None]:
        return self._float("_sent64", self.sent)

    def delivered_values(self) -> list[np.ndarray | None]:
        return self._float("_delivered64", self.delivered_arrays)

    def entered_values(self) -> list[np.ndarray | None]:
        """What entered the operation: what the rank sent, plus the deltas in a perturbed run."""
        return self._float("_perturbed64", self.perturbed) if self.perturbed is not None else self.sent_values()

    def _float(self, key: str, arrays) -> list[np.ndarray | None]:
        """Decoded once (verification reads them many times), read-only so that no reader changes them."""
        cached = self.__dict__.get(key)
        if cached is None:
            cached = [as_float64(array) for array in arrays or []]
            for value in cached:
                if value is not None:
                    value.setflags(write=False)
            self.__dict__[key] = cached
        return list(cached)

    def deltas(self) -> np.ndarray | None:
        """What the perturbation added to what this call sent (its inputs flattened and concatenated)."""
        if self.perturbed is None:
            return None
        sent, entered = self.sent_values(), self.entered_values()
        parts = [e - s for s, e in zip(sent, entered) if s is not None and e is not None]
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def sent_numel(self) -> int:
        return sum(int(d.get("numel") or 0) for d in self.inputs)

    @property
    def sent_bytes(self) -> int:
        return sum(int(d.get("numel") or 0) * element_size(d.get("dtype")) for d in self.inputs)

    @property
    def delivered_bytes(self) -> int:
        return sum(int(d.get("numel") or 0) * element_size(d.get("dtype")) for d in self.delivered)

    @property
    def sent_dtypes(self) -> list[str]:
        return [str(d.get("dtype")) for d in self.inputs]
