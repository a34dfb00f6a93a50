"""Inside one rank process: run the student's `run_worker` and report what happened as plain data.

The zygote imports this module (and torch) once; each rank is a fork of it. A rank:
  1. reads its spec (one JSON line) from its control pipe;
  2. joins the grader's process group (a fresh store per run: see runner.py);
  3. loads the submission's definitions only (static.definitions_only), never its launch calls;
  4. calls run_worker(rank, world_size) while hooks on the collectives log each call, its timing and
     tensors, and (in a perturbed run) add to what it sends the deltas the supervisor answers for that
     call (the seeds never enter the rank), then log what the call produced;
  5. sends the returned values, or run_worker's final locals, as JSON lists of numbers, then waits.

Nothing here judges: the supervisor does, in another process, from this plain data. Every torch
method used on student tensors is taken from torch._C.TensorBase at import, before student code runs,
so patching torch.Tensor or builtins from the submission changes nothing here.
"""
from __future__ import annotations

import ast
import builtins
import functools
import inspect
import json
import linecache
import os
import sys
import threading
import time
import types
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..verify import perturb

from ..submission import static

_TB = torch._C.TensorBase
_dtype_of = _TB.dtype.__get__
_shape_of = _TB.shape.__get__
_device_of = _TB.device.__get__
_tolist, _detach, _cpu, _reshape = _TB.tolist, _TB.detach, _TB.cpu, _TB.reshape
_numel, _data_ptr, _add_ = _TB.numel, _TB.data_ptr, _TB.add_
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_write, _read, _perf, _getframe = os.write, os.read, time.perf_counter, sys._getframe
_dumps = json.dumps
_no_grad = torch.no_grad
_BUILTINS = dict(builtins.__dict__)  # as the zygote imported them, before any student code


def _restore_builtins() -> None:
    """Undo a submission's patches of builtins (isinstance, len ...) before grader code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


MAX_VALUES = 1 << 14      # values sent per tensor
SNAP_LIMIT = 16           # tensors per locals snapshot
OBSERVED = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce", "broadcast",
            "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
            "barrier", "send", "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list")

_STATE: _RankState | None = None  # set in the rank process only, after fork


class _Channel:
    """Newline-delimited JSON to the supervisor."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, **msg) -> None:
        data = memoryview((_dumps(msg, default=repr) + "\n").encode())
        with self.lock:
            while data:
                data = data[_write(self.fd, data):]


def describe(obj, values: bool = True) -> dict:
    """Plain-data view of a value: a tensor's type, dtype, shape and values; else just its type name."""
    kind = type(obj)
    if not issubclass(kind, _TB):
        if isinstance(obj, (list, tuple)):
            return {"kind": "sequence", "type": kind.__name__, "len": len(obj)}
        return {"kind": "other", "type": kind.__name__}
    if kind not in _PLAIN:
        return {"kind": "tensor", "plain": False, "type": kind.__name__}
    out = {"kind": "tensor", "plain": True, "type": kind.__name__, "dtype": str(_dtype_of(obj)),
           "shape": list(_shape_of(obj)), "device": str(_device_of(obj))}
    try:
        out["ptr"] = _data_ptr(obj)
        if values and _TB.is_complex(obj):
            raise TypeError("complex values")
        if values:
            flat = _reshape(_cpu(_detach(obj)), (-1,))
            n = _numel(flat)
            out["values"] = _tolist(flat[:MAX_VALUES] if n > MAX_VALUES else flat)
    except Exception as err:  # sparse, meta, complex ...: a wrong answer, not a grader failure
        out["values"] = []
        out["unreadable"] = f"{type(err).__name__}: {err}"[:200]
    return out


