"""Inside a rank: the process group every API surface of torch.distributed ends in, as a transport to the switch.

Registered as the backend "grader" (`dist.Backend.register_backend`), a Python `ProcessGroup`. `dist.*`
(including `*_into_tensor`, `*_single`, `reduce_scatter*`, send/recv, `batch_isend_irecv`), functional
collectives, `torch.distributed.nn`, DDP, DeviceMesh, DTensor and `new_group` all call its methods, so a new
API surface costs nothing here. For each operation (`comm.METHODS` says which argument is sent and which
receives) it sends the switch one "op" frame: the method, its group and options, the bytes of the tensors
this rank sends (CUDA tensors through host copies) and the shapes of its output buffers; and returns a
handle that completes when the switch answers ("done": the bytes of each output buffer, or an error).

The rank holds no other way to reach another rank, and nothing here is trusted: what this rank sent and
what it was delivered are what the switch measured. What a rank reports besides (where in its code it
called from, when it waits) are hints for the feedback.

The delivered data reaches the student's tensors when the student may look at them, never earlier: at
wait(), at an is_completed() or result() that finds the operation done, or as it lands once a future was
handed out (get_future: DDP's hooks, `.then`). An output read before its wait() holds what it held before
the operation, every time. Grader tensor work runs with torch-function and dispatch modes disabled, on
methods taken from torch._C.TensorBase, so a student's mode or patched Tensor cannot intercept it.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup, Work

from .. import comm, wire
from .guard import Guard
from .values import tensor_bytes

NAME = "grader"
_TB = torch._C.TensorBase
_copy_, _reshape, _to, _view = _TB.copy_, _TB.reshape, _TB.to, _TB.view
_frombuffer = torch.frombuffer


class Link:
    """What the backend needs of its rank (processes/rank.py): the channel to the switch, and hooks."""

    channel = None
    filename: str | None = None

    def restore(self) -> None:
        """Undo what student code did to the interpreter (builtins) before grader code runs."""

    def snapshot(self) -> None:
        """The entry function's tensors as it enters an operation (a rank left waiting is judged on them)."""


_LINK: Link | None = None
# the operations whose work has no future on gloo (torch 2.13: ProcessGroupGloo's send, receive and
# reduce-scatter works keep Work::getFuture's "not implemented"; every other collective's has one)
FUTURELESS = ("send", "recv", "reduce_scatter")
_MISSING = object()


class SwitchWork(Work):
    """The handle the student holds: complete once the switch has answered (see the module docstring)."""

    def __init__(self, seq: int, timeout: float, outputs: list, futureless: bool = False):
        super().__init__()
        self.seq, self.timeout, self.futureless = seq, timeout, futureless
        self.done = threading.Event()
        self.future = torch.futures.Future()
        self.error: BaseException | None = None
        self.outputs = outputs
        self.source: int | None = None
        self.reported_wait = False
        self._lock = threading.Lock()
        self._delivery = None        # the copy into the student's tensors, made once (_deliver)
        self._future_wanted = False
        self._peeked = False

    def _landed(self, delivery, error: BaseException | None, source: int | None) -> None:
        """The channel's thread: the answer is here; the data is copied when the student may look."""
        self.error, self.source = error, source
        with self._lock:
            self._delivery, wanted = delivery, self._future_wanted
        self.done.set()
        if wanted:
            _COMPLETIONS.put(self)

    def _complete_future(self) -> None:
        self._deliver()
        if self.future.done():
            return
        if self.error is None:
            self.future.set_result(list(self.outputs))
        else:
            self.future.set_exception(self.error)

    def _deliver(self) -> None:
        with self._lock:
            delivery, self._delivery = self._delivery, None
        if delivery is not None:
            delivery()

    def _note_wait(self) -> None:
        if not self.reported_wait and _LINK is not None:
            self.reported_wait = True
            _LINK.channel.send({"t": "wait", "seq": self.seq})

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = self.timeout if not timeout else timeout.total_seconds()
        self._note_wait()  # before blocking: the switch then knows this rank waits on this operation
        if not self.done.wait(limit if limit and limit > 0 else None):
            raise RuntimeError(f"operation timed out after {limit:.0f} s")
        if self.error is not None:
            raise self.error
        self._deliver()
        return True

    def is_completed(self) -> bool:
        finished = self.done.is_set()
        if finished:
            self._note_wait()
            self._deliver()
        return finished

    def is_success(self) -> bool:
        return self.done.is_set() and self.error is None

    def exception(self):
        return self.error

    def get_future(self):
        if self.futureless:   # gloo's works of these operations have none: the student's code fails there too
            raise RuntimeError("Work::getFuture not implemented.")
        self._note_wait()  # whoever holds the future waits through it
        _start_completer()
        with self._lock:
            self._future_wanted = True
        if self.done.is_set():
            self._complete_future()   # already landed: now, before anyone can read it through the future
        return self.future

    def result(self):
        if self.done.is_set():
            self._deliver()
        if not self.reported_wait and not self._peeked and _LINK is not None:
            self._peeked = True   # the outputs read without a wait: on gloo a race (verification says so)
            _LINK.channel.send({"t": "peek", "seq": self.seq})
        return list(self.outputs)

    def source_rank(self) -> int:
        return -1 if self.source is None else self.source

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        self.wait()


