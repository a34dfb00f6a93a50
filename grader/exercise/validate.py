"""What a declaration must satisfy, checked when it is made (spec.py's __post_init__ calls these).

Every error is a DeclarationError: a catalog key with its values (feedback/messages.py, zh and en) and
`where`, the file and line of the declaration it is about: the first frame outside grader/exercise/
(and outside generated code), which is the instructor's `Check(...)`, `Quantity(...)` or `Exercise(...)`.
"""
from __future__ import annotations

import difflib
import inspect
import math
import os
import re
import sys

from ..comm import API_NAMES, OPS
from ..feedback.messages import render
from ..wire import DTYPES
from .reference import outcome

HERE = os.path.dirname(__file__) + os.sep
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class DeclarationError(ValueError):
    """A declaration that cannot work; `where` is (file, line) of the declaration."""

    def __init__(self, key: str, where: tuple[str, int] | None = None, **params):
        super().__init__(key)
        self.key, self.where, self.params = key, where, params

    def words(self) -> tuple[str, str]:
        return render(self.key, self.params, "zh"), render(self.key, self.params, "en")

    def __str__(self) -> str:
        place = f"{self.where[0]}:{self.where[1]}: " if self.where else ""
        return place + self.words()[1]


def caller() -> tuple[str, int] | None:
    """Where the declaration being made was written: the first frame outside this package."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(HERE) and not name.startswith("<"):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def is_words(value) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, str) for v in value)


def words(what: str, value, where) -> None:
    if not is_words(value):
        raise DeclarationError("declare.words", where, what=what, value=repr(value)[:80])
    zh, en = set(placeholders(value[0])), set(placeholders(value[1]))
    if zh != en:   # a reader of the other language would see the name in braces, or miss the value
        raise DeclarationError("declare.placeholders", where, what=what, zh=sorted(zh - en) or ["-"],
                               en=sorted(en - zh) or ["-"])


def placeholders(text: str) -> list[str]:
    """The names a message's words fill in: {name}, {name:g}, {name!r}."""
    return re.findall(r"\{(\w+)[^{}]*\}", text)


def _near(name) -> str | None:
    """The operation an unknown name most likely meant: a public function's (all_gather_into_tensor),
    the same letters without underscores (allreduce), or a close spelling."""
    if not isinstance(name, str):
        return None
    if f"torch.distributed.{name}" in API_NAMES:
        return API_NAMES[f"torch.distributed.{name}"]
    squashed = {op.replace("_", ""): op for op in OPS}
    if name.replace("_", "").lower() in squashed:
        return squashed[name.replace("_", "").lower()]
    close = difflib.get_close_matches(name, list(OPS), n=1, cutoff=0.6)
    return close[0] if close else None


def ops(what: str, names, where, single: bool = False) -> None:
    """Operation names (grader.comm.OPS): a tuple of them, or (single) one name or None."""
    if single:
        names = () if names is None else (names,)
    elif isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise DeclarationError("declare.not_tuple", where, what=what, value=repr(names)[:80])
    for name in names:
        if name not in OPS:
            near = _near(name)
            if near is not None:
                raise DeclarationError("declare.unknown_op_near", where, what=what, name=repr(name), near=near)
            raise DeclarationError("declare.unknown_op", where, what=what, name=repr(name), known=list(OPS))


def _fits(fn, n: int) -> bool | None:
    """Whether fn can be called with n positional arguments (None: its signature cannot be read)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in _POSITIONAL]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    keyword_required = [p for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is p.empty]
    return not keyword_required and len(required) <= n and (varargs or len(positional) >= n)


def signature(name: str, field: str, fn, call: tuple[str, ...], where) -> None:
    """A quantity's function must take exactly the positional arguments it is called with."""
    if not callable(fn):
        raise DeclarationError("declare.not_callable", where, name=name, field=field, value=repr(fn)[:80])
    if _fits(fn, len(call)) is False:
        sig = inspect.signature(fn)
        shown = str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                                return_annotation=sig.empty))
        if field == "local" and len(call) == 2 and _fits(fn, 3):
            raise DeclarationError("declare.local_wants_context", where, name=name, signature=shown)
        raise DeclarationError("declare.signature", where, name=name, field=field, signature=shown,
                               call=f"{field}({', '.join(call)})")


def world_size(check_id: str, value, where) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DeclarationError("declare.world_size", where, id=check_id, value=repr(value))


def points(check_id: str, value, where) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DeclarationError("declare.points", where, id=check_id, value=repr(value))


