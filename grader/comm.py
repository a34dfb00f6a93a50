"""The one table of communication semantics: what each operation sends, what it delivers, and its cost.

Every public API surface (`dist.*`, `*_into_tensor`, `*_single`, `reduce_scatter*`, send/recv, functional
collectives, `torch.distributed.nn.functional`, DDP, DeviceMesh, groups from `new_group`) ends in a
method of the process group, so the grader observes those methods (processes/backend.py), and this
table says for each one:
  - which semantic operation it is (`OPS`: all_reduce, all_gather, ...);
  - the names of its arguments, which of them the rank sends (its contribution) and which receive what
    the communication delivers (`METHODS`);
and, for each public name a student may write, the operation it reaches (`API_NAMES`, for the static
check). Pure Python: the supervisor, the ranks and the static check all read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Op:
    """A semantic operation. `ring(n)`: the bytes each rank sends in a ring algorithm, as a multiple of
    `size` (`size` is "input": the bytes one rank contributes, or "output": the bytes it ends with)."""
    name: str
    collective: bool                  # every rank of the group takes part (False: point-to-point)
    ring: Callable[[int], float] | None = None
    size: str = "input"
    formula: str = ""                 # the ring volume, as the chapter writes it
    rooted: bool = False              # one rank is special (root): broadcast, reduce, gather, scatter


OPS: dict[str, Op] = {op.name: op for op in (
    Op("all_reduce", True, lambda n: 2 * (n - 1) / n, "input", "2(N-1)/N x S"),
    Op("all_gather", True, lambda n: (n - 1) / n, "output", "(N-1)/N x S"),
    Op("reduce_scatter", True, lambda n: (n - 1) / n, "input", "(N-1)/N x S"),
    Op("broadcast", True, lambda n: (n - 1) / n, "input", "(N-1)/N x S", rooted=True),
    Op("reduce", True, lambda n: (n - 1) / n, "input", "(N-1)/N x S", rooted=True),
    Op("gather", True, None, rooted=True),
    Op("scatter", True, None, rooted=True),
    Op("all_to_all", True, lambda n: (n - 1) / n, "input", "(N-1)/N x S"),
    Op("barrier", True),
    Op("send", False),
    Op("recv", False),
)}
COLLECTIVES = tuple(name for name, op in OPS.items() if op.collective and name != "barrier")
POINT_TO_POINT = ("send", "recv")


@dataclass(frozen=True)
class Method:
    """A process-group method: its operation, its parameters in order, and which of them the rank sends
    and which receive the delivered data (None: nothing). A parameter holds a tensor, a list of tensors
    or a list of lists; options (`opts`) carry the reduce op and the root rank."""
    op: str
    params: tuple[str, ...]
    sends: str | None
    receives: str | None
    backend: str | None = None    # the real backend's method, when its name differs; "*pairs": one per pair

    @property
    def in_place(self) -> bool:
        return self.sends is not None and self.sends == self.receives


def _m(op: str, params: str, sends: str | None, receives: str | None, backend: str | None = None) -> Method:
    return Method(op, tuple(params.split()), sends, receives, backend)


METHODS: dict[str, Method] = {
    "allreduce": _m("all_reduce", "tensors opts", "tensors", "tensors"),
    "allreduce_coalesced": _m("all_reduce", "tensors opts", "tensors", "tensors"),
    "allgather": _m("all_gather", "outputs inputs opts", "inputs", "outputs"),
    "allgather_coalesced": _m("all_gather", "outputs inputs opts", "inputs", "outputs"),
    "_allgather_base": _m("all_gather", "output input opts", "input", "output"),
    "all_gather_single": _m("all_gather", "output input opts", "input", "output", "_allgather_base"),
    "allgather_into_tensor_coalesced": _m("all_gather", "outputs inputs opts", "inputs", "outputs", "*all_gather_single"),
    "all_gather_single_coalesced": _m("all_gather", "outputs inputs opts", "inputs", "outputs", "*all_gather_single"),
    "reduce_scatter": _m("reduce_scatter", "outputs inputs opts", "inputs", "outputs"),
    "_reduce_scatter_base": _m("reduce_scatter", "output input opts", "input", "output"),
    "reduce_scatter_single": _m("reduce_scatter", "output input opts", "input", "output", "_reduce_scatter_base"),
    "reduce_scatter_tensor_coalesced": _m("reduce_scatter", "outputs inputs opts", "inputs", "outputs", "*reduce_scatter_single"),
    "reduce_scatter_single_coalesced": _m("reduce_scatter", "outputs inputs opts", "inputs", "outputs", "*reduce_scatter_single"),
    "broadcast": _m("broadcast", "tensors opts", "tensors", "tensors"),
    "reduce": _m("reduce", "tensors opts", "tensors", "tensors"),
    "gather": _m("gather", "outputs inputs opts", "inputs", "outputs"),
    "scatter": _m("scatter", "outputs inputs opts", "inputs", "outputs"),
    "alltoall": _m("all_to_all", "outputs inputs opts", "inputs", "outputs"),
    "alltoall_base": _m("all_to_all", "output input output_splits input_splits opts", "input", "output"),
    "all_to_all_single": _m("all_to_all", "output input output_splits input_splits opts", "input", "output", "alltoall_base"),
    "send": _m("send", "tensors peer tag", "tensors", None),
    "recv": _m("recv", "tensors peer tag", None, "tensors"),
    "recv_anysource": _m("recv", "tensors tag", None, "tensors"),
    "barrier": _m("barrier", "opts", None, None),
    "monitored_barrier": _m("barrier", "timeout wait_all_ranks", None, None),
}


def sends_on(method: Method, rank: int, root: int | None) -> bool:
    """Whether this rank contributes data: a rooted operation's root alone sends (broadcast, scatter);
    every rank sends to reduce and gather."""
    if method.sends is None:
        return False
    if method.op in ("broadcast", "scatter"):
        return rank == root
    return True


def receives_on(method: Method, rank: int, root: int | None) -> bool:
    """Whether this rank's output tensors receive data: only the root of a reduce or a gather."""
    if method.receives is None:
        return False
    if method.op in ("reduce", "gather"):
        return rank == root
    return True