class _LineReader:
    """Lines from the supervisor on the control pipe: the spec, then one delta per perturbed collective."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = _read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("control pipe closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


class _TimedWork:
    """An async_op handle whose wait() reports when the collective really finished."""

    def __init__(self, work, done):
        self._work, self._done = work, done

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._done()
        return result

    def is_completed(self):
        finished = self._work.is_completed()
        if finished:
            self._done()
        return finished

    def get_future(self):
        future = self._work.get_future()
        future.add_done_callback(lambda _: self._done())
        return future

    def __getattr__(self, name):
        return getattr(self._work, name)


class _RankState:
    def __init__(self, spec: dict, channel: _Channel, control: _LineReader):
        self.spec = spec
        self.control = control
        self.rank = spec["rank"]
        self.channel = channel
        self.counts: dict[str, int] = {}
        self.perturb = set(spec.get("perturb") or ())   # collective families to perturb: all_reduce, all_gather
        self.entry_code = None
        self.cuda = spec["backend"] != "gloo"

    def next_index(self, op: str) -> int:
        k = self.counts.get(op, 0)
        self.counts[op] = k + 1
        return k

    def snapshot(self) -> None:
        """The tensors run_worker holds when it enters a collective (it may never return)."""
        frame = _getframe(2)
        while frame is not None and frame.f_code is not self.entry_code:
            frame = frame.f_back
        if frame is not None:
            self.channel.send(t="snap", locals=tensor_locals(frame.f_locals))

    def delta_reply(self, op: str, k: int) -> list | None:
        """This call's deltas, asked of the supervisor (it answers every perturbed call's "enter"): no
        secret lives in the rank process before the collective runs, so student code cannot compute
        the perturbation ahead of it."""
        reply = json.loads(self.control.readline())
        if reply.get("op") != op or reply.get("n") != k:
            raise RuntimeError("grader protocol out of step")
        return reply.get("values") or None


def _delta_tensor(values: list, tensor):
    base = torch.tensor(values, dtype=torch.float64)
    reps = -(-_numel(tensor) // len(values))
    flat = base.repeat(reps)[: _numel(tensor)]
    return flat.reshape(_shape_of(tensor)).to(dtype=_dtype_of(tensor), device=_device_of(tensor))


def tensor_locals(namespace: dict) -> dict:
    out = {}
    for name, value in list(namespace.items()):
        if issubclass(type(value), _TB) and len(out) < SNAP_LIMIT:
            try:
                out[name] = describe(value)
            except Exception:  # a tensor that cannot be read (meta, freed ...) is skipped
                pass
    return out


def _call_info(args: dict) -> dict:
    """What the log keeps of a collective's arguments: tensor dtypes and shapes, list lengths and aliasing."""
    info = {}
    for name, value in args.items():
        if issubclass(type(value), _TB) and type(value) in _PLAIN:
            info[name] = {"dtype": str(_dtype_of(value)), "shape": list(_shape_of(value)), "numel": _numel(value)}
        elif isinstance(value, (list, tuple)) and value and all(type(v) in _PLAIN for v in value):
            ptrs = [_data_ptr(v) for v in value]
            info[name] = {"len": len(value), "shapes": [list(_shape_of(v)) for v in value[:8]],
                          "dtype": str(_dtype_of(value[0])), "distinct": len(set(ptrs))}
        elif isinstance(value, (list, tuple)):
            info[name] = {"len": len(value)}
        elif isinstance(value, (int, bool)) or value is None:
            info[name] = value
        elif name == "op":
            info[name] = str(getattr(value, "name", value)).split(".")[-1]
    return info


