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

import math

from ..comm import OPS
from ..feedback.messages import render
from ..model import Note, Words
from ..records import RunOutcome
from . import mistakes
from .kinds.traffic import teaching

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
    """The S of the op's formula: the bytes one rank contributes, or the bytes it ends with (a rooted
    operation's tensor, whichever way it went on this rank: a broadcast's receivers send nothing)."""
    if OPS[call.op].rooted:
        return max(call.sent_bytes, call.delivered_bytes)
    return call.delivered_bytes if OPS[call.op].size == "output" and call.delivered else call.sent_bytes


def teaching_notes(run: RunOutcome, exercise=None, real: RunOutcome | None = None) -> list[Note]:
    """`run`: a graded run (what the switch measured); `real`: the real-backend run, whose ranks timed their
    calls. `exercise`: when it declares traffic checks, the bound they declare follows the per-rank lines."""
    n = run.request.world_size
    # named only where its ranks timed something (a real run that failed at its first call timed nothing: the
    # lines are then the switch's figures alone)
    backend = real.request.backend if real is not None and any(r.timings for r in real.ranks) else None
    notes = [Note("teach.header" if backend else "teach.header_untimed", {"ws": n, "backend": backend or "-"})]
    withheld = False
    for rec in run.ranks:
        timings = [t for t in (real.ranks[rec.rank].timings if real is not None else [])
                   if t.get("op") not in ("send", "recv", "barrier")]
        collectives = [c for c in rec.calls if c.completed and c.ok and OPS.get(c.op) is not None
                       and c.op not in ("send", "recv", "barrier")]
        # (operation, bytes, the N of its group) -> its calls' times (None: not timed), in order: a call on a
        # group of 2 in a world of 4 sends what a ring of 2 sends
        repeats: dict[tuple, list] = {}
        for k, call in enumerate(collectives):
            timing = timings[k] if k < len(timings) and timings[k].get("op") == call.op else None
            ms = timing.get("ms") if timing is not None else None
            repeats.setdefault((call.api or call.op, call.op, _size(call), len(call.group or ()) or n), []).append(
                float(ms) if isinstance(ms, (int, float)) else None)
        for (api, op, size, members), times in repeats.items():
            note, cut = _collective(rec.rank, api, op, size, members, times)
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
        notes += teaching(run, exercise)
    return notes if len(notes) > 1 else []


def _collective(rank: int, api: str, op: str, size: int, n: int, times: list) -> tuple[Note, bool]:
    """One line for a rank's calls of one operation on one size: the first call labelled, the others as their
    median; a bandwidth only from calls after the first, of a message of at least BANDWIDTH_MIN_BYTES.
    And whether a time was shown without its bandwidth."""
    volume, formula = ring_volume(op, n, size)
    params = {"rank": rank, "op": api, "size": size, "volume": int(volume), "formula": formula}
    ring = "teach.ring" if len(times) == 1 else "teach.ring_per_call"
    params["ring"] = Words(*(render(ring, params, lang) if formula != "-" else "" for lang in ("zh", "en")))
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


class Facts:
    """What the switch measured of one rank's operations (or of the run's), for an exercise's Teach lines."""

    def __init__(self, run: RunOutcome, record=None):
        self.run, self.ws = run, run.request.world_size
        self.rank = record.rank if record is not None else None
        self._calls = [c for c in (record.calls if record is not None else []) if c.completed and c.ok]
        self._values = record.result.values if record is not None and record.result is not None else {}

    def _of(self, op: str) -> list:
        return [c for c in self._calls if c.op == op]

    def count(self, op: str) -> int:
        return len(self._of(op))

    def bytes(self, op: str) -> int:
        return sum(c.sent_bytes for c in self._of(op) if c.sends)

    def elements(self, op: str) -> int:
        return sum(c.sent_numel for c in self._of(op) if c.sends)

    def dtypes(self, op: str) -> list[str]:
        return sorted({d for c in self._of(op) if c.sends for d in c.sent_dtypes})

    def first(self, op: str, delivered: bool = False) -> int:
        calls = self._of(op)
        return 0 if not calls else calls[0].delivered_bytes if delivered else calls[0].sent_bytes

    def itemsize(self, op: str) -> int:
        """The bytes of one element the rank's first `op` sent."""
        calls = [c for c in self._of(op) if c.sends]
        return calls[0].sent_bytes // max(1, calls[0].sent_numel) if calls else 0

    def ring(self, op: str, size: int | None = None, delivered: bool = False) -> int:
        return int(ring_volume(op, self.ws, self.first(op, delivered) if size is None else size)[0])

    def held(self, quantity: str) -> int:
        value = self._values.get(quantity) if isinstance(self._values, dict) else None
        shape = value.get("shape") if isinstance(value, dict) and value.get("kind") == "tensor" else None
        return int(math.prod(shape)) if isinstance(shape, list) else 0

    def crossed(self, node: int) -> int:
        """Bytes the run's ranks sent in operations whose ranks lie in more than one node."""
        total = 0
        for record in self.run.ranks:
            for call in record.calls:
                if not (call.completed and call.ok and call.sends):
                    continue
                ranks = set(call.group)
                if call.op == "send":
                    peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else record.rank
                    ranks = {record.rank, peer}
                if len({r // node for r in ranks}) > 1:
                    total += call.sent_bytes
        return total


def exercise_notes(exercise, run: RunOutcome) -> list[Note]:
    """The exercise's own lines about this run (its Teach declarations), its keys under its name. A line
    whose `say` fails is left out (the report goes on) and noted for staff."""
    if not exercise.teach:
        return []
    lessons = list(exercise.teach)
    ranked = [i for i, lesson in enumerate(lessons) if lesson.per == "rank"]
    before = [x for x in lessons[:ranked[0]]] if ranked else lessons
    after = lessons[ranked[-1] + 1:] if ranked else []
    # the run's lines before the first per-rank line, then each rank's lines, then the run's last lines
    order = [(lesson, Facts(run)) for lesson in before if lesson.per == "run"]
    order += [(lesson, Facts(run, record)) for record in run.ranks for lesson in lessons if lesson.per == "rank"]
    order += [(lesson, Facts(run)) for lesson in after if lesson.per == "run"]
    notes = []
    for lesson, facts in order:
        if lesson.held and not facts.held(lesson.held):
            continue
        if not all(mistakes.holds(c, facts.rank or 0, facts.ws, facts._calls, None, {}) for c in lesson.when):
            continue
        try:
            if lesson.only is not None and not lesson.only(facts):
                continue
            params = {"ws": facts.ws, **({"rank": facts.rank} if facts.rank is not None else {}),
                      **(lesson.say(facts) if lesson.say is not None else {})}
        except Exception as err:  # noqa: BLE001  (an exercise's line never breaks grading)
            notes.append(Note("staff.exercise_error", {"exercise": exercise.name, "what": lesson.key,
                                                       "error": f"{type(err).__name__}: {err}"}))
            continue
        notes.append(Note(f"{exercise.name}.{lesson.key}", params))
    return notes if any(not n.key.startswith("staff.") and n.key != f"{exercise.name}.teach.header" for n in notes) else []


def _peers(calls) -> list[str]:
    peers = sorted({c.group[c.peer] if c.peer is not None and c.peer < len(c.group)
                    else c.group[c.source] if c.source is not None and c.source < len(c.group) else None
                    for c in calls} - {None})
    return [str(p) for p in peers] or ["-"]
