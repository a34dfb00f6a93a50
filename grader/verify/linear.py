"""A quantity that is a linear combination of every rank's own vectors, traced through a perturbed run's
all-reduces: for exercises whose quantity is a rank's own state (`combine="own"`, `context=True`), computed
from what its all-reduces delivered with coefficients the engine's tracer does not try (1/K micro-batches,
a half-precision round trip, an optimizer step).

    run = LinearRun(ctx, lambda q: [...rank q's own vectors...], numel)
    run.values(rank, target)   # what this rank can have made, with weights `target` over the own vectors
    foreign_sends(calls, own, numel)   # a rank's all-reduces whose send is not its own data (for causes)

What a rank sent counts as its own data only when fit() explains it to within its dtype's rounding,
relative to what was sent (no fixed floor that a tiny send could sit under): see fit().

Numbers only (numpy): nothing here runs in a rank.
"""
from __future__ import annotations

from itertools import combinations
from types import SimpleNamespace

import numpy as np

from ..switch.perturb import perturbable
from .budget import tick
from .observe import entered_perturbed
from .proof import Finding, Proof, tolerance

HALF = ("torch.float16", "torch.bfloat16")

# the spacing of each dtype's subnormal numbers: the only absolute error its rounding makes (every other
# rounding error is relative to the number rounded). Any other dtype reads as float32.
SUBNORMAL = {"torch.float16": 2.0 ** -24, "torch.bfloat16": 2.0 ** -133, "torch.float32": 2.0 ** -149,
             "torch.float64": 2.0 ** -1074}
# (element, spread, norm), all relative to what was sent: each element's residual within element x |that
# element| + spread x the largest sent element (float32 sums in any order, a scale before or after the
# cast), and the whole residual within norm x the norm of the send. Half precision: a few roundings of
# bfloat16 (2^-8 each; float16's are 2^-11) with room to spare; float32 and wider: float32's.
TOLERANCE = {True: (2e-2, 1e-2, 2e-2), False: (1e-4, 1e-5, 1e-4)}


def _evidence(call) -> bool:
    """A call whose data can explain a value: floating data, or an integer sum the switch perturbed on every
    rank that sent into it (integers that travelled as sent are never evidence: switch/perturb.py)."""
    if perturbable(str(call.inputs[0].get("dtype"))):
        return True
    return all(entered_perturbed(p) for p in (call.partners.values() or [call]) if p.sends)