class _AllWork(Work):
    """One handle for several operations (a coalesced call)."""

    def __init__(self, works: list):
        super().__init__()
        self.works = works
        self.future = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self.works:
            work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self.works)

    def get_future(self):
        if self.future is None and self.works:   # asked for: only then does each operation deliver on landing
            self.future = torch.futures.collect_all([w.get_future() for w in self.works])
        return self.future

    def result(self):
        return [t for work in self.works for t in work.result()]

    def synchronize(self) -> None:
        self.wait()


# Futures complete in a thread of their own: a callback (DDP's) that starts another operation, or waits on
# one, never holds up the channel's thread, which must go on reading answers.
_COMPLETIONS: queue.SimpleQueue = queue.SimpleQueue()
_PENDING: dict[int, tuple[SwitchWork, list]] = {}   # seq -> (handle, the student's output tensors)
_SEQ = [0]
_SEQ_LOCK = threading.Lock()


_COMPLETER_STARTED: list = []
_COMPLETER_LOCK = threading.Lock()


def _start_completer() -> None:
    """The thread that completes futures, started with the first one handed out (most ranks never ask)."""
    with _COMPLETER_LOCK:
        if not _COMPLETER_STARTED and _LINK is not None:
            _COMPLETER_STARTED.append(True)
            _LINK.channel.start_thread(_completer)


def _completer() -> None:
    try:
        while True:
            work = _COMPLETIONS.get()
            try:
                work._complete_future()
            except BaseException:  # noqa: BLE001  (a student's callback raised: the future holds it)
                pass
    except MemoryError:
        _LINK.channel.out_of_memory()


def _on_frame(header, blobs) -> None:
    """The channel's thread: an answer of the switch."""
    if header is None:   # the grader is gone: nothing pending will ever complete
        for work, _ in list(_PENDING.values()):
            work._landed(None, RuntimeError("the grader's switch closed the channel"), None)
        _PENDING.clear()
        return
    if header.get("t") != "done":
        return
    entry = _PENDING.pop(header.get("seq"), None)
    if entry is None:
        return
    work, student_out = entry
    if not header.get("ok"):   # gloo's error, of gloo's type (ValueError for a few, else RuntimeError)
        kind = ValueError if header.get("kind") == "ValueError" else RuntimeError
        work._landed(None, kind(str(header.get("error"))), None)
        return
    arrays = [blobs[d["blob"]] for d in header.get("outputs") or []]   # views of the frame's own buffer

    def delivery():
        with Guard():
            for dst, raw in zip(student_out, arrays):
                src = _reshape(_frombuffer(raw, dtype=dst.dtype) if len(raw) else _TB.new_empty(dst, (0,)),
                               tuple(dst.shape))
                if dst.device.type != "cpu":
                    src = _to(src, dst.device)
                if dst.dtype == torch.bool:   # its bytes as delivered: a bool SUM leaves counts in them, as gloo does
                    dst, src = _view(dst, torch.uint8), _view(src, torch.uint8)
                if dst.layout != torch.strided:
                    src = _TB.coalesce(_TB.to_sparse(src, dst.sparse_dim()))
                if dst.is_inference():   # written as the network would, whichever thread delivers
                    with torch.inference_mode():
                        _copy_(dst, src)
                else:
                    _copy_(dst, src)
    source = header.get("source")
    work._landed(delivery, None, source if isinstance(source, int) else None)


