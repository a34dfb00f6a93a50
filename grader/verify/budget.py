"""The supervisor's own work on one submission, bounded in CPU time.

Verification runs in the supervisor after the ranks ran, and what it costs depends on what the submission
made: a value assembled from thousands of one-element deliveries, or delivered values that tie with many
others, can ask a search for far more than an honest program's milliseconds. The search bounds its steps
(provenance.py); this bounds the seconds, whatever the code path: one proof (`PROOF_SECONDS`), one check
(`CHECK_SECONDS`) and all of a submission's verification together (`SUBMISSION_SECONDS`), counted in the
supervisor's CPU time (`time.process_time`: a batch worker grades one submission at a time in its own
process, so the bound is this student's alone, and a slow machine's waiting counts for nothing).

Work past a bound raises `OverBudget` at the next `tick()`, which the verification loops call; the one who
opened the bound that ran out (`spending`) turns it into a named verdict for that proof or check
(`fail.over_budget`, `fail.check_over_budget`), never a time-out of the whole grading. Nothing is left half
made: caches are filled only once a result is complete.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

PROOF_SECONDS = 3.0           # one rank's value in one run
CHECK_SECONDS = 6.0           # one check, its proofs included
SUBMISSION_SECONDS = 15.0     # every proof and check of one submission
# Besides the search, verification sorts and reads back what the switch kept of a run, which grows with the
# data the ranks themselves sent (a 4 MB warm-up repeated before the answer: ~1 s of sorting at 4 ranks, more
# on a loaded machine): each bound grows by this much per million kept elements of the runs it covers, so
# that an honest program's volume never runs out a bound meant for a search gone combinatorial.
SECONDS_PER_MILLION_KEPT = 1.0
# and no more than this much per bound, whatever was kept (the switch's windows allow hundreds of MB a run:
# sending much must not buy a search minutes of the supervisor's time)
MOST_ALLOWED = 10.0
_EVERY = 16                   # ticks between two readings of the clock (each ~0.6 us)


def allowance(kept_elements: int) -> float:
    """Seconds of CPU a bound grows by for the runs it covers, which kept `kept_elements` values."""
    return min(SECONDS_PER_MILLION_KEPT * kept_elements / 1e6, MOST_ALLOWED)


class OverBudget(Exception):
    """Raised at a tick past a bound; `scope` is the `spending` block whose bound ran out first."""

    def __init__(self, scope):
        super().__init__("over budget")
        self.scope = scope


class Budget:
    """Seconds of CPU for some work, spent across the blocks charged to it."""

    def __init__(self, seconds: float):
        self.seconds, self.spent = seconds, 0.0

    @property
    def left(self) -> float:
        return self.seconds - self.spent


class _Scope:
    def __init__(self, budgets: tuple, start: float, outer):
        self.budgets, self.start = budgets, start
        # the budget that bounds this block (the one with the least left), for the verdict's words
        self.bound = min(budgets, key=lambda b: b.left) if budgets else None
        self.own = start + self.bound.left if budgets else float("inf")
        self.deadline = min(self.own, outer.deadline) if outer is not None else self.own


class _State(threading.local):   # one supervisor's blocks per thread (a replay's threads open none)
    def __init__(self):
        self.stack: list[_Scope] = []
        self.ticks = 0


_state = _State()


@contextmanager
def spending(*budgets: Budget):
    """Charge the CPU time of the block to each budget not already charged by an enclosing block; a tick
    past the first deadline (this block's or an enclosing one's) raises OverBudget. Yields the scope, which an
    `except OverBudget as e` compares with `e.scope`: its own bound ran out, or an enclosing one's (re-raise)."""
    stack = _state.stack
    active = {id(b) for scope in stack for b in scope.budgets}
    scope = _Scope(tuple(b for b in budgets if id(b) not in active), time.process_time(), stack[-1] if stack else None)
    stack.append(scope)
    try:
        yield scope
    finally:
        stack.remove(scope)
        spent = time.process_time() - scope.start
        for b in scope.budgets:
            b.spent += spent


def tick() -> None:
    """Called by verification's loops: raises OverBudget once the innermost block's deadline has passed."""
    state = _state
    if not state.stack:
        return
    state.ticks += 1
    if state.ticks % _EVERY:
        return
    now = time.process_time()
    if now > state.stack[-1].deadline:
        raise OverBudget(next(s for s in state.stack if now > s.own))
