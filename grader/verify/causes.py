"""Why a value is wrong, in the student's terms: the generic patterns (summed, not averaged; the rank's own data
unchanged; stack instead of cat; a constant world size ...) and the exercise's own table of mistakes.
Each is said only where it is certain."""
from __future__ import annotations

import ast
import functools

import numpy as np

from ..exercise.spec import Case
from ..model import Note, Outcome
from ..records import How, RankRecord
from ..switch import Call
from . import mistakes
from .compare import all_close
from .diagnose import at, op_name, preview
from .observe import Value


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
    if same_size and used_through and quantity.combine == "mean" and not quantity.derived:
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
    if same_size and used_through and quantity.local is not None and not quantity.derived and not quantity.forwards \
            and not raised and all_close(data, quantity.local_array(rank, ws), value.dtype) \
            and not all_close(data, expected, value.dtype):
        # (no operation at all: nothing whose result went unused; a rank that forwards what it received may
        # end with its own data for other reasons: a missing broadcast, which the exercise names)
        p2p = bool(set(quantity.through) & {"send", "recv"})
        notes.append(Note("cause.unchanged_p2p" if p2p else "cause.unchanged", {**label, "op": op_name(calls[0])}))
    if same_size and used_through and not any(n.key.startswith("cause.") and n.key != "cause.reduce_op" for n in notes):
        k = _hardcoded(quantity, data, ws, value.dtype, source)
        if k is not None:
            notes.append(Note("cause.hardcoded_ws", {**label, "k": k}))
    if data is not None and value.shape and list(value.shape) != shape:
        if quantity.combine == "concat" and list(value.shape) == [ws, int(np.prod(shape)) // ws]:
            notes.append(Note("cause.stack_not_cat", {**label, "shape": value.shape}))
    if quantity.combine == "concat" and not quantity.derived and data is not None and ws > 1 and value.floating \
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
    """The exercise's own causes for a rank whose check failed (a wrong value, an exception, right numbers that
    did not come through the communication): its table of mistakes (verify/mistakes.py), then what its own
    `diagnose(case)` says, if it declares one. `others`: the rank's other quantities' values."""
    notes: list[Note] = []
    error = record.result.error if record.result is not None else None
    if exercise.mistakes:
        half = value.dtype in ("torch.float16", "torch.bfloat16")
        tolerance = quantity.tolerance or ("torch.float32" if half else (value.dtype or "torch.float32"))
        right = {q.name: (v is not None and v.data is not None and v.data.size == q.expected_array(record.rank, ws).size
                          and all_close(v.data.reshape(-1), q.expected_array(record.rank, ws), tolerance))
                 for q in exercise.quantities for v in [(others or {}).get(q.name)]}
        notes += mistakes.named(exercise, quantity, value, ws, record.rank, record.calls,
                                error if record.how in (How.RAISE, How.EXIT) else None, outcome is Outcome.WRONG,
                                tolerance, right)
    if exercise.diagnose is None:
        return notes
    case = Case(quantity.name, value.data, ws, record.rank, outcome.value, error, record.how is How.RETURN,
                tuple(record.calls), {name: v.data for name, v in (others or {}).items()
                                      if name != quantity.name and v is not None and v.data is not None})
    try:
        extra = exercise.diagnose(case) or []
        return notes + [Note(f"{exercise.name}.{key}", dict(params)) for key, params in extra]  # its own words
    except Exception as err:  # noqa: BLE001  (an exercise's diagnosis never breaks grading; staff see why)
        return notes + [Note("staff.exercise_error", {"exercise": exercise.name, "what": "diagnose",
                                                      "error": f"{type(err).__name__}: {err}"})]


def forbidden_words(exercise, op: str, name: str) -> list[Note]:
    """The exercise's own reason for not allowing `op` (its message `cause.forbidden_<op>`, else
    `cause.forbidden` for every operation it forbids), if it gives one."""
    for key in (f"cause.forbidden_{op}", "cause.forbidden"):
        if key in (exercise.messages or {}):
            return [Note(f"{exercise.name}.{key}", {"op": name})]
    return []


def contribution_causes(quantity, ws: int, record: RankRecord, calls: list[Call]) -> list[Note]:
    """A collective the quantity goes through, fed with something other than the rank's own data."""
    if quantity.local is None or quantity.combine == "custom" or quantity.derived or quantity.forwards:
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
