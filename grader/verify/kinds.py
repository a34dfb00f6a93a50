"""Policy for "counts", "volume" and "groups" checks: what the switch measured of a run's collectives, against
what the exercise declares (exercise/spec.py Check, its params).

    counts   how many times an operation completed, per rank or in all ("one all-reduce per K micro-batches":
             DDP's no_sync(), or accumulating by hand, against an all-reduce per micro-batch)
    volume   the dtype each of those operations carried and the bytes a rank sent in them ("the all-reduce
             moved float16: half the bytes of float32")
    groups   which ranks each operation spans, nodes being blocks of consecutive ranks: what stays inside a
             node, what crosses nodes and with how many ranks of each, in one operation and across the run:
             the ranks linked by operations across nodes, directly or through one another, are one per node
             ("reduce in the node, all-reduce across the leaders, broadcast in the node", against one flat
             all-reduce, or the same cut into 2-rank groups of every pair of ranks)

Every figure is the switch's, never a rank's word, and every run of the world size is judged (the clean and
the perturbed ones: Judge.measured_runs), so code that behaves one way where values are checked and another
where they are proven fails; too few calls count only where the run shows all a rank did. Like traffic checks, these count for a correct answer only:
they pass when the check's quantity passes its value check at the same world size (counts: when it names one),
so a count or a volume next to a locally computed answer earns nothing. Causes name the figures; hidden
checks show their value-free variants (feedback/render.HIDDEN_VARIANTS).
"""
from __future__ import annotations

import math

from ..comm import OPS
from ..exercise.spec import Check
from ..model import CheckResult, Note, Outcome
from ..switch.perturb import perturbable
from ..wire import element_size
from .diagnose import at, op_name


def _done(record, op: str) -> list:
    """The rank's completed calls of `op` that carried data: integer, bool and byte tensors alone are torch's
    own control data (DDP's unused-parameter map with find_unused_parameters, the sizes of the *_object
    collectives), and a barrier carries none: not a communication the exercise counts or weighs."""
    return [c for c in record.calls if c.op == op and c.completed and c.ok and _data(c)]


def _data(call) -> bool:
    dtypes = call.sent_dtypes + [str(d.get("dtype")) for d in call.delivered or ()] + [str(d.get("dtype")) for d in call.outputs or ()]
    return any(perturbable(d) for d in dtypes)


def _counted(record, check: Check) -> list:
    """The rank's calls of `check.op` that a counts or volume check judges: those that carried data, less the
    ones of fewer than `params["least"]` elements (a loss all-reduced for logging) while all of those
    together carry fewer than `least` (no quantity can travel in small calls that way)."""
    done, least = _done(record, check.op), int(check.params.get("least", 0))
    small = [c for c in done if _elements(c) < least]
    if small and sum(_elements(c) for c in small) < least:
        return [c for c in done if _elements(c) >= least]
    return done


def _elements(call) -> int:
    """The elements a call carried: what it sent, or (a receive only) what it was delivered."""
    sent = call.sent_numel
    return sent if sent else sum(int(d.get("numel") or 0) for d in call.delivered or () if isinstance(d, dict))


def _needs_value(judge, check: Check, runs) -> CheckResult | None:
    """The check's quantity must pass its value check at this world size (None: it does, or none is named)."""
    if not check.quantity:
        return None
    values = judge.evaluate_value(Check(check.id, "value", 0, check.title, hidden=check.hidden,
                                        world_size=check.world_size, quantity=check.quantity), runs)
    if values.passed:
        return None
    return CheckResult(check, Outcome.WRONG, notes=[Note("cause.kind_needs_value", {"quantity": check.quantity})])


def _judged(judge, check: Check, runs, one) -> CheckResult:
    """`one(run, complete)` on every run of the world size (Judge.measured_runs): the first that fails
    decides, so code that tells the runs apart fails in the run that shows it; else the first run's pass."""
    quantity = judge.exercise.quantity(check.quantity) if check.quantity else None
    measured = judge.measured_runs(runs, quantity)
    if not measured:
        run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[
            Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
    early = _needs_value(judge, check, runs)
    if early is not None:
        return early
    results = [one(run, complete) for run, complete in measured]
    return next((r for r in results if not r.passed), results[0])


def evaluate_counts(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete: _counts(check, run, complete))


def _counts(check: Check, run, complete: set) -> CheckResult:
    """Too many is judged on every rank; too few only on the ranks of `complete` (those whose run shows
    all they did: a rank stopped half-way has not yet made the calls it would have)."""
    p, n = check.params, run.request.world_size
    want = int(p["count"](n)) if callable(p["count"]) else int(p["count"])
    at_most = bool(p.get("at_most"))
    counts = [len(_counted(rec, check)) for rec in run.ranks]
    got = sum(counts) if p.get("per", "rank") == "all" else None
    details = [Note("detail.counts", {"rank": rec.rank, "op": check.op, "count": c}) for rec, c in zip(run.ranks, counts)]

    def bad(c, whole):
        return c > want or (not at_most and whole and c < want)
    if got is not None:
        if bad(got, len(complete) == n):
            return CheckResult(check, Outcome.WRONG, notes=[Note("cause.counts_all", {"op": check.op, "count": got,
                                                                                     "expected": want})], details=details)
    else:
        wrong = [(rec, c) for rec, c in zip(run.ranks, counts) if bad(c, rec.rank in complete)]
        if wrong:
            rec, c = max(wrong, key=lambda item: abs(item[1] - want))
            key = "cause.counts_more" if c > want else "cause.counts_fewer"
            return CheckResult(check, Outcome.WRONG, notes=[Note(key, {"rank": rec.rank, "op": check.op, "count": c,
                                                                       "expected": want})], details=details)
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.counts", {"op": check.op, "count": want,
                                                                                "at_most": at_most})])


