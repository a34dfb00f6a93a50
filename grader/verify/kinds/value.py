"""The "value" kind: a quantity at a world size, right on every rank and derived from what the communication
delivered (each rank contributing its own data). The clean run says what the code computes (a wrong value,
with its causes; the reason a rank stopped); the perturbed run's proof says where right numbers came from.
A rank stopped only because another failed defers to the one that failed.
"""
from __future__ import annotations

import numpy as np

from ...exercise.spec import Check, Quantity
from ...model import CheckResult, Note, Outcome
from ...records import RankRecord, Stop
from .. import causes, diagnose, outcomes
from ..compare import all_close
from ..evidence import WorldSizeRuns, _tolerance  # noqa: F401  (the value's tolerance, as evidence compares it)
from ..observe import Value
from ..proof import Proof

NOT_COLLECTIVE_WORDS = {"local": "fail.not_collective", "derived": "fail.not_collective_derived",
                        "untraced": "fail.not_collective_untraced"}


def evaluate(judge, check: Check, runs: WorldSizeRuns) -> CheckResult:
    """One value check (a quantity at a world size), over every rank."""
    quantity = judge.exercise.quantity(check.quantity)
    run = runs.clean
    ops = _ops_used(quantity, runs, judge.exercise)
    # a rooted quantity has one contributor: its pass names it, not "every rank contributing its own data"
    passed = Note("pass.value_root", {"quantity": quantity.name, "ops": ops, "root": quantity.root}) \
        if quantity.combine == "root" else Note("pass.value", {"quantity": quantity.name, "ops": ops})
    if run is None:  # skipped: the perturbed run proved every rank's value
        return CheckResult(check, Outcome.PASS, check.points, [passed])
    if run.stop == Stop.GRADER_ERROR:
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": run.error or ""})])
    verdicts = []
    for record in run.ranks:
        verdicts.append(_rank_verdict(judge, quantity, runs, record))
    failed = [v for v in verdicts if v[1] is not Outcome.PASS]
    if not failed:
        return CheckResult(check, Outcome.PASS, check.points, [passed])
    # The check's verdict is the root cause: a rank stopped only because another failed defers to it.
    primary = [v for v in failed if not any(n.key == "fail.stopped" for n in v[2])] or failed
    outcome = primary[0][1]
    details = [d for _, _, _, rank_details in failed for d in rank_details]
    _drop_partial_unchanged(failed)
    notes = [n for _, _, rank_notes, _ in failed for n in rank_notes]
    mismatch = diagnose.mismatched_calls(run)
    if mismatch is not None and outcome is not Outcome.NOT_COLLECTIVE:
        notes.append(mismatch)
    for cause in (diagnose.blocked_in_send(run), diagnose.blocked_in_recv(run), diagnose.unmatched_receive(run),
                  *diagnose.p2p_mismatch(run), diagnose.group_name_conflict(run), diagnose.tag_mismatch(run),
                  causes.hardcoded_ranks(run, judge.source)):
        if cause is not None:
            notes.append(cause)
    for op in quantity.through:
        if diagnose.assigned_result(judge.source, op):
            notes.append(Note("cause.assigned_none", {"op": op}))
    return CheckResult(check, outcome, notes=_unique_causes(notes), details=details)


