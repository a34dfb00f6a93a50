# 19.4 梯度累积与 no_sync() | Gradient accumulation with DDP's no_sync()
#
#   python -m grader check grad_accum_no_sync.py     # 自检（2 个进程）/ check it yourself (2 ranks)
#   python grad_accum_no_sync.py                     # 直接运行 2 个进程 / run 2 ranks directly
#
# 每个进程（rank）代表一张 GPU。评分器会创建进程组并调用 run_worker(rank, world_size)；
# 你不需要自己调用 init_process_group（调用了也没关系）。
# Each process (rank) stands for one GPU. The grader creates the process group and calls
# run_worker(rank, world_size); you need not call init_process_group yourself (it does no harm).
import contextlib
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES, OUT_FEATURES = 8, 4
BATCH = 8   # 每个 micro-batch 的样本数 / samples per micro-batch
K = 4       # 每一步累积的 micro-batch 个数 / micro-batches accumulated per step


def make_model():
    """一个很小的模型：Linear(8, 4)，没有 bias，只有一个参数张量 weight（形状 (4, 8)），每个进程都一样。
    A small model: Linear(8, 4) without bias, one parameter tensor (weight, shape (4, 8)), the same on every rank."""
    model = torch.nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)
    with torch.no_grad():
        index = torch.arange(IN_FEATURES * OUT_FEATURES, dtype=torch.float32).reshape(OUT_FEATURES, IN_FEATURES)
        model.weight.copy_(((index * 5) % 7 - 3) / 8)
    return model


def micro_batch(rank, k):
    """本进程的第 k 个 micro-batch（k = 0 .. K-1）：输入 x 形状 (BATCH, 8)，目标 y 形状 (BATCH, 4)，每个进程都不同。
    This rank's micro-batch k (k = 0 .. K-1): inputs x of shape (BATCH, 8), targets y of shape (BATCH, 4)."""
    index = torch.arange(BATCH * IN_FEATURES, dtype=torch.float32).reshape(BATCH, IN_FEATURES)
    x = ((index * (rank + 2) + 5 * k + rank) % 11 - 5) / 4
    y = ((torch.arange(BATCH * OUT_FEATURES, dtype=torch.float32).reshape(BATCH, OUT_FEATURES) * (k + 1) + 3 * rank) % 9 - 4) / 2
    return x, y


def loss_fn(output, target):
    """一个 micro-batch 的 loss / the loss of one micro-batch."""
    return F.mse_loss(output, target)


def run_worker(rank, world_size):
    """一步训练的梯度：K 个 micro-batch 累积，整个一步只做一次 all_reduce。
    One training step's gradient: K micro-batches accumulated, ONE all_reduce for the whole step.

    要得到的梯度 / The gradient wanted: 所有进程、所有 micro-batch 的平均，也就是
        grad = (1 / world_size) * sum_r (1 / K) * sum_k d loss_fn(model(x_rk), y_rk) / d weight
    the average over every rank and every micro-batch (the formula above).

    TODO 1（累积 / accumulate）：对 K 个 micro-batch 依次 forward + backward，把梯度累积在 .grad 里，
        前 K - 1 个不做任何通信。用 DDP 时，把前 K - 1 次 backward 放进 `with ddp.no_sync():`；
        不用 DDP 时，手动累积就不会通信。
        Run forward + backward for the K micro-batches, accumulating in .grad, with no communication for the
        first K - 1. With DDP, put the first K - 1 backward passes inside `with ddp.no_sync():`; by hand,
        accumulating alone does not communicate.
    TODO 2（一次 all_reduce / one all_reduce）：最后一个 micro-batch 的 backward 让 DDP 做一次 all_reduce
        （DDP 会除以 world_size）；手动时自己调用一次 dist.all_reduce，再除以 world_size。
        别忘了对 K 求平均（例如 loss / K）。
        The last micro-batch's backward makes DDP all-reduce once (DDP divides by world_size); by hand, call
        dist.all_reduce once yourself and divide by world_size. Do not forget the average over K (loss / K).

    Returns:
        grad: weight 的梯度，形状 (4, 8)，float32；也可以保存在同名的局部变量 grad 里。
        the weight's gradient, shape (4, 8), float32; or keep it in a local variable named grad.
    """
    # model = make_model()
    # ddp = DDP(model)                      # 或者不用 DDP，手动累积 / or accumulate by hand
    # for k in range(K):
    #     x, y = micro_batch(rank, k)
    #     TODO 1: 前 K - 1 个 micro-batch：with ddp.no_sync(): ... backward()
    #     TODO 2: 最后一个 micro-batch：backward() 触发一次 all_reduce
    # grad = model.weight.grad
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
        grad = run_worker(rank, world_size)
        print(f"rank {rank}: grad[0, :4] = {grad[0, :4].tolist()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
