"""Why a value is wrong, in the student's terms: the generic patterns (summed, not averaged; the rank's own data
unchanged; stack instead of cat; a constant world size ...) and the exercise's own table of mistakes.
Each is said only where it is certain."""
from __future__ import annotations

import ast
import functools
import re

import numpy as np

from ..exercise.spec import Case, Linear
from ..model import Note, Outcome
from ..records import How, RankRecord
from ..switch import Call
from ..wire import element_size
from . import mistakes
from .compare import all_close
from .diagnose import async_without_wait, at, op_name, preview
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
    sends = sent_causes(quantity, ws, record.rank, calls)
    notes += sends
    if data is not None and data.size and not np.all(np.isfinite(data)) and not sends and \
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
            started = next((c for c in calls if c.async_op), None)   # (it lands at wait(), over a division made before)
            notes.append(Note("cause.summed_not_averaged_async", {**label, "op": op_name(started)}) if started is not None
                         else Note("cause.summed_not_averaged", {**label, "ws": ws}))
        elif all_close(data, expected / ws, value.dtype) and made_of_delivered and not raised:
            avg = any(c.reduce == "AVG" for c in calls)
            notes.append(Note("cause.averaged_twice" if avg else "cause.divided_twice", {**label}))
        elif all_close(data, np.floor(expected), value.dtype) and "//" in source:
            notes.append(Note("cause.floor_division", {**label}))
    root = _wrong_root(quantity, data, ws, rank, value.dtype, calls) if same_size and used_through and not raised else None
    if root is not None:
        notes.append(root)
    elif same_size and used_through and quantity.local is not None and not quantity.derived and not quantity.forwards \
            and not raised and all_close(data, quantity.local_array(rank, ws), value.dtype) \
            and not all_close(data, expected, value.dtype):
        # (no operation at all: nothing whose result went unused; a rank that forwards what it received may
        # end with its own data for other reasons: a missing broadcast, which the exercise names)
        p2p = bool(set(quantity.through) & {"send", "recv"})
        notes.append(Note("cause.unchanged_p2p" if p2p else "cause.unchanged", {**label, "op": op_name(calls[0])}))
    if same_size and used_through and not any(n.key.startswith("cause.") and n.key != "cause.reduce_op" for n in notes):
        given = frozenset(name for name in exercise.defines if name != exercise.entry) if exercise is not None else frozenset()
        k = _hardcoded(quantity, data, ws, value.dtype, source, given)
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
    never_waited = async_without_wait(calls) is not None   # its buffer holds what it held before: no cause of ours
    if _read_before_wait(calls, data):
        notes.append(Note("cause.read_before_wait", {**label, "op": op_name(next(c for c in calls if c.async_op))}))
    elif same_size and not raised and not sends and not never_waited and np.all(data == 0) and np.any(expected != 0) \
            and any(d.size and np.any(d != 0) for d in delivered):
        notes.append(Note("cause.delivered_elsewhere", {**label, "op": op_name(calls[0])}))
    little = carried_too_little(quantity, ws, calls) if used_through and not raised and not sends else None
    if little is not None:
        notes.append(little)
    notes += contribution_causes(quantity, ws, record, calls)
    # what was sent says how the numbers were lost: the exercise's values of them would not; nor of numbers read
    # before an operation never waited on delivered them (whatever its buffer held)
    if not sends and not (never_waited and record.how is How.RETURN):
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
                          and all_close(v.data.reshape(-1), q.expected_array(record.rank, ws),
                                        q.tolerance or v.dtype or "torch.float32"))   # each at its own tolerance
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


def _hardcoded(quantity, data: np.ndarray, ws: int, dtype: str, source: str, given: frozenset = frozenset()) -> int | None:
    """The value is what another world size k would give, and the source has the constant k where the world
    size belongs: a mean divided by k (written as a number, or a name bound to it); a Linear quantity whose
    weight is the one of k ranks, divided by the number k or by a name for the world size (`WORLD_SIZE`,
    `ws`: not K = 4 micro-batches); a sum of the first k ranks' data, with a name for the world size bound to
    k. A constant that only equals a world size (K = 4 micro-batches, a range(4)) is not said to be one, nor a
    number the functions the exercise gives (`given`: its data's `/ 4`) divide by."""
    divisors, named = _divisors(source), _world_names(source)
    for k in range(2, 9):
        if k == ws:
            continue
        if quantity.combine == "mean" and k in divisors:
            guess = np.sum([quantity.local_array(q, ws) for q in range(ws)], axis=0) / k
        elif isinstance(quantity.combine, Linear) and k in _literal_divisors(source, given) | named:
            linear = quantity.combine
            total = np.sum([v for q in range(ws) for v in linear.vectors(q, ws)], axis=0)
            guess = linear.value(ws, linear.weight(k) * total)
        elif quantity.combine == "sum" and k < ws and k in named:
            guess = np.sum([quantity.local_array(q, ws) for q in range(k)], axis=0)
        else:
            continue
        if guess.size == data.size and all_close(data, guess, quantity.tolerance or dtype):
            return k
    return None


