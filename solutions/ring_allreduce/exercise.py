"""Chapter 19.1: ring all-reduce built from send/recv, graded on its values and on its traffic.

Each rank holds `arange(LENGTH) * (rank + 1) * SCALE` (float32; data that varies with the element index, so a
chunk put in the wrong place shows). The student writes `ring_all_reduce(tensor, rank, world_size)`,
which sums `tensor` in place over the ranks with point-to-point operations only (send/recv, isend/irecv,
batch_isend_irecv); `run_worker(rank, world_size)` (given) calls it and returns the tensor. LENGTH = 1031
is divisible by none of the world sizes tried, so chunks are uneven.

Points (100):
  static 10     run_worker reaches send/recv and no collective (the chapter's ring, not dist.all_reduce)
  runtime 10    send/recv used and no collective ran (world size 2)
  per world size, 20 = values 10 + ring 5 + traffic 5; world size 2 is visible, 3, 4 and 5 are hidden:
    values      the sum, right on every rank and derived from what the other ranks sent (provenance)
    ring        each rank sends only to one neighbour and receives only from the other, the same way
                round on every rank (either way)
    traffic     2(N-1) sends per rank in the tensor's own dtype, each of at most one chunk (S // N elements
                with one chunk taking the remainder: at most S - (N-1) x floor(S/N) elements, the largest
                chunk of any of the layouts in _layouts), and at most 2(N-1)/N x S elements in all (S: the
                tensor's element count), plus one element per send for uneven chunks (grader/verify/traffic.py)
  Ring and traffic points are for a correct all-reduce: they count once the values check passes at that
  world size (a forged ring that computes the answer locally earns neither).

The deadlock lesson (measured on gloo, torch 2.13): gloo does not buffer sends, so blocking send before
recv on every rank hangs from a single element up (1 element at 2 and 3 ranks already deadlocks; the
threshold is 1 element). Every check runs such a program into the grader's deadlock detection, the hidden
ones included, whose verdict names it: "every rank is blocked in send; post the receive first (irecv) or
alternate the order by rank parity".
"""
import re

import numpy as np

