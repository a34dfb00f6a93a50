"""Chapter 19, exercise 5: mixed-precision communication: the gradient all-reduced in float16.

The chapter's "工程优化要点": "混合精度通信: 梯度可以用 fp16 传输，通信量减少 50%。... All-Reduce 前将 fp32 梯度转为
fp16，接收后转回 fp32 更新权重。注意：权重更新必须用 fp32，否则累积误差会导致训练不稳定". Every rank holds the same
model (`make_model()`: a Linear(16, 8) without bias, float32 master weights near 1) and a batch of its own
(`batch(rank)`). run_worker(rank, world_size) computes its float32 gradient, casts it to float16 (or
bfloat16) for ONE all-reduce, averages it, turns it back into float32 and makes one SGD step in float32
(weights -= LR * grad). It leaves:
  grad     the averaged gradient, float32, shape (8, 16): within float16's tolerance of the float32 mean
           (the gradient data are not exact in float16, so a float16 answer and a float32 one differ, and
           only the volume check tells them apart: both pass the value check);
  weights  the weights after the step, float32, compared with float32's tolerance: an update of about
           1e-4 on weights near 1 is below float16's resolution there (2^-10), so weights kept or updated
           in float16 lose it ("权重更新必须用 fp32").

What is proven (perturbed runs: every all-reduce carries secret deltas): grad is a combination of what
the all-reduces delivered to this rank that weighs every rank's gradient 1/N, each rank having sent its
own gradient scaled by anything (1/N, a loss scale, a GradScaler's, in any dtype); weights are the
initial weights minus LR times such a combination. Both are declared combine="own", context=True, read
from exercise/linear.LinearRun (the engine's tracer tries the scales 1, N and 1/N only: a loss scale of
1024, or LR x 1/N, is none of them). "Its own gradient" is judged relative to what was sent
(exercise/linear.fit: within the dtype's rounding of the send's own size, no fixed floor): a send that is
mostly something else, however small, proves nothing, and `diagnose` names it (cause.sent_not_own). Then
the volume check: every all_reduce carried float16 or bfloat16 and a rank sent at most 128 x 2 bytes in
them (half of float32's 512).

Points (100): static 10 (run_worker reaches all_reduce: DDP counts); for each world size 30: the
gradient 10, the weights 10, the volume 10 (it counts only where the gradient is right; all-reduces of fewer
than NUMEL // 4 elements, a loss all-reduced for logging, are left out while they carry fewer than that in
all). World size 2 is visible; 3 and 4 are hidden. All-reducing in float32 is right but not compressed: the
value points, not the volume's.
"""
from __future__ import annotations

import numpy as np

from grader.exercise import Alternatives, Check, Exercise, Quantity, Todo
from grader.exercise.linear import LinearRun, foreign_sends

IN_FEATURES, OUT_FEATURES = 16, 8
BATCH = 16
LR = 1e-3
NUMEL = IN_FEATURES * OUT_FEATURES
HALF = ("torch.float16", "torch.bfloat16")
VISIBLE, HIDDEN = (2,), (3, 4)
f32 = np.float32


# -- the data the stub gives, as torch computes it (float32) -------------------------------------------
def initial_weights() -> np.ndarray:
    """1 + 0.5 * torch.sin(torch.arange(128).reshape(8, 16) * 0.7)"""
    index = np.arange(NUMEL, dtype=f32).reshape(OUT_FEATURES, IN_FEATURES)
    return (f32(1) + f32(0.5) * np.sin(index * f32(0.7))).astype(np.float64)


