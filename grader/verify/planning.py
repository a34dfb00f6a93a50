"""What the planner asks of the runs made so far (grader/plan.py): whether a perturbed run alone decides its
world size (`proven`), whether it is that world size's clean run too (`untouched`), which operations to perturb
alone (`unobserved`), whether a real-backend run matters (`passes_any`, `ran_cleanly`).
"""
from __future__ import annotations

from ..exercise.spec import Exercise
from ..model import Outcome
from ..records import RunOutcome, Stop
from . import diagnose, outcomes
from .evidence import WorldSizeRuns


def proven(judge, run: RunOutcome) -> bool:
    """The perturbed run alone proves every provenance quantity on every rank, and no rank failed:
    the clean run of this world size would only repeat the verdict, so the grader skips it.
    Where the student's own checks failed (the perturbed data fails an assert of the expected values by
    design; the run records it and goes on), the values as they stood at each failed check must be proven
    too: a clean run would have stopped there, with those values, if the check failed there as well, and
    otherwise gone on as this run did."""
    if run.stop != Stop.COMPLETED:
        return False
    for record in run.ranks:
        if outcomes.rank_failure(run, record) is not None or record.checks_dropped:
            return False
        for quantity in judge.exercise.quantities:
            if not quantity.provenance:
                return False
            for check in [None, *range(len(record.checks))]:
                proof = judge.proof(run, quantity, record.rank, check)
                if proof is None or not proof.ok or proof.rounded:   # (rounded: its clean run decides the value)
                    return False
                if diagnose.read_without_wait(proof.calls) is not None:
                    return False
    return True


def untouched(run: RunOutcome) -> bool:
    """No operation of this perturbed run delivered anything to any rank before the run ended (a stub's
    NotImplementedError, a load error, a hang or a deadlock before the first delivery). The perturbation
    is only ever in what the switch delivers, and a rank cannot tell a perturbed run from a clean one
    otherwise (its spec is the same), so the code ran as it would in the clean run: this run serves as
    that world size's clean run. Only where every rank got as far as the student's code, and none of its
    own checks failed (a perturbed run records them and goes on, where a clean run stops): a rank that
    failed while the grader set it up gets its clean run, a second chance."""
    return run.stop != Stop.GRADER_ERROR and bool(run.ranks) and all(record.ready for record in run.ranks) and \
        not any(record.checks or record.checks_dropped for record in run.ranks) and \
        not any(call.completed and call.receives for record in run.ranks for call in record.calls)


def unobserved(judge, runs: WorldSizeRuns) -> list[tuple[str, ...]]:
    """Operations to perturb alone, for quantities whose clean value is right but which no perturbed
    run could observe (an honest assert stopped it before the value was computed)."""
    wanted = []
    if runs.clean is None:
        return wanted
    if runs.clean.stop not in (Stop.COMPLETED, Stop.FAILFAST) and all(p.stop == runs.clean.stop for p in runs.perturbed):
        return wanted   # clean and perturbed runs ended alike (a time limit, say): perturbing less changes nothing
    for quantity in judge.exercise.quantities:
        if not quantity.provenance or not quantity.through:
            continue
        for record in runs.clean.ranks:
            value, _ = judge.value(record, quantity.name)
            if judge.judge_clean(quantity, value, runs.world_size, record.rank)[0] is not Outcome.PASS:
                continue
            if judge.provenance(runs, quantity, record.rank)[0] is None:
                if quantity.through not in wanted:
                    wanted.append(quantity.through)
                break
    return wanted

# -- checks


def ran_cleanly(judge, runs: WorldSizeRuns) -> bool:
    """The switch run that decides this world size (its clean run, else its perturbed run) ended with
    every rank done and none failing."""
    decided = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
    return decided is not None and judge.whole(decided)


def passes_any(judge, exercise: Exercise, runs: WorldSizeRuns) -> bool:
    """Some runtime check of this world size passes through the switch (a real-backend run matters)."""
    return any(judge.evaluate(c, runs).passed for c in exercise.checks
               if c.world_size == runs.world_size and c.kind != "static")
