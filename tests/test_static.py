"""The AST rules of grader/submission/static.py, called directly (no processes)."""
from __future__ import annotations

import ast
import textwrap

import pytest

from grader.submission import definitions, static

from conftest import ROOT


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
    kept = ast.unparse(definitions.definitions_only(ast.parse(src)))
    assert "N = 1024" in kept and "def run_worker" in kept and "def test_distributed" in kept
    assert "import torch.multiprocessing as mp" in kept
    lines = [line.strip() for line in kept.splitlines()]
    assert "test_distributed()" not in lines
    for launch in ("result =", "procs =", "print(", "__main__"):
        assert launch not in kept


@pytest.mark.parametrize("src, expected", [
    ("gradient = dist.all_reduce(gradient)", [("all_reduce", 3)]),
    ("parts = dist.all_gather(l, t)", [("all_gather", 3)]),
    ("g: object = dist.all_reduce(g, async_op=False)", [("all_reduce", 3)]),
    ("work = dist.all_reduce(g, async_op=True)", []),
    ("work = dist.all_gather(l, t, None, True)", []),
    ("dist.all_reduce(g)", []),
    ("x = torch.cat(l)", []),
    ("y = funcol.all_reduce(g, 'sum', None)", []),   # functional collectives return their result
])
def test_assigned_collective_results(src, expected):
    module = f"import torch\nimport torch.distributed as dist\nimport torch.distributed._functional_collectives as funcol\n{src}\n"
    assert static.assigned_results(ast.parse(module)) == [(op, line + 1) for op, line in expected]


@pytest.mark.parametrize("src, op", [
    # every call form names the operation: partial (module level or local), getattr with a constant,
    # lambda, a name bound to it, functional collectives, dist.nn, the _into_tensor/_single/_base variants
    ("import functools, torch.distributed as dist\nR = functools.partial(dist.all_reduce, op=None)\ndef run_worker(r, w):\n    R(t)\n", "all_reduce"),
    ("import functools, torch.distributed as dist\ndef run_worker(r, w):\n    f = functools.partial(dist.all_reduce)\n    f(t)\n", "all_reduce"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    getattr(dist, 'all_gather')(l, t)\n", "all_gather"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    go = lambda x: dist.all_reduce(x)\n    go(t)\n", "all_reduce"),
    ("import torch.distributed as dist\nOPS = {'sum': dist.all_reduce}\ndef run_worker(r, w):\n    OPS['sum'](t)\n", "all_reduce"),
    ("import torch.distributed._functional_collectives as fc\ndef run_worker(r, w):\n    fc.all_gather_tensor(t, 0, g)\n", "all_gather"),
    ("from torch.distributed._functional_collectives import all_reduce\ndef run_worker(r, w):\n    all_reduce(t, 'sum', g)\n", "all_reduce"),
    ("import torch.distributed.nn.functional as F\ndef run_worker(r, w):\n    F.all_gather(t)\n", "all_gather"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist.nn.functional.all_reduce(t)\n", "all_reduce"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist.all_gather_into_tensor(o, t)\n", "all_gather"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist.all_gather_single(o, t)\n", "all_gather"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist._all_gather_base(o, t)\n", "all_gather"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist.reduce_scatter_tensor(o, t)\n", "reduce_scatter"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    dist.group.WORLD.allreduce([t])\n", "all_reduce"),
    ("import torch\ndef run_worker(r, w):\n    torch.nn.parallel.DistributedDataParallel(m)\n", "all_reduce"),
    ("import torch.distributed as dist\ndef run_worker(r, w):\n    ops = [dist.P2POp(dist.isend, t, 1)]\n", "send"),
])
def test_every_call_form_reaches_its_operation(src, op):
    assert op in reached(src)


def test_a_bound_name_in_dead_code_or_unused_counts_for_nothing():
    src = """
    import functools, torch.distributed as dist
    R = functools.partial(dist.all_reduce)
    def run_worker(r, w):
        if False:
            R(t)
        return None
    """
    assert reached(src) == set()


