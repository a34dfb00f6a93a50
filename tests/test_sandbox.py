"""Hostile submissions (tests/fixtures/sandbox/) through the real CLI: each gets its own verdict, in
bounded time, and leaves nothing behind (issue 5); what a rank can see (issue 10; the red team of
issue 10 is tests/test_redteam.py)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, PY, ROOT, outcomes, run_cli, slowdown, stretched
from grader.processes.limits import UID_BASE, UID_BLOCK, UID_BLOCKS, uid_range

SANDBOX = FIXTURES / "sandbox"
SOLUTION = ROOT / "solutions" / "dist_primitives" / "dist_primitives.py"


def leftover_processes(supervisor: int | None = None) -> list[int]:
    """Processes still running under the uids a supervisor hands out (any supervisor's when None)."""
    if supervisor is None:
        low, high = UID_BASE, UID_BASE + UID_BLOCKS * UID_BLOCK
    else:  # a supervisor's first choice of uid block (another one only if a live grader holds that one)
        low, high = uid_range(supervisor % UID_BLOCKS)
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if low <= uid < high:
                pids.append(int(entry.name))
    return pids


def batch_watching_workers(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, set[int]]:
    """`python -m grader ARGS` (a batch), and the pids of every worker it started (each is a supervisor with
    uids of its own: other graders on a shared machine have others)."""
    proc = subprocess.Popen([PY, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    workers: set[int] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                workers.update(int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=stretched(timeout))
    finally:
        done.set()
        watcher.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), workers


def grade_process(submission: Path, results: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "grader", "grade", str(submission), "--results", str(results), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 80) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        h.update(str(path).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


CASES = [
    # fixture, expected outcome of ws2.all_reduce, total score, extra CLI args. Every hostile fixture is
    # graded in test_hostile_class_through_batch but the memory toucher (ALONE: graded by
    # test_total_memory_of_all_ranks_is_capped), the fork bomb there only (each of its gradings costs both
    # cores for seconds while the kernel ends its processes); these go through `grade` on their own as well.
    ("kill_parent", "crash", 0, ()),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name,outcome,total,extra", CASES, ids=[c[0] for c in CASES])
def test_hostile_submission_gets_its_verdict(tmp_path, name, outcome, total, extra):
    results = tmp_path / "results.json"
    started = time.monotonic()
    proc = grade_process(SANDBOX / f"{name}.py", results, "--lang", "en", *extra)
    out = finish(proc)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0
    data = json.loads(results.read_text())
    assert outcomes(data)["ws2.all_reduce"] == outcome
    assert data["score"] == total
    assert elapsed < 60, f"grading took {elapsed:.1f} s"
    assert "Traceback" not in out
    assert leftover_processes(proc.pid) == []


@pytest.mark.timeout(60)
def test_memory_hog_stopped_by_memory_limit(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SANDBOX / "memory_hog.py"), "--results", str(results), "--lang", "en")
    data = json.loads(results.read_text())
    assert outcomes(data)["ws2.all_gather"] == "memory_limit", proc.stdout
    assert "went over its memory limit" in proc.stdout
    # it did average the gradient through all_reduce before hogging: those checks keep their points
    assert [outcomes(data)[f"ws{ws}.all_reduce"] for ws in (2, 3, 4)] == ["pass"] * 3
    assert data["score"] == 10 + 3 * 15


@pytest.mark.timeout(60)
def test_total_memory_of_all_ranks_is_capped(tmp_path):
    """Ranks that each stay under their own limit but together would exhaust the machine: the grader's
    memory cgroup lets the kernel stop one of them, and the verdict says memory limit."""
    if not os.access("/sys/fs/cgroup/memory", os.W_OK):
        pytest.fail("this machine has no writable cgroup v1 memory controller; the test needs one")
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SANDBOX / "memory_toucher.py"), "--results", str(results), "--lang", "en",
                   "--memory-mb", "16384", "--memory-total-mb", "800", "--time-limit", "20")
    data = json.loads(results.read_text())
    assert outcomes(data)["ws2.all_gather"] == "memory_limit", proc.stdout
    assert "memory cgroup (800 MiB for all ranks)" in proc.stdout
    assert data["score"] <= 55


@pytest.mark.timeout(30)
def test_the_memory_cgroup_goes_once_its_last_process_has_left_and_never_blocks_for_long(tmp_path):
    """MemoryCgroup.remove tries again until its folder can go (a cgroup's, while the zygote's pods are still
    exiting), and gives up after its patience instead of holding the grader's exit. A plain folder stands in
    for the cgroup: it cannot go while it holds a file, as a cgroup cannot while it holds a process."""
    from grader.processes.cgroup import MemoryCgroup
    busy = tmp_path / "grader-1-busy"
    busy.mkdir()
    (busy / "process").write_text("")
    leaving = threading.Timer(0.2, (busy / "process").unlink)
    leaving.start()
    MemoryCgroup(str(busy), 100).remove(patience=20)   # a loaded machine may run the timer late
    leaving.join()
    assert not busy.exists()
    stuck = tmp_path / "grader-1-stuck"
    stuck.mkdir()
    (stuck / "process").write_text("")
    MemoryCgroup(str(stuck), 100).remove(patience=0.1)   # returns, the folder left for the next grader's sweep
    assert stuck.exists()
    MemoryCgroup(str(tmp_path / "gone"), 100).remove()    # already gone: nothing to do


@pytest.mark.timeout(60)
def test_memory_limit_is_configurable(tmp_path):
    """A correct solution fits the default 2 GiB; with 500 MiB a rank cannot even start the grader's threads
    beside torch: named as the memory limit at once (not a hang until the time limit, not the grader's
    failure), whether the zygote is a fork of the session's template or started cold (env given)."""
    ok = tmp_path / "ok.json"
    run_cli("grade", str(SOLUTION), "--results", str(ok))
    assert json.loads(ok.read_text())["score"] == 100
    for how, env in (("forked", None), ("cold", {})):
        tight = tmp_path / f"tight-{how}.json"
        run_cli("grade", str(SOLUTION), "--results", str(tight), "--memory-mb", "500", "--lang", "en", env=env)
        results = json.loads(tight.read_text())
        assert results["score"] == 10, how
        visible = next(t for t in results["tests"] if t["name"] == "Gradient averaged with all_reduce (2 ranks)")
        assert "went over its memory limit" in visible["output"], (how, visible["output"])
        assert "Time limit" not in visible["output"] and "grader" not in visible["output"].lower(), how


@pytest.mark.timeout(60)
def test_daemon_cannot_touch_results_after_grading(tmp_path):
    """A double-forked setsid daemon wakes 3 s after its run to overwrite every results file it finds:
    the pid namespace is torn down with the run, so it never wakes."""
    results = tmp_path / "results.json"
    proc = grade_process(SANDBOX / "daemon_overwrite.py", results)
    out = finish(proc)
    before = results.read_text()
    assert json.loads(before)["score"] == 100, out
    assert leftover_processes(proc.pid) == []
    time.sleep(4)
    assert results.read_text() == before


@pytest.mark.timeout(60)
def test_killing_the_supervisor_stops_its_runs(tmp_path):
    """SIGKILL the grader mid-run: its zygote stops every run in flight and removes the run folders."""
    proc = grade_process(SANDBOX / "infinite_loop.py", tmp_path / "r.json")
    deadline = time.monotonic() + 30
    while not leftover_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(proc.pid), "the ranks never started"
    base = list(Path(tempfile.gettempdir()).glob(f"grader-runs-{proc.pid}-*"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while leftover_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(proc.pid) == []
    while any(path.exists() for path in base) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    assert base and not any(path.exists() for path in base)
    if proc.stdout:
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.timeout(60)
def test_writes_stay_in_the_working_directory(tmp_path):
    submission = tmp_path / "sub" / "write_outside.py"
    submission.parent.mkdir()
    shutil.copy(SANDBOX / "write_outside.py", submission)
    grader_before = tree_digest(ROOT / "grader")
    for leftover in ("/tmp/escaped.txt", "/var/tmp/escaped.txt", "/dev/shm/escaped.txt"):
        Path(leftover).unlink(missing_ok=True)
    results = tmp_path / "results.json"
    run_cli("grade", str(submission), "--results", str(results))
    assert json.loads(results.read_text())["score"] == 100
    assert submission.read_bytes() == (SANDBOX / "write_outside.py").read_bytes()
    assert tree_digest(ROOT / "grader") == grader_before
    assert not (submission.parent / "escaped.txt").exists()
    for leftover in ("/tmp/escaped.txt", "/var/tmp/escaped.txt", "/dev/shm/escaped.txt", "/root/escaped.txt"):
        assert not Path(leftover).exists(), leftover


@pytest.mark.timeout(90)
def test_report_names_the_layers_and_no_sandbox_still_grades(tmp_path):
    """`grade` (for TAs) names every layer; a student's `check` only when one is missing (tests/test_report.py)."""
    full = run_cli("grade", str(SOLUTION), "--lang", "en", "--tmp-mb", "32")
    assert full.returncode == 0
    layers = full.stdout.split("Sandbox: ")[-1]
    if os.geteuid() == 0:
        for layer in ("unprivileged uid, a new one for every run", "pid namespace", "network namespace",
                      "own root: only the interpreter", "own /tmp for each run (tmpfs, 32 MiB)", "no_new_privs",
                      "seccomp system call filter"):
            assert layer in layers
    bare = run_cli("check", str(SOLUTION), "--lang", "en", "--no-sandbox")
    assert bare.returncode == 0, bare.stdout
    layers = bare.stdout.split("Sandbox: ")[-1]
    assert "pid namespace" not in layers and "rlimits" in layers
    assert "no namespaces" in layers and "no seccomp filter" in layers and "no_new_privs not applied" in layers


# Graded on their own, not in the class below: the memory toucher writes every page up to each rank's limit in
# every run (~0.6 CPU-s a rank on these machines, 10-12 CPU-s a grading: a fifth of this file's CPU), and what it
# shows is a limit, the memory cgroup's (test_total_memory_of_all_ranks_is_capped), not a verdict beside others'
ALONE = ("memory_toucher",)


@pytest.mark.timeout(180)
def test_hostile_class_through_batch(tmp_path):
    """Every hostile fixture (but those graded ALONE) and two honest students in one batch (--jobs 2): each
    hostile one gets its verdict, the honest ones keep 100, and after the daemon's moment has passed no result
    has changed and no process is left."""
    klass = tmp_path / "class"
    klass.mkdir()
    for path in SANDBOX.glob("*.py"):
        if path.stem not in ALONE:
            shutil.copy(path, klass / path.name)
    shutil.copy(SOLUTION, klass / "honest_a.py")
    shutil.copy(SANDBOX / "fixed_port.py", klass / "honest_b.py")
    for cheat in ("c02_patch_comparisons", "c03_tensor_subclass", "c04_fake_output"):
        shutil.copy(FIXTURES / "dist_primitives" / "cheats" / f"{cheat}.py", klass / f"{cheat}.py")
    out = tmp_path / "out"
    # 1280 MiB per rank (a real-backend rank of honest code peaks near 900 MiB of address space): the memory hog
    # reaches it at once. 2 s per run: the endless loop (one rank spinning, the others waiting for it) runs until
    # its runs' time limit (6 runs), each second of it a second of CPU the rest of the suite waits for, and an
    # honest run beside it took up to 0.9 s in a loaded suite (the fork bomb's processes are counted before it).
    # Stretched as the machine is slower, at most three times: the 2 s are sized for the suite's own load
    # already, and the load average counts the suite (in a full `make test` it made them ~14 s of spinning a run)
    limit = 2 * min(slowdown(), 3.0)
    proc, workers = batch_watching_workers("batch", str(klass), "--out", str(out), "--jobs", "2",
                                           "--time-limit", f"{limit:.1f}", "--memory-mb", "1280", "--lang", "en",
                                           timeout=170)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = {
        "honest_a": ("pass", 100), "honest_b": ("pass", 100), "daemon_overwrite": ("pass", 100),
        "write_outside": ("pass", 100), "fixed_port": ("pass", 100),
        "infinite_loop": ("timeout", 5), "fork_bomb": ("process_limit", 5), "one_rank_collective": ("exception", 10),  # its mismatched first calls, named by the switch
        "output_flood": ("output_limit", 5), "kill_parent": ("crash", 0), "os_exit": ("early_exit", 0),
        "sys_exit": ("early_exit", 0), "memory_hog": ("pass", 55),
        "c02_patch_comparisons": ("wrong", 10), "c03_tensor_subclass": ("bad_type", 10),
        "c04_fake_output": ("missing", 10),   # returns (None, None)
    }
    snapshot = {}
    for student, (outcome, score) in expected.items():
        data = json.loads((out / f"{student}.json").read_text())
        assert data["score"] == score, (student, data["extra_data"]["outcomes"])
        assert outcomes(data)["ws2.all_reduce"] == outcome, (student, data["extra_data"]["outcomes"])
    # the fork bomb was stopped once its processes were counted, in every run, not left to spin to the time limit
    bomb = json.loads((out / "fork_bomb.json").read_text())["extra_data"]["runs"]
    assert {run["stop"] for run in bomb} == {"process_limit"}, bomb
    for path in sorted(out.iterdir()):
        if path.is_file():
            snapshot[path.name] = path.read_bytes()
    time.sleep(4)  # the daemon meant to wake 3 s after its run and overwrite every results file it finds
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()} == snapshot
    assert workers and [pid for worker in workers for pid in leftover_processes(worker)] == []


@pytest.mark.timeout(90)
def test_unprivileged_user_grades_with_the_layers_it_has():
    """As a student on a laptop (not root): no uid change, but user, pid and network namespaces, the new root,
    NO_NEW_PRIVS and seccomp where the kernel allows them; a daemon still dies with its run, and the report
    (`grade`'s, for TAs) lists what applied. tests/tools/as_nobody.py makes this clone reachable for nobody wherever it lives (a
    mode-700 folder above it included), without changing anything on disk."""
    assert os.geteuid() == 0, "the test makes an unprivileged user with tests/tools/as_nobody.py"
    cmd = [PY, str(ROOT / "tests" / "tools" / "as_nobody.py"),
           PY, "-m", "grader", "grade", str(SANDBOX / "daemon_overwrite.py"), "--lang", "en"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out = finish(proc)
    assert proc.returncode == 0, out
    layers = out.split("Sandbox: ")[-1]
    assert "unprivileged uid" not in layers
    for layer in ("user namespace", "pid namespace", "own root", "own /tmp", "no_new_privs", "seccomp system call"):
        assert layer in layers, layers
    time.sleep(4)  # the daemon's moment: it never comes, its pid namespace is gone
    survivors = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                # this checkout's grader processes only (its interpreter's path): another checkout's tests may
                # run the same test beside this one
                cmdline = Path(entry.path, "cmdline").read_bytes()
                if entry.stat().st_uid == 65534 and b"grader" in cmdline and os.fsencode(ROOT) in cmdline:
                    survivors.append(entry.name)
            except OSError:
                pass
    assert survivors == []


@pytest.mark.timeout(60)
def test_the_checkout_is_not_readable_from_a_rank():
    """A rank learns the checkout's path from the grader's own modules and tries the solution, the grader's
    source and the tests; it also walks every folder it can see outside the system and the interpreter:
    it finds nothing, and its honest answer still gets full marks."""
    proc = run_cli("check", str(SANDBOX / "read_checkout.py"), "--lang", "en")
    assert proc.returncode == 0, proc.stdout
    assert "  | solution: FileNotFoundError" in proc.stdout
    assert "  | grader source: FileNotFoundError" in proc.stdout
    assert "  | tests: FileNotFoundError" in proc.stdout
    assert "  | visible files: []" in proc.stdout


@pytest.mark.timeout(60)
def test_a_checkout_in_a_private_folder_under_tmp_grades_honest_code(tmp_path):
    """A copy of the grader in a mode-700 folder below /tmp (as a CI clone made with `mktemp -d`): ranks get
    the grader's modules from the zygote, the libraries from the interpreter's folders, and lazy imports of
    the standard library, site-packages and torch still work, from a folder of sys.path below /tmp too (a
    venv inside a clone there: each rank's own /tmp must not hide it); grader modules not preloaded do not."""
    private = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        assert (private.stat().st_mode & 0o777) == 0o700
        checkout = private / "checkout"
        shutil.copytree(ROOT / "grader", checkout / "grader", ignore=shutil.ignore_patterns("__pycache__"))
        for definition in (ROOT / "solutions").glob("*/exercise.py"):     # the exercises, not their solutions
            (checkout / definition.relative_to(ROOT)).parent.mkdir(parents=True)
            shutil.copy(definition, checkout / definition.relative_to(ROOT))
        site = private / "site"
        site.mkdir()
        (site / "tmp_probe_lib.py").write_text("VALUE = 1\n", encoding="utf-8")
        site.chmod(0o755)
        proc = subprocess.run([PY, "-m", "grader", "check", str(SANDBOX / "lazy_library_import.py"), "--lang", "en",
                               "--time-limit", "30"],
                              cwd=checkout, capture_output=True, text=True, timeout=stretched(50),
                              env={**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{site}"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Score: 40 / 40" in proc.stdout
        assert "  | tmp_probe_lib: imported" in proc.stdout, proc.stdout
        assert "  | grader.integrations.release: ModuleNotFoundError" in proc.stdout
    finally:
        shutil.rmtree(private, ignore_errors=True)


@pytest.mark.timeout(60)
def test_ranks_see_no_secret_of_the_grader():
    """A TA's token in the grader's environment reaches neither the ranks' environment nor, through
    /proc, any process they can see."""
    proc = run_cli("check", str(SANDBOX / "env_probe.py"), "--lang", "en", env={"TA_SECRET_TOKEN": "s3cret-value"})
    assert proc.returncode == 0, proc.stdout
    assert "  | found: {}" in proc.stdout
    assert "s3cret-value" not in proc.stdout


def _grader_imports(path: Path) -> set[str]:
    """Grader modules a file imports anywhere (function bodies included), as absolute names."""
    import ast
    package = "grader." + ".".join(path.relative_to(ROOT / "grader").with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.startswith("grader"):
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("grader"))
    return {m for m in found if (ROOT / (m.replace(".", "/") + ".py")).exists()
            or (ROOT / m.replace(".", "/") / "__init__.py").exists()}


@pytest.mark.timeout(60)
def test_every_grader_module_a_rank_can_reach_is_preloaded_by_the_zygote():
    """Ranks cannot read the checkout: whatever grader module rank.py reaches (lazily too) must already be in
    the zygote's memory when it forks, and whatever an exercise notebook imports from the grader must be once
    the zygote has preloaded what the notebook's static report names (comm.PRELOAD_GRADER: not before, so
    that a `.py` submission's zygote starts without the whole grader)."""
    from grader.submission import load, static
    reached, todo = set(), ["grader.processes.rank"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        path = ROOT / (module.replace(".", "/") + ".py")
        if path.exists():
            todo += sorted(_grader_imports(path))
    from_rank = set(reached)
    named = set()
    for nb in (ROOT / "assignments").rglob("*.ipynb"):
        submission = load.load(nb)   # as `grade` reads it: what its static report names, the zygote preloads
        tree = static.parse_source(submission.source, submission.filename)[0]
        named.update(static.inspect_source(tree, "run_worker", getattr(submission, "files", None)).torch_modules)
        for cell in json.loads(nb.read_text())["cells"]:
            for line in "".join(cell["source"]).split("\n"):
                words = line.split()
                if words[:1] in (["from"], ["import"]) and len(words) > 1 and words[1].startswith("grader"):
                    reached.add(words[1])
                    if words[0] == "from" and words[2:3] == ["import"]:
                        names = " ".join(words[3:]).replace(",", " ").split()
                        reached.update(f"{words[1]}.{n}" for n in names
                                       if (ROOT / words[1].replace(".", "/") / f"{n}.py").exists())
    code = ("import sys; from grader.processes import zygote; grader = lambda: sorted(m for m in sys.modules "
            "if m.startswith('grader')); print(grader()); zygote._preload(sys.argv[1:]); print(grader())")
    proc = subprocess.run([PY, "-c", code, *sorted(named)], cwd=ROOT, capture_output=True, text=True,
                          timeout=stretched(50))
    at_start, preloaded = (set(eval(line)) for line in proc.stdout.splitlines())
    assert "grader.integrations.nbcheck" in reached and "grader.integrations.nbcheck" in named
    assert from_rank - at_start == set(), proc.stderr
    assert "grader.integrations.nbcheck" not in at_start
    assert reached - preloaded == set(), proc.stderr