def hardcoded_ranks(run, source: str) -> Note | None:
    """Ranks k and up raised, every one of them and no other, where the source binds a name for the world size
    to k (`WORLD_SIZE = 4`): code written for k ranks, with no place for the others (an IndexError into a list
    of node groups, say)."""
    ws = run.request.world_size
    raised = sorted(rec.rank for rec in run.ranks if rec.how is How.RAISE)
    named = _world_names(source, with_names=True)
    if not raised or raised != list(range(raised[0], ws)) or raised[0] < 2:
        return None
    k = raised[0]
    name = named.get(k)
    if name is None:
        return None
    error = run.ranks[k].result.error if run.ranks[k].result is not None else None
    return Note("cause.hardcoded_ws_ranks", {"first": k, "k": k, "name": name,
                                             "error": str((error or {}).get("type") or "?")})


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


WORLD_NAME = re.compile(r"(?i)^(world(_?size)?|ws|n_?ranks|num_?ranks|n_?procs|nprocs|n_?gpus|ranks)$")


@functools.lru_cache(maxsize=16)
def _names_cached(source: str) -> tuple:
    """(name, number) for every name a number from 2 to 63 is assigned to (module or function level)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            k = node.value.value
            if isinstance(k, int) and not isinstance(k, bool) and 2 <= k < 64:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        out.append((target.id, k))
    return tuple(out)


def _world_names(source: str, with_names: bool = False):
    """The numbers bound to a name for the world size (`WORLD_SIZE = 4`, `ws = 2`); with_names: {number: name}."""
    found = {k: name for name, k in _names_cached(source) if WORLD_NAME.match(name)}
    return found if with_names else frozenset(found)


@functools.lru_cache(maxsize=16)
def _literal_divisors(source: str, given: frozenset = frozenset()) -> frozenset:
    """Numbers the source divides by as written (`x / 2`, `x /= 2`, `x.div(2)`), not through a name, outside
    the top-level functions named in `given`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    found = set()
    kept = [stmt for stmt in tree.body if not (isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in given)]
    for node in (n for stmt in kept for n in ast.walk(stmt)):
        right = node.right if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)) else \
            node.value if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.FloorDiv)) else \
            node.args[-1] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
            and node.func.attr in ("div", "div_", "true_divide", "true_divide_") else None
        if isinstance(right, ast.Constant) and isinstance(right.value, (int, float)) and not isinstance(right.value, bool) \
                and float(right.value).is_integer() and 2 <= right.value < 64:
            found.add(int(right.value))
    return frozenset(found)


INTEGERS = ("torch.int8", "torch.uint8", "torch.int16", "torch.int32", "torch.int64")
WIDER = ("torch.float32", "torch.float64")


def _own_candidates(quantity, rank: int, ws: int) -> list[np.ndarray]:
    """What the rank's own data for the quantity may be when it sends it: its vectors (a Linear quantity's, each
    one, their sum and their mean), or its local data; none for a reference step's."""
    if isinstance(quantity.combine, Linear):
        vectors = quantity.combine.vectors(rank, ws)
        return vectors + ([np.sum(vectors, axis=0), np.mean(vectors, axis=0)] if len(vectors) > 1 else [])
    if quantity.local is not None and not quantity.derived:
        return [o for o in quantity.local_options(rank, ws) if o.size]
    return []


def _scaled(values: np.ndarray, own: np.ndarray, dtype: str = "torch.float32") -> bool:
    """`values` is a non-zero multiple of `own`, within the rounding of `dtype` (float32's at least)."""
    norm = float(own @ own)
    if values.size != own.size or not norm or not np.all(np.isfinite(values)):
        return False
    scale = float(values @ own) / norm
    return scale != 0 and all_close(values, scale * own, dtype if dtype in ("torch.float16", "torch.bfloat16") else "torch.float32")


