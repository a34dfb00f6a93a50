"""What gloo refuses of one call alone, in gloo's words, on the rank that made the call.

torch's ProcessGroupGloo checks each call as it is enqueued (a root out of range, a list of the wrong length,
a size or a dtype that does not fit, a non-contiguous tensor where it needs a contiguous one) and as its work
runs (a dtype gloo does not carry: "Invalid scalar type"; a reduce op the dtype does not allow). The switch
raises the same errors, in the same order, with the same words and exception type, measured against torch's
own gloo (tests/test_differential.py); the run goes on, as on gloo. Python-level checks of torch.distributed
(a dtype mixed in a list, a complex MAX all_reduce) run in the rank before anything reaches the switch.
Where gloo crashes the rank instead of raising (a 0-d reduce_scatter_tensor: SIGSEGV), the switch raises,
naming it. What torch raises later, at wait() (AVG of integers), is raised at the call.
"""
from __future__ import annotations

from .tensors import (COMPLEX, CPP_NAMES, GLOO_TYPES, INTEGRAL, REDUCES, ATEN_NAMES, Args, OpError, T, is_list,
                      one_tensor, options_text, shape_text, tensor_list, vec_text)
from ..wire import FLOATING

ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCES_ENUM = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")   # c10d::ReduceOp
ENFORCE = "[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/"   # how gloo's GLOO_ENFORCE begins


def _scalar_type(t: T, complex_ok: bool = True) -> None:
    """Gloo's dtype table (a complex tensor travels as its real view where torch makes one)."""
    if t.dtype not in GLOO_TYPES and not (complex_ok and t.dtype in COMPLEX):
        raise OpError("Invalid scalar type")


def _reduce_op(reduce: str | None, dtype: str) -> None:
    op = reduce or "SUM"
    if op not in REDUCES:
        raise OpError(f"unknown reduce operation {op}")
    if op == "PREMUL_SUM":
        raise OpError("Cannot use ReduceOp.PREMUL_SUM with Gloo")
    if op in ("BAND", "BOR", "BXOR") and dtype not in INTEGRAL:
        raise OpError(f"Cannot use ReduceOp.{op} with non-integral dtype")
    if op == "AVG" and dtype not in FLOATING and dtype not in COMPLEX:
        raise OpError(f"result type Float can't be cast to the desired output type {ATEN_NAMES.get(dtype, dtype)}")


def _complex(reduce: str | None, dtype: str, what: str) -> None:
    """A complex tensor is reduced as its real view: only a SUM (or AVG) of it means anything."""
    op = reduce or "SUM"
    if dtype in COMPLEX and op not in ("SUM", "AVG"):   # c10 prints the ReduceOp as a char: its enum value
        raise OpError(f"{what} does not support{chr(REDUCES_ENUM.index(op))}on complex tensors")


def _root(call, n: int) -> None:
    if not 0 <= call.root < n:
        raise OpError(f"ProcessGroupGloo::{call.op}: invalid root rank: {call.root}")


def _like(name: str, tensors: list, like: T, start: int = 0) -> None:
    """assertTypeAndSizesMatch: each tensor has `like`'s dtype and shape (index counted from `start`)."""
    for j, t in enumerate(tensors):
        if t.dtype != like.dtype:
            raise OpError(f"ProcessGroupGloo::{name}: invalid tensor type at index {j + start} (expected "
                          f"{options_text(like.dtype)}, got {options_text(t.dtype)})",
                          problem={"kind": "unlike", "index": j + start, "expected": like.dtype, "got": t.dtype})
        if t.shape != like.shape:
            raise OpError(f"ProcessGroupGloo::{name}: invalid tensor size at index {j + start} (expected "
                          f"{shape_text(like.shape)}, got {shape_text(t.shape)})",
                          problem={"kind": "unlike", "index": j + start, "expected": str(list(like.shape)),
                                   "got": str(list(t.shape))})


