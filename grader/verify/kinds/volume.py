"""The "volume" kind: the dtype each of an operation's calls carried and the bytes a rank sent in them (the
all-reduce moved float16: half the bytes of float32), as the switch measured them."""
from __future__ import annotations

import math

from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from ...wire import element_size
from ..diagnose import at, op_name
from .measured import _judged, _named

def evaluate(judge, check: Check, runs) -> CheckResult:
    return _judged(judge, check, runs, lambda run, complete, carried: _volume(judge, check, run, carried))


def _volume(judge, check: Check, run, carried) -> CheckResult:
    """Every call of `op` that carried the quantity's elements (measured.Carried), each in the dtype it
    travelled in: a quantity split into a float16 part and a float32 tail is weighed whole."""
    p, n = check.params, run.request.world_size
    allowed = tuple(p["dtypes"])
    elements = math.prod(judge.exercise.quantity(check.quantity).expected_shape(n))
    bound = int(p["bytes"](n, elements)) if callable(p.get("bytes")) else elements * min(element_size(d) for d in allowed)
    notes, details, most, carried_dtypes = [], [], 0, set()
    for rec in run.ranks:
        calls = [c for c in carried.calls(run, rec, check.op) if c.sends]
        sent = sum(c.sent_bytes for c in calls)
        most = max(most, sent)
        carried_dtypes |= {d for c in calls for d in c.sent_dtypes}
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
    # the dtypes the switch saw (what this code sent), not every one the exercise would have allowed
    return CheckResult(check, Outcome.PASS, check.points, [Note("pass.volume", {"op": check.op, "dtypes": sorted(carried_dtypes),
                                                                                "sent": most, "bound": bound})])
