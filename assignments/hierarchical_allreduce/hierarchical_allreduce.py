# 19.6 分层 All-Reduce | Hierarchical all-reduce: inside the node, across the leaders, back inside
#
#   python -m grader check hierarchical_allreduce.py     # 自检（4 个进程，2 个节点）/ check it yourself (4 ranks, 2 nodes)
#   python hierarchical_allreduce.py                     # 直接运行 4 个进程 / run 4 ranks directly
#
# 每个进程（rank）代表一张 GPU；每 NODE_SIZE = 2 个相邻的进程算作一台机器（节点）。评分器会创建进程组并调用
# run_worker(rank, world_size)；你不需要自己调用 init_process_group（调用了也没关系）。
# Each process (rank) stands for one GPU; every NODE_SIZE = 2 consecutive ranks make one machine (a node). The
# grader creates the process group and calls run_worker(rank, world_size); you need not call init_process_group.
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LENGTH = 512
NODE_SIZE = 2   # 每个节点的进程数：节点 n 是进程 2n 和 2n + 1，leader 是 2n / ranks 2n and 2n + 1; the leader is 2n


def local_tensor(rank):
    """本进程的数据：形状 (LENGTH,)，float32，每个进程都不同。
    This rank's data: shape (LENGTH,), float32, different on every rank."""
    return torch.sin(torch.arange(LENGTH, dtype=torch.float32) * 0.1 * (rank + 1)) + rank


def run_worker(rank, world_size):
    """分层 All-Reduce：每个进程最后都得到所有进程 local_tensor 的和。
    Hierarchical all-reduce: every rank ends with the sum of every rank's local_tensor.

    节点 / Nodes: 节点 n = 进程 [n * NODE_SIZE, (n + 1) * NODE_SIZE)，它的 leader 是 n * NODE_SIZE。
        Node n is ranks [n * NODE_SIZE, (n + 1) * NODE_SIZE); its leader is rank n * NODE_SIZE.

    TODO 1（进程组 / groups）：用 dist.new_group 为每个节点建一个组，再为所有 leader 建一个组。
        注意：每个进程都要按同样的顺序调用每一个 new_group（包括它不在其中的组）。
        dist.new_group one group per node, and one for the leaders. Every rank must call every new_group, in
        the same order (the groups it is not in included).
    TODO 2（节点内 reduce / reduce in the node）：dist.reduce 把节点内的数据加到 leader 上（dst 是全局 rank）。
        dist.reduce the node's data onto its leader (dst is a global rank).
    TODO 3（跨节点 all_reduce / across the leaders）：只有 leader 参加：在 leader 组上 dist.all_reduce。
        Only the leaders take part: dist.all_reduce on the leaders' group.
    TODO 4（节点内 broadcast / broadcast in the node）：leader 把总和 dist.broadcast 给本节点的其他进程。
        The leader dist.broadcasts the sum to the other ranks of its node.

    Returns:
        total: 所有进程数据的和，形状 (LENGTH,)；也可以保存在同名的局部变量 total 里。
        the sum of every rank's data, shape (LENGTH,); or keep it in a local variable named total.
    """
    # total = local_tensor(rank)
    # TODO 1: node_groups = [dist.new_group(...) for ...]; leaders = dist.new_group(...)
    # TODO 2: dist.reduce(total, dst=leader, group=...)
    # TODO 3: if rank == leader: dist.all_reduce(total, group=leaders)
    # TODO 4: dist.broadcast(total, src=leader, group=...)
    raise NotImplementedError("请先完成这里的 TODO / complete the TODO here first")


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
        total = run_worker(rank, world_size)
        print(f"rank {rank}: total[:3] = {total[:3].tolist()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(4, _free_port()), nprocs=4, join=True)
