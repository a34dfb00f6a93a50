"""Chapter 19, exercise 3: a ZeRO-style sharded optimizer step with reduce-scatter and all-gather.

The chapter's "All-Reduce vs Reduce-Scatter + All-Gather: how is memory saved?", in the student's own run.
Each rank holds the same P parameters and its own gradient per step; for each of two SGD steps with
momentum it reduce-scatters its (zero-padded) gradient, updates its momentum and parameter shards, and
all-gathers the updated shards. run_worker leaves `params` (P values) and `momentum` (its shard, padding
included). `step` below is that reference; the engine proves both from what the switch delivered by
replaying it (any bucketing; SUM then / N or AVG; its own shard from its own copy or from the all-gather).
Points (100): static 10; per world size 30: params 15, momentum 10, primitives 5 (no all_reduce: the same
bytes, no memory saved). World size 2 is visible; 3 and 4 (P a multiple of neither: padding) are hidden.
"""
import numpy as np

from grader.exercise import Check, Exercise, Failed, Mistake, NotSent, Quantity, Ran, Right, Sent, Teach, Todo
from grader.exercise.reference import outcome

P, LR, MOMENTUM, STEPS = 1030, 0.1, 0.9, 2
VISIBLE, HIDDEN = (2,), (3, 4)
f32 = np.float32


def initial_parameters():   # torch.arange(P, dtype=torch.float32) / P
    return (np.arange(P, dtype=f32) / f32(P)).astype(np.float64)


def local_gradient(rank, step):   # torch.sin(torch.arange(P, dtype=torch.float32) * (rank + 1) / 100 + step)
    return np.sin(np.arange(P, dtype=f32) * f32(rank + 1) / f32(100) + f32(step)).astype(np.float64)


