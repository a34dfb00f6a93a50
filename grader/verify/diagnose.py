"""Name the cause of a failure in the student's terms, from what the ranks reported.

Each function reads plain observations (a reported value, a rank's operations, a run's stop) and returns
catalog keys with their values (model.Note). judge.py decides pass or fail; this module only explains.
The causes are generic: they speak of the exercise's quantities through the exercise's own labels, of
operations by the name the student called, and of the way the exercise combines the ranks' data.
"""
from __future__ import annotations

import ast
import functools
import signal

import numpy as np

from ..model import Note, Outcome
from ..switch import Call
from ..records import How, RankRecord, RunOutcome
from ..switch.ops import MISMATCH_WORDS
from .observe import Value


def close(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("torch.float16", "torch.bfloat16"):
        return np.abs(a - b) <= 2e-2 + 1e-2 * np.abs(b)
    return np.abs(a - b) <= 1e-6 + 1e-5 * np.abs(b)


def all_close(values: np.ndarray | None, expected: np.ndarray, dtype: str) -> bool:
    return values is not None and values.shape == expected.shape and bool(np.all(close(values, expected, dtype)))


def preview(values, runs: int = 4) -> str:
    """The first values, run-length encoded: `[1.5 x1024]`, `[0 x128, 1 x128]`, `[3, 1, 2, ...]`."""
    if values is None or len(values) == 0:
        return "[]"
    groups: list = []
    for v in np.asarray(values, dtype=np.float64).reshape(-1)[:4096]:
        v = float(v)
        if groups and (groups[-1][0] == v or (np.isnan(v) and np.isnan(groups[-1][0]))):
            groups[-1][1] += 1
        else:
            if len(groups) == runs:
                groups.append(None)
                break
            groups.append([v, 1])
    shown = ", ".join("..." if g is None else (f"{g[0]:g} x{g[1]}" if g[1] > 1 else f"{g[0]:g}") for g in groups)
    return f"[{shown}]"


def at(call: Call) -> dict:
    """Where the student's code started an operation, as notes name it: its line, and the file when it is one
    a notebook cell wrote (feedback/lines.py places it in that cell)."""
    return {"line": call.line or "?", **({"file": call.file} if call.file else {})}


def op_name(call: Call | None) -> str:
    """The operation as the student wrote it: the public function they called, else the operation."""
    if call is None:
        return "-"
    return call.api or call.op


# ------------------------------------------------------------------------------------------------
# Why a rank stopped

def rank_failure(run: RunOutcome, record: RankRecord) -> tuple[Outcome, Note] | None:
    """The reason this rank did not finish the entry function normally, or None if it did."""
    r = record.rank
    result = record.result
    if result is not None:
        how = result.how
        error = result.error or {}
        if how == "load_error":
            return Outcome.LOAD_ERROR, Note("fail.load_error", {"rank": r, **error_params(error)})
        if how == "exit":
            return Outcome.EARLY_EXIT, Note("fail.sys_exit", {"rank": r, "code": error.get("message", "")})
        if how == "raise":
            kind = error.get("type", "")
            message = error.get("message", "")
            failed = failed_call(record)
            if failed is not None and "timed out" in (failed.error or "").lower():
                return Outcome.TIMEOUT, Note("fail.timeout_inside", {"rank": r, "op": op_name(failed), "n": failed.seq + 1})
            if kind == "NotImplementedError":
                return Outcome.TODO, Note("fail.todo", {"rank": r})
            if kind == "MemoryError" or "can't allocate memory" in message or "Cannot allocate memory" in message:
                return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
            if kind == "BlockingIOError" or "Resource temporarily unavailable" in message:
                return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
            if failed is not None and (failed.error or "").startswith(MISMATCH_WORDS) and MISMATCH_WORDS in message:
                # the switch's own error, raised in the student's call: worded in the report's language
                return Outcome.EXCEPTION, Note("fail.mismatch_raised", {"rank": r, "type": kind, "op": op_name(failed),
                                                                        "frames": error_params(error)["frames"]})
            return Outcome.EXCEPTION, Note("fail.exception", {"rank": r, **error_params(error)})
        return None
    if record.out_of_memory:   # the rank's memory limit left the grader's code inside it no room
        return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
    if run.stop == "output_limit" and run.stop_rank == r:
        return Outcome.OUTPUT_LIMIT, Note("fail.output", {"rank": r})
    if run.stop == "traffic_limit" and run.stop_rank == r:
        return Outcome.TRAFFIC_LIMIT, Note("fail.unread" if record.unread else "fail.traffic", {"rank": r})
    if run.stop == "protocol" and run.stop_rank == r:
        if record.broken is not None:
            return Outcome.PROTOCOL, Note("fail.broken", {"rank": r, "error": record.broken})
        return Outcome.PROTOCOL, Note("fail.protocol", {"rank": r})
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
    if run.stop == "process_limit" or (run.stop == "timeout" and run.process_limit_hit):
        return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
    if run.stop == "timeout":
        return Outcome.TIMEOUT, _where(record, "fail.timeout")
    if run.stop == "deadlock":
        return Outcome.DEADLOCK, _where(record, "fail.deadlock")
    if run.stop in ("failfast", "output_limit", "traffic_limit", "protocol"):
        return Outcome.EXCEPTION, Note("fail.stopped", {"rank": r, "other": run.stop_rank})
    return Outcome.GRADER_ERROR, Note("fail.grader", {"rank": r})


def failed_call(record: RankRecord) -> Call | None:
    """The last operation of the rank, if it completed with an error (the exception came out of it)."""
    for call in reversed(record.calls):
        if call.completed and not call.ok:
            return call
        if call.completed:
            return None
    return None


def last_call(record: RankRecord, failure: Note) -> list[Note]:
    """Where a rank was in its operations when it failed (timeouts and deadlocks say it already)."""
    if failure.key.startswith(("fail.timeout", "fail.deadlock", "fail.stopped", "fail.grader")):
        return []
    if not record.calls:
        return [Note("detail.no_collective", {"rank": record.rank})]
    last = record.calls[-1]
    return [Note("detail.last_collective", {"rank": record.rank, "op": op_name(last), "n": last.seq + 1,
                                            **at(last)})]


def _where(record: RankRecord, key: str) -> Note:
    inside = record.inside
    if inside is not None:
        return Note(key + "_inside", {"rank": record.rank, "op": op_name(inside), "n": inside.seq + 1,
                                      **at(inside)})
    last = record.last_started
    if last:   # a real-backend run: no switch saw where the rank waits, only the last call it started
        return Note(key + "_real", {"rank": record.rank, "op": last.get("api") or last.get("op") or "?",
                                    "line": last.get("line") or "?"})
    return Note(key + "_outside", {"rank": record.rank})


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def error_params(error: dict) -> dict:
    """An exception as the report shows it: its type, message and the student's frames (structured: the
    catalog words the frame, so a Chinese report is Chinese throughout)."""
    frames = [f for f in error.get("frames") or [] if isinstance(f, dict)][-3:]
    return {"type": error.get("type", "?"), "message": (error.get("message") or "")[:300],
            "frames": [{"line": f.get("line"), "function": f.get("function"), "text": f.get("text", "")} for f in frames]}


# ------------------------------------------------------------------------------------------------
# Why a value is wrong

def value_causes(quantity, value: Value, ws: int, rank: int, record: RankRecord, others: dict,
                 source: str, exercise) -> list[Note]:
    """Mistakes a wrong value shows, in the exercise's terms. `others`: the rank's other quantities;
    `source`: the submission's text (some causes hold only if the source shows them). Each pattern is
    said only where it is certain: a value "divided twice" is made of what was delivered, a value that
    is the rank's own data was not, and so on."""
    label = {"quantity": quantity.name}
    notes: list[Note] = []
    expected = quantity.expected_array(rank, ws)
    shape = quantity.expected_shape(ws)
    data = value.data
    calls = [c for c in record.calls if not quantity.through or c.op in quantity.through]
    raised = record.how in (How.RAISE, How.EXIT, How.LOAD_ERROR)   # stopped early: its value is half-made
    if value.dtype and not value.floating and value.dtype.startswith(("torch.int", "torch.uint", "torch.bool")):
        notes.append(Note("cause.integer_dtype", {**label, "dtype": value.dtype}))
    for call in calls:
        if call.reduce not in (None, "SUM", "AVG"):
            notes.append(Note("cause.reduce_op", {**label, "op": op_name(call), "reduce": call.reduce, **at(call)}))
            break
    used_through = bool(calls)   # value patterns say something only if the value went through its operation
    delivered = [d for c in calls if c.completed and c.ok and c.receives for d in c.delivered_values() if d is not None]
    if data is not None and data.size and not np.all(np.isfinite(data)) and \
            any(d.size and not np.all(np.isfinite(d)) for d in delivered):
        # what the operation delivered already held inf or nan: a sum past its dtype's largest value
        notes.append(Note("cause.not_finite", {**label, "op": op_name(calls[0])}))
    same_size = data is not None and data.size == expected.size and value.floating
    # a rank that stopped early may have left a value in the making: its numbers alone say nothing of a mistake
    # (a sum not yet divided is no "sum, not averaged"); what the source shows too (a hard-coded world size, a
    # floor division), its dtype, shape and operations still do
    if same_size and used_through and quantity.combine == "mean" and not quantity.uses_context:
        own = quantity.local_array(rank, ws)
        made_of_delivered = _scaled_from(data, delivered, (1.0, 1.0 / ws), value.dtype)
        if own.size == data.size and all_close(data, own / ws, value.dtype) and not made_of_delivered \
                and not all_close(data, expected, value.dtype) and not raised:
            # its own data divided: what the operation delivered never reached it (a copy was reduced)
            notes.append(Note("cause.own_data_divided", {**label, "op": op_name(calls[0])}))
        elif all_close(data, expected * ws, value.dtype) and _scaled_from(data, delivered, (1.0,), value.dtype) \
                and not raised:
            notes.append(Note("cause.summed_not_averaged", {**label, "ws": ws}))
        elif all_close(data, expected / ws, value.dtype) and made_of_delivered and not raised:
            avg = any(c.reduce == "AVG" for c in calls)
            notes.append(Note("cause.averaged_twice" if avg else "cause.divided_twice", {**label}))
        elif all_close(data, np.floor(expected), value.dtype) and "//" in source:
            notes.append(Note("cause.floor_division", {**label}))
    if same_size and used_through and quantity.local is not None and not quantity.uses_context and not raised \
            and all_close(data, quantity.local_array(rank, ws), value.dtype) and not all_close(data, expected, value.dtype):
        # (no operation at all: nothing whose result went unused)
        p2p = bool(set(quantity.through) & {"send", "recv"})
        notes.append(Note("cause.unchanged_p2p" if p2p else "cause.unchanged", {**label, "op": op_name(calls[0])}))
    if same_size and used_through and not any(n.key.startswith("cause.") and n.key != "cause.reduce_op" for n in notes):
        k = _hardcoded(quantity, data, ws, value.dtype, source)
        if k is not None:
            notes.append(Note("cause.hardcoded_ws", {**label, "k": k}))
    if data is not None and value.shape and list(value.shape) != shape:
        if quantity.combine == "concat" and list(value.shape) == [ws, int(np.prod(shape)) // ws]:
            notes.append(Note("cause.stack_not_cat", {**label, "shape": value.shape}))
    if quantity.combine == "concat" and not quantity.uses_context and data is not None and ws > 1 and value.floating \
            and not raised:
        notes += _concat_causes(quantity, data, ws, rank, value.dtype, label)
    for name, other in others.items():
        if name == quantity.name or other is None or other.data is None or data is None or raised:
            continue
        theirs = exercise.quantity(name).expected_array(rank, ws)
        if data.size == theirs.size and all_close(data, theirs, value.dtype):
            notes.append(Note("cause.swapped", {**label, "other": name}))
    if _read_before_wait(calls, data):
        notes.append(Note("cause.read_before_wait", {**label, "op": op_name(next(c for c in calls if c.async_op))}))
    notes += contribution_causes(quantity, ws, record, calls)
    notes += exercise_causes(exercise, quantity, value, ws, record, Outcome.EXCEPTION if raised else Outcome.WRONG,
                             others)
    return notes


def _scaled_from(data: np.ndarray, delivered: list, scales, dtype: str) -> bool:
    """The value is one delivered vector (or its start), times one of `scales`."""
    for d in delivered:
        if d.size < data.size:
            continue
        if any(all_close(data, s * d[:data.size], dtype) for s in scales):
            return True
    return False


def _concat_causes(quantity, data: np.ndarray, ws: int, rank: int, dtype: str, label: dict) -> list[Note]:
    """How a concatenation of every rank's slice went wrong, from its blocks: each block one rank's slice
    (told apart only where the ranks' slices differ), in another order; some slices repeated in the
    slots after them (output buffers that share memory); the whole divided by world_size; the rank's own
    slice once more; or the slices interleaved element by element (columns of one buffer)."""
    expected = quantity.expected_array(rank, ws)
    locals_ = [quantity.local_array(q, ws) for q in range(ws)]
    if all_close(data, expected, dtype):
        return []
    sizes = [a.size for a in locals_]
    distinct = all(not (locals_[a].size == locals_[b].size and all_close(locals_[a], locals_[b], dtype))
                   for a in range(ws) for b in range(a + 1, ws))
    if data.size == expected.size and distinct:
        starts = np.cumsum([0] + sizes)
        owners = []
        for k in range(ws):
            block = data[starts[k]:starts[k + 1]]
            match = [q for q in range(ws) if locals_[q].size == block.size and all_close(block, locals_[q], dtype)]
            owners.append(match[0] if len(match) == 1 else None)
        if None not in owners:
            if sorted(owners) == list(range(ws)):
                return [Note("cause.concat_order", label)]
            last = ws - 1
            if all(q == last for q in owners):
                return [Note("cause.shared_buffers", label)]
            if all(q >= k for k, q in enumerate(owners)):
                return [Note("cause.shared_buffers_some", label)]
        if len(set(sizes)) == 1:
            n = sizes[0]
            if all_close(data.reshape(n, ws).T.reshape(-1), expected, dtype):
                return [Note("cause.interleaved", label)]
    if data.size == expected.size and all_close(data, expected / ws, dtype):
        return [Note("cause.concat_divided", label)]
    own = locals_[rank]
    if data.size == expected.size + own.size and len(set(sizes)) == 1:
        n = own.size
        for j in range(ws + 1):
            rest = np.concatenate([data[:j * n], data[(j + 1) * n:]])
            if all_close(data[j * n:(j + 1) * n], own, dtype) and all_close(rest, expected, dtype):
                return [Note("cause.own_slice_again", label)]
    return []


def exercise_causes(exercise, quantity, value: Value, ws: int, record: RankRecord, outcome: Outcome,
                    others: dict | None = None) -> list[Note]:
    """The exercise's own causes (`Exercise.diagnose`) for a rank whose check failed: a wrong value, and
    also an exception, or right numbers that did not come through the communication. The context holds
    the rank's operations, its value, the outcome, if it raised, its error, and the rank's other
    quantities' values (`others`: name -> array, those it left)."""
    if exercise.diagnose is None:
        return []
    context = {"calls": record.calls, "value": value, "outcome": outcome.value,
               "error": record.result.error if record.result is not None else None, "returned": record.how is How.RETURN,
               "others": {name: v.data for name, v in (others or {}).items()
                          if name != quantity.name and v is not None and v.data is not None}}
    try:
        extra = exercise.diagnose(quantity.name, value.data, ws, record.rank, context) or []
    except Exception:  # noqa: BLE001  (an exercise's diagnosis never breaks grading)
        extra = []
    return [Note(f"{exercise.name}.{key}", dict(params)) for key, params in extra]  # the exercise's own words


def forbidden_words(exercise, op: str, name: str) -> list[Note]:
    """The exercise's own reason for not allowing `op` (its message `cause.forbidden_<op>`, else
    `cause.forbidden` for every operation it forbids), if it gives one."""
    for key in (f"cause.forbidden_{op}", "cause.forbidden"):
        if key in (exercise.messages or {}):
            return [Note(f"{exercise.name}.{key}", {"op": name})]
    return []


def contribution_causes(quantity, ws: int, record: RankRecord, calls: list[Call]) -> list[Note]:
    """A collective the quantity goes through, fed with something other than the rank's own data."""
    if quantity.local is None or quantity.combine == "custom" or quantity.uses_context:
        return []
    local = quantity.local_array(record.rank, ws)
    for call in calls:
        if not call.sends or call.op not in ("all_reduce", "all_gather", "reduce_scatter", "reduce", "gather"):
            continue
        sent = [v for v in call.sent_values() if v is not None]
        if not sent:
            continue
        flat = np.concatenate(sent)
        if flat.size == local.size and not all_close(flat, local, "torch.float64") \
                and not all_close(flat, local / ws, "torch.float64"):
            return [Note("cause.contribution", {"quantity": quantity.name, "rank": record.rank, "op": op_name(call),
                                                **at(call), "sent": preview(flat), "own": preview(local)})]
    return []


def _read_before_wait(calls: list[Call], data) -> bool:
    """An async operation whose result was read before its wait(): the value still holds the buffer's
    contents from before the operation (zeros, typically). (Never waited at all: async_no_wait says so.)"""
    asyncs = [c for c in calls if c.async_op and c.waited]
    return bool(asyncs) and data is not None and data.size > 0 and bool(np.all(data == 0))


def _hardcoded(quantity, data: np.ndarray, ws: int, dtype: str, source: str) -> int | None:
    """The value is what another world size k would give, and the source divides by the constant k (written
    as a number, or a name bound to it): a constant that only equals a world size (K = 4 micro-batches, a
    range(4)) is not said to be one."""
    constants = _divisors(source)
    for k in range(2, 9):
        if k == ws or k not in constants:
            continue
        if quantity.combine == "mean":
            guess = np.sum([quantity.local_array(q, ws) for q in range(ws)], axis=0) / k
            if guess.size == data.size and all_close(data, guess, dtype):
                return k
    return None


@functools.lru_cache(maxsize=16)
def _divisors_cached(source: str) -> frozenset:
    """Whole numbers from 1 to 63 that the source divides by: `x / 4`, `x /= 4`, `x // 4`, `x.div(4)`,
    `torch.div(x, 4)`, `x * (1 / 4)`, and the same through a name assigned the number (`N = 4 ... x / N`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()

    def number(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool) \
                and float(node.value).is_integer() and 0 < node.value < 64:
            return int(node.value)
        return None

    names: dict[str, set] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            k = number(node.value)
            for target in targets:
                if isinstance(target, ast.Name) and k is not None:
                    names.setdefault(target.id, set()).add(k)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):] if node.args.defaults else []
            for arg, default in zip(args, node.args.defaults):
                if number(default) is not None:
                    names.setdefault(arg.arg, set()).add(number(default))

    def values(node) -> set:
        if number(node) is not None:
            return {number(node)}
        if isinstance(node, ast.Name):
            return names.get(node.id, set())
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and node.func.id in ("float", "int"):
            return values(node.args[0])
        return set()

    found: set = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            found |= values(node.right if isinstance(node, ast.BinOp) else node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("div", "div_", "true_divide", "true_divide_", "floor_divide", "floor_divide_"):
                args = node.args[1:] if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" else node.args
                if args:
                    found |= values(args[0])
    return frozenset(found)


def _divisors(source: str) -> frozenset:
    return _divisors_cached(source)


# ------------------------------------------------------------------------------------------------
# What the operations show, whatever became of the value

def _called_elsewhere(run: RunOutcome | None, rank: int, ops: set) -> bool:
    return run is not None and any(c.op in ops for rec in run.ranks if rec.rank != rank for c in rec.calls)


def call_causes(quantity, ws: int, record: RankRecord, run: RunOutcome | None = None) -> list[Note]:
    """What the rank's operations show. `run`: the rank's run, where another rank's calls tell a TODO left
    open (no rank calls the operation) from ranks that call different operations (cause.mismatch's)."""
    notes = []
    through = set(quantity.through)
    returned = record.how is How.RETURN   # a rank that stopped early says nothing of its ops
    if returned and through and not through & {"send", "recv"} and not any(c.op in through for c in record.calls):
        others = [c for c in record.calls if c.op != "barrier" and not c.via]   # not DDP's own start-up broadcast
        # another operation in its place: one that carried data of this quantity's size, a send or a recv
        # included (the other ops may be another quantity's, with this one's TODO still open)
        carried = [c for c in others if _carries(c, quantity, ws, record.rank)]
        if carried:
            used = sorted({op_name(c) for c in carried})   # not another quantity's operation
            notes.append(Note("cause.other_op", {"quantity": quantity.name, "ops": list(quantity.through),
                                                  "used": used, **at(carried[0])}))
            rooted = next((c for c in carried if c.op in ("reduce", "gather")), None)
            if rooted is not None:
                notes.append(Note("cause.rooted_op", {"op": op_name(rooted)}))
        elif not any(c.via for c in record.calls) and not _called_elsewhere(run, record.rank, through):
            # (with DDP, its all-reduce missing is no TODO left open; nor where another rank called it)
            notes.append(Note("cause.op_missing", {"quantity": quantity.name, "ops": list(quantity.through)}))
    for call in record.calls:
        if call.op in quantity.through and call.op in ("all_gather", "gather") and call.receives:
            count = len(call.outputs or [])
            if count > 1 and count != (len(call.group) if call.group else ws):   # a group's size, not the world's
                notes.append(Note("cause.gather_list_size", {"got": count, "op": op_name(call)}))
                break
        if call.error and "invalid output tensor list" in call.error:
            notes.append(Note("cause.gather_list_size", {"got": "?", "op": op_name(call)}))
            break
        if call.error and call.op == "all_gather" and call.device == "cpu" and len(call.outputs) == 1 \
                and call.inputs and call.outputs[0].get("shape") == [len(call.group), *call.inputs[0].get("shape", [])]:
            notes.append(Note("cause.stacked_output", {"op": op_name(call)}))
            break
    pickled = [c for c in record.calls if c.op in through and (c.api or "").endswith("_object")]
    if pickled and len(pickled) == len([c for c in record.calls if c.op in through and c.sends]):
        notes.append(Note("cause.object_collective", {"op": op_name(pickled[0])}))
    waiting = async_without_wait([c for c in record.calls if c.op in through])
    if waiting is not None and record.how is How.RETURN:
        notes.append(Note("cause.async_no_wait", {"op": op_name(waiting)}))
    return notes


def _carries(call: Call, quantity, ws: int, rank: int) -> bool:
    """The call sent or received as many elements as the quantity's own data or its value hold."""
    sizes = {int(quantity.expected_array(rank, ws).size)}
    if quantity.local is not None and not quantity.uses_context:
        sizes.add(int(quantity.local_array(rank, ws).size))
    moved = [call.sent_numel] + [int(d.get("numel") or 0) for d in call.outputs or []] + \
        [int(d.get("numel") or 0) for d in call.delivered or []]
    return bool(sizes & set(moved)) or sum(int(d.get("numel") or 0) for d in call.outputs or []) in sizes


def _signature(call: Call) -> str:
    """An operation as the ranks must agree on it: its name and the sizes it moves."""
    sizes = [str(int(d.get("numel") or 0)) for d in (call.inputs or [])] or [str(int(d.get("numel") or 0)) for d in (call.outputs or [])]
    return f"{op_name(call)}({', '.join(sizes)})"


def _own_fault_outside(run: RunOutcome, record: RankRecord) -> bool:
    result = record.result
    if result is not None and result.how in (How.RAISE, How.EXIT, How.LOAD_ERROR):
        return failed_call(record) is None
    return result is None and record.inside is None and run.stop == "timeout"


def mismatched_calls(run: RunOutcome) -> Note | None:
    """Ranks that called different collectives, or in a different order or size (gloo may pair them
    silently, hang, or abort). Not said when a rank stopped on its own mistake outside the collectives:
    then the other ranks' extra calls are a consequence, not the cause. Point-to-point operations
    differ by design between ranks and are left out."""
    # per group: its members' calls on it must agree (a rank outside a group makes none of its calls: the
    # leaders' all-reduce of a hierarchy is no mismatch for the ranks that are not leaders)
    per_group: dict = {}   # (name, ranks) -> rank -> its calls on that group, in order
    for rec in run.ranks:
        for c in rec.calls:
            if c.op not in ("send", "recv"):
                per_group.setdefault((c.gname, tuple(c.group)), {}).setdefault(rec.rank, []).append(_signature(c))
    candidates = []
    for (_, members), calls in per_group.items():
        pairs = [(r, tuple(calls.get(r, ()))) for r in members if 0 <= r < len(run.ranks)]
        if len({seq for _, seq in pairs}) > 1:
            candidates.append(pairs)
    if not candidates:
        return None
    # the group some member never called at all (a collective only some ranks call) before one whose members
    # merely stopped early (stuck in that call elsewhere), then the larger group
    differing = max(candidates, key=lambda pairs: (any(not seq for _, seq in pairs), len(pairs)))
    if any(_own_fault_outside(run, rec) for rec in run.ranks):
        return None
    if group_name_conflict(run) is not None:   # two groups under one name: the ranks that used it stopped there
        return None
    return Note("cause.mismatch", {"calls": [{"rank": r, "ops": list(seq)} for r, seq in differing]})


def floor_of_delivered(quantity, value: Value, record: RankRecord, ws: int) -> bool:
    """The value is a delivered vector scaled and floored (`//=`): right by luck where the mean is whole."""
    if value.data is None:
        return False
    for call in record.calls:
        if call.op not in quantity.through or not call.completed:
            continue
        for data in call.delivered_values():
            if data is None or data.size < value.data.size:
                continue
            for s in (1.0, 1.0 / ws):
                if np.array_equal(np.floor(s * data[:value.data.size]), value.data):
                    return True
    return False


def blocked_in_send(run: RunOutcome) -> Note | None:
    """A deadlock where every rank waits in a send: gloo does not buffer sends, so a send completes only
    once its peer posts the receive."""
    if run.stop != "deadlock":
        return None
    waiting = [rec.inside for rec in run.ranks if not rec.finished]
    posted = any(c.op == "recv" and not c.completed for rec in run.ranks for c in rec.calls)
    if waiting and all(call is not None and call.op == "send" for call in waiting) and not posted:
        return Note("cause.all_blocked_in_send", {})
    return None


def blocked_in_recv(run: RunOutcome) -> Note | None:
    """A deadlock where every rank waits in a receive and no send is pending anywhere: each receives before it
    sends, so none ever sends."""
    if run.stop != "deadlock":
        return None
    waiting = [rec.inside for rec in run.ranks if not rec.finished]
    posted = any(c.op == "send" and not c.completed for rec in run.ranks for c in rec.calls)
    if len(waiting) > 1 and all(call is not None and call.op == "recv" for call in waiting) and not posted:
        return Note("cause.all_blocked_in_recv", {})
    return None


def global_peer(call: Call, peer: int | None) -> int | None:
    """A call's peer (a rank of its group) as a global rank."""
    if peer is None:
        return None
    return call.group[peer] if call.group and 0 <= peer < len(call.group) else peer


def p2p_mismatch(run: RunOutcome) -> list[Note]:
    """Messages that did not fit the receive buffer posted for them, as the switch measured them (it fails
    both calls and names the figures; gloo would abort the receiver, SIGABRT, or fill part of the buffer):
    the first of each kind."""
    found: dict[str, Note] = {}
    for rec in run.ranks:
        for call in rec.calls:
            facts = call.problem
            if call.op != "recv" or not facts or "receiver" not in facts:
                continue
            params = {"rank": facts["receiver"], "peer": facts["sender"], "sent": facts["sent"], "room": facts["room"]}
            if facts["sent"] > facts["room"]:
                found.setdefault("long", Note("cause.p2p_too_long", params))
            elif facts["sent"] < facts["room"]:
                found.setdefault("short", Note("cause.p2p_too_short", params))
            else:
                found.setdefault("dtype", Note("cause.p2p_dtype", {**params, "sent_dtype": facts["sent_dtype"],
                                                                   "room_dtype": facts["room_dtype"]}))
    return list(found.values())


def group_name_conflict(run: RunOutcome) -> Note | None:
    """Two groups of different ranks under one name, as the switch found them (verify: switch/core.py): torch
    numbers the groups a rank makes, so ranks that made different groups (new_group called only by the
    ranks in the group) name different groups alike, and gloo pairs their ranks up or hangs."""
    for rec in run.ranks:
        for call in rec.calls:
            facts = call.problem
            if facts and facts.get("kind") == "group_name":
                return Note("cause.group_name", {"rank": rec.rank, "op": op_name(call), **at(call),
                                                 "ranks": facts["ranks"], "other": facts["other"]})
    return None


def tag_mismatch(run: RunOutcome) -> Note | None:
    """A deadlock where a rank waits to receive from a peer whose send to it, also pending, carries another
    tag: a send pairs only with a receive of the same tag (and group)."""
    if run.stop != "deadlock":
        return None
    for rec in run.ranks:
        for call in rec.calls:
            if call.op != "recv" or call.completed or call.peer is None:
                continue
            peer = global_peer(call, call.peer)
            if not 0 <= peer < len(run.ranks):
                continue
            for send in run.ranks[peer].calls:
                if send.op == "send" and not send.completed and global_peer(send, send.peer) == rec.rank \
                        and send.tag != call.tag and send.group == call.group:
                    return Note("cause.p2p_tag", {"rank": rec.rank, "peer": peer, **at(call), "tag": call.tag,
                                                  "sent_tag": send.tag})
    return None


def unmatched_receive(run: RunOutcome) -> Note | None:
    """A deadlock where a rank waits to receive from a peer that never sends to it (a wrong neighbour):
    receives posted and pending, but no send of that peer, pending or done, is addressed to this rank."""
    if run.stop != "deadlock":
        return None
    for rec in run.ranks:
        for call in rec.calls:
            if call.op != "recv" or call.completed or call.peer is None:
                continue
            peer = global_peer(call, call.peer)
            if not 0 <= peer < len(run.ranks):
                continue
            sends = [c for c in run.ranks[peer].calls if c.op == "send"]
            to = sorted({global_peer(c, c.peer) for c in sends} - {None})
            # certain only of a peer that sends elsewhere: one that has sent nothing yet (blocked in its own
            # receive first, say) may still send here
            if to and not any(global_peer(c, c.peer) == rec.rank for c in sends):
                return Note("cause.p2p_unmatched", {"rank": rec.rank, "peer": peer, "to": [str(t) for t in to] or ["-"]})
    return None


def async_without_wait(calls: list[Call]) -> Call | None:
    """An operation started with async_op=True whose handle was never waited on."""
    return next((c for c in calls if c.async_op and not c.waited), None)


@functools.lru_cache(maxsize=8)
def _assigned(source: str) -> tuple:
    from ..submission import static
    try:
        return tuple(static.assigned_results(ast.parse(source)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()


def assigned_result(source: str, op: str) -> list[int]:
    """Lines where the submission assigns what an in-place operation returns (None unless async_op)."""
    return [line for name, line in _assigned(source or "") if name == op]
