"""A run as the switch recorded it, reduced to what a picture of it needs: plain data for the space-time
diagram (timeline.py) and the trace-event file (trace.py).

`view(run)` reads a run's records (grader/records.py: run.request.world_size, run.stop, run.stop_rank, and
per rank .calls, .inside, .result, .exit) by their attributes, never through the process modules: every operation of every rank,
when the switch took it and when it completed on the switch's clock (a count of the frames it received and
the operations it completed, not seconds), its group, the sizes and dtypes of what it sent or received, its
partners, and the line the rank said it called from. No value is ever read, nor an exception's message (a
perturbed run's exception may quote its numbers): a perturbed run's view is its shapes and times only.

A run of more than LIMIT operations keeps its first HEAD and its last TAIL in the order the switch took
them (where a program starts and where it ended: a deadlock, a time-out); the operations between are counted
per rank and operation (`Hidden`), so the picture stays small and says what it left out.
"""
from __future__ import annotations

import heapq
from collections import Counter
from itertools import islice
from dataclasses import dataclass, field

LIMIT = 200                 # operations drawn, all ranks together
HEAD = LIMIT // 2           # ... the first ones the switch took
TAIL = LIMIT - HEAD         # ... and the last ones
SIGNATURE_CHARS = 80        # one call's signature in a "the ranks called different operations" listing
ERROR_CHARS = 200           # an operation's error as gloo words it
DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32",
          "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool", "complex64": "c64", "complex128": "c128"}


@dataclass(frozen=True)
class Op:
    """One operation of one rank. state: "ok", "failed" (an error came back to it), "blocked" (the rank waited on
    it when the run ended), "open" (never completed, not waited on: an isend nobody received)."""
    rank: int
    seq: int
    name: str                      # as the student called it (dist.isend: "isend"), else the operation
    op: str                        # the operation (comm.OPS)
    group: int                     # index into RunView.groups
    collective: bool
    peer: int | None               # point-to-point: the other rank (global); None: a receive from any rank
    numel: int                     # elements it sent (what it received where it sent nothing)
    dtype: str                     # "f32" ...
    entered: int                   # the switch's clock when it took the call
    completed: int | None          # ... when it completed (None: never)
    state: str
    why: tuple | None = None       # failed or blocked: (words key, params)
    line: object = None            # an int, or model.CellLines in a notebook
    index: int = -1                # collectives: the k-th of its rank on its group


@dataclass(frozen=True)
class Message:
    """A point-to-point message: from the send's entry (the data reached the switch) to its delivery."""
    src: int
    src_seq: int
    dst: int
    dst_seq: int
    numel: int
    dtype: str
    sent: int
    delivered: int
    ok: bool


@dataclass(frozen=True)
class Band:
    """A collective completing on every rank of its group at one tick (ok False: their calls did not fit)."""
    name: str
    group: int
    ranks: tuple[int, ...]
    seqs: tuple[int, ...]
    at: int
    ok: bool
    index: int


@dataclass(frozen=True)
class End:
    """How a rank ended, placed after its last operation. how: returned, raised, exited, load_error, killed,
    blocked (waiting in an operation when the run was stopped), running (not in an operation), unknown."""
    rank: int
    how: str
    at: int
    type: str | None = None
    line: object = None
    signal: int | None = None


@dataclass(frozen=True)
class Hidden:
    """The operations not drawn: those the switch took between clocks `first` and `last` (exclusive)."""
    first: int
    last: int
    ops: int
    per_rank: tuple = ()           # (rank, count, ((name, count), ...)), most frequent first


@dataclass
class RunView:
    world_size: int
    stop: str                      # how the run ended (completed, deadlock, timeout, failfast ...)
    stop_rank: int | None
    end: int                       # the clock where the run ended (one past its last event)
    ops: list[Op] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    groups: list[tuple[int, ...]] = field(default_factory=list)
    group_names: list[str] = field(default_factory=list)   # "{0,1}"; "{0,1}'" for a second group of those ranks
    ends: list[End] = field(default_factory=list)
    total: int = 0                 # operations the switch recorded
    hidden: Hidden | None = None


def _short(dtype) -> str:
    name = str(dtype or "?").split(".")[-1]
    return DTYPES.get(name, name)


def _size(call) -> tuple[int, str]:
    descs = call.inputs or call.outputs or []
    numel = sum(int(d.get("numel") or 0) for d in descs if isinstance(d, dict))
    return numel, _short(descs[0].get("dtype") if descs and isinstance(descs[0], dict) else None)