def shard(ws):
    return -(-P // ws)


def padded(values, ws):
    return np.concatenate([values, np.zeros(shard(ws) * ws - values.size)])


def step(comm, rank, ws, divide=True, carry=True, own_gradient=False, base=0, first=False, steps=STEPS, sign=1.0,
         reuse=False):
    """The reference; the knobs make the mistakes (the shard updated is rank + base's, or shard 0's)."""
    s = shard(ws)
    params, momentum = padded(initial_parameters(), ws), np.zeros(s)
    for k in range(1, steps + 1):
        gradient = padded(local_gradient(rank, 1 if reuse else k), ws)
        grad = comm.reduce_scatter(gradient, op="mean" if divide else "sum")
        if own_gradient:
            grad = gradient[rank * s:(rank + 1) * s]
        momentum = (MOMENTUM * momentum if carry else 0) + grad
        b = 0 if first else (rank + base) % ws
        params = comm.all_gather(params[b * s:(b + 1) * s] - sign * LR * momentum)
    return {"params": params[:P], "momentum": momentum}


def _shards(rank, ws):     # what each rank may all-gather by mistake: its shard of the mean gradient, or N x it
    mean = [padded(np.mean([local_gradient(q, k) for q in range(ws)], axis=0), ws) for k in range(1, STEPS + 1)]
    return [m[rank * shard(ws):(rank + 1) * shard(ws)] for m in mean]


def _padding_any(rank, ws):   # the right momentum, whatever its padding holds (NaN: any number)
    values = np.array(outcome(step, ws)[rank]["momentum"])
    values[max(0, min(shard(ws), P - rank * shard(ws))):] = np.nan
    return values


def _tail_any(rank, ws):      # the right parameters but for the last P % N
    values = np.array(outcome(step, ws)[rank]["params"])
    values[P // ws * ws:] = np.nan
    return values


MESSAGES = {
    "cause.forbidden_all_reduce": ("原因：{op} 发送的字节数与 reduce_scatter + all_gather 相同，但每个进程都拿到了完整的梯度，显存没有节省。请用 dist.reduce_scatter_single，让每个进程只收到自己那一片平均梯度。",
                                   "Cause: {op} sends as many bytes as reduce_scatter + all_gather, but every rank ends with the whole gradient: no memory is saved. Use dist.reduce_scatter_single, so that each rank receives only its shard of the averaged gradient."),
    "cause.full_momentum": ("原因：每个进程都保存了完整的优化器状态（动量有全部参数那么长）：这是 DDP，不是 ZeRO。每个进程只应保存自己那一片动量（ceil(P / world_size) 个元素）。",
                            "Cause: every rank keeps the whole optimizer state (a momentum as long as all the parameters): this is DDP, not ZeRO. Each rank keeps the momentum of its own shard only (ceil(P / world_size) elements)."),
    "cause.padding": ("原因：参数个数不是 world_size 的整数倍时，要先用零把梯度和参数补齐到 shard * world_size 个元素（shard = ceil(P / world_size)），最后再去掉补齐的部分；否则 reduce_scatter_single / all_gather_single 的大小对不上，或者最后几个参数没有更新。",
                      "Cause: when the number of parameters is not a multiple of world_size, pad the gradient and the parameters with zeros to shard * world_size elements (shard = ceil(P / world_size)) and drop the padding at the end; otherwise the sizes of reduce_scatter_single / all_gather_single do not match, or the last parameters are never updated."),
    "cause.padding_not_zero": ("原因：动量分片里补齐的部分不是零：请用 torch.zeros（不要用 torch.empty）补齐梯度，补齐部分的动量才会保持为零。",
                               "Cause: the padding of the momentum shard is not zero: pad the gradient with torch.zeros (not torch.empty), so that the padding's momentum stays zero."),
    "cause.padding_kept": ("原因：params 还带着补齐的零：all_gather 之后请只保留前 P 个元素。", "Cause: params still holds the zero padding: keep only the first P elements after the all_gather."),
    "cause.not_divided": ("原因：reduce_scatter（SUM）得到的是各进程梯度之和，没有除以 world_size（或改用 ReduceOp.AVG）。",
                          "Cause: reduce_scatter (SUM) delivers the sum of the ranks' gradients, and it was not divided by world_size (or use ReduceOp.AVG)."),
    "cause.update_with_gradient": ("原因：参数是用梯度更新的，而不是用动量：动量算对了，但更新没有用它（params -= LR * momentum）。",
                                   "Cause: the parameters were updated with the gradient, not the momentum: the momentum is right, but the update does not use it (params -= LR * momentum)."),
    "cause.momentum_reset": ("原因：动量每一步都从零重新开始了：动量缓冲区要在两步之间保留（momentum = MOMENTUM * momentum + grad）。",
                             "Cause: the momentum restarted from zero at every step: keep the momentum buffer across the steps (momentum = MOMENTUM * momentum + grad)."),
    "cause.wrong_shard": ("原因：分片的位置不对：进程 r 的分片是第 r * shard 到 (r + 1) * shard 个元素，reduce_scatter 给它的正是这一片的梯度。",
                          "Cause: a shard is at the wrong place: rank r's shard is elements r * shard to (r + 1) * shard, the slice whose gradient reduce_scatter delivers to it."),
    "cause.local_update": ("原因：每个进程用自己的本地梯度更新了全部参数再做 all_gather：应当只更新自己的分片，而且要用 reduce_scatter 得到的平均梯度。",
                           "Cause: every rank updated the full parameters with its own local gradient, then gathered them: update only your shard, with the averaged gradient that reduce_scatter delivered."),
    "cause.one_step": ("原因：只做了一步更新：要做 STEPS 步（对每一步循环），每一步都 reduce_scatter、更新、all_gather。",
                       "Cause: only one step was made: make STEPS steps (a loop over the steps), each one a reduce_scatter, an update and an all_gather."),
    "cause.sign_flipped": ("原因：更新的方向反了（每个更新量正好取了相反数）：梯度下降是 momentum = MOMENTUM * momentum + grad，param_shard = param_shard - LR * momentum（减号）。",
                           "Cause: the update goes the wrong way (every step of it exactly negated): gradient descent is momentum = MOMENTUM * momentum + grad, then param_shard = param_shard - LR * momentum (a minus)."),
    "cause.gradient_reused": ("原因：第二步用的还是第一步的梯度：每一步都要重新取本步的梯度 local_gradient(rank, step)，再做 reduce_scatter。",
                              "Cause: the second step used the first step's gradient again: take each step's own gradient, local_gradient(rank, step), and reduce_scatter it at that step."),
    "cause.not_own_gradient": ("原因：reduce_scatter 收到的不是本进程自己的梯度（local_gradient(rank, step)）：每个进程都应发送自己的梯度，由 reduce_scatter 求和；自己在本地算好平均值再发送，或者由一个进程替所有进程发送，都不是通信得到的结果。",
                               "Cause: reduce_scatter was not fed this rank's own gradient (local_gradient(rank, step)): every rank sends its own gradient and reduce_scatter sums them; an average a rank computed itself, or one rank sending for all, is not what the communication computes."),
    "cause.gathered_gradients": ("原因：all_gather 收集的是梯度分片，然后每个进程在本地更新完整参数；ZeRO 收集的是更新后的参数分片。",
                                 "Cause: the all_gather collected gradient shards and every rank then updated the full parameters itself; ZeRO gathers the updated parameter shards instead."),
    "teach.header": ("ZeRO 的账（{ws} 个进程）：reduce-scatter + all-gather 与一次 all-reduce 发送的字节数相同，但每个进程只保存 1/N 的优化器状态。",
                     "ZeRO's account ({ws} ranks): reduce-scatter + all-gather send as many bytes as one all-reduce, while each rank keeps 1/N of the optimizer state."),
    "teach.volume": ("  进程 {rank}，每一步：reduce_scatter 约发送 {rs} 字节，all_gather 约 {ag} 字节，共 {total} 字节（各为 (N-1)/N × S，S = {size} 字节）；一次 all_reduce 同样的梯度约发送 {all_reduce} 字节（2(N-1)/N × S）。",
                     "  rank {rank}, each step: reduce_scatter sends about {rs} bytes and all_gather about {ag}, {total} in all ((N-1)/N x S each, S = {size} bytes); one all_reduce of the same gradient sends about {all_reduce} (2(N-1)/N x S)."),
    "teach.volume_all_reduce": ("  进程 {rank}，每一步：all_reduce 约发送 {all_reduce} 字节（2(N-1)/N × S，S = {size} 字节）；reduce_scatter + all_gather 发送同样多的字节，却只让每个进程保存自己那一片。",
                                "  rank {rank}, each step: all_reduce sends about {all_reduce} bytes (2(N-1)/N x S, S = {size} bytes); reduce_scatter + all_gather send as many, and leave each rank with its own shard only."),
    "teach.state_sharded": ("  进程 {rank}：保存 {held} 个动量元素（优化器状态），不分片时是 {full} 个：约 1/{n}。",
                            "  rank {rank}: holds {held} momentum elements (optimizer state) where an unsharded optimizer holds {full}: about 1/{n}."),
    "teach.state_full": ("  进程 {rank}：保存 {held} 个动量元素，也就是全部 {full} 个：优化器状态没有分片。",
                         "  rank {rank}: holds {held} momentum elements, all {full} of them: the optimizer state is not sharded."),
}

PAD = lambda ws: P % ws != 0   # noqa: E731
MISTAKES = (
    Mistake("cause.forbidden_all_reduce", when=(Ran("all_reduce"),), params={"op": "all_reduce"}),
    *(Mistake("cause.padding", when=(Failed(op, lambda ws: (P, P // ws), uneven=True),), ws=PAD)
      for op in ("reduce_scatter", "all_gather")),
    Mistake("cause.gathered_gradients", when=(Sent("all_gather", _shards, (1, "N")),)),
    Mistake("cause.not_own_gradient", when=(NotSent("reduce_scatter", lambda r, ws: [
        padded(local_gradient(r, k), ws) for k in range(1, STEPS + 1)], (1, "1/N")),)),
    Mistake("cause.full_momentum", "momentum", shape=lambda ws: [P]),
    Mistake("cause.full_momentum", "momentum", shape=lambda ws: [shard(ws) * ws], ws=PAD),
    Mistake("cause.padding", "momentum", shape=lambda ws: [P // ws], ws=PAD),
    Mistake("cause.padding_not_zero", "momentum", value=_padding_any, ws=PAD),
    Mistake("cause.padding_kept", "params", shape=lambda ws: [shard(ws) * ws], ws=PAD),
    Mistake("cause.not_divided", knobs={"divide": False}),
    Mistake("cause.momentum_reset", knobs={"carry": False}),
    Mistake("cause.update_with_gradient", "params", knobs={"carry": False}, tie=(Right("momentum"),)),
    Mistake("cause.local_update", "params", knobs={"own_gradient": True}),
    Mistake("cause.wrong_shard", "params", knobs={"first": True}),
    Mistake("cause.wrong_shard", "params", knobs={"base": 1}),
    Mistake("cause.wrong_shard", "params", knobs={"base": -1}),
    Mistake("cause.one_step", knobs={"steps": 1}),
    Mistake("cause.sign_flipped", knobs={"sign": -1.0}),
    Mistake("cause.sign_flipped", "momentum", value=lambda r, ws: -outcome(step, ws)[r]["momentum"]),
    Mistake("cause.gradient_reused", knobs={"reuse": True}),
    Mistake("cause.padding", "params", value=_tail_any, ws=PAD),
)

TEACH = (
    Teach("teach.header", per="run"),
    Teach("teach.volume", when=(Ran("reduce_scatter"), Ran("all_gather")), say=lambda f: {
        "rs": f.ring("reduce_scatter"), "ag": f.ring("all_gather", delivered=True), "size": f.first("reduce_scatter"),
        "total": f.ring("reduce_scatter") + f.ring("all_gather", delivered=True),
        "all_reduce": f.ring("all_reduce", size=f.first("reduce_scatter"))}),
    Teach("teach.volume_all_reduce", when=(Ran("all_reduce"),), only=lambda f: not (f.count("reduce_scatter") and f.count("all_gather")), say=lambda f: {
        "size": f.first("all_reduce"), "all_reduce": f.ring("all_reduce")}),
    Teach("teach.state_sharded", held="momentum", say=lambda f: {"held": f.held("momentum"), "full": P, "n": f.ws},
          only=lambda f: 0 < f.held("momentum") < P),
    Teach("teach.state_full", held="momentum", say=lambda f: {"held": f.held("momentum"), "full": P},
          only=lambda f: f.held("momentum") >= P),
)


def _runtime(ws, hidden):
    return (
        Check(f"ws{ws}.params", "value", 15, ("Reduce-Scatter 与 All-Gather 完成两步更新后的参数（{ws} 个进程）",
              "Parameters after two steps through reduce_scatter and all_gather ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="params", op="all_gather"),
        Check(f"ws{ws}.momentum", "value", 10, ("动量只保存本进程的分片（{ws} 个进程）", "Momentum holds this rank's shard only ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="momentum", op="reduce_scatter"),
        Check(f"ws{ws}.primitives", "uses", 5, ("通信原语：reduce_scatter 与 all_gather，不用 all_reduce（{ws} 个进程）",
              "Primitives: reduce_scatter and all_gather, no all_reduce ({ws} ranks)"), hidden=hidden, world_size=ws,
              forbid=("all_reduce",)),
    )


EXERCISE = Exercise(
    name="zero_sharded_step",
    title=("ZeRO 分片优化器：Reduce-Scatter 与 All-Gather", "A ZeRO-style sharded optimizer step: reduce-scatter and all-gather"),
    defines=("run_worker", "local_gradient", "initial_parameters"),
    quantities=(
        Quantity("params", combine="reference", through=("reduce_scatter", "all_gather"), label=("参数 params", "params")),
        Quantity("momentum", combine="reference", through=("reduce_scatter",), label=("动量 momentum", "momentum")),
    ),
    step=step,
    checks=(
        Check("static.reduce_scatter", "static", 5, ("静态检查：run_worker 调用了 dist.reduce_scatter_single",
              "Static: run_worker calls dist.reduce_scatter_single"), op="reduce_scatter"),
        Check("static.all_gather", "static", 5, ("静态检查：run_worker 调用了 dist.all_gather_single",
              "Static: run_worker calls dist.all_gather_single"), op="all_gather"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    teach=TEACH,
    todo=(Todo(("TODO 1（reduce_scatter）", "TODO 1 (reduce_scatter)"), op="reduce_scatter"),
          Todo(("TODO 2（分片更新）", "TODO 2 (the shard update)")),
          Todo(("TODO 3（all_gather）", "TODO 3 (all_gather)"), op="all_gather")),
)
