"""Chapter 19, exercise 5: mixed-precision communication: the gradient all-reduced in float16.

The chapter's "混合精度通信: 梯度可以用 fp16 传输，通信量减少 50% ... 权重更新必须用 fp32". Every rank holds the same
Linear(16, 8) without bias (`make_model()`, float32 weights near 1) and a batch of its own (`batch(rank)`).
run_worker computes its float32 gradient, casts it to float16 (or bfloat16) for ONE all-reduce, averages it,
turns it back into float32 and makes one SGD step in float32. It leaves `grad` (the averaged gradient, within
float16's tolerance) and `weights` (after the step, within float32's: an update of 1e-4 on weights near 1 is
below float16's resolution there). Both are Linear quantities, proven from what the all-reduces delivered,
whatever multiple each rank sent (1 / N, a loss scale, a GradScaler's, in any dtype).
Points (100): static 10; per world size 30: the gradient 10, the weights 10, the volume 10 (float16 or
bfloat16, half of float32's bytes; for a right gradient). World size 2 is visible; 3 and 4 are hidden.
"""
import numpy as np

from grader.exercise import Check, Dtype, Exercise, Linear, Mistake, NotOwn, Quantity, Ran, Representable, Teach, Todo, Wrong

IN_FEATURES, OUT_FEATURES, BATCH, LR = 16, 8, 16, 1e-3
NUMEL = IN_FEATURES * OUT_FEATURES
HALF = ("torch.float16", "torch.bfloat16")
VISIBLE, HIDDEN = (2,), (3, 4)
f32 = np.float32


def initial_weights(ws=None):   # 1 + 0.5 * torch.sin(torch.arange(128).reshape(8, 16) * 0.7), flattened
    return (f32(1) + f32(0.5) * np.sin(np.arange(NUMEL, dtype=f32) * f32(0.7))).astype(np.float64)


def batch(rank):
    x = np.sin(np.arange(BATCH * IN_FEATURES, dtype=f32).reshape(BATCH, IN_FEATURES) * f32(rank + 1) * f32(0.37))
    y = f32(16) * np.cos(np.arange(BATCH * OUT_FEATURES, dtype=f32).reshape(BATCH, OUT_FEATURES) * f32(0.23) + f32(rank))
    return x.astype(np.float64), y.astype(np.float64)


def gradient(rank, ws=None):   # d mse_loss(x W^T, y) / dW for this rank's batch, flattened
    x, y = batch(rank)
    return ((2.0 / (BATCH * OUT_FEATURES)) * (x @ initial_weights().reshape(OUT_FEATURES, IN_FEATURES).T - y).T @ x).reshape(-1)


def mean(ws):
    return np.mean([gradient(q) for q in range(ws)], axis=0)


def half(values):
    return values.astype(np.float16).astype(np.float64)


