"""The rubric: every check, in one place (name, points, visibility, world size, collective).

100 points: 10 static (the collectives are called at all) and 90 runtime (their results, per world size).
World size 2 is what students can check themselves; 3 and 4 are hidden until grades are published.
"""
from __future__ import annotations

from dataclasses import dataclass

VISIBLE_WORLD_SIZE = 2
HIDDEN_WORLD_SIZES = (3, 4)
GRADIENT_NUMEL = 1024      # each rank's gradient: 1024 values equal to rank + 1
FEATURE_NUMEL = 128        # each rank's feature slice: 128 values equal to rank


@dataclass(frozen=True)
class CheckSpec:
    id: str
    kind: str                  # "static" | "runtime"
    collective: str            # "all_reduce" | "all_gather"
    points: float
    hidden: bool = False       # hidden: no code, no expected values, shown after publication
    world_size: int | None = None

    @property
    def visibility(self) -> str:
        """Gradescope's visibility for this check."""
        return "after_published" if self.hidden else "visible"

    @property
    def quantity(self) -> str:
        return "gradient" if self.collective == "all_reduce" else "full_feature"


def _runtime(ws: int, hidden: bool) -> list[CheckSpec]:
    return [CheckSpec(f"ws{ws}.{name}", "runtime", name, 15, hidden, ws) for name in ("all_reduce", "all_gather")]


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("static.all_reduce", "static", "all_reduce", 5),
    CheckSpec("static.all_gather", "static", "all_gather", 5),
    *_runtime(VISIBLE_WORLD_SIZE, hidden=False),
    *(spec for ws in HIDDEN_WORLD_SIZES for spec in _runtime(ws, hidden=True)),
)
TOTAL = sum(c.points for c in CHECKS)
assert TOTAL == 100


def selected(include_hidden: bool) -> tuple[CheckSpec, ...]:
    return tuple(c for c in CHECKS if include_hidden or not c.hidden)


def world_sizes(checks) -> list[int]:
    return sorted({c.world_size for c in checks if c.world_size is not None})


def expected_gradient(ws: int) -> float:
    return sum(range(1, ws + 1)) / ws


def expected_feature(ws: int) -> list[float]:
    return [float(r) for r in range(ws) for _ in range(FEATURE_NUMEL)]
