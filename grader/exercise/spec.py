"""What an exercise declares: the whole of it is data the engine reads, never code the engine knows.

An exercise is a folder (`solutions/<name>/` beside its solution and notebook) holding `exercise.py`,
which defines `EXERCISE = Exercise(...)`:

    entry            the function every rank runs: entry(rank, world_size)
    quantities       what each rank ends with (returned, or kept as a local of the entry function):
                     each rank's own data for it (`local`), how the ranks' data combine into the
                     expected value (`combine`), and which operations it must come through (`through`)
    checks           every check: static (an operation reached / not used), a quantity's value at a
                     world size (right, and derived from what the communication delivered), the
                     operations used, or the traffic of point-to-point exchanges; points, visibility
    forbidden        operations the exercise does not allow (statically and at run time)
    messages         the exercise's own words (zh, en): titles, causes, hints; `cause.forbidden_<op>` says
                     why it does not allow <op> (shown where that op was used)

Values are plain Python or numpy (the supervisor never imports torch). Functions of (rank, world_size)
describe data; `diagnose` may add the exercise's own causes for a rank that failed a check (a wrong
value, an exception, right numbers that did not come through the communication).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

COMBINES = ("mean", "sum", "concat", "root", "own", "custom")


class Alternatives(tuple):
    """What `Quantity.local` returns when a rank's own data may be any of several arrays (two honest
    ways to compute it): Alternatives(a, b)."""

    def __new__(cls, *options):
        return super().__new__(cls, options)


@dataclass(frozen=True)
class Quantity:
    """One value each rank ends with.

    local(rank, ws)    that rank's own data for this quantity (what it must contribute)
    combine            how every rank's data make the expected value on each rank:
                       "mean" / "sum" (elementwise over ranks), "concat" (in rank order),
                       "root" (rank `root`'s data everywhere), "own" (each rank's own data: a state
                       it computes from what it received, with `local(rank, ws, ctx)`),
                       "custom" (`expected` alone says)
    through            operations (comm.OPS names) the value must have come through; () for none
    expected(rank, ws) overrides the value `combine` implies (needed for "custom")
    shape(ws)          the expected shape (default: a vector of the expected length)
    provenance         whether the value must be proven to come from what the communication
                       delivered (False: a state the rank keeps, checked for its value only)
    """
    name: str
    local: Callable[[int, int], Sequence[float]] | None = None
    combine: str = "custom"
    through: tuple[str, ...] = ()
    expected: Callable[[int, int], Sequence[float]] | None = None
    shape: Callable[[int], Sequence[int]] | None = None
    root: int = 0
    provenance: bool = True
    label: tuple[str, str] | None = None   # how feedback names it (zh, en); default: its name
    _expected: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        if self.combine not in COMBINES:
            raise ValueError(f"{self.name}: combine must be one of {COMBINES}")
        if self.combine != "custom" and self.local is None:
            raise ValueError(f"{self.name}: combine={self.combine!r} needs local(rank, ws)")
        if self.combine == "custom" and self.expected is None:
            raise ValueError(f"{self.name}: combine='custom' needs expected(rank, ws)")
        if self.combine == "own" and self.provenance and not self.uses_context:
            raise ValueError(f"{self.name}: combine='own' with provenance needs local(rank, ws, ctx)")

    @cached_property
    def uses_context(self) -> bool:
        """`local(rank, ws, ctx)`: the rank's own data depends on what it received (an optimizer step
        computed from reduce-scattered gradients, say); ctx is verify.observe.RunContext."""
        if self.local is None:
            return False
        try:
            return len(inspect.signature(self.local).parameters) >= 3
        except (TypeError, ValueError):
            return False

    def local_options(self, rank: int, ws: int, ctx=None) -> list[np.ndarray]:
        """The rank's own data: one array, or several when `local` returns Alternatives (any will do)."""
        value = self.local(rank, ws, ctx) if self.uses_context else self.local(rank, ws)
        options = list(value) if isinstance(value, Alternatives) else [value]
        return [np.asarray(v, dtype=np.float64).reshape(-1) for v in options]

    def local_array(self, rank: int, ws: int) -> np.ndarray:
        """The rank's own data as far as it can be told without a run (the first alternative)."""
        return self.local_options(rank, ws)[0] if not self.uses_context else np.zeros(0)

    def expected_array(self, rank: int, ws: int) -> np.ndarray:
        """What `rank` must hold at world size `ws` (computed once per pair: the exercise's functions are
        pure; read-only, so no reader can change it for the next)."""
        key = (rank, ws)
        if key not in self._expected:
            value = np.array(self._expected_array(rank, ws), dtype=np.float64).reshape(-1)
            value.setflags(write=False)
            self._expected[key] = value
        return self._expected[key]

    def _expected_array(self, rank: int, ws: int):
        if self.expected is not None:
            return self.expected(rank, ws)
        locals_ = [self.local_array(q, ws) for q in range(ws)]
        if self.combine == "mean":
            return np.mean(locals_, axis=0)
        if self.combine == "sum":
            return np.sum(locals_, axis=0)
        if self.combine == "concat":
            return np.concatenate(locals_)
        return locals_[rank if self.combine == "own" else self.root]

    def expected_shape(self, ws: int) -> list[int]:
        if self.shape is not None:
            return [int(n) for n in self.shape(ws)]
        return [int(self.expected_array(0, ws).size)]


