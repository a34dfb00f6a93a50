"""The seed's harness for one submission at one world size, as the exercise runs it (the benchmark's baseline).

    python bench/seed_harness.py SUBMISSION.py WORLD_SIZE PORT

Like the seed's `simulate_distributed_primitives`: a fresh interpreter imports torch, checks with `ast` that
run_worker calls all_reduce and all_gather, then `mp.spawn`s WORLD_SIZE ranks (each a fresh interpreter that
imports torch again) that run the student's run_worker, which initialises its own process group. The one
change: every rank's init_process_group is pointed at PORT (a free port chosen by bench.py), so that two
baselines running at once do not join each other's group through the seed's fixed port 12355.
"""
import ast
import runpy
import sys

import torch  # noqa: F401  (the seed's script imports torch at the top, like every rank)
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world_size: int, path: str, port: int) -> None:
    original = dist.init_process_group

    def init_process_group(backend=None, init_method=None, **kwargs):
        return original(backend, init_method=f"tcp://127.0.0.1:{port}", **kwargs)

    dist.init_process_group = init_process_group
    namespace = runpy.run_path(path, run_name="submission")
    namespace["run_worker"](rank, world_size)


def main() -> None:
    path, world_size, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tree = ast.parse(open(path, encoding="utf-8").read())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_worker"), None)
    assert fn is not None, "缺少 run_worker 函数"
    calls = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "all_reduce" in calls and "all_gather" in calls
    mp.spawn(_rank, args=(world_size, path, port), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
