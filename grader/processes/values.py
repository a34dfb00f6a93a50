"""Inside a rank: the values the entry function returned or holds, as plain data for the supervisor.

A tensor becomes a descriptor ({"kind": "tensor", "plain", "type", "dtype", "shape", "blob"}) and its raw
bytes; anything else, its type (and length, for plain sequences). Reading never raises on odd student
objects, and runs with the student's torch-function and dispatch modes off (guard.Guard). These are the
rank's answers: the supervisor judges them, and trusts nothing else a rank says.
"""
from __future__ import annotations

import torch

from .. import wire
from .guard import Guard

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
    """The type's name as a student knows it: `list`, `numpy.ndarray`, `mymodule.Result`."""
    try:
        kind = type(obj)
        module = kind.__module__ if isinstance(kind.__module__, str) else ""
        module = module.split(".")[0] if module.startswith("numpy") else module
        return (kind.__qualname__ if module in ("builtins", "") else f"{module}.{kind.__qualname__}")[:80]
    except BaseException:  # noqa: BLE001
        return "?"


def unreadable(err: BaseException) -> dict:
    return {"kind": "other", "type": "?", "unreadable": f"{type(err).__name__}"[:100]}


def tensor_bytes(t) -> memoryview:
    """The raw bytes of a tensor (C order, on the host; a sparse one's dense values); the caller holds the guard."""
    if t.layout != torch.strided:
        t = _TB.to_dense(t)
    t = _TB.reshape(_TB.contiguous(_TB.detach(t)), (-1,))   # flat: a memoryview cannot cast a shape with a 0
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
    try:
        kind = type(obj)
        if not issubclass(kind, _TB):
            if kind in (list, tuple):
                return {"kind": "sequence", "type": kind.__name__, "len": len(obj)}
            return {"kind": "other", "type": type_name(obj)}
        waited = _async_collective(obj)
        if waited is not None:
            obj, kind = waited, type(waited)
        with Guard():
            plain = kind in (torch.Tensor, torch.nn.Parameter)
            t = _TB.detach(obj)
            out = {"kind": "tensor", "plain": plain, "type": kind.__name__, "dtype": str(t.dtype),
                   "shape": list(t.shape)}
            if t.is_meta or t.layout not in (torch.strided, torch.sparse_coo) or str(t.dtype) not in wire.DTYPES:
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


MAX_SCANNED = 64   # items of a returned tuple or list looked through when it does not match the quantities one to one
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DATA_PTR = torch._C.StorageBase.data_ptr
_STORAGE = _TB.untyped_storage
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction   # a student's torch-function mode or subclass: set aside


def _is_tensor(obj) -> bool:
    return issubclass(type(obj), _TB)


def _memory(obj) -> int:
    """Where a plain tensor's data live, to tell a slice or view of a variable (0: nothing to compare: not a
    plain tensor, meta, sparse, empty). The caller holds _NO_TORCH_FUNCTION (no dispatcher op runs)."""
    if type(obj) not in _PLAIN:
        return 0
    try:
        return int(_DATA_PTR(_STORAGE(obj)))
    except BaseException:  # noqa: BLE001
        return 0


def _claimed(items: list, names: list[str], local: dict) -> dict:
    """The quantities that returned tensors stand for because each is the entry function's variable of
    that name, or shares its memory (a slice, a view, a .detach() of it): a tensor that is several
    quantities' variable, or a quantity that several returned tensors are, is left to the locals."""
    own = {n: v for n, v in local.items() if v is not None}
    if not own:
        return {}
    claims: dict = {n: [] for n in own}
    with _NO_TORCH_FUNCTION():
        memory = {n: _memory(v) for n, v in own.items()}
        for item in items:
            if not _is_tensor(item):
                continue
            hits = [n for n, v in own.items() if item is v]
            if not hits:
                m = _memory(item)
                hits = [n for n in own if m and memory[n] == m]
            if len(hits) == 1 and not any(c is item for c in claims[hits[0]]):
                claims[hits[0]].append(item)
    return {n: c[0] for n, c in claims.items() if len(c) == 1}


