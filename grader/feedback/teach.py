"""The chapter's numbers, measured: each collective's time per rank and the volume a ring moves for it."""
from __future__ import annotations

from ..model import Note
from ..processes.runner import RunOutcome

ELEMENT_BYTES = {"torch.float64": 8, "torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2,
                 "torch.int64": 8, "torch.int32": 4, "torch.int16": 2, "torch.int8": 1, "torch.uint8": 1}


def _rate(volume: float, ms: float) -> str:
    if ms <= 0:
        return "-"
    per_s = volume / (ms / 1000)
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.2f} {unit}"
    return f"{per_s:.0f} B/s"


def ring_volume(op: str, n: int, size: int) -> tuple[float, str]:
    """Bytes each rank sends in a ring: all-reduce 2(N-1)/N x size, all-gather (N-1)/N x total size."""
    if op == "all_reduce":
        return 2 * (n - 1) / n * size, f"2({n}-1)/{n} x {size}"
    return (n - 1) / n * size, f"({n}-1)/{n} x {size}"


def teaching_notes(run: RunOutcome) -> list[Note]:
    n = run.request.world_size
    notes = [Note("teach.header", {"ws": n, "backend": run.request.backend})]
    for rec in run.ranks:
        enters = {(c["op"], c["n"]): c for c in rec.calls if c.get("t") == "enter"}
        for call in rec.calls:
            if call.get("t") != "exit" or call.get("op") not in ("all_reduce", "all_gather") or not call.get("ok"):
                continue
            args = (enters.get((call["op"], call["n"])) or {}).get("args") or {}
            tensor = args.get("tensor") or {}
            elem = ELEMENT_BYTES.get(tensor.get("dtype"), 4)
            size = tensor.get("numel", 0) * elem * (n if call["op"] == "all_gather" else 1)
            volume, formula = ring_volume(call["op"], n, size)
            notes.append(Note("teach.collective", {"rank": rec.rank, "op": call["op"], "ms": float(call.get("ms", 0)),
                                                   "size": size, "volume": int(volume), "formula": formula,
                                                   "bandwidth": _rate(volume, float(call.get("ms", 0)))}))
    return notes if len(notes) > 1 else []
