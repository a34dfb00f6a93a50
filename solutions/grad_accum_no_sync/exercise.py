"""Chapter 19, exercise 4: gradient accumulation with one all-reduce per step (DDP's no_sync()).

The chapter's "DDP 中使用 no_sync() ... 通信次数从 K 次降为 1 次". Every rank holds the same Linear(8, 4) without
bias (`make_model()`) and K = 4 micro-batches of its own (`micro_batch(rank, k)`, loss `F.mse_loss`).
run_worker(rank, world_size) leaves `grad`: the weight's gradient accumulated over the K micro-batches and
averaged over ranks and micro-batches, with ONE all-reduce for the step (DDP with no_sync() around the first
K - 1 backward passes, or accumulated by hand and all-reduced once). `grad` is a Linear quantity: every
micro-batch of every rank weighs 1 / (N K), whatever multiple each rank sent (1 / K in the loss, DDP's 1 / N,
a sum divided afterwards) and however many all-reduces it took; the engine proves it from what they delivered.
Points (100): static 10; per world size 30: the gradient 20, one all-reduce 10 (for a right gradient; an
all-reduce per micro-batch earns the gradient's points, not the count's). World size 2 is visible; 3, 4 hidden.
"""
import numpy as np

from grader.exercise import Check, Exercise, Linear, Mistake, NotOwn, NotRan, Quantity, Ran, Reduce, Sent, Teach, Todo

IN_FEATURES, OUT_FEATURES, BATCH, K = 8, 4, 8, 4
NUMEL = IN_FEATURES * OUT_FEATURES
VISIBLE, HIDDEN = (2,), (3, 4)


def initial_weight():   # ((torch.arange(32).reshape(4, 8) * 5) % 7 - 3) / 8: exact in float32
    return ((np.arange(NUMEL, dtype=np.float64).reshape(OUT_FEATURES, IN_FEATURES) * 5) % 7 - 3) / 8


def micro_batch(rank, k):
    index = np.arange(BATCH * IN_FEATURES, dtype=np.float64).reshape(BATCH, IN_FEATURES)
    x = ((index * (rank + 2) + 5 * k + rank) % 11 - 5) / 4
    y = ((np.arange(BATCH * OUT_FEATURES, dtype=np.float64).reshape(BATCH, OUT_FEATURES) * (k + 1) + 3 * rank) % 9 - 4) / 2
    return x, y


def micro_gradient(rank, k):   # d mse_loss(x W^T, y) / dW = 2 / (B OUT) (x W^T - y)^T x, flattened
    x, y = micro_batch(rank, k)
    return ((2.0 / (BATCH * OUT_FEATURES)) * (x @ initial_weight().T - y).T @ x).reshape(-1)


def own_mean(rank, ws=None):
    return np.mean([micro_gradient(rank, k) for k in range(K)], axis=0)


def right(rank, ws):
    return np.mean([own_mean(q) for q in range(ws)], axis=0)


def mean_of(k, ws):
    return np.mean([micro_gradient(q, k) for q in range(ws)], axis=0)


GRAD = Quantity("grad", combine=Linear(own=lambda rank, ws: [micro_gradient(rank, k) for k in range(K)],
                                       weight=lambda ws: 1.0 / (ws * K)),
                through=("all_reduce",), shape=lambda ws: [OUT_FEATURES, IN_FEATURES],
                label=("累积并平均后的梯度 grad", "the accumulated, averaged gradient grad"))