def evaluate_volume(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete: _volume(judge, check, run))


def _volume(judge, check: Check, run) -> CheckResult:
    p, n = check.params, run.request.world_size
    allowed = tuple(p["dtypes"])
    elements = math.prod(judge.exercise.quantity(check.quantity).expected_shape(n))
    bound = int(p["bytes"](n, elements)) if callable(p.get("bytes")) else elements * min(element_size(d) for d in allowed)
    notes, details, most = [], [], 0
    for rec in run.ranks:
        calls = [c for c in _counted(rec, check) if c.sends]
        sent = sum(c.sent_bytes for c in calls)
        most = max(most, sent)
        details.append(Note("detail.volume", {"rank": rec.rank, "op": check.op, "count": len(calls), "sent": sent,
                                              "dtypes": sorted({d for c in calls for d in c.sent_dtypes}) or ["-"]}))
        other = next(((c, d) for c in calls for d in c.sent_dtypes if d not in allowed), None)
        if other is not None and not _named(notes, "cause.volume_dtype"):
            call, dtype = other
            notes.append(Note("cause.volume_dtype", {"rank": rec.rank, "op": op_name(call), **at(call), "dtype": dtype,
                                                     "allowed": list(allowed), "size": element_size(dtype),
                                                     "want": min(element_size(d) for d in allowed)}))
        if sent > bound and not _named(notes, "cause.volume_bytes"):
            notes.append(Note("cause.volume_bytes", {"rank": rec.rank, "op": check.op, "sent": sent, "bound": bound,
                                                     "count": len(calls)}))
    if notes:
        return CheckResult(check, Outcome.WRONG, notes=notes, details=details)
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.volume", {"op": check.op, "allowed": list(allowed),
                                                                                "sent": most, "bound": bound})])


def evaluate_groups(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete: _groups(judge, check, run))


def _groups(judge, check: Check, run) -> CheckResult:
    p, n = check.params, run.request.world_size
    node = int(p["node"])
    inside = set(p.get("inside") or ())
    quantity = judge.exercise.quantity(check.quantity)
    size = math.prod(quantity.expected_shape(n))
    notes, crossed = [], [0] * n
    first_send: dict[int, object] = {}   # rank -> its first send to another node
    for rec in run.ranks:
        for call in rec.calls:
            if not (call.completed and call.ok) or OPS.get(call.op) is None or not _data(call):
                continue
            nodes = sorted({r // node for r in call.group})
            if call.op in ("send", "recv"):
                peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else None
                if call.op == "send" and peer is not None and peer // node != rec.rank // node:
                    crossed[rec.rank] += call.sent_bytes
                    first_send.setdefault(rec.rank, call)
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
    # across the run: one rank per node in each operation is not enough (2-rank groups of every pair of ranks
    # are flat communication cut small). The ranks that exchange data across nodes, directly or through one
    # another's operations across nodes, are one per node: the leaders, or, a tensor split in parts, one set
    # of ranks per part, one rank per node in each, the sets kept apart
    linked = [] if _named(notes, "cause.groups_flat") or _named(notes, "cause.groups_flat_p2p") else _linked(run, node)
    if linked:
        notes.append(Note("cause.groups_linked", {"op": linked[1].params["op"]}))   # the chain's first operation
    details = [Note("detail.groups", {"rank": r, "node": r // node, "crossed": crossed[r]}) for r in range(n)] + linked
    if notes:
        return CheckResult(check, Outcome.WRONG, notes=notes, details=details)
    leaders = [r for r in range(n) if crossed[r]]
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.groups", {
        "node": node, "nodes": n // node, "inside": sorted(inside) or ["-"], "crossed": sum(crossed),
        "leaders": [str(r) for r in leaders] or ["-"], "size": size})], details=details)


def _crossings(run, node: int) -> list[tuple[tuple, dict]]:
    """Each operation that carried data across nodes, once: (its key, {global rank: that rank's call}), a
    collective with every member of its group, a point-to-point send with its sender and its peer."""
    ops: dict[tuple, dict] = {}
    for rec in run.ranks:
        for call in rec.calls:
            if not (call.completed and call.ok) or OPS.get(call.op) is None or not _data(call):
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


def _linked(run, node: int) -> list[Note]:
    """Two ranks of one node linked by what crossed nodes (the same set of ranks across nodes), as detail
    lines: the two ranks, then each operation along the shortest chain between them; [] when none."""
    crossings = _crossings(run, node)
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


def _named(notes: list, key: str) -> bool:
    return any(n.key == key for n in notes)


EVALUATE = {"counts": evaluate_counts, "volume": evaluate_volume, "groups": evaluate_groups}
