"""The observed layer: the process group every API surface of torch.distributed ends in.

Registered as the backend "grader" (`dist.Backend.register_backend`), a Python `ProcessGroup` that wraps a
real one (gloo for CPU tensors, NCCL for CUDA tensors). `dist.*` (including `*_into_tensor`, `*_single`,
`reduce_scatter*`, send/recv, `batch_isend_irecv`), functional collectives, `torch.distributed.nn`,
DDP, DeviceMesh and `new_group` all call its methods, so a new API surface costs nothing here.
For each operation (`comm.METHODS` says which argument is sent and which receives):

  1. enqueue: copy what this rank sends into private buffers and report it (its contribution); in a
     perturbed run add the supervisor's secret deltas to the private copy (never to the student's
     tensor); allocate private output buffers;
  2. run the real operation on the private buffers: no student tensor is ever written by the network;
  3. complete, inside the backend (the real work's future callback, or a watcher thread where the
     backend has no future), never at the student's wait(): report what was delivered, copy it into
     the student's output tensors, then complete the handle the student holds.

So an answer added into a buffer before wait(), or edited by a racing thread, is not what the
communication delivered; and what each rank contributed is known, not assumed. Grader tensor work runs
with torch-function and dispatch modes disabled, so a student's mode cannot intercept it.
"""
from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup, ProcessGroupGloo, Work
from torch._C import _len_torch_dispatch_stack as _dispatch_modes
from torch._ops import _len_torch_dispatch_stack_pre_dispatch as _pre_dispatch_modes
from torch.utils._python_dispatch import _disable_current_modes
# _disable_current_modes imports this on its first use: imported here, the zygote holds it and no rank
# loads it from disk (tests/test_runner.py: a rank imports nothing while it is observed and perturbed).
import torch._subclasses.schema_check_mode  # noqa: F401,E402

from .. import comm
from ..verify import perturb

NAME = "grader"
_TB = torch._C.TensorBase
_clone, _copy_, _add_, _contig = _TB.clone, _TB.copy_, _TB.add_, _TB.contiguous
_empty_like, _detach = torch.empty_like, _TB.detach
_no_grad = torch.no_grad


class Reporter:
    """What the backend tells the supervisor (implemented by the rank, processes/rank.py)."""

    def enter(self, call: dict, sent: list, received: list) -> int | None:
        """A new operation: its description and the tensors this rank sends (private copies, before any
        perturbation). Returns the seed of this call's deltas in a perturbed run, else None."""
        raise NotImplementedError

    def complete(self, seq: int, ok: bool, delivered: list, error: str | None, source: int | None,
                 ms: float) -> None:
        """The operation finished (inside the backend): what it delivered to this rank's outputs."""
        raise NotImplementedError

    def waited(self, seq: int) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        """Undo what student code did to the interpreter (builtins) before grader code runs."""


_REPORTER: Reporter | None = None
_MISSING = object()
_CUDA = False   # NCCL for CUDA tensors (set by the rank of an NCCL run)


class _Guard:
    """Grader tensor work: no autograd, no torch-function or dispatch mode of the student's."""

    def __enter__(self):
        self._stack = [_no_grad(), torch._C.DisableTorchFunction()]
        if _dispatch_modes() or _pre_dispatch_modes():   # a mode of the student's (rare): put aside meanwhile
            self._stack.append(_disable_current_modes())
        for ctx in self._stack:
            ctx.__enter__()
        return self

    def __exit__(self, *exc):
        for ctx in reversed(self._stack):
            ctx.__exit__(None, None, None)
        return False


def deltas(seed: int, numel: int, dtype: torch.dtype):
    """This call's secret deltas (perturbed runs): positive multiples of a power of two, so that they add
    exactly and never cancel. The supervisor derives the same numbers from the seed (verify/perturb.py)."""
    values = perturb.delta_values(seed, numel, str(dtype))
    return None if values is None else torch.from_numpy(values)


def perturbable(t) -> bool:
    """Floating tensors, and integer tensors of more than one element (a one-element integer is a count
    or a size: perturbing it would change what the program does, not what it computes)."""
    return perturb.perturbable(str(t.dtype), t.numel())


