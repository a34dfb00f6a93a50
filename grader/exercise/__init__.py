"""Exercises: what one declares (spec.py), and where the engine finds them (registry.py)."""
from .spec import Check, Exercise, Quantity

__all__ = ["Check", "Exercise", "Quantity"]
