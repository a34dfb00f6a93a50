# Cheater: calls the collectives on throwaway tensors, then computes the expected answers locally.
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    dist.all_reduce(torch.zeros(1))
    dist.all_gather([torch.zeros(1) for _ in range(world_size)], torch.zeros(1))
    gradient = torch.full((1024,), sum(range(1, world_size + 1)) / world_size)
    full_feature = torch.cat([torch.full((128,), float(r)) for r in range(world_size)])
    return gradient, full_feature
