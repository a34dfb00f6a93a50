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
    todo             what the stub's NotImplementedError stands for: one (zh, en) sentence, or Todo(...)s

Each declaration is checked when it is made (validate.py): a mistake is a DeclarationError naming the
file and line of the Check(...), Quantity(...), Todo(...) or Exercise(...) it is about.

Values are plain Python or numpy (the supervisor never imports torch). Functions of (rank, world_size)
describe data; `diagnose` may add the exercise's own causes for a rank that failed a check (a wrong
value, an exception, right numbers that did not come through the communication).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .kinds import KINDS, check_params
from .reference import outcome
import grader.exercise.validate as validate   # the module, not the package (which imports this one)
from .validate import DeclarationError

COMBINES = ("mean", "sum", "concat", "root", "own", "reference", "custom")



@dataclass(frozen=True)
class Linear:
    """A quantity that is a fixed combination of every rank's own vectors, whatever the operations in between:
    start(ws) + factor x weight(ws) x the sum over ranks q and vectors j of own(q, ws)[j]. Proven from what the
    all-reduces of a perturbed run delivered (verify/linear.py), whatever multiple each rank sent (1 / K, a loss
    scale, DDP's 1 / N) and however many all-reduces it took (one, one per vector, DDP's buckets): what a rank
    sent must be a combination of its own vectors and of what earlier all-reduces delivered to it."""
    own: Callable[[int, int], Sequence]
    weight: Callable[[int], float]
    start: Callable[[int], Sequence[float]] | None = None
    factor: float = 1.0

    def vectors(self, rank: int, ws: int) -> list[np.ndarray]:
        return [np.asarray(v, dtype=np.float64).reshape(-1) for v in self.own(rank, ws)]

    def value(self, ws: int, combination: np.ndarray) -> np.ndarray:
        start = np.asarray(self.start(ws), dtype=np.float64).reshape(-1) if self.start is not None else 0.0
        return start + self.factor * combination

    def expected(self, ws: int) -> np.ndarray:
        total = np.sum([v for q in range(ws) for v in self.vectors(q, ws)], axis=0)
        return self.value(ws, self.weight(ws) * total)


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
                       "root" (rank `root`'s data everywhere), "own" (each rank's own data: a state it
                       keeps, provenance=False), "reference" (what the exercise's reference step leaves on
                       that rank, exercise/reference.py: proven by replaying the step against the run),
                       Linear(...) (a fixed combination of every rank's own vectors, whatever operations
                       carried them: proven from what the all-reduces delivered), "custom" (`expected` alone)
    through            operations (comm.OPS names) the value must have come through; () for none
    expected(rank, ws) overrides the value `combine` implies (needed for "custom")
    shape(ws)          the expected shape (default: a vector of the expected length)
    provenance         whether the value must be proven to come from what the communication
                       delivered (False: a state the rank keeps, checked for its value only)
    tolerance          the dtype whose tolerance values are compared with ("torch.float16": a float32 value
                       computed from float16 communication); default: the dtype of the value
    forwards           ranks send on what they received, not only their own data (a hierarchy's leaders)
    dtypes             the dtypes the value must have (default: any floating dtype)
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
    tolerance: str | None = None
    dtypes: tuple[str, ...] = ()
    forwards: bool = False     # ranks send on what they received (a node's sum from its leader): what a rank sends
    #                            is then not only its own data: never named as "not its own data", nor its own
    #                            data left "unchanged" (the exercise's mistakes say what happened)
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)  # file and line
    _expected: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    step: Callable | None = field(default=None, init=False, repr=False, compare=False)   # set by its Exercise

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", validate.caller())
        where, name = self.where, self.name
        if not isinstance(name, str) or not name.isidentifier():
            raise DeclarationError("declare.name", where, what="Quantity", value=repr(name))
        if not isinstance(self.combine, Linear) and self.combine not in COMBINES:
            raise DeclarationError("declare.combine", where, name=name, value=repr(self.combine), known=list(COMBINES))
        if self.combine not in ("custom", "reference") and not isinstance(self.combine, Linear) and self.local is None:
            raise DeclarationError("declare.needs_function", where, name=name, combine=self.combine, field="local")
        if self.combine == "custom" and self.expected is None:
            raise DeclarationError("declare.needs_function", where, name=name, combine=self.combine, field="expected")
        if self.combine == "own" and self.provenance:
            raise DeclarationError("declare.own_proven", where, name=name)
        validate.ops(f"Quantity({name!r}).through", self.through, where)
        args = ("rank", "ws")
        for field_name, fn, call in (("local", self.local, args), ("expected", self.expected, ("rank", "ws")),
                                     ("shape", self.shape, ("ws",))):
            if fn is not None:
                validate.signature(name, field_name, fn, call, where)
        if self.label is not None:
            validate.words(f"Quantity({name!r}).label", self.label, where)
        if self.tolerance is not None:
            validate.dtypes(f"Quantity({name!r}).tolerance", (self.tolerance,), where)
        if self.dtypes:
            validate.dtypes(f"Quantity({name!r}).dtypes", self.dtypes, where)

    @property
    def derived(self) -> bool:
        """Each rank's own part of it is what the rank computes from what it received (a reference step's
        quantity, or a Linear one): no fixed data of the rank's to compare a send with."""
        return self.combine == "reference" or isinstance(self.combine, Linear)

    def local_options(self, rank: int, ws: int) -> list[np.ndarray]:
        """The rank's own data: one array, or several when `local` returns Alternatives (any will do)."""
        if self.local is None:
            return [np.zeros(0)]
        value = self.local(rank, ws)
        options = list(value) if isinstance(value, Alternatives) else [value]
        return [np.asarray(v, dtype=np.float64).reshape(-1) for v in options]

    def local_array(self, rank: int, ws: int) -> np.ndarray:
        """The rank's own data as far as it can be told without a run (the first alternative)."""
        return self.local_options(rank, ws)[0]

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
        if self.combine == "reference":
            return outcome(self.step, ws)[rank][self.name]
        if isinstance(self.combine, Linear):
            return self.combine.expected(ws)
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
class Case:
    """What an exercise's own `diagnose(case)` reads of one rank whose check failed: the quantity and the rank's
    value (numpy, None: none), the world size and rank, the check's outcome ("wrong", "exception" ...), the
    rank's error ({"type", "message", "frames"}) and whether its entry function returned, its operations as
    the switch recorded them (switch.Call), and its other quantities' values."""
    quantity: str
    values: np.ndarray | None
    ws: int
    rank: int
    outcome: str
    error: dict | None
    returned: bool
    calls: tuple
    others: dict


