"""torch.compile in ranks: inductor's backend compiles with aot_eager, warmed up by the zygote
(grader/processes/inductor.py)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PY, ROOT, stretched

# A zygote's part, then a rank's: the rank is a fork, as in a run, and records every process it starts and
# every file its compile writes.
SCRIPT = r"""
import json, os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from grader.processes import inductor
inductor.set_environment()
import torch, torch.distributed as dist
inductor.eager_kernels()
out = {"warmed": inductor.warm_up(backward=True), "threads": threading.active_count(),
       "initialized": dist.is_initialized()}
read, write = os.pipe()
if os.fork() == 0:
    cache = sys.argv[2]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    commands = []
    real = subprocess.Popen.__init__
    def record(self, args, *rest, **kw):
        commands.append(str(args))
        real(self, args, *rest, **kw)
    subprocess.Popen.__init__ = record
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=2)   # registered by the warm-up
    child = {"group": dist.group.WORLD.group_name}
    modules = len(sys.modules)

    @torch.compile(mode="max-autotune-no-cudagraphs")
    def averaged(g, n):
        dist.all_reduce(g)
        return g / n

    child["value"] = averaged(torch.full((16,), 6.0), 3).tolist()[0]
    layer = torch.compile(torch.nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        layer.weight.fill_(1.0)
    layer(torch.full((3, 4), 2.0)).sum().backward()
    child["grad"] = layer.weight.grad.tolist()
    child["new_modules"] = len(sys.modules) - modules
    config = averaged.get_compiler_config()
    child["config"] = isinstance(config, dict) and "max_autotune" in config
    try:
        torch.compile(lambda x: x, options={"no_such_option": 1})
    except RuntimeError as err:
        child["refused"] = str(err).split(",")[0]
    child["commands"] = commands
    child["written"] = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
    os.write(write, json.dumps(child).encode())
    os._exit(0)
os.close(write)
out["rank"] = json.loads(os.read(read, 1 << 20)); os.wait()
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_a_rank_compiles_with_eager_kernels_after_the_zygotes_warm_up(tmp_path):
    """The zygote's warm-up leaves no process group and no thread behind; in its fork, torch.compile (any mode)
    of a step with a collective and of a Linear's forward and backward gives torch's values with no process
    started (no g++), no file written and no module imported that the warm-up had not; options are checked
    as torch checks them, and the compiled function's config is inductor's."""
    proc = subprocess.run([PY, "-c", SCRIPT, str(ROOT), str(tmp_path / "rank-cache")], capture_output=True,
                          text=True, timeout=stretched(100))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["warmed"] and got["threads"] == 1 and not got["initialized"]
    rank = got["rank"]
    assert rank["group"] == "0"   # as in a fresh process: the warm-up's group left no trace in the names
    assert rank["value"] == 2.0 and rank["grad"] == [[6.0] * 4, [6.0] * 4]   # the fake group returns its input
    assert rank["commands"] == [] and rank["written"] == [] and rank["new_modules"] == 0, rank
    assert rank["config"] and rank["refused"] == "Unexpected optimization option no_such_option"