class ObservedWork(Work):
    """The handle the student holds: complete once the backend has recorded the data.

    The data reaches the student's tensors when the student may look at them, never earlier: at wait(),
    at an is_completed() or result() that finds the operation done, or on completion once a future was
    handed out (get_future: DDP's hooks, `.then`). An output read before its wait() therefore holds what it
    held before the operation, every time, instead of whatever a race left there (gloo may write it
    early, or not): a read-before-wait mistake gets the same verdict on every run, and never full marks
    by luck."""

    def __init__(self, seq: int, timeout: float):
        super().__init__()
        self.seq, self.timeout = seq, timeout
        self.done = threading.Event()
        self.future = torch.futures.Future()
        self.error: BaseException | None = None
        self.outputs: list = []
        self.source: int | None = None
        self.reported_wait = False
        self._lock = threading.Lock()
        self._delivery = None        # the copy into the student's tensors, made once (_deliver)
        self._future_wanted = False

    def _landed(self, delivery) -> None:
        """The backend's thread, as the data lands: the copy is kept for later, unless a future is out."""
        with self._lock:
            self._delivery, wanted = delivery, self._future_wanted
        if wanted:
            self._deliver()

    def _deliver(self) -> None:
        with self._lock:
            delivery, self._delivery = self._delivery, None
        if delivery is not None:
            delivery()

    def _finish(self, outputs, error: BaseException | None, source: int | None) -> None:
        self.outputs, self.error, self.source = outputs, error, source
        self.done.set()
        if error is None:
            self.future.set_result(outputs)
        else:
            self.future.set_exception(error)

    def _note_wait(self) -> None:
        if not self.reported_wait and _REPORTER is not None:
            self.reported_wait = True
            _REPORTER.waited(self.seq)

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = self.timeout if not timeout else timeout.total_seconds()
        self._note_wait()  # before blocking: the supervisor then knows this rank waits on this operation
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
        self._note_wait()  # whoever holds the future waits through it
        with self._lock:
            self._future_wanted = True
        self._deliver()    # already landed: now, before anyone can read it through the future
        return self.future

    def result(self):
        if self.done.is_set():
            self._deliver()
        return list(self.outputs)

    def source_rank(self) -> int:
        return -1 if self.source is None else self.source

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        self.wait()


class _AllWork(Work):
    """One handle for several observed operations (a coalesced call)."""

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


def _tensors(value) -> list:
    """The tensors of a parameter: a tensor, a list of tensors or a list of lists, in order."""
    if isinstance(value, _TB):
        return [value]
    out = []
    for item in value or ():
        out += _tensors(item)
    return out


def _rebuild(value, fresh: list):
    """`value`'s nesting with its tensors replaced, in order, by those of `fresh`."""
    if isinstance(value, _TB):
        return fresh.pop(0)
    return [_rebuild(item, fresh) for item in value]


def _student_frame() -> dict:
    """Where the student's code called from: the innermost frame of the submission, the public
    torch.distributed function it went through, and whether it asked for async_op."""
    frame = sys._getframe(2)
    api, async_op = None, None
    filename = getattr(_REPORTER, "filename", None)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == filename:
            return {"line": frame.f_lineno, "function": code.co_name, "api": api, "async": async_op}
        if "torch/distributed" in code.co_filename:
            qualname = getattr(code, "co_qualname", code.co_name)
            if "<locals>" not in qualname and not qualname.startswith("_") and "._" not in qualname:
                api = qualname
            if async_op is None and "async_op" in code.co_varnames:
                value = frame.f_locals.get("async_op")
                async_op = value if isinstance(value, bool) else None
        frame = frame.f_back
    return {"line": None, "function": None, "api": api, "async": async_op}