DDP, BY_HAND = Ran("broadcast"), NotRan("broadcast")    # DDP broadcasts the module's state first
SENT = lambda *scales: Sent("all_reduce", lambda rank, ws: [own_mean(rank)], scales)   # noqa: E731
TWICE = lambda rank, ws: right(rank, ws) / ws            # noqa: E731
MISTAKES = (
    Mistake("cause.sent_not_own", when=(NotOwn("all_reduce"),)),
    Mistake("cause.not_divided_by_k", value=lambda r, ws: K * right(r, ws), tie=(DDP,)),
    Mistake("cause.not_divided_by_k", value=lambda r, ws: K * right(r, ws), tie=(BY_HAND, SENT(K, 1 / K))),
    Mistake("cause.not_divided_by_ws", value=lambda r, ws: ws * right(r, ws), tie=(BY_HAND, SENT(1))),
    Mistake("cause.not_averaged", value=lambda r, ws: ws * K * right(r, ws)),
    Mistake("cause.divided_by_ws_twice", value=TWICE, when=(DDP,), tie=(DDP,)),
    Mistake("cause.averaged_then_divided", value=TWICE, when=(BY_HAND, Reduce("all_reduce", "AVG")), tie=(SENT(1),)),
    Mistake("cause.summed_divided_twice", value=TWICE, when=(BY_HAND, Reduce("all_reduce", "SUM")), tie=(SENT(1),)),
    Mistake("cause.divided_by_ws_twice", value=TWICE, when=(BY_HAND, NotRan("all_reduce"))),
    Mistake("cause.divided_once_too_often", value=TWICE, ws=lambda ws: ws == K, tie=(BY_HAND, SENT(1 / K))),
    Mistake("cause.divided_by_k_twice", value=lambda r, ws: right(r, ws) / K, tie=(DDP,)),
    Mistake("cause.divided_by_k_twice", value=lambda r, ws: right(r, ws) / K, tie=(BY_HAND, SENT(K))),
    Mistake("cause.last_micro_batch_only", value=lambda r, ws: mean_of(K - 1, ws) / K),
    Mistake("cause.last_micro_batch_only", value=lambda r, ws: mean_of(K - 1, ws)),
    Mistake("cause.never_synced", value=own_mean),
    Mistake("cause.never_synced", value=lambda r, ws: K * own_mean(r)),
    Mistake("cause.synced_too_early", value=lambda r, ws: (mean_of(0, ws) + sum(micro_gradient(r, k) for k in range(1, K))) / K),
    Mistake("cause.synced_too_early", value=lambda r, ws: mean_of(0, ws) + sum(micro_gradient(r, k) for k in range(1, K))),
)
TEACH = (
    Teach("teach.header", per="run", say=lambda f: {"k": K}),
    Teach("teach.rank", when=(Ran("all_reduce"),), say=lambda f: {
        "count": f.count("all_reduce"), "bytes": f.bytes("all_reduce"), "k": K,
        "every": K * NUMEL * f.itemsize("all_reduce")}),
)

