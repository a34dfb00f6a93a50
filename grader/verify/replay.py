"""Provenance by replay: each rank's reference step, run again against what the switch measured.

An exercise may declare its quantities as what a reference step computes (exercise/reference.py). In a
perturbed run the engine replays that step on every rank at once, with a communicator that answers each
operation of the step from the run's record (switch/record.py) instead of computing it:
  - what the rank sent must be what its step sends at that point, at a scale the step allows (x, x / N,
    or any multiple where it says so), carried by one call or by several (buckets, chunks, coalesced
    tensors, any order): each element the rank sent is located in the step's x (`_locate`); elements that
    are not (a send of something else, or garbage where only padding goes) are marked;
  - what the step receives is what the switch delivered to the rank, read element by element through the
    switch's own record of where each delivered element came from (`Call.pieces`): an element counts for
    the step's result only if it is made of exactly the elements the operation's definition names (every
    member's element at that position for a sum; one member's for a gather), the scale undone (a sum of
    x / N is a mean; ReduceOp.AVG divides already). A call beside the step's (a warm-up, a logged loss) is
    passed over.
The values the replay ends with carry the deltas the switch added: a rank's value equal to them came
from the communication, each rank having contributed its own data. Which values rest on a marked element is
found by a second replay in which every result element made of one is unknown (NaN): NaN flows through the
step's arithmetic into exactly the values that depend on it; the others stand (a shard's padding that only
the dropped tail of the parameters holds, say).
Each replay is made in up to four ways (`VARIANTS`), and each rank is judged by the first in which its sends
are its step's and its value is the step's: its own part of a gather taken from what was delivered or from
its own copy; an all-reduce standing in for a reduce-scatter (its chunk read out) or not.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ..comm import COLLECTIVES
from ..exercise.reference import Comm, Op, StepError, TIMEOUT_S, run_ranks
from .observe import RunView
from .proof import Finding, Proof, tolerance

RECEIVERS = {"all_reduce": ("all_reduce",), "reduce_scatter": ("reduce_scatter",), "all_gather": ("all_gather",),
             "broadcast": ("broadcast",), "send": ("send",), "recv": ("recv",)}
STAND_INS = {"reduce_scatter": ("all_reduce",)}     # operations that deliver a superset of the step's result
VARIANTS = (("delivered", False), ("own", False), ("delivered", True), ("own", True))
MAX_CANDIDATES = 16


@dataclass
class _Match:
    """How one rank's calls carried its x in one operation of the step."""
    calls: list
    x: np.ndarray
    maps: dict = field(default_factory=dict)    # (call.seq, input index) -> positions in x
    scale: float = 1.0
    bad: np.ndarray | None = None               # positions of x the rank did not send as its step's


@dataclass
class RankReplay:
    values: dict | None = None                  # quantity -> array (None: the step could not finish)
    findings: list = field(default_factory=list)
    calls: list = field(default_factory=list)


class _Index:
    def __init__(self, x: np.ndarray):
        self.x = x
        self.order = np.argsort(x, kind="stable")
        self.sorted = x[self.order]


def _close(a, b, atol: float, rtol: float):
    return np.abs(a - b) <= atol + rtol * np.abs(b)


def _run(target: np.ndarray, i: int, x: np.ndarray, p: int, free: np.ndarray, atol: float, rtol: float) -> int:
    """How far target[i:] equals x[p:] on free positions, compared in growing windows."""
    m = min(target.size - i, x.size - p)
    done, window = 0, 64
    while done < m:
        end = min(m, done + window)
        ok = _close(target[i + done:i + end], x[p + done:p + end], atol, rtol) & free[p + done:p + end]
        bad = np.flatnonzero(~ok)
        if bad.size:
            return done + int(bad[0])
        done, window = end, window * 4
    return m


