"""Exercises: what one declares (spec.py, checked by validate.py; a reference step, reference.py; its mistakes,
mistakes.py; its lines in the report, teach.py), and where the engine finds them (registry.py)."""
from .mistakes import (Dtype, Failed, Mistake, NotOwn, NotRan, NotSent, Ran, Reduce, Representable, Right, SendsTo, Sent,
                       SentAs, Wrong)
from .kinds import KINDS, Kind
from .spec import Alternatives, Case, Check, Exercise, Linear, Quantity, Todo
from .teach import Teach
from .validate import DeclarationError

__all__ = ["KINDS", "Alternatives", "Case", "Check", "DeclarationError", "Dtype", "Exercise", "Failed", "Kind", "Linear", "Mistake",
           "NotOwn", "NotRan", "NotSent", "Quantity", "Ran", "Reduce", "Representable", "Right", "SendsTo", "Sent", "SentAs", "Wrong",
           "Teach", "Todo"]
