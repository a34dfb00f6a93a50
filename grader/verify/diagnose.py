"""Name the cause of a failure in the student's terms, from what the ranks reported.

Each function reads plain observations (a tensor description, a rank's call log, a run's stop) and
returns catalog keys with their values (model.Note). verify.py decides pass or fail; this module only
explains. Keys are documented in messages.py.
"""
from __future__ import annotations

import ast
import functools
import signal

from ..submission import static
from ..checks import FEATURE_NUMEL, GRADIENT_NUMEL, expected_gradient
from ..model import Note, Outcome
from ..processes.runner import RankRecord, RunOutcome

FLOAT_DTYPES = {"torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"}


def close(a: float, b: float, dtype: str) -> bool:
    if dtype in ("torch.float16", "torch.bfloat16"):
        return abs(a - b) <= 2e-2 + 1e-2 * abs(b)
    return abs(a - b) <= 1e-6 + 1e-5 * abs(b)


def all_close(values: list, expected: list, dtype: str) -> bool:
    return len(values) == len(expected) and all(close(float(v), e, dtype) for v, e in zip(values, expected))


def preview(values: list | None, runs: int = 4) -> str:
    """The first values, run-length encoded: `[1.5 x1024]`, `[0 x128, 1 x128]`, `[3, 1, 2, ...]`."""
    if not values:
        return "[]"
    groups: list[list] = []
    for v in values:
        v = float(v)
        if groups and groups[-1][0] == v:
            groups[-1][1] += 1
        else:
            if len(groups) == runs:
                groups.append(None)
                break
            groups.append([v, 1])
    shown = ", ".join("..." if g is None else (f"{g[0]:g} x{g[1]}" if g[1] > 1 else f"{g[0]:g}") for g in groups)
    return f"[{shown}]"


def _calls(record: RankRecord, op: str) -> list[dict]:
    return [c for c in record.calls if c.get("t") == "enter" and c.get("op") == op]


# ------------------------------------------------------------------------------------------------
# Why a rank stopped

def rank_failure(run: RunOutcome, record: RankRecord) -> tuple[Outcome, Note] | None:
    """The reason this rank did not finish run_worker normally, or None if it did."""
    r = record.rank
    result = record.result
    if result is not None:
        how = result.get("how")
        error = result.get("error") or {}
        if how == "load_error":
            return Outcome.LOAD_ERROR, Note("fail.load_error", {"rank": r, **_error_params(error)})
        if how == "exit":
            return Outcome.EARLY_EXIT, Note("fail.sys_exit", {"rank": r, "code": error.get("message", "")})
        if how == "raise":
            kind = error.get("type", "")
            message = error.get("message", "")
            inside = _failed_collective(record)
            if inside is not None and "Timed out" in (inside.get("error") or ""):
                # the collective's own timeout fired first: a rank waited for others that never came
                return Outcome.TIMEOUT, Note("fail.timeout_inside", {"rank": r, "op": inside["op"], "n": int(inside["n"]) + 1})
            if kind == "NotImplementedError":
                return Outcome.TODO, Note("fail.todo", {"rank": r})
            if kind == "MemoryError" or "can't allocate memory" in message or "Cannot allocate memory" in message:
                return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
            if kind == "BlockingIOError" or "Resource temporarily unavailable" in message:
                return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
            return Outcome.EXCEPTION, Note("fail.exception", {"rank": r, **_error_params(error)})
        return None
    if run.stop == "output_limit" and run.stop_rank == r:
        return Outcome.OUTPUT_LIMIT, Note("fail.output", {"rank": r})
    exit_info = record.exit or {}
    sig = exit_info.get("signal")
    if sig == signal.SIGKILL and run.oom_killed:
        return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
    if sig is not None and not (sig == signal.SIGKILL and run.stop != "completed"):
        if sig == signal.SIGXCPU:
            return Outcome.CPU_LIMIT, Note("fail.cpu", {"rank": r})
        if sig == signal.SIGXFSZ:
            return Outcome.FILE_LIMIT, Note("fail.file_size", {"rank": r})
        text = record.output_text()
        if sig in (signal.SIGABRT, signal.SIGSEGV) and ("bad_alloc" in text or "allocate" in text):
            return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
        return Outcome.CRASH, Note("fail.signal", {"rank": r, "signal": sig, "name": _signal_name(sig)})
    if "code" in exit_info:
        return Outcome.EARLY_EXIT, Note("fail.os_exit", {"rank": r, "code": exit_info["code"]})
    if run.stop == "timeout":
        if run.process_limit_hit:
            return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
        return Outcome.TIMEOUT, _where(record, "fail.timeout")
    if run.stop == "deadlock":
        return Outcome.DEADLOCK, _where(record, "fail.deadlock")
    if run.stop in ("failfast", "output_limit"):
        return Outcome.EXCEPTION, Note("fail.stopped", {"rank": r, "other": run.stop_rank})
    return Outcome.GRADER_ERROR, Note("fail.grader", {"rank": r})


