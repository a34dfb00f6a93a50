"""Chapter 19, exercise 6: hierarchical all-reduce: inside the node, across the node leaders, back inside.

The chapter's "分层通信拓扑: 先机内 All-Reduce ... 再机间 All-Reduce（每台机器派一个代表）", step by step. A node is NODE_SIZE = 2
consecutive ranks (rank 2n is its leader). Every rank holds `local_tensor(rank)` (LENGTH = 512 float32 values)
and run_worker leaves `total`, the sum over every rank, made in three steps on groups of dist.new_group (or
new_subgroups, or a DeviceMesh): reduce to the leader inside the node; all-reduce among the leaders only; broadcast
the leader's result inside the node. Also accepted: an all-reduce inside the node (the chapter's wording), the
bandwidth-optimal form (reduce-scatter in the node, all-reduce of each shard across nodes, all-gather in the node),
and point to point inside the node. Not accepted: one flat all-reduce, or a reduce or broadcast across nodes.
The sum is proven by the engine's tracer (leaders forward their node's sum); the groups check judges, with
nodes of 2 consecutive ranks, what crossed nodes, across the run (2-rank groups of every pair are flat).
Points (100): static 10; per world size 30: the sum 20, the hierarchy 10 (for a right sum). World size 4
(2 nodes) is visible; 6 and 8 are hidden. A flat all-reduce earns 70.
"""
import numpy as np

from grader.exercise import Check, Exercise, Mistake, NotRan, Quantity, Ran, Sent, Teach, Todo

LENGTH, NODE_SIZE = 512, 2
VISIBLE, HIDDEN = (4,), (6, 8)
OPS = ("reduce", "all_reduce", "broadcast", "reduce_scatter", "all_gather", "gather", "scatter", "send", "recv")
f32 = np.float32


def local_tensor(rank, ws=0):
    """torch.sin(torch.arange(512) * 0.1 * (rank + 1)) + rank, as float32 computes it"""
    return (np.sin(np.arange(LENGTH, dtype=f32) * f32(0.1) * f32(rank + 1)) + f32(rank)).astype(np.float64)


def node_of(rank):
    return list(range(rank - rank % NODE_SIZE, rank - rank % NODE_SIZE + NODE_SIZE))


def total(ws):
    return np.sum([local_tensor(q) for q in range(ws)], axis=0)


TOTAL = Quantity("total", local=local_tensor, combine="sum", through=OPS, forwards=True,
                 label=("所有进程的和 total", "the sum over every rank, total"))
