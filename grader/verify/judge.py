"""Policy: decide each runtime check of an exercise from the runs of one world size.

Per world size the grader makes a perturbed run (perturb.py) and, unless that run alone proves every
value (`proven`), a clean run. A value check passes when, on every rank, the value has the expected
shape and a floating dtype, and provenance.Tracer proves it from what the communication delivered in a
perturbed run (which also proves it right: each rank's own data, combined as the exercise says). When
it does not, the clean run says what the student's code really computes: a wrong value (with its
causes), the reason a rank stopped, or right numbers that did not come through the communication.

Honest code that asserts its own expected values raises in the perturbed run; its values are read
from the entry function's locals at the exception (or at its last operation, when another rank's
exception left it waiting), so it still earns full marks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..comm import OPS
from ..exercise.spec import Check, Exercise, Linear, Quantity
from ..model import CheckResult, Note, Outcome
from ..records import How, RankRecord, RunOutcome
from ..wire import HALF
from . import diagnose
from .observe import RunView, Value
from ..switch.perturb import perturbable
from .provenance import Proof, Tracer
from .linear import LinearProof
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
        that delivered nothing is the clean run too (Judge.untouched)."""
        return ([self.clean] if self.clean is not None else []) + [p for p in self.perturbed if p is not self.clean]


