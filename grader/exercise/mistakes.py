"""The wrong answers an exercise names: a table of mistakes, each a variant of the right answer with its cause.

    Mistake("cause.not_divided", knobs={"divide": False})          # the reference step with a knob turned
    Mistake("cause.no_broadcast", quantity="total", value=lambda rank, ws: local_tensor(rank),
            when=(NotRan("broadcast"),))                            # a value, where the run shows a fact
    Mistake("cause.view_uneven", error=r"shape '\\[.*\\]' is invalid", ws=lambda ws: LENGTH % ws != 0)

A rank whose check failed is compared with every mistake of its quantity, within the quantity's tolerance
(verify/mistakes.py); each mistake whose value matches and whose conditions hold is named, in the
exercise's own words (`Exercise.messages[cause]`). Where several match the same value (at N = K, "not
divided by K" and "not divided by N" leave the same numbers), those whose `tie` conditions hold are kept
(where none holds, those with no tie conditions; where every one has some, none: no cause is certain). A mistake with `error` names the exception a rank raised instead of a value.

Conditions are facts the engine reads off the rank's own run (what ran, with which reduce op, what it
sent), never code the exercise runs on a record:
    Ran(op) / NotRan(op)        the rank completed (never completed) an operation `op`
    Failed(op, sizes, uneven)   a call of `op` failed (the grader, as gloo, refused it) that was called with
                                a tensor of one of sizes(ws) elements, or (uneven) a list of unequal sizes
    Reduce(op, "AVG")           the rank's `op` calls used that reduce op
    Sent(op, own, scales)       some `op` of the rank sent scale x one of own(rank, ws) (a list of arrays:
                                its data as the exercise defines it, in any of its honest forms; the first
                                elements of what was sent), within float32's rounding; scales: numbers, or
                                "N" / "1/N"
    NotSent(op, own, scales)    the rank's `op` calls sent something, never that
    NotOwn(op)                  (a Linear quantity) some `op` of the rank sent what is not a combination of its
                                own vectors and of what it was delivered before
    SendsTo(peers)              some point-to-point send of the rank goes to one of peers(rank, ws)
    SentAs(knobs)               the rank's sends are, one by one, those of the reference step with these knobs
    Right(quantity)             the rank's value of another quantity is right
    Wrong(quantity)             ... is not right (of the quantity itself: always, its check failed)
    Dtype("torch.float16", ...) the value's dtype is one of these
    Representable(dtype)        every number of the value is one of dtype's (float16 arithmetic, say)
A mistake with no value, knobs or error is named wherever its conditions hold for a rank whose check failed
(an operation the exercise forbids, say). `test(values, rank, ws)` matches a wrong value by a property of its
numbers (some ranks' data counted twice); `otherwise=True` names a wrong value no other mistake names. A value may hold NaN where any number will do (the padding);
`shape` matches the value's shape alone (the whole optimizer state kept on every rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .validate import caller, mistake


@dataclass(frozen=True)
class Ran:
    op: str


@dataclass(frozen=True)
class NotRan:
    op: str


@dataclass(frozen=True)
class Reduce:
    op: str
    reduce: str


@dataclass(frozen=True)
class Failed:
    op: str
    sizes: Callable[[int], object] | None = None   # sizes(ws): element counts of a tensor it was called with
    uneven: bool = False                           # or: a list of tensors of unequal sizes


@dataclass(frozen=True)
class Sent:
    op: str
    own: Callable[[int, int], object]
    scales: tuple = (1.0,)


class NotSent(Sent):
    """The rank's `op` calls sent something, never what Sent(op, own, scales) says."""


@dataclass(frozen=True)
class SendsTo:
    peers: Callable[[int, int], object]


@dataclass(frozen=True)
class SentAs:
    knobs: dict


@dataclass(frozen=True)
class NotOwn:
    op: str


@dataclass(frozen=True)
class Right:
    quantity: str


@dataclass(frozen=True)
class Wrong:
    quantity: str


@dataclass(frozen=True)
class Dtype:
    dtypes: tuple[str, ...]

    def __init__(self, *dtypes: str):
        object.__setattr__(self, "dtypes", tuple(dtypes))


@dataclass(frozen=True)
class Representable:
    dtype: str


CONDITIONS = (Ran, NotRan, Failed, Reduce, Sent, NotSent, NotOwn, SendsTo, SentAs, Right, Wrong, Dtype, Representable)


@dataclass(frozen=True)
class Mistake:
    """One wrong answer and its cause (a key of the exercise's messages)."""
    cause: str
    quantity: str | None = None                 # the quantity it shows in (None: any of the exercise's)
    knobs: dict | tuple = field(default_factory=dict)   # the reference step with these keyword arguments (a tuple
    #                                                      of dicts: any of these variants)
    value: Callable | None = None               # or the value itself: value(rank, ws)
    when: tuple = ()                            # conditions that must hold
    tie: tuple = ()                             # conditions that keep it among mistakes of the same value
    error: str | None = None                    # a regular expression the rank's exception matches instead
    shape: Callable | None = None               # or the value's shape alone: shape(ws)
    test: Callable | None = None                # or a property of the wrong value: test(values, rank, ws)
    otherwise: bool = False                     # or: a wrong value that no other mistake of the table names
    params: dict = field(default_factory=dict)  # values for the placeholders of its words
    ws: Callable[[int], bool] | None = None     # the world sizes where it can happen
    tolerance: str | None = None                # compared with this dtype's tolerance (default: the quantity's)
    upto: Callable | None = None                # compare the first upto(rank, ws) elements only (the rest: padding)
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", caller())
        mistake(self, CONDITIONS)
