"""Turn results into words, in one language: shared by the text report, results.json and nbgrader."""
from __future__ import annotations

from ..exercise.kinds import KINDS
from ..model import CheckResult, GradingResult, Note, Outcome
from .messages import CATALOG, placeholders, render

HINTS = {
    Outcome.WRONG: "hint.wrong", Outcome.MISSING: "hint.missing", Outcome.BAD_TYPE: "hint.bad_type",
    Outcome.EXCEPTION: "hint.exception", Outcome.LOAD_ERROR: "hint.exception", Outcome.TIMEOUT: "hint.timeout",
    Outcome.DEADLOCK: "hint.deadlock", Outcome.NOT_COLLECTIVE: "hint.not_collective",
    Outcome.MEMORY_LIMIT: "hint.limit", Outcome.CPU_LIMIT: "hint.limit", Outcome.FILE_LIMIT: "hint.limit",
    Outcome.PROCESS_LIMIT: "hint.limit", Outcome.OUTPUT_LIMIT: "hint.limit", Outcome.CRASH: "hint.crash",
    Outcome.EARLY_EXIT: "hint.crash", Outcome.TODO: "hint.todo", Outcome.NOT_SUBMITTED: "hint.not_submitted",
    Outcome.SYNTAX_ERROR: "hint.not_submitted", Outcome.NO_ENTRY: "hint.not_submitted",
    Outcome.GRADER_ERROR: "hint.grader_error", Outcome.NOT_CALLED: "hint.wrong", Outcome.FORBIDDEN: "hint.forbidden",
    Outcome.NO_EXERCISE: "hint.not_submitted", Outcome.REAL_BACKEND: "hint.real_backend",
    Outcome.TRAFFIC_LIMIT: "hint.limit", Outcome.PROTOCOL: "hint.protocol",
}
# A communication check whose result was right but whose communication was not: its own words, not "wrong"
KIND_HINTS = {name: kind.hint for name, kind in KINDS.items() if kind.hint}   # each kind's (exercise/kinds.py)
NEEDS_VALUE = ("cause.kind_needs_value", "cause.traffic_needs_value")
# What a hidden check may show of a cause: only names (of quantities and operations), never values,
# lines or world sizes. Causes whose visible text carries values have a value-free variant, and so has the
# tracer's account of an unproven value (why.*): every cause teaches in a hidden check too.
SAFE_PARAMS = {"quantity", "op", "ops", "used", "other", "reduce", "formula"}   # used: op names; formula: "2(N-1)/N x S", never a number
HIDDEN_VARIANTS = {"cause.mismatch": "cause.mismatch_generic", "cause.other_op": "cause.other_op_generic",
                   "cause.group_name": "cause.group_name_generic", "cause.p2p_tag": "cause.p2p_tag_generic", "cause.contribution": "cause.contribution_hidden",
                   "cause.p2p_unmatched": "cause.p2p_unmatched_generic", "cause.p2p_too_long": "cause.p2p_too_long_generic",
                   "cause.p2p_too_short": "cause.p2p_too_short_generic", "cause.p2p_dtype": "cause.p2p_dtype_generic",
                   **{f"cause.{k}": f"cause.{k}_generic" for k in ("hardcoded_ws", "hardcoded_ws_ranks", "integer_dtype", "reduce_op",
                                                                  "isend_not_waited", "sent_not_finite", "sent_integer", "integer_moved",
                                                                  "sent_reinterpreted", "carried_too_little", "wrong_root")},
                   **{f"cause.{k}": f"cause.{k}_generic" for k in ("counts_more", "counts_fewer", "counts_all",
                                                                  "volume_dtype", "volume_bytes", "groups_inside",
                                                                  "groups_flat", "groups_flat_p2p", "groups_flat_p2p_crossed")},
                   # the tracer's account of an unproven value (why.*), in words with no value of the run
                   "why.contribution": "cause.contribution_hidden", "why.not_finite": "cause.not_finite",
                   "why.near_overflow": "cause.near_overflow",
                   "why.not_delivered_value": "cause.not_delivered_generic", "why.ambiguous": "cause.ambiguous_generic",
                   **{f"why.{k}": f"cause.{k}_generic" for k in ("contribution_derived", "weights", "not_delivered", "nonlinear",
                                                                "inconsistent", "replay_missing", "incomplete", "unmatched")},
                   **{f"cause.traffic_{k}": f"cause.traffic_{k}_generic"
                      for k in ("none", "gather", "peers", "not_neighbour", "direction", "same_side", "sends", "bytes", "whole",
                               "chunk", "dtype", "dtype_wider")}}


# Characters a terminal or a notebook acts on instead of showing: C0/C1 controls (ESC starts the ANSI sequences
# that clear a screen, move the cursor or recolour "FAIL" as "PASS"), and the bidirectional overrides that
# reorder what is shown. A rank's words (its output, an exception's message) may hold them: shown escaped.
_BIDI = {*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C}
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if c not in (0x0A, 0x09)}
_ESCAPED.update({c: f"\\u{c:04x}" for c in _BIDI})


def visible(text: str) -> str:
    """`text` with every control character (but newline and tab) and bidirectional override written as an
    escape (`\\x1b`, `\\u202e`), so that nothing in it acts on the terminal or notebook that shows it."""
    return text.translate(_ESCAPED)


def note(n: Note, lang: str) -> str:
    return visible(render(n.key, n.params, lang))


def words(pair, lang: str) -> str:
    return pair[0] if lang == "zh" else pair[1]


def title(result: CheckResult, lang: str, checks=None) -> str:
    """A check's title. A hidden one is numbered among the hidden checks of its quantity and names no
    world size (`checks`: every check of the grading, for the numbering)."""
    check = result.spec
    ws = "N" if check.hidden else check.world_size
    try:
        text = words(check.title, lang).format(ws=ws, op=check.op, quantity=check.quantity)
    except (KeyError, IndexError, ValueError):
        text = words(check.title, lang)
    if not check.hidden:
        return text
    hidden = [c for c in (checks or [check]) if c.hidden and c.kind == check.kind and c.quantity == check.quantity
              and c.title == check.title]
    n = hidden.index(check) + 1 if check in hidden else 1
    return render("title.hidden", {"n": n, "what": text}, lang)


def status(result: CheckResult, lang: str) -> str:
    return render("status.passed" if result.passed else "status.failed", {}, lang)


def hidden_safe(key: str) -> bool:
    """A cause a hidden check may show: it exists, and names nothing but quantities and operations."""
    if key not in CATALOG or ".cause." not in f".{key}":
        return False
    return placeholders(key) <= SAFE_PARAMS


def check_lines(result: CheckResult, lang: str) -> list[str]:
    """What a student may read about one check. Hidden checks: the verdict, a hint and named mistakes only."""
    if not result.spec.hidden:
        return [note(n, lang) for n in result.notes] + [note(n, lang) for n in result.details]
    if result.passed:
        return [status(result, lang)]
    hint = HINTS.get(result.outcome, "hint.wrong")
    if result.outcome == Outcome.WRONG and not any(n.key in NEEDS_VALUE for n in result.notes):
        hint = KIND_HINTS.get(result.spec.kind, hint)
    lines = [status(result, lang) + render("list.colon", {}, lang) + render(hint, {}, lang)]
    for n in result.notes:
        key = HIDDEN_VARIANTS.get(n.key, n.key)
        if hidden_safe(key):
            lines.append(render(key, {k: v for k, v in n.params.items() if k in SAFE_PARAMS}, lang))
    return list(dict.fromkeys(lines))


def checks_of(result: GradingResult):
    return [c.spec for c in result.checks]
