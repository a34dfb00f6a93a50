"""The chapter's numbers, measured: each collective's bytes (at the switch) and the volume a ring moves for it
(comm.OPS), its time on real gloo / NCCL (the real-backend run), and for point-to-point exchanges what each
rank sent and received, to whom.

Times come from the real-backend run only (as its ranks timed their calls): the switch is the grader's own
channel, and its times say nothing of a network, so they are never shown as bandwidth.
"""
from __future__ import annotations

from ..comm import OPS
from ..model import Note
from ..records import RunOutcome


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


def _size(call) -> int:
    """The S of the op's formula: the bytes one rank contributes, or the bytes it ends with."""
    return call.delivered_bytes if OPS[call.op].size == "output" and call.delivered else call.sent_bytes


def teaching_notes(run: RunOutcome, exercise=None, real: RunOutcome | None = None) -> list[Note]:
    """`run`: a graded run (what the switch measured); `real`: the real-backend run, whose ranks timed their
    calls. `exercise`: when it declares traffic checks, the bound they declare follows the per-rank lines."""
    n = run.request.world_size
    backend = real.request.backend if real is not None else None
    notes = [Note("teach.header" if backend else "teach.header_untimed", {"ws": n, "backend": backend or "-"})]
    for rec in run.ranks:
        timings = [t for t in (real.ranks[rec.rank].timings if real is not None else [])
                   if t.get("op") not in ("send", "recv", "barrier")]
        collectives = [c for c in rec.calls if c.completed and c.ok and OPS.get(c.op) is not None
                       and c.op not in ("send", "recv", "barrier")]
        for k, call in enumerate(collectives):
            size = _size(call)
            volume, formula = ring_volume(call.op, n, size)
            timing = timings[k] if k < len(timings) and timings[k].get("op") == call.op else None
            params = {"rank": rec.rank, "op": call.api or call.op, "size": size, "volume": int(volume),
                      "formula": formula}
            if timing is not None and isinstance(timing.get("ms"), (int, float)):
                notes.append(Note("teach.collective", {**params, "ms": float(timing["ms"]),
                                                       "bandwidth": rate(volume, float(timing["ms"]))}))
            else:
                notes.append(Note("teach.collective_untimed", params))
        sends = [c for c in rec.calls if c.op == "send"]
        recvs = [c for c in rec.calls if c.op == "recv" and c.completed and c.ok]
        if sends or recvs:
            notes.append(Note("teach.p2p", {"rank": rec.rank, "sends": len(sends), "sent": sum(c.sent_bytes for c in sends),
                                            "to": _peers(sends), "recvs": len(recvs),
                                            "received": sum(c.delivered_bytes for c in recvs),
                                            "frm": _peers(recvs)}))
    if exercise is not None and len(notes) > 1:
        from .traffic import teaching
        notes += teaching(run, exercise)
    return notes if len(notes) > 1 else []


def exercise_notes(exercise, run: RunOutcome) -> list[Note]:
    """The exercise's own lines about this run (`Exercise.teach(run, ctx)`, ctx a verify.observe.RunContext),
    its keys under its name. An exercise's teaching never breaks grading."""
    if exercise.teach is None:
        return []
    from .observe import RunContext, RunView
    try:
        extra = exercise.teach(run, RunContext(RunView(run))) or []
    except Exception:  # noqa: BLE001
        return []
    return [Note(f"{exercise.name}.{key}", dict(params)) for key, params in extra]


def _peers(calls) -> list[str]:
    peers = sorted({c.group[c.peer] if c.peer is not None and c.peer < len(c.group)
                    else c.group[c.source] if c.source is not None and c.source < len(c.group) else None
                    for c in calls} - {None})
    return [str(p) for p in peers] or ["-"]
