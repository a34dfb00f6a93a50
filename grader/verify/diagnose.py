"""Name the cause of a failure in the student's terms, from what the switch recorded of a run: operations the
ranks called differently, every rank blocked in a send, a receive no send matched, an async result read before
its wait(), a collective's result assigned from its return value ...; and the small words every cause uses
(`at` a line, `op_name`, a `preview` of values). Verdicts are decided elsewhere (outcomes.py for how a rank
ended, kinds/ per check); why a value is wrong is causes.py.
"""
from __future__ import annotations

import ast
import functools

import numpy as np

from ..model import Note
from ..switch import Call
from ..switch.perturb import SUMS, perturbable
from ..records import How, RankRecord, RunOutcome, Stop



def preview(values, runs: int = 4) -> str:
    """The first values, run-length encoded: `[1.5 x1024]`, `[0 x128, 1 x128]`, `[3, 1, 2, ...]`."""
    if values is None or len(values) == 0:
        return "[]"
    groups: list = []
    for v in np.asarray(values, dtype=np.float64).reshape(-1)[:4096]:
        v = float(v)
        if groups and (groups[-1][0] == v or (np.isnan(v) and np.isnan(groups[-1][0]))):
            groups[-1][1] += 1
        else:
            if len(groups) == runs:
                groups.append(None)
                break
            groups.append([v, 1])
    shown = ", ".join("..." if g is None else (f"{g[0]:g} x{g[1]}" if g[1] > 1 else f"{g[0]:g}") for g in groups)
    return f"[{shown}]"


def at(call: Call) -> dict:
    """Where the student's code started an operation, as notes name it: its line, and the file when it is one
    a notebook cell wrote (feedback/lines.py places it in that cell)."""
    return {"line": call.line or "?", **({"file": call.file} if call.file else {})}


def op_name(call: Call | None) -> str:
    """The operation as the student wrote it: the public function they called, else the operation."""
    if call is None:
        return "-"
    return call.api or call.op


# ------------------------------------------------------------------------------------------------
# Why a rank stopped


# ------------------------------------------------------------------------------------------------
# Why a value is wrong


# ------------------------------------------------------------------------------------------------
# What the operations show, whatever became of the value

def _called_elsewhere(run: RunOutcome | None, rank: int, ops: set) -> bool:
    return run is not None and any(c.op in ops for rec in run.ranks if rec.rank != rank for c in rec.calls)


def integer_moved(quantity, record: RankRecord) -> Note | None:
    """The quantity came through operations that only move data (no sum), and each delivered this rank
    integer or bool tensors: the switch passes those on as sent (switch/perturb.py), so nothing made of them
    is evidence, whoever computed it. Said only then, as a fact about the grader and the fix: send floats."""
    calls = [c for c in record.calls if c.op in quantity.through and c.completed and c.ok and c.delivered]
    if not calls or any(c.op in SUMS or (c.api or "").endswith("_object") for c in calls):
        return None   # a sum is perturbed; an object's pickled bytes have a cause of their own (call_causes)
    dtypes = sorted({str(d.get("dtype")) for c in calls for d in c.delivered})
    if not dtypes or any(perturbable(d) for d in dtypes):
        return None
    return Note("cause.integer_moved", {"quantity": quantity.name, "op": op_name(calls[0]), **at(calls[0]),
                                        "dtype": ", ".join(dtypes)})


