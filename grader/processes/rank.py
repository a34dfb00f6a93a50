"""Inside one rank process: run the student's entry function and report what happened, as plain data.

The zygote imports this module (and torch) once; each rank is a fork of it. A rank:
  1. reads its spec (one JSON line) from its control pipe;
  2. joins the grader's process group, built on the observed backend (backend.py) over a fresh store
     per run (see runner.py);
  3. loads the submission's definitions only (static.definitions_only), never its launch calls;
  4. calls the exercise's entry function, while the backend reports every operation: what this rank
     sent, and what was delivered to it (protocol.py);
  5. reports the quantities the exercise names: returned, or the entry function's final locals.

Nothing here judges: the supervisor does, in another process, from this plain data. Tensor reads run
with torch-function and dispatch modes disabled, on methods taken from torch._C.TensorBase at import,
so patching torch, builtins or Tensor methods from the submission changes nothing here.
"""
from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import sys
import threading
import types
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..submission import static
from . import backend, bench_rank, protocol

_TB = torch._C.TensorBase
_write, _read = os.write, os.read
_BUILTINS = dict(builtins.__dict__)  # as the zygote imported them, before any student code


def _restore_builtins() -> None:
    """Undo a submission's patches of builtins (isinstance, len ...) before grader code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


class _Channel:
    """Newline-delimited JSON to the supervisor (thread-safe: the backend reports from its threads)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, **msg) -> None:
        data = memoryview((json.dumps(msg, default=repr) + "\n").encode())
        with self.lock:
            while data:
                data = data[_write(self.fd, data):]


class _LineReader:
    """Lines from the supervisor on the control pipe: the spec, then one seed per perturbed operation."""

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


class RankReporter(backend.Reporter):
    """Tells the supervisor about every operation the backend runs, and the entry function's locals."""

    def __init__(self, spec: dict, channel: _Channel, control: _LineReader):
        self.spec, self.channel, self.control = spec, channel, control
        self.filename = spec["filename"]
        self.perturbed = bool(spec.get("perturb"))
        self.budget = protocol.Budget()
        self.seq = 0
        self.lock = threading.Lock()
        self.entry_codes: set = set()
        self.snapped: dict[str, tuple] = {}

    def restore(self) -> None:
        _restore_builtins()

    def enter(self, call: dict, sent: list, received: list) -> int | None:
        with self.lock:
            seq = call["seq"] = self.seq
            self.seq += 1
        self._snapshot()
        call["inputs"] = [protocol.encode(t, self.budget) for t in sent]
        call["outputs"] = [protocol.meta(t) for t in received]
        self.channel.send(t="call", **call)
        if not self.perturbed or not sent:
            return None
        reply = json.loads(self.control.readline())
        if reply.get("seq") != seq:
            raise RuntimeError("grader protocol out of step")
        seed = reply.get("seed")
        return int(seed) if isinstance(seed, int) else None

    def complete(self, seq, ok, delivered, error, source, ms) -> None:
        self.channel.send(t="complete", seq=seq, ok=ok, error=error, source=source, ms=round(ms, 4),
                          delivered=[protocol.encode(t, self.budget) for t in delivered])

    def waited(self, seq: int) -> None:
        self.channel.send(t="wait", seq=seq)

    def _snapshot(self) -> None:
        """The tensors the entry function holds as it enters an operation: a rank left waiting there
        (another rank failed) is judged on them. Only tensors that changed since the last snapshot."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code not in self.entry_codes:
            frame = frame.f_back
        if frame is None:
            return
        changed = {}
        for name, value in list(frame.f_locals.items()):
            if isinstance(value, _TB):
                try:
                    version = value._version
                except RuntimeError:   # an inference tensor keeps no version counter
                    version = -1
                key = (id(value), version)
                if self.snapped.get(name) != key:
                    self.snapped[name] = key
                    changed[name] = protocol.describe(value, self.budget)
        if changed:
            self.channel.send(t="snap", locals=changed)


_REPORTER: RankReporter | None = None


def _student_init_process_group(*args, **kwargs):
    """The grader owns the process group: a student's own init (fixed port and all) joins it instead."""
    if _REPORTER is not None:
        _REPORTER.channel.send(t="note", what="init_process_group")
        if dist.is_initialized():
            return None
    return _ORIGINALS["init_process_group"](*args, **kwargs)


def _student_destroy_process_group(group=None):
    if _REPORTER is not None and group is None:
        _REPORTER.channel.send(t="note", what="destroy_process_group")
        return None
    return _ORIGINALS["destroy_process_group"](group)


def _student_new_group(*args, **kwargs):
    """A group the student makes is made on the grader's backend, whatever backend it names ("gloo"):
    what travels through it is observed like the rest."""
    args = list(args)
    if len(args) > 2:
        args[2] = None
    kwargs.pop("backend", None)
    kwargs.pop("pg_options", None)
    return _ORIGINALS["new_group"](*args, **kwargs)


_ORIGINALS: dict = {}


def install_hooks() -> None:
    """Register the observed backend and take over init/destroy of the default group. Called once, in
    the zygote; everything a rank imports later is imported here first (ranks cannot read the checkout)."""
    backend.install(None)
    if _ORIGINALS:
        return
    for name, replacement in (("init_process_group", _student_init_process_group),
                              ("destroy_process_group", _student_destroy_process_group),
                              ("new_group", _student_new_group)):
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
                           "text": linecache.getline(filename, tb.tb_lineno).strip()[:200]})
        tb = tb.tb_next
    try:
        message = str(err)[:2000]
    except BaseException:  # noqa: BLE001  (a student exception whose __str__ raises)
        message = "?"
    return {"type": type(err).__name__[:100], "message": message, "frames": frames[-8:]}


