# 19.1 环形 All-Reduce：用 send/recv 自己搭建 | Ring all-reduce, built from send/recv
#
#   python -m grader check ring_allreduce.py      # 自检（2 个进程）/ check it yourself (2 ranks)
#   python -m grader bench ring_allreduce.py      # 与 dist.all_reduce 比较带宽 / bandwidth against dist.all_reduce
#   python ring_allreduce.py                      # 直接运行 2 个进程 / run 2 ranks directly
#
# 每个进程（rank）代表一张 GPU。评分器会创建进程组并调用 run_worker(rank, world_size)；
# 你只需要补全 ring_all_reduce。本练习不允许使用任何集合通信（all_reduce、reduce_scatter、
# all_gather、broadcast、reduce、all_to_all、gather、scatter）：只用点对点通信。
# Each process (rank) stands for one GPU. The grader creates the process group and calls
# run_worker(rank, world_size); you complete ring_all_reduce. No collective is allowed here
# (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, gather, scatter):
# point-to-point operations only.
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LENGTH = 1031   # 质数：块的大小一般不相等 / prime: chunks generally differ in size


def ring_all_reduce(tensor, rank, world_size):
    """把所有进程的 tensor 按元素求和，结果原地写回每个进程的 tensor（环形算法，只用点对点通信）。
    Sum `tensor` elementwise over all ranks, in place on every rank (a ring, point-to-point only).

    把一维张量切成 world_size 块（块大小可以不等，例如 tensor.tensor_split(world_size)）。
    进程 r 只发给右邻居 (r + 1) % N，只从左邻居 (r - 1) % N 接收：
    Cut the 1-D tensor into world_size chunks (sizes may differ: tensor.tensor_split(world_size)).
    Rank r sends only to its right neighbour (r + 1) % N and receives only from its left (r - 1) % N:

    1. Reduce-Scatter（N - 1 步 / steps）：第 s 步，发送块 (r - s) % N，接收块 (r - s - 1) % N
       并加到自己的那一块上。结束时进程 r 拥有完整求和的块 (r + 1) % N。
       At step s send chunk (r - s) % N, receive chunk (r - s - 1) % N and add it to yours.
       Afterwards rank r holds the complete sum of chunk (r + 1) % N.
    2. All-Gather（N - 1 步 / steps）：第 s 步，发送块 (r + 1 - s) % N，接收块 (r - s) % N
       并覆盖自己的那一块。
       At step s send chunk (r + 1 - s) % N, receive chunk (r - s) % N and overwrite yours with it.

    每个进程共发送 2(N - 1) 次，约 2(N - 1)/N × Size 字节——评分器会测量。
    Each rank sends 2(N - 1) times, about 2(N - 1)/N × Size bytes: the grader measures it.

    死锁 / deadlock：gloo 不缓存发送——send 要等对方调用 recv 才会完成（实测：1 个元素也会卡住）。
    如果每个进程都先阻塞 send 再 recv，所有进程会互相等待。请先发起接收（dist.irecv）、用
    isend/irecv 成对发起再 wait()，或者按 rank 奇偶交替收发顺序。
    gloo does not buffer sends: a send completes only once the peer posts its receive (measured:
    a single element already hangs). If every rank calls a blocking send before its recv, they all
    wait. Post the receive first (dist.irecv), start isend/irecv pairs and then wait(), or alternate
    the order by rank parity.
    """
    # TODO: 实现环形 All-Reduce / implement the ring all-reduce
    # chunks = ???
    # right, left = ???
    # for step in range(world_size - 1):  # reduce-scatter
    #     ...
    # for step in range(world_size - 1):  # all-gather
    #     ...
    raise NotImplementedError("请先完成这里的 TODO / complete the TODO here first")


def run_worker(rank, world_size):
    """每个进程的数据随元素下标变化：rank r 持有 arange(LENGTH) * (r + 1) * 0.37（float32，不是小整数：
    换成更窄的类型传输会丢精度）。
    Each rank's data varies with the element index: rank r holds arange(LENGTH) * (r + 1) * 0.37 (float32,
    not small integers: sent as a narrower type, it would lose precision).

    Returns:
        tensor：求和之后的张量，形状 (LENGTH,)，每个进程都等于 arange(LENGTH) * N(N + 1)/2 * 0.37。
        the tensor after the sum, shape (LENGTH,): arange(LENGTH) * N(N + 1)/2 * 0.37 on every rank.
    """
    tensor = torch.arange(LENGTH, dtype=torch.float32) * (rank + 1) * 0.37
    ring_all_reduce(tensor, rank, world_size)
    return tensor


# ---------------------------------------------------------------------------------------------
# 直接运行本文件时的小测试 / a small harness for running this file directly (the grader ignores it)

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        tensor = run_worker(rank, world_size)
        expected = torch.arange(LENGTH, dtype=torch.float32) * (world_size * (world_size + 1) / 2) * 0.37
        print(f"rank {rank}: tensor[:4] = {tensor[:4].tolist()}, right: {torch.allclose(tensor, expected)}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