def _tensors(value) -> list:
    """The tensors of a parameter: a tensor, a list of tensors or a list of lists, in order."""
    if isinstance(value, _TB):
        return [value]
    out = []
    for item in value or ():
        out += _tensors(item)
    return out


def _describe(value, blobs: list | None):
    """A parameter's tensors as descriptors, nested as they are; with `blobs`, their bytes appended to it."""
    if isinstance(value, _TB):
        desc = {"dtype": str(value.dtype), "shape": list(value.shape)}
        if desc["dtype"] not in wire.DTYPES:
            raise TypeError(f"the grader cannot carry tensors of dtype {value.dtype}")
        if value.layout == torch.strided and not _TB.is_contiguous(value):   # gloo refuses some operations on such a tensor, and adds a view's
            desc["contiguous"] = False    # elements in the order they lie in memory (the switch decides)
            desc["strides"] = list(_TB.stride(value))
        if blobs is not None:
            desc["blob"] = len(blobs)
            blobs.append(tensor_bytes(value))
        return desc
    if value is None:
        return None
    return [_describe(item, blobs) for item in value]


def _student_frame() -> dict:
    """Where the student's code called from: the innermost frame of the submission, the public
    torch.distributed function it went through, and whether it asked for async_op."""
    frame = sys._getframe(3)
    api, async_op, via = None, None, {}
    filenames = getattr(_LINK, "filenames", ())
    while frame is not None:
        code = frame.f_code
        if code.co_filename in filenames:
            written = code.co_filename != getattr(_LINK, "filename", None)
            return {"line": frame.f_lineno, "function": code.co_name, "api": api, "async": async_op, **via,
                    **({"file": os.path.relpath(code.co_filename, os.getcwd())} if written else {})}
        if code.co_filename.endswith("torch/nn/parallel/distributed.py"):
            via = {"via": "DistributedDataParallel"}   # DDP's own call (its start-up broadcast, say), not the student's
        if "torch/distributed" in code.co_filename:
            qualname = getattr(code, "co_qualname", code.co_name)
            if "<locals>" not in qualname and not qualname.startswith("_") and "._" not in qualname:
                api = qualname
            if async_op is None and "async_op" in code.co_varnames:
                value = frame.f_locals.get("async_op")
                async_op = value if isinstance(value, bool) else None
        frame = frame.f_back
    return {"line": None, "function": None, "api": api, "async": async_op, **via}


