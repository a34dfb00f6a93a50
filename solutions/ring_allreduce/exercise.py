"""Chapter 19.1: ring all-reduce built from send/recv, graded on its values and on its traffic.

Each rank holds `arange(LENGTH) * (rank + 1) * SCALE` (float32: a chunk put in the wrong place shows); the student
writes `ring_all_reduce(tensor, rank, world_size)`, summing in place with point-to-point operations only. LENGTH =
1031 divides by no world size tried: chunks are uneven. Points: static 10 (send/recv, no collective), runtime 10
(the same, world size 2); per world size 20: values 10 (the sum, proven), ring 5 (each rank sends to one neighbour
and receives from the other) and traffic 5 (2(N-1) sends of at most one chunk, S - (N-1) x floor(S/N) elements,
at most 2(N-1)/N x S in all: grader/verify/kinds/traffic.py), these two for a right sum only. World size 2 is
visible; 3, 4 and 5 hidden. The deadlock lesson: gloo does not buffer sends, so a blocking send before the recv on
every rank hangs from one element up; every check names it ("every rank is blocked in send").
"""
import numpy as np

from grader.comm import COLLECTIVES
from grader.exercise import Check, Exercise, Mistake, Quantity, SendsTo, SentAs

LENGTH = 1031                     # prime: uneven chunks at every world size
VISIBLE, HIDDEN = (2,), (3, 4, 5)
SCALE = 0.37                      # not small integers: sent as int16 or float16, the data would lose precision


def local(rank, ws):
    """torch.arange(LENGTH, dtype=torch.float32) * (rank + 1) * 0.37, as float32 computes it"""
    return (np.arange(LENGTH, dtype=np.float32) * np.float32(rank + 1) * np.float32(SCALE)).astype(np.float64)


TENSOR = Quantity("tensor", local=local, combine="sum", through=("send", "recv"),
                  label=("求和后的张量 tensor", "the summed tensor"))
RING = {"pattern": "ring"}
TRAFFIC = {"sends": lambda n: 2 * (n - 1), "sends_formula": "2(N-1)", "volume": "all_reduce",
           "function": "ring_all_reduce"}   # what `python -m grader bench` times against dist.all_reduce


