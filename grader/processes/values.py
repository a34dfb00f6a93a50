"""Inside a rank: the values the entry function returned or holds, as plain data for the supervisor.

A tensor becomes a descriptor ({"kind": "tensor", "plain", "type", "dtype", "shape", "blob"}) and its raw
bytes; anything else, its type (and length, for plain sequences). Reading never raises on odd student
objects, and runs with the student's torch-function and dispatch modes off (backend._Guard). These are the
rank's answers: the supervisor judges them, and trusts nothing else a rank says.
"""
from __future__ import annotations

import torch

from .. import wire

MAX_ELEMENTS = 1 << 22        # values sent per tensor
BUDGET_BYTES = 48 << 20       # values of the answers sent per rank in all
SNAPSHOT_BYTES = 32 << 20     # values of the snapshots (entry's locals as it enters an operation) in all

_TB = torch._C.TensorBase


class Budget:
    def __init__(self, left: int = BUDGET_BYTES):
        self.left = left

    def take(self, nbytes: int) -> bool:
        if nbytes > self.left:
            return False
        self.left -= nbytes
        return True


def type_name(obj) -> str:
    try:
        return type(obj).__name__[:80]
    except BaseException:  # noqa: BLE001
        return "?"


def unreadable(err: BaseException) -> dict:
    return {"kind": "other", "type": "?", "unreadable": f"{type(err).__name__}"[:100]}


def tensor_bytes(t) -> memoryview:
    """The raw bytes of a tensor (C order, on the host); the caller holds the guard."""
    t = _TB.contiguous(_TB.detach(t))
    if t.device.type != "cpu":
        t = _TB.cpu(t)
    if t.dtype in (torch.bfloat16, torch.float16):
        t = _TB.view(t, torch.int16)
    elif t.dtype.is_floating_point and t.element_size() == 1:   # float8: bytes
        t = _TB.view(t, torch.uint8)
    elif t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        t = _TB.view(t, {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}[t.dtype])
    return memoryview(_TB.numpy(t)).cast("B")


def describe(obj, budget: Budget, blobs: list) -> dict:
    """Plain data for a value the entry function returned or held (its bytes appended to `blobs`)."""
    from .backend import _Guard
    try:
        kind = type(obj)
        if not issubclass(kind, _TB):
            if kind in (list, tuple):
                return {"kind": "sequence", "type": kind.__name__, "len": len(obj)}
            return {"kind": "other", "type": type_name(obj)}
        waited = _async_collective(obj)
        if waited is not None:
            obj, kind = waited, type(waited)
        with _Guard():
            plain = kind in (torch.Tensor, torch.nn.Parameter)
            t = _TB.detach(obj)
            out = {"kind": "tensor", "plain": plain, "type": kind.__name__, "dtype": str(t.dtype),
                   "shape": list(t.shape)}
            if t.is_sparse or t.is_meta or t.layout != torch.strided or str(t.dtype) not in wire.DTYPES:
                return {**out, "omitted": "layout"}
            if t.numel() > MAX_ELEMENTS:
                return {**out, "omitted": "size"}
            if not budget.take(t.numel() * t.element_size()):
                return {**out, "omitted": "budget"}
            data = tensor_bytes(t)
        out["blob"] = len(blobs)
        blobs.append(data)
        return out
    except BaseException as err:  # noqa: BLE001  (meta, a subclass whose methods raise ...)
        return unreadable(err)


ASYNC_TENSOR: list = []   # [AsyncCollectiveTensor, wait_tensor] of torch, taken before any student code runs (rank.run)


def _async_collective(obj):
    """The tensor that torch's own wrapper of a functional collective's result stands for (it waits for the
    data on first use; returned without an explicit wait, it is the documented result): waited for. None for
    anything else, a look-alike class of the student's included (only torch's class object counts)."""
    if not ASYNC_TENSOR or type(obj) is not ASYNC_TENSOR[0]:
        return None
    return ASYNC_TENSOR[1](obj.elem)


def unpack_returned(returned, names: list[str]) -> dict | None:
    """The quantities in what the entry function returned, by name (a dict), by position (a tuple or a
    list, namedtuples and other subclasses included) or, for a single quantity, the value itself; None
    when it returned none of these shapes. Containers are read through the builtin types' own methods,
    never a subclass's overrides (which may raise or lie)."""
    if returned is None:
        return None
    kind = type(returned)
    if issubclass(kind, dict):
        found = {n: dict.__getitem__(returned, n) for n in names if dict.__contains__(returned, n)}
        return found or None
    if issubclass(kind, (tuple, list)):
        base = tuple if issubclass(kind, tuple) else list
        items = [base.__getitem__(returned, i) for i in range(base.__len__(returned))]
        if len(items) == len(names):
            return dict(zip(names, items))
        if len(names) == 1:
            return {names[0]: returned}
        return None
    if len(names) == 1 and issubclass(kind, _TB):
        return {names[0]: returned}
    return None