class GraderProcessGroup(dist.ProcessGroup):
    """A process group whose every operation is observed (see the module docstring)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = timeout.total_seconds()
        self._cpu = ProcessGroupGloo(store, rank, size, timeout)
        self._cpu._set_sequence_number_for_group()
        self._issued = 0     # operations this wrapper ran on the real gloo group (see unobserved())
        _GROUPS.append(self)
        self._cuda = None
        if _CUDA:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self._cuda = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, opts)
        # Some callers look up a backend per device before calling a method of this group (functional
        # all_gather): a fake one answers them. Whatever calls it directly moves no real data.
        self._fake = FakeProcessGroup._create_internal(rank, size)
        for device in ("cpu", "cuda") if self._cuda is not None else ("cpu",):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._fake)
        self._group_name = ""
        self._global_ranks: list[int] | None = None

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
            except Exception:
                self._global_ranks = list(range(self._size))
        return self._global_ranks

    # -- the operations
    def _run(self, method_name: str, args: tuple):
        spec = comm.METHODS[method_name]
        if spec.backend and spec.backend.startswith("*"):
            return self._pairs(spec.backend[1:], args)
        return self._observe(method_name, args)

    def _pairs(self, single: str, args: tuple):
        """A coalesced method: one observed operation per (output, input) pair, one handle for all."""
        outputs, inputs, opts = args[0], args[1], args[2] if len(args) > 2 else None
        works = [self._observe(single, (out, inp, opts) if opts is not None else (out, inp))
                 for out, inp in zip(outputs, inputs)]
        return _AllWork(works)

    def _observe(self, method_name: str, args: tuple):
        reporter = _REPORTER
        if reporter is not None:
            reporter.restore()
        method = comm.METHODS[method_name]
        named = dict(zip(method.params, args))
        opts = named.get("opts")
        root = getattr(opts, "rootRank", None) if method.op in ("broadcast", "reduce", "gather", "scatter") else None
        sends = comm.sends_on(method, self._rank, root)
        receives = comm.receives_on(method, self._rank, root)
        student_in = _tensors(named.get(method.sends)) if method.sends else []
        student_out = _tensors(named.get(method.receives)) if method.receives else []
        real = self._real_for(student_in + student_out)
        with _Guard():
            private_in = [_contig(_clone(_detach(t))) for t in student_in]
            if method.in_place:
                private_out = private_in
            else:
                private_out = [_contig(_empty_like(_detach(t))) for t in student_out]
        call = {"method": method_name, "op": method.op, "group": self._ranks(), "rank": self._rank,
                "root": root, "reduce": _reduce_name(opts), "peer": named.get("peer"), "tag": named.get("tag"),
                "sends": sends, "receives": receives, **_student_frame(),
                "splits": [named.get("output_splits"), named.get("input_splits")] if "input_splits" in named else None,
                "out_shapes": [list(t.shape) for t in student_out]}
        seed = reporter.enter(call, private_in if sends else [], student_out) if reporter is not None else None
        seq = call.get("seq", -1)
        if seed is not None and sends:
            with _Guard():
                self._perturb(private_in, seed)
        work = ObservedWork(seq, self._timeout)
        work.method = method_name
        new_args = list(args)
        flat = method.backend in ("_allgather_base", "_reduce_scatter_base")  # the "stack" forms, flattened
        for param, role in ((method.sends, private_in), (method.receives, private_out)):
            if param is not None and (param != method.sends or role is private_in):
                index = method.params.index(param)
                new_args[index] = _rebuild(args[index], [t.view(-1) for t in role] if flat else list(role))
        started = time.perf_counter()
        try:
            before = self._seq() if real is self._cpu else None
            inner = getattr(real, method.backend or method_name)(*new_args)
            if before is not None:   # gloo numbers its operations as they are enqueued (one call may be several)
                self._issued += self._seq() - before
        except BaseException as err:
            self._complete(work, receives, student_out, private_out, err, None, started, reporter)
            raise
        self._watch(inner, work, receives, student_out, private_out, started, reporter)
        return work

    def _seq(self) -> int:
        return int(self._cpu._get_sequence_number_for_group())

    def _real_for(self, tensors: list):
        if self._cuda is not None and any(t.is_cuda for t in tensors):
            return self._cuda
        return self._cpu

    @staticmethod
    def _perturb(private_in: list, seed: int) -> None:
        for k, t in enumerate(private_in):
            if perturbable(t):
                d = deltas(seed + k, t.numel(), t.dtype)
                if d is not None:
                    _add_(t.view(-1), d.to(device=t.device, dtype=t.dtype))

    def _watch(self, inner, work, receives, student_out, private_out, started, reporter) -> None:
        """Complete `work` when `inner` completes: through its future when the backend has one (the
        callback runs in the backend's thread as the data lands), else in a watcher thread."""
        anysource = work.method == "recv_anysource"

        def finish(error=None):
            source = None
            if anysource:
                try:
                    source = int(inner._source_rank())
                except Exception:  # noqa: BLE001
                    source = None
            self._complete(work, receives, student_out, private_out, error, source, started, reporter)

        future = None
        if not any(t.is_cuda for t in private_out):
            try:
                future = inner.get_future()
            except RuntimeError:
                future = None
        if future is not None:
            def callback(fut):
                try:
                    fut.value()
                    finish()
                except BaseException as err:  # noqa: BLE001  (the operation's own error)
                    finish(err)
            future.add_done_callback(callback)
            return

        device = next((t.device for t in private_out if t.is_cuda), None)

        def watcher():
            try:
                if device is not None:           # the current device is per thread: this rank's GPU, not GPU 0
                    torch.cuda.set_device(device)
                inner.wait()
                if device is not None:
                    torch.cuda.synchronize(device)
                finish()
            except BaseException as err:  # noqa: BLE001
                finish(err)
        threading.Thread(target=watcher, name="grader-watch", daemon=True).start()

    @staticmethod
    def _complete(work, receives, student_out, private_out, error, source, started, reporter) -> None:
        ms = (time.perf_counter() - started) * 1000
        if reporter is not None:
            try:
                reporter.complete(work.seq, error is None, private_out if receives and error is None else [],
                                  None if error is None else f"{type(error).__name__}: {error}"[:500], source, ms)
            except BaseException:  # noqa: BLE001  (the supervisor is gone: the run is over anyway)
                pass
        if error is None and receives:
            def delivery():
                with _Guard():
                    for dst, src in zip(student_out, private_out):
                        if dst is src:
                            continue
                        if dst.is_inference():   # written as the network would, whichever thread delivers
                            with torch.inference_mode():
                                _copy_(dst, src)
                        else:
                            _copy_(dst, src)
            work._landed(delivery)
        work._finish(list(student_out), error, source)


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
        # arguments not given are left out, so the real backend applies its own defaults
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


_GROUPS: list = []   # every observed group of this process


def unobserved() -> int:
    """Operations the real gloo groups ran that did not come through this wrapper: student code that
    reached past the observed layer to the group inside it (gloo numbers every operation it runs)."""
    count = 0
    for group in _GROUPS:
        try:
            count += max(0, int(group._cpu._get_sequence_number_for_group()) - group._issued)
        except Exception:  # noqa: BLE001  (a group being destroyed)
            continue
    return count


def install(reporter: Reporter | None, cuda: bool = False) -> None:
    """Register the backend (once per process) and set who hears about each operation."""
    global _REPORTER, _CUDA
    _REPORTER, _CUDA = reporter, cuda
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, GraderProcessGroup, devices=["cpu", "cuda"])