def _signature(call) -> str:
    descs = call.inputs or call.outputs or []
    parts = ", ".join(f"{str(d.get('dtype')).split('.')[-1]}({', '.join(map(str, d.get('shape') or []))})"
                      for d in descs[:4] if isinstance(d, dict))
    text = f"{call.api or call.op}({parts}{', ...' if len(descs) > 4 else ''})"
    return text if len(text) <= SIGNATURE_CHARS else text[:SIGNATURE_CHARS - 3] + "..."


def _peer(call) -> int | None:
    index = call.peer if call.peer is not None else call.source
    if index is None or not 0 <= index < len(call.group):
        return None
    return call.group[index]


def _kept(calls: list[list]) -> tuple[int, int] | None:
    """(E1, E2): keep the calls the switch took at or before E1 and at or after E2; None: keep every one.
    Each rank's calls are in the order the switch took them, and no two share a clock."""
    total = sum(len(c) for c in calls)
    if total <= LIMIT:
        return None
    first = list(islice(heapq.merge(*[(c.entered_at for c in cs) for cs in calls]), HEAD))[-1]
    last = list(islice(heapq.merge(*[(c.entered_at for c in reversed(cs)) for cs in calls], reverse=True), TAIL))[-1]
    return first, last


def view(run, place=None) -> RunView:
    """The run's picture data. place(line, file) gives a line as the student sees it (a notebook's cell and
    line); by default the line as recorded."""
    place = place or (lambda line, file: line)
    ws = run.request.world_size
    records = list(run.ranks)
    calls = [list(rec.calls) for rec in records]
    stop = str(getattr(run.stop, "value", run.stop))
    last = max((_last(cs) for cs in calls), default=0)
    out = RunView(world_size=ws, stop=stop, stop_rank=run.stop_rank, end=last + 1, total=sum(len(cs) for cs in calls))
    cut = _kept(calls)
    kept = [[c for c in cs if cut is None or c.entered_at <= cut[0] or c.entered_at >= cut[1]] for cs in calls]
    if cut is not None:
        out.hidden = _hidden(calls, cut)
    groups: dict[tuple, int] = {}
    waiting = {rec.rank: rec.inside.seq for rec in records if rec.inside is not None}
    pending: dict[tuple, set] = {}   # the collectives not completed: who had made each
    for cs in calls:
        for c in cs:
            if not c.completed and c.op not in ("send", "recv"):
                pending.setdefault((tuple(c.group), c.gname, c.index), set()).add(c.rank)
    for call in sorted((c for cs in kept for c in cs), key=lambda c: c.entered_at):   # groups numbered as they appear
        groups.setdefault((tuple(call.group), call.gname), len(groups))
    for cs in kept:
        for call in cs:
            out.ops.append(_op(call, groups, waiting, pending, place))
    for (ranks, gname), gid in sorted(groups.items(), key=lambda item: item[1]):
        out.groups.append(ranks)
        label = "{" + ",".join(map(str, ranks)) + "}"
        out.group_names.append(label + "'" * sum(1 for g in out.groups[:-1] if g == ranks))
    out.messages, out.bands = _links(kept, {(c.rank, c.seq) for cs in kept for c in cs}, groups)
    out.ends = [_end(rec, calls[r], stop, run.stop_rank, place) for r, rec in enumerate(records)]
    return out


def _links(kept: list[list], drawn: set, groups: dict) -> tuple[list[Message], list[Band]]:
    """The messages and the collectives between drawn operations (one left out of the picture takes its
    links with it: the caption counts it)."""
    messages, bands, seen = [], [], set()
    for cs in kept:
        for call in cs:
            if not call.completed or not call.partners:
                continue
            if call.op == "recv":
                send = next(iter(call.partners.values()))
                if (send.rank, send.seq) in drawn:
                    numel, dtype = _size(send)
                    messages.append(Message(send.rank, send.seq, call.rank, call.seq, numel, dtype,
                                            send.entered_at, call.completed_at, call.ok and send.ok))
            elif call.op != "send":
                key = (tuple(call.group), call.gname, call.index)
                members = [call.partners[g] for g in sorted(call.partners)]
                if key in seen or not all((m.rank, m.seq) in drawn for m in members):
                    continue
                seen.add(key)
                bands.append(Band(call.api or call.op, groups[key[:2]], tuple(call.group), tuple(m.seq for m in members),
                                  call.completed_at, all(m.ok for m in members), call.index))
    return messages, sorted(bands, key=lambda b: b.at)


