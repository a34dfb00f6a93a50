"""Typed observations of one run, and where each delivered element came from.

`RunView` reads a finished run (records.RunOutcome: per rank, its operations as the switch
measured them, switch.Call, and the values it reported) and answers the questions verification asks:
  - for delivered elements of a call, which ranks' sent elements they are made of, with what weight
    (`sources`), from the switch's own record of where it put each delivered element (switch.Piece);
  - whether a call carried the secret perturbation (`perturbed`), and the deltas that entered it.
Pure numpy; no torch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..switch import Call
from ..switch.perturb import perturbable
from .budget import tick


def entered_perturbed(call: Call) -> bool:
    """Every element `call` sent entered its operation with a delta (what the switch measured: the data that
    entered differs from the data sent, everywhere)."""
    deltas = call.deltas()
    return deltas is not None and 0 < deltas.size == call.sent_numel and bool(np.all(deltas != 0))


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
    return np.cumsum([0] + sizes[:-1]).tolist() if sizes else []


class RunView:
    def __init__(self, outcome):
        self.outcome = outcome
        self.ws = outcome.request.world_size
        self.calls = [rec.calls for rec in outcome.ranks]
        self.memo: dict = {}   # what verification derives once per run (provenance's sorted pools)

    @functools.cached_property
    def kept(self) -> int:
        """How many values the switch kept of this run (sent and delivered, every rank): what reading it back
        costs grows with it (budget.allowance)."""
        return sum(int(getattr(a, "size", 0)) for calls in self.calls for call in calls
                   for a in (*(call.sent or ()), *(call.delivered_arrays or ())) if a is not None)

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
    def offsets(self, call: Call) -> list[int]:
        """_offsets(call), once per call of the run (a coalesced call of thousands of tensors is asked for
        every output it delivered)."""
        key = ("offsets", id(call))
        if key not in self.memo:
            self.memo[key] = _offsets(call)
        return self.memo[key]

    def flat(self, call: Call, which: str) -> np.ndarray:
        """What `call` sent ("sent"), or what entered it perturbed ("entered"), its tensors laid end to end as
        float64 (a tensor not recorded left out), once per call of the run."""
        key = (which, id(call))
        if key not in self.memo:
            values = call.sent_values() if which == "sent" else call.entered_values()
            self.memo[key] = np.concatenate([v for v in values if v is not None] or [np.zeros(0)])
        return self.memo[key]

    def divisors(self, rank: int, limit: int | None = None) -> list[tuple[float, float]]:
        """Delivered elements of a summing all-reduce whose unperturbed value is the number of ranks (an
        all-reduced count, alone or in a bucket), as (perturbed value, unperturbed value): at most 16 (`limit`:
        in outputs of at most that many elements)."""
        key = ("divisors", rank, limit)
        if key in self.memo:
            return self.memo[key]
        out = []
        for call in self.calls[rank]:
            if not (call.completed and call.ok and call.receives) or call.op != "all_reduce" or call.reduce not in (None, "SUM"):
                continue
            if not self.perturbed(call):   # delivered as sent: a count of N is the scale 1/N, which is tried anyway
                continue
            for k, data in enumerate(call.delivered_values()):
                tick()
                if len(out) >= 16:
                    break
                if data is None or not data.size or (limit is not None and data.size > limit):
                    continue
                terms = self.sources(call, k, np.arange(data.size))
                if isinstance(terms, str):
                    continue
                clean = np.zeros(data.size)
                for term in terms:
                    sent = self.flat(term.call, "sent")
                    pos = term.sent_positions
                    if sent.size == 0 or pos.max() >= sent.size:
                        break
                    clean += term.weight * np.where(pos >= 0, sent[np.clip(pos, 0, None)], 0)
                else:
                    for j in np.flatnonzero(np.abs(clean - self.ws) < 1e-9)[:8]:
                        if data[j] != 0:
                            out.append((float(data[j]), float(clean[j])))
        self.memo[key] = out[:16]
        return self.memo[key]

    def perturbed(self, call: Call) -> bool:
        """Whether what `call` delivered carries deltas: some call that fed it entered perturbed."""
        return any(p.perturbed is not None for p in call.partners.values() if p.sends)

    def deltas(self, call: Call) -> np.ndarray | None:
        """What the perturbation added to what `call` sent (inputs flattened, concatenated); None: nothing."""
        return call.deltas()

    def evidence(self, call: Call, out_index: int) -> bool:
        """Whether delivered output `out_index` of `call` carries deltas a rank could not predict: a floating
        output of a perturbed operation, or an integer one (the student's own integer sum, switch/perturb.py)
        where every sender's data entered perturbed, each element of it (measured: what entered differs
        from what was sent). Integers that travelled as sent prove nothing."""
        if not self.perturbed(call) or out_index >= len(call.delivered):
            return False
        if perturbable(str(call.delivered[out_index].get("dtype", ""))):
            return True
        return all(entered_perturbed(p) for p in call.partners.values() if p.sends)

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
                offsets = self.offsets(sender)
                if index >= len(offsets):
                    return "layout"
                pos = np.full(positions.shape, -1)
                pos[inside] = offsets[index] + start + positions[inside] - piece.start
                terms.append(Term(sender.rank, sender, pos, call.weight))
        return terms