def _wrap_collective(name: str, original):
    signature = inspect.signature(original)
    family = perturb.PERTURBED_OPS.get(name)

    @functools.wraps(original)
    def collective(*args, **kwargs):
        state = _STATE
        if state is None:
            return original(*args, **kwargs)
        _restore_builtins()
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch's own error message, from torch
        k = state.next_index(name)
        state.snapshot()  # every run: a rank that never returns is judged on what it held here
        state.channel.send(t="enter", op=name, n=k, args=_call_info(bound.arguments))
        perturbed = family is not None and family in state.perturb
        if perturbed:
            _apply_delta(state, name, k, bound)
        start = _perf()
        reported = []

        def done(ok=True):
            if reported:
                return
            reported.append(True)
            if state.cuda and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            extra = {"out": _output_values(name, bound.arguments)} if perturbed else {}
            state.channel.send(t="exit", op=name, n=k, ok=ok, ms=(_perf() - start) * 1000, **extra)

        try:
            result = original(*bound.args, **bound.kwargs)
        except BaseException as err:
            state.channel.send(t="exit", op=name, n=k, ok=False, ms=(_perf() - start) * 1000,
                               error=f"{type(err).__name__}: {err}"[:500])
            raise
        if bound.arguments.get("async_op") and result is not None:
            return _TimedWork(result, done)
        done()
        return result

    collective.__grader_original__ = original
    return collective


def _output_values(name: str, args: dict) -> list | None:
    """What a perturbed collective produced on this rank: verify.py checks the result was derived from it."""
    try:
        if name == "all_reduce":
            outputs = [args.get("tensor")]
        elif name == "all_gather":
            outputs = list(args.get("tensor_list") or [])
        else:
            outputs = [args.get("output_tensor")]
        values = []
        for out in outputs:
            if type(out) not in _PLAIN:
                return None
            values += _tolist(_reshape(_cpu(_detach(out)), (-1,)))
            if len(values) > MAX_VALUES:
                return values[:MAX_VALUES]
        return values
    except Exception:
        return None


def _apply_delta(state: _RankState, name: str, k: int, bound) -> None:
    values = state.delta_reply(name, k)
    key = {"all_reduce": "tensor", "all_gather": "tensor"}.get(name, "input_tensor")
    tensor = bound.arguments.get(key)
    if values is None or type(tensor) not in _PLAIN:
        return
    delta = _delta_tensor(values, tensor)
    with _no_grad():
        if name == "all_reduce":
            _add_(tensor, delta)                         # in place: all_reduce sends and receives in it
        else:
            bound.arguments[key] = _detach(tensor) + delta  # the student's own tensor stays as it was
    del delta, values


def _student_init_process_group(*args, **kwargs):
    """The grader owns the process group: a student's own init (fixed port and all) joins it instead."""
    if _STATE is not None:
        _STATE.channel.send(t="note", what="init_process_group")
        if dist.is_initialized():
            return None
    return _ORIGINALS["init_process_group"](*args, **kwargs)


def _student_destroy_process_group(group=None):
    if _STATE is not None and group is None:
        _STATE.channel.send(t="note", what="destroy_process_group")
        return None
    return _ORIGINALS["destroy_process_group"](group)


_ORIGINALS: dict = {}


def install_hooks() -> None:
    """Replace the collectives in torch.distributed (and c10d) by logging wrappers. Called once, in the zygote."""
    if _ORIGINALS:
        return
    for name in OBSERVED:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        _ORIGINALS[name] = original
        wrapper = _wrap_collective(name, original)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
    for name, replacement in (("init_process_group", _student_init_process_group),
                              ("destroy_process_group", _student_destroy_process_group)):
        _ORIGINALS[name] = getattr(c10d, name)
        for module in (dist, c10d):
            setattr(module, name, replacement)


# ------------------------------------------------------------------------------------------------

def _error_record(err: BaseException, filename: str) -> dict:
    frames = []
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == filename:
            frames.append({"line": tb.tb_lineno, "function": code.co_name,
                           "text": linecache.getline(filename, tb.tb_lineno).strip()})
        tb = tb.tb_next
    return {"type": type(err).__name__, "message": str(err)[:2000], "frames": frames[-8:]}


