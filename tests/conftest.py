"""Shared helpers: grade fixture submissions through the real command line."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from filelock import FileLock   # torch's own dependency

# jsonschema (under nbformat and nbgrader) imports rfc3987_syntax where it is installed (jupyter_events pulls it
# in), which builds a lark grammar at import: 1.2-1.3 CPU-s in every process that reads a notebook, for an
# "iri" format check that no notebook schema uses. Without it jsonschema simply skips that format (as it does
# wherever the package is absent). The test processes, and the nbgrader commands they start, go without it.
sys.modules.setdefault("rfc3987_syntax", None)
NO_IRI_FORMAT = "import sys; sys.modules['rfc3987_syntax'] = None"   # the same for a child: python -c

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PY = sys.executable
CLI_TIMEOUT = 120
BATCH_TIMEOUT = 600   # one batch of a folder of fixtures
MAX_SLOWDOWN = 12.0


def slowdown() -> float:
    """How much slower than a quiet machine this one runs now: the runnable processes per core over the last
    minute (os.getloadavg), at least 1, at most MAX_SLOWDOWN. The time limits in tests are sized on a quiet
    machine of the kind `make test` runs on (2 cores), and they check a verdict, not a speed: each is stretched
    by this when it starts (a test's pytest-timeout, run_cli's, the time a run has in a fixtures' batch).
    Speed is measured by bench/, never by a test."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cores = os.cpu_count() or 1
    return min(MAX_SLOWDOWN, max(1.0, os.getloadavg()[0] / cores))


def stretched(seconds: float) -> float:
    """A time limit inside a test (a subprocess's, a kernel's), sized on a quiet machine, stretched as the
    machine is slower now."""
    return seconds * slowdown()

sys.path.insert(0, str(ROOT / "tests" / "tools"))
import forkserver  # noqa: E402  (tests/tools: the standard library only)

_WARM_CLI: dict = {}   # {"path": the warm_cli server's socket, "env": the environment it was started with}


def _run_time_limit() -> float:
    """The time a graded run has by default (`--time-limit`'s default, from the command line itself)."""
    from grader.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.default for a in sub.choices["batch"]._actions if "--time-limit" in a.option_strings)


RUN_TIME_LIMIT = _run_time_limit()
TIMED_VERBS = ("grade", "check", "batch")   # the commands whose runs have --time-limit (gradescope-zip writes it down)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test's time limit (its timeout marker, else pyproject's) stretched by slowdown() as it starts:
    before pytest-timeout reads it."""
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker is not None and marker.args else float(item.config.getini("timeout") or 0)
    factor = slowdown()
    if limit and factor > 1:
        item.add_marker(pytest.mark.timeout(limit * factor), append=False)
    yield


@pytest.fixture(scope="session", autouse=True)
def session_template():
    """One template zygote for this test process (each xdist worker has its own): every grader process the
    tests start (`grade`, `check`, `batch` and its workers, a notebook kernel's nbcheck) forks its zygote from
    it instead of importing torch again (launch.serve_template). A test that gives run_cli an environment
    gets a cold zygote, which inherits that environment. It imports dynamo before its first fork: most of the
    course's fixtures use something that does (torch.optim, DDP, functional collectives, torch.compile), and
    each batch's worker zygotes would import it again (`make test`: ~4% less CPU). Importing it on a run's
    request stays tested where a zygote starts cold (tests/test_runner.py, run_cli with `env`)."""
    from grader.processes import launch
    try:
        path = launch.serve_template(preload=("torch._dynamo",))
    except OSError:   # no template: every grader process starts its zygote cold, as without one
        path = None
    yield path
    launch.stop_serving()


@pytest.fixture(scope="session", autouse=True)
def warm_cli(session_template):
    """`python -m grader` forked from one warm interpreter (tests/tools/warm_cli.py), for every run_cli call
    made in the environment the server started with; without the server, each starts a fresh interpreter."""
    folder = tempfile.mkdtemp(prefix="warm-cli-")
    path = os.path.join(folder, "socket")
    server = subprocess.Popen([PY, str(ROOT / "tests" / "tools" / "warm_cli.py"), path], cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
    try:
        if server.stdout.readline().strip() == b"ready":
            _WARM_CLI.update(path=path, env=_comparable(os.environ))
        yield
    finally:
        _WARM_CLI.clear()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        server.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


def _comparable(env) -> dict:
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}   # pytest sets it for every test


def run_cli(*args: str, timeout: float = CLI_TIMEOUT, env: dict | None = None,
            template: bool = False) -> subprocess.CompletedProcess:
    """`python -m grader ARGS` from the repository root; killed by process group if it overruns. With `env`,
    not the session's template: the zygote starts cold, in that environment (`template=True`: the variables
    are for the grader's own processes, and its zygote is still a fork of the session's template). Its
    timeout, and the time its runs have (`--time-limit`, unless ARGS give one), are stretched by slowdown()."""
    from grader.processes.launch import TEMPLATE_SOCKET_ENV
    factor = slowdown()
    timeout *= factor
    if args and args[0] in TIMED_VERBS and "--time-limit" not in args and factor > 1:   # a run's time, stretched too
        args = (*args, "--time-limit", f"{RUN_TIME_LIMIT * factor:.0f}")
    full = {**os.environ, **(env or {})}
    if env is not None and TEMPLATE_SOCKET_ENV not in env and not template:
        full.pop(TEMPLATE_SOCKET_ENV, None)
    if _WARM_CLI and _comparable(full) == _WARM_CLI["env"]:
        try:
            return _run_warm(list(args), full, timeout)
        except ConnectionError:   # the server is gone: this call and the next start fresh interpreters
            _WARM_CLI.clear()
    proc = subprocess.Popen([PY, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=full)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run_warm(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """run_cli through the warm_cli server: the same command, output and exit code (text as Popen's text
    mode gives it), killed by process group if it overruns."""
    cmd = [PY, "-m", "grader", *args]
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        conn, pid = forkserver.request(_WARM_CLI["path"], {"argv": args, "cwd": str(ROOT), "env": env}, [0, out_w, err_w])
    except (ConnectionError, FileNotFoundError) as err:
        os.close(out_r)
        os.close(err_r)
        raise ConnectionError(err) from err
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    with conn, selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        timed_out = False
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                timed_out = True
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
            for key, _ in sel.select(timeout=max(left, 0.1) if not timed_out else 1.0):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
        code = forkserver.exit_code(conn)
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout)
    out, err = (b"".join(chunks[fd]).decode().replace("\r\n", "\n").replace("\r", "\n") for fd in (out_r, err_r))
    return subprocess.CompletedProcess(cmd, 1 if code is None else code, out, err)


def graded_files(tmp_path_factory, files, exercise: str, lang: str = "en", *extra: str) -> Path:
    """The --out folder of ONE `batch` call over `files` (copied into a class folder of their own), shared by
    every test and every xdist worker of the session that asks the same (a file lock, a session-wide folder):
    tests that judge the same gradings from different sides grade them once, whichever runs first."""
    files = [Path(f) for f in files]
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent   # the workers' common folder
    key = hashlib.sha256(json.dumps([[str(f) for f in files], exercise, lang, extra]).encode()).hexdigest()[:16]
    label = "-".join(dict.fromkeys(f.parent.name for f in files)) if files else "none"
    out = base / "graded" / f"{exercise}-{label}-{lang}-{key}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / ".done").exists():
            return out
        source = out.parent / f"{out.name}-class"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir()
        for path in files:
            shutil.copy(path, source / path.name)
        proc = run_cli("batch", str(source), "--out", str(out), "--exercise", exercise, "--lang", lang,
                       "--jobs", "2", *extra, timeout=BATCH_TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        (out / ".done").write_text("")
    return out


def results_of(out: Path) -> dict:
    """{student: results.json} of a batch's --out folder."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in out.glob("*.json")}


