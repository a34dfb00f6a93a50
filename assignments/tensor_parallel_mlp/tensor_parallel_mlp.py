# 张量并行 MLP（Megatron）| A tensor-parallel MLP, Megatron style (column-parallel, GeLU, row-parallel)
#
#   python -m grader check tensor_parallel_mlp.py     # 自检（2 个进程）/ check it yourself (2 ranks)
#   python tensor_parallel_mlp.py                     # 直接运行 2 个进程 / run 2 ranks directly
#
# 每个进程（rank）代表一张 GPU。评分器会创建进程组并调用 run_worker(rank, world_size)；
# 你不需要自己调用 init_process_group（调用了也没关系）。
# Each process (rank) stands for one GPU. The grader creates the process group and calls
# run_worker(rank, world_size); you need not call init_process_group yourself (it does no harm).
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

TOKENS = 4   # X 的行数（token 数）/ rows of X (tokens)
D = 8        # 模型维度：X、Y 的列数 / the model dimension: columns of X and Y
H = 12       # 隐藏层宽度，能被 2、3、4 整除 / the hidden width, divisible by 2, 3 and 4


def _grid(rows, cols, mul, mod, shift, den):
    index = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    return (index * mul % mod - shift) / den


def make_input():
    """输入 X：形状 (TOKENS, D)，float32，每个进程都一样（张量并行切分的是权重，不是数据）。
    The input X: shape (TOKENS, D), float32, the same on every rank (tensor parallelism splits the weights,
    not the data)."""
    return _grid(TOKENS, D, 3, 11, 5, 8)


def make_target():
    """目标 T：形状 (TOKENS, D)；loss = 0.5 * ((Y - T) ** 2).sum()，所以 dY = Y - T。
    The target T: shape (TOKENS, D); loss = 0.5 * ((Y - T) ** 2).sum(), so dY = Y - T."""
    return _grid(TOKENS, D, 2, 7, 3, 4)


def make_weights():
    """完整的权重 (A, B)：A 形状 (D, H)，B 形状 (H, D)，每个进程都一样；每个进程只用自己那一片。
    The full weights (A, B): A of shape (D, H), B of shape (H, D), the same on every rank; each rank uses
    its own shard only."""
    return _grid(D, H, 5, 13, 6, 16), _grid(H, D, 7, 9, 4, 16)


def gelu_grad(u):
    """F.gelu（erf 形式）的导数，逐元素 / the derivative of F.gelu (the erf form), elementwise."""
    return 0.5 * (1 + torch.erf(u / math.sqrt(2))) + u * torch.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)


def run_worker(rank, world_size):
    """Megatron 的 MLP：Y = GeLU(X A) B，A 按列切分，B 按行切分；前向、反向各一次 all_reduce。
    Megatron's MLP: Y = GeLU(X A) B, A split by columns, B by rows; one all_reduce forward, one backward.

    切分 / Shards: s = H // world_size；进程 r 持有 A_r = A[:, r*s:(r+1)*s]（列）和 B_r = B[r*s:(r+1)*s, :]（行）。
        Rank r holds A_r = A[:, r*s:(r+1)*s] (columns) and B_r = B[r*s:(r+1)*s, :] (rows).

      TODO 1 (前向 / forward)：U_r = X A_r，H_r = GeLU(U_r)（F.gelu），Z_r = H_r B_r 都不需要通信；
          Y = Σ_r Z_r：用 dist.all_reduce（SUM）把各进程的部分输出加起来（Megatron 的 g）。
          U_r = X A_r, H_r = GeLU(U_r) (F.gelu) and Z_r = H_r B_r need no communication; Y is the sum of
          the ranks' Z_r: all_reduce (SUM) the partial outputs (Megatron's g).
      TODO 2 (反向 / backward)：loss = 0.5 * ((Y - T) ** 2).sum()，dY = Y - T（每个进程都一样）；
          dB = H_r^T dY，dH_r = (dY B_r^T) * gelu_grad(U_r)，dA = X^T dH_r（本进程分片的梯度，不通信）；
          输入梯度 dX = Σ_r dH_r A_r^T：用 all_reduce（SUM）把各进程的部分和加起来（Megatron 的 f）。
          可以手写，也可以用 autograd（自己写 autograd.Function 的 f 和 g，或者用 DTensor）。
          dY = Y - T on every rank; dB = H_r^T dY, dH_r = (dY B_r^T) * gelu_grad(U_r), dA = X^T dH_r (this
          rank's shards, no communication); the input gradient dX is the sum of the ranks' dH_r A_r^T:
          all_reduce (SUM) it (Megatron's f). By hand, or with autograd (an autograd.Function for f and g
          of your own, or DTensor).

    Returns:
        (y, dx, dA, dB)：Y 形状 (TOKENS, D)，dX 形状 (TOKENS, D)，dA 形状 (D, s)，dB 形状 (s, D)（与 A_r、B_r
        相同；nn.Linear 的 weight 是转置的）。也可以把它们保存在同名的局部变量里。
        Y and dX of shape (TOKENS, D), dA of shape (D, s) and dB of shape (s, D) (those of A_r and B_r; an
        nn.Linear's weight is transposed); or keep them in local variables of those names.
    """
    x, target = make_input(), make_target()
    A, B = make_weights()
    s = H // world_size
    # a = ???            # A_r：A 的第 r 组列 / A's columns of shard r, (D, s)
    # b = ???            # B_r：B 的第 r 组行 / B's rows of shard r, (s, D)
    # TODO 1: u = ...; h = F.gelu(u); y = ...; dist.all_reduce(...)
    # TODO 2: dy = ...; dB = ...; dh = ...; dA = ...; dx = ...; dist.all_reduce(...)
    raise NotImplementedError("请先完成这里的 TODO / complete the TODO here first")


# ---------------------------------------------------------------------------------------------
# 直接运行本文件时的小测试 / a small harness for running this file directly (the grader ignores it)

def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        y, dx, dA, dB = run_worker(rank, world_size)
        print(f"rank {rank}: y[0] = {y[0].tolist()}, dA {tuple(dA.shape)}, dB {tuple(dB.shape)}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