def batch(rank: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(BATCH * IN_FEATURES, dtype=f32).reshape(BATCH, IN_FEATURES)
    x = np.sin(index * f32(rank + 1) * f32(0.37))
    j = np.arange(BATCH * OUT_FEATURES, dtype=f32).reshape(BATCH, OUT_FEATURES)
    y = f32(16) * np.cos(j * f32(0.23) + f32(rank))
    return x.astype(np.float64), y.astype(np.float64)


def gradient(rank: int) -> np.ndarray:
    """d mse_loss(x W^T, y) / dW for this rank's batch, flattened."""
    x, y = batch(rank)
    residual = x @ initial_weights().T - y
    return ((2.0 / (BATCH * OUT_FEATURES)) * residual.T @ x).reshape(-1)


def mean_gradient(ws: int) -> np.ndarray:
    return np.mean([gradient(q) for q in range(ws)], axis=0)


def expected_weights(rank: int, ws: int) -> np.ndarray:
    return initial_weights().reshape(-1) - LR * mean_gradient(ws)


# -- provenance of the weights: the initial weights minus LR x what the all-reduces delivered ------------
def _own_grads(rank: int, ws: int, ctx) -> list[np.ndarray]:
    """The averaged gradients this rank can have made from what its all-reduces delivered (perturbed runs),
    whatever each rank scaled its gradient by before sending (1/N, a loss scale of 1024, a GradScaler's)."""
    key = ("fp16_allreduce", ws)
    if key not in ctx.view.memo:
        ctx.view.memo[key] = LinearRun(ctx, lambda q: [gradient(q)], NUMEL)
    return ctx.view.memo[key].values(rank, np.full(ws, 1.0 / ws))


def _own_grad(rank: int, ws: int, ctx):
    grads = _own_grads(rank, ws, ctx)
    return Alternatives(*grads) if grads else np.full(NUMEL, np.nan)


def _own_weights(rank: int, ws: int, ctx):
    """The weights this rank can have made from what its all-reduces delivered (perturbed runs)."""
    grads = _own_grads(rank, ws, ctx)
    start = initial_weights().reshape(-1)
    return Alternatives(*[start - LR * g for g in grads]) if grads else np.full(NUMEL, np.nan)


SHAPE = lambda ws: [OUT_FEATURES, IN_FEATURES]   # noqa: E731
QUANTITIES = (
    # context=True although local reads nothing of the run: the engine's generic "a rank did not send its own
    # data" cause (verify/diagnose.contribution_causes) compares with float64's tolerance, so it would name every
    # honest float16 contribution; it skips quantities declared with context=True
    Quantity("grad", local=_own_grad, context=True, combine="own", through=("all_reduce",),
             expected=lambda rank, ws: mean_gradient(ws), shape=SHAPE, tolerance="torch.float16",
             label=("平均梯度 grad", "the averaged gradient grad")),
    Quantity("weights", local=_own_weights, context=True, combine="own", through=("all_reduce",),
             expected=expected_weights, shape=SHAPE, tolerance="torch.float32",
             label=("更新后的权重 weights", "the updated weights")),
)


# -- the exercise's own causes, from the values alone ----------------------------------------------------
def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float64)


def _near(values, expected, tolerance: str = "torch.float32") -> bool:
    if values is None or values.shape != expected.shape:
        return False
    atol, rtol = (2e-2, 1e-2) if tolerance in HALF else (1e-6, 2e-5)
    return bool(np.all(np.abs(values - expected) <= atol + rtol * np.abs(expected)))