def _load_submission(spec: dict) -> types.ModuleType:
    filename, source = spec["filename"], spec["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = static.definitions_only(ast.parse(source, filename))
    module = types.ModuleType("submission")
    module.__file__ = filename
    sys.modules["submission"] = module
    exec(compile(tree, filename, "exec"), module.__dict__)
    return module


def _values_of(returned) -> dict | None:
    if isinstance(returned, dict):
        returned = (returned.get("gradient"), returned.get("full_feature"))
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        return {"gradient": describe(returned[0]), "full_feature": describe(returned[1])}
    return None


def _names_of(returned, final_locals: dict) -> dict:
    """Which locals the returned objects were bound to (for reading them when a later run raises)."""
    names = {}
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        for key, obj in zip(("gradient", "full_feature"), returned):
            for name, value in final_locals.items():
                if value is obj:
                    names[key] = name
                    break
    return names


def run(spec: dict, channel: _Channel, control: _LineReader) -> None:
    """Everything a rank does after its sandbox is in place."""
    global _STATE
    rank, world_size = spec["rank"], spec["world_size"]
    state = _STATE = _RankState(spec, channel, control)
    if state.cuda:
        torch.cuda.set_device(rank)
    backend = "cpu:gloo,cuda:nccl" if state.cuda else "gloo"
    timeout = timedelta(seconds=spec["timeout"])
    where = spec["store"]  # {"kind": "tcp", "host", "port"}: rank 0 hosts it; {"kind": "file", "path"}
    store = (dist.TCPStore(where["host"], where["port"], world_size, rank == 0, timeout, wait_for_workers=False)
             if where["kind"] == "tcp" else dist.FileStore(where["path"], world_size))
    _ORIGINALS["init_process_group"](backend=backend, store=store, rank=rank, world_size=world_size,
                                     timeout=timeout)
    # No student code before every rank has finished connecting: a rank that exits at once (os._exit)
    # would otherwise break a slower rank's handshake, and that would look like the grader's failure.
    store.set(f"connected/{rank}", "1")
    store.wait([f"connected/{r}" for r in range(world_size)], timeout)
    channel.send(t="ready")
    try:
        module = _load_submission(spec)
        entry = getattr(module, static.ENTRY)
        if not callable(entry):
            raise TypeError(f"{static.ENTRY} is not a function")
    except BaseException as err:
        _restore_builtins()
        channel.send(t="result", how="load_error", error=_error_record(err, spec["filename"]))
        return
    _restore_builtins()
    state.entry_code = getattr(entry, "__code__", None)
    captured: dict = {}

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is state.entry_code:
            captured["locals"] = dict(frame.f_locals)

    how, returned, error = "return", None, None
    sys.setprofile(profile)
    try:
        returned = entry(rank, world_size)
    except SystemExit as err:
        how, error = "exit", {"type": "SystemExit", "message": str(err.code), "frames": []}
    except BaseException as err:
        how, error = "raise", _error_record(err, spec["filename"])
    finally:
        sys.setprofile(None)
        _restore_builtins()
    final_locals = captured.get("locals", {})
    message = {"t": "result", "how": how, "error": error, "locals": tensor_locals(final_locals),
               "returned": None, "returned_type": type(returned).__name__, "names": {}}
    if how == "return":
        message["returned"] = _values_of(returned)
        message["names"] = _names_of(returned, final_locals)
    channel.send(**message)


def rank_main(spec_fd: int, result_fd: int) -> None:
    """Entry of a rank process (already sandboxed). Never returns."""
    channel = _Channel(result_fd)
    code = 0
    try:
        control = _LineReader(spec_fd)
        spec = json.loads(control.readline())
        run(spec, channel, control)
    except BaseException as err:  # the grader's own failure (setup), reported as such
        try:
            channel.send(t="setup_error", error=f"{type(err).__name__}: {err}"[:2000])
        except BaseException:
            pass
        code = 70
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        channel.send(t="done")
        while _read(spec_fd, 1):  # hold the process group up until the supervisor is done with this run
            pass
    except BaseException:
        pass
    os._exit(code)