def call_causes(quantity, ws: int, record: RankRecord, run: RunOutcome | None = None) -> list[Note]:
    """What the rank's operations show. `run`: the rank's run, where another rank's calls tell a TODO left
    open (no rank calls the operation) from ranks that call different operations (cause.mismatch's)."""
    notes = []
    through = set(quantity.through)
    returned = record.how is How.RETURN   # a rank that stopped early says nothing of its ops
    # the quantity's operations never called, or called only on something smaller than the quantity (a
    # one-element all_reduce beside a reduce and a broadcast of the whole tensor)
    if returned and through and not through & {"send", "recv"} and \
            not any(c.op in through and _carries(c, quantity, ws, record.rank) for c in record.calls):
        others = [c for c in record.calls if c.op != "barrier" and not c.via and c.op not in through]   # not DDP's start-up broadcast
        # another operation in its place: one that carried data of this quantity's size, a send or a recv
        # included (the other ops may be another quantity's, with this one's TODO still open)
        carried = [c for c in others if _carries(c, quantity, ws, record.rank)]
        if carried:
            used = sorted({op_name(c) for c in carried})   # not another quantity's operation
            notes.append(Note("cause.other_op", {"quantity": quantity.name, "ops": list(quantity.through),
                                                  "used": used, **at(carried[0])}))
            rooted = next((c for c in carried if c.op in ("reduce", "gather")), None)
            if rooted is not None and not any(c.op in ("broadcast", "scatter") for c in carried):   # then passed on
                notes.append(Note("cause.rooted_op", {"op": op_name(rooted)}))
        elif not any(c.op in through for c in record.calls) and not any(c.via for c in record.calls) \
                and not _called_elsewhere(run, record.rank, through):
            # (with DDP, its all-reduce missing is no TODO left open; nor where another rank called it)
            notes.append(Note("cause.op_missing", {"quantity": quantity.name, "ops": list(quantity.through)}))
    for call in record.calls:
        if call.op in quantity.through and call.op in ("all_gather", "gather") and call.receives:
            count = len(call.outputs or [])
            if count > 1 and count != (len(call.group) if call.group else ws):   # a group's size, not the world's
                notes.append(Note("cause.gather_list_size", {"got": count, "op": op_name(call)}))
                break
        if call.error and "invalid output tensor list" in call.error:
            notes.append(Note("cause.gather_list_size", {"got": "?", "op": op_name(call)}))
            break
        if call.error and call.op == "all_gather" and call.device == "cpu" and len(call.outputs) == 1 \
                and call.inputs and call.outputs[0].get("shape") == [len(call.group), *call.inputs[0].get("shape", [])]:
            notes.append(Note("cause.stacked_output", {"op": op_name(call)}))
            break
    pickled = [c for c in record.calls if c.op in through and (c.api or "").endswith("_object")]
    if pickled and len(pickled) == len([c for c in record.calls if c.op in through and c.sends]):
        notes.append(Note("cause.object_collective", {"op": op_name(pickled[0])}))
    waiting = async_without_wait([c for c in record.calls if c.op in through])
    if waiting is not None and record.how is How.RETURN:
        notes.append(Note("cause.async_no_wait", {"op": op_name(waiting)}))
    return notes


def _carries(call: Call, quantity, ws: int, rank: int) -> bool:
    """The call sent or received as many elements as the quantity's own data or its value hold."""
    sizes = {int(quantity.expected_array(rank, ws).size)}
    if quantity.local is not None and not quantity.derived:
        sizes.add(int(quantity.local_array(rank, ws).size))
    moved = [call.sent_numel] + [int(d.get("numel") or 0) for d in call.outputs or []] + \
        [int(d.get("numel") or 0) for d in call.delivered or []]
    return bool(sizes & set(moved)) or sum(int(d.get("numel") or 0) for d in call.outputs or []) in sizes


def _signature(call: Call) -> str:
    """An operation as the ranks must agree on it: its name and the sizes it moves."""
    sizes = [str(int(d.get("numel") or 0)) for d in (call.inputs or [])] or [str(int(d.get("numel") or 0)) for d in (call.outputs or [])]
    return f"{op_name(call)}({', '.join(sizes)})"


def _own_fault_outside(run: RunOutcome, record: RankRecord) -> bool:
    result = record.result
    if result is not None and result.how in (How.RAISE, How.EXIT, How.LOAD_ERROR):
        return failed_call(record) is None
    return result is None and record.inside is None and run.stop == Stop.TIMEOUT


