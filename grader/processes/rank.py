"""Inside one rank process: run the student's entry function and report its answers, as plain data.

The zygote imports this module (and torch) once; each rank is a fork of it. A rank:
  1. reads its spec (the first frame on its one socket to the grader, channel.py);
  2. joins the run's process group: in a graded run the switch's (backend.py, over an in-process store: no
     network, no store another rank could reach); in a real-backend run plain gloo (or NCCL) over the run's
     TCP store, its calls timed (real.py); in a bench run, bench_rank.py;
  3. writes the submission's extra files (a notebook's %%writefile cells) into its working folder, and
     loads the submission's definitions only (definitions.definitions_only), never its launch calls;
  4. calls the exercise's entry function;
  5. reports the quantities the exercise names: returned, or the entry function's final locals.

Nothing here judges and nothing here is trusted: the switch measured every byte that crossed between ranks,
and the supervisor judges these answers against it. Tensor reads run with torch-function and dispatch modes
disabled, on methods taken from torch._C.TensorBase at import, so patching torch, builtins or Tensor
methods from the submission changes nothing here.
"""
from __future__ import annotations

import ast
import builtins
import linecache
import marshal
import os
import sys
import types
from datetime import timedelta

import torch
import torch.distributed as dist

from ..submission import compiled, static
from . import backend, bench_rank, hooks, real, values
from .channel import Channel

_TB = torch._C.TensorBase
_read = os.read
_getline = linecache.getline   # as imported: a submission may replace linecache.getline
_BUILTINS = dict(builtins.__dict__)  # as the zygote imported them, before any student code


def _restore_builtins() -> None:
    """Undo a submission's patches of builtins (isinstance, len ...) before grader code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


class RankLink(backend.Link):
    """What the backend needs of this rank: its channel, the student's files, snapshots of the entry's locals."""

    def __init__(self, spec: dict, channel: Channel):
        self.spec, self.channel = spec, channel
        self.filename = spec["filename"]
        self.filenames = {spec["filename"]}
        self.budget = values.Budget()                          # the answers'
        self.snap_budget = values.Budget(values.SNAPSHOT_BYTES)  # the snapshots': never the answers'
        self.names = set(spec.get("quantities") or ())
        self.entry_codes: set = set()
        self.snapped: dict[str, tuple] = {}

    def restore(self) -> None:
        _restore_builtins()

    def snapshot(self) -> None:
        """The tensors the entry function holds under a quantity's name as it enters an operation: a rank
        left waiting there (another rank failed) is judged on them. Only tensors that changed since the last
        snapshot, within a budget of their own (a warm-up buffer rewritten before every operation must not
        use up what the final answers need)."""
        frame = sys._getframe(2)
        while frame is not None and not _is_entry(frame.f_code, self.entry_codes):
            frame = frame.f_back
        if frame is None:
            return
        changed, blobs = {}, []
        for name, value in list(frame.f_locals.items()):
            if name in self.names and isinstance(value, _TB):
                try:
                    version = value._version
                except RuntimeError:   # an inference tensor keeps no version counter
                    version = -1
                key = (id(value), version)
                if self.snapped.get(name) != key:
                    self.snapped[name] = key
                    changed[name] = values.describe(value, self.snap_budget, blobs)
        if changed:
            self.channel.send({"t": "snap", "locals": changed}, blobs)

    def check_failed(self, line: int | None) -> None:
        """One of the student's own checks failed (a perturbed run goes on): the entry function's quantities as
        they stand now, which a clean run that stopped here would have been judged on."""
        frame = sys._getframe(1)   # the grader's frames below the student's are no entry function's
        while frame is not None and not _is_entry(frame.f_code, self.entry_codes):
            frame = frame.f_back
        found, blobs = {}, []
        if frame is not None:
            for name, value in list(frame.f_locals.items()):
                if name in self.names:
                    found[name] = values.describe(value, self.snap_budget, blobs)
        self.channel.send({"t": "check", "line": line, "locals": found}, blobs)


def _file(filename: str) -> dict:
    """A frame's file when it is one a notebook cell wrote (as the notebook names it), not the submission."""
    if hooks.LINK is None or filename == hooks.LINK.filename:
        return {}
    return {"file": os.path.relpath(filename, os.getcwd())}


