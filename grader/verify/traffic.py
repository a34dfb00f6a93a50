"""Policy for "traffic" checks: the point-to-point exchanges of a run form the pattern the exercise declares.

An exercise declares the pattern as data, in `Check(kind="traffic", quantity=..., params=...)`:

    {"pattern": "ring"}      the shape: every rank sends to exactly one peer and receives from exactly one,
                             its neighbours (r + d) mod N and (r - d) mod N, with the same d (+1 or -1) on
                             every rank: either direction, but one ring
    {"sends": f, "sends_formula": "2(N-1)", "volume": "all_reduce"}
                             the volume: every rank makes f(N) sends and sends at most comm.OPS[volume].ring(N)
                             x S bytes, plus one element per send (the rounding of uneven chunks); S is the
                             bytes of the check's quantity (its expected shape, in the dtype the rank used)

Traffic counts for a correct answer only: a traffic check passes when the check's quantity passes its value
check at the same world size (right on every rank, and derived from what the communication delivered), so a
forged exchange next to a locally computed answer earns nothing. Peers are global ranks (a call's `peer` is
a rank of its group: observe.RunView.global_rank). Causes name the measured figures; hidden checks show
their value-free variants (feedback/render.HIDDEN_VARIANTS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..comm import OPS
from ..exercise.spec import Check
from ..model import CheckResult, Note, Outcome
from ..processes.protocol import element_size
from ..processes.runner import RunOutcome
from .diagnose import global_peer


@dataclass
class RankTraffic:
    """One rank's point-to-point traffic in a run."""
    rank: int
    sends: int = 0
    sent: int = 0                     # bytes
    sizes: list = field(default_factory=list)   # bytes of each send
    recvs: int = 0
    received: int = 0                 # bytes delivered
    to: list = field(default_factory=list)      # global ranks sent to, sorted
    frm: list = field(default_factory=list)     # global ranks received from, sorted


def measure(run: RunOutcome) -> list[RankTraffic]:
    """Per rank: sends and bytes sent (what it handed to send, isend, P2POp), completed receives and bytes
    delivered, and the peers of both."""
    out = []
    for rec in run.ranks:
        t = RankTraffic(rec.rank)
        sends = [c for c in rec.calls if c.op == "send"]
        recvs = [c for c in rec.calls if c.op == "recv" and c.completed and c.ok]
        t.sends, t.sizes = len(sends), [c.sent_bytes for c in sends]
        t.sent = sum(t.sizes)
        t.recvs, t.received = len(recvs), sum(c.delivered_bytes for c in recvs)
        t.to = sorted({p for c in sends if (p := global_peer(c, c.peer)) is not None})
        t.frm = sorted({p for c in recvs if (p := global_peer(c, c.peer if c.peer is not None else c.source)) is not None})
        out.append(t)
    return out


def size_and_element(run: RunOutcome, quantity) -> tuple[int, int]:
    """(S, bytes per element): the quantity's bytes in the dtype the ranks used (the value they reported,
    else what they sent; float32 when neither says)."""
    numel = math.prod(quantity.expected_shape(run.request.world_size))
    dtype = None
    for rec in run.ranks:
        value = (rec.result or {}).get("values", {}) if isinstance((rec.result or {}).get("values"), dict) else {}
        desc = value.get(quantity.name)
        if isinstance(desc, dict) and desc.get("kind") == "tensor":
            dtype = desc.get("dtype")
            break
    if dtype is None:
        dtype = next((d.get("dtype") for rec in run.ranks for c in rec.calls if c.op == "send" for d in c.inputs or []), None)
    item = element_size(dtype)
    return numel * item, item


def bound(params: dict, n: int, size: int, item: int) -> tuple[int, int, str]:
    """(sends per rank, most bytes per rank, the volume's formula) that `params` declare at n ranks."""
    sends = int(params["sends"](n)) if callable(params.get("sends")) else int(params.get("sends") or 0)
    op = OPS.get(params.get("volume") or "")
    if op is None or op.ring is None:
        return sends, -1, "-"
    return sends, int(op.ring(n) * size) + sends * item, op.formula


def _times(nbytes: int, size: int) -> str:
    return f"{nbytes / size:.2f}".rstrip("0").rstrip(".") if size else "?"


