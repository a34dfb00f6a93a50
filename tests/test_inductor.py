"""torch.compile's precompiled header: built by the zygote (trusted), read-only for ranks (grader/processes/inductor.py)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import PY, ROOT, stretched
from grader.processes import inductor

# A zygote's part, then a rank's: the rank is a fork with its own inductor cache folder, as in a run.
SCRIPT = r"""
import json, os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from grader.processes import inductor
inductor.set_environment()
import torch, torch._inductor.compile_fx
from torch._inductor import codecache
out = {"first": inductor.warm_up(), "threads": threading.active_count(), "headers": list(inductor._STATE["headers"].values())}
out["answers"] = codecache._precompile_header is inductor._prebuilt
(header, line), = list(inductor._STATE["headers"].items())[:1]
out["unknown"] = inductor._prebuilt(header, line + " -O0")
def listing():   # a zygote of another grading may be renaming its manifest into place: not a rank's doing
    return sorted(n for n in os.listdir(inductor.HEADERS) if not n.startswith("."))
before = listing()
read, write = os.pipe()
if os.fork() == 0:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[2]
    commands = []
    real = subprocess.Popen.__init__
    def record(self, args, *rest, **kw):
        commands.append(" ".join(args) if isinstance(args, list) else str(args))
        real(self, args, *rest, **kw)
    subprocess.Popen.__init__ = record
    value = torch.compile(lambda g, n: g / n)(torch.full((16,), 6.0), 3)
    os.write(write, json.dumps({"value": value.tolist()[0], "commands": commands}).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 1 << 20)); os.wait()
out.update(child, listing_unchanged=listing() == before)
inductor._STATE.clear()   # a later zygote: it finds the header through the manifest, never building one
def refuse(*args, **kw):
    raise AssertionError("built again")
codecache._precompile_header = refuse
out["second"] = inductor.warm_up()
print(json.dumps(out))
"""


@pytest.mark.timeout(240)
def test_the_zygote_builds_the_header_once_and_ranks_compile_with_it_read_only(tmp_path):
    """In the grader user's own cache, as a grading's zygote uses it: built here if no grading built it yet
    (a compiled fixture's zygote may be building it at the same moment: inductor's lock, the manifest's
    atomic rename), else found there through the manifest."""
    proc = subprocess.run([PY, "-c", SCRIPT, str(ROOT), str(tmp_path / "rank-cache")], capture_output=True,
                          text=True, timeout=stretched(200))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    folder = Path(inductor.HEADERS)
    assert got["first"] and got["second"] and got["answers"]
    assert got["threads"] == 1   # the zygote forks ranks after it: no compile worker or thread may be left
    assert got["headers"] and all(h.startswith(str(folder)) for h in got["headers"])
    for header in got["headers"]:   # ranks run as other users
        for name in (header, header + ".gch"):
            assert oct(os.stat(name).st_mode & 0o777) == "0o644"
    assert got["unknown"] is None   # another command line: compiled without a header, never built in a rank
    assert got["value"] == 2.0 and got["listing_unchanged"]
    [build] = [c for c in got["commands"] if c.startswith("g++") and ".main.cpp" in c]
    assert f"-include {got['headers'][0]}" in build   # the rank's one g++ used the zygote's header
    assert not [c for c in got["commands"] if " -E " in c or "openssl" in c]   # and never preprocessed one
    assert list(folder.glob("manifest-*.json"))


def test_a_folder_others_can_write_is_never_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert inductor._own_folder(str(shared / "inductor-headers")) is None
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert inductor._own_folder(str(mine / "inductor-headers")) == str(mine / "inductor-headers")


def test_a_manifest_names_only_headers_still_there_in_its_own_folder(tmp_path):
    folder = tmp_path / "inductor-headers"
    folder.mkdir()
    (folder / "h.h").write_text("#include <x.h>\n")
    (folder / "h.h.gch").write_bytes(b"gch")
    (tmp_path / "elsewhere.h").write_text("")
    (tmp_path / "elsewhere.h.gch").write_bytes(b"")
    manifest = folder / "manifest-x.json"
    manifest.write_text(json.dumps([["p.h", "g++ a", str(folder / "h.h")], ["p.h", "g++ b", str(tmp_path / "elsewhere.h")],
                                    ["p.h", "g++ c", str(folder / "gone.h")], ["p.h", 3, str(folder / "h.h")]]))
    assert inductor._read_manifest(str(manifest), str(folder)) == {("p.h", "g++ a"): str(folder / "h.h")}
    manifest.write_text("{not json")
    assert inductor._read_manifest(str(manifest), str(folder)) == {}


class _Codecache:   # what _built_whole sets on inductor's module
    _HEADER_DIR = _HEADER_LOCK_DIR = None


def test_a_header_is_built_aside_and_moved_in_whole(tmp_path):
    """A build killed or failing half-way leaves no header in the folder; a finished one moves in, .gch and .h;
    what a zygote killed long ago left aside is swept."""
    folder = tmp_path / "inductor-headers"
    folder.mkdir()
    stale = folder / ".building-old"
    stale.mkdir()
    os.utime(stale, (0, 0))
    codecache = _Codecache()

    def half_way(header, line, **options):
        (Path(codecache._HEADER_DIR) / "k.h").write_text("#include <p.h>\n")
        (Path(codecache._HEADER_DIR) / "k.h.gch").write_bytes(b"half")
        raise OSError("No space left on device")

    with pytest.raises(OSError):
        inductor._built_whole(codecache, half_way, str(folder), "p.h", "g++", {})
    assert os.listdir(folder) == []   # the stale build swept, the half one gone with its folder

    def whole(header, line, **options):
        (Path(codecache._HEADER_DIR) / "k.h").write_text("#include <p.h>\n")
        (Path(codecache._HEADER_DIR) / "k.h.gch").write_bytes(b"whole")
        return str(Path(codecache._HEADER_DIR) / "k.h")

    assert inductor._built_whole(codecache, whole, str(folder), "p.h", "g++", {}) == str(folder / "k.h")
    assert sorted(os.listdir(folder)) == ["k.h", "k.h.gch"] and (folder / "k.h.gch").read_bytes() == b"whole"


@pytest.mark.timeout(300)
def test_code_that_names_torch_compile_and_hangs_gets_the_plain_limits_after_its_first_time_out(tmp_path):
    """Runs of code that names torch.compile are made one at a time with twice the limits (its ranks compile);
    once one runs out of time, compiling is not what the code waits on: the later runs get the plain limits
    (and the clean runs are made at once), so naming torch.compile does not make a hang cost 12 times more."""
    from conftest import run_cli
    limit = 2
    out = tmp_path / "r.json"
    proc = run_cli("grade", str(ROOT / "tests" / "fixtures" / "compile" / "a01_names_compile_then_sleeps.py"),
                   "--exercise", "dist_primitives", "--time-limit", str(limit), "--results", str(out), "--lang", "en",
                   timeout=280)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    runs = json.loads(out.read_text())["extra_data"]["runs"]
    assert all(run["stop"] == "timeout" for run in runs) and len(runs) == 6, runs   # 3 perturbed, 3 clean
    first, *later = sorted(runs, key=lambda run: -run["elapsed"])
    assert first["label"] == "perturbed" and first["world_size"] == 2 and first["elapsed"] >= 2 * limit, runs
    assert all(run["elapsed"] < 2 * limit for run in later), runs