class Judge:
    """Decides an exercise's runtime checks; caches proofs (one per run, quantity and rank)."""

    def __init__(self, exercise: Exercise, source: str):
        self.exercise, self.source = exercise, source
        self._views: dict[int, RunView] = {}
        self._proofs: dict[tuple, Proof | None] = {}

    def view(self, run: RunOutcome) -> RunView:
        if id(run) not in self._views:
            self._views[id(run)] = RunView(run)
        return self._views[id(run)]

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
        if list(value.shape or []) != quantity.expected_shape(ws):
            return Outcome.WRONG, "detail.shape"
        if value.data is None:
            return Outcome.WRONG, "detail.unreadable"
        return Outcome.PASS, None

    def judge_clean(self, quantity: Quantity, value: Value, ws: int, rank: int) -> tuple[Outcome, str | None]:
        outcome, detail = self.shape_ok(quantity, value, ws)
        if outcome is not Outcome.PASS:
            return outcome, detail
        if not diagnose.all_close(value.data, quantity.expected_array(rank, ws), _tolerance(quantity, value)):
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
        if run.stop != "grader_error" and any(run.request.perturbs(op) for op in quantity.through or OPS):
            value = self.value(run.ranks[rank], quantity.name)[0] if check is None else \
                Value.of(run.ranks[rank].checks[check]["values"].get(quantity.name))
            if self.shape_ok(quantity, value, run.request.world_size)[0] is Outcome.PASS:
                # the same numbers have the same proof (a check of the final value: once for both)
                same = (id(run), quantity.name, rank, value.dtype, value.data.tobytes())
                if same not in self._proofs:
                    self._proofs[same] = self._prove(run, quantity, rank, value)
                proof = self._proofs[same]
        self._proofs[key] = proof
        return proof

    def _prove(self, run: RunOutcome, quantity: Quantity, rank: int, value: Value) -> Proof:
        """The tracer's proof, or for a quantity of the reference step, the step replayed against the run."""
        dtype = _tolerance(quantity, value)
        if isinstance(quantity.combine, Linear):
            key = ("linear", id(run), quantity.name)
            if key not in self._proofs:
                self._proofs[key] = LinearProof(self.view(run), quantity.combine)
            return self._proofs[key].prove(rank, value.data.reshape(-1), dtype)
        if quantity.combine != "reference":
            return Tracer(self.view(run), quantity, dtype).prove(rank, value.data)
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
    def proven(self, run: RunOutcome) -> bool:
        """The perturbed run alone proves every provenance quantity on every rank, and no rank failed:
        the clean run of this world size would only repeat the verdict, so the grader skips it.
        Where the student's own checks failed (the perturbed data fails an assert of the expected values by
        design; the run records it and goes on), the values as they stood at each failed check must be proven
        too: a clean run would have stopped there, with those values, if the check failed there as well, and
        otherwise gone on as this run did."""
        if run.stop != "completed":
            return False
        for record in run.ranks:
            if diagnose.rank_failure(run, record) is not None or record.checks_dropped:
                return False
            for quantity in self.exercise.quantities:
                if not quantity.provenance:
                    return False
                for check in [None, *range(len(record.checks))]:
                    proof = self.proof(run, quantity, record.rank, check)
                    if proof is None or not proof.ok:
                        return False
                    if diagnose.async_without_wait(proof.calls) is not None:
                        return False
        return True

    @staticmethod
    def untouched(run: RunOutcome) -> bool:
        """No operation of this perturbed run delivered anything to any rank before the run ended (a stub's
        NotImplementedError, a load error, a hang or a deadlock before the first delivery). The perturbation
        is only ever in what the switch delivers, and a rank cannot tell a perturbed run from a clean one
        otherwise (its spec is the same), so the code ran as it would in the clean run: this run serves as
        that world size's clean run. Only where every rank got as far as the student's code, and none of its
        own checks failed (a perturbed run records them and goes on, where a clean run stops): a rank that
        failed while the grader set it up gets its clean run, a second chance."""
        return run.stop != "grader_error" and bool(run.ranks) and all(record.ready for record in run.ranks) and \
            not any(record.checks or record.checks_dropped for record in run.ranks) and \
            not any(call.completed and call.receives for record in run.ranks for call in record.calls)

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

    def unobserved(self, runs: WorldSizeRuns) -> list[tuple[str, ...]]:
        """Operations to perturb alone, for quantities whose clean value is right but which no perturbed
        run could observe (an honest assert stopped it before the value was computed)."""
        wanted = []
        if runs.clean is None:
            return wanted
        if runs.clean.stop not in ("completed", "failfast") and all(p.stop == runs.clean.stop for p in runs.perturbed):
            return wanted   # clean and perturbed runs ended alike (a time limit, say): perturbing less changes nothing
        for quantity in self.exercise.quantities:
            if not quantity.provenance or not quantity.through:
                continue
            for record in runs.clean.ranks:
                value, _ = self.value(record, quantity.name)
                if self.judge_clean(quantity, value, runs.world_size, record.rank)[0] is not Outcome.PASS:
                    continue
                if self.provenance(runs, quantity, record.rank)[0] is None:
                    if quantity.through not in wanted:
                        wanted.append(quantity.through)
                    break
        return wanted

    # -- checks
    def evaluate(self, check: Check, runs: WorldSizeRuns) -> CheckResult:
        if check.kind == "value":
            return self.evaluate_value(check, runs)
        if check.kind == "uses":
            return self.evaluate_uses(check, runs)
        if check.kind == "traffic":
            from .traffic import evaluate_traffic
            result = evaluate_traffic(self, check, runs)
            if result.outcome is Outcome.WRONG and any(n.key == "cause.traffic_needs_value" for n in result.notes):
                # traffic counts for a correct answer only: where there is none because the run failed (an
                # exception, a deadlock ...), the outcome says so, as the value check's does
                values = self.evaluate_value(Check(check.id, "value", 0, check.title, hidden=check.hidden,
                                                   world_size=check.world_size, quantity=check.quantity), runs)
                if values.outcome not in (Outcome.WRONG, Outcome.NOT_COLLECTIVE, Outcome.PASS, Outcome.GRADER_ERROR):
                    result = CheckResult(check, values.outcome, result.score, result.notes, result.details)
            return result
        from .kinds import EVALUATE
        if check.kind in EVALUATE:
            return EVALUATE[check.kind](self, check, runs)
        return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": f"unknown check kind {check.kind}"})])

    def evaluate_value(self, check: Check, runs: WorldSizeRuns) -> CheckResult:
        """One value check (a quantity at a world size), over every rank."""
        quantity = self.exercise.quantity(check.quantity)
        run = runs.clean
        passed = Note("pass.value", {"quantity": quantity.name, "ops": _ops_used(quantity, runs)})
        if run is None:  # skipped: the perturbed run proved every rank's value
            return CheckResult(check, Outcome.PASS, check.points, [passed])
        if run.stop == "grader_error":
            return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": run.error or ""})])
        verdicts = []
        for record in run.ranks:
            verdicts.append(self._rank_verdict(quantity, runs, record))
        failed = [v for v in verdicts if v[1] is not Outcome.PASS]
        if not failed:
            return CheckResult(check, Outcome.PASS, check.points, [passed])
        # The check's verdict is the root cause: a rank stopped only because another failed defers to it.
        primary = [v for v in failed if not any(n.key == "fail.stopped" for n in v[2])] or failed
        outcome = primary[0][1]
        details = [d for _, _, _, rank_details in failed for d in rank_details]
        _drop_partial_unchanged(failed)
        notes = [n for _, _, rank_notes, _ in failed for n in rank_notes]
        mismatch = diagnose.mismatched_calls(run)
        if mismatch is not None and outcome is not Outcome.NOT_COLLECTIVE:
            notes.append(mismatch)
        for cause in (diagnose.blocked_in_send(run), diagnose.blocked_in_recv(run), diagnose.unmatched_receive(run),
                      *diagnose.p2p_mismatch(run), diagnose.group_name_conflict(run), diagnose.tag_mismatch(run)):
            if cause is not None:
                notes.append(cause)
        for op in quantity.through:
            if diagnose.assigned_result(self.source, op):
                notes.append(Note("cause.assigned_none", {"op": op}))
        return CheckResult(check, outcome, notes=_unique_causes(notes), details=details)

    def _rank_verdict(self, quantity: Quantity, runs: WorldSizeRuns, record: RankRecord):
        ws, run = runs.world_size, runs.clean
        value, from_snapshot = self.value(record, quantity.name)
        outcome, detail = self.judge_clean(quantity, value, ws, record.rank)
        failure = diagnose.rank_failure(run, record)
        notes: list[Note] = []
        details: list[Note] = []
        explained = False    # the value's causes (the exercise's included) are in notes
        label = {"rank": record.rank, "quantity": quantity.name}
        if outcome is Outcome.MISSING:
            if failure is not None:
                outcome, note = failure
                notes.append(note)
                details.extend(diagnose.last_call(record, note))
            else:
                notes.append(Note("fail.missing", {**label, "entry": self.exercise.entry,
                                                   "names": [q.name for q in self.exercise.quantities],
                                                   "returned": record.result.returned_type if record.result is not None else "?"}))
        elif outcome is not Outcome.PASS:
            if failure is not None:  # a wrong value left behind by an exception: the exception is the news
                outcome, note = failure
                notes.append(note)
                details.extend(diagnose.last_call(record, note))
            if not from_snapshot:    # a snapshot is a value in the making: its numbers explain nothing
                others = {q.name: self.value(record, q.name)[0] for q in self.exercise.quantities}
                if detail in ("detail.values", "detail.shape", "detail.dtype"):
                    notes.extend(diagnose.value_causes(quantity, value, ws, record.rank, record, others,
                                                       self.source, self.exercise))
                    explained = True
                # how the ranks' data combined, unless a generic cause already says it (weight 1 instead of
                # 1/N is "summed, not averaged", not "counted twice")
                if detail == "detail.values" and quantity.provenance and not any(n.key.startswith("cause.") for n in notes):
                    notes.extend(self._weights(runs, quantity, record.rank))
                notes.append(Note(detail, label))
                details.append(self._rank_value(quantity, ws, record.rank, value))
        elif quantity.provenance:
            proven, proof = self.provenance(runs, quantity, record.rank)
            waiting = diagnose.async_without_wait(proof.calls if proof is not None else [])
            if proven and waiting is not None:
                outcome = Outcome.WRONG   # right by luck: the result of an un-waited operation may not have arrived
                notes.append(Note("fail.async_no_wait", {**label, "op": diagnose.op_name(waiting)}))
            elif proven is False and "//" in self.source and any(
                    diagnose.floor_of_delivered(quantity, self.value(p.ranks[record.rank], quantity.name)[0],
                                                p.ranks[record.rank], ws) for p in runs.perturbed):
                outcome = Outcome.WRONG   # right here by luck: the mean happens to be whole
                notes.append(Note("cause.floor_division", {"quantity": quantity.name}))
            elif proven is False and (proof is not None and proof.finding is not None and proof.finding.key == "not_finite"
                                      or self._overflowed(runs, quantity, record.rank, ws)):
                # right in the clean run, but the perturbed data took a sum past its dtype's largest value
                outcome = Outcome.NOT_COLLECTIVE
                notes.append(Note("fail.overflowed", {**label, "ops": _ops_text(quantity)}))
            elif proven is False and self._dropped(runs, quantity, record.rank):
                # what its operations delivered was not kept (a benchmark loop beside it, as large as the answer's
                # own operations, used up the grader's budget for evidence): unproven, and nothing worse is known
                outcome = Outcome.NOT_COLLECTIVE
                notes.append(Note("fail.evidence_dropped", {**label, "ops": _ops_text(quantity)}))
            elif proven is False:
                outcome = Outcome.NOT_COLLECTIVE
                how = self.how_computed(runs, quantity, record.rank)
                notes.append(Note(NOT_COLLECTIVE_WORDS[how], {**label, "ops": _ops_text(quantity)}))
                notes.extend(self._why_clean(runs, proof, quantity, how))
            elif proven is None and failure is not None:   # never observed, because the rank stopped
                outcome, note = failure
                notes.append(note)
                details.extend(diagnose.last_call(record, note))
            elif proven is None:
                outcome = Outcome.NOT_COLLECTIVE
                notes.append(Note("fail.unobserved", {**label, "ops": _ops_text(quantity)}))
        if outcome is not Outcome.PASS:
            notes.extend(diagnose.call_causes(quantity, ws, record, run))
            if not explained:
                others = {q.name: self.value(record, q.name)[0] for q in self.exercise.quantities}
                notes.extend(diagnose.exercise_causes(self.exercise, quantity, value, ws, record, outcome, others))
        return record.rank, outcome, notes, details

    def _weights(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> list[Note]:
        """For a wrong value: what the perturbed run shows of how the ranks' data combined (a rank's data
        missing, or counted twice), when the value is otherwise made of what was delivered."""
        for run in runs.perturbed:
            value, snapshot = self.value(run.ranks[rank], quantity.name)
            if snapshot or self.shape_ok(quantity, value, runs.world_size)[0] is not Outcome.PASS:
                continue
            proof = self.proof(run, quantity, rank)
            if proof is not None and proof.finding is not None and proof.finding.key == "weights":
                return _why(proof, quantity)
        return []

    def evaluate_uses(self, check: Check, runs: WorldSizeRuns) -> CheckResult:
        """The quantities came through their operations, and no forbidden operation ran: measured at the
        switch, where every operation between ranks passes (there is no group it does not see). "Came
        through" is evidence, not a call count: a quantity with the right numbers is proven from what its
        operations delivered, or at least follows that data; right numbers that stay the same when the
        grader changes the data in flight were computed without it (collectives on zeros, or on real data
        whose results are never read, beside a local answer). A wrong value is left to its own checks.
        The outcome says what happened: a forbidden operation, a rank that failed (so that an operation
        never completed), right numbers computed without the operations' data, or a wrong use."""
        run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
        if run is None or run.stop == "grader_error":
            return CheckResult(check, Outcome.GRADER_ERROR, notes=[Note("fail.grader_run", {"error": getattr(run, "error", "") or ""})])
        forbidden = set(check.forbid or self.exercise.forbidden)
        notes, outcome = [], Outcome.WRONG
        # every run of the world size counts (code that behaves one way where values are checked and another
        # where they are proven fails in the run that shows it): a forbidden operation in any of them, an
        # operation not used in the deciding run or in any other that ended with no rank failing
        measured = [m for m, _ in self.measured_runs(runs, None)] or [run]
        for record in (rec for m in measured for rec in m.ranks):
            used = next((c for c in record.calls if c.op in forbidden), None)
            if used is not None:
                notes.append(Note("fail.forbidden_op", {"rank": record.rank, "op": diagnose.op_name(used),
                                                        **diagnose.at(used)}))
                notes += diagnose.forbidden_words(self.exercise, used.op, diagnose.op_name(used))
                outcome = Outcome.FORBIDDEN
                break
        wanted = {op for q in self.exercise.quantities for op in q.through}
        p2p = wanted & {"send", "recv"}
        unused = []
        for m in [run] + [m for m in measured if m is not run and self.whole(m)]:
            # used means completed: point-to-point, a send and a receive that met (on some ranks: a root may
            # only receive); a collective, on every rank
            done = [c for rec in m.ranks for c in rec.calls if c.completed and c.ok]
            if p2p and not (any(c.op == "send" for c in done) and any(c.op == "recv" for c in done)):
                unused.append("/".join(sorted(p2p, reverse=True)))
            for op in sorted(wanted - p2p):
                if not all(any(c.op == op and c.completed and c.ok for c in rec.calls) for rec in m.ranks):
                    unused.append(op)
            if unused:
                unused = list(dict.fromkeys(unused))
                break
        if unused:
            failures = [f for f in (diagnose.rank_failure(run, rec) for rec in run.ranks) if f is not None]
            failure = next((f for f in failures if f[1].key != "fail.stopped"), failures[0] if failures else None)
            if failure is not None:   # an operation never completed because a rank failed: that is the news
                notes.append(failure[1])
                if outcome is not Outcome.FORBIDDEN:
                    outcome = failure[0]
            notes += [Note("cause.op_not_used", {"op": op}) for op in unused]
        elif outcome is not Outcome.FORBIDDEN:
            notes += self._not_through(runs, wanted)
            if notes:
                outcome = Outcome.NOT_COLLECTIVE
        if notes:
            return CheckResult(check, outcome, notes=notes)
        return CheckResult(check, Outcome.PASS, check.points, [Note("pass.uses", {"ops": sorted(wanted)})])

    def _not_through(self, runs: WorldSizeRuns, wanted: set) -> list[Note]:
        """For each quantity that comes through the operations of a "uses" check: a rank whose value has the
        right numbers, is not proven, and stays exactly what it is in the clean run when the data in flight
        changes (a locally computed answer beside the operations)."""
        notes = []
        for quantity in self.exercise.quantities:
            if not quantity.provenance or not set(quantity.through) & wanted:
                continue
            for record in runs.clean.ranks if runs.clean is not None else []:
                value, _ = self.value(record, quantity.name)
                if self.judge_clean(quantity, value, runs.world_size, record.rank)[0] is not Outcome.PASS:
                    continue   # a wrong value: its own checks say what is wrong with it
                if self.provenance(runs, quantity, record.rank)[0]:
                    continue
                if self.how_computed(runs, quantity, record.rank) == "local":
                    notes.append(Note("cause.result_unused", {"quantity": quantity.name, "ops": list(quantity.through)}))
                    break
        return notes

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
            return not (np.array_equal(va.data, vb.data) or diagnose.all_close(vb.data, va.data, va.dtype))
        return None

    def how_computed(self, runs: WorldSizeRuns, quantity: Quantity, rank: int) -> str:
        """For right numbers that are not proven: "local" where the value stayed the same although everything
        its operations delivered to the rank changed (certainly computed without it); "derived" where it
        changed with that data (computed from it, though not as the exercise asks); "untraced" otherwise
        (say, what was delivered travelled unperturbed: pickled objects, integers)."""
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
        if not unperturbed and all(perturbable(d.get("dtype", "")) for c in calls if c.receives for d in c.delivered):
            return "local"
        return "untraced"

    def whole(self, run: RunOutcome) -> bool:
        """The run ended with every rank done and none failing."""
        return run.stop == "completed" and not any(diagnose.rank_failure(run, rec) for rec in run.ranks)

    def ran_cleanly(self, runs: WorldSizeRuns) -> bool:
        """The switch run that decides this world size (its clean run, else its perturbed run) ended with
        every rank done and none failing."""
        decided = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
        return decided is not None and self.whole(decided)

    def measured_runs(self, runs: WorldSizeRuns, quantity: Quantity | None) -> list[tuple[RunOutcome, set[int]]]:
        """Every switch run of the world size whose measures a check of what passed through the switch
        judges (the clean run first), each with the ranks whose part of it is complete: every rank of a
        whole run; in another, the ranks whose value of `quantity` the run proved. Runs the grader could
        not complete are left out."""
        out = []
        for run in runs.switch_runs:
            if run.stop == "grader_error":
                continue
            n = run.request.world_size
            if self.whole(run):
                complete = set(range(n))
            elif quantity is not None:
                complete = {r for r in range(n) if (p := self.proof(run, quantity, r)) is not None and p.ok}
            else:
                complete = set()
            out.append((run, complete))
        if runs.clean is not None and runs.clean.stop == "grader_error":
            return []   # the run that decides values could not be made: nothing is judged
        return out

    def passes_any(self, exercise: Exercise, runs: WorldSizeRuns) -> bool:
        """Some runtime check of this world size passes through the switch (a real-backend run matters)."""
        return any(self.evaluate(c, runs).passed for c in exercise.checks
                   if c.world_size == runs.world_size and c.kind != "static")

    def real_backend(self, results: list[CheckResult], runs: dict) -> None:
        """A check that passed through the switch loses its points where the real-backend run of its world
        size shows the code does not work on real gloo (or NCCL) as it is: a value check, where that
        quantity is not right on every rank there (read as the switch run's values are: returned, or the
        entry function's locals when it raised); any other check, where the real run failed and the switch
        runs of that world size did not."""
        for ws, entry in runs.items():
            if entry.real is None or entry.real.stop == "grader_error":
                continue
            for i, result in enumerate(results):
                if result.spec.world_size != ws or result.spec.kind == "static" or not result.passed:
                    continue
                problem = self._real_problem(entry, result.spec)
                if problem:
                    results[i] = CheckResult(result.spec, Outcome.REAL_BACKEND, 0, notes=problem)

    def _real_problem(self, runs: WorldSizeRuns, check: Check) -> list[Note]:
        real, ws = runs.real, runs.world_size
        lead = Note("fail.real_backend", {"backend": real.request.backend})
        failures = [f for f in (diagnose.rank_failure(real, rec) for rec in real.ranks) if f is not None]
        failure = next((f[1] for f in failures if f[1].key != "fail.stopped"), failures[0][1] if failures else None)
        # what the real run shows failed, and where it ran out of time, an isend the switch saw never waited on
        failed = [] if failure is None else [failure]
        if failure is not None and failure.key.startswith("fail.timeout"):
            failed += self._unwaited_sends(runs)
        if check.kind != "value":
            return [lead, *failed] if failed else []
        quantity = self.exercise.quantity(check.quantity)
        for record in real.ranks:
            value, _ = self.value(record, quantity.name)
            if self.judge_clean(quantity, value, ws, record.rank)[0] is not Outcome.PASS:
                if failed:
                    return [lead, *failed]
                return [lead, Note("real.differs", {"backend": real.request.backend, "quantity": quantity.name}),
                        self._rank_value(quantity, ws, record.rank, value)]
        return []

    @staticmethod
    def _unwaited_sends(runs: WorldSizeRuns) -> list[Note]:
        """A hung real run beside a switch run where a rank never waited on an isend's request: on gloo a
        request dropped before its receiver posts the receive is never delivered (FIELD-NOTES), which the
        switch, delivering every send it was given, does not show."""
        for run in runs.switch_runs[:1]:
            for record in run.ranks:
                call = next((c for c in record.calls if c.op == "send" and c.completed and c.ok and not c.waited
                             and c.api == "isend"), None)
                if call is not None:
                    return [Note("cause.isend_not_waited", {"rank": record.rank, **diagnose.at(call)})]
        return []

    def overrule_static(self, results: list[CheckResult], runs: dict) -> None:
        """Static checks against what the runs observed, the stronger evidence either way:
          - an operation the text does not show reached (DTensor's full_tensor / redistribute, getattr
            through a table of names): where every rank of a graded run completed it, called from the
            submission's code, the check passes after all;
          - no forbidden operation in the text, contradicted by the runs (a name built at run time, a
            group's own method): the operation ran, so the check fails after all."""
        for i, result in enumerate(results):
            spec = result.spec
            if spec.kind != "static" or not spec.op or result.passed or result.outcome not in (Outcome.NOT_CALLED, Outcome.TODO):
                continue
            seen = self._completed_everywhere(spec.op, runs)
            if seen is not None:
                results[i] = CheckResult(spec, Outcome.PASS, spec.points, [Note("static.called_at_run", {
                    "op": spec.op, "entry": self.exercise.entry, "api": diagnose.op_name(seen), **diagnose.at(seen)})])
        for i, result in enumerate(results):
            spec = result.spec
            if spec.kind != "static" or not spec.forbid or not result.passed:
                continue
            used = next((c for ws_runs in runs.values() for run in ws_runs.switch_runs
                         for record in run.ranks for c in record.calls if c.op in spec.forbid), None)
            if used is not None:
                results[i] = CheckResult(spec, Outcome.FORBIDDEN, 0, [
                    Note("static.forbidden_at_run", {"op": diagnose.op_name(used), **diagnose.at(used)}),
                    *diagnose.forbidden_words(self.exercise, used.op, diagnose.op_name(used))])

    @staticmethod
    def _completed_everywhere(op: str, runs: dict):
        """The first call of `op` in a graded switch run where every rank completed one from its code (not
        from the module's top level), or None."""
        for ws_runs in runs.values():
            for run in ws_runs.switch_runs:
                if run.stop == "grader_error" or not run.ranks:
                    continue
                found = [next((c for c in rec.calls if c.op == op and c.completed and c.ok and c.function != "<module>"), None)
                         for rec in run.ranks]
                if all(c is not None for c in found):
                    return found[0]
        return None

    def _why_clean(self, runs: WorldSizeRuns, proof: Proof | None, quantity: Quantity, how: str) -> list[Note]:
        """The tracer's finding for right numbers that are not proven, as the student may read it: with the
        clean run's values (a perturbed run's numbers are the grader's, not what the code computes), and only
        where it holds: a send blamed as not the rank's own data is left out where the clean run shows it was
        (the same numbers), or where another quantity through the same operation is proven on every rank
        (its proof says what each rank sent there was its own)."""
        if proof is None or proof.finding is None:
            return []
        finding, clean = proof.finding, runs.clean
        params = finding.params
        if finding.key == "not_delivered":
            rank, element = params.get("rank"), params.get("element")
            if clean is None or not isinstance(rank, int) or rank >= len(clean.ranks):
                return []
            data = self.value(clean.ranks[rank], quantity.name)[0].data
            if data is None or not isinstance(element, int) or element >= data.size:
                return []
            key = "why.not_delivered" if how == "local" else "why.not_delivered_value"
            return [Note(key, {"quantity": quantity.name, "rank": rank, "element": element,
                               "value": float(data.reshape(-1)[element]), "ops": _ops_text(quantity)})]
        if finding.key == "contribution":
            rank, n, op = params.get("rank"), params.get("n"), params.get("op")
            if any(other.name != quantity.name and op in other.through and other.provenance and
                   all(self.provenance(runs, other, r)[0] for r in range(runs.world_size))
                   for other in self.exercise.quantities):
                return []
            calls = clean.ranks[rank].calls if clean is not None and isinstance(rank, int) and rank < len(clean.ranks) else []
            call = calls[n - 1] if isinstance(n, int) and 0 < n <= len(calls) and calls[n - 1].op == op else None
            if call is None:
                return []
            sent = np.concatenate([v for v in call.sent_values() if v is not None] or [np.zeros(0)])
            own = np.asarray(params.get("own") or [], dtype=np.float64)
            if not quantity.derived and own.size and sent.size >= own.size and diagnose.all_close(sent[:own.size], own, "torch.float32"):
                return []
            notes = _why(proof, quantity)
            for note in notes:
                note.params["sent"] = diagnose.preview(sent)
            return notes
        return _why(proof, quantity)

    def _rank_value(self, quantity: Quantity, ws: int, rank: int, value: Value | None) -> Note:
        """What was expected on this rank and what came back (visible checks only)."""
        if value is not None and value.kind in ("sequence", "other"):   # no shape, dtype or values to show
            return Note("detail.rank_value_other", {
                "rank": rank, "quantity": quantity.name, "expected_shape": str(quantity.expected_shape(ws)),
                "expected": diagnose.preview(quantity.expected_array(rank, ws)), "type": value.type or "?"})
        return Note("detail.rank_value", {
            "rank": rank, "quantity": quantity.name,
            "expected_shape": str(quantity.expected_shape(ws)), "expected": diagnose.preview(quantity.expected_array(rank, ws)),
            "shape": str(value.shape) if value else "-", "dtype": (value.dtype or "-") if value else "-",
            "values": diagnose.preview(value.data if value else None)})


def _tolerance(quantity: Quantity, value: Value) -> str:
    """The dtype whose tolerance a value is compared with: the quantity's, when it declares one; else the
    value's, but never a half-precision one (a value returned in float16 keeps float32's tolerance: what
    half precision lost is an error unless the exercise asks for it)."""
    if quantity.tolerance:
        return quantity.tolerance
    return "torch.float32" if value.dtype in HALF else (value.dtype or "torch.float32")


NOT_COLLECTIVE_WORDS = {"local": "fail.not_collective", "derived": "fail.not_collective_derived",
                        "untraced": "fail.not_collective_untraced"}


def _ops_text(quantity: Quantity) -> list[str]:
    return list(quantity.through) or ["-"]


def _ops_used(quantity: Quantity, runs: WorldSizeRuns) -> list[str]:
    """The operations of `through` the ranks completed in the run that decides (what a passed check names:
    of an exercise that accepts several ways, the one the student took); all of them where none shows."""
    run = runs.clean or (runs.perturbed[0] if runs.perturbed else None)
    used = {c.op for rec in run.ranks for c in rec.calls if c.completed and c.ok} if run is not None else set()
    return [op for op in quantity.through if op in used] or _ops_text(quantity)


def _why(proof: Proof | None, quantity: Quantity) -> list[Note]:
    """The tracer's finding, as a cause the student can act on."""
    if proof is None or proof.finding is None:
        return []
    finding = proof.finding
    params = {"quantity": quantity.name, **{k: v for k, v in finding.params.items() if not isinstance(v, list)}}
    if finding.key == "contribution":
        params["sent"] = diagnose.preview(finding.params.get("sent"))
        params["own"] = diagnose.preview(finding.params.get("own"))
        # its own data is what it computes from what it received: no fixed values (a reference step's first
        # operation sends the rank's own data, as the step computes it before anything arrived)
        if quantity.derived and (quantity.combine != "reference" or finding.params.get("derived")):
            return [Note("why.contribution_derived", params)]
    if finding.key == "weights":
        params["missing"] = [str(s) for s in finding.params.get("missing") or []] or ["-"]
        params["twice"] = [str(s) for s in finding.params.get("twice") or []] or ["-"]
    return [Note(f"why.{finding.key}", params)]


def _unique_causes(notes: list[Note]) -> list[Note]:
    """Each cause once, whichever ranks it came from (rank-specific notes stay as they are)."""
    out, seen = [], set()
    for note in notes:
        if note.key.startswith(("cause.", "why.")) or ".cause." in note.key:  # the exercise's causes too
            marker = (note.key, tuple(sorted((k, str(v)) for k, v in note.params.items() if k not in ("rank", "line", "sent"))))
            if marker in seen:
                continue
            seen.add(marker)
        out.append(note)
    return out


def _drop_partial_unchanged(failed) -> None:
    """`cause.unchanged` (the operation's result was not used), and its kin, hold only if every rank whose
    value was examined kept its own input (divided by world_size, for `cause.own_data_divided`); one rank
    whose input happens to equal a wrong result proves nothing."""
    examined = [notes for _, _, notes, details in failed if details]
    for key in ("cause.unchanged", "cause.unchanged_p2p", "cause.own_data_divided"):
        if all(any(n.key == key for n in notes) for notes in examined):
            continue
        for notes in examined:
            notes[:] = [n for n in notes if n.key != key]