class GraderProcessGroup(dist.ProcessGroup):
    """A process group whose every operation goes through the grader's switch."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = timeout.total_seconds()
        # Some callers look up a backend per device before calling a method of this group (functional
        # all_gather): a fake one answers them. Whatever calls it directly moves no data.
        self._fake = FakeProcessGroup._create_internal(rank, size)
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._fake)
        self._group_name = ""
        self._global_ranks: list[int] | None = None

    def __repr__(self) -> str:   # as torch's group shows itself (its errors print the group: "... not part of group <...>")
        return f"<torch.distributed.distributed_c10d.ProcessGroup object at {id(self):#x}>"

    # -- identity, as torch's own Python process groups provide it
    def getBackendName(self) -> str:
        return NAME

    def name(self) -> str:
        return NAME

    def _set_group_name(self, name) -> None:
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def _ranks(self) -> list[int]:
        if self._global_ranks is None:
            try:
                mapping = dist.distributed_c10d._world.pg_group_ranks.get(self)
                self._global_ranks = sorted(mapping, key=mapping.get) if mapping else list(range(self._size))
            except Exception:  # noqa: BLE001
                self._global_ranks = list(range(self._size))
        return self._global_ranks

    # -- the operations
    def _run(self, method_name: str, args: tuple):
        spec = comm.METHODS[method_name]
        if spec.backend and spec.backend.startswith("*"):
            return self._pairs(spec.backend[1:], args)
        return self._send(method_name, args)

    def _pairs(self, single: str, args: tuple):
        """A coalesced method: one operation per (output, input) pair, one handle for all."""
        outputs, inputs, opts = args[0], args[1], args[2] if len(args) > 2 else None
        works = [self._send(single, (out, inp, opts) if opts is not None else (out, inp))
                 for out, inp in zip(outputs, inputs)]
        return _AllWork(works)

    def _send(self, method_name: str, args: tuple):
        link = _LINK
        if link is None:
            raise RuntimeError("the grader's process group is used outside a graded run")
        link.restore()
        method = comm.METHODS[method_name]
        named = dict(zip(method.params, args))
        opts = named.get("opts")
        root = getattr(opts, "rootRank", None) if method.op in ("broadcast", "reduce", "gather", "scatter") else None
        group = self._ranks()
        sends = comm.sends_on(method, self._rank, root)
        student_out = _tensors(named.get(method.receives)) if method.receives else []
        blobs: list = []
        with Guard():
            if method.op == "all_reduce" and _reduce_name(opts) not in (None, "SUM") and any(
                    t.layout != torch.strided for t in _tensors(named.get(method.sends))):
                raise RuntimeError("ProcessGroupGloo::allreduce: unsupported reduction operation (allreduce of "
                                   "sparse tensors only works with ReduceOp.SUM)")
            # a sparse tensor (torch dispatches only all_reduce of one here) travels as its dense values, and
            # the sum comes back into it as a sparse tensor, as gloo's sparse all-reduce leaves it
            inputs = _describe(named.get(method.sends), blobs if sends else None) if method.sends else None
            outputs = _describe(named.get(method.receives), None) if method.receives else None
        peer = named.get("peer")
        tag = named.get("tag")
        if any(isinstance(v, int) and not -(1 << 31) <= v < 1 << 31 for v in (peer, tag)):   # gloo's C++ int
            raise TypeError(f"{method_name}(): incompatible function arguments. The following argument types are "
                            f"supported:\n    (a rank and a tag of 32 bits)")
        header = {"t": "op", "method": method_name, "group": group, "gname": str(self._group_name)[:200],
                  "root": root, "reduce": _reduce_name(opts), "peer": peer if isinstance(peer, int) else None,
                  "tag": tag if isinstance(tag, int) else (0 if method.op in ("send", "recv") else None),
                  "splits": [_ints(named.get("output_splits")), _ints(named.get("input_splits"))]
                  if "input_splits" in named else None,
                  "device": next((t.device.type for t in _tensors(named.get(method.sends)) + student_out), "cpu"),
                  "inputs": inputs, "outputs": outputs, **_student_frame()}
        if header["async"] is None and method.op == "recv" and header["api"] in ("irecv", "batch_isend_irecv"):
            header["async"] = True   # a receive that returns at once: its buffer holds the message after wait()
        link.snapshot()
        with _SEQ_LOCK:   # numbered and sent in one step: the switch sees them in order
            seq = header["seq"] = _SEQ[0]
            _SEQ[0] += 1
            work = SwitchWork(seq, self._timeout, student_out, futureless=method.op in FUTURELESS)
            _PENDING[seq] = (work, student_out)
            link.channel.send(header, blobs)
        return work


def _ints(value) -> list | None:
    if not value:
        return None
    return [int(v) for v in value]


def _reduce_name(opts) -> str | None:
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return None
    name = str(getattr(op, "op", op))
    return name.split(".")[-1].upper()


def _method(name: str):
    params = comm.METHODS[name].params

    def method(self, *args, **kwargs):
        # callers pass some arguments by keyword (`barrier(opts=...)`): put them in place; trailing
        # arguments not given are left out, so the options keep their defaults
        values = list(args) + [kwargs.pop(p, _MISSING) for p in params[len(args):]]
        if kwargs:
            raise TypeError(f"{name}() got unexpected arguments {sorted(kwargs)}")
        while values and values[-1] is _MISSING:
            values.pop()
        if _MISSING in values:
            raise TypeError(f"{name}() is missing an argument")
        return self._run(name, tuple(values))
    method.__name__ = name
    return method


for _name in comm.METHODS:
    setattr(GraderProcessGroup, _name, _method(_name))


def install(link: Link | None) -> None:
    """Register the backend (once per process) and set the rank it serves; start the channel's reader (the
    futures' completer starts with the first future handed out)."""
    global _LINK
    _LINK = link
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, GraderProcessGroup, devices=["cpu", "cuda"])
    if link is not None:
        link.channel.start(_on_frame)
