"""Chapter 19, exercise 4: gradient accumulation with one all-reduce per step (DDP's no_sync()).

The chapter's "工程优化要点": "DDP 中使用 no_sync() 上下文管理器延迟梯度同步，在梯度累积阶段跳过 All-Reduce，
累积多个 micro-batch 后再同步，减少通信次数 ... 通信次数从 K 次降为 1 次". Every rank holds the same small
model (`make_model()`: a Linear(8, 4) without bias, one parameter tensor) and K = 4 micro-batches of its own
(`micro_batch(rank, k)`); the loss is `F.mse_loss`. run_worker(rank, world_size) leaves `grad`: the weight's
gradient accumulated over the K micro-batches and averaged over ranks and micro-batches (the gradient of
the mean of the K losses, averaged over the ranks), with ONE all-reduce for the step: DDP with
`no_sync()` around the first K - 1 backward passes, or the gradient accumulated by hand and all-reduced
once. A Linear(8, 4) has one parameter tensor of 32 float32 values: DDP puts it into one bucket and makes
exactly one all_reduce per synchronised backward pass (measured at the switch; DDP's other operations at
construction, an all_gather of shapes and broadcasts of the module's state, are not all-reduces).

What is proven (a perturbed run: every all-reduce carries secret deltas). The value must be a linear
combination of what the all-reduces delivered to this rank (and, if it likes, of its own micro-batch
gradients) that weighs every micro-batch of every rank 1 / (N K); each rank must have fed each all-reduce
a combination of its own micro-batch gradients and of what earlier all-reduces had delivered to it (DDP
without no_sync all-reduces the accumulated .grad, which holds the previous all-reduce's result). The
scales are whatever the code chose: 1/K in the loss, / (N K) after a sum, ReduceOp.AVG, DDP's division by
N before its all-reduce. (The engine's tracer takes scales 1, N and 1/N only: a sum divided by N K, or a
DDP gradient divided by K afterwards, would read as "not derived from the communication". So `grad` is
declared combine="own" with context=True: `_derived` below is that proof, from what the switch measured.)
Locally computed gradients carry no deltas; a gradient all-reduced by one rank for all, or an answer fed
into the all-reduce, is not a combination of the sender's own micro-batches. That combination is judged
relative to what was sent (exercise/linear.fit: within float32's rounding of the send's own size, no
fixed floor), so the answer laundered at a millionth of its size is not one either; `diagnose` names such
a send (cause.sent_not_own).

Points (100): static 10 (run_worker reaches all_reduce: DDP counts); for each world size 30: the
gradient 20 (right on every rank, derived from the all-reduce), one all-reduce 10 (exactly one all_reduce
completed on every rank for the step; it counts only where the gradient is right; all-reduces of fewer than
NUMEL // 4 elements, a loss or a count all-reduced for logging, are not counted while they carry fewer than
that in all). K all-reduces (one per micro-batch, or DDP without no_sync) earn the gradient's points and not the
count's. World size 2 is visible; 3 and 4 are hidden.
"""
from __future__ import annotations

import numpy as np

from grader.exercise import Alternatives, Check, Exercise, Quantity, Todo
from grader.exercise.linear import LinearRun, foreign_sends

IN_FEATURES, OUT_FEATURES = 8, 4
BATCH = 8          # samples per micro-batch
K = 4              # micro-batches per step
NUMEL = IN_FEATURES * OUT_FEATURES
VISIBLE, HIDDEN = (2,), (3, 4)


# -- the data the stub gives, as torch computes it (every number a multiple of a power of two: exact) -----
def initial_weight() -> np.ndarray:
    """((torch.arange(32).reshape(4, 8) * 5) % 7 - 3) / 8"""
    index = np.arange(NUMEL, dtype=np.float64).reshape(OUT_FEATURES, IN_FEATURES)
    return ((index * 5) % 7 - 3) / 8


