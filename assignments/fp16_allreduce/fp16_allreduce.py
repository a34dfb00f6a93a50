# 19.5 混合精度通信 | Mixed-precision communication: all-reduce in float16, update in float32
#
#   python -m grader check fp16_allreduce.py     # 自检（2 个进程）/ check it yourself (2 ranks)
#   python fp16_allreduce.py                     # 直接运行 2 个进程 / run 2 ranks directly
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
import torch.nn.functional as F

IN_FEATURES, OUT_FEATURES = 16, 8
BATCH = 16
LR = 1e-3   # 学习率 / learning rate


def make_model():
    """Linear(16, 8)，没有 bias：float32 的主权重（master weights）weight，形状 (8, 16)，数值在 1 附近，每个进程都一样。
    Linear(16, 8) without bias: float32 master weights (weight, shape (8, 16), values near 1), the same on every rank."""
    model = torch.nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)
    with torch.no_grad():
        index = torch.arange(IN_FEATURES * OUT_FEATURES, dtype=torch.float32).reshape(OUT_FEATURES, IN_FEATURES)
        model.weight.copy_(1 + 0.5 * torch.sin(index * 0.7))
    return model


def batch(rank):
    """本进程的一个 batch：输入 x 形状 (16, 16)，目标 y 形状 (16, 8)，每个进程都不同。
    This rank's batch: inputs x of shape (16, 16), targets y of shape (16, 8), different on every rank."""
    index = torch.arange(BATCH * IN_FEATURES, dtype=torch.float32).reshape(BATCH, IN_FEATURES)
    x = torch.sin(index * (rank + 1) * 0.37)
    j = torch.arange(BATCH * OUT_FEATURES, dtype=torch.float32).reshape(BATCH, OUT_FEATURES)
    y = 16 * torch.cos(j * 0.23 + rank)
    return x, y


def loss_fn(output, target):
    return F.mse_loss(output, target)


def run_worker(rank, world_size):
    """一步数据并行的 SGD：梯度用 float16 通信，权重用 float32 更新。
    One data-parallel SGD step: the gradient travels in float16, the weights are updated in float32.

    先算出本进程的 float32 梯度：loss_fn(model(x), y).backward()，梯度在 model.weight.grad。
    First compute this rank's float32 gradient: loss_fn(model(x), y).backward(); it is in model.weight.grad.

    TODO 1（压缩通信 / compressed communication）：把梯度转成 float16（.half()，或 bfloat16），
        dist.all_reduce 一次，再除以 world_size 得到平均梯度：通信量是 float32 的一半。
        Cast the gradient to float16 (.half(), or bfloat16), all_reduce it once, and divide by world_size for
        the average: half the bytes of float32.
    TODO 2（转回 float32 更新 / back to float32）：把平均梯度转回 float32（.float()），
        用 float32 的权重做一步 SGD：weight -= LR * grad（或 torch.optim.SGD(lr=LR)）。权重不能用 float16：
        这么小的更新在 float16 里会被舍入掉。
        Turn the averaged gradient back into float32 (.float()) and make one SGD step on the float32 weights:
        weight -= LR * grad (or torch.optim.SGD(lr=LR)). Not in float16: an update this small is rounded away there.
    （DDP 也可以：ddp.register_comm_hook(None, default_hooks.fp16_compress_hook) 做的就是 TODO 1。）
    (DDP works too: ddp.register_comm_hook(None, default_hooks.fp16_compress_hook) does TODO 1.)

    Returns:
        (grad, weights): 平均梯度（float32，形状 (8, 16)）和更新后的权重（float32，形状 (8, 16)）；
        也可以保存在同名的局部变量里。
        the averaged gradient (float32, shape (8, 16)) and the updated weights (float32, shape (8, 16));
        or keep them in local variables of those names.
    """
    # model = make_model()
    # x, y = batch(rank)
    # loss_fn(model(x), y).backward()
    # TODO 1: half = model.weight.grad.half(); dist.all_reduce(...); ...
    # TODO 2: grad = ...float() ...; with torch.no_grad(): model.weight -= LR * grad
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
        grad, weights = run_worker(rank, world_size)
        print(f"rank {rank}: grad[0, :3] = {grad[0, :3].tolist()}, weights.dtype = {weights.dtype}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
