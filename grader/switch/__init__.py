"""The grader's switch: the only channel between a run's ranks (core.py), what each operation does (ops.py),
the secret perturbation (perturb.py), and the record of what it measured (record.py)."""
from .core import MAX_OPS, MAX_OUTPUT, ProtocolError, Switch, TrafficLimit
from .record import Call, Piece

__all__ = ["MAX_OPS", "MAX_OUTPUT", "Call", "Piece", "ProtocolError", "Switch", "TrafficLimit"]