def micro_batch(rank: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(BATCH * IN_FEATURES, dtype=np.float64).reshape(BATCH, IN_FEATURES)
    x = ((index * (rank + 2) + 5 * k + rank) % 11 - 5) / 4
    y = ((np.arange(BATCH * OUT_FEATURES, dtype=np.float64).reshape(BATCH, OUT_FEATURES) * (k + 1) + 3 * rank) % 9 - 4) / 2
    return x, y


def micro_gradient(rank: int, k: int) -> np.ndarray:
    """d mse_loss(x W^T, y) / dW for micro-batch k of this rank, flattened: 2 / (B OUT) (x W^T - y)^T x."""
    x, y = micro_batch(rank, k)
    residual = x @ initial_weight().T - y
    return ((2.0 / (BATCH * OUT_FEATURES)) * residual.T @ x).reshape(-1)


def own_mean(rank: int) -> np.ndarray:
    return np.mean([micro_gradient(rank, k) for k in range(K)], axis=0)


def expected_grad(rank: int, ws: int) -> np.ndarray:
    return np.mean([own_mean(q) for q in range(ws)], axis=0)


# -- provenance: the value as a linear combination of what the all-reduces delivered ---------------------
def _derived(rank: int, ws: int, ctx):
    """The gradient this rank can have made from what its all-reduces delivered (perturbed runs)."""
    key = ("grad_accum", ws)
    if key not in ctx.view.memo:
        ctx.view.memo[key] = LinearRun(ctx, lambda q: [micro_gradient(q, k) for k in range(K)], NUMEL)
    run = ctx.view.memo[key]
    values = run.values(rank, np.full(ws * K, 1.0 / (ws * K)))
    return Alternatives(*values) if values else np.full(NUMEL, np.nan)


GRAD = Quantity("grad", local=_derived, context=True, combine="own", through=("all_reduce",),
                expected=expected_grad, shape=lambda ws: [OUT_FEATURES, IN_FEATURES],
                label=("累积并平均后的梯度 grad", "the accumulated, averaged gradient grad"))


# -- the exercise's own causes, from the values alone ----------------------------------------------------
def _close(values, expected) -> bool:
    return values is not None and values.shape == expected.shape and bool(np.allclose(values, expected, rtol=1e-4, atol=1e-6))


def mistakes(rank: int, ws: int) -> list[tuple[str, np.ndarray]]:
    """What a rank ends with after each mistake, with its cause (no two alike: tests/test_grad_accum_no_sync.py)."""
    right = expected_grad(rank, ws)
    mean_of = lambda k: np.mean([micro_gradient(q, k) for q in range(ws)], axis=0)   # noqa: E731
    return [
        ("cause.not_divided_by_k", K * right),
        ("cause.not_divided_by_ws", ws * right),
        ("cause.not_averaged", ws * K * right),
        ("cause.divided_by_ws_twice", right / ws),
        ("cause.divided_by_k_twice", right / K),
        ("cause.last_micro_batch_only", mean_of(K - 1) / K),
        ("cause.last_micro_batch_only", mean_of(K - 1)),
        ("cause.never_synced", own_mean(rank)),
        ("cause.never_synced", K * own_mean(rank)),
        ("cause.synced_too_early", (mean_of(0) + sum(micro_gradient(rank, k) for k in range(1, K))) / K),
        ("cause.synced_too_early", mean_of(0) + sum(micro_gradient(rank, k) for k in range(1, K))),
    ]


def diagnose(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """Causes named in the exercise's terms (no values: hidden checks may show them). First what the rank's
    all_reduce carried, when it is not the rank's own data as exercise/linear.fit reads it (at any scale,
    within its dtype's rounding, relative to what was sent): the value, right or wrong, was then not made
    of the ranks' data; then what the value itself shows."""
    sent = [("cause.sent_not_own", {})] if context.get("outcome") in ("wrong", "not_collective") and \
        foreign_sends(context.get("calls") or [], [micro_gradient(rank, k) for k in range(K)], NUMEL) else []
    return sent + [cause for cause in _value_causes(quantity, values, ws, rank, context) if cause not in sent]


def _value_causes(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """What a wrong value itself shows, in the exercise's terms."""
    if context.get("outcome") != "wrong" or values is None or values.size != NUMEL:
        return []
    found = list(dict.fromkeys(key for key, wrong in mistakes(rank, ws) if _close(values, wrong)))
    calls = context.get("calls") or []
    if len(found) > 1:      # N == K: a factor K and a factor N look alike; what the rank sent tells them apart
        found = _by_what_was_sent(found, rank, ws, calls)
    return [(_where_divided(key, calls), {}) for key in found]


def _where_divided(key: str, calls) -> str:
    """"Divided by world_size twice" in the words of what divided first: DDP (its broadcasts of the module's
    state come first), ReduceOp.AVG, or the code itself (a SUM)."""
    if key != "cause.divided_by_ws_twice" or any(c.op == "broadcast" for c in calls):
        return key
    reduces = {getattr(c, "reduce", None) for c in calls if c.op == "all_reduce"}
    if "AVG" in reduces:
        return "cause.averaged_then_divided"
    return "cause.summed_divided_twice" if reduces else key


_BY_K = {"cause.not_divided_by_k": "cause.not_divided_by_ws", "cause.divided_by_k_twice": "cause.divided_by_ws_twice"}


def _by_what_was_sent(found: list[str], rank: int, ws: int, calls) -> list[str]:
    """Of a cause about K and its twin about world_size, the one the rank's all-reduce shows. DDP (its
    broadcasts of the module's state come first) divides by world_size itself: a gradient N = K times too
    large is K's; one divided once too often could be either (both stay). By hand, the rank sent its own
    mean (K divided once), its sum (K never divided) or its mean / K (K twice)."""
    ddp = any(c.op == "broadcast" for c in calls)
    sent = [np.concatenate([v for v in c.sent_values() if v is not None] or [np.zeros(0)])
            for c in calls if c.op == "all_reduce" and c.sends]
    mean = own_mean(rank)
    factor = None
    if len(sent) == 1 and sent[0].size == NUMEL:
        factor = next((f for f in (1.0, float(K), 1.0 / K) if _close(sent[0], f * mean)), None)
    if not ddp and factor == 1.0 / K and {"cause.divided_by_k_twice", "cause.divided_by_ws_twice"} <= set(found):
        # its mean / K sent (and averaged): at N = K that is also its mean / N, divided again after a sum
        return ["cause.divided_once_too_often"] + [k for k in found if k not in _BY_K.values() and k not in _BY_K]
    keep = []
    for key in found:
        k_twin = _BY_K.get(key)                                          # key is about K
        ws_twin = next((k for k, w in _BY_K.items() if w == key), None)  # key is about world_size
        if k_twin in found:
            if (ddp and key == "cause.not_divided_by_k") or (ddp and key == "cause.divided_by_k_twice") \
                    or (not ddp and factor in (float(K), 1.0 / K)):
                keep.append(key)
        elif ws_twin in found:
            if (ddp and key == "cause.divided_by_ws_twice") or (not ddp and factor == 1.0):
                keep.append(key)
        else:
            keep.append(key)
    return keep or found


# -- the chapter's claim, in the student's run -----------------------------------------------------------
def teach(run, ctx) -> list[tuple[str, dict]]:
    """Per rank: the all-reduces of the step and their bytes, beside what an all-reduce per micro-batch sends."""
    n = run.request.world_size
    lines = [("teach.header", {"ws": n, "k": K})]
    for rec in run.ranks:
        calls = [c for c in rec.calls if c.op == "all_reduce" and c.completed and c.ok]
        if not calls:
            continue
        size = sum(c.sent_bytes for c in calls)
        # one sync of the whole gradient, in the dtype it travelled in (buckets: their elements add up to it)
        each = NUMEL * calls[0].sent_bytes // max(1, calls[0].sent_numel)
        lines.append(("teach.rank", {"rank": rec.rank, "count": len(calls), "bytes": size, "k": K, "every": K * each}))
    return lines if len(lines) > 1 else []


MESSAGES = {
    "cause.not_divided_by_k": (
        "原因：梯度是 K 个 micro-batch 梯度之和，没有除以 K：每个 micro-batch 的 loss 先除以 K（loss / K）再 backward，"
        "或者在 all_reduce 之后把梯度再除以 K。",
        "Cause: the gradient is the sum of the K micro-batch gradients, not divided by K: divide each micro-batch's loss by K "
        "(loss / K) before backward, or divide the gradient by K after the all_reduce."),
    "cause.not_divided_by_ws": (
        "原因：all_reduce（SUM）得到的是各进程梯度之和，没有除以 world_size（或者改用 ReduceOp.AVG）。",
        "Cause: all_reduce (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size "
        "(or use ReduceOp.AVG)."),
    "cause.not_averaged": (
        "原因：梯度既没有除以 K（micro-batch 个数），也没有除以 world_size：平均要对进程和 micro-batch 两个方向都做。",
        "Cause: the gradient was divided neither by K (the micro-batches) nor by world_size: the average runs over both "
        "the ranks and the micro-batches."),
    "cause.divided_by_ws_twice": (
        "原因：梯度被 world_size 除了两次：DDP 在 all_reduce 之前已经把梯度除以 world_size，不要再除一次。",
        "Cause: the gradient was divided by world_size twice: DDP already divides the gradient by world_size before "
        "its all_reduce; do not divide again."),
    "cause.averaged_then_divided": (
        "原因：梯度被 world_size 除了两次：ReduceOp.AVG 的 all_reduce 已经求了平均（除以 world_size），之后不要再除一次。",
        "Cause: the gradient was divided by world_size twice: an all_reduce with ReduceOp.AVG already averages (divides "
        "by world_size); do not divide again afterwards."),
    "cause.summed_divided_twice": (
        "原因：梯度被 world_size 除了两次：all_reduce（SUM）得到 world_size 个梯度之和，只需要除以 world_size 一次。",
        "Cause: the gradient was divided by world_size twice: all_reduce (SUM) delivers the sum of world_size "
        "gradients, which needs one division by world_size."),
    "cause.divided_once_too_often": (
        "原因：梯度多除了一次：要么被 K 除了两次（loss 已经除以 K），要么被 world_size 除了两次（平均已经除以 world_size）。"
        "这里从数值上分不出是哪一种，请检查你的代码。",
        "Cause: the gradient was divided once too often: by K twice (the loss is already divided by K), or by "
        "world_size twice (the average already divides by it). The numbers here cannot tell which: check your code."),
    "cause.divided_by_k_twice": (
        "原因：梯度被 K 除了两次：loss 已经除以 K 了，累积后的梯度不要再除以 K。",
        "Cause: the gradient was divided by K twice: the loss is already divided by K, so do not divide the "
        "accumulated gradient by K again."),
    "cause.last_micro_batch_only": (
        "原因：只剩下最后一个 micro-batch 的梯度：在 K 个 micro-batch 之间调用了 zero_grad()（或者重新创建了模型），"
        "前面的梯度被清掉了。zero_grad() 只在一步开始时调用一次。",
        "Cause: only the last micro-batch's gradient is left: zero_grad() ran between the K micro-batches (or the model "
        "was made anew), which wiped the earlier gradients. Call zero_grad() once, at the start of the step."),
    "cause.never_synced": (
        "原因：梯度只是本进程自己累积的梯度，没有和其他进程同步：K 个 micro-batch 全都在 no_sync() 里，"
        "或者 all_reduce 的结果没有用上。最后一个 micro-batch 的 backward 要在 no_sync() 之外进行。",
        "Cause: the gradient is this rank's own accumulated gradient, never synchronised with the other ranks: all K "
        "micro-batches ran inside no_sync(), or the all_reduce's result went unused. Run the last micro-batch's "
        "backward outside no_sync()."),
    "cause.synced_too_early": (
        "原因：all_reduce 发生在第一个 micro-batch 上，后面的 micro-batch 只累积了本进程自己的梯度："
        "no_sync() 要包住前 K - 1 个 micro-batch，最后一个 micro-batch 的 backward 才做同步。",
        "Cause: the all_reduce ran at the first micro-batch, and the later micro-batches added only this rank's own "
        "gradients: no_sync() wraps the first K - 1 micro-batches, and the last micro-batch's backward synchronises."),
    "cause.sent_not_own": (
        "原因：进程在 all_reduce 中发送的不是它自己的 micro-batch 梯度之和（可以乘以任意比例，也可以加上之前的 all_reduce 传来的结果）："
        "除去舍入误差，发送的数据里还有别的东西，例如在本地算好的答案。每个进程都必须把自己累积的梯度交给 all_reduce，再用它传回的结果。",
        "Cause: what a rank sent in all_reduce is not its own micro-batch gradients added up (scaled by anything, plus what "
        "earlier all-reduces delivered to it, if it likes): beyond rounding, it holds something else, such as an answer "
        "computed locally. Every rank must hand its own accumulated gradient to the all_reduce, and use what the all_reduce delivers."),
    "teach.header": (
        "梯度累积的账（{ws} 个进程，K = {k} 个 micro-batch）：每一步只需要一次 all_reduce，通信次数和字节数都降为每个 micro-batch "
        "都同步时的 1/K。",
        "Gradient accumulation's account ({ws} ranks, K = {k} micro-batches): one all_reduce a step, so the number of "
        "communications and their bytes drop to 1/K of syncing every micro-batch."),
    "teach.rank": (
        "  进程 {rank}：这一步完成了 {count} 次 all_reduce，共发送 {bytes} 字节；每个 micro-batch 都同步（{k} 次）要发送 {every} 字节。",
        "  rank {rank}: {count} all_reduce this step, {bytes} bytes sent; syncing every micro-batch ({k} times) sends {every} bytes."),
}


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.grad", "value", 20,
              ("累积 K 个 micro-batch 后平均的梯度（{ws} 个进程）",
               "The gradient accumulated over K micro-batches and averaged ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="grad", op="all_reduce"),
        Check(f"ws{ws}.one_all_reduce", "counts", 10,
              ("每一步只做一次 all_reduce（{ws} 个进程）", "One all_reduce for the step ({ws} ranks)"),
              hidden=hidden, world_size=ws, op="all_reduce", quantity="grad",
              params={"count": 1, "per": "rank", "least": NUMEL // 4}),
    )


EXERCISE = Exercise(
    name="grad_accum_no_sync",
    title=("梯度累积：K 个 micro-batch 只做一次 All-Reduce（no_sync）",
           "Gradient accumulation: one all-reduce for K micro-batches (no_sync)"),
    entry="run_worker",
    defines=("run_worker", "make_model", "micro_batch"),
    files=("grad_accum_no_sync", "grad_accum", "no_sync"),
    quantities=(GRAD,),
    checks=(
        Check("static.all_reduce", "static", 10,
              ("静态检查：run_worker 用到了 all_reduce（DDP 也算）", "Static: run_worker reaches all_reduce (DDP counts)"),
              op="all_reduce"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    diagnose=diagnose,
    teach=teach,
    todo=(Todo(("TODO 1（累积 K 个 micro-batch 的梯度，不同步）", "TODO 1 (accumulate K micro-batch gradients without syncing)")),
          Todo(("TODO 2（一次 all_reduce，求平均）", "TODO 2 (one all_reduce, then the average)"), op="all_reduce")),
)