@dataclass(frozen=True)
class Check:
    """One scored check.

    kind "static":   `op` is reached from the entry function (or, with `forbid`, none of them is)
         "value":    `quantity` at `world_size` is right on every rank and derived from what the
                     communication delivered (each rank contributing its own data)
         "uses":     at `world_size`, the quantities came through their operations and no forbidden
                     operation ran
         "traffic":  at `world_size`, point-to-point exchanges form the declared pattern (`params`)
    """
    id: str
    kind: str
    points: float
    title: tuple[str, str]                 # (zh, en); may use {ws}, {op}, {quantity}
    hidden: bool = False
    world_size: int | None = None
    quantity: str | None = None
    op: str | None = None
    forbid: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)

    @property
    def visibility(self) -> str:
        """Gradescope's visibility for this check."""
        return "after_published" if self.hidden else "visible"


@dataclass(frozen=True)
class Exercise:
    name: str
    title: tuple[str, str]
    quantities: tuple[Quantity, ...]
    checks: tuple[Check, ...]
    entry: str = "run_worker"
    defines: tuple[str, ...] = ()          # top-level functions a submission of this exercise defines
    forbidden: tuple[str, ...] = ()        # operations not allowed (statically and at run time)
    messages: dict = field(default_factory=dict)   # key -> (zh, en): the exercise's own words
    todo: tuple[str, str] = ("", "")       # what the stub's NotImplementedError asks for (zh, en)
    diagnose: Callable | None = None       # (quantity, values, ws, rank, context) -> [(key, params)];
    #                                        context: calls, value, outcome, error (verify/diagnose.exercise_causes)
    teach: Callable | None = None          # (run, ctx) -> [(key, params)]: the exercise's own lines in the
    #                                        report's communication section (verify/teach.exercise_notes)
    files: tuple[str, ...] = ()            # file stems a submission of this exercise is usually called
    folder: str = ""                       # where the exercise was loaded from (set by the registry)

    def quantity(self, name: str) -> Quantity:
        return next(q for q in self.quantities if q.name == name)

    @property
    def total(self) -> float:
        return sum(c.points for c in self.checks)

    def selected(self, include_hidden: bool) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if include_hidden or not c.hidden)

    @property
    def visible_world_sizes(self) -> list[int]:
        return sorted({c.world_size for c in self.checks if c.world_size and not c.hidden})

    def world_sizes(self, checks) -> list[int]:
        return sorted({c.world_size for c in checks if c.world_size is not None})

    def rubric_key(self) -> str:
        """Changes whenever a check's id or points change (batch results are reused only if equal)."""
        return self.name + ":" + ",".join(f"{c.id}:{c.points:g}" for c in self.checks)
