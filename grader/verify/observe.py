"""Typed observations of one run, and where each delivered element came from.

`RunView` reads a finished run (records.RunOutcome: per rank, its operations as the switch
measured them, switch.Call, and the values it reported) and answers the questions verification asks:
  - for delivered elements of a call, which ranks' sent elements they are made of, with what weight
    (`sources`), from the switch's own record of where it put each delivered element (switch.Piece);
  - whether a call carried the secret perturbation (`perturbed`), and the deltas that entered it.
Pure numpy; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..switch import Call


@dataclass
class Value:
    """A value a rank reported (returned, or a local of the entry function): its answer, not evidence."""
    kind: str                 # "tensor" | "sequence" | "other" | "missing"
    plain: bool = False
    type: str = ""
    dtype: str = ""
    shape: list | None = None
    data: np.ndarray | None = None
    omitted: str | None = None

    @classmethod
    def of(cls, desc) -> Value:
        """From a value as the runner decoded it (wire.value)."""
        if not isinstance(desc, dict) or desc.get("kind") not in ("tensor", "sequence", "other"):
            return cls("missing")
        return cls(desc["kind"], bool(desc.get("plain")), str(desc.get("type", "")), str(desc.get("dtype", "")),
                   desc.get("shape") if isinstance(desc.get("shape"), list) else None, desc.get("array"),
                   desc.get("omitted"))

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


def _offsets(call: Call) -> list[int]:
    """Where each input tensor of a call starts in the concatenation of them all."""
    sizes = [int(d.get("numel") or 0) for d in call.inputs]
    return [sum(sizes[:k]) for k in range(len(sizes))]


class RunView:
    def __init__(self, outcome):
        self.outcome = outcome
        self.ws = outcome.request.world_size
        self.calls = [rec.calls for rec in outcome.ranks]
        self.memo: dict = {}   # what verification derives once per run (provenance's sorted pools)

    def global_rank(self, call: Call, group_rank: int | None) -> int | None:
        if group_rank is None:
            return None
        return call.group[group_rank] if 0 <= group_rank < len(call.group) else None

    def counterparts(self, call: Call) -> dict[int, Call]:
        """The calls it was paired with, by global rank (for a collective, its own included)."""
        return {p.rank: p for p in call.partners.values()}

    def matching_send(self, recv: Call) -> Call | None:
        """The send a receive got (the switch paired them)."""
        return next(iter(recv.partners.values()), None) if recv.op == "recv" else None

    # -- what a call carried
    def perturbed(self, call: Call) -> bool:
        """Whether what `call` delivered carries deltas: some call that fed it entered perturbed."""
        return any(p.perturbed is not None for p in call.partners.values() if p.sends)

    def deltas(self, call: Call) -> np.ndarray | None:
        """What the perturbation added to what `call` sent (inputs flattened, concatenated); None: nothing."""
        return call.deltas()

    def sources(self, call: Call, out_index: int, positions: np.ndarray) -> list[Term] | str:
        """What delivered elements `positions` of output `out_index` of `call` are made of, or a reason
        (a catalog key suffix) why they are not a linear function of what ranks sent."""
        if call.weight is None:
            return "nonlinear"
        if call.op == "recv" and not call.partners:
            return "unmatched"
        if out_index >= len(call.pieces):
            return "layout"
        terms = []
        for piece in call.pieces[out_index]:
            inside = (positions >= piece.start) & (positions < piece.start + piece.length)
            if not inside.any():
                continue
            for g, index, start in piece.sources:
                sender = call.partners.get(g)
                if sender is None:
                    return "incomplete"
                offsets = _offsets(sender)
                if index >= len(offsets):
                    return "layout"
                pos = np.full(positions.shape, -1)
                pos[inside] = offsets[index] + start + positions[inside] - piece.start
                terms.append(Term(sender.rank, sender, pos, call.weight))
        return terms


@dataclass
class Exchange:
    """One operation that completed and delivered data to a rank, read whole: what the rank sent into it, what
    it delivered to the rank, and what every rank of that same operation sent into it (`fed`, by global rank;
    the rank's own entry included where it sent). Pairing by the operation itself, never by position in
    per-rank lists: a rank's k-th call and another rank's k-th call need not be one operation (a call on a
    group the other rank never joins, one that never completed)."""
    call: Call
    sent: np.ndarray
    delivered: np.ndarray
    fed: dict

    @property
    def reduce(self) -> str | None:
        return self.call.reduce

    @property
    def group(self) -> tuple[int, ...]:
        return tuple(self.call.group)


def _flat(values) -> np.ndarray:
    parts = [v for v in values if v is not None]
    return np.concatenate(parts) if parts else np.zeros(0)


def _contributed(call: Call) -> bool:
    """A call whose data entered an operation that completed and delivered it to some rank (a send that never
    completed, or that reached no one, is no contribution)."""
    return call.completed and call.ok and call.sends and any(
        p.completed and p.ok and p.receives for p in call.partners.values())


class RunContext:
    """What an exercise's `local(rank, ws, ctx)` may read of a run: the values each rank sent and was
    delivered, per operation, in order (each call's tensors flattened and concatenated), as measured.

    `sent`, `delivered` and `reduces` each list ONE rank's own calls: position k of one rank's list and position
    k of another's need not be the same operation, so they are never paired across ranks. What every rank fed
    the operation whose result a rank received is `operations(rank, op)` (each entry one operation, its
    senders by the switch's own pairing)."""

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

    def exchanged(self, rank: int, op: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """(what the rank sent, what it was delivered) in each call of `op` that completed with both, in
        order: the two sides of one call (`sent` and `delivered` each list the calls that have that side)."""
        out = []
        for call in self.view.calls[rank]:
            if call.op == op and call.completed and call.ok and call.sends and call.receives:
                sides = [[v for v in values if v is not None] for values in (call.sent_values(), call.delivered_values())]
                out.append(tuple(np.concatenate(side) if side else np.zeros(0) for side in sides))
        return out

    def sent(self, rank: int, op: str) -> list[np.ndarray]:
        """What the rank sent in each call of `op` whose data entered a completed operation that delivered it
        to some rank, in order (a call still pending at the end, or one that failed, sent nothing anyone got)."""
        return [_flat(call.sent_values()) for call in self.view.calls[rank] if call.op == op and _contributed(call)]

    def operations(self, rank: int, op: str) -> list[Exchange]:
        """Each call of `op` that completed and delivered data to `rank`, in the order of `delivered`, with what
        every rank of that same operation sent into it (the switch's pairing: `Call.partners`)."""
        out = []
        for call in self.view.calls[rank]:
            if call.op == op and call.completed and call.ok and call.receives:
                fed = {p.rank: _flat(p.sent_values()) for p in call.partners.values()
                       if p.sends and p.completed and p.ok}
                sent = _flat(call.sent_values()) if call.sends else np.zeros(0)
                out.append(Exchange(call, sent, _flat(call.delivered_values()), fed))
        return out