def _load_submission(spec: dict) -> types.ModuleType:
    filename, source = spec["filename"], spec["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = static.definitions_only(ast.parse(source, filename))
    module = types.ModuleType("submission")
    module.__file__ = filename
    sys.modules["submission"] = module
    exec(compile(tree, filename, "exec"), module.__dict__)
    return module


def _entry_codes(entry, name: str, filename: str) -> set:
    """The code objects whose locals are the entry function's: the student's own function, also when it
    is decorated (through `__wrapped__`, or a function of that name defined in the submission)."""
    codes = set()
    seen = 0
    fn = entry
    while fn is not None and seen < 32:
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == filename and code.co_name == name:
            codes.add(code)
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    if not codes:  # a decorator without functools.wraps: find the student's def by name in the closures
        stack = [getattr(entry, "__code__", None)]
        while stack:
            code = stack.pop()
            if code is None:
                continue
            if code.co_name == name and code.co_filename == filename:
                codes.add(code)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        for cell in getattr(entry, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:
                continue
            code = getattr(inner, "__code__", None)
            if code is not None and code.co_name == name and code.co_filename == filename:
                codes.add(code)
    return codes


def _quantities(returned, final_locals: dict, names: list[str], budget) -> tuple[dict, str]:
    """Each named quantity as plain data, and where it came from ("return" or "locals")."""
    values = protocol.unpack_returned(returned, names)
    source = "return"
    if values is None:
        values, source = {n: final_locals.get(n) for n in names}, "locals"
    out = {}
    for name in names:
        value = values.get(name)
        out[name] = None if value is None else protocol.describe(value, budget)
    return out, source


def run(spec: dict, channel: _Channel, control: _LineReader) -> None:
    """Everything a rank does after its sandbox is in place."""
    global _REPORTER
    if str(spec.get("mode") or "").startswith("bench"):   # timing, not grading: a plain gloo group
        return bench_rank.run(spec, channel, _load_submission, _ORIGINALS["init_process_group"])
    rank, world_size = spec["rank"], spec["world_size"]
    reporter = _REPORTER = RankReporter(spec, channel, control)
    cuda = spec["backend"] != "gloo"
    if cuda:
        torch.cuda.set_device(rank)
    backend.install(reporter, cuda=cuda)
    timeout = timedelta(seconds=spec["timeout"])
    store = protocol.make_store(spec, world_size)
    _ORIGINALS["init_process_group"](backend=backend.NAME, store=store, rank=rank, world_size=world_size,
                                     timeout=timeout)
    # No student code before every rank has finished connecting: a rank that exits at once (os._exit)
    # would otherwise break a slower rank's handshake, and that would look like the grader's failure.
    store.set(f"connected/{rank}", "1")
    store.wait([f"connected/{r}" for r in range(world_size)], timeout)
    channel.send(t="ready")
    entry_name = spec["entry"]
    try:
        module = _load_submission(spec)
        entry = getattr(module, entry_name)
        if not callable(entry):
            raise TypeError(f"{entry_name} is not a function")
    except BaseException as err:  # noqa: BLE001
        _restore_builtins()
        channel.send(t="result", how="load_error", error=_error_record(err, spec["filename"]))
        return
    _restore_builtins()
    codes = reporter.entry_codes = _entry_codes(entry, entry_name, spec["filename"])
    captured: dict = {}

    def profile(frame, event, arg):
        if event == "return" and frame.f_code in codes:
            captured["locals"] = dict(frame.f_locals)

    how, returned, error = "return", None, None
    sys.setprofile(profile)
    try:
        returned = entry(rank, world_size)
    except SystemExit as err:
        how, error = "exit", {"type": "SystemExit", "message": str(err.code)[:200], "frames": []}
    except BaseException as err:  # noqa: BLE001
        how, error = "raise", _error_record(err, spec["filename"])
    finally:
        sys.setprofile(None)
        _restore_builtins()
    names = list(spec["quantities"])
    try:
        values, source = _quantities(returned if how == "return" else None, captured.get("locals", {}), names,
                                     reporter.budget)
    except BaseException as err:  # noqa: BLE001  (an odd returned object: the student's, never the grader's)
        values, source = {n: protocol.unreadable(err) for n in names}, "return"
    channel.send(t="result", how=how, error=error, values=values, source=source, unobserved=backend.unobserved(),
                 returned_type=protocol.type_name(returned))


def rank_main(spec_fd: int, result_fd: int) -> None:
    """Entry of a rank process (already sandboxed). Never returns."""
    channel = _Channel(result_fd)
    code = 0
    try:
        control = _LineReader(spec_fd)
        spec = json.loads(control.readline())
        run(spec, channel, control)
    except BaseException as err:  # noqa: BLE001  (the grader's own failure (setup), reported as such)
        try:
            channel.send(t="setup_error", error=f"{type(err).__name__}: {err}"[:2000])
        except BaseException:  # noqa: BLE001
            pass
        code = 70
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    try:
        channel.send(t="end")
        while _read(spec_fd, 1):  # hold the process group up until the supervisor is done with this run
            pass
    except BaseException:  # noqa: BLE001
        pass
    os._exit(code)
