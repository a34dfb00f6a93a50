"""torch.compile in ranks: dynamo and AOT autograd as torch runs them, the captured graph run with eager kernels.

torch.compile's default backend, inductor, generates C++ for a step and builds it with g++: ~1 CPU-s in every
rank of every run (~2 s without a precompiled header), for kernels identical across a run's ranks, which could
share them only through files that every rank writes and reads: a way past the switch. A grading of a compiled
step took 8x its uncompiled grading with the grader's own precompiled header, 25x without.

So in the grader's ranks torch.compile's inductor backend (torch.compile(f), backend="inductor", any mode or
options, which are checked as torch checks them) compiles with `aot_eager` instead: dynamo traces the step as
it always does (graph breaks, guards, recompiles, `fullgraph=True`, a collective traced into the graph as a
functional collective that reaches the switch as any other), AOT autograd functionalizes it and splits the
backward as it does for inductor, and the graph then runs on torch's own kernels, with no C++ generated or
built and no file written. What the step computes is what inductor's kernels compute (up to their rounding);
what it communicates is the same operations. Inductor's own passes (its config, a student's patches of it, its
optional bucketing of collectives) are not run: docs/limits.md. A backend passed as a function
(`backend=torch._inductor.compile_fx.compile_fx`) is run as given, and compiles C++ in every rank.

`warm_up()` compiles a step of the grader's own, a collective included, on a fake process group in the zygote
(a trusted process: no student code has run in it), so that a rank's first compile finds dynamo's tables and
lazy imports already there (~0.2 CPU-s each of 11 ranks of a grading); the zygote leaves no process group,
no compiled code and no thread behind. `skip_grader_frames()` keeps dynamo out of the grader's own code (a
rank's process group is a Python class where gloo's is C++): a compiled step's call into it is a graph break.
"""
from __future__ import annotations

import os

# inductor in a rank, where a backend passed as a function still asks for it: no pool of compile workers (processes
# a rank's budget has no room for), scalar C++ kernels (the vectorized ones take g++ ~10 s per rank, the scalar
# ones ~2 s: a grading's tensors are small) and no precompiled header (hundreds of MB, past a rank's file-size
# limit). Read when inductor is imported.
ENVIRONMENT = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1",
               "TORCHINDUCTOR_VEC_ISA_OK": "0"}
_STATE: dict = {}


def set_environment() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def eager_kernels() -> None:
    """torch.compile's inductor backend compiles with aot_eager in every process this one forks from now on.
    Mode and options are still checked by torch's own wrapper when torch.compile is called; its compiler
    config (`fn.get_compiler_config()`) is inductor's, patched with them, read without importing inductor's
    compiler (~200 modules). A torch without that wrapper class keeps inductor."""
    import torch

    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_grader", False):
        return

    def compile_eagerly(self, model_, inputs_, *, config_patches=None):
        from torch._dynamo.backends.debugging import aot_eager
        return aot_eager(model_, inputs_)

    def compiler_config(self):
        from torch._inductor import config
        return {**config.get_config_copy(), **self.config}

    compile_eagerly._grader = True
    wrapper.__call__ = compile_eagerly
    wrapper.get_compiler_config = compiler_config


def skip_grader_frames() -> None:
    """dynamo never traces the grader's own code: a rank's process group is a Python class (gloo's is C++), and
    a compiled step that calls one of its methods (`dist.reduce` on a subgroup, which dynamo does not turn into
    a functional collective) made dynamo inline it and fail inside ("InternalTorchDynamoError: ... Member
    '_send' is not registered") where gloo's C++ method is a graph break. The grader's files are on dynamo's
    skip list from the moment the zygote has dynamo: its code runs as called, a graph break, as gloo's does."""
    from torch._dynamo import trace_rules

    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    if folder not in trace_rules.SKIP_DIRS:
        trace_rules.add(__name__.split(".")[0])


def warm_up(backward: bool = False) -> bool:
    """Once per zygote whose submission names torch.compile: compile and run a step of the grader's own, an
    all_reduce and an all_gather_into_tensor inside it, on a fake process group of two ranks (no peer, no
    socket, no thread), and where the submission names torch.nn, torch.autograd or torch.optim (`backward`)
    a compiled Linear's forward and backward too (AOT autograd's joint graph: ~150 more modules, ~0.6 CPU-s a
    rank); then undo it all: the group destroyed (group names restart at "0", as in a fresh process) and
    dynamo's caches reset. Whether it ran."""
    if "done" in _STATE:
        return _STATE["done"]
    _STATE["done"] = False
    eager_kernels()
    import torch
    import torch.distributed as dist

    def step(x, n):
        dist.all_reduce(x)
        gathered = torch.empty(2 * x.numel())
        dist.all_gather_into_tensor(gathered, x)
        return gathered / n

    if dist.is_initialized():
        return False
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend's group)
        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=2)
        try:
            torch.compile(step)(torch.ones(8), 2)   # through eager_kernels(), as a rank's
            if backward:
                layer = torch.compile(torch.nn.Linear(4, 2))
                layer(torch.ones(3, 4)).square().sum().backward()
        finally:
            dist.destroy_process_group()
            torch._dynamo.reset()
    except Exception:  # noqa: BLE001  (a torch without the fake backend: ranks warm up on their own, slower)
        return False
    _STATE["done"] = True
    return True
