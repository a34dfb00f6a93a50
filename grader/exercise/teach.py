"""The exercise's own lines in the report's communication section: the chapter's claim in the student's run.

    Teach("teach.header", per="run")                                     # once, with {ws}
    Teach("teach.volume", when=(Ran("reduce_scatter"),), say=lambda f: {"rs": f.ring("reduce_scatter")})

Each is a message of the exercise (zh, en) and the values for its placeholders, computed by `say` from the
facts the engine measured of one rank (per="rank", the default) or of the run (per="run"): never from a
record the exercise reads itself. The facts (verify/teach.Facts):
    f.ws, f.rank                 the world size; the rank (per="rank")
    f.count(op), f.bytes(op)     how many `op` calls completed, the bytes the rank sent in them
    f.first(op)                  the bytes the rank's first `op` sent (delivered=True: was delivered)
    f.itemsize(op)               the bytes of one element its first `op` sent
    f.elements(op), f.dtypes(op) the elements it sent in them; the dtypes it sent, sorted
    f.ring(op, size=None)        what a ring algorithm sends per rank for `op` on `size` bytes (default: its
                                 first call's), 2(N-1)/N x S for an all-reduce (grader/comm.py)
    f.held(quantity)             how many elements the rank's value of `quantity` holds
    f.crossed(node)              (per="run") the bytes sent across nodes of `node` consecutive ranks
`when` are conditions of exercise/mistakes.py (Ran, NotRan, ...), `only(f)` a condition on the facts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .validate import DeclarationError, caller


@dataclass(frozen=True)
class Teach:
    key: str
    per: str = "rank"
    when: tuple = ()
    say: Callable | None = None
    only: Callable | None = None
    held: str | None = None               # a quantity whose value the line needs (a rank without one is passed)
    where: tuple[str, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.where is None:
            object.__setattr__(self, "where", caller())
        if self.per not in ("rank", "run"):
            raise DeclarationError("declare.teach_per", self.where, key=self.key, value=repr(self.per))