OWN = dict(own=lambda rank, ws: [gradient(rank)], weight=lambda ws: 1.0 / ws)
SHAPE = lambda ws: [OUT_FEATURES, IN_FEATURES]   # noqa: E731
QUANTITIES = (
    Quantity("grad", combine=Linear(**OWN), through=("all_reduce",), shape=SHAPE, tolerance="torch.float16",
             dtypes=("torch.float32",),   # TODO 2: the averaged gradient back in float32
             label=("平均梯度 grad", "the averaged gradient grad")),
    Quantity("weights", combine=Linear(**OWN, start=initial_weights, factor=-LR), through=("all_reduce",), shape=SHAPE,
             tolerance="torch.float32", label=("更新后的权重 weights", "the updated weights")),
)
START, REDUCED = initial_weights(), Ran("all_reduce")
MISTAKES = (
    Mistake("cause.sent_not_own", when=(NotOwn("all_reduce"),)),
    Mistake("cause.not_divided", "grad", value=lambda r, ws: ws * mean(ws), tolerance="torch.float16"),
    Mistake("cause.divided_twice", "grad", value=lambda r, ws: mean(ws) / ws, tolerance="torch.float16"),
    Mistake("cause.half_copy_dropped", "grad", value=lambda r, ws: gradient(r) / ws, when=(REDUCED,), tolerance="torch.float16"),
    Mistake("cause.half_copy_dropped", "grad", value=gradient, when=(REDUCED,), tolerance="torch.float16"),
    Mistake("cause.weights_in_half", "weights", when=(Dtype(*HALF),)),
    Mistake("cause.weights_in_half", "weights", value=lambda r, ws: half(half(START) - half(LR * mean(ws)))),
    Mistake("cause.weights_in_half", "weights", value=lambda r, ws: half(START - LR * mean(ws))),
    # (where grad is right, the weights' error is in the update itself: two steps look like a sum at N = 2)
    Mistake("cause.not_divided", "weights", value=lambda r, ws: START - LR * ws * mean(ws), when=(Wrong("grad"),)),
    Mistake("cause.divided_twice", "weights", value=lambda r, ws: START - LR * mean(ws) / ws, when=(Wrong("grad"),)),
    Mistake("cause.local_gradient", "weights", value=lambda r, ws: START - LR * gradient(r)),
    Mistake("cause.no_update", "weights", value=lambda r, ws: START),
    Mistake("cause.half_copy_dropped", "weights", value=lambda r, ws: START - LR * gradient(r) / ws, when=(REDUCED,)),
    Mistake("cause.weights_in_half", "weights", when=(Representable("torch.float16"),)),
    Mistake("cause.half_grad_assigned", error=r"assign a gradient with dtype 'c10::(Half|BFloat16)' to a tensor with grad_dtype 'Float'"),
)
TEACH = (
    Teach("teach.header", per="run"),
    Teach("teach.rank", when=(REDUCED,), say=lambda f: {"sent": f.bytes("all_reduce"), "dtypes": f.dtypes("all_reduce"),
                                                       "fp32": 4 * f.elements("all_reduce")}),
)