def needs(check, requirements: tuple[str, ...]) -> None:
    """Each requirement names a field the check must set ("op|forbid": one of them)."""
    for requirement in requirements:
        if not any(getattr(check, name) for name in requirement.split("|")):
            raise DeclarationError("declare.needs", check.where, id=check.id, kind=check.kind,
                                   field=requirement.replace("|", " / "))


def unique(what: str, names: list[str], places: list) -> None:
    seen = set()
    for name, where in zip(names, places):
        if name in seen:
            raise DeclarationError("declare.duplicate", where, what=what, name=name)
        seen.add(name)


def quantity_named(what: str, name, quantities, where) -> None:
    known = [q.name for q in quantities]
    if name is not None and name not in known:
        raise DeclarationError("declare.missing_quantity", where, what=what, name=repr(name), known=known or "-")


def dtypes(what: str, names, where) -> None:
    for name in names:
        if name not in DTYPES:
            raise DeclarationError("declare.dtype", where, what=what, value=repr(name), known="torch.float16, torch.float32, ...")


def step(exercise) -> None:
    """A reference step, where quantities are declared by one, runs on an ideal network at every world size
    the checks use and returns each of those quantities."""
    names = [q.name for q in exercise.quantities if q.combine == "reference"]
    if not names:
        return
    if not callable(exercise.step):
        raise DeclarationError("declare.needs_step", exercise.where, names=names)
    for ws in sorted({c.world_size for c in exercise.checks if c.world_size}) or [2]:
        try:
            out = outcome(exercise.step, ws)
        except Exception as err:  # noqa: BLE001  (any error of the instructor's step is reported as such)
            raise DeclarationError("declare.step_fails", _where_of(exercise.step, exercise.where), ws=ws,
                                   error=f"{type(err).__name__}: {err}") from None
        missing = [n for n in names if any(n not in values for values in out)]
        if missing:
            raise DeclarationError("declare.step_missing", _where_of(exercise.step, exercise.where), ws=ws, names=missing)


def _where_of(fn, default):
    code = getattr(fn, "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else default


def mistake(m, conditions) -> None:
    where = m.where
    if not isinstance(m.cause, str) or not m.cause.startswith("cause."):
        raise DeclarationError("declare.mistake_cause", where, value=repr(m.cause))
    given = [m.value is not None, bool(m.knobs), m.error is not None, m.shape is not None, m.test is not None]
    if sum(given) > 1 or not (any(given) or m.when or m.otherwise):
        raise DeclarationError("declare.mistake_kind", where, cause=m.cause)
    if m.error is not None:
        try:
            re.compile(m.error)
        except re.error as err:
            raise DeclarationError("declare.mistake_regex", where, cause=m.cause, error=str(err)) from None
    for condition in (*m.when, *m.tie):
        if not isinstance(condition, conditions):
            raise DeclarationError("declare.mistake_condition", where, cause=m.cause, value=repr(condition)[:80],
                                   known=[c.__name__ for c in conditions])


def mistakes(exercise) -> None:
    """Each mistake names a cause the exercise words, a quantity it has, and knobs its step takes."""
    for m in exercise.mistakes:
        if not hasattr(m, "cause") or not hasattr(m, "knobs"):
            raise DeclarationError("declare.items", exercise.where, what="Exercise.mistakes", kind="Mistake")
        if m.cause not in (exercise.messages or {}):
            raise DeclarationError("declare.mistake_words", m.where, cause=m.cause)
        # its words' placeholders are filled from its params alone: one it does not give would show as {name}
        missing = sorted(set(placeholders(exercise.messages[m.cause][1])) - set(m.params or {}))
        if missing:
            raise DeclarationError("declare.mistake_params", m.where, cause=m.cause, missing=missing)
        if m.quantity is not None:
            quantity_named("Mistake.quantity", m.quantity, exercise.quantities, m.where)
        if m.knobs:
            if exercise.step is None:
                raise DeclarationError("declare.needs_step", m.where, names=[m.cause])
            params = inspect.signature(exercise.step).parameters
            variants = (m.knobs,) if isinstance(m.knobs, dict) else tuple(m.knobs)
            if not all(isinstance(v, dict) for v in variants):
                raise DeclarationError("declare.mistake_knobs", m.where, cause=m.cause, unknown=[repr(m.knobs)[:60]],
                                       known=[p for p in list(params)[3:]])
            unknown = [k for v in variants for k in v if k not in params]
            if unknown:
                raise DeclarationError("declare.mistake_knobs", m.where, cause=m.cause, unknown=unknown,
                                       known=[p for p in list(params)[3:]])