def _failed_collective(record: RankRecord) -> dict | None:
    """The exit event of the collective the rank's exception came out of, if it came out of one."""
    last = record.calls[-1] if record.calls else None
    if last is not None and last.get("t") == "exit" and not last.get("ok"):
        return last
    return None


def last_collective(record: RankRecord, failure: Note) -> list[Note]:
    """Where a rank was in its collectives when it failed (timeouts and deadlocks say it already)."""
    if failure.key.startswith(("fail.timeout", "fail.deadlock", "fail.stopped", "fail.grader")):
        return []
    enters = [c for c in record.calls if c.get("t") == "enter"]
    if not enters:
        return [Note("detail.no_collective", {"rank": record.rank})]
    last = enters[-1]
    return [Note("detail.last_collective", {"rank": record.rank, "op": last.get("op"), "n": int(last.get("n", 0)) + 1})]


def _where(record: RankRecord, key: str) -> Note:
    if record.inside is not None:
        return Note(key + "_inside", {"rank": record.rank, "op": record.inside.get("op"),
                                      "n": int(record.inside.get("n", 0)) + 1})
    return Note(key + "_outside", {"rank": record.rank})


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _error_params(error: dict) -> dict:
    frames = error.get("frames") or []
    where = "; ".join(f"line {f['line']} in {f['function']}: {f['text']}" for f in frames[-3:])
    return {"type": error.get("type", "?"), "message": (error.get("message") or "")[:300],
            "where": where or "-"}


# ------------------------------------------------------------------------------------------------
# Why a value is wrong

def wrong_gradient(desc: dict, ws: int, record: RankRecord) -> list[Note]:
    values = desc.get("values") or []
    dtype = desc.get("dtype", "")
    expected = expected_gradient(ws)
    notes = []
    if dtype not in FLOAT_DTYPES:
        if _is_integer(dtype):
            notes.append(Note("cause.integer_dtype", {"dtype": dtype}))  # the values say nothing more
    elif values and all(close(float(v), expected * ws, dtype) for v in values):
        notes.append(Note("cause.summed_not_averaged", {"ws": ws}))
    elif values and all(close(float(v), record.rank + 1, dtype) for v in values):
        if not _failed_inside(record, "all_reduce"):  # a collective that raised leaves the input as it was
            notes.append(Note("cause.unchanged", {"op": "all_reduce"}))
    elif values and _looks_hardcoded(values, ws, dtype):
        notes.append(Note("cause.hardcoded_ws", {}))
    if _calls(record, "reduce") and not _calls(record, "all_reduce"):
        notes.append(Note("cause.reduce_not_all_reduce", {}))
    return notes


def _is_integer(dtype: str | None) -> bool:
    return bool(dtype) and dtype.startswith(("torch.int", "torch.uint"))


def _looks_hardcoded(values: list, ws: int, dtype: str) -> bool:
    total = sum(range(1, ws + 1))
    return any(all(close(float(v), total / k, dtype) for v in values) for k in range(1, 9) if k != ws)


def wrong_feature(desc: dict, ws: int, record: RankRecord) -> list[Note]:
    notes = []
    shape = desc.get("shape") or []
    if _is_integer(desc.get("dtype")):
        notes.append(Note("cause.feature_integer_dtype", {"dtype": desc.get("dtype")}))
    if shape == [ws, FEATURE_NUMEL]:
        notes.append(Note("cause.stack_not_cat", {"shape": shape}))
    notes += gather_list_causes(record, ws)
    values = desc.get("values") or []
    if values and len(values) == ws * FEATURE_NUMEL and all(float(v) == float(ws - 1) for v in values) and ws > 1:
        if not any(n.key == "cause.shared_buffers" for n in notes):
            notes.append(Note("cause.shared_buffers", {}))
    return notes