def _locate(target: np.ndarray, index: _Index, free: np.ndarray, atol: float, rtol: float) -> np.ndarray | None:
    """Positions in x of each element of target (runs of consecutive positions, each position once), or None."""
    x, n = index.x, target.size
    pos = np.empty(n, dtype=np.int64)
    free = free.copy()
    i, hint = 0, int(np.argmax(free)) if free.any() else 0
    while i < n:
        v = target[i]
        if not np.isfinite(v):
            return None
        tol = atol + rtol * abs(v)
        lo = np.searchsorted(index.sorted, v - tol, "left")
        hi = np.searchsorted(index.sorted, v + tol, "right")
        candidates = [hint] if hint < x.size and free[hint] else []
        candidates += [int(p) for p in index.order[lo:hi][:4 * MAX_CANDIDATES] if free[p] and p != hint][:MAX_CANDIDATES]
        best, where = 0, -1
        for p in candidates:
            length = _run(target, i, x, p, free, atol, rtol)
            if length > best:
                best, where = length, p
            if best == n - i:
                break
        if best == 0:
            return None
        pos[i:i + best] = np.arange(where, where + best)
        free[where:where + best] = False
        i, hint = i + best, where + best
    return pos


def _flat(values) -> np.ndarray:
    parts = [v for v in values if v is not None]
    return np.concatenate(parts) if parts else np.zeros(0)


def _dtype(call) -> str:
    return str(call.inputs[0].get("dtype")) if call.inputs else ""


def _scales(op: Op, sent: np.ndarray, x: np.ndarray, start: int) -> list[float]:
    """The scales to try for what a call sent: those the step allows, or for "any" the multiple that fits
    where the call's data would start (buckets come in order)."""
    n = float(len(op.group))
    if "any" not in op.scales:
        return [{"1": 1.0, "1/N": 1.0 / n, "N": n}[s] for s in op.scales]
    ref = x[start:start + sent.size]
    t = sent[:ref.size]
    denominator = float(ref @ ref)
    return [float(t @ ref) / denominator] if denominator > 0 and t.size else []


class _Hub:
    """Every rank's step, operation by operation: each member posts how its calls carried its x, then each
    reads its result once every member has posted."""

    def __init__(self, view: RunView, part: str, stand_in: bool, taint: bool):
        self.view, self.part, self.stand_in, self.taint = view, part, stand_in, taint
        self.cond = threading.Condition()
        self.posted: dict = {}
        self.counts: dict = {}
        self.gone: set = set()
        self.cursor = [0] * view.ws
        self.out = [RankReplay() for _ in range(view.ws)]

    def key(self, rank: int, op: Op) -> tuple:
        channel = ("p2p", op.group) if op.kind in ("send", "recv") else (
            "replicated" if op.kind == "replicated" else "collective", op.group)
        n = self.counts.get((rank, channel), 0)
        self.counts[(rank, channel)] = n + 1
        return channel + (n,)

    def post(self, key, rank, match) -> None:
        with self.cond:
            self.posted.setdefault(key, {})[rank] = match
            self.cond.notify_all()

    def wait(self, key, members) -> dict:
        with self.cond:
            entry = self.posted.setdefault(key, {})
            if not self.cond.wait_for(lambda: all(q in entry or q in self.gone for q in members), TIMEOUT_S):
                raise StepError("the replay waits forever")
            return dict(entry)

    def leave(self, rank: int) -> None:
        with self.cond:
            self.gone.add(rank)
            self.cond.notify_all()


