"""A reference step: what every rank computes, written once over an abstract communicator.

An exercise whose quantities are what each rank computes from what it received (an optimizer step on
reduce-scattered gradients, a layer's output after an all-reduce of partial sums) declares them as one
function, the way the chapter writes its reference answer, in numpy:

    def step(comm, rank, ws, divide=True):          # keyword arguments with defaults: the knobs of mistakes
        grad = comm.reduce_scatter(padded(local_gradient(rank)), op="mean")
        shard = params_shard(rank) - LR * grad
        return {"params": comm.all_gather(shard)}   # one array per quantity

The engine runs it in two ways, neither of which the exercise sees:
  - with every rank's step at once on an ideal network (`ideal`): the expected values, and the values each
    declared mistake leaves (the same step with a knob turned);
  - once per graded run, replaying each rank's step against what the switch measured
    (verify/replay.py): what each rank sent must be what its step sends, at a scale the step allows, and
    what its step receives is what the switch delivered to it. The values the replay ends with carry the
    run's secret deltas: a value equal to them came from the communication, made of every rank's own data.

Operations (x a 1-D numpy array; `group` global ranks, default every rank; `op` "sum" or "mean"):
    all_reduce(x, op, group)       the sum (mean) of every member's x
    reduce_scatter(x, op, group)   x cut into len(group) equal chunks; this rank's chunk of the sum (mean)
    all_gather(x, group)           every member's x, concatenated in group order
    broadcast(x, src, group)       src's x (src a global rank; x is ignored elsewhere)
    send(x, dst) / recv(src)       point to point
    replicated(x, group)           x itself, the same on every member: no operation in the step, but a rank may
                                   all-reduce it into its mean (autograd's backward of
                                   torch.distributed.nn.functional.all_reduce does, on a loss divided by N), and
                                   the replay then reads it from what that all-reduce delivered
`scales` on the sending operations says what multiple of x a rank may send: by default x itself or x / N
(a mean made as a sum of pre-divided parts); "any" for any non-zero multiple (a loss scale).
Nothing here reads a run: this module is the exercise's side; the replay is the engine's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

OPS = ("sum", "mean")
DEFAULT_SCALES = ("1", "1/N")
TIMEOUT_S = 10.0     # an ideal run of a correct step takes milliseconds: past this the step deadlocks


class StepError(RuntimeError):
    """The step itself cannot run (a deadlock between its ranks, a collective called with different sizes):
    an instructor's error, reported as a declaration error."""


@dataclass(frozen=True)
class Op:
    """One operation a rank's step made: its kind, its group (global ranks), what it sent (flattened), its
    reduce op, root or peer, and the scales it allows."""
    kind: str
    group: tuple[int, ...]
    x: np.ndarray | None
    op: str = "sum"
    root: int | None = None
    scales: tuple[str, ...] = DEFAULT_SCALES


class Comm:
    """What a step talks to. Subclasses answer `_exchange`: the ideal network here, the replay in the engine."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    # -- the operations a step uses
    def all_reduce(self, x, op: str = "sum", group=None, scales=DEFAULT_SCALES) -> np.ndarray:
        return self._exchange(Op("all_reduce", self._group(group), _flat(x), _op(op), scales=_scales(scales)))

    def reduce_scatter(self, x, op: str = "sum", group=None, scales=DEFAULT_SCALES) -> np.ndarray:
        group = self._group(group)
        x = _flat(x)
        if x.size % len(group):
            raise StepError(f"reduce_scatter of {x.size} elements on {len(group)} ranks: not equal chunks")
        return self._exchange(Op("reduce_scatter", group, x, _op(op), scales=_scales(scales)))

    def all_gather(self, x, group=None) -> np.ndarray:
        return self._exchange(Op("all_gather", self._group(group), _flat(x), scales=("1",)))

    def broadcast(self, x, src: int, group=None) -> np.ndarray:
        group = self._group(group)
        if src not in group:
            raise StepError(f"broadcast from rank {src}, not in the group {list(group)}")
        return self._exchange(Op("broadcast", group, _flat(x) if self.rank == src else None, root=src, scales=("1",)))

    def replicated(self, x, group=None) -> np.ndarray:
        return self._exchange(Op("replicated", self._group(group), _flat(x), "mean"))

    def send(self, x, dst: int) -> None:
        self._exchange(Op("send", (self.rank, dst), _flat(x), root=dst, scales=("1",)))

    def recv(self, src: int) -> np.ndarray:
        return self._exchange(Op("recv", (src, self.rank), None, root=src))

    # -- for subclasses
    def _group(self, group) -> tuple[int, ...]:
        out = tuple(range(self.world_size)) if group is None else tuple(int(r) for r in group)
        if self.rank not in out:
            raise StepError(f"rank {self.rank} calls an operation of a group it is not in: {list(out)}")
        return out

    def _exchange(self, op: Op) -> np.ndarray | None:
        raise NotImplementedError


def _flat(x) -> np.ndarray:
    return np.array(x, dtype=np.float64).reshape(-1)


def _op(op: str) -> str:
    if op not in OPS:
        raise StepError(f"reduce op {op!r}: a step reduces with one of {list(OPS)}")
    return op


def _scales(scales) -> tuple[str, ...]:
    return ("any",) if scales == "any" else tuple(scales)


def combine(op: Op, inputs: dict[int, np.ndarray], rank: int) -> np.ndarray | None:
    """What `op` delivers to `rank` on an ideal network, from every member's input (global rank -> x)."""
    group = op.group
    if op.kind in ("all_reduce", "reduce_scatter"):
        sizes = {inputs[q].size for q in group}
        if len(sizes) != 1:
            raise StepError(f"{op.kind} with different sizes on the ranks of {list(group)}: {sorted(sizes)}")
        total = np.sum([inputs[q] for q in group], axis=0)
        if op.op == "mean":
            total = total / len(group)
        if op.kind == "all_reduce":
            return total
        n = total.size // len(group)
        k = group.index(rank)
        return total[k * n:(k + 1) * n]
    if op.kind == "all_gather":
        return np.concatenate([inputs[q] for q in group])
    if op.kind == "broadcast":
        return inputs[op.root].copy()
    if op.kind == "recv":
        return inputs[op.root].copy()
    return None


