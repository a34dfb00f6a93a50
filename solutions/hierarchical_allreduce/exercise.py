"""Chapter 19, exercise 6: hierarchical all-reduce: inside the node, across the node leaders, back inside.

The chapter's "工程优化要点": "分层通信拓扑: 多机训练中，先机内 All-Reduce（利用 NVLink 高带宽），再机间 All-Reduce（利用
InfiniBand）... 先在每台机器内 8 卡 All-Reduce，再在 8 台机器间 All-Reduce（每台机器派一个代表），总通信量更少". Here
a node is NODE_SIZE = 2 consecutive ranks (ranks 2n and 2n + 1; rank 2n is its leader). Every rank holds
`local_tensor(rank)` (LENGTH = 512 float32 values) and run_worker(rank, world_size) leaves `total`: the
sum over every rank, on every rank, computed in three steps on groups made with dist.new_group (or
dist.new_subgroups, or a DeviceMesh of shape (nodes, NODE_SIZE)):
  1. inside each node, reduce to the node's leader (the node's sum lands on the leader);
  2. across nodes, all-reduce among the leaders only (one rank per node crosses the node boundary);
  3. inside each node, broadcast the leader's result.

What the chapter means. Its first step says "机内 All-Reduce": what the inter-node step needs is the node's
sum on the one rank that represents the node ("每台机器派一个代表"), which a reduce to the leader gives; an
all_reduce inside the node gives it too (every rank of the node then holds it, which costs a little more
inside the node and nothing more across nodes), and is accepted as the chapter's literal wording. What
matters is step 2: only one rank per node takes part in anything that crosses nodes; and step 3, since
after step 2 only the leaders hold the total. Also accepted: the bandwidth-optimal form of the same idea
(a reduce-scatter inside the node, an all-reduce of each shard among the ranks with the same index in
their node, an all-gather inside the node), and an all-reduce inside the node followed by an all-reduce
among the ranks of each local index: in both, every operation that crosses nodes takes one rank per node,
and the ranks that cross nodes together make sets of one rank per node (one set per local index) that never
mix. That is judged across the run, not operation by operation: 2-rank groups of every pair of ranks give
each operation one rank per node, yet ranks 0 and 1 both exchange data across nodes with rank 2: flat.
Point-to-point inside the node counts as the same steps (each rank sends its tensor to its leader, which adds
them up; after the leaders' all-reduce, the leader sends the total back): a send crosses nodes when its peer
is in another node. So does a gather to the leader, which adds up what it gathered (and a scatter back).
Not accepted: one flat all-reduce over every rank (the right sum; two ranks of each node send across the
boundary), and anything that makes a reduce or a broadcast cross nodes.

What is proven: the value, by the engine's tracer (combine="sum"): in a perturbed run every operation the
sum may come through carries secret deltas, and the sum must be made of what the broadcast (or the
all-reduce, the all-gather) delivered, whose senders sent what they had received (the leaders' all-reduce
of the node sums) down to every rank's own tensor. Then the groups check (grader/verify/kinds.py): with
nodes of 2 consecutive ranks, reduce and broadcast stay inside a node, every operation that crosses nodes
has one rank per node, and no two ranks of one node are linked through operations across nodes (directly
or through ranks of other nodes); it names what crossed and counts for a correct sum only.

Points (100): static 10 (run_worker reaches all_reduce); for each world size 30: the sum 20 (right on
every rank, derived from the communication), the hierarchy 10 (the groups check). World size 4 (2 nodes)
is visible; 6 (3 nodes) and 8 (4 nodes) are hidden. A flat all-reduce earns the static and value points:
70.
"""
from __future__ import annotations

import numpy as np

from grader.exercise import Check, Exercise, Quantity, Todo

LENGTH = 512
NODE_SIZE = 2
VISIBLE, HIDDEN = (4,), (6, 8)
OPS = ("reduce", "all_reduce", "broadcast", "reduce_scatter", "all_gather", "gather", "scatter", "send", "recv")
f32 = np.float32


def local_tensor(rank: int, ws: int = 0) -> np.ndarray:
    """torch.sin(torch.arange(512) * 0.1 * (rank + 1)) + rank, as float32 computes it"""
    index = np.arange(LENGTH, dtype=f32)
    return (np.sin(index * f32(0.1) * f32(rank + 1)) + f32(rank)).astype(np.float64)


def node_of(rank: int) -> list[int]:
    first = rank - rank % NODE_SIZE
    return list(range(first, first + NODE_SIZE))