class _ReplayComm(Comm):
    def __init__(self, rank: int, world_size: int, hub: _Hub):
        super().__init__(rank, world_size)
        self.hub, self.n, self.received = hub, 0, False

    def _exchange(self, op: Op):
        hub, rank = self.hub, self.rank
        self.n += 1
        key = hub.key(rank, op)
        if op.kind == "replicated":
            return self._replicated(key, op)
        match = self._match(op) if op.x is not None else None
        hub.post(key, rank, match)
        out = hub.out[rank]
        if match is not None:
            out.calls += [c for c in match.calls if c not in out.calls]
            if match.bad is not None and match.bad.size and np.isfinite(op.x).any():   # (an x made of unknowns
                out.findings.append(self._contribution(op, match))                    # has nothing to compare)
        if op.kind == "send":
            return None
        matches = hub.wait(key, (op.root,) if op.kind == "recv" else op.group)
        result = self._result(op, matches, match)
        self.received = True
        return result

    def _replicated(self, key, op: Op) -> np.ndarray:
        """x, or where every member all-reduced its share of x (x / N summed, or x averaged), what that
        all-reduce delivered: a rank's later values are made from it, with its deltas."""
        hub, rank = self.hub, self.rank
        reduce = Op("all_reduce", op.group, op.x, "mean", scales=op.scales)
        match = None if np.isnan(op.x).any() else self._strict(reduce, hub.view.calls[rank])
        hub.post(key, rank, match)
        matches = hub.wait(key, op.group)
        if match is None or any(matches.get(q) is None for q in op.group):
            return op.x.copy()
        hub.out[rank].calls += [c for c in match.calls if c not in hub.out[rank].calls]
        return self._result(reduce, matches, match)

    # -- the sending side
    def _compatible(self, op: Op, call, sending: bool) -> bool:
        kinds = STAND_INS.get(op.kind, ()) if self.hub.stand_in and op.kind in STAND_INS else RECEIVERS[op.kind]
        if not (call.completed and call.ok) or call.op not in kinds:
            return False
        if op.kind in ("send", "recv"):
            peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else call.source
            return peer == (op.root if op.kind == "send" else op.group[0])
        return tuple(call.group) == op.group and (call.sends if sending else call.receives)

    def _match(self, op: Op) -> _Match:
        """The calls from this rank's cursor that carry x, each element once, at one scale the step allows;
        failing that, the next calls of the operation read in order, the elements that differ marked."""
        x, hub, rank = op.x, self.hub, self.rank
        calls = hub.view.calls[rank]
        strict = None if np.isnan(x).any() else self._strict(op, calls)
        if strict is not None:
            return strict
        found, size, i = [], 0, hub.cursor[rank]
        while i < len(calls) and size < x.size:
            call = calls[i]
            i += 1
            if self._compatible(op, call, sending=True):
                found.append(call)
                size += call.sent_numel
            elif not found and self._instead(op, call):
                break
        if not found:   # the rank never made this operation (the next call of its kind is a later one's)
            return _Match([], x, bad=np.arange(x.size))
        hub.cursor[rank] = i
        sent = _flat(v for c in found for v in c.sent_values())
        n = min(sent.size, x.size)
        atol, rtol = tolerance(_dtype(found[0]))
        best = None
        for c in _scales(op, sent, x, 0) or [1.0]:
            good = np.zeros(x.size, dtype=bool)
            if c:
                good[:n] = _close(sent[:n] / c, x[:n], atol / abs(c), rtol) & np.isfinite(x[:n])
            if best is None or good.sum() > best[1].sum():
                best = (c or 1.0, good)
        maps, offset = {}, 0
        for call in found:
            for j, d in enumerate(call.inputs):
                numel = int(d.get("numel") or 0)
                maps[(call.seq, j)] = np.clip(np.arange(offset, offset + numel), 0, max(0, x.size - 1))
                offset += numel
        return _Match(found, x, maps, best[0], np.flatnonzero(~best[1]))

    def _strict(self, op: Op, calls: list) -> _Match | None:
        x, hub, rank = op.x, self.hub, self.rank
        index, free = _Index(x), np.ones(x.size, dtype=bool)
        found, maps, scale = [], {}, None
        i = hub.cursor[rank]
        while free.any() and i < len(calls):
            call = calls[i]
            i += 1
            if not self._compatible(op, call, sending=True):
                continue
            sent = call.sent_values()
            atol, rtol = tolerance(_dtype(call))
            start = int(np.argmax(free))
            for c in [scale] if scale is not None else _scales(op, _flat(sent), x, start):
                if not c:
                    continue
                trial, placed = free.copy(), {}
                for j, t in enumerate(sent):
                    if t is None or t.size == 0:
                        continue
                    pos = _locate(t / c, index, trial, atol / abs(c), rtol)
                    if pos is None:
                        placed = None
                        break
                    trial[pos] = False
                    placed[(call.seq, j)] = pos
                if placed:
                    free, scale = trial, c
                    maps.update(placed)
                    found.append(call)
                    break
        if free.any() or not found:
            return None
        hub.cursor[rank] = i
        return _Match(found, x, maps, float(scale), np.zeros(0, dtype=np.int64))

    def _instead(self, op: Op, call) -> bool:
        """A completed collective of another kind that sent as many elements as the step's x: the rank made
        this operation another way (an all-gather summed locally for an all-reduce), so the next call of the
        step's kind belongs to a later operation and is not read as a wrong contribution to this one."""
        return (op.kind not in ("send", "recv") and call.op in COLLECTIVES and call.op not in RECEIVERS[op.kind]
                and call.completed and call.ok and call.sends and call.sent_numel == op.x.size)

    def _contribution(self, op: Op, match: _Match) -> Finding:
        call = match.calls[0] if match.calls else None
        if call is None:
            return Finding("replay_missing", {"rank": self.rank, "op": op.kind, "n": self.n})
        return Finding("contribution", {"rank": self.rank, "op": call.op, "line": call.line, "n": call.seq + 1,
                                        "sent": _flat(call.sent_values())[:4096].tolist(),
                                        "own": match.x[:4096].tolist(), "derived": self.received})

    # -- the receiving side
    def _result(self, op: Op, matches: dict, mine: _Match | None) -> np.ndarray:
        hub, rank, group = self.hub, self.rank, op.group
        xs = {q: m.x for q, m in matches.items() if m is not None}
        if op.kind in ("recv", "broadcast"):
            size = xs[op.root].size if op.root in xs else 0
        elif op.kind == "all_gather":
            size = sum(xs[q].size for q in group if q in xs)
        elif op.kind == "reduce_scatter":
            size = op.x.size // len(group)
        else:
            size = op.x.size
        result, covered = np.full(size, np.nan), np.zeros(size, dtype=bool)
        receiving = list(mine.calls) if mine is not None else []
        if op.kind in ("recv", "broadcast") and rank != op.root:
            receiving = self._receiving(op, matches)
            hub.out[rank].calls += [c for c in receiving if c not in hub.out[rank].calls]
        by_call = {id(c): (q, m) for q, m in matches.items() if m is not None for c in m.calls}
        for call in receiving:
            self._read(op, call, by_call, result, covered)
        if not covered.all() and not any(m is not None and m.bad is not None and m.bad.size == m.x.size
                                         for m in matches.values()):
            hub.out[rank].findings.append(Finding("replay_missing", {"rank": rank, "op": op.kind, "n": self.n}))
        return result

    def _receiving(self, op: Op, matches: dict) -> list:
        """A receiver's calls, from its cursor, whose data came from the sender's calls of this operation."""
        hub, rank = self.hub, self.rank
        sender = matches.get(op.root)
        if sender is None:
            return []
        theirs = {id(c) for c in sender.calls}
        calls, out = hub.view.calls[rank], []
        for i in range(hub.cursor[rank], len(calls)):
            call = calls[i]
            if self._compatible(op, call, sending=False) and any(id(p) in theirs for p in call.partners.values()):
                out.append(call)
                hub.cursor[rank] = i + 1
            elif out:
                break
        return out

    def _read(self, op: Op, call, by_call: dict, result: np.ndarray, covered: np.ndarray) -> None:
        """Fill the step's result from what `call` delivered to this rank, piece by piece."""
        delivered = call.delivered_values()
        for k, pieces in enumerate(call.pieces):
            values = delivered[k] if k < len(delivered) else None
            if values is None or call.weight is None:
                continue
            for piece in pieces:
                found = []
                for g, j, first in piece.sources:
                    sender = call.partners.get(g)
                    owner = by_call.get(id(sender)) if sender is not None else None
                    positions = owner[1].maps.get((sender.seq, j)) if owner is not None else None
                    if positions is None or first + piece.length > positions.size:
                        break
                    found.append((owner[0], owner[1], positions[first:first + piece.length]))
                else:
                    if found:
                        self._place(op, call, values[piece.start:piece.start + piece.length], found, result, covered)

    def _place(self, op: Op, call, values: np.ndarray, found: list, result: np.ndarray, covered: np.ndarray) -> None:
        group, rank = op.group, self.rank
        senders = sorted(q for q, _, _ in found)
        pos = found[0][2]
        if any(not np.array_equal(p, pos) for _, _, p in found) or len({m.scale for _, m, _ in found}) != 1:
            return
        scale = found[0][1].scale
        if op.kind in ("all_reduce", "reduce_scatter"):
            if senders != sorted(group):
                return
            value = values / (call.weight * scale) / (len(group) if op.op == "mean" else 1)
            u = pos if op.kind == "all_reduce" else pos - group.index(rank) * result.size
        else:
            if len(senders) != 1:
                return
            q, m = found[0][0], found[0][1]
            value = values / (call.weight * scale)
            if self.hub.part == "own" and q == rank:
                value = m.x[pos]
            u = group.index(q) * m.x.size + pos if op.kind == "all_gather" else pos
        if self.hub.taint:   # an element made of one a rank did not send as its step's is unknown
            for _, m, p in found:
                if m.bad is not None and m.bad.size:
                    value = np.where(np.isin(p, m.bad), np.nan, value)
        inside = (u >= 0) & (u < result.size)
        u, value = u[inside], value[inside]
        fresh = ~covered[u]
        result[u[fresh]] = value[fresh]
        covered[u[fresh]] = True


