# Honest, in the seed's reference style: initialises its own process group, asserts, destroys it.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_worker(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        gradient = torch.full((1024,), float(rank + 1))
        dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
        gradient /= world_size

        local_feature = torch.full((128,), float(rank))
        gathered_list = [torch.zeros_like(local_feature) for _ in range(world_size)]
        dist.all_gather(gathered_list, local_feature)
        full_feature = torch.cat(gathered_list, dim=0)

        expected = torch.full_like(gradient, sum(range(1, world_size + 1)) / world_size)
        assert torch.allclose(gradient, expected), 'All-Reduce 结果不正确！'
    finally:
        dist.destroy_process_group()


if __name__ == '__main__':
    mp.spawn(run_worker, args=(2,), nprocs=2, join=True)