def total(ws: int) -> np.ndarray:
    return np.sum([local_tensor(q) for q in range(ws)], axis=0)


# context=True although local reads nothing of the run: the engine's generic "a rank did not send its own data"
# cause (verify/diagnose.contribution_causes) reads every operation's sent data as the rank's own, so it would
# name each leader that forwards its node's sum into the leaders' all-reduce; it skips quantities declared with
# context=True (and then `expected` is needed)
TOTAL = Quantity("total", local=lambda rank, ws, ctx: local_tensor(rank), context=True, combine="sum", through=OPS,
                 expected=lambda rank, ws: total(ws), label=("所有进程的和 total", "the sum over every rank, total"))


# -- the exercise's own causes, from the values (and, for an exception, the error) -----------------------
def _close(values, expected) -> bool:
    return values is not None and values.shape == expected.shape and bool(np.allclose(values, expected, rtol=1e-5, atol=1e-5))


def mistakes(rank: int, ws: int) -> list[tuple[str, np.ndarray]]:
    """What a rank ends with after each mistake, with its cause (no two alike at 4, 6 and 8 ranks)."""
    node = node_of(rank)
    node_sum = np.sum([local_tensor(q) for q in node], axis=0)
    return [
        ("cause.counted_per_node", NODE_SIZE * total(ws)),
        ("cause.averaged", total(ws) / ws),
        ("cause.node_sum_only", node_sum),
        ("cause.no_broadcast", local_tensor(rank)),
        ("cause.broadcast_wrong_root", local_tensor(node[1])),     # src = the node's second rank
    ]


def diagnose(quantity: str, values, ws: int, rank: int, context: dict) -> list[tuple[str, dict]]:
    """Causes named in the exercise's terms (no values: hidden checks may show them). A rank that raised is
    explained by its error (its locals are a value in the making), whatever outcome the engine passes."""
    error = context.get("error")
    if error:
        message = str(error.get("message") or "")
        if "not part of" in message or "not in group" in message or "not in the group" in message:
            return [("cause.global_rank_in_group", {})]
        return []
    if context.get("outcome") != "wrong" or values is None or values.size != LENGTH:
        return []
    broadcast = any(c.op == "broadcast" and c.completed and c.ok for c in context.get("calls") or [])
    for key, wrong in mistakes(rank, ws):
        if key == "cause.no_broadcast" and broadcast:
            continue      # its own data after a broadcast: the broadcast came from the wrong rank
        if _close(values, wrong):
            return [(key, {})]
    return []


