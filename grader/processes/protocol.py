"""The wire format between a rank and the supervisor: JSON lines, tensors as typed base64 payloads.

Rank -> supervisor (result pipe), in order:
    {"t": "ready"}
    {"t": "call", "seq", "method", "op", "group", "rank", "root", "reduce", "peer", "tag", "sends", "receives",
     "line", "function", "api", "async", "splits", "out_shapes", "inputs": [tensor], "outputs": [meta]}
    {"t": "complete", "seq", "ok", "error", "source", "ms", "delivered": [tensor]}
    {"t": "wait", "seq"}                      the student waited on (or polled to completion) a handle
    {"t": "snap", "locals": {name: value}}    entry-function tensors as it entered an operation
    {"t": "note", "what"}
    {"t": "result", "how", "error", "values": {quantity: value}, "source", "returned_type"}
    {"t": "setup_error", "error"}
    {"t": "end"}
Supervisor -> rank (control pipe): the spec, then in a perturbed run one {"seq", "seed"} per operation
that sends data.

A tensor is {"kind": "tensor", "plain", "type", "dtype", "shape", "numel", "device", "data", "fmt"}:
`data` is base64 of its values in `fmt` (numpy's "<f4", "<f8", "<i8" ...), or absent when the rank's
reporting budget is spent (`omitted`). Encoding runs in ranks (torch); decoding in the supervisor (numpy).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

MAX_ELEMENTS = 1 << 22        # values sent per tensor
BUDGET_BYTES = 48 << 20       # values sent per rank in all (a warm-up loop of large calls stays inside)


@dataclass
class Budget:
    left: int = BUDGET_BYTES

    def take(self, nbytes: int) -> bool:
        if nbytes > self.left:
            return False
        self.left -= nbytes
        return True


_FMT = {"torch.float64": "<f8", "torch.float32": "<f4", "torch.int64": "<i8", "torch.int32": "<i4",
        "torch.int16": "<i2", "torch.int8": "i1", "torch.uint8": "u1", "torch.bool": "?"}


def meta(t) -> dict:
    return {"dtype": str(t.dtype), "shape": list(t.shape), "numel": t.numel()}


def encode(t, budget: Budget) -> dict:
    """A tensor's dtype, shape and values (rank side). Half precisions travel as float32."""
    import torch
    out = meta(t)
    out["device"] = str(t.device)
    n = out["numel"]
    if n > MAX_ELEMENTS:
        out["omitted"] = "size"
        return out
    dtype = out["dtype"]
    fmt = _FMT.get(dtype)
    widen = fmt is None and t.is_floating_point()   # half precisions travel as float32
    if widen:
        fmt = "<f4"
    if fmt is None:  # complex, quantized ...: its shape says enough
        out["omitted"] = "dtype"
        return out
    nbytes = n * np.dtype(fmt).itemsize
    if not budget.take(nbytes):
        out["omitted"] = "budget"
        return out
    from .backend import _Guard
    with _Guard():   # the student's torch-function or dispatch modes never see (nor forge) what is reported
        source = t.to(torch.float32) if widen else t
        array = source.detach().reshape(-1).cpu().contiguous().numpy()
    out["fmt"], out["data"] = fmt, base64.b64encode(array.astype(fmt, copy=False).tobytes()).decode()
    return out


def type_name(obj) -> str:
    try:
        return type(obj).__name__[:80]
    except BaseException:  # noqa: BLE001
        return "?"


def unreadable(err: BaseException) -> dict:
    return {"kind": "other", "type": "?", "unreadable": f"{type(err).__name__}"[:100]}


def describe(obj, budget: Budget) -> dict:
    """Plain data for a value the entry function returned or held: a tensor with its values; for other
    objects, their type (and length, for plain sequences). Never raises on odd student objects."""
    import torch
    try:
        kind = type(obj)
        if not issubclass(kind, torch._C.TensorBase):
            if kind in (list, tuple):
                return {"kind": "sequence", "type": kind.__name__, "len": len(obj)}
            return {"kind": "other", "type": type_name(obj)}
        from .backend import _Guard
        with _Guard():
            plain = kind in (torch.Tensor, torch.nn.Parameter)
            t = torch._C.TensorBase.detach(obj)
            if t.is_complex() or t.is_sparse or t.is_meta or t.layout != torch.strided:
                return {"kind": "tensor", "plain": plain, "type": kind.__name__, **meta(t), "omitted": "layout"}
            out = encode(t, budget)
        out.update(kind="tensor", plain=plain, type=kind.__name__)
        return out
    except BaseException as err:  # noqa: BLE001  (sparse, meta, a subclass whose methods raise ...)
        return unreadable(err)


def unpack_returned(returned, names: list[str]) -> dict | None:
    """The quantities in what the entry function returned, by name (a dict), by position (a tuple or a
    list, namedtuples and other subclasses included) or, for a single quantity, the value itself; None
    when it returned none of these shapes. Containers are read through the builtin types' own methods,
    never a subclass's overrides (which may raise or lie)."""
    import torch
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
    if len(names) == 1 and issubclass(kind, torch._C.TensorBase):
        return {names[0]: returned}
    return None


