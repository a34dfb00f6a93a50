# 19. 分布式通信原语实战 | Distributed Communication Primitives (All-Reduce, All-Gather)
#
#   python -m grader check dist_primitives.py     # 自检（2 个进程）/ check it yourself (2 ranks)
#   python dist_primitives.py                     # 直接运行 2 个进程 / run 2 ranks directly
#
# 每个进程（rank）代表一张 GPU。评分器会创建进程组并调用 run_worker(rank, world_size)；
# 你不需要自己调用 init_process_group（调用了也没关系）。
# Each process (rank) stands for one GPU. The grader creates the process group and calls
# run_worker(rank, world_size); you need not call init_process_group yourself (it does no harm).
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_worker(rank, world_size):
    """在子进程中执行的代码，代表单张 GPU 的视角。
    The code one rank runs: the view from a single GPU.

    TODO 1 (All-Reduce)：每个进程的局部梯度是 1024 个值都等于 rank + 1 的浮点张量；
        用 dist.all_reduce 求和后除以 world_size，每个进程都得到平均梯度。
        Each rank's local gradient holds 1024 floats equal to rank + 1; all_reduce it (sum),
        then divide by world_size, so that every rank holds the average.
    TODO 2 (All-Gather)：每个进程负责 128 个值都等于 rank 的一段特征；
        用 dist.all_gather 收集所有进程的分段，再用 torch.cat 拼成长度 128 * world_size 的完整向量。
        Each rank owns a slice of 128 floats equal to rank; all_gather every rank's slice and
        torch.cat them into one vector of 128 * world_size values.

    Returns:
        (gradient, full_feature): 形状 (1024,) 的平均梯度与形状 (128 * world_size,) 的完整特征。
        the averaged gradient, shape (1024,), and the full feature, shape (128 * world_size,).
    """
    # TODO 1: 模拟 DDP 的梯度同步场景 / gradient synchronisation as in DDP
    # gradient = ???
    # dist.all_reduce(...)
    # gradient /= world_size

    # TODO 2: 模拟 TP 的特征拼接场景 / feature concatenation as in tensor parallelism
    # local_feature = ???
    # gathered_list = ???
    # dist.all_gather(...)
    # full_feature = torch.cat(...)
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
        gradient, full_feature = run_worker(rank, world_size)
        if rank == 0:
            print(f"rank 0 gradient[:4] = {gradient[:4].tolist()}")
            print(f"rank 0 full_feature[::128] = {full_feature[::128].tolist()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
