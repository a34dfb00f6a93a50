"""Policy for "traffic" checks: the point-to-point exchanges of a run form the pattern the exercise declares.

Every figure here is the switch's (what passed through it), never what a rank says. An exercise declares the
pattern as data, in `Check(kind="traffic", quantity=..., params=...)`:

    {"pattern": "ring"}      the shape: every rank sends to exactly one peer and receives from exactly one,
                             its neighbours (r + d) mod N and (r - d) mod N, with the same d (+1 or -1) on
                             every rank: either direction, but one ring
    {"sends": f, "sends_formula": "2(N-1)", "volume": "all_reduce"}
                             the volume: every rank makes f(N) sends, each of at most one chunk, and sends at
                             most comm.OPS[volume].ring(N) x S elements in all, plus one element per send (the
                             rounding of uneven chunks); S is the element count of the check's quantity. Every
                             send carries the dtype of the tensor the rank returned: counted in elements,
                             casting to a narrower type saves nothing, and is named.

One chunk is the largest chunk of S cut into N contiguous chunks the ways students cut it (largest_chunk):
tensor_split / np.array_split and i*S//N offsets (at most ceil(S/N)), torch.chunk and ceil-sized offsets (ceil(S/N),
the last shorter), S // N each with the last (or the first) taking the remainder: S - (N-1) x floor(S/N), which is
the largest of them (floor(S/N) + S mod N; 260 for S = 1031 at N = 4, where ceil(S/N) is 258). For every one of
these layouts, a ring's 2(N-1) sends (each phase sends every chunk but one: 2S less two neighbouring chunks) come
to less than 2(N-1)/N x S + max(2, N-2) elements, within the "one element per send" of the total. The per-send
cap is what stops a whole vector (or most of it) travelling in one send beside padding sends that keep the count
and the total in bounds; none of the layouts above needs more than the chunk that takes the remainder.

Traffic counts for a correct answer only: a traffic check passes when the check's quantity passes its value
check at the same world size (right on every rank, and derived from what the communication delivered), so a
forged exchange next to a locally computed answer earns nothing. Every switch run of the world size is
judged (Judge.measured_runs): what a rank did too much counts in any run, what it did too little only where
the run shows all it did (the run ended with no rank failing, or it proved the rank's value), so code that
behaves one way where values are checked and another where they are proven fails. Peers are global ranks (a call's `peer` is
a rank of its group). Causes name the measured figures; hidden checks show their value-free variants
(feedback/render.HIDDEN_VARIANTS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...comm import OPS
from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from ...records import RunOutcome
from ...wire import element_size
from ..diagnose import global_peer


@dataclass
class RankTraffic:
    """One rank's point-to-point traffic in a run, as the switch measured it."""
    rank: int
    sends: int = 0
    sent: int = 0                     # elements
    sent_bytes: int = 0
    sizes: list = field(default_factory=list)   # elements of each send
    dtypes: list = field(default_factory=list)  # the dtype each send carried
    recvs: int = 0
    received: int = 0                 # elements delivered
    received_bytes: int = 0
    to: list = field(default_factory=list)      # global ranks sent to, sorted
    frm: list = field(default_factory=list)     # global ranks received from, sorted


def measure(run: RunOutcome) -> list[RankTraffic]:
    """Per rank: sends and elements sent (what it handed to send, isend, P2POp), completed receives and
    elements delivered, and the peers of both."""
    out = []
    for rec in run.ranks:
        t = RankTraffic(rec.rank)
        sends = [c for c in rec.calls if c.op == "send"]
        recvs = [c for c in rec.calls if c.op == "recv" and c.completed and c.ok]
        t.sends, t.sizes = len(sends), [c.sent_numel for c in sends]
        t.dtypes = [d for c in sends for d in c.sent_dtypes]
        t.sent, t.sent_bytes = sum(t.sizes), sum(c.sent_bytes for c in sends)
        t.recvs = len(recvs)
        t.received = sum(int(d.get("numel") or 0) for c in recvs for d in c.delivered)
        t.received_bytes = sum(c.delivered_bytes for c in recvs)
        t.to = sorted({p for c in sends if (p := global_peer(c, c.peer)) is not None})
        t.frm = sorted({p for c in recvs if (p := global_peer(c, c.peer if c.peer is not None else c.source)) is not None})
        out.append(t)
    return out


def size_and_dtype(run: RunOutcome, quantity) -> tuple[int, str | None]:
    """(S, the dtype the ranks returned): the quantity's element count, and the dtype of the value the
    first rank that reported one returned (None when none did)."""
    numel = math.prod(quantity.expected_shape(run.request.world_size))
    for rec in run.ranks:
        values = rec.result.values if rec.result is not None else None
        desc = values.get(quantity.name) if isinstance(values, dict) else None
        if isinstance(desc, dict) and desc.get("kind") == "tensor":
            return numel, desc.get("dtype")
    return numel, None


