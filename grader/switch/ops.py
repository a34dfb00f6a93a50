"""What each operation does to the tensors of the ranks that take part, as torch on gloo does it (numpy only).

For every process-group method (comm.METHODS) the switch asks three things of this module:
  check(call, n)        the errors gloo raises on the rank that makes the call, from the call alone
                        (a gather list of the wrong length, a reduce op the dtype does not allow ...);
  agree(calls, n)       the errors of calls that do not fit together (ranks calling different operations,
                        or the same one with different shapes or dtypes): gloo pairs them silently, hangs or
                        aborts; the switch names each rank's call instead;
  run(calls, ins, n)    what is delivered to each rank's output buffers, and where every delivered element
                        came from (record.Piece), from `ins`: what entered the operation, per group rank.
A call's tensors arrive as `Args`: its inputs and outputs as the method's parameters nest them.

Reductions run in the dtype, one rank after another (float16 rounds after each addition as gloo does;
bfloat16 is computed in float32 and rounded back). Deliberate differences from gloo, each an error or a
right answer where gloo gives garbage: a strided or transposed view is reduced as the tensor it is, a
point-to-point message must fit its receive buffer exactly (gloo aborts the receiver, or reinterprets the
bytes), a reduce leaves the non-roots' buffers as they were (gloo uses them as scratch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..wire import FLOATING, round_to
from .record import Call, Piece

GLOO_TYPES = {"torch.float64", "torch.float32", "torch.float16", "torch.bfloat16", "torch.int64", "torch.int32",
              "torch.int8", "torch.uint8", "torch.bool", "torch.complex64", "torch.complex128"}
TORCH_NAMES = {"torch.int64": "Long", "torch.int32": "Int", "torch.int16": "Short", "torch.int8": "Char",
               "torch.uint8": "Byte", "torch.bool": "Bool"}
INTEGRAL = {"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8", "torch.bool"}
REDUCES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


class OpError(Exception):
    """An error of one call (raised on its rank) or of calls that do not fit (raised on every rank)."""


@dataclass
class T:
    """One tensor of a call: dtype, shape, and its values when the rank sent them."""
    dtype: str
    shape: tuple
    numel: int
    index: int                   # its place among the call's inputs (or outputs), flattened in order
    data: np.ndarray | None = None


@dataclass
class Args:
    """A call's tensors, nested as the method's parameters are: a T, a list of T, or a list of lists."""
    inputs: object = None
    outputs: object = None
    flat_in: list = field(default_factory=list)
    flat_out: list = field(default_factory=list)


def shape_text(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _is_list(value) -> bool:
    return isinstance(value, list)


def _tensor_list(value, what: str) -> list:
    if not _is_list(value) or not all(isinstance(t, T) for t in value):
        raise OpError(f"{what} must be a list of tensors")
    return value


def _one_tensor(value, what: str) -> T:
    if not isinstance(value, T):
        raise OpError(f"{what} must be a tensor")
    return value


def _gloo_type(t: T, method: str) -> None:
    if t.dtype not in GLOO_TYPES:
        raise OpError("Invalid scalar type")


def _check_reduce(reduce: str | None, dtype: str) -> None:
    op = reduce or "SUM"
    if op == "PREMUL_SUM":
        raise OpError("Cannot use ReduceOp.PREMUL_SUM with Gloo")
    if op in ("BAND", "BOR", "BXOR") and dtype not in INTEGRAL:
        raise OpError(f"Cannot use ReduceOp.{op} with non-integral dtype")
    if op == "AVG" and dtype not in FLOATING and not dtype.startswith("torch.complex"):
        raise OpError(f"result type Float can't be cast to the desired output type {TORCH_NAMES.get(dtype, dtype)}")
    if op not in REDUCES:
        raise OpError(f"unknown reduce operation {op}")


def reduce_arrays(arrays: list[np.ndarray], op: str | None, dtype: str, n: int) -> np.ndarray:
    """The elementwise reduction of `arrays` (each as wire.tensor gives it) in `dtype`, in order."""
    op = op or "SUM"
    if dtype == "torch.bool":
        combine = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "PRODUCT": np.logical_and,
                   "MIN": np.logical_and, "BAND": np.logical_and, "BXOR": np.logical_xor}[op]
    else:
        combine = {"SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
                   "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    bf16 = dtype == "torch.bfloat16"
    with np.errstate(all="ignore"):
        total = arrays[0].copy()
        for array in arrays[1:]:
            total = combine(total, array)
            if bf16:
                total = round_to(total.astype(np.float64), dtype)
        if op == "AVG":
            total = total / np.asarray(n, dtype=total.dtype)
            if bf16:
                total = round_to(total.astype(np.float64), dtype)
    return total.astype(arrays[0].dtype, copy=False)


def weight_of(reduce: str | None, n: int) -> float | None:
    """How a sum's sources weigh in what is delivered: 1 (SUM), 1/N (AVG); None: not a weighted sum."""
    op = reduce or "SUM"
    return 1.0 if op == "SUM" else 1.0 / n if op == "AVG" else None


