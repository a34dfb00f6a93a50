"""A run as a Chrome trace-event file (the JSON Object Format, {"traceEvents": [...]}) that Perfetto
(ui.perfetto.dev, "Open trace file") and chrome://tracing open, from runview.RunView.

A process per rank ("rank 0" ...), each operation a complete event ("X") on one of its threads: slices on a
thread must nest, so operations of a rank that overlap without nesting (an isend still open while an irecv
runs) go on a thread of their own. Each point-to-point message is a flow from its send to its receive, each
collective a flow through the slices of its group's ranks (flow events "s", "t", "f", placed inside the
slices they bind to, "f" binding to its enclosing slice: "bp": "e"). How each rank ended is an instant event
on its first thread, how the run ended a global one.

Time is the switch's clock, which counts events, not seconds; the format has only microseconds, so one tick
is shown as 1 us (a call entered at tick c starts at c us; a completion at tick c is drawn at c + 0.5 us,
after the calls taken at c). `otherData` says so. Nothing here is a value the ranks computed.
"""
from __future__ import annotations

import json

from . import runview
from .runview import RunView
from .timeline_words import ending, say, stop, why

HALF = 0.5        # where a completion at tick c is drawn: after the calls the switch took at c
INSIDE = 0.25     # flow events sit this far inside the slices they bind to


def _done(op: runview.Op, view: RunView) -> float:
    return op.completed + HALF if op.completed is not None else float(view.end)


def _line(line, lang: str):
    return line if line is None or isinstance(line, int) else say("op_line", {"line": line}, lang)


def events(view: RunView | None, lang: str = "zh") -> dict:
    """The trace as a JSON-ready dict."""
    if view is None:
        return {"traceEvents": [], "otherData": {"note": say("none", {}, lang)}}
    row, counts = runview.rows(view)
    out: list[dict] = []
    for r in range(view.world_size):
        pid = r + 1
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 1, "ts": 0,
                    "args": {"name": say("lane", {"rank": r}, lang)}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 1, "ts": 0, "args": {"sort_index": r}})
        for t in range(counts[r]):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t + 1, "ts": 0,
                        "args": {"name": "operations" if t == 0 else f"operations ({t + 1})"}})
    where = {}
    for op in view.ops:
        tid = row[(op.rank, op.seq)] + 1
        where[(op.rank, op.seq)] = (op.rank + 1, tid)
        args = {"rank": op.rank, "operation": op.seq + 1, "op": op.op, "group": list(view.groups[op.group]),
                "elements": op.numel, "dtype": op.dtype, "line": _line(op.line, lang), "entered_clock": op.entered,
                "completed_clock": op.completed, "state": op.state}
        if not op.collective:
            args["peer"] = op.peer
        if op.why is not None:
            args["why"] = why(op.why, lang)
        name = op.name if op.state == "ok" else f"{op.name} ({op.state})"
        out.append({"name": name, "cat": "collective" if op.collective else "p2p", "ph": "X", "pid": op.rank + 1,
                    "tid": tid, "ts": op.entered, "dur": _done(op, view) - op.entered, "args": args})
    flow = 0
    for m in view.messages:
        flow += 1
        (spid, stid), (dpid, dtid) = where[(m.src, m.src_seq)], where[(m.dst, m.dst_seq)]
        common = {"name": "message", "cat": "message", "id": flow}
        out.append({**common, "ph": "s", "pid": spid, "tid": stid, "ts": m.sent + INSIDE,
                    "args": {"elements": m.numel, "dtype": m.dtype, "delivered": m.ok}})
        out.append({**common, "ph": "f", "bp": "e", "pid": dpid, "tid": dtid, "ts": m.delivered + INSIDE, "args": {}})
    for band in view.bands:
        flow += 1
        members = sorted(zip(band.ranks, band.seqs))
        common = {"name": band.name, "cat": "collective", "id": flow}
        for i, (rank, seq) in enumerate(members):
            pid, tid = where[(rank, seq)]
            phase = "s" if i == 0 else "f" if i == len(members) - 1 else "t"
            event = {**common, "ph": phase, "pid": pid, "tid": tid, "ts": band.at + INSIDE,
                     "args": {"group": list(band.ranks), "ok": band.ok}}
            if phase == "f":
                event["bp"] = "e"
            out.append(event)
    out += _marks(view, lang)
    other = {"clock": "the switch's clock: one tick (an event it received or an operation it completed) is shown "
                      "as 1 us; a completion at tick c is drawn at c + 0.5 us", "world_size": view.world_size,
             "operations": view.total, "stop": view.stop, "stop_words": stop(view, lang)}
    if view.hidden is not None:
        other["not_drawn"] = view.hidden.ops
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": other}


def _marks(view: RunView, lang: str) -> list[dict]:
    """How each rank ended and how the run did (instants); the operations left out (a slice per rank, on a
    thread of its own)."""
    out = []
    for end in view.ends:
        out.append({"name": ending(end, lang), "cat": "end", "ph": "i", "s": "t", "pid": end.rank + 1, "tid": 1,
                    "ts": min(end.at + HALF + INSIDE, view.end), "args": {"how": end.how}})
    out.append({"name": stop(view, lang), "cat": "run", "ph": "i", "s": "g", "pid": 1, "tid": 1, "ts": view.end,
                "args": {"stop": view.stop, "rank": view.stop_rank}})
    if view.hidden is not None:
        h = view.hidden
        for rank, count, names in h.per_rank:
            out.append({"name": "thread_name", "ph": "M", "pid": rank + 1, "tid": 99, "ts": 0, "args": {"name": "not drawn"}})
            out.append({"name": say("hidden_count", {"n": count}, lang), "cat": "not_drawn", "ph": "X", "pid": rank + 1,
                        "tid": 99, "ts": h.first + HALF + INSIDE, "dur": max(h.last - h.first - 2 * INSIDE - HALF, INSIDE),
                        "args": {"operations": dict(names)}})
    return out


def write(view: RunView | None, path, lang: str = "zh") -> None:
    from .results import write_atomic
    write_atomic(path, json.dumps(events(view, lang), ensure_ascii=False))
