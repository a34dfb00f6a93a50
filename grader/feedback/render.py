"""Turn results into words, in one language: shared by the text report, results.json and nbgrader."""
from __future__ import annotations

from ..checks import CHECKS
from .messages import render
from ..model import CheckResult, Note, Outcome

HINTS = {
    Outcome.WRONG: "hint.wrong", Outcome.MISSING: "hint.missing", Outcome.BAD_TYPE: "hint.bad_type",
    Outcome.EXCEPTION: "hint.exception", Outcome.LOAD_ERROR: "hint.exception", Outcome.TIMEOUT: "hint.timeout",
    Outcome.DEADLOCK: "hint.deadlock", Outcome.NOT_COLLECTIVE: "hint.not_collective",
    Outcome.MEMORY_LIMIT: "hint.limit", Outcome.CPU_LIMIT: "hint.limit", Outcome.FILE_LIMIT: "hint.limit",
    Outcome.PROCESS_LIMIT: "hint.limit", Outcome.OUTPUT_LIMIT: "hint.limit", Outcome.CRASH: "hint.crash",
    Outcome.EARLY_EXIT: "hint.crash", Outcome.TODO: "hint.todo", Outcome.NOT_SUBMITTED: "hint.not_submitted",
    Outcome.SYNTAX_ERROR: "hint.not_submitted", Outcome.NO_ENTRY: "hint.not_submitted",
    Outcome.GRADER_ERROR: "hint.grader_error", Outcome.NOT_CALLED: "hint.wrong",
}
# Causes a hidden check may show: they name a mistake and carry no values.
SAFE_CAUSES = {"cause.summed_not_averaged", "cause.hardcoded_ws", "cause.reduce_not_all_reduce",
               "cause.integer_dtype", "cause.feature_integer_dtype", "cause.stack_not_cat", "cause.gather_list_size", "cause.shared_buffers",
               "cause.async_no_wait", "cause.assigned_none", "cause.unchanged", "cause.mismatch_generic"}
# Causes whose visible text carries values: hidden checks show this value-free variant instead.
HIDDEN_VARIANTS = {"cause.mismatch": "cause.mismatch_generic"}


def note(n: Note, lang: str) -> str:
    return render(n.key, n.params, lang)


def title(result: CheckResult, lang: str) -> str:
    spec = result.spec
    if spec.kind == "static":
        return render(f"title.static.{spec.collective}", {}, lang)
    if spec.hidden:  # the name must not reveal the hidden world sizes either
        n = [c for c in CHECKS if c.hidden and c.collective == spec.collective].index(spec) + 1
        return render(f"title.hidden_n.{spec.collective}", {"n": n}, lang)
    return render(f"title.runtime.{spec.collective}", {"ws": spec.world_size}, lang)


def status(result: CheckResult, lang: str) -> str:
    return render("status.passed" if result.passed else "status.failed", {}, lang)


def check_lines(result: CheckResult, lang: str) -> list[str]:
    """What a student may read about one check. Hidden checks: the verdict, a hint and named mistakes only."""
    if not result.spec.hidden:
        return [note(n, lang) for n in result.notes] + [note(n, lang) for n in result.details]
    if result.passed:
        return [status(result, lang)]
    lines = [status(result, lang) + ": " + render(HINTS.get(result.outcome, "hint.wrong"), {}, lang)]
    keys = [HIDDEN_VARIANTS.get(n.key, n.key) for n in result.notes]
    lines += [render(k, {"op": result.spec.collective}, lang) for k in keys if k in SAFE_CAUSES]
    return list(dict.fromkeys(lines))