def largest_chunk(size: int, n: int) -> int:
    """The most elements one chunk holds when `size` elements are cut into n contiguous chunks the ways a
    ring's chunks are cut: S // N each with one chunk (the last, or the first) taking the remainder,
    S - (N-1) x floor(S/N); tensor_split, np.array_split, torch.chunk, ceil-sized and i*S//N offsets all stay
    within ceil(S/N), which is no larger."""
    return size - (n - 1) * (size // n) if n > 0 else size


def bound(params: dict, n: int, size: int) -> tuple[int, int, int, str]:
    """(sends per rank, most elements per rank, most elements per send, the volume's formula) that `params`
    declare at n ranks for a quantity of `size` elements: the total is the ring's volume plus one element per
    send (the rounding of uneven chunks), each send at most largest_chunk(size, n)."""
    sends = int(params["sends"](n)) if callable(params.get("sends")) else int(params.get("sends") or 0)
    op = OPS.get(params.get("volume") or "")
    if op is None or op.ring is None:
        return sends, -1, -1, "-"
    return sends, int(op.ring(n) * size) + sends, largest_chunk(size, n), op.formula


def _times(count: int, size: int) -> str:
    return f"{count / size:.2f}".rstrip("0").rstrip(".") if size else "?"


def shape_causes(traffic: list[RankTraffic], n: int, size: int, complete=None) -> list[Note]:
    """Why the exchanges are not one ring of neighbours (empty: they are). What a rank did too much (a
    peer too many, a peer not a neighbour, the other way round) is judged on every rank; what it did too
    little (no exchange, no peer) only on the ranks of `complete` (None: all), those whose run shows all
    they did: a rank stopped half-way has not yet sent what it would have."""
    complete = set(range(n)) if complete is None else complete
    for t in traffic:
        if t.rank in complete and not t.sends and not t.recvs:
            return [Note("cause.traffic_none", {"rank": t.rank})]
    if n >= 3:
        hub = max(traffic, key=lambda t: (len(t.frm), t.received))
        # one rank that receives from every other, the others from one at most (at 3 ranks, a rank of a
        # ring that turns both ways also hears from both others: that is no gather)
        if len(hub.frm) >= 2 and len(hub.frm) == n - 1 and all(len(t.frm) <= 1 for t in traffic if t is not hub):
            return [Note("cause.traffic_gather", {"rank": hub.rank, "k": _times(hub.received, size),
                                                  "m": len(hub.frm)})]
    for t in traffic:
        if len(t.to) > 1 or len(t.frm) > 1 or (t.rank in complete and (len(t.to) != 1 or len(t.frm) != 1)):
            return [Note("cause.traffic_peers", {"rank": t.rank, "to": t.to or ["-"], "frm": t.frm or ["-"]})]
    sending = [t for t in traffic if t.to]
    offsets = [(t.to[0] - t.rank) % n for t in sending]
    for t, d in zip(sending, offsets):
        if d not in (1, n - 1):
            return [Note("cause.traffic_not_neighbour", {"rank": t.rank, "to": t.to[0]})]
    if len(set(offsets)) > 1:
        a = sending[offsets.index(1)]
        b = sending[offsets.index(n - 1)]
        return [Note("cause.traffic_direction", {"rank": a.rank, "to": a.to[0], "other": b.rank, "other_to": b.to[0]})]
    for t, d in zip(sending, offsets):
        if t.frm and (t.rank - t.frm[0]) % n != d:
            return [Note("cause.traffic_same_side", {"rank": t.rank, "to": t.to[0], "frm": t.frm[0]})]
    return []


def volume_causes(traffic: list[RankTraffic], params: dict, n: int, size: int, dtype: str | None,
                  complete=None) -> list[Note]:
    """Why the volume is not the declared one (empty: it is): the rank furthest off, in figures. Too few
    sends are judged only on the ranks of `complete` (None: all), as in shape_causes."""
    complete = set(range(n)) if complete is None else complete
    sends, most, chunk, formula = bound(params, n, size)
    notes = []
    wrong_count = [t for t in traffic if t.sends > sends or (t.sends < sends and t.rank in complete)]
    if wrong_count:
        t = max(wrong_count, key=lambda t: abs(t.sends - sends))
        notes.append(Note("cause.traffic_sends", {"rank": t.rank, "count": t.sends, "formula": params.get("sends_formula", "?"),
                                                  "expected": sends}))
    narrow = next((t for t in traffic if dtype and any(d != dtype for d in t.dtypes)), None)
    if narrow is not None:
        sent = next(d for d in narrow.dtypes if d != dtype)
        wider = element_size(sent) > element_size(dtype)   # (a float64 work copy: more bytes, no saving to undo)
        notes.append(Note("cause.traffic_dtype_wider" if wider else "cause.traffic_dtype",
                          {"rank": narrow.rank, "sent": sent, "dtype": dtype}))
    over = [t for t in traffic if most >= 0 and t.sent > most]
    big = [t for t in traffic if chunk >= 0 and t.sizes and max(t.sizes) > chunk]
    if over or big:
        t = max(over or big, key=lambda t: t.sent)
        whole = t.sizes and min(t.sizes) >= size
        key = "cause.traffic_whole" if whole else "cause.traffic_bytes" if over else "cause.traffic_chunk"
        notes.append(Note(key, {"rank": t.rank, "sent": t.sent, "k": _times(t.sent, size), "count": t.sends,
                                "formula": formula, "bound": most, "bound_k": _times(most, size), "size": size,
                                "largest": max(t.sizes), "chunk": chunk}))
    return notes


def evaluate(judge, check: Check, runs) -> CheckResult:
    quantity = judge.exercise.quantity(check.quantity)
    measured = judge.measured_runs(runs, quantity)
    if not measured:
        run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
    values = judge.evaluate_value(Check(check.id, "value", 0, check.title, hidden=check.hidden, world_size=check.world_size,
                                        quantity=check.quantity), runs)
    if values.outcome is Outcome.GRADER_ERROR:   # the grader lost the run that shows it: its failure, said once
        return CheckResult(check, Outcome.GRADER_ERROR, notes=values.notes)
    if not values.passed:
        # traffic counts for a correct answer only: where there is none because the run failed (an exception, a
        # deadlock ...), the outcome says so, as the value check's does
        failed = values.outcome not in (Outcome.WRONG, Outcome.NOT_COLLECTIVE, Outcome.PASS)
        return CheckResult(check, values.outcome if failed else Outcome.WRONG,
                           notes=[Note("cause.traffic_needs_value", {"quantity": quantity.name})])
    params = check.params or {}
    # every run of the world size is judged, so that code which tells the runs apart (a fake ring where
    # values are right, another exchange where they are proven) fails in the run that shows it
    for run, complete in measured:
        n = run.request.world_size
        traffic = measure(run)
        size, dtype = size_and_dtype(run, quantity)
        notes: list[Note] = []
        if params.get("pattern") == "ring":
            notes += shape_causes(traffic, n, size, complete)
        if "sends" in params or "volume" in params:
            notes += volume_causes(traffic, params, n, size, dtype, complete)
        if notes:
            return CheckResult(check, Outcome.WRONG, notes=notes, details=_details(traffic))
    run = measured[0][0]
    n = run.request.world_size
    traffic = measure(run)
    size, _ = size_and_dtype(run, quantity)
    if params.get("pattern") == "ring":
        d = (traffic[0].to[0] - traffic[0].rank) % n if traffic and traffic[0].to else 1
        passed = Note("pass.ring", {"d": "+1" if d == 1 else "-1"})
    else:
        sends, most, chunk, formula = bound(params, n, size)
        passed = Note("pass.traffic", {"count": sends, "formula": params.get("sends_formula", "?"),
                                       "sent": max(t.sent for t in traffic), "bound": most, "vformula": formula,
                                       "size": size, "chunk": chunk})
    return CheckResult(check, Outcome.PASS, check.points, [passed])


def _details(traffic: list[RankTraffic]) -> list[Note]:
    return [Note("detail.traffic", {"rank": t.rank, "sends": t.sends, "sent": t.sent, "recvs": t.recvs,
                                    "received": t.received, "to": t.to or ["-"], "frm": t.frm or ["-"],
                                    "sent_bytes": t.sent_bytes, "received_bytes": t.received_bytes})
            for t in traffic]


def teaching(run: RunOutcome, exercise) -> list[Note]:
    """For the report: the declared bound beside the measured per-rank traffic (teach.py prints the latter)."""
    checks = [c for c in exercise.checks if c.kind == "traffic" and c.world_size == run.request.world_size
              and ("sends" in (c.params or {}) or "volume" in (c.params or {}))]
    if not checks or not any(rec.calls for rec in run.ranks):
        return []
    check = checks[0]
    n = run.request.world_size
    size, _ = size_and_dtype(run, exercise.quantity(check.quantity))
    sends, most, chunk, formula = bound(check.params, n, size)
    return [Note("teach.traffic_bound", {"ws": n, "size": size, "count": sends, "sformula": check.params.get("sends_formula", "?"),
                                         "bound": most, "formula": formula, "chunk": chunk})]
