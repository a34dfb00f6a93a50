"""What one world size's runs show, as verification asks it: each rank's value as it reported it, whether it is
right, and the proof that it came from what the switch delivered (provenance.Tracer for values combined from
every rank's data, replay.Replays for a reference step's, linear.LinearProof for a Linear quantity's);
whether it followed the data in flight; which runs a check of measures judges. Cached per run, quantity and
rank. The per-kind verdicts (kinds/), the planning predicates (planning.py) and the overrules (overrule.py)
read runs through this.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..comm import OPS
from ..exercise.spec import Exercise, Linear, Quantity
from ..model import Outcome
from ..records import How, RankRecord, RunOutcome, Stop
from ..switch.perturb import LARGEST, may_overflow, perturbable
from ..wire import HALF
from . import outcomes
from . import budget
from .diagnose import at
from .compare import all_close
from .linear import LinearProof
from .observe import RunView, Value
from .pool import largest
from .proof import Finding, Proof
from .provenance import Tracer
from .replay import Replays


@dataclass
class WorldSizeRuns:
    world_size: int
    clean: RunOutcome | None = None          # None: skipped, the perturbed run alone proved every value
    perturbed: list[RunOutcome] = field(default_factory=list)  # every perturbed op first, then single ones
    real: RunOutcome | None = None           # the real-backend run (the visible world size), when one was made

    @property
    def switch_runs(self) -> list[RunOutcome]:
        """The clean run first (when there is one), then the perturbed runs, each run once: a perturbed run
        that delivered nothing is the clean run too (planning.untouched)."""
        return ([self.clean] if self.clean is not None else []) + [p for p in self.perturbed if p is not self.clean]


class Evidence:
    """An exercise's evidence over runs; caches views and proofs (one per run, quantity and rank)."""

    def __init__(self, exercise: Exercise, source: str):
        self.exercise, self.source = exercise, source
        self._views: dict[int, RunView] = {}
        self._proofs: dict[tuple, Proof | None] = {}
        self.work = budget.Budget(budget.SUBMISSION_SECONDS)   # all of this submission's verification

    def view(self, run: RunOutcome) -> RunView:
        if id(run) not in self._views:
            self._views[id(run)] = view = RunView(run)
            # what reading this run back costs, within one allowance for the whole submission
            self.work.seconds = min(self.work.seconds + budget.allowance(view.kept),
                                    budget.SUBMISSION_SECONDS + budget.MOST_ALLOWED)
        return self._views[id(run)]

    def allowance(self, runs: WorldSizeRuns) -> float:
        """Seconds a check's bound grows by for reading back what the switch kept of its runs."""
        return budget.allowance(sum(self.view(run).kept for run in runs.switch_runs))

    # -- values as reported

    @staticmethod
    def value(record: RankRecord, name: str) -> tuple[Value, bool]:
        """A rank's value for a quantity, and whether it comes from the snapshot taken as the rank
        entered its last operation (it never returned: another rank's failure left it waiting)."""
        result = record.result
        if result is not None and isinstance(result.values, dict):
            return Value.of(result.values.get(name)), False
        if result is not None:
            return Value("missing"), False
        return Value.of(record.snapshot.get(name)), True

    def shape_ok(self, quantity: Quantity, value: Value, ws: int) -> tuple[Outcome, str | None]:
        """Type, dtype and shape against the exercise (values aside)."""
        if value.kind == "missing":
            return Outcome.MISSING, None
        if value.kind != "tensor":
            return Outcome.BAD_TYPE, "detail.not_tensor"
        if not value.plain:
            return Outcome.BAD_TYPE, "detail.subclass"
        if value.omitted in ("layout", "dtype") or not value.floating:
            return Outcome.WRONG, "detail.dtype"
        if quantity.dtypes and value.dtype not in quantity.dtypes:
            return Outcome.WRONG, "detail.dtype_declared"
        if list(value.shape or []) != quantity.expected_shape(ws):
            return Outcome.WRONG, "detail.shape"
        if value.data is None:
            return Outcome.WRONG, "detail.unreadable"
        return Outcome.PASS, None

    def judge_clean(self, quantity: Quantity, value: Value, ws: int, rank: int) -> tuple[Outcome, str | None]:
        outcome, detail = self.shape_ok(quantity, value, ws)
        if outcome is not Outcome.PASS:
            return outcome, detail
        if not all_close(value.data, quantity.expected_array(rank, ws), _tolerance(quantity, value)):
            return Outcome.WRONG, "detail.values"
        return Outcome.PASS, None

    def proof(self, run: RunOutcome, quantity: Quantity, rank: int, check: int | None = None) -> Proof | None:
        """The provenance proof of this rank's value in a perturbed run (`check`: its value where the rank's
        own check number `check` failed); None: nothing to prove from (no usable value, or the run did not
        perturb what the quantity comes through)."""
        key = (id(run), quantity.name, rank, check)
        if key in self._proofs:
            return self._proofs[key]
        proof = None
        if run.stop != Stop.GRADER_ERROR and any(run.request.perturbs(op) for op in quantity.through or OPS):
            value = self.value(run.ranks[rank], quantity.name)[0] if check is None else \
                Value.of(run.ranks[rank].checks[check]["values"].get(quantity.name))
            if self.shape_ok(quantity, value, run.request.world_size)[0] is Outcome.PASS:
                # the same numbers have the same proof (a check of the final value: once for both)
                same = (id(run), quantity.name, rank, value.dtype, value.data.tobytes())
                if same not in self._proofs:
                    self._proofs[same] = self._bounded(run, quantity, rank, value)
                proof = self._proofs[same]
        self._proofs[key] = proof
        return proof

    def _bounded(self, run: RunOutcome, quantity: Quantity, rank: int, value: Value) -> Proof:
        """_prove within the proof's CPU budget and what is left of the submission's: past it, not proven
        ("over_budget", with the seconds of the bound that ran out)."""
        seconds = budget.PROOF_SECONDS + budget.allowance(self.view(run).kept)
        with budget.spending(budget.Budget(seconds), self.work) as scope:
            try:
                proof = self._prove(run, quantity, rank, value)
                near = near_overflow(self.view(run), proof.calls) if proof.ok else None
                return proof if near is None else Proof(False, near, proof.calls)
            except budget.OverBudget as over:
                if over.scope is not scope:
                    raise    # an enclosing check's bound: its verdict
                return Proof(False, Finding("over_budget", {"rank": rank, "seconds": round(scope.bound.seconds, 1)}))

    def _prove(self, run: RunOutcome, quantity: Quantity, rank: int, value: Value) -> Proof:
        """The tracer's proof, or for a quantity of the reference step, the step replayed against the run."""
        dtype = _tolerance(quantity, value)
        if isinstance(quantity.combine, Linear):
            key = ("linear", id(run), quantity.name)
            if key not in self._proofs:
                self._proofs[key] = LinearProof(self.view(run), quantity.combine)
            return self._proofs[key].prove(rank, value.data.reshape(-1), dtype)
        if quantity.combine != "reference":
            proof = _traced(self.view(run), quantity, rank, value.data, dtype)
            if not proof.ok and value.dtype in HALF and dtype not in HALF:
                # a value held in a half dtype was rounded to it at every step (a mean divided in bfloat16): traced
                # within that rounding, its value is then decided by a clean run, at `dtype`'s tolerance
                rounded = _traced(self.view(run), quantity, rank, value.data, value.dtype)
                if rounded.ok:
                    rounded.rounded = True
                    return rounded
            return proof
        key = ("replays", id(run))
        if key not in self._proofs:
            self._proofs[key] = Replays(self.view(run), self.exercise.step)
        return self._proofs[key].prove(rank, quantity.name, value.data.reshape(-1), dtype)

    def provenance(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> tuple[bool | None, Proof | None]:
        """True with the proof; False with the most telling failed proof; None: nothing observed."""
        failed = None
        for run in runs.perturbed:
            proof = self.proof(run, quantity, rank)
            if proof is None:
                continue
            if proof.ok:
                return True, proof  # a snapshot that proves out is evidence too
            _, snapshot = self.value(run.ranks[rank], quantity.name)
            if snapshot or run.ranks[rank].how is How.RAISE:
                continue  # a value in the making (the rank never returned, or raised) disproves nothing
            failed = failed or proof
        return (False, failed) if failed is not None else (None, None)

    # -- whole runs

    @staticmethod
    def _own_calls(runs: WorldSizeRuns, quantity: Quantity, rank: int):
        """This rank's completed calls of the quantity's operations in the perturbed runs."""
        ops = set(quantity.through) | ({"recv"} if "send" in quantity.through else set())
        return (call for run in runs.perturbed if rank < len(run.ranks) for call in run.ranks[rank].calls
                if call.completed and (not ops or call.op in ops))

    def _overflowed(self, runs: WorldSizeRuns, quantity: Quantity, rank: int, ws: int) -> bool:
        """An operation of the quantity delivered this rank, in a perturbed run, as many elements as the value
        holds, and some of them inf or nan (not a warm-up's larger tensor)."""
        size = int(np.prod(quantity.expected_shape(ws)))
        return any(call.ok and call.receives and any(d is not None and d.size == size and not np.all(np.isfinite(d))
                                                     for d in call.delivered_values())
                   for call in self._own_calls(runs, quantity, rank))

    def _dropped(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> bool:
        """Some operation of the quantity completed on this rank in a perturbed run without its values kept."""
        return any(not call.retained for call in self._own_calls(runs, quantity, rank))

    def follows(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> bool | None:
        """Whether this rank's value changed between the clean run and a perturbed run that changed what its
        operations delivered (True: it depends on that data; False: it stayed exactly the same, the deltas
        being far beyond any tolerance); None where it cannot be told (no clean run, a rank that did not
        return in either run, values of other shapes)."""
        clean = runs.clean
        if clean is None or rank >= len(clean.ranks):
            return None
        for run in runs.perturbed:
            if not all(run.request.perturbs(op) for op in quantity.through) or rank >= len(run.ranks):
                continue
            a, b = clean.ranks[rank], run.ranks[rank]
            if a.how is not How.RETURN or b.how is not How.RETURN:
                continue
            va, vb = self.value(a, quantity.name)[0], self.value(b, quantity.name)[0]
            if va.data is None or vb.data is None or va.data.shape != vb.data.shape or not va.floating:
                continue
            return not (np.array_equal(va.data, vb.data) or all_close(vb.data, va.data, va.dtype))
        return None

    def delivered_evidence(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> list[str]:
        """The quantity's operations that delivered this rank at least as many elements carrying deltas as the
        quantity holds, in a perturbed run that perturbed all of them ([]: none did)."""
        size = int(np.prod(quantity.expected_shape(runs.world_size)))
        for run in runs.perturbed:
            if not all(run.request.perturbs(op) for op in quantity.through) or rank >= len(run.ranks):
                continue
            view = self.view(run)
            ops = sorted({c.op for c in run.ranks[rank].calls if c.completed and c.ok and c.receives and c.op in quantity.through
                          and sum(int(d.get("numel") or 0) for k, d in enumerate(c.delivered) if view.evidence(c, k)) >= size})
            if ops:
                return ops
        return []

    def how_computed(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> str:
        """For right numbers that are not proven: "local" where the value stayed the same although everything
        its operations delivered to the rank changed (certainly computed without it); "derived" where it
        changed with that data (computed from it, though not as the exercise asks); "untraced" otherwise
        (say, what was delivered travelled unperturbed: pickled objects, integers the switch leaves as sent)."""
        follows = self.follows(runs, quantity, rank)
        if follows:
            return "derived"
        if follows is None:
            return "untraced"
        perturbed = next((run for run in runs.perturbed if all(run.request.perturbs(op) for op in quantity.through)), None)
        calls = [c for c in perturbed.ranks[rank].calls if c.op in quantity.through or
                 (c.op == "recv" and "send" in quantity.through)] if perturbed is not None else []
        # data that reached the rank unperturbed (another operation than the quantity's, not perturbed in
        # this run, or floating data the switch does not perturb: a MAX) may be what the value was made of:
        # then it is not certainly local
        view = self.view(perturbed) if perturbed is not None else None
        unperturbed = perturbed is not None and any(
            c.receives and c.delivered and c.op != "barrier" and not view.perturbed(c)
            and (not perturbed.request.perturbs(c.op) or any(perturbable(d.get("dtype", "")) for d in c.delivered))
            for c in perturbed.ranks[rank].calls if c.completed and c.ok)
        if not unperturbed and all(view.evidence(c, k) for c in calls if c.receives for k in range(len(c.delivered))):
            return "local"
        return "untraced"

    def whole(self, run: RunOutcome) -> bool:
        """The run ended with every rank done and none failing."""
        return run.stop == Stop.COMPLETED and not any(outcomes.rank_failure(run, rec) for rec in run.ranks)

    def measured_runs(self, runs: WorldSizeRuns, quantity: Quantity | None) -> list[tuple[RunOutcome, set[int]]]:
        """Every switch run of the world size whose measures a check of what passed through the switch
        judges (the clean run first), each with the ranks whose part of it is complete: every rank of a
        whole run; in another, the ranks whose value of `quantity` the run proved. Runs the grader could
        not complete are left out."""
        out = []
        for run in runs.switch_runs:
            if run.stop == Stop.GRADER_ERROR:
                continue
            n = run.request.world_size
            if self.whole(run):
                complete = set(range(n))
            elif quantity is not None:
                complete = {r for r in range(n) if (p := self.proof(run, quantity, r)) is not None and p.ok}
            else:
                complete = set()
            out.append((run, complete))
        if runs.clean is not None and runs.clean.stop == Stop.GRADER_ERROR:
            return []   # the run that decides values could not be made: nothing is judged
        return out


def _tolerance(quantity: Quantity, value: Value) -> str:
    """The dtype whose tolerance a value is compared with: the quantity's, when it declares one; else the
    value's, but never a half-precision one (a value returned in float16 keeps float32's tolerance: what
    half precision lost is an error unless the exercise asks for it)."""
    if quantity.tolerance:
        return quantity.tolerance
    return "torch.float32" if value.dtype in HALF else (value.dtype or "torch.float32")


# The tracer searches first among the deliveries of at most FIRST_POOL_TIMES x N x the value's elements (at
# least FIRST_POOL_MIN): a bandwidth loop's megabyte buffers beside a 4 KiB answer are not sorted for a
# proof that never needs them (six 4 MB warm-up all-reduces: 2.7 of a grading's 4.4 s of verification)
FIRST_POOL_TIMES, FIRST_POOL_MIN = 4, 1 << 12


def _traced(view: RunView, quantity: Quantity, rank: int, data: np.ndarray, dtype: str) -> Proof:
    """The tracer's proof of `data`: from the rank's smaller deliveries first, then from all of them. What the
    first search proves is proven (its evidence is evidence in the whole pool too); only a value it cannot
    prove is searched for again in everything, whose account (the most telling failure) is the one given."""
    limit = max(FIRST_POOL_MIN, FIRST_POOL_TIMES * view.ws * int(data.size))
    if largest(view, rank) > limit:
        first = Tracer(view, quantity, dtype, limit).prove(rank, data)
        if first.ok:
            return first
    return Tracer(view, quantity, dtype).prove(rank, data)


def near_overflow(view: RunView, calls) -> Finding | None:
    """The first operation a proven value came through whose sum some draw of the deltas could take past its
    dtype's largest value (switch.perturb.may_overflow, from what the ranks sent): such a value is proven in
    one grading and inf in the next, so it is never proven ("near_overflow"), whatever this run's draw was.
    A float16 sum whose positive parts stay under about 4/5 of 65504 is never concerned."""
    for call in calls:
        if not (call.ok and call.receives and view.perturbed(call)):
            continue
        senders = [p for p in call.partners.values() if p.sends]
        for k, delivered in enumerate(call.delivered_values()):
            dtype = str(call.delivered[k].get("dtype", "")) if k < len(call.delivered) else ""
            if delivered is None or dtype not in LARGEST or not delivered.size:
                continue
            # at most the largest positive element of every sender's data, each counted once: nearly every
            # operation ends here, before its elements are mapped to their sources
            top = sum(max(float(view.flat(p, "sent").max(initial=0.0)), 0.0) for p in senders)
            if not may_overflow(np.array([top]), len(senders), dtype):
                continue
            terms = view.sources(call, k, np.arange(delivered.size))
            if isinstance(terms, str):
                continue
            sent = [view.flat(t.call, "sent") for t in terms]
            positive = np.zeros(delivered.size)
            for term, values in zip(terms, sent):
                mask = (term.sent_positions >= 0) & (term.sent_positions < values.size)
                positive[mask] += np.maximum(values[term.sent_positions[mask]], 0.0)
            if may_overflow(positive, len(senders), dtype):   # one value of each sender at most in an element
                return Finding("near_overflow", {"rank": call.rank, "op": call.op, **at(call)})
    return None