def _error_record(err: BaseException, filenames) -> dict:
    frames = []
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in filenames:
            frames.append({"line": tb.tb_lineno, "function": code.co_name,
                           "text": _getline(code.co_filename, tb.tb_lineno).strip()[:200],
                           **_file(code.co_filename)})
        tb = tb.tb_next
    try:
        message = str(err)[:2000]
    except BaseException:  # noqa: BLE001  (a student exception whose __str__ raises)
        message = "?"
    return {"type": type(err).__name__[:100], "message": message, "frames": frames[-8:]}


def _write_files(spec: dict) -> None:
    """A notebook's %%writefile cells, as Jupyter writes them: into the working folder, importable."""
    for name, text in (spec.get("files") or {}).items():
        path = os.path.join(os.getcwd(), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    if spec.get("files") and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _load_submission(spec: dict) -> types.ModuleType:
    filename, source = spec["filename"], spec["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType("submission")
    module.__file__ = filename
    sys.modules["submission"] = module
    record = spec.get("checks") == "record"
    code = spec.get("_code")
    if isinstance(code, bytes) and spec.get("code_magic") == compiled.MAGIC:
        code = marshal.loads(code)   # compiled by the supervisor (submission/compiled.py)
    else:
        code = compiled.rank_code(source, filename, record)
    _run_top_level(module, code, record)
    return module


def _run_top_level(module: types.ModuleType, code, record: bool) -> None:
    """Execute a module's definitions; `record`: its checks recorded (below), the hook put back afterwards,
    whatever the top level did to it."""
    if record:
        _record_checks(module)
    exec(code, module.__dict__)
    if record:
        module.__dict__[compiled.CHECK_HOOK] = _check_failed


# -- the student's own checks -----------------------------------------------------------------------
# A perturbed run's data fails the student's own checks of the expected values by design (an assert of the
# average they computed, torch.testing.assert_close of a shard). There they are recorded, with the entry
# function's quantities as they stand at the check, and the code goes on: the supervisor proves those values
# too (a clean run would have stopped there with them). Every other run raises as Python does.

def _record_checks(module: types.ModuleType) -> None:
    """In a perturbed run: the module's recorded asserts (compiled.RecordChecks) and torch.testing's
    assert_close record a failure instead of raising."""
    module.__dict__[compiled.CHECK_HOOK] = _check_failed
    for name in ("assert_close", "assert_allclose"):
        original = getattr(torch.testing, name, None)
        if original is not None and not getattr(original, "_records", False):
            setattr(torch.testing, name, _recording(original))


def _check_failed(line=None, message=None) -> None:
    if hooks.LINK is None:   # the module's top level, before the run's group: a check there raises, as Python's does
        raise AssertionError(message) if message is not None else AssertionError
    hooks.LINK.check_failed(line if type(line) is int else None)


def _recording(check):
    """torch.testing.assert_close in a perturbed run: a failure is recorded, not raised."""
    def recorded(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except AssertionError:
            frame = sys._getframe(1)
            _check_failed(frame.f_lineno if frame.f_code.co_filename in real.FILENAMES else None)
    recorded._records = True
    recorded.__wrapped__ = check
    return recorded


def _entry(module: types.ModuleType, spec: dict):
    """The entry function: the submission's own, or the one a notebook cell wrote into a file
    (static.entry_origin: the notebook imports it, at the top or in the function it spawns, or runs the file
    as a script: `!python dist_worker.py`). A written file the submission has not imported is loaded as the
    submission is, its definitions only: its launch code (`if __name__ == "__main__":`) never runs here."""
    entry = getattr(module, spec["entry"], None)
    if entry is None and spec.get("files"):
        origin = static.entry_origin(ast.parse(spec["source"]), spec["entry"], spec["files"])
        if origin is not None:
            name, path = origin[0][:-3].replace("/", "."), os.path.join(os.getcwd(), origin[0])
            written = sys.modules.get(name)
            if getattr(written, "__file__", None) != path:
                written = _load_written(path, name, spec)
            entry = getattr(written, origin[1], None)
    if entry is None:
        raise AttributeError(f"module 'submission' has no attribute '{spec['entry']}'")
    return entry


def _load_written(path: str, name: str, spec: dict) -> types.ModuleType:
    """A file a notebook cell wrote (_write_files), as a module of its definitions only."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    record = spec.get("checks") == "record" and compiled.recorded(source, path)   # this file's own handlers
    _run_top_level(module, compiled.rank_code(source, path, record), record)
    return module


def _is_entry(code, codes) -> bool:
    """Whether `code` is one of the entry function's: by identity, never by hash (a code object dynamo made for a
    compiled function's resumption holds a dict among its constants, and hashing it raises TypeError)."""
    return any(code is entry for entry in codes)


def _entry_codes(entry, name: str, filenames) -> set:
    """The code objects whose locals are the entry function's: the student's own function, also when it
    is decorated (through `__wrapped__`, or a function of that name defined in the submission), or, failing
    those, the student's function the entry name is bound to (what a factory returned)."""
    codes = set()
    seen = 0
    fn = entry
    while fn is not None and seen < 32:
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename in filenames and code.co_name == name:
            codes.add(code)
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    if not codes:  # a decorator without functools.wraps: find the student's def by name in the closures
        stack = [getattr(entry, "__code__", None)]
        while stack:
            code = stack.pop()
            if code is None:
                continue
            if code.co_name == name and code.co_filename in filenames:
                codes.add(code)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        for cell in getattr(entry, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:
                continue
            code = getattr(inner, "__code__", None)
            if code is not None and code.co_name == name and code.co_filename in filenames:
                codes.add(code)
    code = getattr(entry, "__code__", None)
    if not codes and code is not None and code.co_filename in filenames:
        codes.add(code)   # a factory's function of another name (`run_worker = make_worker()`, `def worker`)
    return codes


def _quantities(returned, final_locals: dict, names: list[str], budget, blobs: list) -> tuple[dict, str]:
    """Each named quantity as plain data, and where they came from: "return" when what the entry function
    returned gave at least one of them, else "locals" (values.unpack_returned's rule)."""
    chosen, sources = values.select(returned, final_locals, names)
    out = {name: None if chosen[name] is None else values.describe(chosen[name], budget, blobs) for name in names}
    return out, "return" if "return" in sources.values() else "locals"


def _join(spec: dict, channel: Channel) -> None:
    """The run's process group, before any student code."""
    rank, world_size = spec["rank"], spec["world_size"]
    timeout = timedelta(seconds=spec["timeout"])
    if spec["mode"] == "real":
        store = real.make_store(spec, world_size)
        hooks.ORIGINALS["init_process_group"](backend="cpu:gloo,cuda:nccl" if spec["backend"] == "nccl" else "gloo",
                                              store=store, rank=rank, world_size=world_size, timeout=timeout)
        if spec["backend"] == "nccl":
            torch.cuda.set_device(rank)
        # No student code before every rank has connected: a rank that exits at once (os._exit) would
        # otherwise break a slower rank's handshake, and that would look like the grader's failure.
        store.set(f"connected/{rank}", "1")
        store.wait([f"connected/{r}" for r in range(world_size)], timeout)
        hooks.LINK = RankLink(spec, channel)
        real.install(channel)
        real.SNAPSHOT[:] = [hooks.LINK.snapshot]
        return
    hooks.LINK = RankLink(spec, channel)
    backend.install(hooks.LINK)
    hooks.ORIGINALS["init_process_group"](backend=backend.NAME, store=dist.HashStore(), rank=rank,
                                          world_size=world_size, timeout=timeout)


def run(spec: dict, channel: Channel) -> None:
    """Everything a rank does after its sandbox is in place."""
    if spec.get("mode") == "bench":   # timing, not grading: a plain gloo group
        return bench_rank.run(spec, channel, _load_submission, hooks.ORIGINALS["init_process_group"])
    funcol = sys.modules.get("torch.distributed._functional_collectives")
    if funcol is not None:   # torch's own classes, before any student code can replace them
        values.ASYNC_TENSOR[:] = [funcol.AsyncCollectiveTensor, funcol.wait_tensor]
    # A graded rank loads the submission before it joins the run's group, as a process started by mp.spawn
    # imports it before run_worker calls init_process_group: what its top level would communicate fails here
    # as it does there (a decorator, a default value, a table's entry that all-reduces at import). A
    # real-backend rank joins gloo first: a rank that exited while loading would break another's handshake.
    graded = spec["mode"] == "switch"
    if not graded:
        _join(spec, channel)
    hooks.CHANNEL = channel
    channel.send({"t": "ready", "ring": channel.ring is not None})   # the supervisor may write to its ring
    filenames = {spec["filename"], *(os.path.join(os.getcwd(), n) for n in spec.get("files") or {})}
    real.FILENAMES.update(filenames)
    entry_name = spec["entry"]
    try:
        _write_files(spec)
        module = _load_submission(spec)
        entry = _entry(module, spec)
        if not callable(entry):
            raise TypeError(f"{entry_name} is not a function")
    except BaseException as err:  # noqa: BLE001
        _restore_builtins()
        channel.send({"t": "result", "how": "load_error", "error": _error_record(err, filenames)})
        return
    _restore_builtins()
    if graded:
        try:
            _join(spec, channel)
        except BaseException as err:  # noqa: BLE001  (the top level that just ran broke the group's set-up)
            _restore_builtins()
            channel.send({"t": "result", "how": "load_error", "error": _error_record(err, filenames)})
            return
    if hooks.LINK is not None:
        hooks.LINK.filenames = filenames
    try:
        codes = _entry_codes(entry, entry_name, filenames)
    except BaseException:  # noqa: BLE001  (an entry object whose attributes raise: its locals are not read)
        codes = set()
    if hooks.LINK is not None:
        hooks.LINK.entry_codes = codes
    captured: dict = {}

    def profile(frame, event, arg):
        # The entry function's own frame, held from its first event: a frame object keeps its locals once the
        # function has returned (or raised), so the hook goes at once instead of running for every call and
        # return the student's code makes (torch's Python included: 5-8% of the CPU that grading the
        # dist_primitives fixtures takes).
        if event == "call" and _is_entry(frame.f_code, codes):
            captured["frame"] = frame
            sys.setprofile(None)

    how, returned, error = "return", None, None
    sys.setprofile(profile)
    try:
        returned = entry(spec["rank"], spec["world_size"])
    except SystemExit as err:
        how, error = "exit", {"type": "SystemExit", "message": str(err.code)[:200], "frames": []}
    except BaseException as err:  # noqa: BLE001
        how, error = "raise", _error_record(err, filenames)
    finally:
        sys.setprofile(None)
        _restore_builtins()
    names = list(spec["quantities"])
    blobs: list = []
    budget = hooks.LINK.budget if hooks.LINK is not None else values.Budget()
    try:
        final_locals = dict(captured["frame"].f_locals) if "frame" in captured else {}
    except BaseException:  # noqa: BLE001  (a frame the student's code cleared: no locals)
        final_locals = {}
    try:
        found, source = _quantities(returned if how == "return" else None, final_locals, names, budget, blobs)
    except BaseException as err:  # noqa: BLE001  (an odd returned object: the student's, never the grader's)
        found, source, blobs = {n: values.unreadable(err) for n in names}, "return", []
    channel.send({"t": "result", "how": how, "error": error, "values": found, "source": source,
                  "returned_type": values.type_name(returned)}, blobs)


def rank_main(channel_fd: int) -> None:
    """Entry of a rank process (already sandboxed). Never returns."""
    code, header = 0, {}
    channel = Channel(channel_fd)
    if not os.environ.get("OMP_NUM_THREADS"):
        # One intra-op thread per rank, as torchrun sets for several processes on one machine: the ranks'
        # thread pools would otherwise fight over the cores (an elementwise op on 64K elements then takes
        # 10-30 ms instead of 20 us, with 2 cores and 2 ranks or more).
        torch.set_num_threads(1)
    try:
        header, blobs = channel.recv(first=True)
        if isinstance(header.get("code"), int) and 0 <= header["code"] < len(blobs):
            header["_code"] = bytes(blobs[header["code"]])   # the submission, compiled by the supervisor
        if header.get("t") != "spec":
            raise RuntimeError("no spec")
        run(header, channel)
    except BaseException as err:  # noqa: BLE001  (the grader's own failure (setup), reported as such)
        if isinstance(err, MemoryError) or "can't start new thread" in str(err):
            channel.out_of_memory()   # the rank's memory limit, not the grader's fault
        try:
            channel.send({"t": "setup_error", "error": f"{type(err).__name__}: {err}"[:2000]})
        except BaseException:  # noqa: BLE001
            pass
        code = 70
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    try:
        channel.send({"t": "end"})
        if header.get("mode") != "switch":   # hold a real group up until the supervisor is done with this run
            while _read(channel.sock.fileno(), 1):
                pass
    except BaseException:  # noqa: BLE001
        pass
    os._exit(code)
