"""Gloo's arithmetic: an elementwise reduction of the ranks' arrays, in the dtype and in the order gloo adds them.

torch's ProcessGroupGloo (torch 2.13, CPU) reduces with gloo's ring algorithms (gloo/allreduce.cc `ring`,
gloo/reduce.cc): the flat buffer is cut into 2N or more segments, N consecutive runs of them ("chunks"), and
chunk c is reduced along the ring starting at rank c - 1: rank c - 2 combines its own value with what it
received, rank c - 3 combines its own with that, ... and rank c last, so that element j of chunk c is
    x[c] + (x[c+1] + (... + (x[c-2] + x[c-1])))      (indices mod N; each + rounded in the dtype)
and every rank then receives chunk c as rank c computed it. Which chunk an element falls in depends on the
buffer's size in bytes, the element size and N (a segment is at most 1 MiB), so the order varies along the
tensor; at 2 ranks it cannot matter. Measured against torch's own gloo, bit for bit, at 3 and 4 ranks, for
1 to 4M elements (tests/test_differential.py):
  - all_reduce: the ring of gloo/allreduce.cc over the tensor (a list of tensors on a rank is first summed
    locally, left to right); all_reduce_coalesced: one ring over the tensors laid end to end;
  - reduce: the ring of gloo/reduce.cc (segments of total / 2N bytes, at most 1 MiB);
  - reduce_scatter_tensor: the all_reduce ring over the whole input, each rank keeping its chunk;
    the list form: one all_reduce ring per rank's piece;
  - AVG: the SUM, then divided by N in the dtype (as torch divides the result).
A combination is gloo's: a + b rounded to the dtype (float16 and bfloat16 through float32, as gloo and c10
do), a * b, std::max(a, b) = (a < b ? b : a), std::min(a, b) = (b < a ? b : a), where a is the rank's own
value and b what it received (so a NaN received by MAX or MIN is dropped, one of its own is kept). bool is
reduced as bytes, as gloo does: a SUM leaves the number of ranks that sent True in each byte.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import twocores
from ..wire import round_to

MAX_SEGMENT = 1 << 20   # gloo's kMaxSegmentSize (allreduce.h, reduce.h)
MAX_ORDERED = 1 << 22   # a view of more elements is added in C order (the supervisor's memory: 3 int64 per element)
COMMUTATIVE = ("SUM", "AVG", "PRODUCT")   # at two ranks their order cannot matter (MAX and MIN keep a NaN of one side)


def _round_up(value: int, multiple: int) -> int:
    return value if value % multiple == 0 else value + multiple - value % multiple


@functools.lru_cache(maxsize=256)
def chunk_bounds(elements: int, item: int, n: int, algorithm: str = "allreduce") -> tuple[tuple[int, int], ...]:
    """[start, stop) of chunk c (the elements rank c reduces last), for c in 0..n-1, as gloo cuts the buffer."""
    total = elements * item
    if not total:
        return ((0, 0),) * n
    if algorithm == "allreduce":
        max_segment = item * max(1, MAX_SEGMENT // item)
        segments = _round_up(max(-(-total // max_segment), 2 * n), n)
        segment = _round_up(-(-total // segments), item)
    else:   # gloo/reduce.cc
        segment = _round_up(min(-(-total // (2 * n)), item * (MAX_SEGMENT // item)), item)
        segments = _round_up(max(-(-total // segment), 2 * n), n)
    per_chunk = segments // n * (segment // item)
    return tuple((min(c * per_chunk, elements), min((c + 1) * per_chunk, elements)) for c in range(n))


def _combine(op: str, floating: bool):
    if op in ("SUM", "AVG"):
        return np.add
    if op == "PRODUCT":
        return np.multiply
    if op == "MAX":
        return (lambda own, got: np.where(own < got, got, own)) if floating else np.maximum
    if op == "MIN":
        return (lambda own, got: np.where(got < own, got, own)) if floating else np.minimum
    return {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]


def memory_order(shape: tuple, strides: tuple | None) -> np.ndarray | None:
    """The logical (C-order) indices of a view's elements in the order they lie in memory, for a view whose
    elements fill a block of memory exactly once (a transposed or permuted tensor): gloo's ring cuts that
    memory, not the logical order. None for a contiguous tensor, and for one with gaps or overlaps (gloo
    reduces other memory there: its bug, not reproduced)."""
    numel = int(np.prod(shape)) if shape else 1
    if strides is None or not 2 <= numel <= MAX_ORDERED or len(strides) != len(shape) or \
            any(not 0 <= s < 1 << 31 for s in strides):
        return None
    where = np.zeros(shape, dtype=np.int64)
    for k, (size, stride) in enumerate(zip(shape, strides)):
        if size > 1:
            axis = [size if j == k else 1 for j in range(len(shape))]
            where += (np.arange(size, dtype=np.int64) * stride).reshape(axis)
    where = where.reshape(-1)
    if where.max() >= numel or np.bincount(where, minlength=numel).max() != 1:
        return None
    order = np.empty(numel, dtype=np.int64)
    order[where] = np.arange(numel)
    return order


def reduce_arrays(arrays: list[np.ndarray], op: str | None, dtype: str, n: int, algorithm: str = "allreduce",
                  local: int = 1, layout: tuple | None = None) -> np.ndarray:
    """The reduction of `arrays` (flat, each as wire.tensor gives it for `dtype`), in gloo's order: `local`
    consecutive arrays per rank (a list all_reduce) are combined on their rank first, then the ranks'
    results along gloo's ring (`algorithm`: "allreduce" or "reduce"), over the elements in the order they lie
    in memory in a view of this `layout` (shape, strides; None: C order). Returns a new array."""
    op = op or "SUM"
    kind = np.asarray(arrays[0]).dtype
    ring = kind.kind in "fc" and len(arrays) // local >= 2 and (len(arrays) // local > 2 or op not in COMMUTATIVE)
    order = memory_order(*layout) if layout is not None and ring else None
    if order is not None:
        total = reduce_arrays([np.asarray(a)[order] for a in arrays], op, dtype, n, algorithm, local)
        logical = np.empty_like(total)
        logical[order] = total
        return logical
    if dtype == "torch.bool":   # bytes, as gloo adds them
        arrays = [np.asarray(a).view(np.uint8) for a in arrays]
    elif kind.kind == "c":      # a complex sum is a sum of its real and imaginary parts, as floats
        arrays = [np.asarray(a).view(np.dtype(f"f{kind.itemsize // 2}")) for a in arrays]
    floating = arrays[0].dtype.kind == "f"
    combine = _combine(op, floating)
    bf16 = dtype == "torch.bfloat16"
    item = 2 if bf16 else arrays[0].itemsize   # what gloo sees: bfloat16 travels here as float32

    def step(own, got):
        out = combine(own, got)
        return round_to(out.astype(np.float64), dtype) if bf16 else out

    with np.errstate(all="ignore"):
        if local > 1:   # a rank's own tensors, left to right (gloo's local reduction before the ring)
            arrays = [_fold(arrays[g * local:(g + 1) * local], step) for g in range(len(arrays) // local)]
        ranks = len(arrays)
        if ranks == 1:
            total = arrays[0].copy()
        elif combine is np.add and not bf16 and arrays[0].nbytes * ranks >= twocores.LEAST:
            total = _sum(arrays, floating and ranks > 2, item, algorithm)
        elif not floating or (ranks == 2 and op in COMMUTATIVE):   # the order cannot change the result
            total = _fold(arrays, step)
        else:
            total = np.empty_like(arrays[0])
            for c, (start, stop) in enumerate(chunk_bounds(arrays[0].size, item, ranks, algorithm)):
                if start == stop:
                    continue
                if combine is np.add and not bf16:   # the same additions, into the result (no temporaries)
                    acc = total[start:stop]
                    np.add(arrays[(c - 2) % ranks][start:stop], arrays[(c - 1) % ranks][start:stop], out=acc)
                    for k in range(3, ranks + 1):
                        np.add(arrays[(c - k) % ranks][start:stop], acc, out=acc)
                    continue
                acc = arrays[(c - 1) % ranks][start:stop]
                for k in range(2, ranks + 1):
                    acc = step(arrays[(c - k) % ranks][start:stop], acc)
                total[start:stop] = acc
        if op == "AVG":   # torch divides the sum; a complex one times 1/N (c10::complex's division by a real)
            total = total * (np.asarray(1, total.dtype) / np.asarray(n, total.dtype)) if kind.kind == "c" else \
                total / np.asarray(n, dtype=total.dtype)
            if bf16:
                total = round_to(total.astype(np.float64), dtype)
    total = np.asarray(total, dtype=arrays[0].dtype)
    return total.view(kind) if kind.kind == "c" else total


def _sum(arrays: list[np.ndarray], ring: bool, item: int, algorithm: str) -> np.ndarray:
    """The sum of large arrays, on two cores (twocores.py), with the same additions as reduce_arrays makes
    one after the other: along gloo's ring, chunk by chunk (`ring`), else in the ranks' order, in two halves
    (integers, and floats at two ranks, whose order cannot change the result)."""
    ranks, total = len(arrays), np.empty_like(arrays[0])
    if ring:
        bounds = chunk_bounds(total.size, item, ranks, algorithm)
        orders = [[(c - 2) % ranks, (c - 1) % ranks] + [(c - k) % ranks for k in range(3, ranks + 1)]
                  for c in range(ranks)]
    else:
        half = total.size // 2
        bounds, orders = ((0, half), (half, total.size)), [list(range(ranks))] * 2

    def add(start: int, stop: int, order: list) -> None:
        if start == stop:
            return
        acc = total[start:stop]
        with np.errstate(all="ignore"):   # numpy's error state is the thread's own
            np.add(arrays[order[0]][start:stop], arrays[order[1]][start:stop], out=acc)
            for k in order[2:]:
                np.add(arrays[k][start:stop], acc, out=acc)

    twocores.run_all([functools.partial(add, start, stop, order) for (start, stop), order in zip(bounds, orders)],
                     total.nbytes * ranks)
    return total


def _fold(arrays: list[np.ndarray], step) -> np.ndarray:
    acc = arrays[0]
    for a in arrays[1:]:
        acc = step(acc, a)
    return acc if len(arrays) > 1 else acc.copy()
