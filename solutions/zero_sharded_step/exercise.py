"""Chapter 19, exercise 3: a ZeRO-style sharded optimizer step ("how do reduce-scatter + all-gather save memory?").

Two SGD steps with momentum, each rank updating its shard of the P parameters; run_worker leaves `params` and
`momentum` (its shard). `step` is the reference the engine replays against the run. Points: static 10; per world
size params 15, momentum 10, primitives 5 (no all_reduce). World size 2 visible; 3 and 4 (padding) hidden.
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


shard = lambda ws: -(-P // ws)   # noqa: E731
padded = lambda values, ws: np.concatenate([values, np.zeros(shard(ws) * ws - values.size)])   # noqa: E731


def step(comm, rank, ws, divide=True, carry=True, own_gradient=False, base=0, first=False, steps=STEPS, sign=1.0,
         reuse=False):
    """The reference; the knobs make the mistakes (the shard updated is rank + base's, or shard 0's)."""
    s = shard(ws)
    params, momentum = padded(initial_parameters(), ws), np.zeros(s)
    for k in range(1, steps + 1):
        gradient = padded(local_gradient(rank, 1 if reuse else k), ws)
        grad = gradient[rank * s:(rank + 1) * s] if own_gradient else comm.reduce_scatter(gradient, op="mean" if divide else "sum")
        momentum = (MOMENTUM * momentum if carry else 0) + grad
        b = 0 if first else (rank + base) % ws
        params = comm.all_gather(params[b * s:(b + 1) * s] - sign * LR * momentum)
    return {"params": params[:P], "momentum": momentum}


MEAN = lambda k, ws: padded(np.mean([local_gradient(q, k) for q in range(ws)], axis=0), ws)   # noqa: E731
PAD = lambda ws: P % ws != 0   # noqa: E731
RIGHT = lambda name: lambda r, ws: outcome(step, ws)[r][name]   # noqa: E731
MISTAKES = (
    Mistake("cause.forbidden_all_reduce", when=(Ran("all_reduce"),), params={"op": "all_reduce"}),
    *(Mistake("cause.padding", when=(Failed(op, lambda ws: (P, P // ws), uneven=True),), ws=PAD)
      for op in ("reduce_scatter", "all_gather")),
    Mistake("cause.gathered_gradients", when=(Sent("all_gather", lambda r, ws: [
        MEAN(k, ws)[r * shard(ws):(r + 1) * shard(ws)] for k in range(1, STEPS + 1)], (1, "N")),)),
    Mistake("cause.not_own_gradient", when=(NotSent("reduce_scatter", lambda r, ws: [   # its first P elements: the
        local_gradient(r, k) for k in range(1, STEPS + 1)], (1, "1/N")),)),            # padding may be anything
    Mistake("cause.full_momentum", "momentum", shape=lambda ws: [P]),
    Mistake("cause.full_momentum", "momentum", shape=lambda ws: [shard(ws) * ws], ws=PAD),
    Mistake("cause.padding", "momentum", shape=lambda ws: [P // ws], ws=PAD),
    Mistake("cause.padding_not_zero", "momentum", value=RIGHT("momentum"), upto=lambda r, ws: P - r * shard(ws), ws=PAD),
    Mistake("cause.padding_kept", "params", shape=lambda ws: [shard(ws) * ws], ws=PAD),
    Mistake("cause.padding", "params", value=RIGHT("params"), upto=lambda r, ws: P // ws * ws, ws=PAD),
    Mistake("cause.not_divided", knobs={"divide": False}),
    Mistake("cause.momentum_reset", knobs={"carry": False}),
    Mistake("cause.update_with_gradient", "params", knobs={"carry": False}, tie=(Right("momentum"),)),
    Mistake("cause.local_update", "params", knobs={"own_gradient": True}),
    Mistake("cause.wrong_shard", "params", knobs=({"first": True}, {"base": 1}, {"base": -1})),
    Mistake("cause.one_step", knobs={"steps": 1}),
    Mistake("cause.sign_flipped", knobs={"sign": -1.0}),
    Mistake("cause.sign_flipped", "momentum", value=lambda r, ws: -RIGHT("momentum")(r, ws)),
    Mistake("cause.gradient_reused", knobs={"reuse": True}),
)
BOTH = lambda f: f.count("reduce_scatter") and f.count("all_gather")   # noqa: E731
RS, AG = (lambda f: f.ring("reduce_scatter")), (lambda f: f.ring("all_gather", delivered=True))
TEACH = (
    Teach("teach.header", per="run"),
    Teach("teach.volume", only=BOTH, say=lambda f: {"rs": RS(f), "ag": AG(f), "total": RS(f) + AG(f), "size": f.first(
        "reduce_scatter"), "all_reduce": f.ring("all_reduce", size=f.first("reduce_scatter"))}),
    Teach("teach.volume_all_reduce", when=(Ran("all_reduce"),), only=lambda f: not BOTH(f),
          say=lambda f: {"size": f.first("all_reduce"), "all_reduce": f.ring("all_reduce")}),
    Teach("teach.state_sharded", held="momentum", only=lambda f: f.held("momentum") < P, say=lambda f: {"held": f.held("momentum"), "full": P, "n": f.ws}),
    Teach("teach.state_full", held="momentum", only=lambda f: f.held("momentum") >= P, say=lambda f: {"held": f.held("momentum"), "full": P}),
)

MESSAGES = {
    "cause.forbidden_all_reduce": ("原因：{op} 发送的字节数与 reduce_scatter + all_gather 相同，但每个进程都拿到了完整梯度，显存没有节省：请用 dist.reduce_scatter_single。",
                                   "Cause: {op} sends as many bytes as reduce_scatter + all_gather, but every rank holds the whole gradient: no memory saved. Use dist.reduce_scatter_single."),
    "cause.full_momentum": ("原因：每个进程都保存了完整的动量（优化器状态）：这是 DDP，不是 ZeRO。每个进程只保存自己那一片（ceil(P / world_size) 个元素）。",
                            "Cause: every rank keeps the whole momentum (optimizer state): that is DDP, not ZeRO. Keep your own shard only (ceil(P / world_size) elements)."),
    "cause.padding": ("原因：P 不是 world_size 的整数倍时，先用零把梯度和参数补齐到 shard * world_size（shard = ceil(P / world_size)），最后再去掉补齐部分。",
                      "Cause: when P is not a multiple of world_size, pad the gradient and the parameters with zeros to shard * world_size (shard = ceil(P / world_size)), and drop the padding at the end."),
    "cause.padding_not_zero": ("原因：动量分片里补齐的部分不是零：请用 torch.zeros（不要用 torch.empty）补齐梯度。",
                               "Cause: the padding of the momentum shard is not zero: pad the gradient with torch.zeros, not torch.empty."),
    "cause.padding_kept": ("原因：params 还带着补齐的零：all_gather 之后只保留前 P 个元素。", "Cause: params still holds the zero padding: keep only the first P elements after the all_gather."),
    "cause.not_divided": ("原因：reduce_scatter（SUM）给的是各进程梯度之和，没有除以 world_size（或用 ReduceOp.AVG）。",
                          "Cause: reduce_scatter (SUM) delivers the sum of the ranks' gradients, not divided by world_size (or use ReduceOp.AVG)."),
    "cause.update_with_gradient": ("原因：动量算对了，但参数是用梯度更新的：params -= LR * momentum。", "Cause: the momentum is right, but the parameters were updated with the gradient: params -= LR * momentum."),
    "cause.momentum_reset": ("原因：动量每一步都从零开始：要在两步之间保留它（momentum = MOMENTUM * momentum + grad）。",
                             "Cause: the momentum restarted from zero at every step: keep it across the steps (momentum = MOMENTUM * momentum + grad)."),
    "cause.wrong_shard": ("原因：分片位置不对：进程 r 的分片是第 r * shard 到 (r + 1) * shard 个元素，reduce_scatter 给它的正是这一片的梯度。",
                          "Cause: a shard is at the wrong place: rank r's shard is elements r * shard to (r + 1) * shard, whose gradient reduce_scatter delivers to it."),
    "cause.local_update": ("原因：参数是用每个进程自己的本地梯度更新的，而不是 reduce_scatter 给的平均梯度：每个进程用 reduce_scatter 送来的平均梯度分片更新自己的参数分片。",
                           "Cause: the parameters were updated with each rank's own local gradient, not the averaged gradient reduce_scatter delivered: each rank updates its shard of the parameters with the averaged gradient shard reduce_scatter gives it."),
    "cause.one_step": ("原因：只做了一步：要做 STEPS 步，每一步都 reduce_scatter、更新、all_gather。", "Cause: only one step was made: make STEPS steps, each a reduce_scatter, an update and an all_gather."),
    "cause.sign_flipped": ("原因：更新方向反了：param_shard = param_shard - LR * momentum（减号）。", "Cause: the update goes the wrong way: param_shard = param_shard - LR * momentum (a minus)."),
    "cause.gradient_reused": ("原因：第二步还用第一步的梯度：每一步都要取本步的 local_gradient(rank, step)。",
                              "Cause: the second step used the first step's gradient: take each step's own local_gradient(rank, step)."),
    "cause.not_own_gradient": ("原因：reduce_scatter 收到的不是本进程自己的梯度按原顺序排好的样子：每个进程发送自己的 local_gradient(rank, step)（补齐后，按原来的元素顺序），进程 r 的分片是其中连续的第 r 段；本地算好的平均值、一个进程替所有进程发送，或者换了一种切分方式（例如间隔取元素），都不对。",
                               "Cause: reduce_scatter was not fed this rank's own gradient in its own order: every rank sends its own local_gradient(rank, step) (padded, its elements in order), and rank r's shard is its r-th contiguous piece; an average computed locally, one rank sending for all, or the shards cut another way (every N-th element, say) are not it."),
    "cause.gathered_gradients": ("原因：all_gather 收集的是梯度分片，然后每个进程在本地更新全部参数；ZeRO 收集的是更新后的参数分片。",
                                 "Cause: the all_gather collected gradient shards and every rank updated all the parameters itself; ZeRO gathers the updated parameter shards."),
    "teach.header": ("ZeRO 的账（{ws} 个进程）：reduce-scatter + all-gather 与一次 all-reduce 发送的字节数相同，但每个进程只保存 1/N 的优化器状态。",
                     "ZeRO's account ({ws} ranks): reduce-scatter + all-gather send as many bytes as one all-reduce, while each rank keeps 1/N of the optimizer state."),
    "teach.volume": ("  进程 {rank}，每一步：reduce_scatter 约发送 {rs} 字节，all_gather 约 {ag} 字节，共 {total} 字节（各为 (N-1)/N × S，S = {size} 字节）；一次 all_reduce 同样的梯度约发送 {all_reduce} 字节（2(N-1)/N × S）。",
                     "  rank {rank}, each step: reduce_scatter sends about {rs} bytes and all_gather about {ag}, {total} in all ((N-1)/N x S each, S = {size} bytes); one all_reduce of the same gradient sends about {all_reduce} (2(N-1)/N x S)."),
    "teach.volume_all_reduce": ("  进程 {rank}，每一步：all_reduce 约 {all_reduce} 字节（2(N-1)/N × S，S = {size} 字节）；reduce_scatter + all_gather 一样多，却只保存自己那一片。",
                                "  rank {rank}, each step: all_reduce sends about {all_reduce} bytes (2(N-1)/N x S, S = {size} bytes); reduce_scatter + all_gather send as many and keep one shard."),
    "teach.state_sharded": ("  进程 {rank}：保存 {held} 个动量元素（优化器状态），不分片时是 {full} 个：约 1/{n}。", "  rank {rank}: holds {held} momentum elements (optimizer state) where an unsharded optimizer holds {full}: about 1/{n}."),
    "teach.state_full": ("  进程 {rank}：保存 {held} 个动量元素，也就是全部 {full} 个：优化器状态没有分片。", "  rank {rank}: holds {held} momentum elements, all {full} of them: the optimizer state is not sharded."),
}

def _runtime(ws, hidden):
    return (Check(f"ws{ws}.params", "value", 15, ("Reduce-Scatter 与 All-Gather 完成两步更新后的参数（{ws} 个进程）",
                  "Parameters after two steps through reduce_scatter and all_gather ({ws} ranks)"),
                  hidden=hidden, world_size=ws, quantity="params", op="all_gather"),
            Check(f"ws{ws}.momentum", "value", 10, ("动量只保存本进程的分片（{ws} 个进程）", "Momentum holds this rank's shard only ({ws} ranks)"),
                  hidden=hidden, world_size=ws, quantity="momentum", op="reduce_scatter"),
            Check(f"ws{ws}.primitives", "uses", 5, ("通信原语：reduce_scatter 与 all_gather，不用 all_reduce（{ws} 个进程）",
                  "Primitives: reduce_scatter and all_gather, no all_reduce ({ws} ranks)"), hidden=hidden, world_size=ws, forbid=("all_reduce",)))


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
        *(c for ws in VISIBLE + HIDDEN for c in _runtime(ws, hidden=ws in HIDDEN)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    teach=TEACH,
    todo=(Todo(("TODO 1（reduce_scatter）", "TODO 1 (reduce_scatter)"), op="reduce_scatter"), Todo(("TODO 2（分片更新）", "TODO 2 (the shard update)")),
          Todo(("TODO 3（all_gather）", "TODO 3 (all_gather)"), op="all_gather")),
)