def shape_causes(traffic: list[RankTraffic], n: int, size: int) -> list[Note]:
    """Why the exchanges are not one ring of neighbours (empty: they are)."""
    for t in traffic:
        if not t.sends and not t.recvs:
            return [Note("cause.traffic_none", {"rank": t.rank})]
    if n >= 3:
        hub = max(traffic, key=lambda t: (len(t.frm), t.received))
        if len(hub.frm) >= 2 and len(hub.frm) == n - 1:
            return [Note("cause.traffic_gather", {"rank": hub.rank, "k": _times(hub.received, size),
                                                  "m": len(hub.frm)})]
    for t in traffic:
        if len(t.to) != 1 or len(t.frm) != 1:
            return [Note("cause.traffic_peers", {"rank": t.rank, "to": t.to or ["-"], "frm": t.frm or ["-"]})]
    offsets = [(t.to[0] - t.rank) % n for t in traffic]
    for t, d in zip(traffic, offsets):
        if d not in (1, n - 1):
            return [Note("cause.traffic_not_neighbour", {"rank": t.rank, "to": t.to[0]})]
    if len(set(offsets)) > 1:
        a = traffic[offsets.index(1)]
        b = traffic[offsets.index(n - 1)]
        return [Note("cause.traffic_direction", {"rank": a.rank, "to": a.to[0], "other": b.rank, "other_to": b.to[0]})]
    for t, d in zip(traffic, offsets):
        if (t.rank - t.frm[0]) % n != d:
            return [Note("cause.traffic_same_side", {"rank": t.rank, "to": t.to[0], "frm": t.frm[0]})]
    return []


def volume_causes(traffic: list[RankTraffic], params: dict, n: int, size: int, item: int) -> list[Note]:
    """Why the volume is not the declared one (empty: it is): the rank furthest off, in figures."""
    sends, most, formula = bound(params, n, size, item)
    notes = []
    wrong_count = [t for t in traffic if t.sends != sends]
    if wrong_count:
        t = max(wrong_count, key=lambda t: abs(t.sends - sends))
        notes.append(Note("cause.traffic_sends", {"rank": t.rank, "count": t.sends, "formula": params.get("sends_formula", "?"),
                                                  "expected": sends}))
    over = [t for t in traffic if most >= 0 and t.sent > most]
    if over:
        t = max(over, key=lambda t: t.sent)
        whole = t.sizes and min(t.sizes) >= size
        key = "cause.traffic_whole" if whole else "cause.traffic_bytes"
        notes.append(Note(key, {"rank": t.rank, "sent": t.sent, "k": _times(t.sent, size), "count": t.sends,
                                "formula": formula, "bound": most, "bound_k": _times(most, size), "size": size}))
    return notes


def _run_of(runs):
    """The run whose traffic is measured: the clean one when it was made, else the first perturbed one
    (the same program: perturbation changes values, never sizes or peers)."""
    if runs.clean is not None:
        return runs.clean
    return runs.perturbed[0] if runs.perturbed else None


def evaluate_traffic(judge, check: Check, runs) -> CheckResult:
    quantity = judge.exercise.quantity(check.quantity)
    run = _run_of(runs)
    if run is None or run.stop == "grader_error":
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
    values = judge.evaluate_value(Check(check.id, "value", 0, check.title, hidden=check.hidden, world_size=check.world_size,
                                        quantity=check.quantity), runs)
    if not values.passed:
        return CheckResult(check, Outcome.WRONG, notes=[Note("cause.traffic_needs_value", {"quantity": quantity.name})])
    n = run.request.world_size
    traffic = measure(run)
    size, item = size_and_element(run, quantity)
    params = check.params or {}
    notes: list[Note] = []
    if params.get("pattern") == "ring":
        notes += shape_causes(traffic, n, size)
    if "sends" in params or "volume" in params:
        notes += volume_causes(traffic, params, n, size, item)
    details = [Note("detail.traffic", {"rank": t.rank, "sends": t.sends, "sent": t.sent, "recvs": t.recvs,
                                       "received": t.received, "to": t.to or ["-"], "frm": t.frm or ["-"]})
               for t in traffic]
    if notes:
        return CheckResult(check, Outcome.WRONG, notes=notes, details=details)
    if params.get("pattern") == "ring":
        passed = Note("pass.ring", {"d": "+1" if (traffic[0].to[0] - traffic[0].rank) % n == 1 else "-1"})
    else:
        sends, most, formula = bound(params, n, size, item)
        passed = Note("pass.traffic", {"count": sends, "formula": params.get("sends_formula", "?"), "sent": max(t.sent for t in traffic),
                                       "bound": most, "vformula": formula, "size": size})
    return CheckResult(check, Outcome.PASS, check.points, [passed])


def teaching(run: RunOutcome, exercise) -> list[Note]:
    """For the report: the declared bound beside the measured per-rank traffic (teach.py prints the latter)."""
    checks = [c for c in exercise.checks if c.kind == "traffic" and c.world_size == run.request.world_size
              and ("sends" in (c.params or {}) or "volume" in (c.params or {}))]
    if not checks or not any(rec.calls for rec in run.ranks):
        return []
    check = checks[0]
    n = run.request.world_size
    size, item = size_and_element(run, exercise.quantity(check.quantity))
    sends, most, formula = bound(check.params, n, size, item)
    return [Note("teach.traffic_bound", {"ws": n, "size": size, "count": sends, "sformula": check.params.get("sends_formula", "?"),
                                         "bound": most, "formula": formula})]