def _rank_verdict(judge, quantity: Quantity, runs: WorldSizeRuns, record: RankRecord):
    ws, run = runs.world_size, runs.clean
    value, from_snapshot = judge.value(record, quantity.name)
    outcome, detail = judge.judge_clean(quantity, value, ws, record.rank)
    right = outcome is Outcome.PASS   # the numbers are right (a verdict below may still fail them)
    failure = outcomes.rank_failure(run, record)
    notes: list[Note] = []
    details: list[Note] = []
    explained = False    # the value's causes (the exercise's included) are in notes
    label = {"rank": record.rank, "quantity": quantity.name}
    if outcome is Outcome.MISSING:
        if failure is not None:
            outcome, note = failure
            notes.append(note)
            details.extend(outcomes.last_call(record, note))
        elif record.result is not None and record.result.returned_type == "NoneType" and len(judge.exercise.quantities) == 1:
            notes.append(Note("fail.missing_none", {**label, "entry": judge.exercise.entry}))
        else:
            notes.append(Note("fail.missing", {**label, "entry": judge.exercise.entry,
                                               "names": [q.name for q in judge.exercise.quantities],
                                               "returned": record.result.returned_type if record.result is not None else "?"}))
    elif outcome is not Outcome.PASS:
        if failure is not None:  # a wrong value left behind by an exception: the exception is the news
            outcome, note = failure
            notes.append(note)
            details.extend(outcomes.last_call(record, note))
        if not from_snapshot:    # a snapshot is a value in the making: its numbers explain nothing
            others = {q.name: judge.value(record, q.name)[0] for q in judge.exercise.quantities}
            if detail in ("detail.values", "detail.shape", "detail.dtype", "detail.dtype_declared"):
                notes.extend(causes.value_causes(quantity, value, ws, record.rank, record, others,
                                                   judge.source, judge.exercise))
                explained = True
            # how the ranks' data combined, unless a generic cause already says it (weight 1 instead of
            # 1/N is "summed, not averaged", not "counted twice")
            if detail == "detail.values" and quantity.provenance and not any(n.key.startswith("cause.") for n in notes):
                notes.extend(_weights(judge, runs, quantity, record.rank))
            notes.append(Note(detail, {**label, "dtype": value.dtype, "dtypes": list(quantity.dtypes)}
                              if detail == "detail.dtype_declared" else label))
            details.append(rank_value(judge, quantity, ws, record.rank, value))
    elif quantity.provenance:
        proven, proof = judge.provenance(runs, quantity, record.rank)
        waiting = diagnose.read_without_wait(proof.calls if proof is not None else [])
        if proven and waiting is not None:
            outcome = Outcome.WRONG   # right by luck: the result of an un-waited operation may not have arrived
            notes.append(Note("fail.async_no_wait", {**label, "op": diagnose.op_name(waiting)}))
        elif proven is False and proof is not None and proof.finding is not None and proof.finding.key == "over_budget":
            outcome = Outcome.NOT_COLLECTIVE   # not proven within the grader's work for one value: nothing worse is known
            notes.append(Note("fail.over_budget", {**label, "ops": _ops_text(quantity), **proof.finding.params}))
        elif proven is False and "//" in judge.source and any(
                causes.floor_of_delivered(quantity, judge.value(p.ranks[record.rank], quantity.name)[0],
                                            p.ranks[record.rank], ws) for p in runs.perturbed):
            outcome = Outcome.WRONG   # right here by luck: the mean happens to be whole
            notes.append(Note("cause.floor_division", {"quantity": quantity.name}))
        elif proven is False and (proof is not None and proof.finding is not None
                                  and proof.finding.key in ("not_finite", "near_overflow")
                                  or judge._overflowed(runs, quantity, record.rank, ws)):
            # right in the clean run, but a sum so near its dtype's largest value that perturbed data takes
            # (or some draw would take) it past
            outcome = Outcome.NOT_COLLECTIVE
            notes.append(Note("fail.overflowed", {**label, "ops": _ops_text(quantity)}))
        elif proven is False and judge._dropped(runs, quantity, record.rank):
            # what its operations delivered was not kept (a benchmark loop beside it, as large as the answer's
            # own operations, used up the grader's budget for evidence): unproven, and nothing worse is known
            outcome = Outcome.NOT_COLLECTIVE
            notes.append(Note("fail.evidence_dropped", {**label, "ops": _ops_text(quantity)}))
        elif proven is False and (moved := diagnose.integer_moved(quantity, record)) is not None:
            outcome = Outcome.NOT_COLLECTIVE   # integers travel as sent: what they made proves nothing
            notes += [Note("fail.not_collective_unperturbed", {**label, "ops": _ops_text(quantity)}), moved]
            explained = True
        elif proven is False:
            outcome = Outcome.NOT_COLLECTIVE
            how = judge.how_computed(runs, quantity, record.rank)
            notes.append(Note(NOT_COLLECTIVE_WORDS[how], {**label, "ops": _ops_text(quantity)}))
            notes.extend(_why_clean(judge, runs, proof, quantity, how))
            notes.extend(_unproven_causes(judge, runs, quantity, record, how))
        elif proven is None and failure is not None:   # never observed, because the rank stopped
            outcome, note = failure
            notes.append(note)
            details.extend(outcomes.last_call(record, note))
        elif proven is None and (lost := next((r for r in runs.perturbed if r.stop == Stop.GRADER_ERROR), None)):
            outcome = Outcome.GRADER_ERROR   # the run that would have shown it could not be made: not the student's doing
            notes.append(Note("fail.grader_run", {"error": lost.error or ""}))
        elif proven is None:
            outcome = Outcome.NOT_COLLECTIVE
            notes.append(Note("fail.unobserved", {**label, "ops": _ops_text(quantity)}))
    if outcome is not Outcome.PASS:
        called = diagnose.call_causes(quantity, ws, record, run)
        notes.extend(called)
        # numbers read before their operation delivered them (never waited on) are whatever the buffer held: no
        # mistake of the exercise's is certain of them (causes.value_causes leaves them out too)
        explained = explained or outcome is Outcome.WRONG and any(n.key == "cause.async_no_wait" for n in called)
        # right numbers failed for how they were had (read before wait(), a whole mean floored): the note says
        # why; a mistake of the exercise's that leaves these numbers as they are is no cause of anything
        if not explained and not (right and outcome is Outcome.WRONG):
            others = {q.name: judge.value(record, q.name)[0] for q in judge.exercise.quantities}
            notes.extend(causes.exercise_causes(judge.exercise, quantity, value, ws, record, outcome, others))
    return record.rank, outcome, notes, details


