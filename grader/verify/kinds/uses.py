"""The "uses" kind: the quantities came through their operations, and no forbidden operation ran, in every
run of the world size (measured at the switch, which sees every operation between ranks).
"""
from __future__ import annotations

from ...records import Stop

from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from .. import causes, diagnose, outcomes
from ..evidence import WorldSizeRuns


def evaluate(judge, check: Check, runs: WorldSizeRuns) -> CheckResult:
    """The quantities came through their operations, and no forbidden operation ran: measured at the
    switch, where every operation between ranks passes (there is no group it does not see). "Came
    through" is evidence, not a call count: a quantity with the right numbers is proven from what its
    operations delivered, or at least follows that data; right numbers that stay the same when the
    grader changes the data in flight were computed without it (collectives on zeros, or on real data
    whose results are never read, beside a local answer). A wrong value is left to its own checks.
    The outcome says what happened: a forbidden operation, a rank that failed (so that an operation
    never completed), right numbers computed without the operations' data, or a wrong use."""
    run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
    if run is None or run.stop == Stop.GRADER_ERROR:
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
    forbidden = set(check.forbid or judge.exercise.forbidden)
    notes, outcome = [], Outcome.WRONG
    # every run of the world size counts (code that behaves one way where values are checked and another
    # where they are proven fails in the run that shows it): a forbidden operation in any of them, an
    # operation not used in the deciding run or in any other that ended with no rank failing
    measured = [m for m, _ in judge.measured_runs(runs, None)] or [run]
    for record in (rec for m in measured for rec in m.ranks):
        used = next((c for c in record.calls if c.op in forbidden), None)
        if used is not None:
            notes.append(Note("fail.forbidden_op", {"rank": record.rank, "op": diagnose.op_name(used),
                                                    **diagnose.at(used)}))
            notes += causes.forbidden_words(judge.exercise, used.op, diagnose.op_name(used))
            outcome = Outcome.FORBIDDEN
            break
    wanted = {op for q in judge.exercise.quantities for op in q.through}
    p2p = wanted & {"send", "recv"}
    unused = []
    for m in [run] + [m for m in measured if m is not run and judge.whole(m)]:
        # used means completed: point-to-point, a send and a receive that met (on some ranks: a root may
        # only receive); a collective, on every rank
        done = [c for rec in m.ranks for c in rec.calls if c.completed and c.ok]
        if p2p and not (any(c.op == "send" for c in done) and any(c.op == "recv" for c in done)):
            unused.append("/".join(sorted(p2p, reverse=True)))
        for op in sorted(wanted - p2p):
            if not all(any(c.op == op and c.completed and c.ok for c in rec.calls) for rec in m.ranks):
                unused.append(op)
        if unused:
            unused = list(dict.fromkeys(unused))
            break
    if unused:
        failures = [f for f in (outcomes.rank_failure(run, rec) for rec in run.ranks) if f is not None]
        failure = next((f for f in failures if f[1].key != "fail.stopped"), failures[0] if failures else None)
        if failure is not None:   # an operation never completed because a rank failed: that is the news
            notes.append(failure[1])
            if outcome is not Outcome.FORBIDDEN:
                outcome = failure[0]
        called = {c.op for rec in run.ranks for c in rec.calls}   # called, but none completed (a deadlock, say)
        notes += [Note("cause.op_not_completed" if called & set(op.split("/")) else "cause.op_not_used", {"op": op})
                  for op in unused]
    elif outcome is not Outcome.FORBIDDEN:
        notes += _not_through(judge, runs, wanted)
        if notes:
            outcome = Outcome.NOT_COLLECTIVE
    if notes:
        return CheckResult(check, outcome, notes=notes)
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.uses", {"ops": sorted(wanted)})])


def _not_through(judge, runs: WorldSizeRuns, wanted: set) -> list[Note]:
    """For each quantity that comes through the operations of a "uses" check: a rank whose value has the
    right numbers, is not proven, and stays exactly what it is in the clean run when the data in flight
    changes (a locally computed answer beside the operations)."""
    notes = []
    for quantity in judge.exercise.quantities:
        if not quantity.provenance or not set(quantity.through) & wanted:
            continue
        for record in runs.clean.ranks if runs.clean is not None else []:
            value, _ = judge.value(record, quantity.name)
            if judge.judge_clean(quantity, value, runs.world_size, record.rank)[0] is not Outcome.PASS:
                continue   # a wrong value: its own checks say what is wrong with it
            if judge.provenance(runs, quantity, record.rank)[0]:
                continue
            if judge.how_computed(runs, quantity, record.rank) == "local":
                notes.append(Note("cause.result_unused", {"quantity": quantity.name, "ops": list(quantity.through)}))
                break
    return notes
