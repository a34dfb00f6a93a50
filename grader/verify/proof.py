"""What a proof of provenance concludes: proven, or why not (`Finding`), and the operations the value came
through; and the tolerance values are compared with. Shared by the provers (provenance.py's tracer,
replay.py, linear.py), which the judge reads alike."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..switch import Call


@dataclass
class Finding:
    """Why a value is not proven: `key` names the reason (catalog `why.<key>`), `params` its specifics."""
    key: str
    params: dict = field(default_factory=dict)


@dataclass
class Proof:
    ok: bool
    finding: Finding | None = None
    calls: list[Call] = field(default_factory=list)    # the operations the value came through, in order
    rounded: bool = False   # traced only within the rounding of the value's half dtype: a clean run decides the value


def tolerance(dtype: str) -> tuple[float, float]:
    """(absolute, relative) tolerance for comparing values of this dtype."""
    if dtype in ("torch.float16", "torch.bfloat16"):
        return 2e-2, 2e-2
    return 1e-6, 2e-5
