# Wrong: sums the gradients but forgets to divide by world_size.
import torch
import torch.distributed as dist


def run_worker(rank, world_size):
    gradient = torch.full((1024,), float(rank + 1))
    dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
    local_feature = torch.full((128,), float(rank))
    gathered_list = [torch.zeros_like(local_feature) for _ in range(world_size)]
    dist.all_gather(gathered_list, local_feature)
    full_feature = torch.cat(gathered_list, dim=0)
    return gradient, full_feature
