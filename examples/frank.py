# Broken: a syntax error (missing colon).
import torch
import torch.distributed as dist


def run_worker(rank, world_size)
    gradient = torch.full((1024,), float(rank + 1))
    dist.all_reduce(gradient)
    return gradient / world_size