def _chunks(shape: tuple, n: int) -> list[tuple]:
    """The shapes torch.chunk(n) gives along dim 0 (fewer than n chunks when dim 0 is short)."""
    if not shape:
        return [shape]
    size = -(-shape[0] // n) if shape[0] else 0
    out, left = [], shape[0]
    while left > 0:
        take = min(size, left)
        out.append((take, *shape[1:]))
        left -= take
    return out or [(0, *shape[1:])]


def _signature(call: Call, args: Args) -> str:
    parts = [f"{t.dtype.split('.')[-1]}{shape_text(t.shape)}" for t in args.flat_in] or \
            [f"{t.dtype.split('.')[-1]}{shape_text(t.shape)}" for t in args.flat_out]
    return f"{call.api or call.method}({', '.join(parts)})"


MISMATCH_WORDS = "the ranks called different operations, or the same one with different shapes"   # diagnose rewords it


def mismatch(calls: list[tuple[Call, Args]]) -> OpError:
    listing = "; ".join(f"rank {c.rank}: {_signature(c, a)}" for c, a in calls)
    return OpError(f"{MISMATCH_WORDS}: {listing}")


# -- the families of operations -------------------------------------------------------------------------

class Family:
    """check / agree / run for the methods of one operation (see the module docstring)."""

    def check(self, call: Call, args: Args, n: int) -> None:
        pass

    def agree(self, calls: list[tuple[Call, Args]], n: int) -> None:
        first = calls[0]
        key = self.key(*first)
        for call, args in calls[1:]:
            if call.op != first[0].op or self.key(call, args) != key or call.reduce != first[0].reduce \
                    or call.root != first[0].root:
                raise mismatch(calls)

    def key(self, call: Call, args: Args):
        """What every rank's call must share: by default the dtypes and shapes of what it sends."""
        return tuple((t.dtype, t.shape) for t in args.flat_in)

    def run(self, calls, ins, n):
        raise NotImplementedError


class AllReduce(Family):
    def check(self, call, args, n):
        tensors = _tensor_list(args.inputs, "tensors")
        if not tensors:
            raise OpError("requires non-empty tensor list")
        for t in tensors:
            _gloo_type(t, call.method)
            _check_reduce(call.reduce, t.dtype)
        if call.method == "allreduce" and len({(t.dtype, t.shape) for t in tensors}) > 1:
            raise OpError("ProcessGroupGloo::allreduce: tensors must all have the same type and size")

    def run(self, calls, ins, n):
        call = calls[0][0]
        k = len(ins[0])
        out = []
        if call.method == "allreduce":   # every tensor of every rank, summed into every tensor
            total = reduce_arrays([a for per_rank in ins for a in per_rank], call.reduce, calls[0][1].flat_in[0].dtype,
                                  n)
            pieces = [Piece(0, total.size, tuple((g, i, 0) for g in range(n) for i in range(k)))]
            for _ in calls:
                out.append(([total.copy() for _ in range(k)], [pieces] * k))
            return out
        totals = [reduce_arrays([ins[g][i] for g in range(n)], call.reduce, calls[0][1].flat_in[i].dtype, n)
                  for i in range(k)]
        pieces = [[Piece(0, t.size, tuple((g, i, 0) for g in range(n)))] for i, t in enumerate(totals)]
        return [([t.copy() for t in totals], pieces) for _ in calls]


class AllGather(Family):
    """allgather (lists), allgather_coalesced (a list per input), _allgather_base / all_gather_single (one
    output tensor of N inputs along dim 0)."""

    def check(self, call, args, n):
        name = f"ProcessGroupGloo::{'allgather_coalesced' if call.method == 'allgather_coalesced' else 'allgather'}"
        if isinstance(args.inputs, T):   # the flat forms
            inp, out = args.inputs, _one_tensor(args.outputs, "output")
            _gloo_type(inp, call.method)
            if out.dtype != inp.dtype:
                raise OpError(f"{name}: invalid tensor type at index 0 (expected {inp.dtype}, got {out.dtype})")
            if call.device != "cpu" and out.numel == n * inp.numel:
                return   # NCCL takes the stacked form too
            chunks = _chunks(out.shape, n)
            if len(chunks) != n:
                raise OpError(f"{name}: invalid output tensor list at index 0 (expected length {n}, got {len(chunks)})")
            for i, shape in enumerate(chunks):
                if shape != inp.shape:
                    raise OpError(f"{name}: invalid tensor size at index {i} (expected {shape_text(inp.shape)}, got "
                                  f"{shape_text(shape)})")
            return
        inputs = _tensor_list(args.inputs, "input_tensors")
        outputs = args.outputs
        if not inputs:
            raise OpError(f"{name}: requires non-empty input tensor list")
        for t in inputs:
            _gloo_type(t, call.method)
        if call.method == "allgather_coalesced":   # one list per rank, holding a tensor per input
            if not _is_list(outputs) or len(outputs) != n:
                raise OpError(f"{name}: output lists should be equal to world size")
            for out_list in outputs:
                out_list = _tensor_list(out_list, "output_tensors")
                if len(out_list) != len(inputs):
                    raise OpError(f"{name}: requires input/output tensor lists to have the same length")
                for j, (o, e) in enumerate(zip(out_list, inputs)):
                    if (o.dtype, o.shape) != (e.dtype, e.shape):
                        raise OpError(f"{name}: invalid size of output tensor at index {j} (expected length "
                                      f"{shape_text(e.shape)}, got {shape_text(o.shape)})")
            return
        if not _is_list(outputs) or len(outputs) != len(inputs):
            raise OpError(f"{name}: requires input/output tensor lists to have the same length")
        for i, out_list in enumerate(outputs):
            out_list = _tensor_list(out_list, "output_tensors")
            want, expected = len(inputs) * n, [inputs[j % len(inputs)] for j in range(len(inputs) * n)]
            if len(out_list) != want:
                raise OpError(f"{name}: invalid output tensor list at index {i} (expected length {want}, got {len(out_list)})")
            for j, (o, e) in enumerate(zip(out_list, expected)):
                if o.dtype != e.dtype:
                    raise OpError(f"{name}: invalid tensor type at index {j} (expected {e.dtype}, got {o.dtype})")
                if o.shape != e.shape:
                    raise OpError(f"{name}: invalid tensor size at index {j} (expected {shape_text(e.shape)}, got "
                                  f"{shape_text(o.shape)})")

    def run(self, calls, ins, n):
        method = calls[0][0].method
        out, flat = [], None
        for call, args in calls:
            if isinstance(args.inputs, T):
                m = ins[0][0].size
                if flat is None:   # the same output for every rank, built once (records are never written)
                    flat = np.concatenate([ins[g][0] for g in range(n)]) if n else np.zeros(0)
                out.append(([flat], [[Piece(g * m, m, ((g, 0, 0),)) for g in range(n)]]))
            elif method == "allgather_coalesced":   # outputs[g][i]: input i of rank g
                arrays, pieces = [], []
                for g in range(n):
                    for i in range(len(args.flat_in)):
                        arrays.append(ins[g][i])   # records are never written: outputs share what entered
                        pieces.append([Piece(0, ins[g][i].size, ((g, i, 0),))])
                out.append((arrays, pieces))
            else:
                k = len(args.flat_in)
                arrays, pieces = [], []
                for _ in args.outputs:
                    for j in range(k * n):
                        g, i = divmod(j, k)
                        arrays.append(ins[g][i])
                        pieces.append([Piece(0, ins[g][i].size, ((g, i, 0),))])
                out.append((arrays, pieces))
        return out


class ReduceScatter(Family):
    def check(self, call, args, n):
        if isinstance(args.inputs, T):
            inp, outp = args.inputs, _one_tensor(args.outputs, "output")
            _gloo_type(inp, call.method)
            _check_reduce(call.reduce, inp.dtype)
            if outp.dtype != inp.dtype:
                raise OpError(f"ProcessGroupGloo::reduce_scatter: invalid tensor type (expected {inp.dtype}, got {outp.dtype})")
            o0 = outp.shape[0] if outp.shape else 1
            i0 = inp.shape[0] if inp.shape else 1
            if o0 * n != i0 or outp.shape[1:] != inp.shape[1:]:
                raise OpError(f"Check failed: outputShape[0] * worldSize == inputShape[0] ({o0 * n} vs. {i0}).")
            return
        outputs = _tensor_list(args.outputs, "output_tensors")
        inputs = args.inputs
        if len(outputs) != 1 or not _is_list(inputs) or len(inputs) != 1:
            raise OpError("ProcessGroupGloo::reduce_scatter: requires a single-element output list and input list")
        chunk = _tensor_list(inputs[0], "input_tensors")
        if len(chunk) != n:
            raise OpError(f"ProcessGroupGloo::reduce_scatter: invalid input tensor list (expected length {n}, got {len(chunk)})")
        for j, t in enumerate(chunk):
            _gloo_type(t, call.method)
            _check_reduce(call.reduce, t.dtype)
            if (t.dtype, t.shape) != (outputs[0].dtype, outputs[0].shape):
                raise OpError(f"ProcessGroupGloo::reduce_scatter: invalid tensor size at index {j} (expected "
                              f"{shape_text(outputs[0].shape)}, got {shape_text(t.shape)})")

    def run(self, calls, ins, n):
        reduce, out = calls[0][0].reduce, []
        for r, (call, args) in enumerate(calls):
            if isinstance(args.inputs, T):
                m = args.outputs.numel
                parts = [ins[g][0][r * m:(r + 1) * m] for g in range(n)]
                pieces = [Piece(0, m, tuple((g, 0, r * m) for g in range(n)))]
            else:
                parts = [ins[g][r] for g in range(n)]
                pieces = [Piece(0, parts[0].size, tuple((g, r, 0) for g in range(n)))]
            out.append(([reduce_arrays(parts, reduce, args.flat_out[0].dtype, n)], [pieces]))
        return out


class Broadcast(Family):
    def check(self, call, args, n):
        tensors = _tensor_list(args.outputs, "tensors")
        if not tensors:
            raise OpError("requires non-empty tensor list")
        for t in tensors:
            _gloo_type(t, call.method)

    def key(self, call, args):
        return tuple((t.dtype, t.shape) for t in args.flat_out)

    def run(self, calls, ins, n):
        root = calls[0][0].root or 0
        source = ins[root][0]
        return [([source.copy() for _ in args.flat_out], [[Piece(0, source.size, ((root, 0, 0),))]] * len(args.flat_out))
                for _, args in calls]


class Reduce(Family):
    def check(self, call, args, n):
        AllReduce().check(call, args, n)

    def run(self, calls, ins, n):
        root = calls[0][0].root or 0
        k = len(ins[0])
        total = reduce_arrays([a for per_rank in ins for a in per_rank], calls[0][0].reduce, calls[0][1].flat_in[0].dtype, n)
        pieces = [Piece(0, total.size, tuple((g, i, 0) for g in range(n) for i in range(k)))]
        return [([total.copy() for _ in range(k)], [pieces] * k) if g == root else ([], []) for g in range(n)]


def _root_list(name: str, what: str, listing: list, like: T, n: int) -> None:
    """The root's list of a gather or a scatter: one list of N tensors, each like `like`."""
    if len(listing) != 1 or not _is_list(listing[0]) or len(listing[0]) != n:
        got = len(listing[0]) if listing and _is_list(listing[0]) else 0
        raise OpError(f"{name}: invalid {what} tensor list at index 0 (expected length {n}, got {got})")
    for j, t in enumerate(listing[0]):
        if (t.dtype, t.shape) != (like.dtype, like.shape):
            raise OpError(f"{name}: invalid tensor size at index {j} (expected {shape_text(like.shape)}, got "
                          f"{shape_text(t.shape)})")


class Gather(Family):
    def check(self, call, args, n):
        inputs = _tensor_list(args.inputs, "input_tensors")
        if len(inputs) != 1:
            raise OpError("ProcessGroupGloo::gather: requires a single-element input list")
        _gloo_type(inputs[0], call.method)
        outputs = args.outputs if _is_list(args.outputs) else []
        me = call.group.index(call.rank)
        if me == call.root:
            _root_list("ProcessGroupGloo::gather", "output", outputs, inputs[0], n)
        elif outputs and any(outputs):
            raise OpError("ProcessGroupGloo::gather: requires empty output on non-root")

    def run(self, calls, ins, n):
        root = calls[0][0].root or 0
        arrays = [ins[g][0].copy() for g in range(n)]
        pieces = [[Piece(0, a.size, ((g, 0, 0),))] for g, a in enumerate(arrays)]
        return [(arrays, pieces) if g == root else ([], []) for g in range(n)]


class Scatter(Family):
    def check(self, call, args, n):
        outputs = _tensor_list(args.outputs, "output_tensors")
        if len(outputs) != 1:
            raise OpError("ProcessGroupGloo::scatter: requires a single-element output list")
        _gloo_type(outputs[0], call.method)
        inputs = args.inputs if _is_list(args.inputs) else []
        if call.group.index(call.rank) == call.root:
            _root_list("ProcessGroupGloo::scatter", "input", inputs, outputs[0], n)

    def key(self, call, args):
        return tuple((t.dtype, t.shape) for t in args.flat_out)

    def run(self, calls, ins, n):
        root = calls[0][0].root or 0
        return [([ins[root][g].copy()], [[Piece(0, ins[root][g].size, ((root, g, 0),))]]) for g in range(n)]


class AllToAll(Family):
    def check(self, call, args, n):
        if isinstance(args.inputs, T):
            inp, outp = args.inputs, _one_tensor(args.outputs, "output")
            _gloo_type(inp, call.method)
            if inp.dtype != outp.dtype:
                raise OpError(f"ProcessGroupGloo::alltoall_base: invalid tensor type (expected {inp.dtype}, got {outp.dtype})")
            out_split, in_split = self.splits(call, args, n)
            rows_in = inp.shape[0] if inp.shape else 0
            rows_out = outp.shape[0] if outp.shape else 0
            if sum(in_split) != rows_in or sum(out_split) != rows_out or inp.shape[1:] != outp.shape[1:]:
                raise OpError(f"Split sizes doesn't match total dim 0 size (input {rows_in} rows, splits {in_split}; "
                              f"output {rows_out} rows, splits {out_split})")
            return
        inputs, outputs = _tensor_list(args.inputs, "input_tensors"), _tensor_list(args.outputs, "output_tensors")
        if len(inputs) != n or len(outputs) != n:
            raise OpError(f"ProcessGroupGloo::alltoall: requires {n} input and output tensors, got {len(inputs)} and "
                          f"{len(outputs)}")
        for t in inputs:
            _gloo_type(t, call.method)

    @staticmethod
    def splits(call, args, n) -> tuple[list[int], list[int]]:
        given = call.splits or [None, None]
        rows = []
        for split, t in zip(given, (args.outputs, args.inputs)):
            if split:
                if len(split) != n or not all(type(s) is int and s >= 0 for s in split):
                    raise OpError(f"split sizes must be {n} non-negative integers, got {split}")
                rows.append(list(split))
            else:
                total = t.shape[0] if t.shape else 0
                if total % n:
                    raise OpError(f"Tensor's dim 0 does not divide equally across group size ({total} rows, {n} ranks)")
                rows.append([total // n] * n)
        return rows[0], rows[1]

    def key(self, call, args):
        return (isinstance(args.inputs, T), tuple(t.dtype for t in args.flat_in))

    def agree(self, calls, n):
        super().agree(calls, n)
        if isinstance(calls[0][1].inputs, T):
            splits = [self.splits(c, a, n) for c, a in calls]
            for r in range(n):
                for j in range(n):
                    if splits[r][0][j] != splits[j][1][r] or calls[r][1].inputs.shape[1:] != calls[j][1].inputs.shape[1:]:
                        raise mismatch(calls)
        else:
            for r in range(n):
                for j in range(n):
                    a, b = calls[r][1].outputs[j], calls[j][1].inputs[r]
                    if (a.dtype, a.shape) != (b.dtype, b.shape):
                        raise mismatch(calls)

    def run(self, calls, ins, n):
        out = []
        if not isinstance(calls[0][1].inputs, T):
            for r in range(n):
                out.append(([ins[j][r].copy() for j in range(n)], [[Piece(0, ins[j][r].size, ((j, r, 0),))] for j in range(n)]))
            return out
        splits = [self.splits(c, a, n) for c, a in calls]
        for r, (call, args) in enumerate(calls):
            row = int(np.prod(args.outputs.shape[1:])) if args.outputs.shape else 1
            parts, pieces, at = [], [], 0
            for j in range(n):
                start = sum(splits[j][1][:r]) * row
                length = splits[r][0][j] * row
                parts.append(ins[j][0][start:start + length])
                pieces.append(Piece(at, length, ((j, 0, start),)))
                at += length
            out.append(([np.concatenate(parts) if parts else np.zeros(0)], [pieces]))
        return out


class Barrier(Family):
    def key(self, call, args):
        return ()

    def run(self, calls, ins, n):
        return [([], []) for _ in calls]


FAMILIES: dict[str, Family] = {
    "all_reduce": AllReduce(), "all_gather": AllGather(), "reduce_scatter": ReduceScatter(), "broadcast": Broadcast(),
    "reduce": Reduce(), "gather": Gather(), "scatter": Scatter(), "all_to_all": AllToAll(), "barrier": Barrier(),
}


# -- point to point ------------------------------------------------------------------------------------

def check_p2p(call: Call, args: Args, n: int) -> None:
    tensors = _tensor_list(args.inputs if call.op == "send" else args.outputs, "tensors")
    if len(tensors) != 1:
        raise OpError(f"ProcessGroupGloo::{call.method}: requires a single-element tensor list")
    if call.peer is not None:
        me = call.group.index(call.rank)
        if not 0 <= call.peer < n:
            raise OpError(f"invalid {'destination' if call.op == 'send' else 'source'} rank {call.peer} "
                          f"(the group has {n} ranks)")
        if call.peer == me:
            raise OpError(f"rank {call.rank} cannot {call.op} {'to' if call.op == 'send' else 'from'} itself: "
                          f"{call.op}({'dst' if call.op == 'send' else 'src'}={call.peer})")


def check_message(send: tuple[Call, Args], recv: tuple[Call, Args]) -> tuple[str, dict] | None:
    """Why a message cannot land in the buffer posted for it, and the figures (None: it fits)."""
    s, r = send[1].flat_in[0], recv[1].flat_out[0]
    facts = {"sender": send[0].rank, "receiver": recv[0].rank, "sent": s.numel, "room": r.numel,
             "sent_dtype": s.dtype, "room_dtype": r.dtype}
    if s.numel != r.numel:
        exactly = "as large as" if s.numel > r.numel else "exactly as large as"
        return (f"rank {send[0].rank} sent rank {recv[0].rank} a message of {s.numel} elements into a receive buffer "
                f"of {r.numel}: the receive buffer must be {exactly} what is sent"), facts
    if s.dtype != r.dtype:
        return (f"rank {send[0].rank} sent {s.dtype} to rank {recv[0].rank}, whose receive buffer is {r.dtype}: "
                f"the dtypes must match"), facts
    return None