def layouts(ws):
    """Chunk bounds students use: tensor_split (the first LENGTH % N one longer), ceil-sized (torch.chunk: the
    last shorter), LENGTH // N with the last or the first taking the rest, i * LENGTH // N offsets. Each
    chunk holds at most LENGTH - (N-1) x (LENGTH // N): the traffic check's largest chunk."""
    def bounds(sizes):
        return [(sum(sizes[:k]), sum(sizes[:k + 1])) for k in range(ws)]
    base, extra = divmod(LENGTH, ws)
    c, rest = -(-LENGTH // ws), LENGTH - (ws - 1) * base
    return [bounds([base + (k < extra) for k in range(ws)]), [(min(k * c, LENGTH), min((k + 1) * c, LENGTH)) for k in range(ws)],
            bounds([base] * (ws - 1) + [rest]), bounds([rest] + [base] * (ws - 1)),
            [(k * LENGTH // ws, (k + 1) * LENGTH // ws) for k in range(ws)]]


def step(comm, rank, ws, d=1, layout=0, add=True, gather=True):
    """A ring turning d: N - 1 reduce-scatter steps (add what arrives), then N - 1 all-gather steps (copy it).
    The knobs make the mistakes: the all-gather left out, what arrives copied instead of added."""
    chunks, t = layouts(ws)[layout], local(rank, ws).copy()
    for s in range(ws - 1):
        comm.send(t[slice(*chunks[(rank - d * s) % ws])], (rank + d) % ws)
        a, b = chunks[(rank - d * s - d) % ws]
        got = comm.recv((rank - d) % ws)
        t[a:b] = t[a:b] + got if add else got
    for s in range(ws - 1 if gather else 0):
        comm.send(t[slice(*chunks[(rank + d - d * s) % ws])], (rank + d) % ws)
        a, b = chunks[(rank - d * s) % ws]
        t[a:b] = comm.recv((rank - d) % ws)
    return {"tensor": t}


def _multipliers(values):   # each element of the right answer is index x SCALE x N(N+1)/2: whose data it holds
    return values[1:] / (np.arange(1, LENGTH) * SCALE)


def _subset_sums(values, rank, ws):   # whole numbers of ranks' data, varying along it, not its own: wrong chunks
    m = _multipliers(values)
    return bool(np.all(np.abs(m - np.round(m)) < 1e-3) and np.ptp(m) > 0.5 and not np.allclose(m, rank + 1, rtol=1e-5))


def _mean(values, rank, ws):   # the sum / N, where that is not the rank's own data (rank 1's at N = 3)
    return (ws + 1) / 2 != rank + 1 and bool(np.allclose(_multipliers(values), (ws + 1) / 2, rtol=1e-5))


def _tail_any(rank, ws):   # right but for the last LENGTH % N elements
    values = np.sum([local(q, ws) for q in range(ws)], axis=0)
    values[LENGTH - LENGTH % ws:] = np.nan
    return values


WAYS = [{"d": d, "layout": k} for d in (1, -1) for k in range(5)]
MISTAKES = (
    Mistake("cause.send_to_self", when=(SendsTo(lambda r, ws: {r}),), ws=lambda ws: ws > 1),
    Mistake("cause.not_neighbour", when=(SendsTo(lambda r, ws: set(range(ws)) - {r, (r + 1) % ws, (r - 1) % ws}),)),
    Mistake("cause.view_uneven", error=r"shape '\[[^\]]*\]' is invalid for input of size", ws=lambda ws: LENGTH % ws != 0),
    Mistake("cause.uneven", value=_tail_any, ws=lambda ws: LENGTH % ws != 0),
    *(Mistake("cause.no_all_gather", knobs={**way, "gather": False}) for way in WAYS),
    Mistake("cause.own_twice", test=lambda v, r, ws: bool(np.all(_multipliers(v) >= ws * (ws + 1) / 2 - 1e-3))),
    *(Mistake("cause.copy_not_add", when=(SentAs({**way, "add": False}),)) for way in WAYS),
    Mistake("cause.chunk_mixup", otherwise=True, test=_subset_sums),
    Mistake("cause.divided", test=_mean, ws=lambda ws: ws > 1),
)


def _runtime(ws, hidden):
    return (
        Check(f"ws{ws}.values", "value", 10, ("环形 All-Reduce 的结果（{ws} 个进程）", "Ring all-reduce: values ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="tensor"),
        Check(f"ws{ws}.ring", "traffic", 5, ("通信构成一个环（{ws} 个进程）", "Ring all-reduce: a ring of neighbours ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="tensor", params=RING),
        Check(f"ws{ws}.traffic", "traffic", 5, ("通信量不超过 2(N-1)/N × Size（{ws} 个进程）",
              "Ring all-reduce: traffic within 2(N-1)/N x Size ({ws} ranks)"), hidden=hidden, world_size=ws,
              quantity="tensor", params=TRAFFIC),
    )


MESSAGES = {
    "cause.forbidden": ("原因：本练习要用 send/recv 自己搭建 all-reduce，不能调用任何集合通信。",
                        "Cause: this exercise builds all-reduce from send/recv: no collective may be called."),
    "cause.uneven": ("原因：只有最后 N 除不尽的那几个元素不对——张量长度不能被 world_size 整除时，块的大小不相等，分块必须覆盖整个张量（例如 tensor.tensor_split(world_size)，或让最后一块取到末尾）。",
                     "Cause: only the last elements, those left over when the length is divided by world_size, are wrong: when the length is not divisible by world_size the chunks differ in size, and they must cover the whole tensor (tensor.tensor_split(world_size), or let the last chunk run to the end)."),
    "cause.own_twice": ("原因：结果里有的进程的数据被算了两次（数值偏大）——Reduce-Scatter 每一步只把收到的块加到自己的块上（chunk += incoming），不要再加一次自己的原始数据；All-Gather 每一步用收到的块替换自己的块（chunk.copy_(incoming)），不是再加上去。",
                        "Cause: some ranks' data is counted twice (the sum is too large): at each reduce-scatter step add only what arrived (chunk += incoming), not your own data once more; at each all-gather step what arrives replaces your chunk (chunk.copy_(incoming)), it is not added."),
    "cause.divided": ("原因：结果是总和除以 world_size（平均值）：这个练习的 all-reduce 求的是和，环结束后不要再除。",
                      "Cause: the result is the sum divided by world_size (the mean): this exercise's all-reduce is the sum; do not divide after the ring."),
    "cause.no_all_gather": ("原因：只有一块是完整的总和，其余的块仍是部分和——Reduce-Scatter 之后还需要 All-Gather 阶段（再 N - 1 步），把每个进程求好的那一块传给所有进程。",
                            "Cause: one chunk holds the complete sum and the others partial sums: after the reduce-scatter comes the all-gather phase (N - 1 more steps), which passes every rank's finished chunk to all."),
    "cause.send_to_self": ("原因：有进程把数据发给了它自己（dst 等于自己的 rank）：环中进程 r 只发给右邻居 (r + 1) % N，只从左邻居 (r - 1) % N 接收。",
                           "Cause: a rank sends to itself (dst is its own rank): in the ring, rank r sends only to its right neighbour (r + 1) % N and receives only from its left, (r - 1) % N."),
    "cause.not_neighbour": ("原因：有进程把数据发给了不是邻居的进程（例如 rank + 2）：环中进程 r 只发给右邻居 (r + 1) % N，只从左邻居 (r - 1) % N 接收。",
                            "Cause: a rank sends to a rank that is not its neighbour (rank + 2, say): in the ring, rank r sends only to its right neighbour (r + 1) % N and receives only from its left, (r - 1) % N."),
    "cause.view_uneven": ("原因：tensor.view(world_size, -1)（或 reshape）要求长度能被 world_size 整除，而这个张量的长度不能：请把它切成大小不等的块，例如 tensor.tensor_split(world_size)（块是原张量的视图，写入块就是写入张量）。",
                          "Cause: tensor.view(world_size, -1) (or reshape) needs a length that world_size divides, and this tensor's length is not divisible by it: cut it into chunks of unequal sizes instead, tensor.tensor_split(world_size) (views of the tensor: writing a chunk writes the tensor)."),
    "cause.copy_not_add": ("原因：每个元素只含一个进程的数据，不是总和，正是 Reduce-Scatter 每一步用收到的块覆盖自己的块时的结果：要把收到的块加到自己的块上（chunk += incoming，或 add_），不能用它覆盖（copy_、赋值）——覆盖会丢掉已经累加的部分和。",
                           "Cause: every element holds one rank's data, not the sum, exactly what a ring gives whose reduce-scatter steps copy what arrived over the chunk: add it to your chunk instead (chunk += incoming, or add_); copying it over (copy_, assignment) throws the partial sum away."),
    "cause.chunk_mixup": ("原因：有的块不是所有进程数据的总和（有的进程缺了，有的多算了）——检查每一步发送、接收并写回 tensor 的块：第 s 步，进程 r 在 Reduce-Scatter 中发送块 (r - s) % N、接收块 (r - s - 1) % N；在 All-Gather 中发送块 (r + 1 - s) % N、接收块 (r - s) % N。",
                          "Cause: some chunks are not the sum of every rank's data (a rank missing, or counted twice): check which chunk each step sends, receives and writes back into the tensor: at step s, rank r sends chunk (r - s) % N and receives chunk (r - s - 1) % N in the reduce-scatter, then sends chunk (r + 1 - s) % N and receives chunk (r - s) % N in the all-gather."),
}

EXERCISE = Exercise(
    name="ring_allreduce",
    title=("环形 All-Reduce：用 send/recv 自己搭建", "Ring all-reduce, built from send/recv"),
    defines=("run_worker", "ring_all_reduce"),
    files=("ring_allreduce", "ring_all_reduce"),
    quantities=(TENSOR,),
    forbidden=COLLECTIVES,
    step=step,
    checks=(
        Check("static.p2p_only", "static", 10, ("静态检查：只用点对点通信（send/recv），不用集合通信",
              "Static: point-to-point operations (send/recv) only, no collective"), op="send", forbid=COLLECTIVES),
        Check("ws2.p2p_only", "uses", 10, ("运行时：用了 send/recv，没有调用任何集合通信（{ws} 个进程）",
              "Run time: send/recv used, no collective ({ws} ranks)"), world_size=2, forbid=COLLECTIVES),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    mistakes=MISTAKES,
    todo=("请先完成 ring_all_reduce 里的 TODO", "complete the TODO in ring_all_reduce first"),
)