def test_a_method_of_the_submissions_own_class_named_like_a_group_method_is_not_one():
    # a ring written as a class with its own `allreduce` (from send/recv): not the process group's all_reduce
    src = """
    import torch.distributed as dist
    class Ring:
        def allreduce(self, t):
            dist.send(t, 1)
    def run_worker(r, w):
        Ring().allreduce(t)
        getattr(Ring(), "allreduce")(t)
    """
    assert reached(src) == {"send"}
    # without a definition of its own, the name is the process group's
    assert reached("import torch.distributed as dist\ndef run_worker(r, w):\n    pg.allreduce([t])\n") == {"all_reduce"}


def test_torch_modules_to_preload():
    src = "import torch.distributed._functional_collectives as fc\nimport torch.distributed as dist\ndef run_worker(r, w):\n    dist.nn.functional.all_reduce(t)\n"
    modules = inspect(src).torch_modules
    assert "torch.distributed._functional_collectives" in modules and "torch._dynamo" in modules
    assert "torch.distributed.nn" in modules
    src = "from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module\n"
    assert "torch._dynamo" in inspect(src).torch_modules   # DTensor's first parallelized forward imports it


@pytest.mark.parametrize("src, named", [
    ("from grader.integrations import nbcheck\n", ["grader.integrations.nbcheck"]),
    ("from grader.integrations import nbcheck, bench\n", ["grader.integrations.bench", "grader.integrations.nbcheck"]),
    ("import grader.integrations.nbcheck as nb\n", ["grader.integrations.nbcheck"]),
    ("from grader.integrations.bench import run_bench, table\n", ["grader.integrations.bench"]),
    ("import grader\ngrader.integrations.nbcheck.report()\n", ["grader.integrations.nbcheck"]),
    ("import grader.integrations as gi\ngi.nbcheck.check('x')\n", ["grader.integrations.nbcheck"]),
    ("import torch.distributed as dist\n", []),
])
def test_the_grader_modules_a_notebook_imports_are_named_for_the_zygote_to_preload(src, named):
    """A rank cannot import grader code from disk, and a zygote imports nbcheck and bench (comm.PRELOAD_GRADER)
    only for a submission whose static report names them: every way of importing them is named."""
    assert [m for m in inspect(src).torch_modules if m.startswith("grader.")] == named


@pytest.mark.parametrize("src, problem", [
    ("def run_worker(:\n", "static.syntax_error"),
    ("x = " + "(" * 3000 + "1" + ")" * 3000 + "\n", "static.too_complex"),  # too deep for the parser
])
def test_unparsable_source_is_the_students_problem(src, problem):
    tree, found = static.parse_source(src, "s.py")
    assert tree is None and found.key == problem


@pytest.mark.parametrize("body, expected", [
    ("dist.all_reduce(t)\nassert torch.allclose(t, e), 'wrong'", True),                   # the seed's reference
    ("dist.all_reduce(t)\ntorch.testing.assert_close(t, e)", True),
    ("dist.all_reduce(t)\nif not ok(t):\n    raise ValueError('wrong')", True),
    ("check(t)", True),                                                             # a helper it reaches asserts
    ("raise NotImplementedError", False),                                           # the stub
    ("dist.all_reduce(t)\nreturn t", False),
    ("if False:\n    assert t", False),                                            # dead code
])
def test_self_checks_names_code_that_may_stop_on_its_own_values(body, expected):
    """A hint for scheduling only (api._run_all): `grade` starts the clean runs that a perturbed run's failed
    assert will need at once, instead of in a second round."""
    src = ("import torch, torch.distributed as dist\n"
           "def check(t):\n    assert t.sum() > 0\n"
           "def unused(t):\n    assert t is None\n"
           "def run_worker(r, w):\n" + textwrap.indent(body, "    ") + "\n")
    assert static.inspect_source(ast.parse(src)).self_checks is expected


# -- getattr with a name held in a constant (issue 19) ---------------------------------------------

HEAD = "import functools, threading\nimport torch.distributed as dist\n"


