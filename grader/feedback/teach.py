"""The chapter's numbers, measured: each collective's time per rank and the volume a ring moves for it
(comm.OPS), and for point-to-point exchanges what each rank sent and received, to whom."""
from __future__ import annotations

from ..comm import OPS
from ..model import Note
from ..processes.protocol import element_size
from ..processes.runner import RunOutcome


def rate(volume: float, ms: float) -> str:
    if ms <= 0:
        return "-"
    per_s = volume / (ms / 1000)
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.2f} {unit}"
    return f"{per_s:.0f} B/s"


def ring_volume(op: str, n: int, size: int) -> tuple[float, str]:
    """Bytes each rank sends in a ring algorithm for `op` on `size` bytes (comm.OPS), and the formula."""
    spec = OPS[op]
    if spec.ring is None:
        return 0.0, "-"
    return spec.ring(n) * size, spec.formula.replace("N", str(n)).replace("S", str(size))


def _size(call, n: int) -> int:
    """The S of the op's formula: the bytes one rank contributes, or the bytes it ends with."""
    descs = call.delivered if OPS[call.op].size == "output" and call.delivered else call.inputs
    return sum(int(d.get("numel") or 0) * element_size(d.get("dtype")) for d in descs or [])


def teaching_notes(run: RunOutcome, exercise=None) -> list[Note]:
    """`exercise`: when it declares traffic checks, the bound they declare follows the per-rank lines."""
    n = run.request.world_size
    notes = [Note("teach.header", {"ws": n, "backend": run.request.backend})]
    for rec in run.ranks:
        for call in rec.calls:
            if not (call.completed and call.ok) or call.op in ("send", "recv", "barrier") or OPS.get(call.op) is None:
                continue
            size = _size(call, n)
            volume, formula = ring_volume(call.op, n, size)
            notes.append(Note("teach.collective", {"rank": rec.rank, "op": call.api or call.op, "ms": call.ms,
                                                   "size": size, "volume": int(volume), "formula": formula,
                                                   "bandwidth": rate(volume, call.ms)}))
        sends = [c for c in rec.calls if c.op == "send"]
        recvs = [c for c in rec.calls if c.op == "recv" and c.completed and c.ok]
        if sends or recvs:
            notes.append(Note("teach.p2p", {"rank": rec.rank, "sends": len(sends), "sent": sum(c.sent_bytes for c in sends),
                                            "to": _peers(sends), "recvs": len(recvs),
                                            "received": sum(c.delivered_bytes for c in recvs),
                                            "frm": _peers(recvs)}))
    if exercise is not None and len(notes) > 1:
        from ..verify.traffic import teaching
        notes += teaching(run, exercise)
    return notes if len(notes) > 1 else []


def exercise_notes(exercise, run: RunOutcome) -> list[Note]:
    """The exercise's own lines about this run (`Exercise.teach(run, ctx)`, ctx a verify.observe.RunContext),
    its keys under its name. An exercise's teaching never breaks grading."""
    if exercise.teach is None:
        return []
    from ..verify.observe import RunContext, RunView
    try:
        extra = exercise.teach(run, RunContext(RunView(run))) or []
    except Exception:  # noqa: BLE001
        return []
    return [Note(f"{exercise.name}.{key}", dict(params)) for key, params in extra]


def _peers(calls) -> list[str]:
    peers = sorted({c.peer if c.peer is not None else c.source for c in calls} - {None})
    return [str(p) for p in peers] or ["-"]