MESSAGES = {
    "cause.not_divided_by_k": ("原因：梯度是 K 个 micro-batch 梯度之和，没有除以 K：每个 micro-batch 的 loss 先除以 K（loss / K）再 backward，或者在 all_reduce 之后把梯度再除以 K。",
                               "Cause: the gradient is the sum of the K micro-batch gradients, not divided by K: divide each micro-batch's loss by K (loss / K) before backward, or divide the gradient by K after the all_reduce."),
    "cause.not_divided_by_ws": ("原因：all_reduce（SUM）得到的是各进程梯度之和，没有除以 world_size（或者改用 ReduceOp.AVG）。",
                                "Cause: all_reduce (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size (or use ReduceOp.AVG)."),
    "cause.not_averaged": ("原因：梯度既没有除以 K（micro-batch 个数），也没有除以 world_size：平均要对进程和 micro-batch 两个方向都做。",
                           "Cause: the gradient was divided neither by K (the micro-batches) nor by world_size: the average runs over both the ranks and the micro-batches."),
    "cause.divided_by_ws_twice": ("原因：梯度被 world_size 除了两次：DDP 在 all_reduce 之前已经把梯度除以 world_size，不要再除一次。",
                                  "Cause: the gradient was divided by world_size twice: DDP already divides the gradient by world_size before its all_reduce; do not divide again."),
    "cause.averaged_then_divided": ("原因：梯度被 world_size 除了两次：ReduceOp.AVG 的 all_reduce 已经求了平均（除以 world_size），之后不要再除一次。",
                                    "Cause: the gradient was divided by world_size twice: an all_reduce with ReduceOp.AVG already averages (divides by world_size); do not divide again afterwards."),
    "cause.summed_divided_twice": ("原因：梯度被 world_size 除了两次：all_reduce（SUM）得到 world_size 个梯度之和，只需要除以 world_size 一次。",
                                   "Cause: the gradient was divided by world_size twice: all_reduce (SUM) delivers the sum of world_size gradients, which needs one division by world_size."),
    "cause.divided_once_too_often": ("原因：梯度多除了一次：要么被 K 除了两次（loss 已经除以 K），要么被 world_size 除了两次（平均已经除以 world_size）。这里从数值上分不出是哪一种，请检查你的代码。",
                                     "Cause: the gradient was divided once too often: by K twice (the loss is already divided by K), or by world_size twice (the average already divides by it). The numbers here cannot tell which: check your code."),
    "cause.divided_by_k_twice": ("原因：梯度被 K 除了两次：loss 已经除以 K 了，累积后的梯度不要再除以 K。",
                                 "Cause: the gradient was divided by K twice: the loss is already divided by K, so do not divide the accumulated gradient by K again."),
    "cause.last_micro_batch_only": ("原因：只剩下最后一个 micro-batch 的梯度：在 K 个 micro-batch 之间调用了 zero_grad()（或者重新创建了模型），前面的梯度被清掉了。zero_grad() 只在一步开始时调用一次。",
                                    "Cause: only the last micro-batch's gradient is left: zero_grad() ran between the K micro-batches (or the model was made anew), which wiped the earlier gradients. Call zero_grad() once, at the start of the step."),
    "cause.never_synced": ("原因：梯度只是本进程自己累积的梯度，没有和其他进程同步（例如 K 个 micro-batch 全都在 no_sync() 里、all_reduce 的结果没有用上，或者 backward 没有经过 DDP 包装的模型）。最后一个 micro-batch 的 backward 要经过 DDP 模型、在 no_sync() 之外进行，或者手动 all_reduce 并用上它的结果。",
                           "Cause: the gradient is this rank's own accumulated gradient, never synchronised with the other ranks (all K micro-batches inside no_sync(), the all_reduce's result unused, or backward passes that did not go through the DDP-wrapped model, say). Run the last micro-batch's backward through the DDP model, outside no_sync(), or all-reduce by hand and use its result."),
    "cause.synced_too_early": ("原因：all_reduce 发生在第一个 micro-batch 上，后面的 micro-batch 只累积了本进程自己的梯度：no_sync() 要包住前 K - 1 个 micro-batch，最后一个 micro-batch 的 backward 才做同步。",
                               "Cause: the all_reduce ran at the first micro-batch, and the later micro-batches added only this rank's own gradients: no_sync() wraps the first K - 1 micro-batches, and the last micro-batch's backward synchronises."),
    "cause.sent_not_own": ("原因：进程在 all_reduce 中发送的不是它自己的 micro-batch 梯度之和（可以乘以任意比例，也可以加上之前的 all_reduce 传来的结果）：除去舍入误差，发送的数据里还有别的东西（例如别的 micro-batch 的梯度，或在本地算好的答案）。每个进程都必须把自己累积的梯度交给 all_reduce，再用它传回的结果。",
                           "Cause: what a rank sent in all_reduce is not its own micro-batch gradients added up (scaled by anything, plus what earlier all-reduces delivered to it, if it likes): beyond rounding, it holds something else (other micro-batches' gradients, say, or an answer computed locally). Every rank must hand its own accumulated gradient to the all_reduce, and use what the all_reduce delivers."),
    "teach.header": ("梯度累积的账（{ws} 个进程，K = {k} 个 micro-batch）：每一步只需要一次 all_reduce，通信次数和字节数都降为每个 micro-batch 都同步时的 1/K。",
                     "Gradient accumulation's account ({ws} ranks, K = {k} micro-batches): one all_reduce a step, so the number of communications and their bytes drop to 1/K of syncing every micro-batch."),
    "teach.rank": ("  进程 {rank}：这一步完成了 {count} 次 all_reduce，共发送 {bytes} 字节；每个 micro-batch 都同步（{k} 次）要发送 {every} 字节。",
                   "  rank {rank}: {count} all_reduce this step, {bytes} bytes sent; syncing every micro-batch ({k} times) sends {every} bytes."),
}

def _runtime(ws, hidden):
    return (
        Check(f"ws{ws}.grad", "value", 20, ("累积 K 个 micro-batch 后平均的梯度（{ws} 个进程）",
              "The gradient accumulated over K micro-batches and averaged ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="grad", op="all_reduce"),
        Check(f"ws{ws}.one_all_reduce", "counts", 10, ("每一步只做一次 all_reduce（{ws} 个进程）", "One all_reduce for the step ({ws} ranks)"),
              hidden=hidden, world_size=ws, op="all_reduce", quantity="grad", params={"count": 1, "per": "rank"}),
    )


EXERCISE = Exercise(
    name="grad_accum_no_sync",
    title=("梯度累积：K 个 micro-batch 只做一次 All-Reduce（no_sync）", "Gradient accumulation: one all-reduce for K micro-batches (no_sync)"),
    defines=("run_worker", "make_model", "micro_batch"),
    files=("grad_accum_no_sync", "grad_accum", "no_sync"),
    quantities=(GRAD,),
    checks=(
        Check("static.all_reduce", "static", 10, ("静态检查：run_worker 用到了 all_reduce（DDP 也算）",
              "Static: run_worker reaches all_reduce (DDP counts)"), op="all_reduce"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    teach=TEACH,
    todo=(Todo(("TODO 1（累积 K 个 micro-batch 的梯度，不同步）", "TODO 1 (accumulate K micro-batch gradients without syncing)")),
          Todo(("TODO 2（一次 all_reduce，求平均）", "TODO 2 (one all_reduce, then the average)"), op="all_reduce")),
)
