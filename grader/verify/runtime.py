"""Policy: decide each runtime check from the runs of one world size.

Per world size the grader makes a perturbed run (see perturb.py) and, unless that run alone proves every
value (proven_by_perturbed), a clean run. A check passes when,
on every rank, the clean value is right (shape, floating dtype, values) *and* the perturbed value moved
by exactly the shift the secret deltas imply *and* it is what that collective call produced (its output,
or for the gradient that output / world_size). Numbers computed locally cannot move; local numbers plus a
probe collective on zeros move but are not the call's output: both score 0, even when the submission also
calls the collectives on throwaway tensors.

Honest code that asserts its own expected values raises in the perturbed run; that is expected there,
and its values are read from run_worker's locals at the exception (or at its last collective, when
another rank's exception left it waiting; a snapshot counts only for a quantity whose collective had
completed before it). Order of verdicts on a rank: no value (the reason it stopped), wrong type, wrong
value, an async_op collective never wait()ed (right by luck is still a race), not through the collective,
pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import diagnose

from . import perturb
from ..checks import FEATURE_NUMEL, GRADIENT_NUMEL, CheckSpec, expected_feature, expected_gradient
from .diagnose import FLOAT_DTYPES, all_close
from ..model import CheckResult, Note, Outcome
from ..processes.runner import RankRecord, RunOutcome

QUANTITIES = ("gradient", "full_feature")
FAMILY_OF = {"gradient": "all_reduce", "full_feature": "all_gather"}
FAMILY_OPS = {"all_reduce": ("all_reduce",), "all_gather": ("all_gather", "all_gather_into_tensor", "_all_gather_base")}


@dataclass
class WorldSizeRuns:
    world_size: int
    clean: RunOutcome | None          # None: skipped, the perturbed run alone proved every value
    perturbed: list[RunOutcome] = field(default_factory=list)  # the both-collectives run, then single ones


def expected(quantity: str, ws: int) -> list[float]:
    if quantity == "gradient":
        return [expected_gradient(ws)] * GRADIENT_NUMEL
    return expected_feature(ws)


def rank_values(record: RankRecord, names: dict | None = None) -> dict:
    """The gradient and full_feature a rank ended with: returned, else run_worker's final locals,
    else (killed while waiting in a collective) the locals it held when it entered that collective."""
    result = record.result
    if result is not None and result.get("how") == "return" and result.get("returned"):
        return result["returned"]
    if result is not None:
        pool = result.get("locals") or {}
        settled = QUANTITIES
    else:  # the snapshot taken as it entered its last collective: a quantity is final only if its own
        pool = record.snapshot or {}  # collective had already completed by then
        settled = [q for q in QUANTITIES if _completed_before_last_enter(record, FAMILY_OPS[FAMILY_OF[q]])]
    names = names or {}
    return {q: (pool.get(names.get(q, q)) or pool.get(q)) if q in settled else None for q in QUANTITIES}


def _completed_before_last_enter(record: RankRecord, ops: tuple[str, ...]) -> bool:
    last_enter = max((i for i, c in enumerate(record.calls) if c.get("t") == "enter"), default=-1)
    return any(c.get("t") == "exit" and c.get("ok") and c.get("op") in ops for c in record.calls[:max(last_enter, 0)])


def judge(desc: dict | None, quantity: str, ws: int) -> tuple[Outcome, str | None]:
    """Clean value against the exercise: (PASS, None) or (outcome, detail key)."""
    if desc is None:
        return Outcome.MISSING, None
    if desc.get("kind") != "tensor":
        return Outcome.BAD_TYPE, "detail.not_tensor"
    if not desc.get("plain"):
        return Outcome.BAD_TYPE, "detail.subclass"
    if desc.get("dtype") not in FLOAT_DTYPES:
        return Outcome.WRONG, "detail.dtype"
    if desc.get("shape") != diagnose.EXPECTED_SHAPES[quantity](ws):
        return Outcome.WRONG, "detail.shape"
    values = desc.get("values") or []
    if not all(isinstance(v, (int, float)) for v in values) or not all_close(values, expected(quantity, ws), desc["dtype"]):
        return Outcome.WRONG, "detail.values"
    return Outcome.PASS, None


# ------------------------------------------------------------------------------------------------
# Through the collective?

def _shift_ok(delta: list[float], shift: list[float], dtype: str) -> bool:
    tol = 6e-2 if dtype in ("torch.float16", "torch.bfloat16") else 1e-4
    return len(delta) == len(shift) and all(abs(d - s) <= tol + 1e-6 * abs(s) for d, s in zip(delta, shift))


def _enters(record: RankRecord, ops: tuple[str, ...]) -> list[dict]:
    return [c for c in record.calls if c.get("t") == "enter" and c.get("op") in ops]


def _pattern_of(call: dict, seed: int, key: str) -> list | None:
    arg = (call.get("args") or {}).get(key) or {}
    if "numel" not in arg:
        return None
    pat = perturb.pattern(seed, call["op"], call["n"], arg["numel"], arg.get("dtype", ""))
    return None if pat is None else perturb.expand(pat, arg["numel"])


def expected_shifts(run: RunOutcome, quantity: str) -> list[tuple[int, list[float]]]:
    """(call index, shift) for every shift the perturbation could have caused. For the gradient both the
    averaged shift (sum, then / world_size; or ReduceOp.AVG) and the plain sum (inputs divided first)."""
    ws = run.request.world_size
    seeds = run.request.seeds
    ops = FAMILY_OPS[FAMILY_OF[quantity]]
    per_rank = [_enters(rec, ops) for rec in run.ranks]
    shifts = []
    for k in range(min((len(calls) for calls in per_rank), default=0)):
        calls = [calls[k] for calls in per_rank]
        if quantity == "gradient":
            pats = [_pattern_of(c, seeds[r], "tensor") for r, c in enumerate(calls)]
            if any(p is None or len(p) < GRADIENT_NUMEL for p in pats):
                continue
            total = [sum(p[i] for p in pats) for i in range(GRADIENT_NUMEL)]
            shifts += [(k, [t / ws for t in total]), (k, total)]
        else:
            key = lambda c: "tensor" if c["op"] == "all_gather" else "input_tensor"  # noqa: E731
            pats = [_pattern_of(c, seeds[r], key(c)) for r, c in enumerate(calls)]
            if any(p is None or len(p) < FEATURE_NUMEL for p in pats):
                continue
            shifts.append((k, [v for p in pats for v in p[:FEATURE_NUMEL]]))
    return shifts


def _output_of(record: RankRecord, ops: tuple[str, ...], k: int) -> list[float] | None:
    """What the k-th call of the collective produced on this rank (logged in perturbed runs)."""
    enters = [c for c in record.calls if c.get("t") == "enter" and c.get("op") in ops]
    if k >= len(enters):
        return None
    op, n = enters[k]["op"], enters[k]["n"]
    for call in record.calls:
        if call.get("t") == "exit" and call.get("op") == op and call.get("n") == n and call.get("ok"):
            out = call.get("out")
            return [float(v) for v in out] if out else None
    return None


def _derived_from(moved: list[float], out: list[float] | None, quantity: str, ws: int, dtype: str) -> bool:
    """The value is the collective's output itself (or, for the gradient, that output / world_size)."""
    if out is None or len(out) < len(moved):
        return False
    out = out[: len(moved)]
    candidates = [out, [v / ws for v in out]] if quantity == "gradient" else [out]
    tol = 6e-2 if dtype in ("torch.float16", "torch.bfloat16") else 1e-4
    return any(all(abs(m - c) <= tol + 1e-5 * abs(c) for m, c in zip(moved, cand)) for cand in candidates)