from grader.comm import COLLECTIVES
from grader.exercise import Check, Exercise, Quantity

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


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.values", "value", 10, ("环形 All-Reduce 的结果（{ws} 个进程）", "Ring all-reduce: values ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="tensor"),
        Check(f"ws{ws}.ring", "traffic", 5, ("通信构成一个环（{ws} 个进程）", "Ring all-reduce: a ring of neighbours ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="tensor", params=RING),
        Check(f"ws{ws}.traffic", "traffic", 5, ("通信量不超过 2(N-1)/N × Size（{ws} 个进程）",
                                                "Ring all-reduce: traffic within 2(N-1)/N x Size ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="tensor", params=TRAFFIC),
    )


# -- the exercise's own causes for a wrong sum (diagnose), from the values alone -------------------

def _layouts(ws: int) -> list[list[tuple[int, int]]]:
    """Chunk boundaries students use: tensor_split / np.array_split (the first LENGTH % N chunks one longer),
    ceil-sized chunks (torch.chunk, math.ceil offsets: the last one shorter), LENGTH // N each with the last
    chunk taking the remainder, or the first, and i * LENGTH // N offsets. Every chunk of these holds at most
    LENGTH - (N-1) x (LENGTH // N) elements: the traffic check's largest chunk (verify/traffic.largest_chunk)."""
    def bounds(sizes):
        return [(sum(sizes[:k]), sum(sizes[:k + 1])) for k in range(ws)]
    base, extra = divmod(LENGTH, ws)
    split = bounds([base + (1 if k < extra else 0) for k in range(ws)])
    c = -(-LENGTH // ws)
    ceil = [(min(k * c, LENGTH), min((k + 1) * c, LENGTH)) for k in range(ws)]
    rest = LENGTH - (ws - 1) * base
    last = bounds([base] * (ws - 1) + [rest])
    first = bounds([rest] + [base] * (ws - 1))
    spread = [(k * LENGTH // ws, (k + 1) * LENGTH // ws) for k in range(ws)]
    layouts = []
    for layout in (split, ceil, last, first, spread):   # at some N two of them coincide
        if layout not in layouts:
            layouts.append(layout)
    return layouts


def after_reduce_scatter(ws: int, rank: int, d: int, layout, add: bool = True) -> np.ndarray:
    """Rank `rank`'s tensor after the N - 1 reduce-scatter steps of a ring turning d (+1 or -1), and no
    all-gather: what a solution that stops halfway returns. add=False: each step copies what arrived
    over the chunk instead of adding it."""
    return _ring(ws, d, layout, add, gather=False)[rank]


def _ring(ws: int, d: int, layout, add: bool, gather: bool, sends: list | None = None) -> list[np.ndarray]:
    """Every rank's tensor after a ring turning d (the reduce-scatter, then the all-gather if `gather`);
    `sends`, when given, collects what each rank sends, in order (one list per rank)."""
    state = [local(q, ws) for q in range(ws)]
    if sends is not None:
        sends[:] = [[] for _ in range(ws)]
    for s in range(ws - 1):
        sent = [state[q][slice(*layout[(q - d * s) % ws])].copy() for q in range(ws)]
        for q in range(ws):
            a, b = layout[(q - d * s) % ws]
            if add:
                state[(q + d) % ws][a:b] += sent[q]
            else:
                state[(q + d) % ws][a:b] = sent[q]
        for q in range(ws) if sends is not None else ():
            sends[q].append(sent[q])
    for s in range(ws - 1 if gather else 0):
        sent = [state[q][slice(*layout[(q + d - d * s) % ws])].copy() for q in range(ws)]
        for q in range(ws):
            a, b = layout[(q + d - d * s) % ws]
            state[(q + d) % ws][a:b] = sent[q]
        for q in range(ws) if sends is not None else ():
            sends[q].append(sent[q])
    return state


def copied_not_added(ws: int, rank: int, d: int, layout, sent: list) -> bool:
    """The rank's sends are, one by one, those of a whole ring turning d whose reduce-scatter steps copy what
    arrived over the chunk (copy_) instead of adding it. (Its values alone do not tell: an all-gather that
    starts one chunk early ends with the same numbers, from other sends.)"""
    expected: list = []
    _ring(ws, d, layout, add=False, gather=True, sends=expected)
    mine = expected[rank]
    return len(sent) == len(mine) and all(a.shape == b.shape and np.allclose(a, b, rtol=1e-5) for a, b in zip(sent, mine))


def _peers(call, rank):
    """A point-to-point call's peer as a global rank (None: not known)."""
    peer = call.peer if call.peer is not None else call.source
    if peer is None:
        return None
    group = list(call.group or ())
    return group[peer] if 0 <= peer < len(group) else peer


def diagnose(name, data, ws, rank, context):
    """Which step of the ring went wrong. From the rank's operations: a send to itself or to a rank that is
    not a neighbour; from its exception: chunks cut with view / reshape, which need a length the world size
    divides. From the values of a rank that returned a wrong sum: every element of the right answer is
    index x SCALE x N(N+1)/2, and the multipliers data[i] / (i SCALE) say which ranks' data an element holds."""
    calls = context.get("calls") or []
    sends = [c for c in calls if c.op == "send"]
    if ws > 1 and any(_peers(c, rank) == rank for c in sends):
        return [("cause.send_to_self", {})]
    if ws > 2 and any(_peers(c, rank) not in ((rank + 1) % ws, (rank - 1) % ws) for c in sends):
        return [("cause.not_neighbour", {})]
    error = context.get("error") or {}
    message = str(error.get("message") or "")
    if error.get("type") == "RuntimeError" and LENGTH % ws and re.search(r"shape '\[[^\]]*\]' is invalid for input of size", message):
        return [("cause.view_uneven", {})]
    if data is None or data.size != LENGTH or ws < 2 or not context.get("returned", True):
        return []
    full = ws * (ws + 1) / 2
    m = data[1:] / (np.arange(1, LENGTH) * SCALE)
    right = np.isclose(m, full, rtol=1e-5)
    if right.all():
        return []
    if np.allclose(m, rank + 1, rtol=1e-5):
        return []   # its own data, unchanged: the engine says so (nothing received reached the tensor)
    tail = LENGTH % ws
    if tail and right[: LENGTH - 1 - tail].all():
        return [("cause.uneven", {})]
    if any(np.allclose(data, after_reduce_scatter(ws, rank, d, layout), rtol=1e-5)
           for d in (1, -1) for layout in _layouts(ws)):
        return [("cause.no_all_gather", {})]
    if np.all(m >= full - 1e-3):
        return [("cause.own_twice", {})]
    sent = [np.concatenate([v for v in c.sent_values() if v is not None] or [np.zeros(0)]) for c in sends]
    if any(copied_not_added(ws, rank, d, layout, sent) for d in (1, -1) for layout in _layouts(ws)):
        return [("cause.copy_not_add", {})]   # what arrived replaced the partial sum instead of adding to it
    return [("cause.chunk_mixup", {})]


MESSAGES = {
    "cause.forbidden": ("原因：本练习要用 send/recv 自己搭建 all-reduce，不能调用任何集合通信。",
                        "Cause: this exercise builds all-reduce from send/recv: no collective may be called."),
    "cause.uneven": ("原因：只有最后 N 除不尽的那几个元素不对——张量长度不能被 world_size 整除时，块的大小不相等，"
                     "分块必须覆盖整个张量（例如 tensor.tensor_split(world_size)，或让最后一块取到末尾）。",
                     "Cause: only the last elements, those left over when the length is divided by world_size, are wrong: "
                     "when the length is not divisible by world_size the chunks differ in size, and they must cover the "
                     "whole tensor (tensor.tensor_split(world_size), or let the last chunk run to the end)."),
    "cause.own_twice": ("原因：结果里有的进程的数据被算了两次（数值偏大）——Reduce-Scatter 每一步只把收到的块加到自己的块上"
                        "（chunk += incoming），不要再加一次自己的原始数据。",
                        "Cause: some ranks' data is counted twice (the sum is too large): at each reduce-scatter step add "
                        "only what arrived (chunk += incoming), not your own data once more."),
    "cause.no_all_gather": ("原因：只有一块是完整的总和，其余的块仍是部分和——Reduce-Scatter 之后还需要 All-Gather 阶段"
                            "（再 N - 1 步），把每个进程求好的那一块传给所有进程。",
                            "Cause: one chunk holds the complete sum and the others partial sums: after the reduce-scatter "
                            "comes the all-gather phase (N - 1 more steps), which passes every rank's finished chunk to all."),
    "cause.send_to_self": ("原因：有进程把数据发给了它自己（dst 等于自己的 rank）：环中进程 r 只发给右邻居 (r + 1) % N，只从左邻居 (r - 1) % N 接收。",
                           "Cause: a rank sends to itself (dst is its own rank): in the ring, rank r sends only to its right neighbour "
                           "(r + 1) % N and receives only from its left, (r - 1) % N."),
    "cause.not_neighbour": ("原因：有进程把数据发给了不是邻居的进程（例如 rank + 2）：环中进程 r 只发给右邻居 (r + 1) % N，只从左邻居 (r - 1) % N 接收。",
                            "Cause: a rank sends to a rank that is not its neighbour (rank + 2, say): in the ring, rank r sends only to "
                            "its right neighbour (r + 1) % N and receives only from its left, (r - 1) % N."),
    "cause.view_uneven": ("原因：tensor.view(world_size, -1)（或 reshape）要求长度能被 world_size 整除，而这个张量的长度不能：请把它切成大小不等的块，"
                          "例如 tensor.tensor_split(world_size)（块是原张量的视图，写入块就是写入张量）。",
                          "Cause: tensor.view(world_size, -1) (or reshape) needs a length that world_size divides, and this tensor's "
                          "length is not divisible by it: cut it into chunks of unequal sizes instead, tensor.tensor_split(world_size) "
                          "(views of the tensor: writing a chunk writes the tensor)."),
    "cause.copy_not_add": ("原因：每个元素只含一个进程的数据，不是总和，正是 Reduce-Scatter 每一步用收到的块覆盖自己的块时的结果："
                           "要把收到的块加到自己的块上（chunk += incoming，或 add_），不能用它覆盖（copy_、赋值）——覆盖会丢掉已经累加的部分和。",
                           "Cause: every element holds one rank's data, not the sum, exactly what a ring gives whose reduce-scatter "
                           "steps copy what arrived over the chunk: add it to your chunk instead (chunk += incoming, or add_); copying "
                           "it over (copy_, assignment) throws the partial sum away."),
    "cause.chunk_mixup": ("原因：有的块不是所有进程数据的总和（有的进程缺了，有的多算了）——检查每一步发送和接收的块号："
                          "第 s 步，进程 r 在 Reduce-Scatter 中发送块 (r - s) % N、接收块 (r - s - 1) % N；"
                          "在 All-Gather 中发送块 (r + 1 - s) % N、接收块 (r - s) % N。",
                          "Cause: some chunks are not the sum of every rank's data (a rank missing, or counted twice): check "
                          "the chunk index of each step: at step s, rank r sends chunk (r - s) % N and receives chunk "
                          "(r - s - 1) % N in the reduce-scatter, then sends chunk (r + 1 - s) % N and receives chunk "
                          "(r - s) % N in the all-gather."),
}

EXERCISE = Exercise(
    name="ring_allreduce",
    title=("环形 All-Reduce：用 send/recv 自己搭建", "Ring all-reduce, built from send/recv"),
    entry="run_worker",
    defines=("run_worker", "ring_all_reduce"),
    files=("ring_allreduce", "ring_all_reduce"),
    quantities=(TENSOR,),
    forbidden=COLLECTIVES,
    checks=(
        Check("static.p2p_only", "static", 10, ("静态检查：只用点对点通信（send/recv），不用集合通信",
                                                "Static: point-to-point operations (send/recv) only, no collective"),
              op="send", forbid=COLLECTIVES),
        Check("ws2.p2p_only", "uses", 10, ("运行时：用了 send/recv，没有调用任何集合通信（{ws} 个进程）",
                                           "Run time: send/recv used, no collective ({ws} ranks)"),
              world_size=2, forbid=COLLECTIVES),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    messages=MESSAGES,
    todo=("请先完成 ring_all_reduce 里的 TODO", "complete the TODO in ring_all_reduce first"),
    diagnose=diagnose,
)