MESSAGES = {
    "cause.half_grad_assigned": ("原因：把 float16 的梯度赋给了 float32 参数的 .grad，torch 不允许（.grad 的 dtype 要和参数一样）：先在 float16 里 all_reduce 和平均，再用 .float() 转回 float32 后赋值。",
                                 "Cause: a float16 gradient was assigned to a float32 parameter's .grad, which torch refuses (.grad has the parameter's dtype): all-reduce and average in float16, then turn it back with .float() before assigning it."),
    "cause.not_divided": ("原因：all_reduce（SUM）得到的是各进程梯度之和，没有除以 world_size（或者改用 ReduceOp.AVG）。",
                          "Cause: all_reduce (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size (or use ReduceOp.AVG)."),
    "cause.divided_twice": ("原因：梯度被 world_size 除了两次：先除以 world_size 再用 ReduceOp.AVG（或 DDP 的压缩 hook 已经除过），只需要一次。",
                            "Cause: the gradient was divided by world_size twice: divided before a ReduceOp.AVG (or after DDP's compression hook, which divides already); once is enough."),
    "cause.weights_in_half": ("原因：权重是用 float16 保存或更新的：LR × grad 大约只有 1e-4，比 float16 在 1 附近的精度（2^-10）还小，更新被舍入掉了。只有通信用 float16：收到的梯度先转回 float32，再用 float32 的权重更新（weights 保持 float32）。",
                              "Cause: the weights were kept or updated in float16: LR x grad is about 1e-4, below float16's resolution near 1 (2^-10), so the update is rounded away. Only the communication is float16: turn the received gradient back into float32 and update float32 weights (weights stay float32)."),
    "cause.local_gradient": ("原因：权重是用本进程自己的梯度更新的，不是 all_reduce 之后的平均梯度：先同步梯度，再更新权重。",
                             "Cause: the weights were updated with this rank's own gradient, not the averaged one from the all_reduce: synchronise the gradient first, then update the weights."),
    "cause.half_copy_dropped": ("原因：梯度还是本进程自己的梯度：all_reduce 的结果没有被用到。all_reduce 原地修改传给它的张量，而 .half() 会生成一个新的张量：dist.all_reduce(grad.half()) 求和的是这个临时副本，结果随之丢掉。先保存它：half = grad.half(); dist.all_reduce(half); grad = half.float() / world_size。",
                                "Cause: the gradient is still this rank's own: what the all_reduce delivered was never read. all_reduce changes the tensor it is given in place, and .half() makes a new one: dist.all_reduce(grad.half()) sums that temporary copy, and the result goes with it. Keep it: half = grad.half(); dist.all_reduce(half); grad = half.float() / world_size."),
    "cause.sent_not_own": ("原因：进程在 all_reduce 中发送的不是它自己的梯度：除去传输所用数据类型的舍入误差，发送的数据里还有别的东西（梯度可以先乘以任意比例，例如除以 world_size 或乘以损失缩放系数）。每个进程都必须把自己的梯度交给 all_reduce，再用它传回的结果。",
                           "Cause: what a rank sent in all_reduce is not its own gradient: beyond the rounding of the dtype it travelled in, it holds something else (the gradient may be scaled by anything first: divided by world_size, multiplied by a loss scale). Every rank must hand its own gradient to the all_reduce, and use what the all_reduce delivers."),
    "cause.no_update": ("原因：权重还是初始值：没有做 weights -= LR * grad 这一步（或者更新的是一个副本）。",
                        "Cause: the weights are still the initial ones: the step weights -= LR * grad did not happen (or it updated a copy)."),
    "teach.header": ("混合精度通信的账（{ws} 个进程）：float16 / bfloat16 每个元素 2 字节，float32 是 4 字节：梯度用半精度传输，通信量减半。",
                     "Mixed-precision communication's account ({ws} ranks): float16 / bfloat16 take 2 bytes an element and float32 4: a gradient sent in half precision halves the traffic."),
    "teach.rank": ("  进程 {rank}：all_reduce 发送了 {sent} 字节（{dtypes}）；同样的元素用 float32 是 {fp32} 字节。",
                   "  rank {rank}: all_reduce sent {sent} bytes ({dtypes}); the same elements in float32 are {fp32} bytes."),
}

def _runtime(ws, hidden):
    return (
        Check(f"ws{ws}.grad", "value", 10, ("半精度 all_reduce 后的平均梯度（float32，{ws} 个进程）",
              "The gradient averaged through a half-precision all_reduce (float32, {ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="grad", op="all_reduce"),
        Check(f"ws{ws}.weights", "value", 10, ("用 float32 更新的权重（{ws} 个进程）", "The weights updated in float32 ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="weights", op="all_reduce"),
        Check(f"ws{ws}.volume", "volume", 10, ("all_reduce 传送 float16 / bfloat16：通信量减半（{ws} 个进程）",
              "The all_reduce carries float16 / bfloat16: half the bytes ({ws} ranks)"),
              hidden=hidden, world_size=ws, op="all_reduce", quantity="grad", params={"dtypes": HALF}),
    )


EXERCISE = Exercise(
    name="fp16_allreduce",
    title=("混合精度通信：用 float16 做 All-Reduce，用 float32 更新权重",
           "Mixed-precision communication: all-reduce in float16, update the weights in float32"),
    defines=("run_worker", "make_model", "batch"),
    files=("fp16_allreduce", "fp16_all_reduce", "mixed_precision"),
    quantities=QUANTITIES,
    checks=(
        Check("static.all_reduce", "static", 10, ("静态检查：run_worker 用到了 all_reduce（DDP 也算）",
              "Static: run_worker reaches all_reduce (DDP counts)"), op="all_reduce"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    teach=TEACH,
    todo=(Todo(("TODO 1（转成 float16，all_reduce，求平均）", "TODO 1 (cast to float16, all_reduce, average)"), op="all_reduce"),
          Todo(("TODO 2（转回 float32，更新权重）", "TODO 2 (back to float32, update the weights)"))),
)