@pytest.mark.parametrize("src, ops", [
    ('OPS = {"feat": "all_gather", "grad": "all_reduce"}\ndef run_worker(r, w):\n    getattr(dist, OPS["feat"])(l, t)\n',
     {"all_gather"}),
    ('def run_worker(r, w):\n    OPS = {"feat": "all_gather", "grad": "all_reduce"}\n    getattr(dist, OPS["grad"])(t)\n',
     {"all_reduce"}),
    ('OPS = {"feat": "all_gather"}\ndef run_worker(r, w):\n    getattr(dist, OPS.get("feat"))(l, t)\n', {"all_gather"}),
    ('NAME = "all_reduce"\ndef run_worker(r, w):\n    getattr(dist, NAME)(t)\n', {"all_reduce"}),
    ('def run_worker(r, w):\n    name: str = "reduce_scatter_tensor"\n    op = getattr(dist, name)\n    op(o, t)\n',
     {"reduce_scatter"}),
    ('NAMES = ("all_reduce", "all_gather")\ndef run_worker(r, w):\n    for name in NAMES:\n        getattr(dist, name)(t)\n',
     {"all_reduce", "all_gather"}),
    ('def run_worker(r, w):\n    getattr(dist, "all_" + "gather")(l, t)\n', {"all_gather"}),
    ('def run_worker(r, w):\n    getattr(dist.group.WORLD, "allreduce")([t])\n', {"all_reduce"}),
])
def test_getattr_with_a_constant_valued_name_reaches_the_operation_it_names(src, ops):
    assert reached(HEAD + src) == ops


@pytest.mark.parametrize("src", [
    'def run_worker(r, w):\n    getattr(dist, kind)(t)\n',                                  # not a constant
    'OPS = {"feat": "all_gather"}\ndef run_worker(r, w):\n    getattr(dist, OPS[key])(l, t)\n',  # key not constant
    'def run_worker(r, w):\n    getattr(dist, "".join(("all", "_reduce")))(t)\n',            # built at run time
])
def test_getattr_with_a_name_known_only_at_run_time_names_nothing(src):
    assert reached(HEAD + src) == set()


# -- a reference counts when its value is used (issue 19) ----------------------------------------

@pytest.mark.parametrize("body, ops", [
    ("f = dist.reduce_scatter_tensor\n    f(o, t)", {"reduce_scatter"}),                       # bound, then called
    ("f = dist.reduce_scatter_tensor\n    g = f\n    g(o, t)", {"reduce_scatter"}),            # through two names
    ("list(map(dist.all_reduce, tensors))", {"all_reduce"}),                                 # passed to map
    ("apply(dist.all_reduce, t)", {"all_reduce"}),                                            # a helper's parameter
    ("functools.partial(dist.all_gather, l)", {"all_gather"}),                                # passed to partial
    ("threading.Thread(target=dist.all_reduce, args=(t,))", {"all_reduce"}),                  # passed by keyword
    ("return dist.all_reduce", {"all_reduce"}),                                               # returned
    ("return pick()(t)", {"all_reduce"}),                                                     # a helper returns it
    ("ops = [dist.all_reduce, dist.all_gather]\n    for op in ops:\n        op(t)", {"all_reduce", "all_gather"}),
    ("for op in (dist.all_reduce,):\n        op(t)", {"all_reduce"}),
    ("[op(t) for op in (dist.all_reduce,)]", {"all_reduce"}),
    ("run_all((dist.all_reduce, dist.all_gather))", {"all_reduce", "all_gather"}),            # a container passed on
    ("table = {'sum': dist.all_reduce, 'cat': dist.all_gather}\n    table['sum'](t)", {"all_reduce"}),
    ("table = {'sum': dist.all_reduce}\n    table.get('sum')(t)", {"all_reduce"}),
    ("self.op = dist.all_reduce", {"all_reduce"}),                                            # stored on an object
    ("(op := dist.all_reduce)(t)", {"all_reduce"}),
    ("op = dist.all_reduce if r else dist.all_gather\n    op(t)", {"all_reduce", "all_gather"}),
    ("return Reduce.apply(t) @ t", {"all_reduce"}),          # an autograd Function's result computed with
    ("h = -Reduce.apply(t)\n    return h", {"all_reduce"}),
    ("return t[Reduce.apply(t) > 0]", {"all_reduce"}),
])
def test_a_reference_counts_when_its_value_is_used(body, ops):
    src = HEAD + ("def apply(op, t):\n    op(t)\ndef pick():\n    return dist.all_reduce\n"
                  "class Reduce(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n        return x\n"
                  "    @staticmethod\n    def backward(ctx, g):\n        dist.all_reduce(g)\n        return g\n"
                  "def run_worker(r, w):\n    " + body + "\n")
    assert reached(src) == ops


