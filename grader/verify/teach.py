"""The chapter's numbers, measured: each collective's bytes (at the switch) and the volume a ring moves for it
(comm.OPS), its time on real gloo / NCCL (the real-backend run), and for point-to-point exchanges what each
rank sent and received, to whom.

Times come from the real-backend run only (as its ranks timed their calls): the switch is the grader's own
channel, and its times say nothing of a network, so they are never shown as bandwidth. Nor are two kinds of
real time. A rank's first call of an operation includes gloo's set-up of it (measured here, 2 ranks on
loopback: a 1 KiB all-reduce 2.9 ms the first time, 0.46 ms after; 256 KiB 11 ms, then 1.5 ms): it is
labelled as such, and repeated calls of one operation and size are shown as that first call and the median
of the others. And a message under BANDWIDTH_MIN_BYTES times mostly the call's fixed cost (0.35-0.45 ms
whatever the size up to 16 KiB: a 4 KiB all-reduce "at 47 KB/s" says nothing of the link), so it gets a time
and no bandwidth. `python -m grader bench` is where bandwidth is measured: after a warm-up, 4 KiB to 64 MiB.
"""
from __future__ import annotations

from ..comm import OPS
from ..model import Note
from ..records import RunOutcome

BANDWIDTH_MIN_BYTES = 1 << 20   # a message's data (S) from which a time says something of the link


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
    withheld = False
    for rec in run.ranks:
        timings = [t for t in (real.ranks[rec.rank].timings if real is not None else [])
                   if t.get("op") not in ("send", "recv", "barrier")]
        collectives = [c for c in rec.calls if c.completed and c.ok and OPS.get(c.op) is not None
                       and c.op not in ("send", "recv", "barrier")]
        repeats: dict[tuple, list] = {}   # (operation, bytes) -> its calls' times (None: not timed), in order
        for k, call in enumerate(collectives):
            timing = timings[k] if k < len(timings) and timings[k].get("op") == call.op else None
            ms = timing.get("ms") if timing is not None else None
            repeats.setdefault((call.api or call.op, call.op, _size(call)), []).append(
                float(ms) if isinstance(ms, (int, float)) else None)
        for (api, op, size), times in repeats.items():
            note, cut = _collective(rec.rank, api, op, size, n, times)
            notes.append(note)
            withheld |= cut
        sends = [c for c in rec.calls if c.op == "send"]
        recvs = [c for c in rec.calls if c.op == "recv" and c.completed and c.ok]
        if sends or recvs:
            notes.append(Note("teach.p2p", {"rank": rec.rank, "sends": len(sends), "sent": sum(c.sent_bytes for c in sends),
                                            "to": _peers(sends), "recvs": len(recvs),
                                            "received": sum(c.delivered_bytes for c in recvs),
                                            "frm": _peers(recvs)}))
    if withheld:
        notes.append(Note("teach.no_bandwidth", {"min": _bytes_words(BANDWIDTH_MIN_BYTES), "command": "python -m grader bench"}))
    if exercise is not None and len(notes) > 1:
        from .traffic import teaching
        notes += teaching(run, exercise)
    return notes if len(notes) > 1 else []


def _collective(rank: int, api: str, op: str, size: int, n: int, times: list) -> tuple[Note, bool]:
    """One line for a rank's calls of one operation on one size: the first call labelled, the others as their
    median; a bandwidth only from calls after the first, of a message of at least BANDWIDTH_MIN_BYTES.
    And whether a time was shown without its bandwidth."""
    volume, formula = ring_volume(op, n, size)
    params = {"rank": rank, "op": api, "size": size, "volume": int(volume), "formula": formula}
    if any(ms is None for ms in times):
        if len(times) > 1:
            return Note("teach.collective_untimed_calls", {**params, "calls": len(times)}), False
        return Note("teach.collective_untimed", params), False
    if len(times) == 1:
        return Note("teach.collective_first", {**params, "ms": times[0]}), True
    later = sorted(times[1:])
    median = later[len(later) // 2] if len(later) % 2 else (later[len(later) // 2 - 1] + later[len(later) // 2]) / 2
    params.update(calls=len(times), first_ms=times[0], ms=median)
    if size < BANDWIDTH_MIN_BYTES:
        return Note("teach.collective_repeated", params), True
    return Note("teach.collective_rate", {**params, "bandwidth": rate(volume, median)}), False


def _bytes_words(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 and not size % (1 << 20) else f"{size >> 10} KiB"


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
