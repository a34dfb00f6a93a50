"""Policy: decide each runtime check of an exercise from the runs of one world size.

Per world size the grader makes a perturbed run (switch/perturb.py) and, unless that run alone proves every
value (planning.proven), a clean run. Each check is decided by the module its kind names in the one table of
kinds (exercise/kinds.py): a value check passes when, on every rank, the value has the expected shape and a
floating dtype and is proven from what the communication delivered in a perturbed run (which also proves it
right); when it is not, the clean run says what the code really computes. What the runs show is read through
Evidence (evidence.py); after the checks, the stronger evidence overrules (overrule.py).

Honest code that asserts its own expected values raises in the perturbed run; its values are read from the
entry function's locals at the exception (or at its last operation, when another rank's exception left it
waiting), so it still earns full marks.
"""
from __future__ import annotations

import importlib

from ..exercise.kinds import KINDS
from ..exercise.spec import Check, Exercise
from ..model import CheckResult, Note, Outcome
from ..records import RunOutcome
from . import budget, overrule, planning
from .evidence import Evidence, WorldSizeRuns
from .kinds import value


class Judge(Evidence):
    """Decides an exercise's runtime checks, and answers the planner (grader/plan.py)."""

    def evaluate(self, check: Check, runs: WorldSizeRuns) -> CheckResult:
        kind = KINDS.get(check.kind)
        if kind is None or kind.evaluator is None:
            return CheckResult(check, Outcome.GRADER_ERROR, notes=[
                Note("fail.grader_run", {"error": f"no evaluator for check kind {check.kind}"})])
        seconds = budget.CHECK_SECONDS + self.allowance(runs)   # the runs' views made (and counted) first
        with budget.spending(budget.Budget(seconds), self.work) as scope:
            try:
                return importlib.import_module(kind.evaluator).evaluate(self, check, runs)
            except budget.OverBudget as over:
                if over.scope is not scope:
                    raise
                # what the runs show could not be read within the grader's work for one check: not passed,
                # and nothing more is said of the code (budget.py)
                return CheckResult(check, Outcome.NOT_COLLECTIVE, notes=[
                    Note("fail.check_over_budget", {"seconds": round(scope.bound.seconds, 1)})])

    def evaluate_value(self, check: Check, runs: WorldSizeRuns) -> CheckResult:
        """A value check (the kinds that count for a correct answer only ask it of their quantity)."""
        return value.evaluate(self, check, runs)

    # -- what the planner asks
    def proven(self, run: RunOutcome) -> bool:
        return planning.proven(self, run)

    @staticmethod
    def untouched(run: RunOutcome) -> bool:
        return planning.untouched(run)

    def unobserved(self, runs: WorldSizeRuns) -> list[tuple[str, ...]]:
        return planning.unobserved(self, runs)

    def ran_cleanly(self, runs: WorldSizeRuns) -> bool:
        return planning.ran_cleanly(self, runs)

    def passes_any(self, exercise: Exercise, runs: WorldSizeRuns) -> bool:
        return planning.passes_any(self, exercise, runs)

    # -- after the checks: the stronger evidence
    def real_backend(self, results: list[CheckResult], runs: dict) -> None:
        overrule.real_backend(self, results, runs)

    def overrule_static(self, results: list[CheckResult], runs: dict) -> None:
        overrule.overrule_static(self, results, runs)
