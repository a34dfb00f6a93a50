"""The "groups" kind: which ranks each operation spans, nodes being blocks of consecutive ranks: what stays
inside a node, what crosses nodes and with how many ranks of each, in one operation and across the run."""
from __future__ import annotations

import math

from ...comm import OPS
from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from ..diagnose import at, op_name
from .measured import _judged, _named

def evaluate(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete, carried: _groups(judge, check, run, carried))


def _groups(judge, check: Check, run, carried) -> CheckResult:
    """The operations that carried the quantity's elements (measured.Carried): a barrier, or a collective of
    other data beside the answer, spans what it likes."""
    p, n = check.params, run.request.world_size
    node = int(p["node"])
    inside = set(p.get("inside") or ())
    quantity = judge.exercise.quantity(check.quantity)
    size = math.prod(quantity.expected_shape(n))
    notes, crossed = [], [0] * n
    first_send: dict[int, object] = {}   # rank -> its first send to another node
    first_recv: dict[int, object] = {}   # rank -> its first receive from another node
    used: set = set()
    for rec in run.ranks:
        for call in carried.calls(run, rec):
            if OPS.get(call.op) is None:
                continue
            used.add(call.op)
            nodes = sorted({r // node for r in call.group})
            if call.op in ("send", "recv"):
                peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else None
                if call.op == "send" and peer is not None and peer // node != rec.rank // node:
                    crossed[rec.rank] += call.sent_bytes
                    first_send.setdefault(rec.rank, call)
                elif call.op == "recv" and peer is not None and peer // node != rec.rank // node:
                    first_recv.setdefault(rec.rank, call)
                continue
            if len(nodes) > 1:
                crossed[rec.rank] += call.sent_bytes
            if call.op in inside and len(nodes) > 1 and not _named(notes, "cause.groups_inside"):
                notes.append(Note("cause.groups_inside", {"rank": rec.rank, "op": op_name(call), **at(call),
                                                          "ranks": list(call.group), "nodes": nodes}))
            per_node = max(sum(1 for r in call.group if r // node == k) for k in nodes)
            if len(nodes) > 1 and per_node > 1 and not _named(notes, "cause.groups_flat"):
                notes.append(Note("cause.groups_flat", {"rank": rec.rank, "op": op_name(call), **at(call),
                                                        "ranks": list(call.group), "k": per_node, "node": node}))
    # point to point: the ranks of one node that send to another node are as many as take part across nodes
    for k in sorted({r // node for r in first_send}):
        senders = sorted(r for r in first_send if r // node == k)
        if len(senders) > 1 and not _named(notes, "cause.groups_flat") and not _named(notes, "cause.groups_flat_p2p"):
            call = first_send[senders[1]]
            notes.append(Note("cause.groups_flat_p2p", {"rank": senders[1], "op": op_name(call), **at(call),
                                                        "ranks": senders, "k": len(senders), "node": node}))
    # ... and as many as receive from another node: a flat ring (0 -> 1 -> 2 -> 3 -> 0 over nodes {0, 1} and
    # {2, 3}) has one sender per node, but its other rank receives across nodes (3 -> 0)
    for k in sorted({r // node for r in (*first_send, *first_recv)}):
        senders = [r for r in sorted(first_send) if r // node == k]
        takers = [r for r in sorted(first_recv) if r // node == k and r not in senders]
        if senders and takers and not any(_named(notes, key) for key in ("cause.groups_flat", "cause.groups_flat_p2p")):
            call = first_recv[takers[0]]
            notes.append(Note("cause.groups_flat_p2p_crossed", {
                "rank": takers[0], "op": op_name(call), **at(call), "sender": senders[0], "node": node,
                "ranks": sorted({*senders, *takers})}))
            break
    # across the run: one rank per node in each operation is not enough (2-rank groups of every pair of ranks
    # are flat communication cut small). The ranks that exchange data across nodes, directly or through one
    # another's operations across nodes, are one per node: the leaders, or, a tensor split in parts, one set
    # of ranks per part, one rank per node in each, the sets kept apart
    linked = [] if _named(notes, "cause.groups_flat") or _named(notes, "cause.groups_flat_p2p") else _linked(run, node, carried)
    if linked:
        notes.append(Note("cause.groups_linked", {"op": linked[1].params["op"]}))   # the chain's first operation
    details = [Note("detail.groups", {"rank": r, "node": r // node, "crossed": crossed[r]}) for r in range(n)] + linked
    if notes:
        return CheckResult(check, Outcome.WRONG, notes=notes, details=details)
    leaders = [r for r in range(n) if crossed[r]]
    kept = sorted(inside & used)   # the operations it keeps inside a node that the code used (none: point to point)
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.groups" if kept else "pass.groups_across", {
        "node": node, "nodes": n // node, "inside": kept, "crossed": sum(crossed),
        "leaders": [str(r) for r in leaders] or ["-"], "size": size})], details=details)


def _crossings(run, node: int, carried) -> list[tuple[tuple, dict]]:
    """Each operation that carried data across nodes, once: (its key, {global rank: that rank's call}), a
    collective with every member of its group, a point-to-point send with its sender and its peer."""
    ops: dict[tuple, dict] = {}
    for rec in run.ranks:
        for call in carried.calls(run, rec):
            if OPS.get(call.op) is None:
                continue
            if call.op == "recv":
                continue                                   # its send names the same link
            if call.op == "send":
                peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else None
                if peer is not None and peer // node != rec.rank // node:
                    ops[("send", rec.rank, call.seq)] = {rec.rank: call, peer: call}
                continue
            if len({r // node for r in call.group}) > 1:
                ops.setdefault(("collective", call.gname, tuple(call.group), call.index), {})[rec.rank] = call
    for key, members in ops.items():
        if key[0] == "collective":
            for r in key[2]:
                members.setdefault(r, None)                # a member whose call the run did not show still took part
    return list(ops.items())


def _linked(run, node: int, carried) -> list[Note]:
    """Two ranks of one node linked by what crossed nodes (the same set of ranks across nodes), as detail
    lines: the two ranks, then each operation along the shortest chain between them; [] when none."""
    crossings = _crossings(run, node, carried)
    touching: dict[int, list[int]] = {}
    for i, (_, members) in enumerate(crossings):
        for r in members:
            touching.setdefault(r, []).append(i)
    for a in sorted(touching):
        # breadth first from a, through operations across nodes: the first rank of a's node reached
        came, used = {a: None}, set()
        frontier = [a]
        while frontier:
            reached = []
            for r in frontier:
                for i in touching.get(r, ()):
                    if i in used:
                        continue
                    used.add(i)
                    for other in sorted(crossings[i][1]):
                        if other not in came:
                            came[other] = (r, i)
                            reached.append(other)
            b = next((r for r in reached if r // node == a // node), None)
            if b is not None:
                return _chain(crossings, came, a, b, node)
            frontier = reached
    return []


def _chain(crossings, came: dict, a: int, b: int, node: int) -> list[Note]:
    links, r = [], b
    while came[r] is not None:
        prev, i = came[r]
        links.append((prev, r, i))
        r = prev
    out = [Note("detail.groups_linked", {"a": a, "b": b, "node": a // node})]
    for prev, r, i in reversed(links):
        key, members = crossings[i]
        if key[0] == "send":
            sender = key[1]
            call = members[sender]
            out.append(Note("detail.groups_link_p2p", {"rank": sender, "op": op_name(call), **at(call),
                                                       "peer": r if sender == prev else prev}))
        else:
            mine = prev if members.get(prev) is not None else r
            call = members.get(mine) or next(c for c in members.values() if c is not None)
            out.append(Note("detail.groups_link", {"rank": call.rank, "op": op_name(call), **at(call),
                                                   "ranks": list(key[2]), "peer": r if call.rank == prev else prev}))
    return out