@pytest.mark.parametrize("body", [
    "f = dist.reduce_scatter_tensor",                                 # bound to a name never used
    "f = dist.reduce_scatter_tensor\n    g = f",                      # ... nor is the name it goes on to
    "dist.reduce_scatter_tensor",                                     # a statement of its own
    "f = getattr(dist, 'reduce_scatter_tensor')",
    "ops = [dist.reduce_scatter_tensor]",                             # a container never used
    "table = {'rs': dist.reduce_scatter_tensor}\n    table['other'](t)",   # read with another key
    "if dist.reduce_scatter_tensor is not None:\n        pass",        # compared, not called
    "print(dist.reduce_scatter_tensor.__name__)",                     # an attribute of it is not it
    "x = dist.group.WORLD._reduce_scatter_base",
    "f = unused",                                                     # a helper bound to a name never used
])
def test_a_bare_reference_does_not_reach_the_operation(body):
    src = HEAD + "def unused(o, t):\n    dist.reduce_scatter_tensor(o, t)\ndef run_worker(r, w):\n    " + body + "\n"
    assert "reduce_scatter" not in reached(src)


def test_lines_are_where_the_operation_is_named():
    src = HEAD + "def run_worker(r, w):\n    work = dist.all_reduce(t, async_op=True)\n    work.wait()\n    return t\n"
    assert inspect(src).reached == {"all_reduce": [4]}


# honest styles whose operations the text does not show (DTensor's full_tensor / redistribute, getattr through a
# table): the runs show every rank completing them, which passes their static checks (their sidecars in
# tests/fixtures/dist_primitives/honest/ say so)
REACHED_AT_RUN_ONLY = {"h39_dtensor_partial_full_tensor", "h40_dtensor_redistribute_replicate", "h41_dtensor_distribute_tensor",
                       "h42_getattr_table"}


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "tests" / "fixtures" / "dist_primitives" / "honest").glob("*.py")
                                        if p.stem not in REACHED_AT_RUN_ONLY), ids=lambda p: p.stem)
def test_every_honest_fixture_still_reaches_both_collectives(path):
    assert {"all_reduce", "all_gather"} <= set(static.inspect_source(ast.parse(path.read_text())).reached)


@pytest.mark.parametrize("name", sorted(REACHED_AT_RUN_ONLY))
def test_operations_reached_only_at_run_time_are_not_seen_in_the_text(name):
    path = ROOT / "tests" / "fixtures" / "dist_primitives" / "honest" / f"{name}.py"
    assert not {"all_reduce", "all_gather"} & set(static.inspect_source(ast.parse(path.read_text())).reached)


# -- an entry function in a file a notebook cell writes (issue 19) ----------------------------------

WORKER = {"dist_worker.py": "import torch.distributed as dist\ndef run_worker(r, w):\n    dist.all_reduce(t)\n"
                            "def other(r, w):\n    dist.all_gather(l, t)\n",
          "helpers.py": "import torch.distributed as dist\ndef average(t):\n    dist.all_reduce(t)\n"}


