"""Chapter 19, exercise 3: a ZeRO-style sharded optimizer step with reduce-scatter and all-gather.

The chapter's second question, "All-Reduce vs Reduce-Scatter + All-Gather: how is memory saved?", in the
student's own run. Every rank holds the same NUM_PARAMS parameters and its own gradient per step
(`local_gradient(rank, step)`). For each of two steps of SGD with momentum, every rank:
  1. reduce-scatters its full gradient (sum then / N, or AVG): it receives the averaged gradient of its
     own shard only, shard = ceil(P / N) elements (the vectors padded with zeros to shard * N);
  2. updates its momentum shard and its parameter shard (momentum = MOMENTUM * momentum + gradient;
     parameters -= LR * momentum);
  3. all-gathers the updated shards into the full parameters (the padding dropped at the end).
run_worker(rank, world_size) leaves `params` (NUM_PARAMS values, the same on every rank) and `momentum`
(this rank's shard, padding included): returned, or kept as locals.

What is proven, in a perturbed run (every tensor sent into reduce_scatter and all_gather carries secret
deltas): the final parameters are what the last all-gather delivered; each rank fed the all-gather the
shard it computed from the gradient shards the reduce-scatter delivered to it (at step 2 from its own
copy of its shard, or from its slice of the parameters an all-gather delivered where it fed that
all-gather the first step's shard it computed so), and fed the reduce-scatter its own full
gradient (or that gradient / N with a sum); its momentum is the one it computed from those deliveries.
A gradient all-reduced whole and then sliced gives the right numbers from what the all-reduce delivered
(it is perturbed too): the value points, not the primitives points, also beside a reduce-scatter whose
result goes unused (calls beside the steps', a warm-up say, are passed over). Each reduce-scatter and
all-gather may be whole or bucketed: consecutive calls that each carry the same part of every rank's shard
and together cover the shard once.

Points (100): static 10 (run_worker reaches reduce_scatter 5, all_gather 5); for each world size 30:
the parameters 15, the momentum shard (sharded optimizer state) 10, the primitives 5 (reduce_scatter
and all_gather used, the quantities through them, no all_reduce: the same bytes as reduce-scatter +
all-gather, with no saving in memory). World size 2 is visible (P = 1030 is a multiple of 2); 3 and 4 are hidden (1030 is a multiple
of neither: the padding counts).
"""
from __future__ import annotations

import functools

import numpy as np

from grader.comm import OPS
from grader.exercise import Alternatives, Check, Exercise, Quantity, Todo

NUM_PARAMS = 1030
LR = 0.1
MOMENTUM = 0.9
STEPS = 2
VISIBLE, HIDDEN = (2,), (3, 4)
P = NUM_PARAMS


# -- the data the stub gives (float32, as torch computes it) -------------------------------------------
def initial_parameters() -> np.ndarray:
    """torch.arange(P, dtype=torch.float32) / P"""
    return (np.arange(P, dtype=np.float32) / np.float32(P)).astype(np.float64)


def local_gradient(rank: int, step: int) -> np.ndarray:
    """torch.sin(torch.arange(P, dtype=torch.float32) * (rank + 1) / 100 + step)"""
    index = np.arange(P, dtype=np.float32)
    return np.sin(index * np.float32(rank + 1) / np.float32(100) + np.float32(step)).astype(np.float64)