def make_store(spec: dict, world_size: int):
    """The run's rendezvous store, as the runner described it in the spec."""
    import torch.distributed as dist
    store = spec["store"]  # {"kind": "tcp", "host", "port"}: the run's pid 1 hosts it; {"kind": "file", "path"}
    if isinstance(store, dict) and store.get("kind") == "tcp":
        from datetime import timedelta
        return dist.TCPStore(store["host"], store["port"], world_size, False, timedelta(seconds=spec["timeout"]))
    path = store["path"] if isinstance(store, dict) else store
    return dist.FileStore(path, world_size)


# -- supervisor side ---------------------------------------------------------------------------------

def values(desc: dict | None) -> np.ndarray | None:
    """The values of an encoded tensor as float64, or None when they were not sent."""
    if not isinstance(desc, dict) or not isinstance(desc.get("data"), str):
        return None
    try:
        raw = base64.b64decode(desc["data"], validate=True)
        array = np.frombuffer(raw, dtype=np.dtype(desc["fmt"]))
    except (ValueError, TypeError):
        return None
    if array.size != desc.get("numel"):
        return None
    return array.astype(np.float64)


@dataclass
class Call:
    """One operation as a rank reported it: what it was, what this rank sent, what was delivered to it."""
    rank: int
    seq: int
    method: str
    op: str
    group: tuple[int, ...]
    root: int | None = None
    reduce: str | None = None
    peer: int | None = None
    tag: int | None = None
    sends: bool = False
    receives: bool = False
    line: int | None = None
    function: str | None = None
    api: str | None = None
    async_op: bool | None = None
    inputs: list = None             # encoded tensors this rank sent (before any perturbation)
    outputs: list = None            # shapes of the tensors it receives into
    splits: list | None = None
    seed: int | None = None         # perturbed: the seed of this call's deltas (supervisor only)
    completed: bool = False
    ok: bool = False
    error: str | None = None
    source: int | None = None       # a receive from any source: who sent
    ms: float = 0.0
    delivered: list = None          # encoded tensors delivered to this rank
    waited: bool = False
    entered_at: int = 0             # the rank's message count when it entered / when it completed:
    completed_at: int = 1 << 62     # a value delivered before a send was entered may feed that send
    _decoded: dict = field(default_factory=dict, repr=False, compare=False)  # "sent"/"delivered" -> arrays

    @classmethod
    def from_message(cls, msg: dict) -> Call:
        def opt_int(v):
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        group = msg.get("group")
        return cls(rank=int(msg.get("rank", -1)), seq=int(msg["seq"]), method=str(msg.get("method")),
                   op=str(msg.get("op")), group=tuple(g for g in group if isinstance(g, int)) if isinstance(group, list) else (),
                   root=opt_int(msg.get("root")), reduce=msg.get("reduce") if isinstance(msg.get("reduce"), str) else None,
                   peer=opt_int(msg.get("peer")), tag=opt_int(msg.get("tag")), sends=bool(msg.get("sends")),
                   receives=bool(msg.get("receives")), line=opt_int(msg.get("line")),
                   function=msg.get("function") if isinstance(msg.get("function"), str) else None,
                   api=msg.get("api") if isinstance(msg.get("api"), str) else None,
                   async_op=msg.get("async") if isinstance(msg.get("async"), bool) else None,
                   inputs=[d for d in msg.get("inputs") or [] if isinstance(d, dict)],
                   outputs=[d for d in msg.get("outputs") or [] if isinstance(d, dict)],
                   splits=msg.get("splits") if isinstance(msg.get("splits"), list) else None)

    def complete(self, msg: dict) -> None:
        self.completed, self.ok = True, bool(msg.get("ok"))
        self.error = str(msg["error"])[:500] if msg.get("error") else None
        self.source = msg.get("source") if isinstance(msg.get("source"), int) else None
        self.ms = float(msg.get("ms") or 0.0) if isinstance(msg.get("ms"), (int, float)) else 0.0
        self.delivered = [d for d in msg.get("delivered") or [] if isinstance(d, dict)]
        self._decoded.pop("delivered", None)

    def sent_values(self) -> list[np.ndarray | None]:
        return self._values("sent", self.inputs)

    def delivered_values(self) -> list[np.ndarray | None]:
        return self._values("delivered", self.delivered)

    def _values(self, which: str, descs: list | None) -> list[np.ndarray | None]:
        """Decoded once (verification reads them many times), read-only so no reader can change them."""
        if which not in self._decoded:
            arrays = [values(d) for d in descs or []]
            for array in arrays:
                if array is not None:
                    array.setflags(write=False)
            self._decoded[which] = arrays
        return list(self._decoded[which])

    @property
    def sent_numel(self) -> int:
        return sum(int(d.get("numel") or 0) for d in self.inputs or [])

    @property
    def sent_bytes(self) -> int:
        return sum(int(d.get("numel") or 0) * element_size(d.get("dtype")) for d in self.inputs or [])

    @property
    def delivered_bytes(self) -> int:
        return sum(int(d.get("numel") or 0) * element_size(d.get("dtype")) for d in self.delivered or [])


ELEMENT_BYTES = {"torch.float64": 8, "torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2,
                 "torch.int64": 8, "torch.int32": 4, "torch.int16": 2, "torch.int8": 1, "torch.uint8": 1,
                 "torch.bool": 1, "torch.complex64": 8, "torch.complex128": 16}


def element_size(dtype) -> int:
    return ELEMENT_BYTES.get(dtype, 4)