def _perturbed_value(runs: WorldSizeRuns, quantity: str, rank: int, names: dict):
    """(run, value) from the first perturbed run that perturbed this quantity's collective and holds it."""
    family = FAMILY_OF[quantity]
    for run in runs.perturbed:
        if family not in (run.request.perturb or ()):
            continue
        if run.stop == "grader_error":
            continue
        desc = rank_values(run.ranks[rank], names).get(quantity)
        if desc is not None and desc.get("kind") == "tensor" and desc.get("plain"):
            return run, desc
    return None, None


def through_collective(runs: WorldSizeRuns, quantity: str, rank: int, clean_desc: dict, names: dict) -> bool | None:
    """True: the value moved with the perturbation. False: it did not. None: it could not be observed."""
    run, desc = _perturbed_value(runs, quantity, rank, names)
    if run is None:
        return None
    clean = [float(v) for v in clean_desc["values"]]
    return _moved_with(run, rank, quantity, desc, clean)


def _moved_with(run: RunOutcome, rank: int, quantity: str, desc: dict, base: list[float]) -> bool:
    """Two conditions: the value is `base` moved by a shift only the seeds explain, and it is what that
    collective call produced (so a probe collective on zeros, added to local numbers, does not count)."""
    moved = [float(v) for v in desc.get("values") or []]
    if len(moved) != len(base):
        return False
    delta = [m - b for m, b in zip(moved, base)]
    ops = FAMILY_OPS[FAMILY_OF[quantity]]
    ws, dtype = run.request.world_size, desc.get("dtype", "")
    return any(_shift_ok(delta, shift, dtype)
               and _derived_from(moved, _output_of(run.ranks[rank], ops, k), quantity, ws, dtype)
               for k, shift in expected_shifts(run, quantity))