@dataclass(frozen=True)
class Check:
    """One scored check.

    kind "static":   `op` is reached from the entry function (or, with `forbid`, none of them is)
         "value":    `quantity` at `world_size` is right on every rank and derived from what the
                     communication delivered (each rank contributing its own data)
         "uses":     at `world_size`, the quantities came through their operations and no forbidden
                     operation ran
         "traffic":  at `world_size`, point-to-point exchanges form the declared pattern (`params`)
         (each kind is declared in exercise/kinds.py)
         "counts":   at `world_size`, how many times `op` completed on each rank (`params`: "count", an int
                     or a function of the world size; "per": "rank" (default) or "all" ranks together;
                     "at_most": True for a bound, not an exact count); with a `quantity`, the calls that
                     carried its elements are counted (a loss all-reduced for logging is not)
         "volume":   at `world_size`, the dtype every `op` that carried `quantity`'s elements carried
                     (`params`: "dtypes", the allowed ones) and the bytes a rank sent in them: at most one
                     `quantity`'s elements in those dtypes (or `params["bytes"](ws, elements)`)
         "groups":   at `world_size`, the groups operations span, with nodes of `params["node"]`
                     consecutive ranks: the operations of `params["inside"]` each stay inside one node, and
                     an operation that crosses nodes takes one rank per node (its leader)
         counts, volume and groups: `params["quantities"]`, the names of the quantities whose operations
                     are judged, where that is more than `quantity` (every all-reduce of a step that carries
                     several: `quantity` stays the one that must be right)
    counts, volume, groups and traffic count for a correct answer only: they pass when `quantity`'s value
    check passes at the same world size (counts: when a `quantity` is named)
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
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)  # file and line

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", validate.caller())
        where = self.where
        if not isinstance(self.id, str) or not self.id:
            raise DeclarationError("declare.name", where, what="Check", value=repr(self.id))
        if self.kind not in KINDS:
            raise DeclarationError("declare.unknown_kind", where, id=self.id, kind=repr(self.kind), known=list(KINDS))
        validate.points(self.id, self.points, where)
        validate.world_size(self.id, self.world_size, where)
        validate.words(f"Check({self.id!r}).title", self.title, where)
        validate.ops(f"Check({self.id!r}).op", self.op, where, single=True)
        validate.ops(f"Check({self.id!r}).forbid", self.forbid, where)
        validate.needs(self, KINDS[self.kind].needs)
        check_params(self)

    @property
    def visibility(self) -> str:
        """Gradescope's visibility for this check."""
        return "after_published" if self.hidden else "visible"


