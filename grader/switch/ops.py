"""What each operation delivers to the ranks that take part, as torch's gloo delivers it (numpy only).

For every process-group method (comm.METHODS) the switch asks its operation's Family three things:
  check(call, args, n)   what gloo refuses of the call alone, on its rank (checks.py);
  agree(calls, n)        whether the paired calls fit together, else an error naming what differs (agree.py);
  run(calls, ins, n)     what is delivered to each rank's output buffers, and where every delivered element
                         came from (record.Piece), from `ins`: what entered the operation, per group rank.
Reductions are gloo's, bit for bit: in the dtype and in the order its ring algorithms combine the ranks
(arith.py). Deliberate differences from gloo (docs/switch.md), each an error or a right answer where gloo
gives garbage: a strided or transposed view is reduced as the tensor it is, a point-to-point message must fit
its receive buffer exactly, a reduce leaves the non-roots' buffers as they were (gloo uses them as scratch).
"""
from __future__ import annotations

import numpy as np

from .. import wire
from . import agree as agreement
from . import checks
from .arith import reduce_arrays
from .record import Call, Piece
from .tensors import Args, OpError, T

MISMATCH_WORDS = agreement.MISMATCH_WORDS
__all__ = ["Args", "FAMILIES", "MISMATCH_WORDS", "OpError", "T", "weight_of"]


def weight_of(reduce: str | None, n: int) -> float | None:
    """How a sum's sources weigh in what is delivered: 1 (SUM), 1/N (AVG); None: not a weighted sum."""
    op = reduce or "SUM"
    return 1.0 if op == "SUM" else 1.0 / n if op == "AVG" else None


def _layout(tensors: list[T]) -> tuple | None:
    """The view gloo's ring follows the memory of (arith.memory_order), where every rank passes the same one."""
    first = tensors[0]
    if first.strides is None or any((t.shape, t.strides) != (first.shape, first.strides) for t in tensors[1:]):
        return None
    return first.shape, first.strides


def _whole(array: np.ndarray, sources) -> list[Piece]:
    return [Piece(0, array.size, tuple(sources))]


class Family:
    """check / agree / run for the methods of one operation (see the module docstring)."""
    op = ""

    def check(self, call: Call, args: Args, n: int) -> None:
        checks.check(call, args, n)

    def agree(self, calls: list[tuple[Call, Args]], n: int) -> None:
        agreement.agree(calls, n, self.key)

    def key(self, call: Call, args: Args):
        """What every rank's call must share: by default the dtypes and shapes of what it sends."""
        return tuple((t.dtype, t.shape) for t in args.flat_in)

    def run(self, calls, ins, n):
        raise NotImplementedError


class AllReduce(Family):
    def run(self, calls, ins, n):
        call, args = calls[0]
        dtype, k = args.flat_in[0].dtype, len(ins[0])
        if call.method == "allreduce":   # every tensor of every rank, reduced into every tensor
            total = reduce_arrays([a for per_rank in ins for a in per_rank], call.reduce, dtype, n, local=k,
                                  layout=_layout([a.flat_in[0] for _, a in calls]) if k == 1 else None)
            pieces = _whole(total, ((g, i, 0) for g in range(n) for i in range(k)))
            return [([total] * k, [pieces] * k) for _ in calls]
        # coalesced: one ring over the rank's tensors laid end to end
        sizes = [a.size for a in ins[0]]
        total = reduce_arrays([np.concatenate(per_rank) if k > 1 else per_rank[0] for per_rank in ins], call.reduce,
                              dtype, n)
        bounds = np.cumsum([0, *sizes])
        parts = [total[bounds[i]:bounds[i + 1]] for i in range(k)]
        pieces = [_whole(p, ((g, i, 0) for g in range(n))) for i, p in enumerate(parts)]
        return [(parts, pieces) for _ in calls]


