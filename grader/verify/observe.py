"""Typed observations of one run, and where each delivered element came from.

`RunView` reads a finished run (processes/runner.RunOutcome: per rank, its operations as protocol.Call
and its reported values) and answers the questions verification asks:
  - which calls of the other ranks took part in a collective (`counterparts`), which send a receive
    matched (`matching_send`);
  - for delivered elements of a call, which ranks' sent elements they are made of, with what weight
    (`sources`), following the semantics of comm.METHODS;
  - whether a call carried the secret perturbation (`perturbed`).
Pure numpy; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..comm import OPS
from ..processes.protocol import Call, values
from . import perturb

LINEAR = {"SUM": 1.0, "AVG": None, "PREMUL_SUM": None}   # AVG: 1/N


@dataclass
class Value:
    """A value a rank reported (returned, or a local of the entry function)."""
    kind: str                 # "tensor" | "sequence" | "other" | "missing"
    plain: bool = False
    type: str = ""
    dtype: str = ""
    shape: list | None = None
    data: np.ndarray | None = None
    omitted: str | None = None

    @classmethod
    def of(cls, desc) -> Value:
        if not isinstance(desc, dict):
            return cls("missing")
        kind = desc.get("kind") if desc.get("kind") in ("tensor", "sequence", "other") else "other"
        shape = desc.get("shape") if isinstance(desc.get("shape"), list) else None
        return cls(kind, bool(desc.get("plain")), str(desc.get("type", ""))[:80], str(desc.get("dtype", "")),
                   shape, values(desc), desc.get("omitted") if isinstance(desc.get("omitted"), str) else None)

    @property
    def floating(self) -> bool:
        return self.dtype in ("torch.float16", "torch.bfloat16", "torch.float32", "torch.float64")


@dataclass
class Term:
    """Delivered elements `positions` (of one output of a call) are made of rank `rank`'s sent elements
    `sent_positions` (of its call `call`) times `weight`; -1 marks elements this rank has no part in."""
    rank: int
    call: Call
    sent_positions: np.ndarray
    weight: float


class RunView:
    def __init__(self, outcome):
        self.outcome = outcome
        self.ws = outcome.request.world_size
        self.calls = [rec.calls for rec in outcome.ranks]
        self.memo: dict = {}   # what verification derives once per run (provenance's sorted pools)
        self._collective_index: dict[tuple, dict[int, Call]] = {}
        for rank, calls in enumerate(self.calls):
            count: dict[tuple, int] = {}
            for call in calls:
                if OPS.get(call.op) is not None and OPS[call.op].collective:
                    key = call.group or tuple(range(self.ws))
                    k = count.get(key, 0)
                    count[key] = k + 1
                    self._collective_index.setdefault((key, k), {})[rank] = call
                    call.index = k  # type: ignore[attr-defined]

    # -- matching calls across ranks
    def counterparts(self, call: Call) -> dict[int, Call]:
        """The calls each rank of the group made for the same collective (the k-th on that group)."""
        key = call.group or tuple(range(self.ws))
        return self._collective_index.get((key, getattr(call, "index", -1)), {})

    def global_rank(self, call: Call, group_rank: int | None) -> int | None:
        if group_rank is None:
            return None
        group = call.group or tuple(range(self.ws))
        return group[group_rank] if 0 <= group_rank < len(group) else None

    def matching_send(self, recv: Call) -> Call | None:
        """The send a receive got: the k-th receive from a peer with a tag matches the k-th send to it."""
        src = self.global_rank(recv, recv.peer) if recv.peer is not None else self.global_rank(recv, recv.source)
        if src is None or not 0 <= src < self.ws:
            return None
        tag = recv.tag
        recvs = [c for c in self.calls[recv.rank] if c.op == "recv" and c.tag == tag
                 and (self.global_rank(c, c.peer) if c.peer is not None else self.global_rank(c, c.source)) == src]
        sends = [c for c in self.calls[src] if c.op == "send" and c.tag == tag
                 and self.global_rank(c, c.peer) == recv.rank]
        k = next((i for i, c in enumerate(recvs) if c is recv), None)
        return sends[k] if k is not None and k < len(sends) else None

    # -- what a call carried
    def perturbed(self, call: Call) -> bool:
        """Whether what `call` delivered carries deltas: some rank that sent into it had a seed and a
        perturbable tensor."""
        senders = [self.matching_send(call)] if call.op == "recv" else list(self.counterparts(call).values())
        for sender in senders:
            if sender is None or sender.seed is None:
                continue
            if any(perturb.perturbable(str(d.get("dtype")), int(d.get("numel") or 0)) for d in sender.inputs or []):
                return True
        return False

    def deltas(self, call: Call) -> np.ndarray | None:
        """The deltas the backend added to what `call` sent (its inputs, flattened and concatenated), from
        the supervisor's seed; None when nothing was perturbed."""
        if call.seed is None:
            return None
        parts = []
        for k, desc in enumerate(call.inputs or []):
            numel, dtype = int(desc.get("numel") or 0), str(desc.get("dtype"))
            values = perturb.delta_values(call.seed + k, numel, dtype) if perturb.perturbable(dtype, numel) else None
            parts.append(values if values is not None else np.zeros(numel))
        return np.concatenate(parts) if parts else np.zeros(0)

    def sources(self, call: Call, out_index: int, positions: np.ndarray) -> list[Term] | str:
        """What delivered elements `positions` of output `out_index` of `call` are made of, or a reason
        (a catalog key suffix) why they are not a linear function of what ranks sent."""
        op = call.op
        weight = 1.0
        if op in ("all_reduce", "reduce_scatter", "reduce"):
            reduce = call.reduce or "SUM"
            if reduce == "AVG":
                weight = 1.0 / max(1, len(call.group or range(self.ws)))
            elif reduce != "SUM":
                return "nonlinear"
        if op == "recv":
            send = self.matching_send(call)
            if send is None:
                return "unmatched"
            return [Term(send.rank, send, _flat_positions(send, out_index, positions), 1.0)]
        group = call.group or tuple(range(self.ws))
        parts = self.counterparts(call)
        n = len(group)
        if len(parts) != n:
            return "incomplete"
        layout = _layout(call, n)
        if layout is None:
            return "layout"
        terms = []
        for g, q in enumerate(group):
            sent = parts[q]
            pos = layout(call, sent, g, out_index, positions)
            if pos is None:
                return "layout"
            if np.any(pos >= 0):
                terms.append(Term(q, sent, pos, weight))
        return terms


