"""The "counts" kind: how many times an operation completed, per rank or in all (one all-reduce for K
micro-batches, against one per micro-batch), as the switch counted them."""
from __future__ import annotations

from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from .measured import _judged

def evaluate(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete, carried: _counts(check, run, complete, carried))


def _counts(check: Check, run, complete: set, carried) -> CheckResult:
    """Too many is judged on every rank; too few only on the ranks of `complete` (those whose run shows
    all they did: a rank stopped half-way has not yet made the calls it would have). What is counted: the
    calls of `op` that carried the quantity's elements (measured.Carried), whatever their size."""
    p, n = check.params, run.request.world_size
    want = int(p["count"](n)) if callable(p["count"]) else int(p["count"])
    at_most = bool(p.get("at_most"))
    counts = [len(carried.calls(run, rec, check.op)) for rec in run.ranks]
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
