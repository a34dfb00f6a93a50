"""Which runs one grading makes, round by round, and the real-backend run beside them.

Every graded run goes through the switch (processes/runner.py, switch/). Per world size:
  round 1   a perturbed run (what the quantities come through, and what the exercise forbids, perturbed);
            it alone proves an honest submission's values (Judge.proven), so nothing more is needed;
  round 2   the clean run of every world size the perturbed run did not prove: what the code really
            computes, for the verdict and its causes (none where the perturbed run delivered nothing to any
            rank: the perturbation never reached the code, so that run is the clean one, Judge.untouched);
  round 3   (rare) a run perturbing only the operations of a quantity that rounds 1-2 could not observe (a
            check of the student's own that raised before it was computed).
The student's own checks (assert statements, torch.testing.assert_close) fail on perturbed data by design: a
perturbed run records each that fails, with the values as they stood there, and goes on (rank.py). It decides
alone only where those values are proven too (Judge.proven): a clean run would have stopped at such a check
with them, or gone on as the perturbed run did. Otherwise (a check of an intermediate value, before the
answer exists) the clean run says what the code computes, and the perturbed run where the answer came from.
Code that raises on its own values in another way (`if not torch.allclose(...): raise ...`) fails its
perturbed runs, so its clean runs decide: `grade` and `check`, which someone waits for, start the clean run
of a world size of code that checks its own values as soon as its perturbed run ends without deciding alone,
beside the other runs (the verdicts are those of two rounds; an honest answer's perturbed runs decide alone,
so it costs no clean run).

The real-backend run: the student's code once more, at the visible world size, on torch's own gloo (NCCL
where enough GPUs are visible), for what the chapter teaches: its output and its real communication times.
It is needed only where the switch run of the visible world size ran without a failure and some check of
it passes (a failure or a different answer there costs that world size's points, Judge.real_backend). `grade` and `check` start it in
round 1 and cancel it as soon as the visible perturbed run shows it will not be needed; a batch starts it
only once it is: as soon as that perturbed run proves its values and passes a check (beside the other world
sizes' runs), else after the last round. One that runs out of time is run once more, with twice the time,
before it costs anything.
"""
from __future__ import annotations

from .exercise.spec import Exercise
from .processes.runner import Runner
from .records import RunRequest, Stop
from .verify.evidence import WorldSizeRuns
from .verify.judge import Judge


def backend_for(ws: int, backend: str, gpus: int) -> str | None:
    """The real backend at world size ws: gloo, or NCCL with a GPU per rank (None: NCCL asked for, too few)."""
    if backend == "gloo":
        return "gloo"
    if backend == "nccl":
        return "nccl" if gpus >= ws else None
    return "nccl" if gpus >= ws else "gloo"


def perturbed_ops(exercise: Exercise) -> tuple[str, ...]:
    """The operations a perturbed run perturbs: those the quantities come through, and those the exercise
    forbids (a value that went through a forbidden operation can then still be shown right, if not
    allowed: the "uses" check says so)."""
    ops = []
    for op in [op for quantity in exercise.quantities for op in quantity.through] + list(exercise.forbidden_ops):
        ops += ["send", "recv"] if op in ("send", "recv") else [op]
    return tuple(dict.fromkeys(ops))