def grade_cli(path: Path, tmp_path: Path, *extra: str, lang: str = "en") -> tuple[dict, subprocess.CompletedProcess]:
    """`grade PATH --results ...`: (results.json as a dict, the finished process)."""
    results = tmp_path / f"{Path(path).name}.results.json"
    proc = run_cli("grade", str(path), "--results", str(results), "--lang", lang, *extra)
    assert results.exists(), proc.stderr
    return json.loads(results.read_text(encoding="utf-8")), proc


def scores_by_name(results: dict) -> dict:
    return {t["name"]: t["score"] for t in results["tests"]}


def outcomes(results: dict) -> dict:
    return results["extra_data"]["outcomes"]


@pytest.fixture
def grade(tmp_path):
    def _grade(path, *extra, lang="en"):
        return grade_cli(path, tmp_path, *extra, lang=lang)
    return _grade


# The files that take longest go to the workers first, longest first (measured: `--durations=0`, summed per
# file), so that the workers finish together instead of one running the last big file alone.
# --dist loadfile hands out files in collection order once xdist's own reordering (by number of tests) is
# off (--no-loadscope-reorder, pyproject.toml); tests/test_fixtures.py is handed out per exercise (one batch
# grades all of its fixtures: pytest_xdist_make_scheduler below), the largest exercises first. The nbgrader round trip is the longest
# file that cannot be cut: it starts first.
SLOWEST_FIRST = ["test_nbgrader_e2e.py", "test_fixtures.py", "test_differential.py", "test_dist_primitives.py",
                 "test_sandbox.py",
                 "test_cli.py", "test_grad_accum_no_sync.py", "test_toy_exercise.py", "test_timeline.py",
                 "test_batch.py", "test_inductor.py", "test_ring_allreduce.py", "test_runner.py", "test_gradescope.py", "test_attacks.py",
                 "test_switch.py", "test_notebook.py", "test_authoring.py", "test_zero_sharded_step.py",
                 "test_discovery.py", "test_readme.py", "test_redteam.py", "test_classreport.py",
                 "test_hierarchical_allreduce.py", "test_fp16_allreduce.py"]
# A module whose tests are handed out per value of their first parameter's id, up to its first "/": one scope
# per exercise (tests of none are a scope of their own)
PER_PARAMETER = ("test_fixtures.py",)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        order = SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)
        if name in PER_PARAMETER:   # the graded fixtures first, the largest exercises first
            scope = _scope(item.nodeid)
            return order, -_SIZES.get(scope, 0) if "[" in scope else 1
        return order, 0
    for item in items:
        scope = _scope(item.nodeid)
        if "[" in scope:
            _SIZES[scope] = _SIZES.get(scope, 0) + 1
    items.sort(key=rank)   # stable: each file keeps its own order


_SIZES: dict = {}


def _scope(nodeid: str) -> str:
    """The unit of work xdist hands one worker: the file; for PER_PARAMETER, the file and the first part of its
    test's parameter id (`tests/test_fixtures.py[dist_primitives]`)."""
    path, _, rest = nodeid.partition("::")
    if path.rsplit("/", 1)[-1] in PER_PARAMETER and "[" in rest:
        param = rest.split("[", 1)[1].rstrip("]")
        return f"{path}[{param.split('/')[0]}]"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with PER_PARAMETER's scopes: one exercise's fixture folders are graded on different
    workers at once, where a file would hand them all to one."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)
    return Scheduling(config, log)