def proven_by_perturbed(run: RunOutcome) -> bool:
    """Whether the perturbed run alone proves both quantities on every rank: each value is the exercise's
    answer moved by the seeds' shift, and it is its collective's output. Then the clean run of this world
    size would only repeat the verdict (PASS), and the grader skips it."""
    if run.stop == "grader_error" or set(run.request.perturb) != set(FAMILY_OPS):
        return False
    ws = run.request.world_size
    for rec in run.ranks:
        values = rank_values(rec)
        for quantity in QUANTITIES:
            desc = values.get(quantity)
            if desc is None or desc.get("kind") != "tensor" or not desc.get("plain"):
                return False
            if desc.get("dtype") not in FLOAT_DTYPES or desc.get("shape") != diagnose.EXPECTED_SHAPES[quantity](ws):
                return False
            if diagnose.async_without_wait(rec, FAMILY_OF[quantity]):
                return False
            if not _moved_with(run, rec.rank, quantity, desc, expected(quantity, ws)):
                return False
    return True


def missing_observations(runs: WorldSizeRuns) -> list[str]:
    """Collectives whose perturbed values no perturbed run holds yet, for clean values that are right."""
    wanted = []
    for quantity in QUANTITIES:
        for rec in runs.clean.ranks:
            names = (rec.result or {}).get("names") or {}
            clean_desc = rank_values(rec).get(quantity)
            if judge(clean_desc, quantity, runs.world_size)[0] is not Outcome.PASS:
                continue
            if _perturbed_value(runs, quantity, rec.rank, names)[0] is None:
                wanted.append(FAMILY_OF[quantity])
                break
    return wanted


# ------------------------------------------------------------------------------------------------

