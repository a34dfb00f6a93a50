"""Whether the calls the ranks paired fit together, and what to say on every rank where they do not.

Gloo pairs the k-th collective of every rank on a group whatever each rank called: calls that do not fit
(another operation, reduce op or root, other shapes, dtypes or splits) return garbage, hang or abort a rank.
The switch names what differs, with each rank's call, on every rank of the group.
"""
from __future__ import annotations

from .checks import split_rows
from .tensors import Args, OpError, T, shape_text

MISMATCH_WORDS = "the ranks called "   # how every such error begins (verify/outcomes.py words it for the report)
_DTYPE = lambda d: d.split(".")[-1]   # noqa: E731


def signature(call, args: Args, extra: tuple = ()) -> str:
    """A rank's call as the student wrote it: what it sends (else its output buffers), its options."""
    parts = [f"{_DTYPE(t.dtype)}{shape_text(t.shape)}" for t in args.flat_in] or \
            [f"{_DTYPE(t.dtype)}{shape_text(t.shape)}" for t in args.flat_out]
    if call.reduce is not None and call.op in ("all_reduce", "reduce", "reduce_scatter"):
        parts.append(f"op={call.reduce}")
    if call.root is not None:
        parts.append(f"{'src' if call.op in ('broadcast', 'scatter') else 'dst'}={call.root}")
    parts.extend(extra)
    return f"{call.api or call.method}({', '.join(parts)})"


# what differs -> how the error says it (the report words each in its language: catalog "mismatch.<key>")
DIFFERS = {
    "operations": "different operations",
    "reduce": "{op} with different reduce operations",
    "roots": "{op} with different roots",
    "dtypes": "{op} with different dtypes",
    "shapes": "{op} with different shapes",
    "sizes": "{op} with different sizes",
    "row_shapes": "{op} with different row shapes",
    "some_splits": "{op} with splits on some ranks only",
    "splits": "{op} with splits that do not match (rank r's output split j must be rank j's input split r)",
    "tensors": "{op} with tensors that do not fit: what a rank sends another must have the dtype and shape of "
               "that rank's output for it",
}


def mismatch(calls: list[tuple], differs: str, extras: list | None = None) -> OpError:
    """An error for every rank: what differs, then each rank's call (also as data, `problem`, for the report)."""
    listing = [(c.rank, signature(c, a, extras[i] if extras else ())) for i, (c, a) in enumerate(calls)]
    what = DIFFERS[differs].format(op=calls[0][0].op)
    return OpError(f"{MISMATCH_WORDS}{what}: " + "; ".join(f"rank {r}: {call}" for r, call in listing),
                   problem={"kind": "mismatch", "differs": differs,
                            "calls": [{"rank": r, "ops": [call]} for r, call in listing]})


def _differs(values: list) -> bool:
    return any(v != values[0] for v in values[1:])


def agree(calls: list[tuple], n: int, key) -> None:
    """Raise where the ranks' calls differ: in the operation, the reduce op, the root, then in `key(call, args)`
    (dtypes, then shapes, of what every rank must share)."""
    first = calls[0][0]
    forms = [c.method in _FLAT for c, _ in calls] if first.op in ("reduce_scatter", "all_to_all") else []
    if _differs([c.op for c, _ in calls]) or _differs(forms):   # (gloo's algorithms for the two forms differ)
        raise mismatch(calls, "operations")
    if _differs([c.reduce or "SUM" for c, _ in calls]):
        raise mismatch(calls, "reduce")
    if _differs([c.root for c, _ in calls]):
        raise mismatch(calls, "roots")
    shared = [key(c, a) for c, a in calls]
    if _differs([[t[0] for t in s] for s in shared]):
        raise mismatch(calls, "dtypes")
    if _differs(shared):
        raise mismatch(calls, "shapes")


_FLAT = ("_allgather_base", "all_gather_single", "_reduce_scatter_base", "reduce_scatter_single", "alltoall_base",
         "all_to_all_single")


def agree_all_to_all(calls: list[tuple], n: int) -> None:
    """all_to_all: what rank r sends rank j is what rank j receives from rank r, in rows and row shape (the
    single-tensor form, with its splits) or in dtype and shape (the list form)."""
    if not isinstance(calls[0][1].inputs, T):
        for r in range(n):
            for j in range(n):
                a, b = calls[r][1].outputs[j], calls[j][1].inputs[r]
                if (a.dtype, a.shape) != (b.dtype, b.shape):
                    raise mismatch(calls, "tensors")
        return
    split = [c.splits is not None and any(c.splits) for c, _ in calls]
    if _differs(split):
        raise mismatch(calls, "some_splits")
    if not split[0]:   # gloo's alltoall on bytes: the same number of bytes on every rank
        if _differs([a.inputs.numel for _, a in calls]):
            raise mismatch(calls, "sizes")
        return
    if _differs([a.inputs.shape[1:] for _, a in calls]):
        raise mismatch(calls, "row_shapes")
    rows = [split_rows(c, a, n) for c, a in calls]
    extras = [(f"output_splits={out}", f"input_splits={inp}") for out, inp in rows]
    if any(rows[r][0][j] != rows[j][1][r] for r in range(n) for j in range(n)):
        raise mismatch(calls, "splits", extras)