def shard_size(ws: int) -> int:
    return -(-P // ws)


def _padded(values: np.ndarray, ws: int) -> np.ndarray:
    out = np.zeros(shard_size(ws) * ws)
    out[:values.size] = values
    return out


def _real(rank: int, ws: int) -> int:
    """How many of the rank's shard elements are parameters (the rest is padding)."""
    s = shard_size(ws)
    return int(min(s, max(0, P - rank * s)))


# -- the reference, and the same loop with a mistake in it --------------------------------------------
@functools.lru_cache(maxsize=64)
def simulate(ws: int, divide: bool = True, carry: bool = True, own_gradient: bool = False,
             base: str = "own", steps: int = STEPS, sign: float = 1.0, reuse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(parameters [P], momentum shards [shard * ws]) after STEPS sharded steps on ws ranks, each rank
    updating its shard with the averaged gradient. The mistakes: divide=False, the sum not divided;
    carry=False, the momentum restarted every step; own_gradient, each rank's shard updated with its
    own local gradient; base, the parameters a rank's update starts from: "own" (its shard), "first"
    (shard 0 for every rank), "next" / "previous" (the shard of rank q + 1 / q - 1); steps, how many
    steps are made; sign=-1, the update added instead of subtracted; reuse, the first step's gradient
    used again at every step."""
    s = shard_size(ws)
    params, momentum = _padded(initial_parameters(), ws), np.zeros(s * ws)
    for step in range(1, steps + 1):
        total = np.sum([local_gradient(q, 1 if reuse else step) for q in range(ws)], axis=0)
        mean = _padded(total / (ws if divide else 1), ws)
        updated = np.empty_like(params)
        for q in range(ws):
            mine = slice(q * s, (q + 1) * s)
            grad = _padded(local_gradient(q, step), ws)[mine] if own_gradient else mean[mine]
            momentum[mine] = (MOMENTUM * momentum[mine] if carry else 0) + grad
            b = {"own": q, "first": 0, "next": (q + 1) % ws, "previous": (q - 1) % ws}[base]
            updated[mine] = params[b * s:(b + 1) * s] - sign * LR * momentum[mine]
        params = updated
    return params[:P], momentum


def _expected_params(rank: int, ws: int) -> np.ndarray:
    return simulate(ws)[0]


def _expected_momentum(rank: int, ws: int) -> np.ndarray:
    s = shard_size(ws)
    return simulate(ws)[1][rank * s:(rank + 1) * s]


# -- what each rank must have computed from what it was delivered (perturbed runs) ---------------------
def _fed_scale(sent: np.ndarray | None, ws: int, q: int, zero_padding: bool, step: int) -> float | None:
    """What rank q fed an all-reduce (`sent`, None: it fed it nothing): its own (padded) gradient of `step`
    (1.0), that gradient divided by N (1/N), or anything else (None). zero_padding: the padding must be zeros
    too (it lands in the last rank's momentum; the parameters drop it)."""
    if sent is None or sent.size not in (shard_size(ws) * ws, P) or (zero_padding and np.any(sent[P:] != 0)):
        return None
    own = local_gradient(q, step)
    for scale in (1.0, 1.0 / ws):
        if np.allclose(sent[:P], scale * own, rtol=2e-5, atol=1e-6):
            return scale
    return None


def _bucket_of(sent: np.ndarray | None, ws: int, q: int, step: int, zero_padding: bool) -> tuple[int, float] | None:
    """(lo, scale) when what rank q fed a reduce-scatter is, for every rank j in turn, elements lo .. lo + m
    of rank j's shard of its own padded gradient of `step` times scale (1 or 1/N): the whole gradient
    (lo = 0, m = shard) or one bucket of every shard. None: anything else (or nothing)."""
    s = shard_size(ws)
    if sent is None or sent.size == 0 or sent.size % ws or sent.size // ws > s:
        return None
    m = sent.size // ws
    grid = _padded(local_gradient(q, step), ws).reshape(ws, s)
    fed = sent.reshape(ws, m)
    real = np.arange(ws * s).reshape(ws, s) < P      # the rest is padding: zeros where zero_padding, else anything
    for scale in (1.0, 1.0 / ws):
        for lo in np.nonzero(np.abs(scale * grid[0, :s - m + 1] - fed[0, 0]) <= 1e-6 + 2e-5 * np.abs(fed[0, 0]))[0]:
            inside = real[:, lo:lo + m]
            if np.allclose(fed[inside], scale * grid[:, lo:lo + m][inside], rtol=2e-5, atol=1e-6) and not (
                    zero_padding and np.any(fed[~inside] != 0)):
                return int(lo), scale
    return None


def _steps_through(op: str, rank: int, ws: int, ctx, zero_padding: bool) -> list[np.ndarray] | None:
    """The momentum after each step from the calls of `op` that carried the steps' gradients, in order:
    a step is one call of the whole gradient, or consecutive buckets that cover the rank's shard once
    (calls beside them, a warm-up or a repeat say, are passed over). Each call is read whole: what it
    delivered to this rank beside what every rank fed that same operation (RunContext.operations)."""
    s = shard_size(ws)
    exchanges = ctx.operations(rank, op)
    if len(exchanges) > 64:
        return None
    if op == "all_reduce":
        delivered = [_padded(e.delivered, ws)[rank * s:(rank + 1) * s] if e.delivered.size in (P, s * ws) else e.delivered
                     for e in exchanges]
    else:
        delivered = [e.delivered for e in exchanges]
    momentum, out, k = np.zeros(s), [], 0
    for step in range(1, STEPS + 1):
        grad, covered = np.zeros(s), np.zeros(s, dtype=bool)
        while not covered.all() and k < len(exchanges):
            piece = _piece(op, rank, ws, zero_padding, exchanges[k], step, delivered[k])
            k += 1
            if piece is None:
                continue
            lo, values = piece
            if covered[lo:lo + values.size].any():
                continue
            grad[lo:lo + values.size], covered[lo:lo + values.size] = values, True
        if not covered.all():
            return None
        momentum = MOMENTUM * momentum + grad
        out.append(momentum)
    return out


def _piece(op: str, rank: int, ws: int, zero_padding: bool, exchange, step: int,
           delivered: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(where in the rank's shard, the averaged gradient there) that one operation of `op` delivered, when
    every rank fed that same operation the same part of its own gradient of `step` at the same scale; None: it
    carried no step. The operation must span every rank, in rank order (the shard a reduce-scatter delivers
    to rank r is chunk r), and each rank's part is what it sent into this operation: a call of its own that
    never completed, or that went to another group, is no contribution to it."""
    reduce = exchange.reduce
    if reduce not in (None, "SUM", "AVG") or exchange.group != tuple(range(ws)):
        return None
    fed = exchange.fed
    if op == "all_reduce":
        scales = {_fed_scale(fed.get(q), ws, q, zero_padding, step) for q in range(ws)}
        lo = 0 if delivered.size == shard_size(ws) else None
    else:
        found = {_bucket_of(fed.get(q), ws, q, step, zero_padding) for q in range(ws)}
        if len(found) != 1 or None in found:
            return None
        lo, scale = found.pop()
        scales = {scale} if delivered.size * ws == fed[rank].size else {None}
    if len(scales) != 1 or None in scales or lo is None:
        return None
    scale = scales.pop()
    if reduce == "AVG":
        if scale != 1.0:
            return None                             # an average of gradients / N is N times too small
        factor = 1.0
    else:
        factor = 1.0 / ws if scale == 1.0 else 1.0   # a sum of gradients, or of gradients / N
    return lo, factor * delivered


def _momentum_steps(rank: int, ws: int, ctx, zero_padding: bool) -> list[np.ndarray] | None:
    """The rank's momentum shard after each step, from the gradient shards the reduce-scatter delivered
    to it; None unless every rank fed every reduce-scatter its own gradient. Failing that, from the whole
    gradient all-reduced at each step and this rank's shard sliced out: the right numbers (the primitives
    check takes its points away: the same bytes, no memory saved), also beside a reduce-scatter whose
    result goes unused."""
    for op in ("reduce_scatter", "all_reduce"):
        steps = _steps_through(op, rank, ws, ctx, zero_padding)
        if steps is not None:
            return steps
    return None


def _own_momentum(rank: int, ws: int, ctx) -> np.ndarray:
    # the padding the ranks feed lands in the shard that holds it (the last rank's): only there must it be zeros
    steps = _momentum_steps(rank, ws, ctx, zero_padding=_real(rank, ws) < shard_size(ws))
    return steps[-1] if steps is not None else np.full(shard_size(ws), np.nan)


def _own_shard(rank: int, ws: int, ctx):
    """The parameter shard the rank must have fed the last all-gather: updated from its own copy of its
    shard, or from its slice of the parameters an earlier all-gather delivered (both honest)."""
    steps = _momentum_steps(rank, ws, ctx, zero_padding=False)
    s, real = shard_size(ws), _real(rank, ws)
    if steps is None:
        return np.full(real, np.nan)
    first, last = steps
    start = _padded(initial_parameters(), ws)[rank * s:(rank + 1) * s]
    bases = [start - LR * first]
    # the first step's gathered parameters count as a base only from an all-gather this rank fed the shard it
    # computed from its deliveries: a shard computed otherwise (locally, from the known gradients) and gathered
    # comes back as what was delivered, so it would launder the first step (whole, or in buckets that cover
    # the shard once)
    gathered, covered = np.zeros(s), np.zeros(s, dtype=bool)
    exchanged = ctx.exchanged(rank, "all_gather")
    for sent, delivered in exchanged if len(exchanged) <= 64 else ():
        m = sent.size
        if not 0 < m <= s or delivered.size != m * ws:
            continue
        lows = np.arange(s - m + 1)
        starts = np.nonzero(np.isclose(sent[0], bases[0][lows], rtol=1e-5, atol=1e-6) | (lows >= real))[0]
        for lo in starts:
            upto = max(0, min(m, real - lo))        # the padding a rank feeds may hold anything
            if not covered[lo:lo + m].any() and np.allclose(sent[:upto], bases[0][lo:lo + upto], rtol=1e-5, atol=1e-6):
                gathered[lo:lo + m], covered[lo:lo + m] = delivered[rank * m:(rank + 1) * m], True
                break
        if covered.all():
            bases.append(gathered)
            gathered, covered = np.zeros(s), np.zeros(s, dtype=bool)
    return Alternatives(*[(base - LR * last)[:real] for base in bases])


QUANTITIES = (
    Quantity("params", local=_own_shard, context=True, combine="concat", through=("reduce_scatter", "all_gather"),
             expected=_expected_params, shape=lambda ws: [P], label=("参数 params", "params")),
    Quantity("momentum", local=_own_momentum, context=True, combine="own", through=("reduce_scatter",),
             expected=_expected_momentum, shape=lambda ws: [shard_size(ws)], label=("动量 momentum", "momentum")),
)


# -- the exercise's own causes --------------------------------------------------------------------------
def _close(a, b) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))


def _gathered_gradients(calls, ws: int) -> bool:
    """An all-gather fed with the rank's averaged (or summed) gradient shard of a step."""
    s = shard_size(ws)
    for call in calls:
        if call.op != "all_gather" or not (call.sends and call.completed and call.ok):
            continue
        sent = np.concatenate([v for v in call.sent_values() if v is not None] or [np.zeros(0)])
        if sent.size != s:
            continue
        for step in range(1, STEPS + 1):
            mean = _padded(np.mean([local_gradient(q, step) for q in range(ws)], axis=0), ws)
            chunk = mean[call.rank * s:(call.rank + 1) * s]
            if _close(sent, chunk) or _close(sent, ws * chunk):
                return True
    return False


def _not_own_gradient(calls, ws: int, rank: int) -> bool:
    """The rank fed its reduce-scatters something, but never its own gradient of a step (nor that gradient
    / N): an average it computed itself, or one rank's sum sent for all."""
    sent = [np.concatenate([v for v in c.sent_values() if v is not None] or [np.zeros(0)])
            for c in calls if c.op == "reduce_scatter" and c.sends and c.completed and c.ok]
    sent = [v for v in sent if v.size == shard_size(ws) * ws]
    if not sent:
        return False
    own = [scale * local_gradient(rank, step) for step in range(1, STEPS + 1) for scale in (1.0, 1.0 / ws)]
    return not any(_close(v[:P], g) for v in sent for g in own)


def _unpadded(call, ws: int) -> bool:
    """A call that failed on sizes the padding would have made right: a tensor of the P parameters, or a
    shard of P // N (P not a multiple of N), or a list of pieces of unequal sizes (P split N ways)."""
    sizes = [int(d.get("numel") or 0) for d in [*call.inputs, *call.outputs] if isinstance(d, dict)]
    listed = [int(d.get("numel") or 0) for d in call.inputs if isinstance(d, dict)]
    return P in sizes or P // ws in sizes or (len(listed) == ws and len(set(listed)) > 1)


def diagnose(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """Causes named in the exercise's terms (no values: hidden checks may show them)."""
    calls = context.get("calls") or []
    value = context.get("value")
    shape = list(getattr(value, "shape", None) or [])
    s = shard_size(ws)
    out: list[tuple[str, dict]] = []
    if any(c.op == "all_reduce" for c in calls):
        out.append(("cause.forbidden_all_reduce", {"op": "all_reduce"}))
    if P % ws and any(c.op in ("reduce_scatter", "all_gather") and c.error and _unpadded(c, ws) for c in calls):
        out.append(("cause.padding", {}))
    if _gathered_gradients(calls, ws):
        out.append(("cause.gathered_gradients", {}))
    if _not_own_gradient(calls, ws, rank):
        out.append(("cause.not_own_gradient", {}))
    if context.get("outcome") != "wrong" or values is None:
        return out   # the numbers below explain wrong values only
    if quantity == "momentum":
        mine = slice(rank * s, (rank + 1) * s)
        if shape and shape[0] >= P:
            out.append(("cause.full_momentum", {}))
        elif P % ws and shape == [P // ws]:
            out.append(("cause.padding", {}))
        elif values.size == s and _close(values[:_real(rank, ws)], simulate(ws)[1][mine][:_real(rank, ws)]):
            out.append(("cause.padding_not_zero", {}))
        elif _close(values, simulate(ws, divide=False)[1][mine]):
            out.append(("cause.not_divided", {}))
        elif _close(values, simulate(ws, carry=False)[1][mine]):
            out.append(("cause.momentum_reset", {}))
        elif _close(values, simulate(ws, steps=1)[1][mine]):
            out.append(("cause.one_step", {}))
        elif _close(values, -simulate(ws)[1][mine]):
            out.append(("cause.sign_flipped", {}))
        elif _close(values, simulate(ws, reuse=True)[1][mine]):
            out.append(("cause.gradient_reused", {}))
    if quantity == "params":
        if shape == [s * ws] and shape != [P]:
            out.append(("cause.padding_kept", {}))
        elif values.size == P:
            mistakes = (("cause.not_divided", {"divide": False}), ("cause.momentum_reset", {"carry": False}),
                        ("cause.local_update", {"own_gradient": True}), ("cause.wrong_shard", {"base": "first"}),
                        ("cause.wrong_shard", {"base": "next"}), ("cause.wrong_shard", {"base": "previous"}),
                        ("cause.one_step", {"steps": 1}), ("cause.sign_flipped", {"sign": -1.0}),
                        ("cause.gradient_reused", {"reuse": True}))
            found = [key for key, knobs in mistakes if _close(values, simulate(ws, **knobs)[0])][:1]
            momentum = (context.get("others") or {}).get("momentum")
            if found == ["cause.momentum_reset"] and momentum is not None and momentum.size == s \
                    and _close(momentum, simulate(ws)[1][rank * s:(rank + 1) * s]):
                found = ["cause.update_with_gradient"]   # the momentum kept, then left out of the update
            out += [(key, {}) for key in found]
            tail = P // ws * ws
            if P % ws and _close(values[:tail], simulate(ws)[0][:tail]):
                out.append(("cause.padding", {}))
    unique = {key: params for key, params in reversed(out)}      # each cause once, the first kept
    return [(key, unique[key]) for key in dict.fromkeys(key for key, _ in out)]


# -- the chapter's claim, in the student's run ----------------------------------------------------------
def teach(run, ctx) -> list[tuple[str, dict]]:
    """Per rank, for one step: the bytes a ring sends for its reduce-scatter and its all-gather beside what
    one all-reduce of the same gradient sends; and the optimizer state it holds beside the unsharded count."""
    n = run.request.world_size
    ring = {op: OPS[op].ring(n) for op in ("reduce_scatter", "all_gather", "all_reduce")}
    lines = [("teach.header", {"ws": n})]
    for rec in run.ranks:
        first = {}
        for call in rec.calls:
            if call.completed and call.ok and call.op in ring:
                first.setdefault(call.op, call)
        if "reduce_scatter" in first and "all_gather" in first:
            size = first["reduce_scatter"].sent_bytes
            rs = int(ring["reduce_scatter"] * size)
            ag = int(ring["all_gather"] * first["all_gather"].delivered_bytes)
            lines.append(("teach.volume", {"rank": rec.rank, "rs": rs, "ag": ag, "total": rs + ag, "size": size,
                                           "all_reduce": int(ring["all_reduce"] * size)}))
        elif "all_reduce" in first:
            size = first["all_reduce"].sent_bytes
            lines.append(("teach.volume_all_reduce", {"rank": rec.rank, "size": size,
                                                      "all_reduce": int(ring["all_reduce"] * size)}))
        values = (rec.result or {}).get("values")
        momentum = values.get("momentum") if isinstance(values, dict) else None
        if isinstance(momentum, dict) and momentum.get("kind") == "tensor" and isinstance(momentum.get("shape"), list):
            held = int(np.prod(momentum["shape"]))
            lines.append(("teach.state_sharded" if held < P else "teach.state_full",
                          {"rank": rec.rank, "held": held, "full": P, "n": n}))
    return lines if len(lines) > 1 else []


MESSAGES = {
    "cause.forbidden_all_reduce": (
        "原因：{op} 发送的字节数与 reduce_scatter + all_gather 相同，但每个进程都拿到了完整的梯度，显存没有节省。"
        "请用 dist.reduce_scatter_single，让每个进程只收到自己那一片平均梯度。",
        "Cause: {op} sends as many bytes as reduce_scatter + all_gather, but every rank ends with the whole gradient: "
        "no memory is saved. Use dist.reduce_scatter_single, so that each rank receives only its shard of the averaged gradient."),
    "cause.full_momentum": (
        "原因：每个进程都保存了完整的优化器状态（动量有全部参数那么长）：这是 DDP，不是 ZeRO。"
        "每个进程只应保存自己那一片动量（ceil(P / world_size) 个元素）。",
        "Cause: every rank keeps the whole optimizer state (a momentum as long as all the parameters): this is DDP, not ZeRO. "
        "Each rank keeps the momentum of its own shard only (ceil(P / world_size) elements)."),
    "cause.padding": (
        "原因：参数个数不是 world_size 的整数倍时，要先用零把梯度和参数补齐到 shard * world_size 个元素"
        "（shard = ceil(P / world_size)），最后再去掉补齐的部分；否则 reduce_scatter_single / all_gather_single 的大小对不上，"
        "或者最后几个参数没有更新。",
        "Cause: when the number of parameters is not a multiple of world_size, pad the gradient and the parameters with zeros "
        "to shard * world_size elements (shard = ceil(P / world_size)) and drop the padding at the end; otherwise the sizes "
        "of reduce_scatter_single / all_gather_single do not match, or the last parameters are never updated."),
    "cause.padding_not_zero": (
        "原因：动量分片里补齐的部分不是零：请用 torch.zeros（不要用 torch.empty）补齐梯度，补齐部分的动量才会保持为零。",
        "Cause: the padding of the momentum shard is not zero: pad the gradient with torch.zeros (not torch.empty), so "
        "that the padding's momentum stays zero."),
    "cause.padding_kept": (
        "原因：params 还带着补齐的零：all_gather 之后请只保留前 P 个元素。",
        "Cause: params still holds the zero padding: keep only the first P elements after the all_gather."),
    "cause.not_divided": (
        "原因：reduce_scatter（SUM）得到的是各进程梯度之和，没有除以 world_size（或改用 ReduceOp.AVG）。",
        "Cause: reduce_scatter (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size "
        "(or use ReduceOp.AVG)."),
    "cause.update_with_gradient": (
        "原因：参数是用梯度更新的，而不是用动量：动量算对了，但更新没有用它（params -= LR * momentum）。",
        "Cause: the parameters were updated with the gradient, not the momentum: the momentum is right, but the "
        "update does not use it (params -= LR * momentum)."),
    "cause.momentum_reset": (
        "原因：动量每一步都从零重新开始了：动量缓冲区要在两步之间保留（momentum = MOMENTUM * momentum + grad）。",
        "Cause: the momentum restarted from zero at every step: keep the momentum buffer across the steps "
        "(momentum = MOMENTUM * momentum + grad)."),
    "cause.wrong_shard": (
        "原因：分片的位置不对：进程 r 的分片是第 r * shard 到 (r + 1) * shard 个元素，reduce_scatter 给它的正是这一片的梯度。",
        "Cause: a shard is at the wrong place: rank r's shard is elements r * shard to (r + 1) * shard, the slice whose "
        "gradient reduce_scatter delivers to it."),
    "cause.local_update": (
        "原因：每个进程用自己的本地梯度更新了全部参数再做 all_gather：应当只更新自己的分片，而且要用 reduce_scatter 得到的平均梯度。",
        "Cause: every rank updated the full parameters with its own local gradient, then gathered them: update only "
        "your shard, with the averaged gradient that reduce_scatter delivered."),
    "cause.one_step": (
        "原因：只做了一步更新：要做 STEPS 步（对每一步循环），每一步都 reduce_scatter、更新、all_gather。",
        "Cause: only one step was made: make STEPS steps (a loop over the steps), each one a reduce_scatter, an "
        "update and an all_gather."),
    "cause.sign_flipped": (
        "原因：更新的方向反了（每个更新量正好取了相反数）：梯度下降是 momentum = MOMENTUM * momentum + grad，"
        "param_shard = param_shard - LR * momentum（减号）。",
        "Cause: the update goes the wrong way (every step of it exactly negated): gradient descent is momentum = "
        "MOMENTUM * momentum + grad, then param_shard = param_shard - LR * momentum (a minus)."),
    "cause.gradient_reused": (
        "原因：第二步用的还是第一步的梯度：每一步都要重新取本步的梯度 local_gradient(rank, step)，再做 reduce_scatter。",
        "Cause: the second step used the first step's gradient again: take each step's own gradient, "
        "local_gradient(rank, step), and reduce_scatter it at that step."),
    "cause.not_own_gradient": (
        "原因：reduce_scatter 收到的不是本进程自己的梯度（local_gradient(rank, step)）：每个进程都应发送自己的梯度，"
        "由 reduce_scatter 求和；自己在本地算好平均值再发送，或者由一个进程替所有进程发送，都不是通信得到的结果。",
        "Cause: reduce_scatter was not fed this rank's own gradient (local_gradient(rank, step)): every rank sends its own "
        "gradient and reduce_scatter sums them; an average a rank computed itself, or one rank sending for all, is not "
        "what the communication computes."),
    "cause.gathered_gradients": (
        "原因：all_gather 收集的是梯度分片，然后每个进程在本地更新完整参数；ZeRO 收集的是更新后的参数分片。",
        "Cause: the all_gather collected gradient shards and every rank then updated the full parameters itself; ZeRO "
        "gathers the updated parameter shards instead."),
    "teach.header": (
        "ZeRO 的账（{ws} 个进程）：reduce-scatter + all-gather 与一次 all-reduce 发送的字节数相同，但每个进程只保存 1/N 的优化器状态。",
        "ZeRO's account ({ws} ranks): reduce-scatter + all-gather send as many bytes as one all-reduce, while each rank "
        "keeps 1/N of the optimizer state."),
    "teach.volume": (
        "  进程 {rank}，每一步：reduce_scatter 约发送 {rs} 字节，all_gather 约 {ag} 字节，共 {total} 字节"
        "（各为 (N-1)/N × S，S = {size} 字节）；一次 all_reduce 同样的梯度约发送 {all_reduce} 字节（2(N-1)/N × S）。",
        "  rank {rank}, each step: reduce_scatter sends about {rs} bytes and all_gather about {ag}, {total} in all "
        "((N-1)/N x S each, S = {size} bytes); one all_reduce of the same gradient sends about {all_reduce} (2(N-1)/N x S)."),
    "teach.volume_all_reduce": (
        "  进程 {rank}，每一步：all_reduce 约发送 {all_reduce} 字节（2(N-1)/N × S，S = {size} 字节）；"
        "reduce_scatter + all_gather 发送同样多的字节，却只让每个进程保存自己那一片。",
        "  rank {rank}, each step: all_reduce sends about {all_reduce} bytes (2(N-1)/N x S, S = {size} bytes); "
        "reduce_scatter + all_gather send as many, and leave each rank with its own shard only."),
    "teach.state_sharded": (
        "  进程 {rank}：保存 {held} 个动量元素（优化器状态），不分片时是 {full} 个：约 1/{n}。",
        "  rank {rank}: holds {held} momentum elements (optimizer state) where an unsharded optimizer holds {full}: about 1/{n}."),
    "teach.state_full": (
        "  进程 {rank}：保存 {held} 个动量元素，也就是全部 {full} 个：优化器状态没有分片。",
        "  rank {rank}: holds {held} momentum elements, all {full} of them: the optimizer state is not sharded."),
}


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.params", "value", 15,
              ("Reduce-Scatter 与 All-Gather 完成两步更新后的参数（{ws} 个进程）",
               "Parameters after two steps through reduce_scatter and all_gather ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="params", op="all_gather"),
        Check(f"ws{ws}.momentum", "value", 10,
              ("动量只保存本进程的分片（{ws} 个进程）", "Momentum holds this rank's shard only ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="momentum", op="reduce_scatter"),
        Check(f"ws{ws}.primitives", "uses", 5,
              ("通信原语：reduce_scatter 与 all_gather，不用 all_reduce（{ws} 个进程）",
               "Primitives: reduce_scatter and all_gather, no all_reduce ({ws} ranks)"),
              hidden=hidden, world_size=ws, forbid=("all_reduce",)),
    )


EXERCISE = Exercise(
    name="zero_sharded_step",
    title=("ZeRO 分片优化器：Reduce-Scatter 与 All-Gather", "A ZeRO-style sharded optimizer step: reduce-scatter and all-gather"),
    entry="run_worker",
    defines=("run_worker", "local_gradient", "initial_parameters"),
    quantities=QUANTITIES,
    checks=(
        Check("static.reduce_scatter", "static", 5,
              ("静态检查：run_worker 调用了 dist.reduce_scatter_single", "Static: run_worker calls dist.reduce_scatter_single"),
              op="reduce_scatter"),
        Check("static.all_gather", "static", 5,
              ("静态检查：run_worker 调用了 dist.all_gather_single", "Static: run_worker calls dist.all_gather_single"),
              op="all_gather"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    diagnose=diagnose,
    teach=teach,
    todo=(Todo(("TODO 1（reduce_scatter）", "TODO 1 (reduce_scatter)"), op="reduce_scatter"),
          Todo(("TODO 2（分片更新）", "TODO 2 (the shard update)")),
          Todo(("TODO 3（all_gather）", "TODO 3 (all_gather)"), op="all_gather")),
)