def evaluate(spec: CheckSpec, runs: WorldSizeRuns) -> CheckResult:
    """One runtime check (a world size and a collective), over every rank."""
    quantity, ws, run = spec.quantity, runs.world_size, runs.clean
    family = FAMILY_OF[quantity]
    if run is None:  # skipped because the perturbed run proved every rank's value (proven_by_perturbed)
        return CheckResult(spec, Outcome.PASS, score=spec.points, notes=[Note("pass.runtime", {"op": spec.collective})])
    if run.stop == "grader_error":
        return CheckResult(spec, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": run.error or ""})])
    verdicts: list[tuple[int, Outcome, list[Note], list[Note]]] = []
    for rec in run.ranks:
        names = (rec.result or {}).get("names") or {}
        desc = rank_values(rec).get(quantity)
        from_snapshot = rec.result is None   # never returned: what it held when it entered its last collective
        outcome, detail = judge(desc, quantity, ws)
        failure = diagnose.rank_failure(run, rec)
        notes: list[Note] = []
        details: list[Note] = []
        if outcome is Outcome.MISSING:
            if failure is not None:
                outcome, note = failure
                notes.append(note)
                details.extend(diagnose.last_collective(rec, note))
            else:
                notes.append(Note("fail.missing", {"rank": rec.rank, "quantity": quantity,
                                                   "returned": (rec.result or {}).get("returned_type", "?")}))
        elif outcome is not Outcome.PASS:
            if failure is not None:  # a wrong value left behind by an exception: the exception is the news
                outcome, note = failure
                notes.append(note)
                details.extend(diagnose.last_collective(rec, note))
            if not from_snapshot:    # a snapshot is a value in the making: its numbers explain nothing
                if detail in ("detail.values", "detail.shape", "detail.dtype"):
                    cause = (diagnose.wrong_gradient if quantity == "gradient" else diagnose.wrong_feature)(desc, ws, rec)
                    notes.extend(cause)
                notes.append(Note(detail, {"rank": rec.rank, "quantity": quantity}))
                details.append(_rank_value(rec.rank, quantity, ws, desc))
        elif diagnose.async_without_wait(rec, family):
            # right by luck: the result of an un-waited collective may not have arrived yet
            outcome = Outcome.WRONG
            notes.append(Note("fail.async_no_wait", {"rank": rec.rank, "op": family}))
        else:
            moved = through_collective(runs, quantity, rec.rank, desc, names)
            if moved is not True:
                outcome = Outcome.NOT_COLLECTIVE
                notes.append(Note("fail.not_collective" if moved is False else "fail.unobserved",
                                  {"rank": rec.rank, "op": family}))
        if outcome is not Outcome.PASS:
            notes.extend(diagnose.call_causes(rec, family, ws))
        verdicts.append((rec.rank, outcome, notes, details))

    failed = [v for v in verdicts if v[1] is not Outcome.PASS]
    if not failed:
        return CheckResult(spec, Outcome.PASS, score=spec.points, notes=[Note("pass.runtime", {"op": spec.collective})])
    # The check's verdict is the root cause: a rank stopped only because another one failed defers to it.
    primary = [v for v in failed if not any(n.key == "fail.stopped" for n in v[2])] or failed
    outcome = primary[0][1]
    details = [d for _, _, _, rank_details in failed for d in rank_details]
    _drop_partial_unchanged(failed)
    notes = [n for _, _, rank_notes, _ in failed for n in rank_notes]
    mismatch = diagnose.mismatched_calls(run)
    if mismatch is not None:
        notes.append(mismatch)
    if any(diagnose.async_without_wait(rec, family) for rec in run.ranks):
        notes.append(Note("cause.async_no_wait", {}))
    if diagnose.assigned_result(run.request.source, family):
        notes.append(Note("cause.assigned_none", {"op": family}))
    return CheckResult(spec, outcome, notes=_unique_causes(notes), details=details)


def _rank_value(rank: int, quantity: str, ws: int, desc: dict | None) -> Note:
    """What was expected on this rank and what came back (visible checks only)."""
    return Note("detail.rank_value", {
        "rank": rank, "quantity": quantity,
        "expected_shape": diagnose.EXPECTED_SHAPES[quantity](ws),
        "expected": diagnose.preview(expected(quantity, ws)),
        "shape": desc.get("shape") if desc else None, "dtype": desc.get("dtype") if desc else None,
        "values": diagnose.preview(desc.get("values") if desc else None)})


def _unique_causes(notes: list[Note]) -> list[Note]:
    """Each cause once, whichever ranks it came from (rank-specific notes stay as they are)."""
    out, seen = [], set()
    for note in notes:
        if note.key.startswith("cause."):
            marker = (note.key, tuple(sorted((k, str(v)) for k, v in note.params.items() if k != "rank")))
            if marker in seen:
                continue
            seen.add(marker)
        out.append(note)
    return out


def _drop_partial_unchanged(failed) -> None:
    """`cause.unchanged` (the collective's result was not used) holds only if every rank whose value was
    examined kept its own input; one rank whose input happens to equal a wrong result proves nothing."""
    examined = [notes for _, _, notes, details in failed if details]
    if all(any(n.key == "cause.unchanged" for n in notes) for notes in examined):
        return
    for notes in examined:
        notes[:] = [n for n in notes if n.key != "cause.unchanged"]