def _from_return(returned, names: list[str], local: dict) -> dict:
    if returned is None:
        return {}
    kind, k = type(returned), len(names)
    if issubclass(kind, dict):
        found = {n: dict.get(returned, n) for n in names}
        return {n: v for n, v in found.items() if v is not None}
    if issubclass(kind, (tuple, list)):
        base = tuple if issubclass(kind, tuple) else list
        size = base.__len__(returned)
        if size == k:
            found = {n: base.__getitem__(returned, i) for i, n in enumerate(names)}
            return {n: v for n, v in found.items() if v is not None}
        items = [base.__getitem__(returned, i) for i in range(size)] if size <= MAX_SCANNED else []
    elif issubclass(kind, _TB):
        if k == 1:
            return {names[0]: returned}
        items = [returned]
    else:
        return {}
    found = _claimed(items, names, local)
    # a quantity no returned tensor is the variable of: the tensor at its position (`return a, b, elapsed`:
    # what the code returns is what it computed, even where its variables hold something else)
    taken = list(found.values())
    for i, name in enumerate(names if issubclass(kind, (tuple, list)) else ()):
        if name not in found and i < len(items) and _is_tensor(items[i]) and not any(t is items[i] for t in taken):
            found[name] = items[i]
            taken.append(items[i])
    if k == 1 and not found:
        tensors: list = []
        for v in items:
            if _is_tensor(v) and not any(t is v for t in tensors):
                tensors.append(v)
        if len(tensors) == 1:
            found[names[0]] = tensors[0]
        elif local.get(names[0]) is None:
            found[names[0]] = returned   # nothing else to judge: the sequence itself (not a tensor)
    return found


def unpack_returned(returned, names: list[str], final_locals: dict | None = None) -> dict | None:
    """The quantities taken from what the entry function returned (name -> object); each quantity absent
    is read from the entry function's final locals (`final_locals`, its variable of that name). None when
    none is taken. The rule, in order:

    - None, or anything but a dict, a tuple, a list or a tensor: nothing.
    - A dict: each quantity whose name is a key (its value not None).
    - A tuple or a list (namedtuples and other subclasses included) as long as the quantities: by position,
      in declaration order (an item that is None is not taken).
    - A single tensor, for one quantity: that tensor.
    - Otherwise (a tuple or a list of another length, or a single tensor for several quantities): each
      returned tensor that is the variable of a quantity's name, or a slice or view of it (shares its
      memory), stands for that quantity, when that pairing is one to one; a quantity left over takes the
      tensor at its position, if there is one (`return answer, other, elapsed`). For one quantity
      besides: the one tensor among the returned items when there is exactly one; else its variable; else,
      when it has none, what was returned (judged as it is: not a tensor). A tuple or a list longer than
      MAX_SCANNED is not looked through (the variables, as when nothing pairs).

    Containers are read through the builtin types' own methods, never a subclass's overrides (which may
    raise or lie); generators and other objects are never iterated; a container that cannot be read (a
    student's thread changing it meanwhile, a key whose __eq__ raises) gives nothing. Each quantity gets one
    object at most: a rank's report is never read two ways."""
    names = list(names)
    local = {n: dict.get(final_locals, n) for n in names} if type(final_locals) is dict else {}
    try:
        found = _from_return(returned, names, local)
    except BaseException:  # noqa: BLE001
        found = {}
    return found or None


def select(returned, final_locals: dict, names: list[str]) -> tuple[dict, dict]:
    """Each quantity's object (None: none) and where it came from ("return" or "locals"), by
    unpack_returned's rule."""
    found = unpack_returned(returned, names, final_locals) or {}
    local = final_locals if type(final_locals) is dict else {}
    chosen, sources = {}, {}
    for name in names:
        if name in found:
            chosen[name], sources[name] = found[name], "return"
        else:
            chosen[name], sources[name] = dict.get(local, name), "locals"
    return chosen, sources
