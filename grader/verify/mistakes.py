"""An exercise's table of mistakes (exercise/mistakes.py), matched against a rank whose check failed.

Each mistake is a value (the reference step with knobs turned, or a function of the rank and world size)
compared with the rank's value within the quantity's tolerance, or a regular expression its exception
matches; its conditions are facts of the rank's own run, read here from what the switch measured (which
operations completed, their reduce op, what the rank sent). Nothing of the exercise runs on a record.
"""
from __future__ import annotations

import re

import numpy as np

from ..exercise import reference
from ..exercise.mistakes import (Dtype, Failed, NotOwn, NotRan, NotSent, Ran, Reduce, Representable, Right, Sent, SendsTo, Wrong,
                                 SentAs)
from ..exercise.spec import Linear
from .linear import foreign_sends
from ..model import Note
from .compare import all_close


def _flat(values) -> np.ndarray:
    parts = [v for v in values if v is not None]
    return np.concatenate(parts) if parts else np.zeros(0)


def _scale(scale, ws: int) -> float:
    return {"N": float(ws), "1/N": 1.0 / ws}.get(scale, scale) if isinstance(scale, str) else float(scale)


def _sent(condition, rank: int, ws: int, done: list) -> tuple[bool, bool]:
    """(some call of the op sent data, one of them sent scale x one of the rank's own arrays)."""
    own = [np.asarray(a, dtype=np.float64).reshape(-1) for a in condition.own(rank, ws)]
    sent = [_flat(c.sent_values()) for c in done if c.op == condition.op and c.sends]
    sent = [v for v in sent if v.size and any(v.size >= o.size for o in own)]
    hit = any(np.allclose(v[:o.size], _scale(k, ws) * o, rtol=1e-4, atol=1e-6)
              for v in sent for o in own if v.size >= o.size for k in condition.scales)
    return bool(sent), hit


def _called_with(call, condition, ws: int) -> bool:
    if condition.sizes is None and not condition.uneven:
        return True
    sizes = [int(d.get("numel") or 0) for d in [*call.inputs, *call.outputs] if isinstance(d, dict)]
    listed = [int(d.get("numel") or 0) for d in call.inputs if isinstance(d, dict)]
    wanted = [int(n) for n in condition.sizes(ws)] if condition.sizes is not None else []
    return any(n in sizes for n in wanted) or (condition.uneven and len(listed) > 1 and len(set(listed)) > 1)


def _peer(call) -> int | None:
    peer = call.peer if call.peer is not None else call.source
    group = list(call.group or ())
    return None if peer is None else group[peer] if 0 <= peer < len(group) else peer


def _sent_as(exercise, knobs: dict, rank: int, ws: int, done: list) -> bool:
    try:
        expected = reference.sent(exercise.step, ws, **knobs)[rank]
    except Exception:  # noqa: BLE001  (a variant that cannot be made at this world size is no match)
        return False
    kinds = {kind for kind, _ in expected}
    mine = [_flat(c.sent_values()) for c in done if c.op in kinds and c.sends]
    return len(mine) == len(expected) and all(a.size == x.size and np.allclose(a, x, rtol=1e-5, atol=1e-6)
                                               for a, (_, x) in zip(mine, expected))


def holds(condition, rank: int, ws: int, calls: list, value, right: dict, quantity=None, exercise=None) -> bool:
    """Whether one condition holds of the rank's run (its calls as the switch recorded them) and value;
    `right`: whether each of the rank's quantities is right."""
    done = [c for c in calls if c.completed and c.ok]
    if isinstance(condition, SendsTo):
        peers = set(condition.peers(rank, ws))
        return any(_peer(c) in peers for c in calls if c.op == "send")
    if isinstance(condition, SentAs):
        return exercise is not None and exercise.step is not None and _sent_as(exercise, condition.knobs, rank, ws, done)
    if isinstance(condition, Ran):
        return any(c.op == condition.op for c in done)
    if isinstance(condition, NotRan):
        return not any(c.op == condition.op for c in done)
    if isinstance(condition, Failed):
        return any(c.op == condition.op and c.completed and not c.ok and _called_with(c, condition, ws) for c in calls)
    if isinstance(condition, Reduce):
        return any(c.op == condition.op and (c.reduce or "SUM") == condition.reduce for c in done)
    if isinstance(condition, NotSent):
        some, hit = _sent(condition, rank, ws, done)
        return some and not hit
    if isinstance(condition, Sent):
        return _sent(condition, rank, ws, done)[1]
    if isinstance(condition, NotOwn):
        if quantity is None or not isinstance(quantity.combine, Linear):
            return False
        own = quantity.combine.vectors(rank, ws)
        return bool(foreign_sends([c for c in calls if c.op == condition.op], own, own[0].size if own else 0))
    if isinstance(condition, Right):
        return bool(right.get(condition.quantity))
    if isinstance(condition, Wrong):
        return not right.get(condition.quantity)
    if isinstance(condition, Dtype):
        return getattr(value, "dtype", "") in condition.dtypes
    if isinstance(condition, Representable):
        data = getattr(value, "data", None)
        if data is None or condition.dtype != "torch.float16":
            return False
        return bool(np.array_equal(data, data.astype(np.float16).astype(np.float64)))
    return False