def fit(target: np.ndarray, columns: list[np.ndarray], dtype: str):
    """Coefficients c with sum(c_j columns_j) == target within the rounding of `dtype`; None if none.

    Every tolerance is relative to what was sent, none a fixed amount: fit(s x target) fits exactly when
    fit(target) does (with s x its coefficients), so a send far smaller than its rank's data is held to
    the same precision as a large one, and a send that is mostly something else, tiny or not, does not
    fit (a fixed floor let a tiny send of anything "fit" with whatever coefficient its projection gave).
    An honest send is its combination rounded once or a few times: each element off by a few units of
    its own last place. The one absolute term is the dtype's: a few subnormal steps per element (float16's
    2^-24; nil for bfloat16 and float32), for honest elements that fall below the normal range; it never
    carries a send, as the norm test has none: a send that is rounding noise, or mostly subnormal, fails."""
    if not columns:
        return None
    target = np.asarray(target, dtype=np.float64)
    basis = np.stack(columns, axis=1).astype(np.float64)
    if not (np.all(np.isfinite(target)) and np.all(np.isfinite(basis))):
        return None
    scale = np.linalg.norm(basis, axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(basis / scale, target, rcond=None)   # columns of any size alike
    coef = coef / scale
    residual = np.abs(basis @ coef - target)
    element, spread, norm = TOLERANCE[dtype in HALF]
    floor = 4 * SUBNORMAL.get(dtype, SUBNORMAL["torch.float32"])
    if np.any(residual > element * np.abs(target) + spread * float(np.max(np.abs(target), initial=0.0)) + floor):
        return None
    if float(np.linalg.norm(residual)) > norm * float(np.linalg.norm(target)):
        return None
    return coef


class LinearRun:
    """What the all-reduces of one perturbed run delivered, in terms of every rank's own vectors.

    `own(q)` lists rank q's own vectors (the exercise's data: one per micro-batch, say). A vector a rank sent is explained when it
    is a combination of its own vectors and of what earlier all-reduces delivered to it; a delivered vector
    is then weight x the sum of what the group's ranks sent, so each is a coefficient vector over the
    basis (q, j) of every rank's own vectors, exactly as the unperturbed run would have computed it. Only
    all-reduces whose tensors (flattened, concatenated) have `numel` elements take part, or consecutive
    all-reduces on one group whose pieces add up to `numel` elements in the order they ran (buckets, as DDP
    makes them): those count as one."""

    def __init__(self, ctx, own, numel: int, ops=("all_reduce",)):
        self.view, self.ws, self.numel, self.ops = ctx.view, ctx.world_size, numel, ops
        self.own = [list(own(q)) for q in range(self.ws)]
        self.offset = np.cumsum([0] + [len(v) for v in self.own])
        self._sent: dict = {}
        self._delivered: dict = {}
        self.loose = False    # a vector sent in half precision: its coefficients are known to about 1e-3
        self._units: dict = {}

    def calls(self, rank: int) -> list:
        """This rank's all-reduces of `numel` elements, buckets joined (_Buckets), in the order they ran."""
        if rank not in self._units:
            calls = [c for c in self.view.calls[rank] if c.op in self.ops and c.completed and c.ok and c.sends and c.receives
                     and c.inputs and _evidence(c)]
            units, run, size = [], [], 0
            for call in calls:
                n = call.sent_numel
                if n == self.numel:
                    units.append(call)
                    run, size = [], 0
                    continue
                if run and (call.gname, call.group, call.weight) != (run[0].gname, run[0].group, run[0].weight):
                    run, size = [], 0
                run.append(call)
                size += n
                while size > self.numel:   # the oldest pieces cannot start this bucket run
                    size -= run.pop(0).sent_numel
                if size == self.numel and run:
                    units.append(_Buckets(self, run))
                    run, size = [], 0
            self._units[rank] = units
        return self._units[rank]

    def unit_of(self, call):
        """The unit (call or _Buckets) of calls(call.rank) that starts with `call`, or None."""
        for unit in self.calls(call.rank):
            if (unit.members[0] if isinstance(unit, _Buckets) else unit) is call:
                return unit
        return None

    @staticmethod
    def _flat(arrays) -> np.ndarray:
        parts = [a for a in arrays if a is not None]
        return np.concatenate(parts) if parts else np.zeros(0)

    def delivered(self, call) -> np.ndarray | None:
        """Coefficients of what `call` delivered (None: not explained)."""
        key = (call.rank, call.seq)
        if key not in self._delivered:
            self._delivered[key] = None
            if call.weight is not None and self._flat(call.delivered_values()).size == self.numel:
                parts = [self.sent(p) for p in call.partners.values()]
                if parts and all(p is not None for p in parts):
                    self._delivered[key] = call.weight * np.sum(parts, axis=0)
        return self._delivered[key]

    def sent(self, call) -> np.ndarray | None:
        """Coefficients of what rank `call.rank` sent into `call` (None: not its own data)."""
        key = (call.rank, call.seq)
        if key not in self._sent:
            self._sent[key] = None
            sent = self._flat(call.sent_values())
            if sent.size == self.numel:
                earlier = [c for c in self.calls(call.rank) if c.completed_at < call.entered_at and self.delivered(c) is not None]
                columns = self.own[call.rank] + [self._flat(c.delivered_values()) for c in earlier]
                dtype = str(call.inputs[0].get("dtype")) if call.inputs else ""
                coef = fit(sent, columns, dtype)
                self.loose |= coef is not None and dtype in HALF
                if coef is not None:
                    q, n = call.rank, len(self.own[call.rank])
                    out = np.zeros(self.offset[-1])
                    out[self.offset[q]:self.offset[q] + n] = coef[:n]
                    for c, b in zip(earlier, coef[n:]):
                        out += b * self.delivered(c)
                    self._sent[key] = out
        return self._sent[key]

    def values(self, rank: int, target: np.ndarray, limit: int = 16) -> list[np.ndarray]:
        """Every value rank `rank` can make from what it was delivered (and its own vectors) whose weights are
        `target`, one per independent choice of deliveries (an all-reduce repeated gives two ways)."""
        usable = [c for c in self.calls(rank) if self.delivered(c) is not None]
        own = self.own[rank]
        own_columns = []
        for j in range(len(own)):
            e = np.zeros(self.offset[-1])
            e[self.offset[rank] + j] = 1.0
            own_columns.append(e)
        out: list[np.ndarray] = []
        for size in range(1, min(len(usable), 6) + 1):
            for subset in combinations(usable, size):
                tick()
                columns = [self.delivered(c) for c in subset] + own_columns
                basis = np.stack(columns, axis=1)
                if np.linalg.matrix_rank(basis) < len(columns):
                    continue
                coef, *_ = np.linalg.lstsq(basis, target, rcond=None)
                # the coefficients of what was delivered come from fits of rounded data: known to the rounding
                if np.max(np.abs(basis @ coef - target)) > (3e-2 if self.loose else 1e-4) * float(np.max(np.abs(target))):
                    continue
                value = sum(b * self._flat(c.delivered_values()) for c, b in zip(subset, coef[:size]))
                value = value + sum(b * v for v, b in zip(own, coef[size:]))
                if not any(np.allclose(value, v, rtol=1e-9, atol=1e-12) for v in out):
                    out.append(value)
                if len(out) >= limit:
                    return out
            if out:
                return out    # the fewest deliveries that make it
        return out


def foreign_sends(calls: list, own: list[np.ndarray], numel: int, ops=("all_reduce",)) -> list:
    """Of one rank's calls (a run's record of them, in the order they ran), the all-reduces of `numel`
    elements (buckets joined, as LinearRun joins them) whose send is not this rank's own data as fit()
    reads it: not a combination of `own` and of what its earlier such all-reduces delivered to it, or a
    send of zeros where its own data is not (a send of inf or nan is its own data overflowed, not another's).
    For an exercise's causes: what was measured, with no values."""
    calls = [c for c in calls if all(hasattr(c, name) for name in _RECORDED)]   # a run's records only
    if not calls:
        return []
    rank = calls[0].rank
    run = LinearRun(_one_rank(rank, calls), lambda q: own if q == rank else [], numel, ops)
    units, out = run.calls(rank), []
    for unit in units:
        sent = run._flat(unit.sent_values())
        if sent.size != numel:
            continue
        earlier = [run._flat(c.delivered_values()) for c in units if c.completed_at < unit.entered_at]
        earlier = [d for d in earlier if d.size == numel]
        dtype = str(unit.inputs[0].get("dtype")) if unit.inputs else ""
        if not np.all(np.isfinite(sent)):
            continue   # its own data overflowed in a cast (causes.sent_causes names it), not something else
        nothing = not np.any(sent) and any(np.any(v) for v in own)
        if nothing or fit(sent, list(own) + earlier, dtype) is None:
            out.append(unit.members[0] if isinstance(unit, _Buckets) else unit)
    return out


# what LinearRun reads of a recorded call (switch/record.py)
_RECORDED = ("rank", "seq", "op", "completed", "ok", "sends", "receives", "inputs", "sent_numel", "gname", "group",
             "weight", "entered_at", "completed_at", "sent_values", "delivered_values")


def _one_rank(rank: int, calls: list) -> SimpleNamespace:
    """A run context holding one rank's calls: what LinearRun.calls reads (ctx.view.calls[rank])."""
    return SimpleNamespace(world_size=rank + 1, view=SimpleNamespace(calls={rank: calls}))


class _Buckets:
    """Consecutive all-reduces of one rank on one group whose pieces make one vector of `numel` elements
    (a bucketed all-reduce): read as one call. Its partner on another rank is that rank's run of the
    partners of these calls, when that run is a unit of its own."""

    def __init__(self, run: LinearRun, members: list):
        self.run, self.members = run, list(members)
        first, last = self.members[0], self.members[-1]
        self.rank, self.seq, self.weight, self.inputs = first.rank, ("buckets", first.seq), first.weight, first.inputs
        self.entered_at, self.completed_at = first.entered_at, last.completed_at

    @property
    def partners(self) -> dict:
        out = {}
        for g, partner in self.members[0].partners.items():
            unit = self.run.unit_of(partner)
            wanted = [m.partners.get(g) for m in self.members]
            if not isinstance(unit, _Buckets) or len(unit.members) != len(wanted) \
                    or any(a is not b for a, b in zip(unit.members, wanted)):
                return {}
            out[g] = unit
        return out

    def sent_values(self) -> list:
        return [v for m in self.members for v in m.sent_values()]

    def delivered_values(self) -> list:
        return [v for m in self.members for v in m.delivered_values()]


class LinearProof:
    """A Linear quantity's proof on one perturbed run: the value must be one this rank can make from what its
    all-reduces delivered (LinearRun.values), with the declared weight on every rank's own vectors."""

    def __init__(self, view, linear):
        self.view, self.linear, self.ws = view, linear, view.ws
        own = [linear.vectors(q, self.ws) for q in range(self.ws)]
        self.own, self.numel = own, own[0][0].size if own and own[0] else 0
        self.run = LinearRun(SimpleNamespace(view=view, world_size=self.ws), lambda q: own[q], self.numel)

    def prove(self, rank: int, value: np.ndarray, dtype: str) -> Proof:
        atol, rtol = tolerance(dtype)
        target = np.full(sum(len(v) for v in self.own), float(self.linear.weight(self.ws)))
        made = [self.linear.value(self.ws, combination) for combination in self.run.values(rank, target)]
        calls = [m for c in self.run.calls(rank) for m in (c.members if isinstance(c, _Buckets) else [c])]
        for option in made:
            if option.size == value.size and np.all(np.abs(value - option) <= atol + rtol * np.abs(option)):
                return Proof(True, None, calls)
        for q in [rank] + [q for q in range(self.ws) if q != rank]:
            foreign = foreign_sends(self.view.calls[q], self.own[q], self.numel)
            if foreign:
                call = foreign[0]
                sent = np.concatenate([v for v in call.sent_values() if v is not None] or [np.zeros(0)])
                return Proof(False, Finding("contribution", {"rank": q, "op": call.op, "line": call.line, "n": call.seq + 1,
                                                             "sent": sent[:4096].tolist(),
                                                             "own": self.own[q][0][:4096].tolist()}), calls)
        option = made[0] if made else None
        bad = np.flatnonzero(np.abs(value - option) > atol + rtol * np.abs(option)) if option is not None \
            and option.size == value.size else np.zeros(1, dtype=np.int64)
        element = int(bad[0]) if bad.size else 0
        return Proof(False, Finding("not_delivered", {"rank": rank, "element": element,
                                                      "value": float(value[element]) if value.size else 0.0,
                                                      "delivered": bool(calls)}), calls)