@pytest.mark.parametrize("src, origin", [
    ("from dist_worker import run_worker\n", ("dist_worker.py", "run_worker")),
    ("from dist_worker import other as run_worker\n", ("dist_worker.py", "other")),
    ("import dist_worker\nrun_worker = dist_worker.other\n", ("dist_worker.py", "other")),
    ("import dist_worker\nimport torch.multiprocessing as mp\nmp.spawn(dist_worker.run_worker, nprocs=2)\n",
     ("dist_worker.py", "run_worker")),
    ("import dist_worker as w\nmp.spawn(w.run_worker, nprocs=2)\n", ("dist_worker.py", "run_worker")),
    ("from dist_worker import run_worker\ndef run_worker(r, w):\n    pass\n", None),        # the last binding wins
    ("import dist_worker\n", ("dist_worker.py", "run_worker")),                              # the one file defining it
    ("from dist_worker import *\n", ("dist_worker.py", "run_worker")),
    ("from dist_worker import *\ndef run_worker(r, w):\n    pass\n", None),                   # the last binding wins
    ("def launch(r, w):\n    from dist_worker import run_worker\n    run_worker(r, w)\n",      # imported where spawned
     ("dist_worker.py", "run_worker")),
    ("def launch(r, w):\n    import dist_worker\n    dist_worker.run_worker(r, w)\n", ("dist_worker.py", "run_worker")),
    ("pass  # !python dist_worker.py\n", ("dist_worker.py", "run_worker")),                 # a script the notebook runs
    ("from elsewhere import run_worker\n", None),                                           # not a written file
])
def test_entry_origin(src, origin):
    assert static.entry_origin(ast.parse(src), "run_worker", WORKER) == origin
    assert static.entry_origin(ast.parse(src), "run_worker", {}) is None


def test_a_notebook_entry_reaches_operations_through_a_written_helper_at_the_calling_line():
    src = "from helpers import average\nimport helpers\ndef run_worker(r, w):\n    average(t)\n    x = helpers.average\n"
    report = static.inspect_source(ast.parse(src), files=WORKER)
    assert report.entry_file is None and report.reached == {"all_reduce": [4]}   # line 5 is a bare reference


def test_an_entry_file_that_does_not_parse_leaves_the_error_to_the_ranks():
    report = static.inspect_source(ast.parse("from dist_worker import run_worker\n"), files={"dist_worker.py": "def run_worker(:\n"})
    assert report.has_entry and report.entry_file == "dist_worker.py" and report.reached == {}


def test_torch_modules_of_written_files_are_preloaded():
    files = {"w.py": "import torch.distributed._functional_collectives as fc\ndef run_worker(r, n):\n    fc.all_reduce(t, 'sum', g)\n"}
    report = static.inspect_source(ast.parse("from w import run_worker\n"), files=files)
    assert report.reached == {"all_reduce": [3]} and "torch._dynamo" in report.torch_modules


def test_no_entry_origin_when_several_written_files_define_it_and_nothing_names_one():
    files = {**WORKER, "other.py": "def run_worker(r, w):\n    pass\n"}
    assert static.entry_origin(ast.parse("pass\n"), "run_worker", files) is None
    assert static.entry_origin(ast.parse("from other import *\n"), "run_worker", files) == ("other.py", "run_worker")


# -- what a rank runs of the top level (definitions_only) ----------------------------------------------

def kept(src: str) -> str:
    return ast.unparse(definitions.definitions_only(ast.parse(textwrap.dedent(src))))


LAUNCH_HEAD = """
import functools, os, platform, subprocess, timeit
import multiprocessing
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
def run_worker(r, w):
    t = torch.ones(4)
    dist.all_reduce(t)
    return t
def spawn_all(n):
    mp.spawn(run_worker, nprocs=n)
def main():
    for n in (2, 4):
        spawn_all(n)
def make_worker():
    def worker(r, w):
        dist.all_gather([], torch.ones(1))
    return worker
def timed(fn):
    def wrapper(*args):
        return fn(*args)
    return wrapper
def table():
    return {r: r // 2 for r in range(8)}
class Launcher:
    def __init__(self, n):
        mp.spawn(run_worker, nprocs=n)
"""