@dataclass(frozen=True)
class Todo:
    """One TODO of the stub: its name (zh, en), e.g. ("TODO 1（all_reduce）", "TODO 1 (all_reduce)"), and
    what shows it done without a run: `op`, an operation the entry function reaches; or `quantity`, every
    operation that quantity comes through reached. With neither, it is open as long as the entry function
    still raises NotImplementedError. The static verdict names the open ones ("complete TODO 2 ... first")."""
    words: tuple[str, str]
    op: str | None = None
    quantity: str | None = None
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", validate.caller())
        validate.words("Todo.words", self.words, self.where)
        validate.ops("Todo.op", self.op, self.where, single=True)


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
    todo: tuple = ("", "")                 # what the stub's NotImplementedError asks for: (zh, en) for one
    #                                        TODO, or (Todo(...), ...) for several (the open ones are named)
    step: Callable | None = None           # the reference step (exercise/reference.py): step(comm, rank, ws, **knobs)
    #                                        -> {quantity: array}; quantities with combine="reference" are its
    mistakes: tuple = ()                   # Mistake(...)s: the wrong answers the exercise names (exercise/mistakes.py)
    diagnose: Callable | None = None       # diagnose(case: Case) -> [(key, params)]: the exercise's own code for
    #                                        causes its mistakes cannot declare (its exceptions go to staff)
    teach: tuple = ()                      # Teach(...)s: the exercise's own lines in the report's communication
    #                                        section (exercise/teach.py)
    files: tuple[str, ...] = ()            # file stems a submission of this exercise is usually called
    folder: str = ""                       # where the exercise was loaded from (set by the registry)
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)  # file and line

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", validate.caller())
        where = self.where
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise DeclarationError("declare.name", where, what="Exercise", value=repr(self.name))
        if not isinstance(self.entry, str) or not self.entry.isidentifier():
            raise DeclarationError("declare.name", where, what="Exercise.entry", value=repr(self.entry))
        validate.words("Exercise.title", self.title, where)
        for what, items, kind in (("quantities", self.quantities, Quantity), ("checks", self.checks, Check)):
            if isinstance(items, (str, kind)) or not all(isinstance(item, kind) for item in items):
                raise DeclarationError("declare.items", where, what=f"Exercise.{what}", kind=kind.__name__)
        validate.unique("Quantity", [q.name for q in self.quantities], [q.where for q in self.quantities])
        validate.unique("Check", [c.id for c in self.checks], [c.where for c in self.checks])
        for check in self.checks:
            validate.quantity_named(f"Check({check.id!r}).quantity", check.quantity, self.quantities, check.where)
            for name in check.params.get("quantities") or ():
                validate.quantity_named(f"Check({check.id!r}).params['quantities']", name, self.quantities, check.where)
        validate.ops("Exercise.forbidden", self.forbidden, where)
        for key, pair in (self.messages or {}).items():
            validate.words(f"Exercise.messages[{key!r}]", pair, where)
        validate.step(self)
        for quantity in self.quantities:
            if quantity.combine == "reference":
                object.__setattr__(quantity, "step", self.step)
        validate.mistakes(self)
        if not validate.is_words(self.todo):
            if isinstance(self.todo, (str, Todo)) or not all(isinstance(t, Todo) for t in self.todo):
                raise DeclarationError("declare.todo", where, value=repr(self.todo)[:80])
            for todo in self.todo:
                validate.quantity_named("Todo.quantity", todo.quantity, self.quantities, todo.where)

    @property
    def todos(self) -> tuple[Todo, ...]:
        """The TODOs declared as data (none when `todo` is a single (zh, en) phrase)."""
        return () if validate.is_words(self.todo) else tuple(self.todo)

    @property
    def forbidden_ops(self) -> tuple[str, ...]:
        """Every operation the exercise does not allow: its own `forbidden`, and what its "uses" checks forbid."""
        return tuple(dict.fromkeys([*self.forbidden, *(op for check in self.checks if check.kind == "uses"
                                                        for op in check.forbid)]))

    def quantity(self, name: str) -> Quantity:
        for quantity in self.quantities:
            if quantity.name == name:
                return quantity
        raise KeyError(f"{self.name}: no quantity {name!r}")

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
