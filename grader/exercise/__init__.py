"""Exercises: what one declares (spec.py), and where the engine finds them (registry.py)."""
from .spec import Alternatives, Check, Exercise, Quantity

__all__ = ["Alternatives", "Check", "Exercise", "Quantity"]