def _variants(exercise, mistake, name: str, rank: int, ws: int) -> list[np.ndarray]:
    """The values the mistake leaves on this rank: its value, or the reference step with each of its knobs."""
    out = []
    for knobs in ((mistake.knobs,) if isinstance(mistake.knobs, dict) else mistake.knobs) if mistake.knobs else (None,):
        try:
            value = reference.outcome(exercise.step, ws, **knobs)[rank].get(name) if knobs else mistake.value(rank, ws)
        except Exception:  # noqa: BLE001  (a variant that cannot be made at this world size is no match)
            continue
        if value is not None:
            out.append(np.asarray(value, dtype=np.float64).reshape(-1))
    return out


def _matches(data: np.ndarray, variant: np.ndarray, dtype: str) -> bool:
    """The value equals the variant where the variant says (NaN: any number will do there)."""
    if variant.size != data.size:
        return False
    known = ~np.isnan(variant)
    return bool(known.any()) and all_close(data[known], variant[known], dtype)


def named(exercise, quantity, value, ws: int, rank: int, calls: list, error: dict | None, wrong: bool,
          tolerance: str, right: dict) -> list[Note]:
    """The exercise's mistakes this rank shows for `quantity`: by its exception where it raised, by its value
    (or its shape) where the value is wrong, by conditions alone. `tolerance`: the dtype whose tolerance
    values are compared with; `right`: whether each of the rank's quantities is right."""
    message = str((error or {}).get("message") or "")
    wrong = wrong and not error      # a rank that raised left a value in the making: its error explains it
    found, by_value, fallback = [], [], []
    data = getattr(value, "data", None)
    for mistake in exercise.mistakes:
        if mistake.quantity not in (None, quantity.name):
            continue
        if mistake.ws is not None and not mistake.ws(ws):
            continue
        if not all(holds(c, rank, ws, calls, value, right, quantity, exercise) for c in mistake.when):
            continue
        if mistake.error is not None:
            if error and re.search(mistake.error, message):
                found.append(mistake)
        elif mistake.shape is not None:
            if wrong and list(getattr(value, "shape", None) or []) == [int(n) for n in mistake.shape(ws)]:
                found.append(mistake)
        elif mistake.test is not None or mistake.otherwise:
            try:
                hit = wrong and data is not None and (mistake.test is None or bool(mistake.test(data.reshape(-1), rank, ws)))
            except Exception:  # noqa: BLE001  (a test that cannot read these numbers names nothing)
                hit = False
            if hit:
                (fallback if mistake.otherwise else found).append(mistake)
        elif mistake.value is None and not mistake.knobs:
            found.append(mistake)
        elif wrong and data is not None:
            for variant in _variants(exercise, mistake, quantity.name, rank, ws):
                if mistake.upto is not None:
                    variant = variant.copy()
                    variant[max(0, int(mistake.upto(rank, ws))):] = np.nan
                if _matches(data.reshape(-1), variant, mistake.tolerance or tolerance):
                    by_value.append((mistake, variant))
                    break
    # mistakes that leave the same numbers: those whose tie conditions hold; where none does, those without any;
    # where every one has some and none holds, none of them (no cause is certain), unless they are one cause
    kept = []
    for mistake, variant in by_value:
        twins = [m for m, v in by_value if v.size == variant.size and np.allclose(v, variant, rtol=1e-9, atol=1e-12,
                                                                                  equal_nan=True)]
        if len(twins) > 1:
            preferred = [m for m in twins if m.tie and all(holds(c, rank, ws, calls, value, right, quantity, exercise) for c in m.tie)]
            preferred = preferred or [m for m in twins if not m.tie] or (twins if len({m.cause for m in twins}) == 1 else [])
            if mistake not in preferred:
                continue
        kept.append(mistake)
    out, seen = [], set()
    for mistake in found + kept + (fallback if not found and not kept else []):
        if mistake.cause not in seen:
            seen.add(mistake.cause)
            out.append(Note(f"{exercise.name}.{mistake.cause}", dict(mistake.params)))
    return out