@pytest.mark.parametrize("line", [
    "USE_NCCL = platform.system() == 'Linux'",                     # platform.system is not os.system
    "INITIAL = table()",                                           # a constant from the submission's own helper
    "all_reduce = timed(dist.all_reduce)",                         # a wrapper: the operation is passed, not called
    "run_worker = make_worker()",                                  # a factory: what it returns is not called
    "go = lambda t: dist.all_reduce(t)",                           # a lambda is a definition
    "R = functools.partial(dist.all_reduce, op=dist.ReduceOp.SUM)",
    "NODE_OF = {}\nfor r in range(64):\n    NODE_OF[r] = r // 2",  # a table a loop fills
    "LEADERS = []\nfor r in range(64):\n    if r % 2 == 0:\n        LEADERS.append(r)",
    "SIZES = []\nSIZES.extend([1, 2])",                             # filling a container the module binds
    "os.environ['MASTER_PORT'] = '29500'",
    "with open(__file__) as f:\n    TEXT = f.read()",
    "run_worker = torch.compile(run_worker, fullgraph=True)",        # wrapped, not called (scope.WRAPPERS)
    "compiled = torch.compile(run_worker, mode='max-autotune-no-cudagraphs')",
    "sync = functools.partial(run_worker, 0)",
])
def test_a_rank_keeps_top_level_code_that_only_computes_values(line):
    src = LAUNCH_HEAD + line + "\n"
    assert kept(src) == ast.unparse(ast.parse(src))


@pytest.mark.parametrize("line", [
    "procs = mp.spawn(run_worker, nprocs=2)",                                 # by its origin
    "status = os.system('nvidia-smi')",
    "out = subprocess.run(['nvidia-smi'])",
    "p = multiprocessing.Process(target=run_worker, args=(0, 2))",
    "ctx = mp.get_context('spawn')\np = ctx.Process(target=run_worker)",       # origin unknown: by name
    "x = main()",                                                              # through own functions
    "x = [spawn_all(n) for n in (2, 4)]",
    "for n in (2, 4):\n    spawn_all(n)",                                        # a launch loop
    "RESULTS = {}\nfor n in (2, 4):\n    RESULTS[n] = main()",
    "t = timeit.timeit(lambda: spawn_all(2), number=3)",                      # a callback it calls
    "t = timeit.timeit(main, number=3)",
    "go = functools.partial(mp.spawn, run_worker)",                            # a launcher passed on
    "launcher = Launcher(2)",                                                  # a class whose __init__ spawns
    "answer = run_worker(0, 1)",                                              # communicates at import
    "answer = torch.compile(run_worker)(0, 1)",                               # wrapped, then called
    "go = functools.partial(torch.compile(run_worker), 0)()",
    "GROUP = dist.new_group([0, 1])",
    "with multiprocessing.Pool(2) as pool:\n    SQUARES = pool.map(abs, [1, 2])",
    "if True:\n    main()",
    "while True:\n    x = 1",                                                   # never a while loop
    "for n in (2, 4):\n    print(n)",                                          # a loop that only prints
    "print('launching')",
    "main()",
])
def test_a_rank_drops_top_level_code_that_launches_or_communicates(line):
    kept_src = kept(LAUNCH_HEAD + line + "\n")
    head = ast.unparse(ast.parse(LAUNCH_HEAD))
    assert kept_src.startswith(head)
    rest = kept_src[len(head):].strip()
    assert rest in ("", "if True:\n    pass", "ctx = mp.get_context('spawn')", "RESULTS = {}"), rest


def test_a_statement_reading_what_a_dropped_one_bound_is_dropped_too():
    src = LAUNCH_HEAD + """
procs = [mp.Process(target=run_worker, args=(r, 2)) for r in range(2)]
for p in procs:
    p.start()
NAMES = [str(p) for p in procs]
DONE = []
for p in procs:
    DONE.append(p)
N = 4
TABLE = {r: r for r in range(N)}
"""
    rest = kept(src)[len(ast.unparse(ast.parse(LAUNCH_HEAD))):].strip()
    assert rest == "DONE = []\nN = 4\nTABLE = {r: r for r in range(N)}"