def mismatched_calls(run: RunOutcome) -> Note | None:
    """Ranks that called different collectives, or in a different order or size (gloo may pair them
    silently, hang, or abort). Not said when a rank stopped on its own mistake outside the collectives:
    then the other ranks' extra calls are a consequence, not the cause. Point-to-point operations
    differ by design between ranks and are left out."""
    # per group: its members' calls on it must agree (a rank outside a group makes none of its calls: the
    # leaders' all-reduce of a hierarchy is no mismatch for the ranks that are not leaders)
    per_group: dict = {}   # (name, ranks) -> rank -> its calls on that group, in order
    for rec in run.ranks:
        for c in rec.calls:
            if c.op not in ("send", "recv"):
                per_group.setdefault((c.gname, tuple(c.group)), {}).setdefault(rec.rank, []).append(_signature(c))
    candidates = []
    for (_, members), calls in per_group.items():
        pairs = [(r, tuple(calls.get(r, ()))) for r in members if 0 <= r < len(run.ranks)]
        if len({seq for _, seq in pairs}) > 1:
            candidates.append(pairs)
    if not candidates:
        return None
    # the group some member never called at all (a collective only some ranks call) before one whose members
    # merely stopped early (stuck in that call elsewhere), then the larger group
    differing = max(candidates, key=lambda pairs: (any(not seq for _, seq in pairs), len(pairs)))
    if any(_own_fault_outside(run, rec) for rec in run.ranks):
        return None
    if group_name_conflict(run) is not None:   # two groups under one name: the ranks that used it stopped there
        return None
    return Note("cause.mismatch", {"calls": [{"rank": r, "ops": list(seq)} for r, seq in differing]})


def blocked_in_send(run: RunOutcome) -> Note | None:
    """A deadlock where every rank waits in a send: gloo does not buffer sends, so a send completes only
    once its peer posts the receive."""
    if run.stop != Stop.DEADLOCK:
        return None
    waiting = [rec.inside for rec in run.ranks if not rec.finished]
    posted = any(c.op == "recv" and not c.completed for rec in run.ranks for c in rec.calls)
    if waiting and all(call is not None and call.op == "send" for call in waiting) and not posted:
        return Note("cause.all_blocked_in_send", {})
    return None


def blocked_in_recv(run: RunOutcome) -> Note | None:
    """A deadlock where every rank waits in a receive and no send is pending anywhere: each receives before it
    sends, so none ever sends."""
    if run.stop != Stop.DEADLOCK:
        return None
    waiting = [rec.inside for rec in run.ranks if not rec.finished]
    posted = any(c.op == "send" and not c.completed for rec in run.ranks for c in rec.calls)
    if len(waiting) > 1 and all(call is not None and call.op == "recv" for call in waiting) and not posted:
        return Note("cause.all_blocked_in_recv", {})
    return None


def global_peer(call: Call, peer: int | None) -> int | None:
    """A call's peer (a rank of its group) as a global rank."""
    if peer is None:
        return None
    return call.group[peer] if call.group and 0 <= peer < len(call.group) else peer


def p2p_mismatch(run: RunOutcome) -> list[Note]:
    """Messages that did not fit the receive buffer posted for them, as the switch measured them (it fails
    both calls and names the figures; gloo would abort the receiver, SIGABRT, or fill part of the buffer):
    the first of each kind."""
    found: dict[str, Note] = {}
    for rec in run.ranks:
        for call in rec.calls:
            facts = call.problem
            if call.op != "recv" or not facts or "receiver" not in facts:
                continue
            params = {"rank": facts["receiver"], "peer": facts["sender"], "sent": facts["sent"], "room": facts["room"]}
            if facts["sent"] > facts["room"]:
                found.setdefault("long", Note("cause.p2p_too_long", params))
            elif facts["sent"] < facts["room"]:
                found.setdefault("short", Note("cause.p2p_too_short", params))
            else:
                found.setdefault("dtype", Note("cause.p2p_dtype", {**params, "sent_dtype": facts["sent_dtype"],
                                                                   "room_dtype": facts["room_dtype"]}))
    return list(found.values())