def diagnose(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """Causes named in the exercise's terms (no values: hidden checks may show them). First what the rank's
    all_reduce carried, when it is not the rank's own data as exercise/linear.fit reads it (at any scale,
    within its dtype's rounding, relative to what was sent): the value, right or wrong, was then not made
    of the ranks' data; then what the value itself shows."""
    sent = [("cause.sent_not_own", {})] if context.get("outcome") in ("wrong", "not_collective") and \
        foreign_sends(context.get("calls") or [], [gradient(rank)], NUMEL) else []
    return sent + [cause for cause in _value_causes(quantity, values, ws, rank, context) if cause not in sent]


def _value_causes(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """What a wrong value itself shows, in the exercise's terms."""
    value = context.get("value")
    if context.get("outcome") != "wrong" or values is None or values.size != NUMEL:
        return []
    mean, own = mean_gradient(ws), gradient(rank)
    start = initial_weights().reshape(-1)
    # the rank's own gradient (divided or not) after an all_reduce that completed: its result was not read
    reduced = any(c.op == "all_reduce" and c.completed and c.ok for c in context.get("calls") or ())
    if quantity == "grad":
        for key, wrong in (("cause.not_divided", ws * mean), ("cause.divided_twice", mean / ws)):
            if _near(values, wrong, "torch.float16"):
                return [(key, {})]
        if reduced and any(_near(values, wrong, "torch.float16") for wrong in (own / ws, own)):
            return [("cause.half_copy_dropped", {})]
        return []
    if getattr(value, "dtype", "") in HALF:
        return [("cause.weights_in_half", {})]
    steps = {"cause.weights_in_half": (_half(_half(start) - _half(LR * mean)), _half(start - LR * mean)),
             "cause.not_divided": (start - LR * ws * mean,), "cause.divided_twice": (start - LR * mean / ws,),
             "cause.local_gradient": (start - LR * own,), "cause.no_update": (start,)}
    if reduced:
        steps["cause.half_copy_dropped"] = (start - LR * own / ws,)
    for key, candidates in steps.items():
        if any(np.allclose(values, c, rtol=0, atol=2e-6) for c in candidates):
            return [(key, {})]
    if np.allclose(values, _half(values), rtol=0, atol=0):   # every value a float16 number: float16 arithmetic
        return [("cause.weights_in_half", {})]
    return []


# -- the chapter's claim, in the student's run -----------------------------------------------------------
def teach(run, ctx) -> list[tuple[str, dict]]:
    """Per rank: the bytes its all-reduces sent and their dtypes, beside float32's."""
    lines = [("teach.header", {"ws": run.request.world_size})]
    for rec in run.ranks:
        calls = [c for c in rec.calls if c.op == "all_reduce" and c.completed and c.ok and c.sends]
        if not calls:
            continue
        sent = sum(c.sent_bytes for c in calls)
        dtypes = sorted({d for c in calls for d in c.sent_dtypes})
        lines.append(("teach.rank", {"rank": rec.rank, "sent": sent, "dtypes": dtypes, "fp32": 4 * sum(c.sent_numel for c in calls)}))
    return lines if len(lines) > 1 else []


MESSAGES = {
    "cause.not_divided": (
        "原因：all_reduce（SUM）得到的是各进程梯度之和，没有除以 world_size（或者改用 ReduceOp.AVG）。",
        "Cause: all_reduce (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size "
        "(or use ReduceOp.AVG)."),
    "cause.divided_twice": (
        "原因：梯度被 world_size 除了两次：先除以 world_size 再用 ReduceOp.AVG（或 DDP 的压缩 hook 已经除过），只需要一次。",
        "Cause: the gradient was divided by world_size twice: divided before a ReduceOp.AVG (or after DDP's compression "
        "hook, which divides already); once is enough."),
    "cause.weights_in_half": (
        "原因：权重是用 float16 保存或更新的：LR × grad 大约只有 1e-4，比 float16 在 1 附近的精度（2^-10）还小，更新被舍入掉了。"
        "只有通信用 float16：收到的梯度先转回 float32，再用 float32 的权重更新（weights 保持 float32）。",
        "Cause: the weights were kept or updated in float16: LR x grad is about 1e-4, below float16's resolution near 1 "
        "(2^-10), so the update is rounded away. Only the communication is float16: turn the received gradient back "
        "into float32 and update float32 weights (weights stay float32)."),
    "cause.local_gradient": (
        "原因：权重是用本进程自己的梯度更新的，不是 all_reduce 之后的平均梯度：先同步梯度，再更新权重。",
        "Cause: the weights were updated with this rank's own gradient, not the averaged one from the all_reduce: "
        "synchronise the gradient first, then update the weights."),
    "cause.half_copy_dropped": (
        "原因：梯度还是本进程自己的梯度：all_reduce 的结果没有被用到。all_reduce 原地修改传给它的张量，而 .half() 会生成一个新的张量："
        "dist.all_reduce(grad.half()) 求和的是这个临时副本，结果随之丢掉。先保存它：half = grad.half(); dist.all_reduce(half); "
        "grad = half.float() / world_size。",
        "Cause: the gradient is still this rank's own: what the all_reduce delivered was never read. all_reduce changes the tensor "
        "it is given in place, and .half() makes a new one: dist.all_reduce(grad.half()) sums that temporary copy, and the "
        "result goes with it. Keep it: half = grad.half(); dist.all_reduce(half); grad = half.float() / world_size."),
    "cause.sent_not_own": (
        "原因：进程在 all_reduce 中发送的不是它自己的梯度：除去传输所用数据类型的舍入误差，发送的数据里还有别的东西"
        "（梯度可以先乘以任意比例，例如除以 world_size 或乘以损失缩放系数）。每个进程都必须把自己的梯度交给 all_reduce，再用它传回的结果。",
        "Cause: what a rank sent in all_reduce is not its own gradient: beyond the rounding of the dtype it travelled in, "
        "it holds something else (the gradient may be scaled by anything first: divided by world_size, multiplied by a "
        "loss scale). Every rank must hand its own gradient to the all_reduce, and use what the all_reduce delivers."),
    "cause.no_update": (
        "原因：权重还是初始值：没有做 weights -= LR * grad 这一步（或者更新的是一个副本）。",
        "Cause: the weights are still the initial ones: the step weights -= LR * grad did not happen (or it updated a copy)."),
    "teach.header": (
        "混合精度通信的账（{ws} 个进程）：float16 / bfloat16 每个元素 2 字节，float32 是 4 字节：梯度用半精度传输，通信量减半。",
        "Mixed-precision communication's account ({ws} ranks): float16 / bfloat16 take 2 bytes an element and float32 4: "
        "a gradient sent in half precision halves the traffic."),
    "teach.rank": (
        "  进程 {rank}：all_reduce 发送了 {sent} 字节（{dtypes}）；同样的元素用 float32 是 {fp32} 字节。",
        "  rank {rank}: all_reduce sent {sent} bytes ({dtypes}); the same elements in float32 are {fp32} bytes."),
}


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.grad", "value", 10,
              ("半精度 all_reduce 后的平均梯度（float32，{ws} 个进程）",
               "The gradient averaged through a half-precision all_reduce (float32, {ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="grad", op="all_reduce"),
        Check(f"ws{ws}.weights", "value", 10,
              ("用 float32 更新的权重（{ws} 个进程）", "The weights updated in float32 ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="weights", op="all_reduce"),
        Check(f"ws{ws}.volume", "volume", 10,
              ("all_reduce 传送 float16 / bfloat16：通信量减半（{ws} 个进程）",
               "The all_reduce carries float16 / bfloat16: half the bytes ({ws} ranks)"),
              hidden=hidden, world_size=ws, op="all_reduce", quantity="grad", params={"dtypes": HALF, "least": NUMEL // 4}),
    )


EXERCISE = Exercise(
    name="fp16_allreduce",
    title=("混合精度通信：用 float16 做 All-Reduce，用 float32 更新权重",
           "Mixed-precision communication: all-reduce in float16, update the weights in float32"),
    entry="run_worker",
    defines=("run_worker", "make_model", "batch"),
    files=("fp16_allreduce", "fp16_all_reduce", "mixed_precision"),
    quantities=QUANTITIES,
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
    todo=(Todo(("TODO 1（转成 float16，all_reduce，求平均）", "TODO 1 (cast to float16, all_reduce, average)"), op="all_reduce"),
          Todo(("TODO 2（转回 float32，更新权重）", "TODO 2 (back to float32, update the weights)"))),
)