def rows(view: RunView, most: int | None = None) -> tuple[dict[tuple[int, int], int], list[int]]:
    """A row for each operation, (rank, seq) -> row, so that operations of a rank that overlap in time (an
    isend still open while an irecv runs) are on different rows; and how many rows each rank has. With `most`,
    past that many rows an operation shares the row that frees first."""
    row: dict[tuple[int, int], int] = {}
    ends: list[list[int]] = [[] for _ in range(view.world_size)]
    for op in sorted(view.ops, key=lambda o: o.entered):
        lane, end = ends[op.rank], op.completed if op.completed is not None else view.end
        free = next((i for i, e in enumerate(lane) if e < op.entered), None)
        if free is None and (most is None or len(lane) < most):
            lane.append(0)
            free = len(lane) - 1
        if free is None:
            free = min(range(len(lane)), key=lane.__getitem__)
        lane[free] = max(lane[free], end)
        row[(op.rank, op.seq)] = free
    return row, [max(1, len(lane)) for lane in ends]


def _last(calls: list) -> int:
    """A rank's last event on the switch's clock: its calls were taken in order, but an earlier one may
    complete after a later one was taken (isend, then irecv)."""
    return max((c.completed_at if c.completed else c.entered_at for c in calls), default=0)


def _hidden(calls: list[list], cut: tuple[int, int]) -> Hidden:
    per_rank, total = [], 0
    for r, cs in enumerate(calls):
        names = Counter(c.api or c.op for c in cs if cut[0] < c.entered_at < cut[1])
        if names:
            count = sum(names.values())
            total += count
            per_rank.append((r, count, tuple(names.most_common())))
    return Hidden(cut[0], cut[1], total, tuple(per_rank))


def _op(call, groups: dict, waiting: dict, pending: dict, place) -> Op:
    gid = groups[(tuple(call.group), call.gname)]
    numel, dtype = _size(call)
    collective = call.op not in ("send", "recv")
    if call.completed:
        state = "ok" if call.ok else "failed"
        why = None if call.ok else _failure(call, collective)
    else:
        state = "blocked" if waiting.get(call.rank) == call.seq else "open"
        why = _waits_for(call, collective, pending)
    return Op(call.rank, call.seq, call.api or call.op, call.op, gid, collective, None if collective else _peer(call),
              numel, dtype, call.entered_at, call.completed_at if call.completed else None, state, why,
              place(call.line, call.file), call.index)


def _failure(call, collective: bool) -> tuple:
    problem = call.problem or {}
    if problem.get("kind") == "group_name":
        return "failed.group_name", {"name": problem.get("name"), "ranks": list(problem.get("ranks") or ()),
                                     "other": list(problem.get("other") or ())}
    if "sent" in problem:
        return "failed.message", {k: problem.get(k) for k in ("sender", "receiver", "sent", "room")} | {
            "sent_dtype": _short(problem.get("sent_dtype")), "room_dtype": _short(problem.get("room_dtype"))}
    if collective and len(call.partners) == len(call.group) > 1:   # paired, and the calls did not fit together
        members = [call.partners[g] for g in sorted(call.partners)]
        return "failed.diverged", {"calls": [{"rank": m.rank, "ops": [_signature(m)]} for m in members]}
    return "failed.error", {"error": (call.error or "?")[:ERROR_CHARS]}


def _waits_for(call, collective: bool, pending: dict) -> tuple:
    """Who the switch was still waiting for (certain: it pairs every call): the ranks of the group that had
    not made this collective, or the peer that had posted no matching receive or send."""
    if collective:
        made = pending.get((tuple(call.group), call.gname, call.index), set())
        missing = [g for g in call.group if g not in made]
        return ("waits.collective", {"ranks": missing}) if missing else ("waits.unknown", {})
    peer = _peer(call)
    other = "recv" if call.op == "send" else "send"
    if peer is None:
        return "waits.any", {"other": other}
    return "waits.p2p", {"peer": peer, "other": other}


def _end(rec, calls: list, stop: str, stop_rank, place) -> End:
    at = _last(calls)
    result = rec.result   # records.RankResult: how the entry function ended, as the rank said
    if result is not None:
        error = result.error or {}
        frames = error.get("frames") or []
        last = frames[-1] if frames and isinstance(frames[-1], dict) else {}
        kind = str(error.get("type") or "")[:60] or None
        if result.how == "return":
            return End(rec.rank, "returned", at)
        if result.how == "exit":
            return End(rec.rank, "exited", at)
        how = "load_error" if result.how == "load_error" else "raised"
        return End(rec.rank, how, at, kind, place(last.get("line"), last.get("file")))
    if rec.inside is not None:
        return End(rec.rank, "blocked", at)
    exit_info = rec.exit or {}
    own = stop == "completed" or stop_rank == rec.rank   # not the grader stopping the run
    if exit_info.get("signal") is not None and own:
        return End(rec.rank, "killed", at, signal=exit_info.get("signal"))
    if exit_info.get("code") is not None and own:
        return End(rec.rank, "exited", at)
    return End(rec.rank, "running" if stop != "completed" else "unknown", at)