class _Network:
    """Every rank's step at once: each collective waits for its group, each recv for its send."""

    def __init__(self, ws: int):
        self.ws = ws
        self.lock = threading.Condition()
        self.posted: dict = {}        # key -> {rank: x}
        self.counts: dict = {}        # (rank, channel) -> how many operations it made there
        self.failed: BaseException | None = None

    def key(self, rank: int, op: Op) -> tuple:
        channel = ("p2p", op.group) if op.kind in ("send", "recv") else ("collective", op.group)
        n = self.counts.get((rank, channel), 0)
        self.counts[(rank, channel)] = n + 1
        return channel + (n,)

    def exchange(self, rank: int, op: Op) -> np.ndarray | None:
        with self.lock:
            key = self.key(rank, op)
            if op.kind == "recv":
                members = (op.root,)
            elif op.kind == "send":
                self.posted.setdefault(key, {})[rank] = op.x
                self.lock.notify_all()
                return None
            else:
                members = op.group
                self.posted.setdefault(key, {})[rank] = op.x
                self.lock.notify_all()
            posted = self.posted.setdefault(key, {})
            if not self.lock.wait_for(lambda: self.failed is not None or all(q in posted for q in members), TIMEOUT_S):
                raise StepError(f"rank {rank} waits forever in its {op.kind} on {list(op.group)}: the step deadlocks")
            if self.failed is not None:
                raise StepError("another rank's step failed")
            return combine(op, posted, rank)


class _IdealComm(Comm):
    def __init__(self, rank: int, world_size: int, network: _Network):
        super().__init__(rank, world_size)
        self.network, self.sent = network, []

    def _exchange(self, op: Op):
        if op.kind == "replicated":
            return op.x.copy()
        if op.x is not None:
            self.sent.append((op.kind, op.x))
        return self.network.exchange(self.rank, op)


def run_ranks(ws: int, body) -> list:
    """body(rank) in one thread per rank; each rank's result, or the first exception raised, re-raised."""
    results: list = [None] * ws
    errors: list = []

    def one(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as err:  # noqa: BLE001  (handed to the caller)
            errors.append(err)

    threads = [threading.Thread(target=one, args=(rank,), daemon=True) for rank in range(ws)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 3)
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise StepError("the step did not finish")
    return results


def ideal(step, ws: int, sends: list | None = None, **knobs) -> list[dict[str, np.ndarray]]:
    """Every rank's quantities after `step` on an ideal network (exact, in float64); `sends`, when given, gets
    what each rank sent, in order: one list of (operation, x) per rank."""
    network = _Network(ws)
    comms = [_IdealComm(rank, ws, network) for rank in range(ws)]

    def body(rank: int):
        try:
            out = step(comms[rank], rank, ws, **knobs)
        except BaseException as err:
            with network.lock:
                network.failed = err
                network.lock.notify_all()
            raise
        if not isinstance(out, dict):
            raise StepError(f"the step returns {type(out).__name__}, not a dict of quantity -> array")
        return {name: np.array(value, dtype=np.float64).reshape(-1) for name, value in out.items()}

    values = run_ranks(ws, body)
    if sends is not None:
        sends[:] = [comm.sent for comm in comms]
    return values


_OUTCOMES: dict = {}


def outcome(step, ws: int, **knobs) -> list[dict[str, np.ndarray]]:
    """`ideal(step, ws, **knobs)`, computed once per step, world size and knobs (a step is a pure function
    of them); the arrays are read-only, so that no reader changes them for the next."""
    return _ideal(step, ws, knobs)[0]


def sent(step, ws: int, **knobs) -> list[list[tuple[str, np.ndarray]]]:
    """What each rank sends in `step` on an ideal network, in order: (operation, x) per send."""
    return _ideal(step, ws, knobs)[1]


def _ideal(step, ws: int, knobs: dict):
    key = (step, ws, tuple(sorted(knobs.items())))
    if key not in _OUTCOMES:
        sends: list = []
        values = ideal(step, ws, sends, **knobs)
        for array in [a for rank_values in values for a in rank_values.values()] + [x for s in sends for _, x in s]:
            array.setflags(write=False)
        _OUTCOMES[key] = (values, sends)
    return _OUTCOMES[key]
