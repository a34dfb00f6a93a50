"""Exercises: what one declares (spec.py, checked by validate.py), and where the engine finds them (registry.py)."""
from .spec import KINDS, Alternatives, Check, Exercise, Quantity, Todo
from .validate import DeclarationError

__all__ = ["KINDS", "Alternatives", "Check", "DeclarationError", "Exercise", "Quantity", "Todo"]