@pytest.mark.parametrize("qualified, name, launches", [
    ("os.system", "system", True), ("platform.system", "system", False), ("subprocess.run", "run", True),
    ("torch.multiprocessing.spawn", "spawn", True), ("os.execvp", "execvp", True), ("os.path.join", "join", False),
    ("torch.distributed.run.main", "main", True), ("time.process_time", "process_time", False),
    (None, "Process", True), (None, "start", False),
    ("mylib.run", "run", True),                                 # another package's: by its name
])
def test_launchers_by_origin_where_it_is_known(qualified, name, launches):
    assert definitions.is_launcher(qualified, name) is launches


# -- entries and operations made by the submission's own factories and wrappers ---------------------------

def test_an_operation_wrapped_by_the_submissions_own_function_is_reached():
    src = LAUNCH_HEAD + "all_reduce = timed(dist.all_reduce)\nother = timed(dist.all_gather)\n" + \
        "def run_worker(r, w):\n    all_reduce(t)\n"
    assert reached(src) == {"all_reduce"}          # `other` is never used
    # a call of something else with the operation as an argument is not a wrapper the value holds
    assert reached(HEAD + "x = len(dist.all_reduce)\ndef run_worker(r, w):\n    x(t)\n") == set()


@pytest.mark.parametrize("src, line, params, ops", [
    ("def make(n):\n    def worker(rank, ws):\n        dist.all_reduce(t)\n    return worker\nrun_worker = make(4)\n",
     4, 2, {"all_reduce"}),
    ("def timed(fn):\n    def wrapper(*a):\n        return fn(*a)\n    return wrapper\n"
     "def _impl(rank, ws):\n    dist.all_gather(l, t)\nrun_worker = timed(_impl)\n", 7, 2, {"all_gather"}),
    ("def run_worker(rank, ws):\n    dist.all_gather(l, t)\n"
     "def timed(fn):\n    return fn\nrun_worker = timed(run_worker)\n", 3, 2, {"all_gather"}),
])
def test_an_entry_made_by_a_factory_or_wrapper_of_the_submission(src, line, params, ops):
    report = inspect(HEAD + src)
    assert report.has_entry and report.entry_line == line and report.entry_params == params
    assert set(report.reached) == ops


@pytest.mark.parametrize("binding", ["compiled = torch.compile(_step, mode='max-autotune-no-cudagraphs')",
                                     "compiled = functools.partial(_step)", "compiled = torch.compiler.disable(_step)",
                                     "compiled = torch.compile(functools.partial(_step), fullgraph=True)"])
def test_a_function_wrapped_at_the_top_level_is_walked_through_the_name_it_is_bound_to(binding):
    """`compiled = torch.compile(step)` binds step itself (scope.WRAPPERS): what run_worker reaches through it."""
    src = HEAD + "import torch\ndef _step(t):\n    dist.all_reduce(t)\n" + binding + \
        "\ndef run_worker(r, w):\n    return compiled(t)\n"
    assert reached(src) == {"all_reduce"}
    for binding in ("run_worker = torch.compile(_worker)", "run_worker = _worker"):
        entry = inspect(HEAD + "import torch\ndef _worker(r, w):\n    dist.all_gather(l, t)\n" + binding + "\n")
        assert entry.has_entry and set(entry.reached) == {"all_gather"}, binding


def test_an_entry_made_by_something_else_is_not_found():
    assert not inspect(HEAD + "run_worker = make_it()\n").has_entry
    assert not inspect(HEAD + "def make():\n    return 1\nrun_worker = make()\n").has_entry
    # a def after the factory's binding is the entry, as when Python runs it
    src = HEAD + "def make():\n    def w(r, n):\n        pass\n    return w\nrun_worker = make()\ndef run_worker(a, b, c):\n    pass\n"
    assert inspect(src).entry_params == 3


def test_a_name_a_dropped_block_binds_again_keeps_its_kept_value():
    src = LAUNCH_HEAD + """
world_size = 2
if __name__ == "__main__":
    world_size = 4
    spawn_all(world_size)
SIZES = [world_size * k for k in (1, 2)]
"""
    assert kept(src).endswith("world_size = 2\nSIZES = [world_size * k for k in (1, 2)]")
