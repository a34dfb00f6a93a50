"""The course's next chapter, tensor parallelism: a Megatron-style MLP, Y = GeLU(X A) B, forward and backward.

A is split by columns (rank r holds A_r = A[:, shard r]), B by rows (B_r = B[shard r, :]): each rank computes
Z_r = GeLU(X A_r) B_r alone, and an all-reduce (SUM) of the Z_r gives Y (Megatron's g). With dY = Y - T (loss
0.5 ||Y - T||^2) on every rank, each rank's dX_r = dH_r A_r^T is a partial sum, all-reduced into dX (Megatron's
f, in the backward pass). run_worker leaves y, dx and its shards' gradients dA (D x H/N), dB (H/N x D); `step` is
that reference, replayed by the engine against what the switch delivered. Points (100): static 10; per world
size 30: y 8, dx 8, dA 5, dB 5, two all-reduces 4. World size 2 is visible; 3 and 4 hidden (H = 12 divides).
"""
import math

import numpy as np

from grader.exercise import Check, Exercise, Mistake, Quantity, Ran, Right, Sent, SentAs, Teach, Todo, Wrong
from grader.exercise.reference import outcome, sent

TOKENS, D, H = 4, 8, 12
VISIBLE, HIDDEN = (2,), (3, 4)
ERF = np.vectorize(math.erf)


def grid(rows, cols, mul, mod, shift, den):   # ((torch.arange(rows * cols).reshape(rows, cols) * mul) % mod - shift) / den
    return ((np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) * mul) % mod - shift) / den


X, A, B, T = grid(TOKENS, D, 3, 11, 5, 8), grid(D, H, 5, 13, 6, 16), grid(H, D, 7, 9, 4, 16), grid(TOKENS, D, 2, 7, 3, 4)
gelu = lambda u: 0.5 * u * (1 + ERF(u / math.sqrt(2)))   # noqa: E731  (F.gelu, the erf form, and its derivative)
gelu_grad = lambda u: 0.5 * (1 + ERF(u / math.sqrt(2))) + u * np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)   # noqa: E731


def step(comm, rank, ws, reduce_y=1, reduce_dx=1, y_op="sum", dx_op="sum", gelu_after=False, reduce_dy=False, loss=1.0):
    """The reference; its knobs make the mistakes (reduce_y / reduce_dx: how many all-reduces, 0, 1 or 2)."""
    s = H // ws
    a, b = A[:, rank * s:(rank + 1) * s], B[rank * s:(rank + 1) * s, :]
    u = X @ a
    h = u if gelu_after else gelu(u)
    y = h @ b                                                   # Z_r, this rank's partial output
    for _ in range(reduce_y):
        y = comm.all_reduce(y, op=y_op).reshape(TOKENS, D)      # g: all-reduce forward
    out = gelu(y) if gelu_after else y
    dy = loss * (out - T) * (gelu_grad(y) if gelu_after else 1)
    # dY, the same on every rank; a rank may all-reduce its dY / N (torch.distributed.nn.functional's backward)
    dy = (comm.all_reduce(dy) if reduce_dy else comm.replicated(dy)).reshape(TOKENS, D)
    dh = (dy @ b.T) * (1 if gelu_after else gelu_grad(u))
    dx = dh @ a.T                                               # dX_r, a partial sum
    for _ in range(reduce_dx):
        dx = comm.all_reduce(dx, op=dx_op).reshape(TOKENS, D)   # f: all-reduce backward
    return {"y": out, "dx": dx, "dA": X.T @ dh, "dB": h.T @ dy}


def _knobs(cause, quantity=None, **knobs):   # the step with knobs turned; where two leave the same numbers, the sends tell
    return Mistake(cause, quantity, knobs=knobs, tie=(SentAs(knobs),))


