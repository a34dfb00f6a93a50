# 19.3 ZeRO 风格的分片优化器步 | A ZeRO-style sharded optimizer step (Reduce-Scatter + All-Gather)
#
#   python -m grader check zero_sharded_step.py     # 自检（2 个进程）/ check it yourself (2 ranks)
#   python zero_sharded_step.py                     # 直接运行 2 个进程 / run 2 ranks directly
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

NUM_PARAMS = 1030   # P：参数个数 / the number of parameters
LR = 0.1            # 学习率 / learning rate
MOMENTUM = 0.9      # 动量系数 / momentum
STEPS = 2           # 两步 SGD / two steps of SGD with momentum


def initial_parameters():
    """第 1 步之前的参数，每个进程都一样：形状 (NUM_PARAMS,)，float32。
    The parameters before step 1, the same on every rank: shape (NUM_PARAMS,), float32."""
    return torch.arange(NUM_PARAMS, dtype=torch.float32) / NUM_PARAMS


def local_gradient(rank, step):
    """本进程在第 step 步（1 或 2）的梯度：形状 (NUM_PARAMS,)，float32，每个进程都不同。
    This rank's gradient at `step` (1 or 2): shape (NUM_PARAMS,), float32, different on every rank."""
    index = torch.arange(NUM_PARAMS, dtype=torch.float32)
    return torch.sin(index * (rank + 1) / 100 + step)


def run_worker(rank, world_size):
    """ZeRO 的一步（做两步）：每个进程只保存、只更新自己那一片（shard）。
    ZeRO's step (two of them): each rank keeps and updates only its own shard.

    分片 / Shards: shard = ceil(NUM_PARAMS / world_size)，进程 r 负责第 r * shard 到 (r + 1) * shard 个元素。
        NUM_PARAMS 不是 world_size 的整数倍时，先用 0 把梯度和参数补齐（pad）到 shard * world_size 个元素，
        最后再去掉补齐的部分——ZeRO 的实现（DeepSpeed、FSDP）都是这样做的。
        Rank r owns elements r * shard to (r + 1) * shard. When NUM_PARAMS is not a multiple of
        world_size, pad the gradient and the parameters with zeros to shard * world_size elements and
        drop the padding at the end, as ZeRO implementations (DeepSpeed, FSDP) do.

    每一步、每个进程 / Each step, on every rank:
      TODO 1 (Reduce-Scatter)：dist.reduce_scatter_single 把各进程（补齐后的）梯度求和，每个进程只收到
          自己那一片；再除以 world_size（或用 ReduceOp.AVG）得到平均梯度分片。
          reduce_scatter_single the (padded) gradient: each rank receives the sum of its own shard only;
          divide by world_size (or use ReduceOp.AVG) for the averaged gradient shard.
      TODO 2 (分片更新 / shard update)：只更新自己的动量分片和参数分片：
          momentum = MOMENTUM * momentum + grad_shard；param_shard = param_shard - LR * momentum。
          Update this rank's momentum shard and parameter shard only (the formulas above).
      TODO 3 (All-Gather)：dist.all_gather_single 把各进程更新后的参数分片拼成完整参数。
          all_gather_single the updated parameter shards into the full parameters.
      （torch 2.13 提示 dist.reduce_scatter_tensor / dist.all_gather_into_tensor 已弃用，推荐用上面的名字；
      旧名字评分器同样接受。）
      (torch 2.13 warns that dist.reduce_scatter_tensor / dist.all_gather_into_tensor are deprecated in
      favour of the names above; the grader accepts the older names too.)

    Returns:
        (params, momentum): 两步之后的完整参数，形状 (NUM_PARAMS,)（去掉补齐部分）；本进程的动量分片，
        形状 (shard,)（含补齐部分）。也可以把它们保存在同名的局部变量里。
        the full parameters after two steps, shape (NUM_PARAMS,) (padding dropped), and this rank's
        momentum shard, shape (shard,) (padding included); or keep them in local variables of those names.
    """
    # shard = ???
    # params = ???        # 完整参数（补齐）/ the full parameters, padded
    # momentum = ???      # 只有本进程的一片 / this rank's shard only
    # for step in range(1, STEPS + 1):
    #     TODO 1: dist.reduce_scatter_single(...)
    #     TODO 2: momentum = ...; param_shard = ...
    #     TODO 3: dist.all_gather_single(...)
    ### BEGIN SOLUTION
    shard = math.ceil(NUM_PARAMS / world_size)
    padded = shard * world_size
    start = rank * shard

    params = torch.zeros(padded)
    params[:NUM_PARAMS] = initial_parameters()
    momentum = torch.zeros(shard)
    for step in range(1, STEPS + 1):
        grad = torch.zeros(padded)
        grad[:NUM_PARAMS] = local_gradient(rank, step)
        grad_shard = torch.empty(shard)
        dist.reduce_scatter_single(grad_shard, grad, op=dist.ReduceOp.SUM)
        grad_shard /= world_size

        momentum = MOMENTUM * momentum + grad_shard
        param_shard = params[start:start + shard] - LR * momentum

        dist.all_gather_single(params, param_shard)
    params = params[:NUM_PARAMS]
    return params, momentum
    ### END SOLUTION


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
        params, momentum = run_worker(rank, world_size)
        print(f"rank {rank}: params[:3] = {params[:3].tolist()}, momentum has {momentum.numel()} elements")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_launch, args=(2, _free_port()), nprocs=2, join=True)