def replay(view: RunView, step, part: str = "delivered", stand_in: bool = False, taint: bool = False) -> list[RankReplay]:
    """Every rank's step replayed against the run: per rank, its values, what went wrong, the calls used."""
    hub = _Hub(view, part, stand_in, taint)

    def body(rank: int):
        try:
            out = step(_ReplayComm(rank, view.ws, hub), rank, view.ws)
        finally:
            hub.leave(rank)
        hub.out[rank].values = {name: np.array(v, dtype=np.float64).reshape(-1) for name, v in out.items()}

    try:
        with np.errstate(all="ignore"):
            run_ranks(view.ws, body)
    except Exception:  # noqa: BLE001  (a step that cannot run on this record, sizes the calls do not have: unproven)
        pass
    return hub.out


def _mine(replayed: RankReplay, rank: int) -> list:
    return [f for f in replayed.findings if f.params.get("rank") == rank]


class Replays:
    """The replays of one run, made as they are needed and kept for every quantity and rank."""

    def __init__(self, view: RunView, step):
        self.view, self.step = view, step
        self._made: dict = {}

    def _get(self, part: str, stand_in: bool, taint: bool) -> list[RankReplay]:
        key = (part, stand_in, taint)
        if key not in self._made:
            self._made[key] = replay(self.view, self.step, part, stand_in, taint)
        return self._made[key]

    def prove(self, rank: int, name: str, value: np.ndarray, dtype: str) -> Proof:
        atol, rtol = tolerance(dtype)
        first = None
        for part, stand_in in VARIANTS:
            replayed = self._get(part, stand_in, False)
            mine = replayed[rank]
            if first is None:
                first = (mine, replayed)
            # an operation of the step the rank never made leaves unknown (NaN) what depends on it; a value the
            # step made before it, or apart from it, still stands (the output of a forward pass whose backward
            # all-reduce is missing)
            made = (mine.values or {}).get(name)
            if any(f.key == "replay_missing" for f in _mine(mine, rank)) and (made is None or np.isnan(made).any()):
                continue
            other = self._get("own" if part == "delivered" else "delivered", stand_in, False)[rank]
            candidates = [r.values[name] for r in (mine, other) if r.values and name in r.values]
            if not any(c.size == value.size and np.all(_close(value, c, atol, rtol)) for c in candidates):
                continue
            if any(r.findings for r in replayed):     # which values rest on an element sent otherwise
                tainted = self._get(part, stand_in, True)[rank].values or {}
                if name not in tainted or np.isnan(tainted[name]).any():
                    continue
            return Proof(True, None, mine.calls)
        mine, replayed = first
        findings = _mine(mine, rank) + [f for r in replayed for f in r.findings if f.params.get("rank") != rank]
        if findings:
            return Proof(False, findings[0], mine.calls)
        expected = (mine.values or {}).get(name)
        if expected is None or expected.size != value.size:
            return Proof(False, Finding("replay_missing", {"rank": rank, "op": "-", "n": 0}), mine.calls)
        bad = np.flatnonzero(~_close(value, expected, atol, rtol))
        element = int(bad[0]) if bad.size else 0
        return Proof(False, Finding("not_delivered", {"rank": rank, "element": element, "value": float(value[element]),
                                                      "delivered": bool(mine.calls)}), mine.calls)
