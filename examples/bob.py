# Honest, short style: leaves the process group to the harness, averages with ReduceOp.AVG, returns both.
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    gradient = torch.full((1024,), rank + 1.0)
    dist.all_reduce(gradient, op=dist.ReduceOp.AVG)
    local_feature = torch.full((128,), float(rank))
    gathered_list = [torch.empty_like(local_feature) for _ in range(world_size)]
    dist.all_gather(gathered_list, local_feature)
    return gradient, torch.cat(gathered_list)