def torch_chunks(shape: tuple, n: int) -> list[tuple]:
    """The shapes torch.chunk(n) gives along dim 0: fewer than n chunks when dim 0 is short, n empty ones when
    it is 0."""
    if not shape[0]:
        return [shape] * n
    size = -(-shape[0] // n)
    return [(min(size, shape[0] - at), *shape[1:]) for at in range(0, shape[0], size)]


def all_reduce(call, args: Args, n: int) -> None:
    name = call.method if call.method == "allreduce_coalesced" else "allreduce"
    tensors = tensor_list(args.inputs, "tensors")
    if not tensors:
        raise OpError(f"ProcessGroupGloo::{name}: requires non-empty tensor list")
    if call.method == "allreduce":
        _like(name, tensors[1:], tensors[0])
    elif len({t.dtype for t in tensors}) > 1:
        raise OpError(f"ProcessGroupGloo::{name}: tensors must all have the same type")
    _complex(call.reduce, tensors[0].dtype, "all_reduce")
    for t in tensors:
        _scalar_type(t)
    _reduce_op(call.reduce, tensors[0].dtype)


def all_gather(call, args: Args, n: int) -> None:
    if isinstance(args.inputs, T):   # the flat forms: the output cut in n along dim 0
        inp, out = args.inputs, one_tensor(args.outputs, "output")
        if call.device != "cpu" and out.numel == n * inp.numel and out.dtype == inp.dtype:
            return   # NCCL takes the stacked form too
        if not out.shape:
            raise OpError("chunk expects at least a 1-dimensional tensor")
        chunks = torch_chunks(out.shape, n)
        if len(chunks) != n:
            raise OpError(f"ProcessGroupGloo::allgather: invalid output tensor list at index 0 (expected length {n}, "
                          f"got {len(chunks)})")
        _like("allgather", [T(out.dtype, shape, 0, 0) for shape in chunks], inp)
        _scalar_type(inp)
        return
    name = "allgather_coalesced" if call.method == "allgather_coalesced" else "allgather"
    inputs, outputs = tensor_list(args.inputs, "input_tensors"), args.outputs
    if not inputs:
        raise OpError(f"ProcessGroupGloo::{name}: requires non-empty input tensor list")
    if call.method == "allgather_coalesced":   # one list per rank, holding a tensor per input
        if not is_list(outputs) or len(outputs) != n:
            raise OpError(f"ProcessGroupGloo::{name}: output lists should be equal to world size")
        for out_list in outputs:
            out_list = tensor_list(out_list, "output_tensors")
            if len(out_list) != len(inputs):
                raise OpError(f"ProcessGroupGloo::{name}: requires input/output tensor lists to have the same length")
            for j, (o, e) in enumerate(zip(out_list, inputs)):
                if (o.dtype, o.shape) != (e.dtype, e.shape):
                    raise OpError(f"ProcessGroupGloo::{name}: invalid size of output tensor at index {j} (expected "
                                  f"length {shape_text(e.shape)}, got {shape_text(o.shape)})")
    else:
        if not is_list(outputs) or len(outputs) != len(inputs):
            raise OpError(f"ProcessGroupGloo::{name}: requires input/output tensor lists to have the same length")
        for i, out_list in enumerate(outputs):
            out_list = tensor_list(out_list, "output_tensors")
            if len(out_list) != len(inputs) * n:
                raise OpError(f"ProcessGroupGloo::{name}: invalid output tensor list at index {i} (expected length "
                              f"{len(inputs) * n}, got {len(out_list)})")
            _like(name, out_list, inputs[0])
    for t in inputs:
        _scalar_type(t)


def reduce_scatter(call, args: Args, n: int) -> None:
    if isinstance(args.inputs, T):
        inp, out = args.inputs, one_tensor(args.outputs, "output")
        if not inp.shape or not out.shape:   # gloo dereferences dim 0 of a 0-d tensor: the rank is killed
            raise OpError("ProcessGroupGloo::reduce_scatter: 0-d tensors kill the rank on gloo (SIGSEGV, no "
                          "exception): reduce_scatter_tensor needs tensors of at least one dimension")
        if out.dtype != inp.dtype:
            raise OpError(f"Check failed: outputTensors[i].dtype() == inputTensors[i].dtype() "
                          f"({CPP_NAMES.get(out.dtype)} vs. {CPP_NAMES.get(inp.dtype)}).")
        if out.shape[0] * n != inp.shape[0]:
            raise OpError(f"Check failed: outputShape[0] * worldSize == inputShape[0] ({out.shape[0] * n} vs. "
                          f"{inp.shape[0]}).")
        for o, i in zip(out.shape[1:], inp.shape[1:]):
            if o != i:
                raise OpError(f"Check failed: outputShape[i] == inputShape[i] ({o} vs. {i}).")
        if len(out.shape) != len(inp.shape):
            raise OpError(f"Check failed: outputShape.size() == inputShape.size() ({len(out.shape)} vs. "
                          f"{len(inp.shape)}).")
        dtype = inp.dtype
    else:
        outputs = tensor_list(args.outputs, "output_tensors")
        if len(outputs) != 1 or not is_list(args.inputs) or len(args.inputs) != 1:
            raise OpError("ProcessGroupGloo::reduce_scatter: requires a single-element output list and input list")
        pieces = tensor_list(args.inputs[0], "input_tensors")
        if len(pieces) != n:
            raise OpError("invalid input tensor list size, must be world size")
        for t in pieces:
            if t.shape != outputs[0].shape:
                raise OpError(f"Check failed: outputs[0].sizes().vec() == inputs[0][i].sizes().vec() "
                              f"({vec_text(outputs[0].shape)} vs. {vec_text(t.shape)}).")
        dtype = outputs[0].dtype
    _scalar_type(T(dtype, (), 0, 0))
    _complex(call.reduce, dtype, "all_reduce")
    _reduce_op(call.reduce, dtype)


def broadcast(call, args: Args, n: int) -> None:
    _root(call, n)
    tensors = tensor_list(args.outputs, "tensors")
    if not tensors:
        raise OpError("ProcessGroupGloo::broadcast: requires non-empty tensor list")
    for t in tensors:
        _scalar_type(t)


def reduce(call, args: Args, n: int) -> None:
    _root(call, n)
    tensors = tensor_list(args.inputs, "tensors")
    if len(tensors) != 1:
        raise OpError("ProcessGroupGloo::reduce: requires a single-element tensor list")
    _complex(call.reduce, tensors[0].dtype, "reduce")
    _scalar_type(tensors[0])
    _reduce_op(call.reduce, tensors[0].dtype)


def _root_list(name: str, what: str, listing, like: T, n: int) -> None:
    """The root's list of a gather or a scatter: one list of n tensors, each like `like`."""
    if not is_list(listing) or len(listing) != 1 or not is_list(listing[0]):
        raise OpError(f"ProcessGroupGloo::{name}: requires a single-element {what} list containing a list with {n} "
                      f"tensors.")
    if len(listing[0]) != n:
        raise OpError(f"ProcessGroupGloo::{name}: Incorrect {what} list size {len(listing[0])}. {what.capitalize()} "
                      f"list size should be {n}, same as size of the process group.")
    _like(name, tensor_list(listing[0], f"{what}_tensors"), like)


def gather(call, args: Args, n: int) -> None:
    _root(call, n)
    inputs = tensor_list(args.inputs, "input_tensors")
    if len(inputs) != 1:
        raise OpError("ProcessGroupGloo::gather: requires a single-element input list")
    if call.group.index(call.rank) == call.root:
        _root_list("gather", "output", args.outputs, inputs[0], n)
    elif args.outputs and any(args.outputs):
        raise OpError("ProcessGroupGloo::gather: requires empty output on non-root")
    _scalar_type(inputs[0], complex_ok=False)


def scatter(call, args: Args, n: int) -> None:
    _root(call, n)
    outputs = tensor_list(args.outputs, "output_tensors")
    if len(outputs) != 1:
        raise OpError("ProcessGroupGloo::scatter: requires a single-element output list")
    if call.group.index(call.rank) == call.root:
        _root_list("scatter", "input", args.inputs, outputs[0], n)
    elif args.inputs and any(args.inputs):
        raise OpError("ProcessGroupGloo::scatter: requires empty input on non-root")
    _scalar_type(outputs[0])


def all_to_all(call, args: Args, n: int) -> None:
    if isinstance(args.inputs, T):
        inp, out = args.inputs, one_tensor(args.outputs, "output")
        if not inp.contiguous:   # (an output view gets its values; gloo writes the memory under it: docs/switch.md)
            raise OpError("Tensors must be contiguous", "ValueError")
        if call.splits and any(call.splits):
            split_rows(call, args, n)
            _scalar_type(inp)
        else:   # gloo's alltoall on bytes: each rank's buffer cut in n equal parts
            _scalar_type(inp)
            size = inp.numel * _itemsize(inp.dtype)
            if size % n:
                raise OpError(f"{ENFORCE}alltoall.cc:29] in->size % context->size == 0. ")
            if size != out.numel * _itemsize(out.dtype):
                raise OpError(f"{ENFORCE}alltoall.cc:30] in->size == out->size. ")
        return
    inputs, outputs = tensor_list(args.inputs, "input_tensors"), tensor_list(args.outputs, "output_tensors")
    if len(inputs) != n:
        raise OpError(f"ProcessGroupGloo::alltoall: input tensor list size {len(inputs)} does not match world size {n}")
    if len(outputs) != n:
        raise OpError(f"ProcessGroupGloo::alltoall: output tensor list size {len(outputs)} does not match world size "
                      f"{n}")
    _like("alltoall", inputs, inputs[0])
    if any(t.shape != inputs[0].shape for t in outputs):
        raise OpError("ProcessGroupGloo::alltoall: input and output tensors must have the same size")
    for t in inputs:
        _scalar_type(t)


def split_rows(call, args: Args, n: int) -> tuple[list[int], list[int]]:
    """all_to_all_single's rows to each rank: (output splits, input splits), as c10d's checkSplitSizes makes them."""
    given = call.splits or [None, None]
    rows = []
    for split, t in zip(given, (args.outputs, args.inputs)):
        total = t.shape[0] if t.shape else 0
        if split:
            if len(split) != n:
                raise OpError("Number of tensor splits not equal to group size")
            if min(split) < 0:   # gloo fails on the byte offsets they make (an internal assert): named instead
                raise OpError(f"split sizes must not be negative: {split}")
            if sum(split) != total:
                raise OpError("Split sizes doesn't match total dim 0 size")
            rows.append(list(split))
        else:
            if total % n:
                raise OpError("Tensor's dim 0 does not divide equally across group size")
            rows.append([total // n] * n)
    return rows[0], rows[1]


def _itemsize(dtype: str) -> int:
    from ..wire import element_size
    return element_size(dtype)


def point_to_point(call, args: Args, n: int) -> None:
    tensors = tensor_list(args.inputs if call.op == "send" else args.outputs, "tensors")
    if len(tensors) != 1:
        raise OpError(f"ProcessGroupGloo::{call.op} takes a single tensor")
    if not tensors[0].contiguous:
        raise OpError("input tensor has to be contiguous")
    if call.peer is not None:
        me = call.group.index(call.rank)
        if not 0 <= call.peer < n:   # gloo waits forever (no pair to that rank): named instead
            raise OpError(f"ProcessGroupGloo::{call.op}: invalid {'destination' if call.op == 'send' else 'source'} "
                          f"rank {call.peer}: the group has {n} ranks (gloo waits forever on it)",
                          problem={"kind": "peer_outside", "peer": call.peer, "n": n})
        if call.peer == me and call.op == "send":
            raise OpError("Invalid destination rank: destination rank should not be the same as the rank of the "
                          "current process.", "ValueError")
        if call.peer == me:
            raise OpError(f"{ENFORCE}transport/tcp/pair.cc:801] state_ >= CONNECTED. 1 vs 4. Pair is not connected "
                          f"(rank {call.rank} receives from itself)")


CHECKS = {"all_reduce": all_reduce, "all_gather": all_gather, "reduce_scatter": reduce_scatter,
          "broadcast": broadcast, "reduce": reduce, "gather": gather, "scatter": scatter, "all_to_all": all_to_all,
          "barrier": lambda call, args, n: None, "send": point_to_point, "recv": point_to_point}


def check(call, args: Args, n: int) -> None:
    """Raise OpError where gloo refuses this call on the rank that made it."""
    CHECKS[call.op](call, args, n)


def check_message(send: tuple, recv: tuple) -> tuple[str, dict] | None:
    """Why a message cannot land in the buffer posted for it, and the figures (None: it fits). Gloo aborts
    the receiver, fills part of the buffer or reads the bytes as another dtype: the switch names it instead."""
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
