"""The AST rules of grader/static.py, called directly (no processes)."""
from __future__ import annotations

import ast
import textwrap

import pytest

from grader.submission import static


def inspect(src: str) -> static.StaticReport:
    return static.inspect_source(ast.parse(textwrap.dedent(src)))


def reached(src: str) -> set[str]:
    return set(inspect(src).reached)


@pytest.mark.parametrize("src", [
    "import torch.distributed as dist\ndef run_worker(r, w):\n    dist.all_reduce(t); dist.all_gather(l, t)\n",
    "import torch.distributed as d\ndef run_worker(r, w):\n    d.all_reduce(t); d.all_gather(l, t)\n",
    "import torch\ndef run_worker(r, w):\n    torch.distributed.all_reduce(t); torch.distributed.all_gather(l, t)\n",
    "import torch.distributed\ndef run_worker(r, w):\n    torch.distributed.all_reduce(t); torch.distributed.all_gather(l, t)\n",
    "from torch.distributed import all_reduce as ar, all_gather as ag\ndef run_worker(r, w):\n    ar(t); ag(l, t)\n",
    "from torch import distributed\ndef run_worker(r, w):\n    distributed.all_reduce(t); distributed.all_gather(l, t)\n",
    "import torch\nD = torch.distributed\ndef run_worker(r, w):\n    D.all_reduce(t); D.all_gather(l, t)\n",
    "def run_worker(r, w):\n    import torch.distributed as dist\n    dist.all_reduce(t); dist.all_gather(l, t)\n",
])
def test_resolves_every_way_of_naming_the_collectives(src):
    assert reached(src) == {"all_reduce", "all_gather"}


def test_follows_helpers_methods_and_callbacks():
    src = """
    import torch.distributed as dist
    def average(t):
        dist.all_reduce(t)
    class Comm:
        def gather(self, l, t):
            dist.all_gather(l, t)
    def run_worker(r, w):
        time_it(lambda: average(t))
        Comm().gather(l, t)
    """
    assert reached(src) == {"all_reduce", "all_gather"}


def test_comments_strings_and_dead_branches_do_not_count():
    src = """
    import torch.distributed as dist
    def run_worker(r, w):
        # dist.all_reduce(t)
        "dist.all_gather(l, t)"
        if False:
            dist.all_reduce(t)
        while False:
            dist.all_gather(l, t)
        x = dist.all_gather(l, t) if 0 else None
        return None
        dist.all_reduce(t)
    """
    assert reached(src) == set()


def test_unrelated_functions_named_like_collectives_do_not_count():
    src = """
    import torch.distributed as dist
    def all_reduce(t):
        return t
    def run_worker(r, w):
        all_reduce(t)
        other.all_gather(l, t)
    """
    assert reached(src) == set()


def test_a_helper_that_is_never_used_does_not_count():
    src = """
    import torch.distributed as dist
    def unused(t):
        dist.all_reduce(t)
    def run_worker(r, w):
        return None
    """
    assert reached(src) == set()


def test_entry_and_stub():
    assert not inspect("def worker(r, w):\n    pass\n").has_entry
    report = inspect("def run_worker(rank, world_size):\n    raise NotImplementedError('todo')\n")
    assert report.has_entry and report.todo_left and report.entry_params == 2
    assert not inspect("def run_worker(rank, world_size):\n    return 1\n").todo_left


def test_definitions_only_keeps_definitions_and_drops_launches():
    src = textwrap.dedent("""
    import os
    import torch.multiprocessing as mp
    N = 1024
    def run_worker(r, w):
        return N
    def test_distributed():
        mp.spawn(run_worker, nprocs=2)
    test_distributed()
    result = test_distributed()
    procs = mp.spawn(run_worker, nprocs=2)
    print("launching")
    if __name__ == "__main__":
        test_distributed()
    """)
    kept = ast.unparse(static.definitions_only(ast.parse(src)))
    assert "N = 1024" in kept and "def run_worker" in kept and "def test_distributed" in kept
    assert "import torch.multiprocessing as mp" in kept
    lines = [line.strip() for line in kept.splitlines()]
    assert "test_distributed()" not in lines
    for launch in ("result =", "procs =", "print(", "__main__"):
        assert launch not in kept


@pytest.mark.parametrize("src, expected", [
    ("gradient = dist.all_reduce(gradient)", {"all_reduce": [3]}),
    ("parts = dist.all_gather(l, t)", {"all_gather": [3]}),
    ("g: object = dist.all_reduce(g, async_op=False)", {"all_reduce": [3]}),
    ("work = dist.all_reduce(g, async_op=True)", {}),
    ("work = dist.all_gather(l, t, None, True)", {}),
    ("dist.all_reduce(g)", {}),
    ("x = torch.cat(l)", {}),
])
def test_assigned_collective_results(src, expected):
    module = f"import torch\nimport torch.distributed as dist\n{src}\n"
    assert static.assigned_results(ast.parse(module)) == expected
