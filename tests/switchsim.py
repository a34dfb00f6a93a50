"""Ranks played in-process against the grader's real switch (grader/switch/): no processes, no torch.

Each call sends the switch the frame a rank's transport sends (processes/backend.py) and returns what the
switch delivered, so tests of verification run on records the switch itself made.
"""
from __future__ import annotations

import numpy as np

from grader import wire
from grader.records import RankRecord, RunOutcome, RunRequest
from grader.switch import Switch
from grader.switch.perturb import generator

NP = {"torch.float32": np.float32, "torch.float64": np.float64, "torch.int64": np.int64, "torch.int32": np.int32,
      "torch.float16": np.float16, "torch.uint8": np.uint8, "torch.bool": np.bool_, "torch.int8": np.int8,
      "torch.bfloat16": np.float32, "torch.complex64": np.complex64, "torch.complex128": np.complex128}


def desc(array, dtype: str, blobs: list | None) -> dict:
    out = {"dtype": dtype, "shape": list(np.shape(array))}
    if blobs is not None:
        out["blob"] = len(blobs)
        blobs.append(wire.to_bytes(np.asarray(array), dtype))
    return out


class Sim:
    """`ws` ranks of one run; `perturb`: the operations the switch perturbs (all of these by default)."""

    def __init__(self, ws: int, perturb=True, dtype: str = "torch.float32", seed: int = 1):
        ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv") if perturb is True \
            else tuple(perturb or ())
        self.ws, self.dtype = ws, dtype
        self.switch = Switch(ws, ops, rng=generator() if seed is None else np.random.default_rng(seed))
        self.records = [RankRecord(r) for r in range(ws)]
        for record, calls in zip(self.records, self.switch.calls):
            record.calls = calls
        self.perturb = ops

    def op(self, rank: int, method: str, inputs=None, outputs=None, group=None, **options) -> None:
        """Send rank `rank`'s frame for one operation: `inputs` / `outputs` nested like the method's
        parameters, each leaf an array (sent) or a shape tuple (an output buffer)."""
        blobs: list = []

        def nest(value, send):
            if isinstance(value, list):
                return [nest(v, send) for v in value]
            if isinstance(value, tuple):
                return {"dtype": self.dtype, "shape": list(value)}
            return desc(np.asarray(value, dtype=NP[self.dtype]), self.dtype, blobs if send else None)
        header = {"t": "op", "seq": len(self.switch.calls[rank]), "method": method,
                  "group": list(group or range(self.ws)), "gname": "", "inputs": nest(inputs, True) if inputs is not None else None,
                  "outputs": nest(outputs, False) if outputs is not None else None, **options}
        self.switch.receive(rank, header, blobs)

    def delivered(self, rank: int, seq: int = -1) -> list[np.ndarray]:
        return [np.asarray(a, dtype=np.float64) for a in self.switch.calls[rank][seq].delivered_arrays]

    # -- the operations tests use most
    def all_reduce(self, contributions: list, reduce: str = "SUM") -> list[np.ndarray]:
        for r, c in enumerate(contributions):
            self.op(r, "allreduce", [np.asarray(c)], [tuple(np.shape(c))], reduce=reduce)
        return [self.delivered(r)[0] for r in range(self.ws)]

    def all_gather(self, contributions: list) -> list[np.ndarray]:
        for r, c in enumerate(contributions):
            self.op(r, "allgather", [np.asarray(c)], [[tuple(np.shape(c))] * self.ws])
        return [np.concatenate(self.delivered(r)) for r in range(self.ws)]

    def send_recv(self, src: int, dst: int, values) -> np.ndarray:
        values = np.asarray(values)
        self.op(src, "send", [values], None, peer=dst, tag=0)
        self.op(dst, "recv", None, [tuple(values.shape)], peer=src, tag=0)
        return self.delivered(dst)[0]

    def run(self) -> RunOutcome:
        return RunOutcome(RunRequest(world_size=self.ws, source="", filename="s.py", perturb=self.perturb), self.records)