# -- the chapter's claim, in the student's run -----------------------------------------------------------
def teach(run, ctx) -> list[tuple[str, dict]]:
    """The bytes that crossed the node boundary, beside what one flat all-reduce would make cross."""
    n = run.request.world_size
    crossed = 0
    for rec in run.ranks:
        for call in rec.calls:
            if not (call.completed and call.ok and call.sends):
                continue
            if call.op == "send":   # a point-to-point send crosses when its peer is in another node
                peer = call.group[call.peer] if call.peer is not None and call.peer < len(call.group) else rec.rank
                ranks = {rec.rank, peer}
            else:
                ranks = set(call.group)
            if len({r // NODE_SIZE for r in ranks}) > 1:
                crossed += call.sent_bytes
    size = 4 * LENGTH
    return [("teach.header", {"ws": n, "node": NODE_SIZE, "nodes": n // NODE_SIZE}),
            ("teach.crossed", {"crossed": crossed, "flat": n * size, "size": size})]


MESSAGES = {
    "cause.counted_per_node": (
        "原因：结果是正确总和的 NODE_SIZE 倍：节点内 all_reduce 之后，节点里的每个进程都参加了跨节点的 all_reduce，"
        "每个节点的和被算了不止一次。跨节点那一步只让每个节点的 leader 参加。",
        "Cause: the result is NODE_SIZE times the right sum: after the all_reduce inside the node, every rank of the node "
        "joined the all_reduce across nodes, so each node's sum was counted more than once. Only each node's leader takes "
        "part across nodes."),
    "cause.averaged": (
        "原因：结果是平均值：这里要的是所有进程的和（ReduceOp.SUM，不要除以 world_size）。",
        "Cause: the result is the mean: this exercise asks for the sum over every rank (ReduceOp.SUM, no division by "
        "world_size)."),
    "cause.node_sum_only": (
        "原因：结果只是本节点的和，不含其他节点：跨节点的 all_reduce 没有生效。它必须在持有节点和的进程上进行"
        "（reduce 的 dst，即 leader），而且 broadcast 要在它之后。",
        "Cause: the result is this node's sum only, without the other nodes: the all_reduce across nodes had no effect. "
        "It must run on the ranks that hold the node sums (the reduce's dst, the leaders), and the broadcast comes after it."),
    "cause.no_broadcast": (
        "原因：这个进程的结果还是它自己的数据：跨节点 all_reduce 之后只有 leader 拿到了总和，"
        "还要在节点内由 leader 用 broadcast 发给其他进程。",
        "Cause: this rank still holds its own data: after the all_reduce across nodes only the leaders hold the sum, "
        "which a broadcast inside the node from the leader passes on."),
    "cause.broadcast_wrong_root": (
        "原因：节点内 broadcast 的 src 不是持有总和的 leader：整个节点拿到的是另一个进程的数据。"
        "src 要写 leader 的全局 rank（或者用 group_src=0）。",
        "Cause: the broadcast inside the node came from a rank other than the leader that holds the sum: the whole node "
        "got another rank's data. Give src the leader's global rank (or group_src=0)."),
    "cause.global_rank_in_group": (
        "原因：在节点的进程组上调用 reduce / broadcast 时，dst / src 是全局 rank：写 0 只对第一个节点有效，"
        "其他节点的组里没有 0 号进程。写 leader 的全局 rank（rank - rank % NODE_SIZE），或者用 group_dst / group_src（组内 rank）。",
        "Cause: with a node's group, reduce's dst and broadcast's src are global ranks: 0 works for the first node only, "
        "since the other nodes' groups have no rank 0. Give the leader's global rank (rank - rank % NODE_SIZE), or use "
        "group_dst / group_src (the rank inside the group)."),
    "teach.header": (
        "分层通信的账（{ws} 个进程，{nodes} 个节点，每个节点 {node} 个进程）：跨节点的带宽最贵，分层后每个节点只派一个 leader 跨节点通信。",
        "Hierarchical communication's account ({ws} ranks, {nodes} nodes of {node}): bandwidth across nodes is the "
        "dearest, and with a hierarchy each node sends one leader across."),
    "teach.crossed": (
        "  跨节点发送的数据：{crossed} 字节；一次扁平的 all_reduce 让每个进程都跨节点发送，共 {flat} 字节（每个进程 {size} 字节）。",
        "  data sent across nodes: {crossed} bytes; one flat all_reduce makes every rank send across nodes, {flat} bytes "
        "({size} bytes a rank)."),
}


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.total", "value", 20,
              ("分层 All-Reduce 的结果：所有进程的和（{ws} 个进程）", "Hierarchical all-reduce: the sum over every rank ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="total", op="all_reduce"),
        Check(f"ws{ws}.hierarchy", "groups", 10,
              ("分层：reduce、broadcast 只在节点内，跨节点每个节点一个进程（{ws} 个进程）",
               "Hierarchy: reduce and broadcast inside a node, one rank per node across nodes ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="total",
              params={"node": NODE_SIZE, "inside": ("reduce", "broadcast")}),
    )


EXERCISE = Exercise(
    name="hierarchical_allreduce",
    title=("分层 All-Reduce：节点内 reduce，leader 之间 all-reduce，节点内 broadcast",
           "Hierarchical all-reduce: reduce in the node, all-reduce across the leaders, broadcast in the node"),
    entry="run_worker",
    defines=("run_worker", "local_tensor"),
    files=("hierarchical_allreduce", "hierarchical_all_reduce", "hierarchical"),
    quantities=(TOTAL,),
    checks=(
        Check("static.all_reduce", "static", 10,
              ("静态检查：run_worker 调用了 dist.all_reduce", "Static: run_worker calls dist.all_reduce"), op="all_reduce"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    diagnose=diagnose,
    teach=teach,
    todo=(Todo(("TODO 1（进程组）", "TODO 1 (the groups)")),
          Todo(("TODO 2（节点内 reduce）", "TODO 2 (reduce in the node)"), op="reduce"),
          Todo(("TODO 3（leader 之间 all_reduce）", "TODO 3 (all_reduce across the leaders)"), op="all_reduce"),
          Todo(("TODO 4（节点内 broadcast）", "TODO 4 (broadcast in the node)"), op="broadcast")),
)
