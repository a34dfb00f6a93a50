"""The switch: the only channel between the ranks of a run, in a grader process where no student code runs.

Each rank has one socket, to the supervisor, which feeds every frame a rank sends to the Switch of its run
(processes/runner.py). For every operation a rank starts (an "op" frame: the method, its group, its
options, the tensors it sends and the shapes of its output buffers) the switch
  - checks the call alone, as gloo does (checks.py): an error, in gloo's words, goes back to that rank;
  - in a perturbed run, adds fresh secret deltas to its own copy of what the rank sent (perturb.py): at once
    for a small call, for a large one when its operation runs (the calls of an operation on two cores);
  - pairs it: a collective with the calls of the other ranks of its group with the same index on that
    group (all of them, or it waits), checking that they fit (agree.py); a send with the first
    receive posted for it (a send completes only when its receive is posted: gloo does not buffer sends);
  - computes what each rank's output buffers receive (ops.Family.run) and sends it back ("done" frames);
  - records all of it (record.Call): what was sent, what entered the operation, what was delivered and
    where each delivered element came from, in the order of the switch's own clock.
Nothing a rank says about communication is taken on trust: what it sent and received is what passed here.
A rank's words (the line it called from, whether it waited) are kept as hints for the feedback only.

The switch also knows when no operation can progress (`stuck`): every rank that has not finished waits on
an operation that nothing pending or to come can complete.
"""
from __future__ import annotations

import functools
from collections import deque

import numpy as np

from .. import comm, twocores, wire
from . import checks, ops, perturb
from .record import Call, Piece
from .tensors import REDUCES

# Values kept per rank for verification (sizes and every record are kept beyond them): the rank's first
# operations up to RETAIN_FIRST, then windows of its latest ones up to RETAIN_LATEST in all: RETAIN_LATEST_SMALL
# for operations of at most SMALL_OP, the rest for larger ones (the oldest completed operation of a window makes
# way for a new one). An answer computed before a long benchmark loop, after a long warm-up, or between a
# warm-up and a loop whose tensors are of the other size class, keeps its evidence; one between loops of its
# own size class may lose it (its checks then fail, saying so: evidence lost never passes a check). An operation
# too large for its window (an all_reduce of 16M float32: 64 MiB sent, as much perturbed and delivered) is kept
# alone, the rank's latest such one: at most 2 x MAX_PAYLOAD + MAX_OUTPUT per rank beside the windows.
LINEAR_REDUCES = (None, "SUM", "AVG", "PREMUL_SUM")   # what a perturbed operation may combine (None: no reduction)
RETAIN_FIRST = 16 << 20
RETAIN_LATEST = 32 << 20
RETAIN_LATEST_SMALL = 8 << 20
SMALL_OP = 256 << 10      # what keeping an operation's values costs (sent, entered, delivered)
TRAFFIC_BYTES = 1 << 30     # what one rank may pass through the switch in one run (sent and delivered)
MAX_OUTPUT = 64 << 20       # what one operation may deliver to one rank (an all_reduce of 16M float32, an
#                             all_gather of 16 MiB at 4 ranks) ...
FREE_OUTPUT = 32 << 20      # ... and beyond N times what it sent in it (a broadcast's receivers send nothing; a
#                             list all_gather's K x K x N outputs of K small inputs are K^2 x N times their bytes)
MAX_IN_FLIGHT = 64 << 20    # what a rank's operations not yet completed may have sent (the switch holds it)
MAX_TENSORS = 4096          # tensors in one operation
MAX_OPS = 100_000           # operations of one rank in one run (each is kept as a record)


class ProtocolError(Exception):
    """A frame that no honest rank sends: the rank is stopped, with a verdict naming it."""


class TrafficLimit(Exception):
    """A rank passed more than TRAFFIC_BYTES, or MAX_OPS operations, through the switch, asked one
    operation for more than MAX_OUTPUT (or FREE_OUTPUT beyond N times what it sent), or had more than
    MAX_IN_FLIGHT sent in operations not completed."""


