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
where they are proven fails; too few calls count only where the run shows all a rank did. What is judged is
every operation that carried the quantity's elements, whatever its size and dtype (Carried: what the proofs
came through), so a quantity split across calls is weighed whole, each part in the dtype it travelled in;
an operation is left out only where it carried none of the quantity. Like traffic checks, these count for a
correct answer only: they pass when the check's quantity passes its value check at the same world size
(counts: when it names one), so a count or a volume next to a locally computed answer earns nothing. Causes name the figures; hidden
checks show their value-free variants (feedback/render.HIDDEN_VARIANTS).
"""
from __future__ import annotations

import numpy as np

from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from ...switch.perturb import perturbable
from ..proof import tolerance


def _data(call) -> bool:
    """The call carried floating data (a barrier carries none; integer, bool and byte tensors alone are
    torch's own control data where nothing proves otherwise: DDP's unused-parameter map, the sizes of the
    *_object collectives)."""
    dtypes = call.sent_dtypes + [str(d.get("dtype")) for d in call.delivered or ()] + [str(d.get("dtype")) for d in call.outputs or ()]
    return any(perturbable(d) for d in dtypes)


def _moved(call) -> bool:
    """The call carried elements, of any dtype (sent or delivered)."""
    return bool(call.sent_numel) or any(int(d.get("numel") or 0) for d in call.delivered or () if isinstance(d, dict))


def _signatures(calls) -> list[tuple[tuple, object]]:
    """Each completed call with what tells it apart in another run of the same code: its operation and
    group, how many of those came before it on the rank, and the sizes and dtypes it sent and was delivered."""
    seen: dict[tuple, int] = {}
    out = []
    for call in calls:
        key = (call.op, tuple(call.group))
        k = seen[key] = seen.get(key, -1) + 1
        out.append(((*key, k, call.sent_numel, tuple(call.sent_dtypes),
                     tuple((str(d.get("dtype")), int(d.get("numel") or 0)) for d in call.delivered or () if isinstance(d, dict))),
                    call))
    return out


def _holds(call, own: list, ws: int) -> bool:
    """Some floating tensor the call sent is a run of the rank's own data (1, 1/N or N times it, at any
    offset; two elements at least, unless the data is one element): the quantity, in a call whose result
    the value may never have read."""
    for sent, desc in zip(call.sent_values(), call.inputs):
        dtype = str(desc.get("dtype"))
        if sent is None or not sent.size or not perturbable(dtype):
            continue
        atol, rtol = tolerance(dtype)
        for local in own:
            if sent.size > local.size or (sent.size < 2 and local.size > 1):
                continue
            for scale in (1.0, 1.0 / ws, float(ws)):
                target = scale * local
                starts = np.flatnonzero(np.abs(target[:local.size - sent.size + 1] - sent[0]) <= atol + rtol * np.abs(sent[0]))
                for j in starts[:16]:
                    if np.all(np.abs(target[j:j + sent.size] - sent) <= atol + rtol * np.abs(target[j:j + sent.size])):
                        return True
    return False


class Carried:
    """Which operations carried a quantity's elements, in each run a check of measures judges (of the check's
    quantity, or of each of `params["quantities"]`: a run knows them where every one is proven).

    A perturbed run whose proofs hold on every rank knows it: the calls each proof came through (for a
    collective, with every member's call: what the others sent into it is the quantity too; for a receive,
    the send it got). Every other completed call of that run carried none of the quantity (a loss
    all-reduced for logging, DDP's int32 map of unused parameters, a warm-up of other data). In another run
    (the clean one, a run perturbing one operation) a call is left out only where its signature is one that
    a fully proven run left out and never counted, so a call that appears in one run only (code that tells
    the runs apart) is judged. A call no proof came through still carried the quantity where what the rank
    sent is its own data (a collective of it whose result was never read). Where no run proved the quantities
    on every rank (or no quantity is named), every call that carried floating data is judged."""

    def __init__(self, judge, runs, quantities: tuple):
        self.known: dict[int, set[int]] = {}     # id(run) -> ids of the calls that carried the quantities
        counted: dict[int, set] = {}
        left: dict[int, set] = {}
        for run in runs.perturbed if quantities else ():
            proofs = [judge.proof(run, quantity, rec.rank) for quantity in quantities for rec in run.ranks]
            if not run.ranks or not all(p is not None and p.ok for p in proofs):
                continue
            carried = set()
            for proof in proofs:
                for call in proof.calls:
                    carried.add(id(call))
                    carried.update(id(p) for p in call.partners.values())
            for rec in run.ranks:
                own = [a for q in quantities if q.local is not None and not q.derived
                       for a in q.local_options(rec.rank, len(run.ranks))]
                for signature, call in _signatures([c for c in rec.calls if c.completed and c.ok]):
                    if id(call) not in carried and _holds(call, own, len(run.ranks)):
                        carried.add(id(call))   # its own data, in a call no proof needed (a result never read)
                    (counted if id(call) in carried else left).setdefault(rec.rank, set()).add(signature)
            self.known[id(run)] = carried
        self.left = {rank: sigs - counted.get(rank, set()) for rank, sigs in left.items()}

    def calls(self, run, record, op: str | None = None) -> list:
        """The rank's completed calls (of `op`) that carried the quantity in `run`."""
        done = [c for c in record.calls if c.completed and c.ok]
        known = self.known.get(id(run))
        if known is not None:
            picked = [c for c in done if id(c) in known]
        elif not self.known:
            picked = [c for c in done if _data(c)]
        else:
            left = self.left.get(record.rank, set())
            picked = [c for signature, c in _signatures(done) if signature not in left and _moved(c)]
        return [c for c in picked if op is None or c.op == op]


def _needs_value(judge, check: Check, runs) -> CheckResult | None:
    """The check's quantity must pass its value check at this world size (None: it does, or none is named)."""
    if not check.quantity:
        return None
    values = judge.evaluate_value(Check(check.id, "value", 0, check.title, hidden=check.hidden,
                                        world_size=check.world_size, quantity=check.quantity), runs)
    if values.passed:
        return None
    if values.outcome is Outcome.GRADER_ERROR:   # the grader lost the run that shows it: its failure, said once
        return CheckResult(check, Outcome.GRADER_ERROR, notes=values.notes)
    return CheckResult(check, Outcome.WRONG, notes=[Note("cause.kind_needs_value", {"quantity": check.quantity})])


def _judged(judge, check: Check, runs, one) -> CheckResult:
    """`one(run, complete, carried)` on every run of the world size (Judge.measured_runs): the first that
    fails decides, so code that tells the runs apart fails in the run that shows it; else the first run's
    pass. `carried`: which calls carried the check's quantity (Carried)."""
    quantity = judge.exercise.quantity(check.quantity) if check.quantity else None
    measured = judge.measured_runs(runs, quantity)
    if not measured:
        run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[
            Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
    early = _needs_value(judge, check, runs)
    if early is not None:
        return early
    names = check.params.get("quantities") or ((check.quantity,) if check.quantity else ())
    carried = Carried(judge, runs, tuple(judge.exercise.quantity(name) for name in names))
    results = [one(run, complete, carried) for run, complete in measured]
    return next((r for r in results if not r.passed), results[0])


def _named(notes: list, key: str) -> bool:
    return any(n.key == key for n in notes)