def group_name_conflict(run: RunOutcome) -> Note | None:
    """Two groups of different ranks under one name, as the switch found them (verify: switch/core.py): torch
    numbers the groups a rank makes, so ranks that made different groups (new_group called only by the
    ranks in the group) name different groups alike, and gloo pairs their ranks up or hangs."""
    for rec in run.ranks:
        for call in rec.calls:
            facts = call.problem
            if facts and facts.get("kind") == "group_name":
                return Note("cause.group_name", {"rank": rec.rank, "op": op_name(call), **at(call),
                                                 "ranks": facts["ranks"], "other": facts["other"]})
    return None


def tag_mismatch(run: RunOutcome) -> Note | None:
    """A deadlock where a rank waits to receive from a peer whose send to it, also pending, carries another
    tag: a send pairs only with a receive of the same tag (and group)."""
    for rec, call, peer in _waiting_receives(run):
        for send in run.ranks[peer].calls:
            if send.op == "send" and not send.completed and global_peer(send, send.peer) == rec.rank \
                    and send.tag != call.tag and send.group == call.group:
                return Note("cause.p2p_tag", {"rank": rec.rank, "peer": peer, **at(call), "tag": call.tag,
                                              "sent_tag": send.tag})
    return None


def unmatched_receive(run: RunOutcome) -> Note | None:
    """A deadlock where a rank waits to receive from a peer that never sends to it (a wrong neighbour):
    receives posted and pending, but no send of that peer, pending or done, is addressed to this rank."""
    for rec, call, peer in _waiting_receives(run):
        sends = [c for c in run.ranks[peer].calls if c.op == "send"]
        to = sorted({global_peer(c, c.peer) for c in sends} - {None})
        # certain only of a peer that sends elsewhere: one that has sent nothing yet (blocked in its own
        # receive first, say) may still send here
        if to and not any(global_peer(c, c.peer) == rec.rank for c in sends):
            return Note("cause.p2p_unmatched", {"rank": rec.rank, "peer": peer, "to": [str(t) for t in to] or ["-"]})
    return None


def _waiting_receives(run: RunOutcome):
    """(rank record, receive, peer's global rank) of every receive still pending when the run deadlocked,
    from a peer that exists."""
    if run.stop != Stop.DEADLOCK:
        return
    for rec in run.ranks:
        for call in rec.calls:
            if call.op != "recv" or call.completed or call.peer is None:
                continue
            peer = global_peer(call, call.peer)
            if 0 <= peer < len(run.ranks):
                yield rec, call, peer


def async_without_wait(calls: list[Call]) -> Call | None:
    """An operation started with async_op=True whose handle was never waited on."""
    return next((c for c in calls if c.async_op and not c.waited), None)


def read_without_wait(calls: list[Call]) -> Call | None:
    """An operation started with async_op=True whose outputs the rank read (its handle's result()) without
    ever waiting: on gloo a race. One never read left the student's tensors as they were (the rank copies
    what was delivered only at wait(), is_completed() or a future), so nothing the rank holds came from it."""
    return next((c for c in calls if c.async_op and not c.waited and c.peeked), None)


@functools.lru_cache(maxsize=8)
def _assigned(source: str) -> tuple:
    from ..submission import static
    try:
        return tuple(static.assigned_results(ast.parse(source)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()


def assigned_result(source: str, op: str) -> list[int]:
    """Lines where the submission assigns what an in-place operation returns (None unless async_op)."""
    return [line for name, line in _assigned(source or "") if name == op]


def failed_call(record: RankRecord) -> Call | None:
    """The last operation of the rank, if it completed with an error (the exception came out of it)."""
    for call in reversed(record.calls):
        if call.completed and not call.ok:
            return call
        if call.completed:
            return None
    return None