def gather_list_causes(record: RankRecord, ws: int) -> list[Note]:
    """What the all_gather calls of a rank got wrong about their output list (from the call log)."""
    notes = []
    for call in _calls(record, "all_gather"):
        out = (call.get("args") or {}).get("tensor_list") or {}
        if out.get("len") is not None and out["len"] != ws:
            notes.append(Note("cause.gather_list_size", {"got": out["len"]}))
        elif out.get("distinct") is not None and out["distinct"] < out.get("len", 0):
            notes.append(Note("cause.shared_buffers", {}))
    return notes


def call_causes(record: RankRecord, family: str, ws: int) -> list[Note]:
    """Mistakes the call log shows whatever became of the value (it may never have been returned)."""
    if family == "all_gather":
        return gather_list_causes(record, ws)
    notes = []
    for call in _calls(record, "all_reduce"):
        dtype = ((call.get("args") or {}).get("tensor") or {}).get("dtype")
        if _is_integer(dtype):
            notes.append(Note("cause.integer_dtype", {"dtype": dtype}))
            break
    if _calls(record, "reduce") and not _calls(record, "all_reduce"):
        notes.append(Note("cause.reduce_not_all_reduce", {}))
    return notes


def _failed_inside(record: RankRecord, op: str) -> bool:
    return any(c.get("t") == "exit" and c.get("op") == op and not c.get("ok") for c in record.calls)


def _signature(call: dict) -> str:
    """A collective as the ranks must agree on it: its name and the sizes it moves."""
    args = call.get("args") or {}
    sizes = [str(a["numel"]) if "numel" in a else f"{a['len']}x" for a in args.values()
             if isinstance(a, dict) and ("numel" in a or "len" in a)]
    return f"{call['op']}({', '.join(sizes)})" if sizes else call["op"]


def _own_fault_outside(run: RunOutcome, record: RankRecord) -> bool:
    """The rank stopped for a reason of its own away from any collective (an exception, an exit, a loop)."""
    result = record.result
    if result is not None and result.get("how") in ("raise", "exit", "load_error"):
        return _failed_collective(record) is None
    return result is None and record.inside is None and run.stop == "timeout"


def mismatched_calls(run: RunOutcome) -> Note | None:
    """Ranks that called different collectives, or in a different order or size (gloo may pair them
    silently, hang, or abort). Not said when a rank stopped on its own mistake outside the collectives:
    then the other ranks' extra calls are a consequence, not the cause."""
    sequences = [tuple(_signature(c) for c in rec.calls if c.get("t") == "enter") for rec in run.ranks]
    if len(set(sequences)) <= 1:
        return None
    if any(_own_fault_outside(run, rec) for rec in run.ranks):
        return None
    listing = "; ".join(f"rank {rec.rank}: {', '.join(seq) or '-'}" for rec, seq in zip(run.ranks, sequences))
    return Note("cause.mismatch", {"calls": listing})


def async_without_wait(record: RankRecord, family: str | None = None) -> bool:
    """An async_op=True collective (of this family) whose wait() was never called."""
    entered = {(c["op"], c["n"]) for c in record.calls if c.get("t") == "enter" and (c.get("args") or {}).get("async_op")
               and (family is None or c["op"] in FAMILY_OPS[family])}
    left = {(c["op"], c["n"]) for c in record.calls if c.get("t") == "exit"}
    return bool(entered - left)


FAMILY_OPS = {"all_reduce": ("all_reduce", "reduce"), "all_gather": ("all_gather", "all_gather_into_tensor", "_all_gather_base")}
EXPECTED_SHAPES = {"gradient": lambda ws: [GRADIENT_NUMEL], "full_feature": lambda ws: [ws * FEATURE_NUMEL]}


@functools.lru_cache(maxsize=8)
def _assigned(source: str) -> dict:
    try:
        return static.assigned_results(ast.parse(source))
    except (SyntaxError, ValueError):
        return {}


def assigned_result(source: str, family: str) -> list[int]:
    """Lines where the submission assigns what this collective returns (None, unless async_op=True)."""
    return _assigned(source or "").get(family, [])