def run_all(submission, exercise: Exercise, judge: Judge, world_sizes, runner: Runner, *, backend: str,
            show_output: bool, real: bool, preload: tuple, self_checks: bool = False) -> dict[int, WorldSizeRuns]:
    gpus = runner.gpus if backend != "gloo" else 0
    names = tuple(q.name for q in exercise.quantities)
    visible = exercise.visible_world_sizes[:1]
    real_at = visible[0] if real and backend != "none" and visible and visible[0] in world_sizes else None
    real_backend = backend_for(real_at, backend, gpus) if real_at is not None else None
    if real_backend is None:   # NCCL asked for, too few GPUs: no real-backend run (api.py says so)
        real_at = None

    def request(ws: int, perturb: tuple, label: str, mode: str = "switch", scale: float = 1.0) -> RunRequest:
        return RunRequest(world_size=ws, source=submission.source, filename=submission.filename,
                          entry=exercise.entry, quantities=names, perturb=perturb, label=label, preload=preload,
                          mode=mode, backend=real_backend if mode == "real" else "gloo",
                          time_scale=scale,
                          cuda=gpus > 0 and (mode == "switch" or real_backend == "nccl"),
                          files=dict(getattr(submission, "files", None) or {}))

    every = perturbed_ops(exercise)
    first = [request(ws, every, "perturbed") for ws in world_sizes]
    # code that checks its own values: the clean run of a world size starts as soon as its perturbed run ends
    # without deciding alone (watch), beside the other runs, not after them
    hasty = {ws for ws in world_sizes if show_output and self_checks}
    if show_output and real_at is None and visible and visible[0] in world_sizes:
        first.append(request(visible[0], (), "clean"))   # no real-backend run: its output is what the report shows
        hasty.discard(visible[0])
    speculative = show_output and real_backend is not None
    if speculative:
        first.append(request(real_at, (), "real", "real"))
    runs = {ws: WorldSizeRuns(ws) for ws in world_sizes}

    def watch(index: int, outcome):
        """Start the clean run of code that checks its own values as soon as its perturbed run does not decide
        alone. Cancel the speculative real-backend run once the visible perturbed run shows it is not needed;
        where there is none, start the real-backend run as soon as that run alone shows it is (beside the other
        world sizes' runs, not after them)."""
        req = outcome.request
        answer = []
        if req.perturb and not req.real and req.world_size in hasty and not judge.proven(outcome):
            hasty.discard(req.world_size)
            answer.append(request(req.world_size, (), "clean"))
        if req.perturb and req.world_size == real_at and not req.real:
            if speculative and not judge.proven(outcome) and (not self_checks or outcome.stop in (Stop.DEADLOCK, Stop.TIMEOUT)):
                answer.append(len(first) - 1)
            elif not speculative and judge.proven(outcome):
                decided = WorldSizeRuns(real_at, perturbed=[outcome])
                if judge.ran_cleanly(decided) and judge.passes_any(exercise, decided):
                    answer.append(request(real_at, (), "real", "real"))
        return answer

    for outcome in runner.run_many(first, watch=watch):
        entry = runs[outcome.request.world_size]
        if outcome.request.real:
            entry.real = outcome if outcome.stop != Stop.CANCELLED else None
        elif outcome.request.perturb:
            entry.perturbed.append(outcome)
        else:
            entry.clean = outcome
    for entry in runs.values():
        if entry.clean is None and not judge.proven(entry.perturbed[0]) and judge.untouched(entry.perturbed[0]):
            entry.clean = entry.perturbed[0]   # what a clean run would repeat: nothing was delivered
    second = [request(ws, (), "clean") for ws, entry in runs.items()
              if entry.clean is None and not judge.proven(entry.perturbed[0])]
    for outcome in runner.run_many(second) if second else []:
        runs[outcome.request.world_size].clean = outcome
    third = [request(ws, ops, "perturbed-" + "+".join(ops))
             for ws, entry in runs.items() for ops in judge.unobserved(entry)]
    for outcome in runner.run_many(third) if third else []:
        runs[outcome.request.world_size].perturbed.append(outcome)
    if real_at is not None:
        entry = runs[real_at]
        if not (judge.ran_cleanly(entry) and judge.passes_any(exercise, entry)):
            entry.real = None   # it could cost nothing: the switch runs failed where it would
        elif entry.real is None:
            entry.real = runner.run_many([request(real_at, (), "real", "real")])[0]
        if entry.real is not None and entry.real.stop == Stop.TIMEOUT:
            # code the switch runs passed, out of time on gloo: once more with twice the time before it costs
            # the world size's points (gloo's set-up on a loaded machine: a class's fork bomb beside it)
            entry.real = runner.run_many([request(real_at, (), "real", "real", scale=2.0)])[0]
    return runs