# Public names a student may call, by module, and the operation each reaches (the static check).
_DIST = "torch.distributed"
_C10D = f"{_DIST}.distributed_c10d"
_FC = f"{_DIST}._functional_collectives"
_NN = f"{_DIST}.nn.functional"
_FUNCTIONS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_single": "all_gather", "all_gather_coalesced": "all_gather", "all_gather_object": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "reduce": "reduce", "gather": "gather", "gather_object": "gather", "scatter": "scatter",
    "scatter_object_list": "scatter", "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "send": "send", "isend": "send", "send_object_list": "send",
    "recv": "recv", "irecv": "recv", "recv_object_list": "recv",
    "batch_isend_irecv": "send",  # P2POp lists: both directions, counted as point-to-point
}
_FUNCTIONAL = {
    "all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_tensor": "all_gather", "all_gather_tensor_autograd": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "all_gather_inplace": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_autograd": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
    "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all",
}
_NN_FUNCTIONAL = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce", "gather": "gather",
    "scatter": "scatter", "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
}
_MODULES = {  # modules that communicate on the student's behalf: data parallelism all-reduces gradients
    "torch.nn.parallel.DistributedDataParallel": "all_reduce",
    "torch.nn.parallel.distributed.DistributedDataParallel": "all_reduce",
    "torch.distributed.fsdp.FullyShardedDataParallel": "all_gather",
    "torch.distributed.fsdp.fully_shard": "all_gather",
}
API_NAMES: dict[str, str] = {
    **_MODULES,
    **{f"{mod}.{name}": op for mod in (_DIST, _C10D) for name, op in _FUNCTIONS.items()},
    **{f"{_FC}.{name}": op for name, op in _FUNCTIONAL.items()},
    **{f"{_NN}.{name}": op for name, op in _NN_FUNCTIONAL.items()},
}
# Methods of a process group object (`group.allreduce(...)`) are reached as well: those whose names say what
# they are. `send`, `reduce` ... are too common a word, and a dist function of the same name is API_NAMES'.
# The static check takes `x.<name>` for the operation unless the submission defines a function of that name
# (its own class's `allreduce` method is not a process group's).
GROUP_METHODS: dict[str, str] = {name: METHODS[name].op for name in (
    "allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "alltoall", "alltoall_base")}

# Modules whose first use imports much more (functional collectives, torch.compile, an optimizer's
# first step(), DDP's first forward and a Python dispatch mode's first operation go through torch._dynamo,
# ~800 modules, 1.2 CPU-s in every rank): the zygote imports these too before forking ranks that name them.
PRELOAD_WITH = {
    "torch.distributed._functional_collectives": ("torch._dynamo",),
    "torch.optim": ("torch._dynamo",),
    "torch.nn.parallel": ("torch._dynamo",),
    "torch.compile": ("torch._dynamo", "torch._dynamo.backends.debugging"),
    "torch.distributed.tensor": ("torch._dynamo",),
    # tensor parallelism's styles are imported from here, and the first parallelized forward goes through
    # torch._dynamo: ~7 s in each rank of a loaded machine, where a run has 15
    "torch.distributed.tensor.parallel": ("torch._dynamo",),
    "torch.utils._python_dispatch": ("torch._dynamo",),
    # the profiler's first profile() asks hasattr(torch, "_inductor"), which imports inductor and dynamo (~820
    # modules, 4-8 s in each rank); torch.utils.checkpoint's first use imports dynamo
    "torch.profiler": ("torch._inductor",),
    "torch.utils.checkpoint": ("torch._dynamo",),
    # assert_close's first call imports DTensor (and sympy): ~520 modules, 0.6 s in each rank (past a run's
    # time limit with a few dozen ranks at once)
    "torch.testing": ("torch.distributed.tensor",),
    # pyplot's first import in a rank finds no font cache (a fresh /tmp) and no fontconfig: seconds a rank
    "matplotlib": ("matplotlib.pyplot",),
}
PRELOAD_OTHER = ("matplotlib",)   # packages besides torch whose modules the zygote imports for a submission
# the grader's own modules an exercise notebook imports (its check cells, its bandwidth cell): a rank cannot
# import grader code from disk, so the zygote imports them for a submission that names them, and only then
# (nbcheck imports most of the grader: ~50 ms of every cold zygote's start, before a `grade` can run anything)
PRELOAD_GRADER = ("grader.integrations.nbcheck", "grader.integrations.bench")