MISTAKES = (
    *(Mistake(c, knobs=k, when=(w("y"),), tie=(SentAs(k),)) for c, w in (("cause.no_output_all_reduce", Wrong),   # y is
      ("cause.dy_from_partial", Right)) for k in ({"reduce_y": 0}, {"reduce_y": 0, "reduce_dx": 0})),   # right: dY is not
    _knobs("cause.dx_not_all_reduced", "dx", reduce_y=0, reduce_dx=0), _knobs("cause.dx_not_all_reduced", "dx", reduce_dx=0),
    _knobs("cause.output_averaged", y_op="mean"), _knobs("cause.dx_averaged", "dx", dx_op="mean"),
    _knobs("cause.output_summed_twice", reduce_y=2), _knobs("cause.dx_summed_twice", "dx", reduce_dx=2),
    _knobs("cause.gelu_after_all_reduce", gelu_after=True),
    _knobs("cause.dy_instead_of_dx", reduce_dy=True, reduce_dx=0), _knobs("cause.dy_all_reduced", reduce_dy=True),
    _knobs("cause.loss_form", loss=2.0 / (TOKENS * D)), _knobs("cause.loss_form", loss=2.0),
    *(Mistake("cause.b_not_split_by_rows", error=rf"\(\d+x{H // n} and {H}x\d+\)", ws=lambda ws, n=n: ws == n) for n in (2, 3, 4)),
    Mistake("cause.weight_layout", "dA", shape=lambda ws: [H // ws, D]), Mistake("cause.weight_layout", "dB", shape=lambda ws: [D, H // ws]),
    *(Mistake("cause.shard_grad_all_reduced", name, value=lambda rank, ws, name=name: np.sum(   # every rank's shard, summed
        [outcome(step, ws)[q][name] for q in range(ws)], axis=0)) for name in ("dA", "dB")),
    Mistake("cause.a_not_split_by_columns", error=rf"\(\d+x{D} and (?!{D}x)\d+x{H}\)"),   # X @ A[rows]
    Mistake("cause.partials_all_gathered", when=(Sent("all_gather", lambda rank, ws: [sent(step, ws)[rank][0][1]]),)),
)
TEACH = (
    Teach("teach.header", per="run", say=lambda f: {"size": TOKENS * D}),
    Teach("teach.rank", when=(Ran("all_reduce"),), say=lambda f: {
        "count": f.count("all_reduce"), "bytes": f.bytes("all_reduce"), "size": f.first("all_reduce"),
        "ring": f.ring("all_reduce"), "held": f.held("dA") + f.held("dB"), "full": 2 * D * H}),
)

MESSAGES = {
    "cause.no_output_all_reduce": ("原因：y 只是本进程的部分和 Z_r = GeLU(X A_r) B_r：B 按行切分时，每个进程只算出 Y 的一部分，要用 all_reduce（SUM）把各进程的 Z_r 加起来才是 Y（Megatron 的 g）。",
                                   "Cause: y is only this rank's partial sum Z_r = GeLU(X A_r) B_r: with B split by rows each rank computes a part of Y, and an all_reduce (SUM) of the ranks' Z_r makes Y (Megatron's g)."),
    "cause.dy_from_partial": ("原因：y 是对的，但 dY 是用本进程的部分和 Z_r 算的，不是用 all_reduce 之后的 Y：dY = Y - T 要用求和之后的 Y。",
                              "Cause: y is right, but dY was computed from this rank's partial sum Z_r, not from the all-reduced Y: dY = Y - T takes the summed Y."),
    "cause.dx_not_all_reduced": ("原因：dx 只是本进程的部分和 dX_r = dH_r A_r^T：X 在每个进程上都参与了计算，它的梯度是各进程部分和之和，要在反向传播中用 all_reduce（SUM）加起来（Megatron 的 f）。",
                                 "Cause: dx is only this rank's partial sum dX_r = dH_r A_r^T: X went into every rank's shard, so its gradient is the sum of the ranks' partials, all-reduced (SUM) in the backward pass (Megatron's f)."),
    "cause.output_averaged": ("原因：y 是各进程 Z_r 的平均，不是它们的和：张量并行的部分输出要求和（ReduceOp.SUM，不要再除以 world_size）；求平均是数据并行里梯度的做法。",
                              "Cause: y is the mean of the ranks' Z_r, not their sum: tensor parallelism sums the partial outputs (ReduceOp.SUM, no division by world_size); averaging is what data parallelism does to gradients."),
    "cause.dx_averaged": ("原因：dx 是各进程 dX_r 的平均，不是它们的和：输入梯度的部分和要求和（ReduceOp.SUM，不要再除以 world_size）。",
                          "Cause: dx is the mean of the ranks' dX_r, not their sum: the input gradient's partials are summed (ReduceOp.SUM, no division by world_size)."),
    "cause.output_summed_twice": ("原因：部分输出被 all_reduce 了两次：第一次之后每个进程都已经是 Y，再求和一次就成了 world_size × Y。",
                                  "Cause: the partial outputs were all-reduced twice: after the first every rank holds Y, and summing again gives world_size x Y."),
    "cause.dx_summed_twice": ("原因：dx 被 all_reduce 了两次：第一次之后每个进程都已经是 dX，再求和一次就成了 world_size × dX。",
                              "Cause: dx was all-reduced twice: after the first every rank holds dX, and summing again gives world_size x dX."),
    "cause.gelu_after_all_reduce": ("原因：GeLU 用在了 all_reduce 之后：GeLU 不是线性的，GeLU(Σ Z_r) ≠ Σ GeLU(...)。它要作用在列切分的输出 X A_r 上，在乘 B_r 之前，这样每个进程都不需要通信。",
                                    "Cause: GeLU was applied after the all_reduce: GeLU is not linear, so GeLU of the sum is not the sum of GeLUs. Apply it to the column-parallel output X A_r, before the multiplication by B_r, where no rank needs to communicate."),
    "cause.dy_instead_of_dx": ("原因：反向传播中 all_reduce 的是 dY，而不是 dX：每个进程的 dY = Y - T 本来就相同，求和只会把它乘以 world_size；需要求和的是输入梯度的部分和 dX_r = dH_r A_r^T。",
                               "Cause: the backward pass all-reduced dY instead of dX: dY = Y - T is the same on every rank already, so summing it only multiplies it by world_size; what needs the sum is the input gradient's partials dX_r = dH_r A_r^T."),
    "cause.dy_all_reduced": ("原因：反向传播中 dY 也被 all_reduce 了，梯度都大了 world_size 倍：torch.distributed.nn.functional.all_reduce 的反向也是一次 all_reduce，而每个进程的 loss 相同。Megatron 的 g 反向是恒等映射（自己写 autograd.Function），或者把每个进程的 loss 除以 world_size。",
                             "Cause: dY was all-reduced in the backward pass too, so the gradients are world_size times too large: the backward of torch.distributed.nn.functional.all_reduce is an all_reduce as well, and every rank holds the same loss. Megatron's g is the identity backward (write an autograd.Function), or divide each rank's loss by world_size."),
    "cause.loss_form": ("原因：梯度是正确梯度的整数倍或几分之一：loss 要写成 0.5 * ((y - target) ** 2).sum()，于是 dY = Y - T；F.mse_loss 取的是平均（还乘以 2），不带 0.5 的平方和会乘以 2。",
                        "Cause: the gradients are a multiple of the right ones: the loss is 0.5 * ((y - target) ** 2).sum(), so that dY = Y - T; F.mse_loss takes the mean (and doubles), and a sum of squares without the 0.5 doubles."),
    "cause.a_not_split_by_columns": ("原因：X（D 列）乘上了一个行数不是 D 的矩阵：A 要按列切分，进程 r 用 A[:, r * s:(r + 1) * s]（s = H / world_size），而不是按行切分。",
                                     "Cause: X (D columns) was multiplied by a matrix without D rows: A is split by columns, rank r takes A[:, r * s:(r + 1) * s] (s = H / world_size), not by rows."),
    "cause.b_not_split_by_rows": ("原因：GeLU 的输出（每个进程 H / world_size 列）乘上了一个有 H 行的矩阵：B 要按行切分，进程 r 用 B[r * s:(r + 1) * s, :]（s = H / world_size），而不是整个 B 或按列切分的 B。",
                                  "Cause: the GeLU output (H / world_size columns on each rank) was multiplied by a matrix of H rows: B is split by rows, rank r using B[r * s:(r + 1) * s, :] (s = H / world_size), not the whole B nor B split by columns."),
    "cause.weight_layout": ("原因：梯度是转置的：nn.Linear 的 weight 是 (out, in)，也就是 A^T 和 B^T；dA 的形状和 A_r 相同（D × H/N），dB 和 B_r 相同（H/N × D）：返回 weight.grad.T。",
                            "Cause: the gradient is transposed: an nn.Linear's weight is (out, in), that is A^T and B^T; dA has A_r's shape (D x H/N) and dB has B_r's (H/N x D): return weight.grad.T."),
    "cause.shard_grad_all_reduced": ("原因：分片的梯度被 all_reduce 了：进程 r 的 dA_r、dB_r 是它自己那一片权重的梯度，各进程的分片不同，不需要同步（同步梯度是数据并行的做法）。",
                                     "Cause: a shard's gradient was all-reduced: rank r's dA_r and dB_r are the gradients of its own shard of the weights, a different shard on every rank, and need no synchronisation (syncing gradients is data parallelism)."),
    "cause.partials_all_gathered": ("原因：部分输出 Z_r 是用 all_gather 收集、再在本地相加的：数值一样，但每个进程要收下另外 N-1 份（(N-1) × S 字节），而 all_reduce（SUM）在环形算法下每个进程只发送约 2(N-1)/N × S。请用 dist.all_reduce。",
                                    "Cause: the partial outputs Z_r were all-gathered and added up locally: the same numbers, but each rank receives the N-1 others ((N-1) x S bytes), where an all_reduce (SUM) sends about 2(N-1)/N x S per rank in a ring. Use dist.all_reduce."),
    "teach.header": ("Megatron 式 MLP 的账（{ws} 个进程）：每对（列切分、行切分）线性层只需要两次 all_reduce，每次的大小都是激活 Y（{size} 个元素）：前向一次（g），反向一次（f）；权重和它们的梯度始终分片，从不通信。",
                     "Megatron's MLP account ({ws} ranks): a column- and row-parallel pair of layers needs two all_reduces, each the size of the activation Y ({size} elements): one forward (g), one backward (f); the weights and their gradients stay sharded and never travel."),
    "teach.rank": ("  进程 {rank}：all_reduce 完成了 {count} 次，共发送 {bytes} 字节（每次 S = {size} 字节；环形算法每次约发送 {ring} 字节，2(N-1)/N × S）；本进程只保存 {held} 个权重梯度元素，全部是 {full} 个。",
                   "  rank {rank}: {count} all_reduce, {bytes} bytes sent (S = {size} bytes each; a ring sends about {ring} per call, 2(N-1)/N x S); this rank holds {held} of the {full} weight-gradient elements."),
}

CHECKS = (("y", 8, "前向：行切分的部分输出经 all_reduce 求和得到 Y", "Forward: Y, the row-parallel partials all-reduced"),
          ("dx", 8, "反向：输入梯度 dX 经 all_reduce 求和", "Backward: the input gradient dX, all-reduced"),
          ("dA", 5, "本进程 A 分片的梯度 dA", "The gradient dA of this rank's shard of A"),
          ("dB", 5, "本进程 B 分片的梯度 dB", "The gradient dB of this rank's shard of B"))


def _runtime(ws, hidden):
    return (*(Check(f"ws{ws}.{name}", "value", points, (f"{zh}（{{ws}} 个进程）", f"{en} ({{ws}} ranks)"), hidden=hidden,
                    world_size=ws, quantity=name, op="all_reduce") for name, points, zh, en in CHECKS),
            # the all-reduces that carried any of the step's quantities are counted (a logged loss is not)
            Check(f"ws{ws}.two_all_reduces", "counts", 4, ("每一步恰好两次 all_reduce：前向一次、反向一次（{ws} 个进程）",
                  "Exactly two all_reduces a step: one forward, one backward ({ws} ranks)"), hidden=hidden, world_size=ws,
                  op="all_reduce", quantity="dx", params={"count": 2, "quantities": tuple(name for name, *_ in CHECKS)}))


_quantity = lambda name, shape, zh, en: Quantity(name, combine="reference", through=("all_reduce",), shape=shape, label=(zh, en))  # noqa: E731

EXERCISE = Exercise(
    name="tensor_parallel_mlp",
    title=("张量并行 MLP：列切分、GeLU、行切分，前向与反向各一次 All-Reduce",
           "A tensor-parallel MLP: column-parallel, GeLU, row-parallel; one all-reduce forward, one backward"),
    defines=("run_worker", "make_input", "make_weights"),
    files=("tensor_parallel_mlp", "tensor_parallel", "megatron_mlp"),
    quantities=(_quantity("y", lambda ws: [TOKENS, D], "输出 y", "the output y"),
                _quantity("dx", lambda ws: [TOKENS, D], "输入梯度 dx", "the input gradient dx"),
                _quantity("dA", lambda ws: [D, H // ws], "A 分片的梯度 dA", "dA, the gradient of A's shard"),
                _quantity("dB", lambda ws: [H // ws, D], "B 分片的梯度 dB", "dB, the gradient of B's shard")),
    checks=(Check("static.all_reduce", "static", 10, ("静态检查：run_worker 用到了 all_reduce（DTensor 也算）",
                  "Static: run_worker reaches all_reduce (DTensor counts)"), op="all_reduce"),
            *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)), *(c for ws in HIDDEN for c in _runtime(ws, hidden=True))),
    step=step, messages=MESSAGES, mistakes=MISTAKES, teach=TEACH,
    todo=(Todo(("TODO 1（前向：部分输出 all_reduce）", "TODO 1 (forward: all-reduce the partial outputs)"), op="all_reduce"),
          Todo(("TODO 2（反向：dA、dB，输入梯度 all_reduce）", "TODO 2 (backward: dA, dB, all-reduce the input gradient)"))),
)