def _unproven_causes(judge, runs: WorldSizeRuns, quantity: Quantity, record: RankRecord, how: str) -> list[Note]:
    """Why right numbers are not proven, where the run shows it for certain: the quantity's operations carried
    fewer elements on this rank than the quantity holds (one number all-reduced beside an answer computed on
    the rank); or, where it could not be traced (`how`), they delivered the rank the quantity's elements with
    the secret deltas, and the value stayed exactly the same (the result thrown away: a DDP step whose
    result was never read). ("local" says the second already.) Both only for a quantity made element by
    element of what was delivered (causes.elementwise): a step's output may rightly not follow every one of
    its operations (the forward activation does not follow the backward all-reduce)."""
    calls = [c for c in record.calls if c.completed and c.ok and c.op in quantity.through]
    little = causes.carried_too_little(quantity, runs.world_size, calls)
    if little is not None:
        return [little]
    if how == "untraced" and causes.elementwise(quantity) and \
            judge.follows(runs, quantity, record.rank) is False:
        ops = judge.delivered_evidence(runs, quantity, record.rank)
        if ops:
            return [Note("cause.result_unused", {"quantity": quantity.name, "ops": ops})]
    return []


def _weights(judge, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> list[Note]:
    """For a wrong value: what the perturbed run shows of how the ranks' data combined (a rank's data
    missing, or counted twice), when the value is otherwise made of what was delivered."""
    for run in runs.perturbed:
        value, snapshot = judge.value(run.ranks[rank], quantity.name)
        if snapshot or judge.shape_ok(quantity, value, runs.world_size)[0] is not Outcome.PASS:
            continue
        proof = judge.proof(run, quantity, rank)
        if proof is not None and proof.finding is not None and proof.finding.key == "weights":
            return _why(proof, quantity)
    return []


def _why_clean(judge, runs: WorldSizeRuns, proof: Proof | None, quantity: Quantity, how: str) -> list[Note]:
    """The tracer's finding for right numbers that are not proven, as the student may read it: with the
    clean run's values (a perturbed run's numbers are the grader's, not what the code computes), and only
    where it holds: a send blamed as not the rank's own data is left out where the clean run shows it was
    (the same numbers), or where another quantity through the same operation is proven on every rank
    (its proof says what each rank sent there was its own)."""
    if proof is None or proof.finding is None:
        return []
    finding, clean = proof.finding, runs.clean
    params = finding.params
    if finding.key == "not_delivered":
        rank, element = params.get("rank"), params.get("element")
        if clean is None or not isinstance(rank, int) or rank >= len(clean.ranks):
            return []
        data = judge.value(clean.ranks[rank], quantity.name)[0].data
        if data is None or not isinstance(element, int) or element >= data.size:
            return []
        key = "why.not_delivered" if how == "local" else "why.not_delivered_value"
        return [Note(key, {"quantity": quantity.name, "rank": rank, "element": element,
                           "value": float(data.reshape(-1)[element]), "ops": _ops_text(quantity)})]
    if finding.key == "contribution":
        rank, n, op = params.get("rank"), params.get("n"), params.get("op")
        if any(other.name != quantity.name and op in other.through and other.provenance and
               all(judge.provenance(runs, other, r)[0] for r in range(runs.world_size))
               for other in judge.exercise.quantities):
            return []
        calls = clean.ranks[rank].calls if clean is not None and isinstance(rank, int) and rank < len(clean.ranks) else []
        call = calls[n - 1] if isinstance(n, int) and 0 < n <= len(calls) and calls[n - 1].op == op else None
        if call is None:
            return []
        sent = np.concatenate([v for v in call.sent_values() if v is not None] or [np.zeros(0)])
        own = np.asarray(params.get("own") or [], dtype=np.float64)
        if not quantity.derived and own.size and sent.size >= own.size and all_close(sent[:own.size], own, "torch.float32"):
            return []
        notes = _why(proof, quantity)
        for note in notes:
            note.params["sent"] = diagnose.preview(sent)
        return notes
    return _why(proof, quantity)


def rank_value(judge, quantity: Quantity, ws: int, rank: int, value: Value | None) -> Note:
    """What was expected on this rank and what came back (visible checks only)."""
    if value is not None and value.kind in ("sequence", "other"):   # no shape, dtype or values to show
        return Note("detail.rank_value_other", {
            "rank": rank, "quantity": quantity.name, "expected_shape": str(quantity.expected_shape(ws)),
            "expected": diagnose.preview(quantity.expected_array(rank, ws)), "type": value.type or "?"})
    return Note("detail.rank_value", {
        "rank": rank, "quantity": quantity.name,
        "expected_shape": str(quantity.expected_shape(ws)), "expected": diagnose.preview(quantity.expected_array(rank, ws)),
        "shape": str(value.shape) if value else "-", "dtype": (value.dtype or "-") if value else "-",
        "values": diagnose.preview(value.data if value else None)})


def _ops_text(quantity: Quantity) -> list[str]:
    return list(quantity.through) or ["-"]


def _ops_used(quantity: Quantity, runs: WorldSizeRuns, exercise) -> list[str]:
    """The operations of `through` the ranks completed in the run that decides (what a passed check names:
    of an exercise that accepts several ways, the one the student took); where none of them completed, the
    forbidden ones that did (a value proven right through all_reduce where reduce_scatter was asked: the
    "uses" check fails it, and the pass names what it came through); all of `through` where none shows."""
    run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
    used = {c.op for rec in run.ranks for c in rec.calls if c.completed and c.ok} if run is not None else set()
    return [op for op in quantity.through if op in used] or [op for op in exercise.forbidden_ops if op in used] \
        or _ops_text(quantity)


def _why(proof: Proof | None, quantity: Quantity) -> list[Note]:
    """The tracer's finding, as a cause the student can act on."""
    if proof is None or proof.finding is None:
        return []
    finding = proof.finding
    params = {"quantity": quantity.name, **{k: v for k, v in finding.params.items() if not isinstance(v, list)}}
    if finding.key == "contribution":
        params["sent"] = diagnose.preview(finding.params.get("sent"))
        params["own"] = diagnose.preview(finding.params.get("own"))
        # its own data is what it computes from what it received: no fixed values (a reference step's first
        # operation sends the rank's own data, as the step computes it before anything arrived)
        if quantity.derived and (quantity.combine != "reference" or finding.params.get("derived")):
            return [Note("why.contribution_derived", params)]
    if finding.key == "weights":
        params["missing"] = [str(s) for s in finding.params.get("missing") or []] or ["-"]
        params["twice"] = [str(s) for s in finding.params.get("twice") or []] or ["-"]
    return [Note(f"why.{finding.key}", params)]


def _unique_causes(notes: list[Note]) -> list[Note]:
    """Each cause once, whichever ranks it came from (rank-specific notes stay as they are)."""
    out, seen = [], set()
    for note in notes:
        if note.key.startswith(("cause.", "why.")) or ".cause." in note.key:  # the exercise's causes too
            marker = (note.key, tuple(sorted((k, str(v)) for k, v in note.params.items() if k not in ("rank", "line", "sent"))))
            if marker in seen:
                continue
            seen.add(marker)
        out.append(note)
    return out


def _drop_partial_unchanged(failed) -> None:
    """`cause.unchanged` (the operation's result was not used), and its kin, hold only if every rank whose
    value was examined kept its own input (divided by world_size, for `cause.own_data_divided`); one rank
    whose input happens to equal a wrong result proves nothing."""
    examined = [notes for _, _, notes, details in failed if details]
    for key in ("cause.unchanged", "cause.unchanged_p2p", "cause.own_data_divided"):
        if all(any(n.key == key for n in notes) for notes in examined):
            continue
        for notes in examined:
            notes[:] = [n for n in notes if n.key != key]