def _int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _opt_str(value, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _forget(call: Call) -> None:
    """A completed operation's values dropped (its record kept): it no longer counts as evidence."""
    call.retained = False
    call.sent = [None] * len(call.sent)
    if call.perturbed is not None:
        call.perturbed = [None] * len(call.perturbed)
    call.delivered_arrays = [None] * len(call.delivered_arrays)
    for cached in ("_sent64", "_delivered64", "_perturbed64"):
        call.__dict__.pop(cached, None)


def _entered_perturbed(call: Call, rng: np.random.Generator) -> list | None:
    """What entered `call`: its sent arrays with fresh deltas where perturb.py perturbs them, the others as
    sent; None if none is perturbed (integers that travel as sent)."""
    values = [perturb.perturbed(a, d["dtype"], rng, call) if a is not None else None
              for a, d in zip(call.sent, call.inputs)]
    return [e if e is not None else a for e, a in zip(values, call.sent)] if any(e is not None for e in values) \
        else None


class Switch:
    def __init__(self, world_size: int, perturb_ops: tuple = (), rng: np.random.Generator | None = None):
        self.ws = world_size
        self.perturb_ops = set(perturb_ops)
        self.rng = rng if rng is not None or not perturb_ops else perturb.generator()
        self.calls: list[list[Call]] = [[] for _ in range(world_size)]
        self.args: dict[tuple[int, int], ops.Args] = {}        # (rank, seq) -> its tensors, while pending
        self.clock = 0
        self.outbox: list[tuple[int, dict, list]] = []       # (rank, header, blobs) of frames to send
        self.finished: set[int] = set()
        self.blocked: dict[int, int] = {}                    # rank -> seq of the operation it waits on
        self.first = [0] * world_size                        # bytes kept of each rank's first operations
        self.first_full = [False] * world_size
        self.latest = [(deque(), deque()) for _ in range(world_size)]   # (call, bytes): small ones, the rest
        self.latest_bytes = [[0, 0] for _ in range(world_size)]
        self.huge: list[Call | None] = [None] * world_size   # each rank's latest operation too large for a window
        self.traffic = [0] * world_size
        self.in_flight = [0] * world_size                    # bytes sent by each rank's operations not completed
        self._index: dict[tuple, int] = {}                   # (rank, group key) -> collectives so far
        self._slots: dict[tuple, dict[int, Call]] = {}       # (group key, index) -> group rank -> call
        # pending point-to-point operations, each queue in the order they were posted (messages between two
        # ranks on one group and tag never overtake each other): a match is always a queue's head
        self._sends: dict[tuple, deque] = {}                 # (group key, tag, to, from) -> sends
        self._recvs: dict[tuple, deque] = {}                 # (group key, tag, at, from or None) -> receives
        self._posted = 0
        self._gnames: dict[str, tuple] = {}   # a group's name -> the ranks of the first group seen with it
        self.unprepared: set[tuple[int, int]] = set()        # (rank, seq) of large calls whose deltas wait to be drawn

    # -- frames in ----------------------------------------------------------------------------------
    def receive(self, rank: int, header: dict, blobs: list) -> None:
        """An "op", "wait" or "peek" frame from `rank`. Raises ProtocolError (or wire.WireError) for a bad one."""
        self.clock += 1
        kind = header.get("t")
        if kind in ("wait", "peek"):
            seq = header.get("seq")
            if not _int(seq, 0, len(self.calls[rank])):
                raise ProtocolError(f"{kind} for an operation that does not exist")
            call = self.calls[rank][seq]
            if kind == "peek":
                call.peeked = True
                return
            call.waited = True
            if not call.completed:
                self.blocked[rank] = seq
            return
        if kind != "op":
            raise ProtocolError(f"unexpected frame {kind!r}")
        call, args = self._parse(rank, header, blobs)
        self.calls[rank].append(call)
        known = self._gnames.setdefault(call.gname, call.group)
        if call.gname and known != call.group:
            # torch names a group by how many groups were made before it, unless use_local_synchronization:
            # ranks that made different groups (new_group called only by the ranks in it) give two groups
            # one name, and gloo connects them under one prefix of the store: ranks of both pair up or hang
            call.problem = {"kind": "group_name", "name": call.gname, "ranks": list(call.group), "other": list(known)}
            self._fail(call, f"the process group named {call.gname!r} was made for ranks {list(known)} and for ranks "
                             f"{list(call.group)}: every rank must call new_group for every group, in the same order "
                             f"(ranks outside the group too), unless use_local_synchronization=True")
            return
        try:
            checks.check(call, args, len(call.group))
        except ops.OpError as err:
            call.problem = err.problem
            self._fail(call, str(err), err.kind)
            return
        self.args[(rank, call.seq)] = args
        if self._takes_deltas(call):   # a small call's deltas at once, a large one's when its operation runs
            if call.sent_bytes_held < twocores.LEAST:
                call.perturbed = _entered_perturbed(call, self.rng)
            else:
                self.unprepared.add((rank, call.seq))
        if call.op in ("send", "recv"):
            self._post_p2p(call)
        else:
            self._post_collective(call)

    def _parse(self, rank: int, h: dict, blobs: list) -> tuple[Call, ops.Args]:
        seq, method = h.get("seq"), h.get("method")
        if seq != len(self.calls[rank]):
            raise ProtocolError("operations out of order")
        if seq >= MAX_OPS:
            raise TrafficLimit()
        spec = comm.METHODS.get(method) if isinstance(method, str) else None
        if spec is None or spec.backend and spec.backend.startswith("*"):
            raise ProtocolError(f"unknown method {str(method)[:40]!r}")
        group = h.get("group")
        if not isinstance(group, list) or not group or len(group) > self.ws or len(set(group)) != len(group) \
                or not all(_int(g, 0, self.ws) for g in group) or rank not in group:
            raise ProtocolError("bad group")
        n, me = len(group), group.index(rank)
        root, peer, tag, reduce = h.get("root"), h.get("peer"), h.get("tag"), h.get("reduce")
        if root is not None and not _int(root, -(1 << 63), 1 << 63):   # out of range: gloo's error (checks.py)
            raise ProtocolError("bad root")
        if spec.op in ("broadcast", "reduce", "gather", "scatter") and root is None:
            raise ProtocolError("rooted operation without a root")
        if peer is not None and not _int(peer, -(1 << 31), 1 << 31):
            raise ProtocolError("bad peer")
        if tag is not None and not _int(tag, -(1 << 62), 1 << 62):
            raise ProtocolError("bad tag")
        if reduce is not None and reduce not in REDUCES:
            raise ProtocolError("bad reduce operation")
        if spec.op in ("send", "recv") and method != "recv_anysource" and peer is None:
            raise ProtocolError("point-to-point operation without a peer")
        splits = h.get("splits")
        if splits is not None and not (isinstance(splits, list) and len(splits) == 2 and all(   # (their sense: checks)
                s is None or (isinstance(s, list) and len(s) <= MAX_TENSORS and all(
                    _int(x, -(1 << 40), 1 << 40) for x in s)) for s in splits)):
            raise ProtocolError("bad splits")
        sends, receives = comm.sends_on(spec, me, root), comm.receives_on(spec, me, root)
        args = ops.Args()
        args.inputs = self._tensors(h.get("inputs"), blobs, args.flat_in, data=sends) if spec.sends else None
        args.outputs = self._tensors(h.get("outputs"), blobs, args.flat_out, data=False) if spec.receives else None
        if len(args.flat_in) + len(args.flat_out) > MAX_TENSORS:
            raise ProtocolError("too many tensors")
        nbytes = sum(t.data.nbytes for t in args.flat_in if t.data is not None)
        if nbytes > wire.MAX_PAYLOAD:
            raise ProtocolError(f"an operation of {nbytes} bytes")
        # what the switch will build for the rank's outputs, before it builds it (a list-form all_gather's
        # K x K x N outputs are K^2 x N copies of small inputs)
        out_bytes = sum(t.numel * wire.element_size(t.dtype) for t in args.flat_out)
        self.traffic[rank] += nbytes + out_bytes
        self.in_flight[rank] += nbytes
        amplified = out_bytes > FREE_OUTPUT and out_bytes > n * nbytes
        if out_bytes > MAX_OUTPUT or amplified or self.traffic[rank] > TRAFFIC_BYTES or \
                self.in_flight[rank] > MAX_IN_FLIGHT:
            raise TrafficLimit()
        call = Call(rank=rank, seq=seq, method=method, op=spec.op, group=tuple(group), root=root, reduce=reduce,
                    peer=peer, tag=tag, sends=sends, receives=receives, splits=splits,
                    device=_opt_str(h.get("device"), 16) or "cpu", entered_at=self.clock,
                    line=h.get("line") if _int(h.get("line"), 0, 1 << 31) else None,
                    file=_opt_str(h.get("file"), 100), function=_opt_str(h.get("function")), api=_opt_str(h.get("api")), via=_opt_str(h.get("via"), 40),
                    async_op=h.get("async") if isinstance(h.get("async"), bool) else None,
                    gname=_opt_str(h.get("gname")) or "")
        call.inputs = [{"dtype": t.dtype, "shape": list(t.shape), "numel": t.numel} for t in args.flat_in] if sends else []
        call.outputs = [{"dtype": t.dtype, "shape": list(t.shape), "numel": t.numel} for t in args.flat_out]
        call.sent = [t.data for t in args.flat_in] if sends else []
        call.weight = ops.weight_of(reduce, n) if spec.op in ("all_reduce", "reduce_scatter", "reduce") else 1.0
        call.sent_bytes_held = nbytes
        call.retain_bytes = 2 * nbytes + out_bytes    # sent, perturbed, delivered: charged once it completes
        return call, args

    @staticmethod
    def _tensors(nested, blobs, flat: list, data: bool, depth: int = 0):
        """A parameter's descriptors, nested (a tensor, a list of them, a list of lists) as ops.T."""
        if isinstance(nested, dict):
            dtype, shape, numel = wire.meta(nested)
            values = wire.tensor(nested, blobs)
            if data and values is None:
                raise ProtocolError("a tensor the rank sends came without its values")
            strides = nested.get("strides")
            strides = tuple(strides) if isinstance(strides, list) and len(strides) == len(shape) and all(
                _int(s, 0, 1 << 40) for s in strides) else None
            t = ops.T(dtype, shape, numel, len(flat), values if data else None, nested.get("contiguous") is not False,
                      strides)
            flat.append(t)
            return t
        if isinstance(nested, list) and depth < 2 and len(nested) <= MAX_TENSORS:
            return [Switch._tensors(item, blobs, flat, data, depth + 1) for item in nested]
        if nested is None and depth == 0:
            return []
        raise ProtocolError("bad tensor nesting")

    def _retain(self, call: Call, nbytes: int) -> None:
        """At completion: keep the values of a rank's first operations, then of a window of its latest, one
        for small operations and one for the rest, the oldest of each making way: an answer of a few KiB
        computed between a warm-up and a benchmark loop of MiB-sized tensors keeps its evidence."""
        rank = call.rank
        if not self.first_full[rank]:
            if self.first[rank] + nbytes <= RETAIN_FIRST:
                self.first[rank] += nbytes
                return
            self.first_full[rank] = True
        size = 0 if nbytes <= SMALL_OP else 1
        limit = RETAIN_LATEST_SMALL if size == 0 else RETAIN_LATEST - RETAIN_LATEST_SMALL
        if nbytes > limit:   # kept alone: the rank's latest operation of this size makes way for this one
            if self.huge[rank] is not None:
                _forget(self.huge[rank])
            self.huge[rank] = call
            return
        window, held = self.latest[rank][size], self.latest_bytes[rank]
        while held[size] + nbytes > limit:
            old, old_bytes = window.popleft()
            held[size] -= old_bytes
            _forget(old)
        window.append((call, nbytes))
        held[size] += nbytes

    # -- pairing ------------------------------------------------------------------------------------
    def _post_collective(self, call: Call) -> None:
        key = (call.group, call.gname)
        index = self._index.get((call.rank, key), 0)
        self._index[(call.rank, key)] = index + 1
        call.index = index
        slot = self._slots.setdefault((key, index), {})
        slot[call.group.index(call.rank)] = call
        if len(slot) == len(call.group):
            del self._slots[(key, index)]
            self._complete_collective([slot[g] for g in range(len(call.group))])

    def _complete_collective(self, calls: list[Call]) -> None:
        n = len(calls)
        pairs = [(c, self.args.pop((c.rank, c.seq))) for c in calls]
        for c in calls:
            c.partners = {g: other for g, other in enumerate(calls)}
        family = ops.FAMILIES[calls[0].op]
        try:
            family.agree(pairs, n)
        except ops.OpError as err:
            for c in calls:
                c.problem = err.problem
                self._fail(c, str(err), err.kind)
            return
        self._perturbed(calls)
        ins = [self._entered(c, args) for c, args in pairs]
        try:
            results = family.run(pairs, ins, n)
        except Exception as err:  # noqa: BLE001  (what the checks let through fails this call, never the supervisor)
            for c in calls:
                self._fail(c, f"the switch could not run {calls[0].op}: {err}")
            return
        self.clock += 1
        made: dict = {}   # an array several ranks receive: its bytes made once
        for (c, args), (arrays, pieces) in zip(pairs, results):
            self._deliver(c, args, arrays, pieces, made)

    def _takes_deltas(self, call: Call) -> bool:
        """In a perturbed run, what a call sends in an operation the run perturbs enters it with fresh deltas
        (perturb.py). A MAX, MIN or product is no sum of the ranks' data: no value is ever proven from it, and
        honest code branches on it (GradScaler's found_inf, all-reduced with MAX, must stay 0 where nothing
        overflowed): it enters as sent."""
        return bool(self.perturb_ops) and call.op in self.perturb_ops and call.sends and call.reduce in LINEAR_REDUCES

    def _perturbed(self, calls: list[Call]) -> None:
        """The deltas of the large calls of an operation that runs now, drawn on two cores (twocores.py), each
        call's from a generator of its own seeded from the run's. Drawn as the operation runs, not as each call
        arrives: the ranks of a run then wait for the switch, and the cores are free (drawn as the first rank's
        call arrived, the helper thread took a core from the ranks still sending, bench.md)."""
        large = [c for c in calls if (c.rank, c.seq) in self.unprepared]
        if not large:
            return
        self.unprepared.difference_update((c.rank, c.seq) for c in large)
        rngs = perturb.children(self.rng, len(large))
        entered = twocores.run_all([functools.partial(_entered_perturbed, c, rng) for c, rng in zip(large, rngs)],
                                   sum(a.nbytes for c in large for a in c.sent if a is not None))
        for call, values in zip(large, entered):
            call.perturbed = values

    @staticmethod
    def _entered(call: Call, args: ops.Args) -> list[np.ndarray]:
        if not call.sends:
            return []
        return list(call.perturbed) if call.perturbed is not None else list(call.sent)

    def _post_p2p(self, call: Call) -> None:
        """Pair a send with the earliest receive posted for it (one from its sender, or from any rank), a
        receive with the earliest send to it (from the rank it names, or from any): a queue's head each."""
        self._posted += 1
        call.posted = self._posted
        key, me = (call.group, call.gname, call.tag), call.rank
        if call.op == "send":
            to = call.group[call.peer]
            heads = [q for q in (self._recvs.get((*key, to, me)), self._recvs.get((*key, to, None))) if q]
            if not heads:
                self._sends.setdefault((*key, to, me), deque()).append(call)
                return
            match = min(heads, key=lambda q: q[0].posted).popleft()
            self._complete_p2p(call, match)
            return
        frm = None if call.peer is None else call.group[call.peer]
        sources = [frm] if frm is not None else list(call.group)
        heads = [q for q in (self._sends.get((*key, me, g)) for g in sources) if q]
        if not heads:
            self._recvs.setdefault((*key, me, frm), deque()).append(call)
            return
        match = min(heads, key=lambda q: q[0].posted).popleft()
        self._complete_p2p(match, call)

    def _complete_p2p(self, send: Call, recv: Call) -> None:
        s_args, r_args = self.args.pop((send.rank, send.seq)), self.args.pop((recv.rank, recv.seq))
        g_send, g_recv = send.group.index(send.rank), recv.group.index(recv.rank)
        send.partners, recv.partners = {g_recv: recv}, {g_send: send}
        recv.source = g_send
        problem = checks.check_message((send, s_args), (recv, r_args))
        if problem is not None:
            for call in (send, recv):
                call.problem = problem[1]
                self._fail(call, problem[0])
            return
        self._perturbed([send])
        data = self._entered(send, s_args)[0]
        self.clock += 1
        self._deliver(send, s_args, [], [])
        self._deliver(recv, r_args, [data.copy()], [[Piece(0, data.size, ((g_send, 0, 0),))]])

    # -- frames out ---------------------------------------------------------------------------------
    def _deliver(self, call: Call, args: ops.Args, arrays: list, pieces: list, made: dict | None = None) -> None:
        call.completed, call.ok, call.completed_at = True, True, self.clock
        self._retain(call, call.retain_bytes)
        outs = args.flat_out if call.receives else []
        descs, blobs, made = [], [], {} if made is None else made
        for t, array in zip(outs, arrays):
            descs.append({"dtype": t.dtype, "shape": list(t.shape), "blob": len(blobs)})
            key = (id(array), t.dtype)   # one array delivered to several outputs: its bytes made once
            if key not in made:
                made[key] = wire.buffer(array, t.dtype)   # sent as it lies: no copy
            blobs.append(made[key])
        call.delivered = [{"dtype": t.dtype, "shape": list(t.shape), "numel": t.numel} for t in outs[:len(arrays)]]
        call.delivered_arrays = list(arrays) if call.retained else [None] * len(arrays)
        call.pieces = list(pieces)
        if not call.retained:
            call.sent = [None] * len(call.sent)
            call.perturbed = None if call.perturbed is None else [None] * len(call.perturbed)
        self._unblock(call)
        self.outbox.append((call.rank, {"t": "done", "seq": call.seq, "ok": True, "source": call.source,
                                        "outputs": descs}, blobs))

    def _fail(self, call: Call, error: str, kind: str = "RuntimeError") -> None:
        """The call ends in an error, raised on its rank as `kind` (RuntimeError, or ValueError where gloo
        raises one)."""
        call.completed, call.ok, call.error, call.completed_at = True, False, error[:1000], self.clock
        self.args.pop((call.rank, call.seq), None)
        self.unprepared.discard((call.rank, call.seq))
        _forget(call)   # a failed operation proves nothing: its values are not kept (its record is)
        self._unblock(call)
        self.outbox.append((call.rank, {"t": "done", "seq": call.seq, "ok": False, "error": call.error,
                                        "kind": kind}, []))

    def _unblock(self, call: Call) -> None:
        self.in_flight[call.rank] -= call.sent_bytes_held
        call.sent_bytes_held = 0
        if self.blocked.get(call.rank) == call.seq:
            del self.blocked[call.rank]

    # -- what the supervisor asks -------------------------------------------------------------------
    def finish(self, rank: int) -> None:
        """The rank will start no operation any more (it returned, raised, exited or was stopped); what it
        waited on when it was stopped stays known (the verdict names it)."""
        self.finished.add(rank)

    def pending(self, rank: int) -> list[Call]:
        return [c for c in self.calls[rank] if not c.completed]

    def waiting_on(self, rank: int) -> Call | None:
        seq = self.blocked.get(rank)
        return None if seq is None else self.calls[rank][seq]

    def stuck(self) -> bool:
        """Every rank that has not finished waits on an operation, and none of those can complete: each
        needs a rank that has finished, or a call that only a waiting rank could still make."""
        live = [r for r in range(self.ws) if r not in self.finished]
        return bool(live) and all(r in self.blocked for r in live)