MISTAKES = (
    Mistake("cause.global_rank_in_group", error=r"not part of|not in (the )?group"),
    Mistake("cause.counted_per_node", value=lambda r, ws: NODE_SIZE * total(ws)),
    Mistake("cause.averaged", value=lambda r, ws: total(ws) / ws),
    # (where the nodes are as many as a node's ranks, a division by the number of nodes leaves the same numbers)
    Mistake("cause.divided_by_node_size", value=lambda r, ws: total(ws) / NODE_SIZE, ws=lambda ws: ws // NODE_SIZE != NODE_SIZE),
    Mistake("cause.node_sum_only", value=lambda r, ws: np.sum([local_tensor(q) for q in node_of(r)], axis=0)),
    Mistake("cause.no_broadcast", value=local_tensor, when=(NotRan("broadcast"),)),
    # the node's second rank broadcast (its own data: the reduce left its buffer as it was), seen on that rank: a
    # non-leader that kept its own data after a broadcast from the leader (received into another tensor) is not it
    Mistake("cause.broadcast_wrong_root", value=lambda r, ws: local_tensor(node_of(r)[1]), tie=(Ran("broadcast"),),
            when=(Sent("broadcast", own=lambda r, ws: [local_tensor(r)]),)),
)
TEACH = (
    Teach("teach.header", per="run", say=lambda f: {"node": NODE_SIZE, "nodes": f.ws // NODE_SIZE}),
    Teach("teach.crossed", per="run", say=lambda f: {"crossed": f.crossed(NODE_SIZE), "flat": f.ws * 4 * LENGTH,
                                                     "size": 4 * LENGTH}),
)

MESSAGES = {
    "cause.counted_per_node": ("原因：结果是正确总和的 NODE_SIZE 倍：节点内 all_reduce 之后，节点里的每个进程都参加了跨节点的 all_reduce，每个节点的和被算了不止一次。跨节点那一步只让每个节点的 leader 参加。",
                               "Cause: the result is NODE_SIZE times the right sum: after the all_reduce inside the node, every rank of the node joined the all_reduce across nodes, so each node's sum was counted more than once. Only each node's leader takes part across nodes."),
    "cause.averaged": ("原因：结果是平均值：这里要的是所有进程的和（ReduceOp.SUM，不要除以 world_size）。",
                       "Cause: the result is the mean: this exercise asks for the sum over every rank (ReduceOp.SUM, no division by world_size)."),
    "cause.divided_by_node_size": ("原因：结果是总和除以 NODE_SIZE：每个节点的和被除以了节点里的进程数（求了节点内的平均），跨节点那一步加起来的是这些平均值。这里要的是所有进程的和：节点内和跨节点都用 SUM，不要除。",
                                   "Cause: the result is the sum divided by NODE_SIZE: each node's sum was divided by the ranks of the node (a node mean), and the step across nodes added those means. This exercise asks for the sum over every rank: SUM inside the node and across nodes, no division."),
    "cause.node_sum_only": ("原因：结果只是本节点的和，不含其他节点：跨节点的 all_reduce 没有生效。它必须在持有节点和的进程上进行（reduce 的 dst，即 leader），而且 broadcast 要在它之后。",
                            "Cause: the result is this node's sum only, without the other nodes: the all_reduce across nodes had no effect. It must run on the ranks that hold the node sums (the reduce's dst, the leaders), and the broadcast comes after it."),
    "cause.no_broadcast": ("原因：这个进程的结果还是它自己的数据：跨节点 all_reduce 之后只有 leader 拿到了总和，还要在节点内由 leader 用 broadcast 发给其他进程。",
                           "Cause: this rank still holds its own data: after the all_reduce across nodes only the leaders hold the sum, which a broadcast inside the node from the leader passes on."),
    "cause.broadcast_wrong_root": ("原因：节点内 broadcast 的 src 不是持有总和的 leader：整个节点拿到的是另一个进程的数据。src 要写 leader 的全局 rank（或者用 group_src=0）。",
                                   "Cause: the broadcast inside the node came from a rank other than the leader that holds the sum: the whole node got another rank's data. Give src the leader's global rank (or group_src=0)."),
    "cause.global_rank_in_group": ("原因：在节点的进程组上调用 reduce / broadcast 时，dst / src 是全局 rank：组内的序号（例如 rank % NODE_SIZE）只在第一个节点里碰巧等于全局 rank，其他节点的组里没有这个进程。写 leader 的全局 rank（rank - rank % NODE_SIZE），或者用 group_dst / group_src（组内 rank）。",
                                   "Cause: with a node's group, reduce's dst and broadcast's src are global ranks: a rank inside the group (rank % NODE_SIZE, say) equals the global rank in the first node only, and the other nodes' groups do not hold that rank. Give the leader's global rank (rank - rank % NODE_SIZE), or use group_dst / group_src (the rank inside the group)."),
    "teach.header": ("分层通信的账（{ws} 个进程，{nodes} 个节点，每个节点 {node} 个进程）：跨节点的带宽最贵，分层后每个节点只派一个 leader 跨节点通信。",
                     "Hierarchical communication's account ({ws} ranks, {nodes} nodes of {node}): bandwidth across nodes is the dearest, and with a hierarchy each node sends one leader across."),
    "teach.crossed": ("  跨节点发送的数据：{crossed} 字节；一次扁平的 all_reduce 让每个进程都跨节点发送，共 {flat} 字节（每个进程 {size} 字节）。",
                      "  data sent across nodes: {crossed} bytes; one flat all_reduce makes every rank send across nodes, {flat} bytes ({size} bytes a rank)."),
}


def _runtime(ws, hidden):
    return (
        Check(f"ws{ws}.total", "value", 20, ("分层 All-Reduce 的结果：所有进程的和（{ws} 个进程）",
              "Hierarchical all-reduce: the sum over every rank ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="total", op="all_reduce"),
        Check(f"ws{ws}.hierarchy", "groups", 10, ("分层：reduce、broadcast 只在节点内，跨节点每个节点一个进程（{ws} 个进程）",
              "Hierarchy: reduce and broadcast inside a node, one rank per node across nodes ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="total", params={"node": NODE_SIZE, "inside": ("reduce", "broadcast")}),
    )


EXERCISE = Exercise(
    name="hierarchical_allreduce",
    title=("分层 All-Reduce：节点内 reduce，leader 之间 all-reduce，节点内 broadcast",
           "Hierarchical all-reduce: reduce in the node, all-reduce across the leaders, broadcast in the node"),
    defines=("run_worker", "local_tensor"),
    files=("hierarchical_allreduce", "hierarchical_all_reduce", "hierarchical"),
    quantities=(TOTAL,),
    checks=(
        Check("static.all_reduce", "static", 10, ("静态检查：run_worker 调用了 dist.all_reduce", "Static: run_worker calls dist.all_reduce"),
              op="all_reduce"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    teach=TEACH,
    todo=(Todo(("TODO 1（进程组）", "TODO 1 (the groups)")),
          Todo(("TODO 2（节点内 reduce）", "TODO 2 (reduce in the node)"), op="reduce"),
          Todo(("TODO 3（leader 之间 all_reduce）", "TODO 3 (all_reduce across the leaders)"), op="all_reduce"),
          Todo(("TODO 4（节点内 broadcast）", "TODO 4 (broadcast in the node)"), op="broadcast")),
)