class AllGather(Family):
    """allgather (lists), allgather_coalesced (a list per input), _allgather_base / all_gather_single (one
    output tensor of N inputs along dim 0)."""

    def run(self, calls, ins, n):
        method = calls[0][0].method
        out, flat = [], None
        for call, args in calls:
            if isinstance(args.inputs, T):
                m = ins[0][0].size
                if flat is None:   # the same output for every rank, built once (records are never written)
                    flat = np.concatenate([ins[g][0] for g in range(n)])
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
    def run(self, calls, ins, n):
        call, args = calls[0]
        dtype = args.flat_out[0].dtype
        if isinstance(args.inputs, T):   # gloo: the all_reduce ring over the whole input, each rank its chunk
            m = args.outputs.numel
            total = reduce_arrays([ins[g][0] for g in range(n)], call.reduce, dtype, n,
                                  layout=_layout([a.inputs for _, a in calls]))
            if dtype == "torch.bool":   # gloo reduces a copy and copies it back: a bool copy holds 0 or 1
                total = total != 0
            return [([total[r * m:(r + 1) * m]], [[Piece(0, m, tuple((g, 0, r * m) for g in range(n)))]])
                    for r in range(n)]
        out = []   # the list form: an all_reduce ring of each rank's piece
        for r in range(n):
            part = reduce_arrays([ins[g][r] for g in range(n)], call.reduce, dtype, n,
                                 layout=_layout([a.inputs[0][r] for _, a in calls]))
            out.append(([part], [_whole(part, ((g, r, 0) for g in range(n)))]))
        return out


class Broadcast(Family):
    def key(self, call, args):
        return tuple((t.dtype, t.shape) for t in args.flat_out)

    def run(self, calls, ins, n):
        root = calls[0][0].root
        source = ins[root][0]
        return [([source] * len(args.flat_out), [_whole(source, ((root, 0, 0),))] * len(args.flat_out))
                for _, args in calls]


class Reduce(Family):
    def run(self, calls, ins, n):
        call, args = calls[0]
        total = reduce_arrays([per_rank[0] for per_rank in ins], call.reduce, args.flat_in[0].dtype, n, "reduce",
                              layout=_layout([a.flat_in[0] for _, a in calls]))
        pieces = _whole(total, ((g, 0, 0) for g in range(n)))
        return [([total], [pieces]) if g == call.root else ([], []) for g in range(n)]


class Gather(Family):
    def run(self, calls, ins, n):
        root = calls[0][0].root
        arrays = [ins[g][0] for g in range(n)]
        pieces = [[Piece(0, a.size, ((g, 0, 0),))] for g, a in enumerate(arrays)]
        return [(arrays, pieces) if g == root else ([], []) for g in range(n)]


class Scatter(Family):
    def key(self, call, args):
        return tuple((t.dtype, t.shape) for t in args.flat_out)

    def run(self, calls, ins, n):
        root = calls[0][0].root
        return [([ins[root][g]], [[Piece(0, ins[root][g].size, ((root, g, 0),))]]) for g in range(n)]


class AllToAll(Family):
    def key(self, call, args):
        return tuple((t.dtype, ()) for t in args.flat_in)

    def agree(self, calls, n):
        super().agree(calls, n)
        agreement.agree_all_to_all(calls, n)

    def run(self, calls, ins, n):
        if not isinstance(calls[0][1].inputs, T):
            return [([ins[j][r] for j in range(n)], [[Piece(0, ins[j][r].size, ((j, r, 0),))] for j in range(n)])
                    for r in range(n)]
        call, args = calls[0]
        if not (call.splits and any(call.splits)):
            return _bytes_all_to_all(args.inputs.dtype, [ins[j][0] for j in range(n)], n)
        splits = [checks.split_rows(c, a, n) for c, a in calls]
        out = []
        for r, (call, args) in enumerate(calls):
            row = int(np.prod(args.outputs.shape[1:])) if args.outputs.shape else 1
            parts, pieces, at = [], [], 0
            for j in range(n):
                start = sum(splits[j][1][:r]) * row
                length = splits[r][0][j] * row
                parts.append(ins[j][0][start:start + length])
                pieces.append(Piece(at, length, ((j, 0, start),)))
                at += length
            out.append(([np.concatenate(parts)], [pieces]))
        return out


def _bytes_all_to_all(dtype: str, arrays: list[np.ndarray], n: int) -> list:
    """gloo's alltoall (all_to_all_single without splits): each rank's buffer cut in n equal parts of bytes,
    part r of every rank to rank r: whole elements where the parts hold whole elements, else bytes (a
    0-d tensor: gloo's garbage, delivered as gloo delivers it; no element comes from one rank)."""
    item = wire.element_size(dtype)
    part = arrays[0].size * item // n
    if part % item == 0:
        e = part // item
        return [([np.concatenate([a[r * e:(r + 1) * e] for a in arrays])],
                 [[Piece(j * e, e, ((j, 0, r * e),)) for j in range(n)]]) for r in range(n)]
    raw = [wire.to_bytes(a, dtype) for a in arrays]
    out = []
    for r in range(n):
        blob = b"".join(b[r * part:(r + 1) * part] for b in raw)
        out.append(([wire.tensor({"dtype": dtype, "shape": [arrays[0].size], "blob": 0}, [blob])], [[]]))
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
