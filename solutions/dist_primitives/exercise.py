"""Chapter 19, exercise 1: average a gradient with all-reduce, rebuild a feature vector with all-gather.

Each rank (one GPU) holds a gradient of 1024 values equal to rank + 1 and a feature slice of 128 values
equal to rank. run_worker(rank, world_size) returns (gradient, full_feature): the gradient averaged over
the ranks, and every rank's slice concatenated in rank order.

Points (100): static 10 (run_worker reaches all_reduce 5, all_gather 5); for each world size, each
quantity right on every rank and derived from what the collective delivered, 15: world size 2 is
visible (students check it themselves), 3 and 4 are hidden until grades are published.
"""
from grader.exercise import Check, Exercise, Quantity, Todo

GRADIENT_NUMEL = 1024
FEATURE_NUMEL = 128
VISIBLE, HIDDEN = (2,), (3, 4)

QUANTITIES = (
    Quantity("gradient", local=lambda rank, ws: [rank + 1.0] * GRADIENT_NUMEL, combine="mean",
             through=("all_reduce",), label=("梯度 gradient", "gradient")),
    Quantity("full_feature", local=lambda rank, ws: [float(rank)] * FEATURE_NUMEL, combine="concat",
             through=("all_gather",), label=("完整特征 full_feature", "full_feature")),
)


def _runtime(ws: int, hidden: bool) -> tuple[Check, ...]:
    return (
        Check(f"ws{ws}.all_reduce", "value", 15, ("All-Reduce 求平均梯度（{ws} 个进程）", "Gradient averaged with all_reduce ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="gradient", op="all_reduce"),
        Check(f"ws{ws}.all_gather", "value", 15, ("All-Gather 拼接特征（{ws} 个进程）", "Feature rebuilt with all_gather ({ws} ranks)"),
              hidden=hidden, world_size=ws, quantity="full_feature", op="all_gather"),
    )


EXERCISE = Exercise(
    name="dist_primitives",
    title=("分布式通信原语：All-Reduce 与 All-Gather", "Distributed communication primitives: all-reduce and all-gather"),
    entry="run_worker",
    defines=("run_worker",),
    files=("dist_primitives", "distributed_primitives"),
    quantities=QUANTITIES,
    checks=(
        Check("static.all_reduce", "static", 5, ("静态检查：run_worker 调用了 dist.all_reduce", "Static: run_worker calls dist.all_reduce"),
              op="all_reduce"),
        Check("static.all_gather", "static", 5, ("静态检查：run_worker 调用了 dist.all_gather", "Static: run_worker calls dist.all_gather"),
              op="all_gather"),
        *(c for ws in VISIBLE for c in _runtime(ws, hidden=False)),
        *(c for ws in HIDDEN for c in _runtime(ws, hidden=True)),
    ),
    todo=(Todo(("TODO 1（all_reduce）", "TODO 1 (all_reduce)"), op="all_reduce"),
          Todo(("TODO 2（all_gather）", "TODO 2 (all_gather)"), op="all_gather")),
)
