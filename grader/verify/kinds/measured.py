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

from ...exercise.spec import Check
from ...model import CheckResult, Note, Outcome
from ...switch.perturb import perturbable


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


def _named(notes: list, key: str) -> bool:
    return any(n.key == key for n in notes)