def _flat_positions(sent: Call, tensor_index: int, positions: np.ndarray) -> np.ndarray:
    """Positions in the concatenation of `sent`'s inputs of element `positions` of its input `tensor_index`."""
    sizes = [int(d.get("numel") or 0) for d in sent.inputs or []]
    if tensor_index >= len(sizes):
        return np.full(positions.shape, -1)
    return positions + sum(sizes[:tensor_index])


def _numels(descs) -> list[int]:
    return [int(d.get("numel") or 0) for d in descs or []]


def _layout(call: Call, n: int):
    """A function (call, sender's call, sender's group rank g, output index, positions) -> positions in
    the sender's flattened input (-1: not from this sender), for the call's operation."""
    op = call.op
    out_sizes = _numels(call.outputs)
    in_sizes_here = _numels(call.inputs)

    def reduce_like(c, sent, g, k, pos):
        sizes = _numels(sent.inputs)
        if op == "reduce_scatter":
            # output k on group rank `me` is the sum over senders of their `me`-th chunk of input k
            me = (call.group or tuple(range(n))).index(call.rank) if call.rank in (call.group or range(n)) else -1
            if len(sizes) == len(out_sizes) * n:        # list form: inputs are N tensors per output
                idx = k * n + me
                return pos + sum(sizes[:idx]) if idx < len(sizes) else None
            chunk = out_sizes[k] if k < len(out_sizes) else 0
            return pos + sum(sizes[:k]) + me * chunk if k < len(sizes) else None
        return pos + sum(sizes[:k]) if k < len(sizes) else None

    def gather_like(c, sent, g, k, pos):
        sizes = _numels(sent.inputs)
        if len(out_sizes) == max(1, len(sizes)) * n and len(sizes) <= 1:    # list form: output k from rank k
            return pos.copy() if k == g else np.full(pos.shape, -1)
        if k >= len(sizes):
            return None
        m = sizes[k]
        owner = pos // max(1, m)                                         # single tensor: blocks of m
        out = np.where(owner == g, pos % max(1, m) + sum(sizes[:k]), -1)
        return out

    def broadcast_like(c, sent, g, k, pos):
        root = call.root if call.root is not None else 0
        if g != root:
            return np.full(pos.shape, -1)
        sizes = _numels(sent.inputs)
        if op == "scatter":
            me = (call.group or tuple(range(n))).index(call.rank)
            return pos + sum(sizes[:me]) if me < len(sizes) else None
        return pos + sum(sizes[:k]) if k < len(sizes) else None

    def all_to_all(c, sent, g, k, pos):
        sizes = _numels(sent.inputs)
        me = (call.group or tuple(range(n))).index(call.rank)
        if len(out_sizes) == n and len(sizes) == n:                       # list form
            return pos + sum(sizes[:me]) if k == g else np.full(pos.shape, -1)
        splits = call.splits or [None, None]
        out_split = splits[0] or [out_sizes[0] // n] * n if out_sizes else None
        in_split = (sent.splits or [None, None])[1] or ([sizes[0] // n] * n if sizes else None)
        if not out_split or not in_split or len(out_split) != n or len(in_split) != n:
            return None
        rows = (out_sizes[0] // max(1, sum(out_split))) if sum(out_split) else 1
        start = sum(out_split[:g]) * rows
        end = start + out_split[g] * rows
        src_start = sum(in_split[:me]) * rows
        return np.where((pos >= start) & (pos < end), pos - start + src_start, -1)

    del in_sizes_here
    if op in ("all_reduce", "reduce_scatter", "reduce"):
        return reduce_like
    if op in ("all_gather", "gather"):
        return gather_like
    if op in ("broadcast", "scatter"):
        return broadcast_like
    if op == "all_to_all":
        return all_to_all
    return None


class RunContext:
    """What an exercise's `local(rank, ws, ctx)` may read of a run: the values each rank sent and was
    delivered, per operation, in order (each call's tensors flattened and concatenated)."""

    def __init__(self, view: RunView):
        self.view = view
        self.world_size = view.ws

    def delivered(self, rank: int, op: str) -> list[np.ndarray]:
        out = []
        for call in self.view.calls[rank]:
            if call.op == op and call.completed and call.ok and call.receives:
                parts = [v for v in call.delivered_values() if v is not None]
                out.append(np.concatenate(parts) if parts else np.zeros(0))
        return out

    def reduces(self, rank: int, op: str) -> list[str | None]:
        """The reduce operation ("SUM", "AVG" ...; None: not given) of each call of `op` on `rank` that
        delivered data, in the order of `delivered`: what a rank must do with a sum depends on it."""
        return [call.reduce for call in self.view.calls[rank]
                if call.op == op and call.completed and call.ok and call.receives]

    def sent(self, rank: int, op: str) -> list[np.ndarray]:
        out = []
        for call in self.view.calls[rank]:
            if call.op == op and call.sends:
                parts = [v for v in call.sent_values() if v is not None]
                out.append(np.concatenate(parts) if parts else np.zeros(0))
        return out