def sent_causes(quantity, ws: int, rank: int, calls: list[Call]) -> list[Note]:
    """What the rank sent into the quantity's operations could not carry it, each measured of the send: values
    already inf or nan (a cast that overflowed, before any sum); the quantity's own data cast to an integer
    dtype (its fractions cut off); its bytes sent as another dtype (a view: bit patterns summed). Each said
    only where the send shows it (the integers are the data truncated or rounded; the bytes, read back, are the
    data)."""
    own = _own_candidates(quantity, rank, ws)
    label = {"quantity": quantity.name}
    for call in calls:
        if not (call.sends and call.completed):
            continue
        for raw, values, desc in zip(call.sent, call.sent_values(), call.inputs):
            if raw is None or values is None:
                continue
            dtype, numel = str(desc.get("dtype")), int(desc.get("numel") or 0)
            values = values.reshape(-1)
            where = {"op": op_name(call), **at(call), "dtype": dtype}
            for data in own:
                fractional = bool(np.any(data != np.round(data)))
                if dtype in INTEGERS and numel == data.size and fractional and any(
                        np.array_equal(values, f(s * data)) for s in (1.0, 1.0 / ws, float(ws))
                        for f in (np.trunc, np.round)):
                    return [Note("cause.sent_integer", {**label, **where})]
                for wide in WIDER:
                    size = element_size(wide)
                    if numel != data.size and numel * element_size(dtype) == data.size * size and \
                            _scaled(np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.dtype(wide.split(".")[1]))
                                    .astype(np.float64), data):
                        return [Note("cause.sent_reinterpreted", {**label, **where, "numel": numel, "own": wide,
                                                                  "size": data.size})]
            # the rank's own data, scaled, where it is finite, and inf or nan elsewhere: it overflowed on the rank
            # (bit patterns read as float16 may be inf or nan too: a view is named as one, above; an
            # uninitialised warm-up tensor is no data of the quantity's)
            finite = np.isfinite(values)
            if dtype not in INTEGERS and not finite.all() and any(
                    data.size == values.size and (not finite.any() or _scaled(values[finite], data[finite], dtype))
                    for data in own):
                return [Note("cause.sent_not_finite", {**label, **where})]
    return []


def elementwise(quantity) -> bool:
    """Each element of the quantity is made of elements its operations delivered (a mean, a sum, a
    concatenation, a root's data, a Linear combination): not a step's output computed from fewer of them (a
    reference's output for a shard of weights, made from the all-reduced activation), nor an exercise's own
    formula."""
    return quantity.combine in ("mean", "sum", "concat", "root") or isinstance(quantity.combine, Linear)


def carried_too_little(quantity, ws: int, calls: list[Call]) -> Note | None:
    """The quantity's operations, all of them together, carried fewer elements on this rank (sent or delivered,
    whichever is more, in each call) than the quantity holds: the rest of it did not come through them (one
    number all-reduced beside an answer computed on the rank; a loss all-reduced in place of the data). Only
    for a quantity made element by element of what was delivered (`elementwise`)."""
    if not elementwise(quantity):
        return None
    size = int(np.prod(quantity.expected_shape(ws)))
    done = [c for c in calls if c.completed and c.ok]
    carried = sum(max(c.sent_numel, sum(int(d.get("numel") or 0) for d in c.delivered if isinstance(d, dict)))
                  for c in done)
    if not done or carried >= size:
        return None
    return Note("cause.carried_too_little", {"quantity": quantity.name, "op": op_name(done[0]), "sent": carried, "size": size})


def _wrong_root(quantity, data: np.ndarray, ws: int, rank: int, dtype: str, calls: list[Call]) -> Note | None:
    """A rooted quantity (combine="root") that is the data of another rank than the root and than this one (a
    rank holding its own data may just not have used what it received): the operation came from the wrong
    root (src)."""
    if quantity.combine != "root" or data is None:
        return None
    for other in range(ws):
        if other in (quantity.root, rank):
            continue
        theirs = quantity.local_array(other, ws)
        if theirs.size == data.size and all_close(data, theirs, dtype) and \
                not all_close(theirs, quantity.local_array(quantity.root, ws), dtype):
            rooted = next((c for c in calls if c.op in ("broadcast", "scatter")), calls[0] if calls else None)
            return Note("cause.wrong_root", {"quantity": quantity.name, "op": op_name(rooted), "other": other,
                                             "root": quantity.root})
    return None


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
