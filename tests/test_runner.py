"""The transport on its own: runs through the switch, real-backend runs, isolation between gradings, output
caps, zygote recovery."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, PY, ROOT, stretched
from grader.processes import launch
from grader.processes.runner import Runner
from grader.records import How, RunRequest
from grader.processes.limits import Limits


def values(desc):
    return desc["array"]

ECHO = """
import torch, torch.distributed as dist
def run_worker(rank, world_size):
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    print("rank", rank, "says", t.tolist())
    return t, None
"""

IMPORTS = """
import sys, torch, torch.distributed as dist
def run_worker(rank, world_size):
    before = set(sys.modules)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    out = [torch.empty(2) for _ in range(world_size)]
    dist.all_gather(out, torch.ones(2))
    print("imported:", sorted(set(sys.modules) - before))
    return t, None
"""

CHATTY = """
def run_worker(rank, world_size):
    for _ in range(3000):
        print("x" * 99)
    return None, None
"""


@pytest.fixture(scope="module")
def runner():
    with Runner(limits=Limits(wall_s=10)) as r:
        yield r


@pytest.mark.timeout(60)
def test_ranks_report_calls_values_and_output(runner):
    [out] = runner.run_many([RunRequest(world_size=3, source=ECHO, filename="echo.py", quantities=("t", "u"))])
    assert out.stop == "completed"
    for rec in out.ranks:
        assert rec.result.how is How.RETURN and rec.result.source == "return"
        assert values(rec.result.values["t"]).tolist() == [6.0] * 4
        assert rec.result.values["u"] == {"kind": "missing"}
        [call] = rec.calls
        assert (call.op, call.method, call.api, call.line, call.sends, call.receives) == ("all_reduce", "allreduce", "all_reduce", 5, True, True)
        assert call.completed and call.ok and call.waited and call.perturbed is None   # a clean run: nothing perturbed
        assert call.sent_values()[0].tolist() == [rec.rank + 1.0] * 4               # what this rank sent the switch
        assert call.delivered_values()[0].tolist() == [6.0] * 4                     # what the switch delivered
        assert f"rank {rec.rank} says [6.0, 6.0, 6.0, 6.0]" in rec.output_text()


@pytest.mark.timeout(60)
def test_a_perturbed_run_adds_secret_deltas_at_the_switch(runner):
    """The deltas never exist in a rank: the switch adds them to its own copy of what each rank sent, and
    what it delivers is the sum of what entered (each rank got it, and printed it)."""
    [out] = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"),
                                        perturb=("all_reduce",))])
    calls = [rec.calls[0] for rec in out.ranks]
    deltas = [c.deltas() for c in calls]
    assert all((d > 0).all() for d in deltas) and deltas[0].tolist() != deltas[1].tolist()
    delivered = calls[0].delivered_values()[0]
    entered = [c.entered_values()[0] for c in calls]
    assert delivered.tolist() == (entered[0] + entered[1]).astype("float32").tolist()
    assert calls[0].sent_values()[0].tolist() == [1.0] * 4                        # the student's tensor, as sent
    assert f"says {[float(x) for x in delivered.astype('float32')]}" in out.ranks[1].output_text()


@pytest.mark.timeout(60)
def test_a_real_backend_run_times_its_calls_on_gloo(runner):
    """torch's own gloo between the ranks (their own network, the run's store): the answers and the ranks'
    own timings come back; nothing passes through the switch."""
    [out] = runner.run_many([RunRequest(world_size=3, source=ECHO, filename="echo.py", quantities=("t", "u"),
                                        mode="real")])
    assert out.stop == "completed"
    for rec in out.ranks:
        assert values(rec.result.values["t"]).tolist() == [6.0] * 4
        assert rec.calls == []
        [timing] = rec.timings
        assert timing["op"] == "all_reduce" and timing["line"] == 5 and timing["ms"] > 0 and timing["bytes"] == 16


@pytest.mark.timeout(60)
def test_observing_and_perturbing_imports_nothing_in_a_rank(runner):
    """Every module the backend needs is the zygote's already: loaded lazily in a rank, numpy.random and
    torch's dispatch-mode modules cost each rank ~15 ms of CPU (half of an honest rank's own work)."""
    [out] = runner.run_many([RunRequest(world_size=2, source=IMPORTS, filename="imports.py", quantities=("t", "u"),
                                        perturb=("all_reduce", "all_gather"))])
    assert out.stop == "completed"
    assert all(call.perturbed is not None for rec in out.ranks for call in rec.calls)
    for rec in out.ranks:
        assert "imported: []" in rec.output_text(), rec.output_text()


def _thp_available() -> bool:
    try:
        enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    return "[never]" not in enabled and release >= (6, 1)


@pytest.mark.timeout(60)
def test_the_zygote_heap_is_backed_by_huge_pages_where_the_kernel_can(runner):
    """Every process of a run is a fork of the zygote: with its ~150 MB heap on 2 MiB pages, a fork copies
    and an exit unmaps 512 times fewer page-table entries (about a fifth of an honest student's CPU)."""
    from grader.processes.zygote import COLLAPSE_AFTER_RUNS   # here, not at collection: it imports torch
    outs = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")] * (COLLAPSE_AFTER_RUNS + 1))
    assert all(out.stop == "completed" for out in outs)     # a cold zygote's heap is collapsed by now
    rollup = Path(f"/proc/{runner.hello['pid']}/smaps_rollup").read_text()
    huge_kb = int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("AnonHugePages:")))
    # a busy machine may not find a free 2 MiB block for every range (MADV_COLLAPSE then leaves it as it was:
    # 62 of the heap's ~75 collapsed under a full `make test`): some huge pages, not every one
    assert (huge_kb >= 16 * 1024) == _thp_available(), rollup


@pytest.mark.timeout(60)
def test_output_is_capped_and_counted(runner):
    small = Limits(wall_s=10, output_keep_kb=4)
    with Runner(limits=small) as r:
        [out] = r.run_many([RunRequest(world_size=2, source=CHATTY, filename="chatty.py")])
    rec = out.ranks[0]
    assert len(rec.output) == 4 * 1024
    assert rec.output_total == 3000 * 100


@pytest.mark.timeout(60)
def test_zygote_death_is_survived(runner):
    """If the zygote dies between runs (OOM killer, a stray signal), the run that finds it dead is made once
    more, on a new zygote: the grader's accident never becomes the student's outcome."""
    assert runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])[0].stop == "completed"
    os.killpg(runner.proc.pid, signal.SIGKILL)   # the zygote of that run
    runner.proc.wait()
    first = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])[0]
    assert first.stop == "completed", (first.stop, first.error)
    second = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])[0]
    assert second.stop == "completed"


@pytest.mark.timeout(90)
def test_two_gradings_at_once_with_the_same_fixed_port(tmp_path):
    """The seed's reference sets MASTER_PORT=12355 and inits its own group: two gradings side by side
    must not join each other's group (the grader owns the group; each run has its own store)."""
    seed_style = FIXTURES / "sandbox" / "fixed_port.py"
    procs = [subprocess.Popen([PY, "-m", "grader", "grade", str(seed_style), "--results", str(tmp_path / f"r{i}.json")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for i in range(2)]
    try:
        for p in procs:
            p.wait(timeout=stretched(80))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for i in range(2):
        assert json.loads((tmp_path / f"r{i}.json").read_text())["score"] == 100


def _parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.timeout(90)
def test_a_batch_worker_zygote_is_a_fork_of_the_template_and_goes_with_its_runner(monkeypatch):
    """A batch imports torch once: each worker's zygote is forked from the parent's template, serves that
    worker alone, and is gone (process and folder) when the worker's Runner closes."""
    monkeypatch.delenv(launch.TEMPLATE_SOCKET_ENV, raising=False)   # not the session's template: a batch's own
    launch.start_template()
    try:
        template = launch._TEMPLATE[1]
        monkeypatch.setenv(launch.TEMPLATE_ENV, str(os.dup(launch.template_fd())))  # a worker's own copy
        launch.prestart()
        assert launch.TEMPLATE_ENV not in os.environ      # nothing the runs could inherit
        with Runner(limits=Limits(wall_s=10)) as r:
            [out] = r.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"))])
            assert out.stop == "completed"
            assert [values(rec.result.values["t"]).tolist() for rec in out.ranks] == [[3.0] * 4] * 2
            assert isinstance(r.proc, launch.Forked) and _parent_pid(r.proc.pid) == template.pid
            zygote, base = r.proc.pid, r.base
            assert "seccomp" in r.layer_names() or os.geteuid() != 0
        assert _gone(zygote) and not base.exists()
        assert template.poll() is None                      # the template serves the next worker
    finally:
        launch.stop_template()
    assert template.poll() is not None


@pytest.mark.timeout(90)
def test_a_worker_whose_template_died_starts_its_own_zygote(monkeypatch):
    """The template is killed after the worker asked it (its request, socket attached, dies unanswered):
    the worker's Runner starts a zygote of its own and grades."""
    monkeypatch.delenv(launch.TEMPLATE_SOCKET_ENV, raising=False)
    launch.start_template()
    try:
        monkeypatch.setenv(launch.TEMPLATE_ENV, str(os.dup(launch.template_fd())))  # a worker's own copy
        launch.prestart()
        stop = launch._TEMPLATE[1]
        os.killpg(stop.pid, signal.SIGKILL)                # still importing torch: the request is unread
        stop.wait()
        with Runner(limits=Limits(wall_s=10)) as r:
            [out] = r.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])
            assert out.stop == "completed"
            assert not isinstance(r.proc, launch.Forked)
    finally:
        launch.stop_template()


@pytest.mark.timeout(90)
def test_a_session_template_serves_every_grader_process_of_its_user(session_template, tmp_path):
    """GRADER_TEMPLATE_SOCKET (tests/conftest.py sets it): a Runner's zygote is a fork of the session's
    template; a batch started under it makes no template of its own; the socket is out of other users' reach."""
    assert session_template is not None, "the session's template did not start (tests/conftest.py)"
    template = launch._SESSION[1]
    assert os.environ[launch.TEMPLATE_SOCKET_ENV] == session_template
    assert os.stat(os.path.dirname(session_template)).st_mode & 0o777 == 0o700
    with Runner(limits=Limits(wall_s=10)) as r:
        [out] = r.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"))])
        assert out.stop == "completed"
        assert [values(rec.result.values["t"]).tolist() for rec in out.ranks] == [[3.0] * 4] * 2
        assert isinstance(r.proc, launch.Forked) and _parent_pid(r.proc.pid) == template.pid
        zygote = r.proc.pid
    assert _gone(zygote) and template.poll() is None
    launch.start_template()
    assert launch.template_fd() is None
    if os.geteuid() == 0:   # a rank's uid (or any other) cannot even reach the socket
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.connect(session_template)
            except PermissionError:
                code = 0
            except BaseException:
                code = 2
            os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.timeout(90)
def test_a_template_forks_only_for_its_own_interpreter_and_checkout(session_template, monkeypatch, tmp_path):
    """A request from another interpreter or checkout gets its socket closed, unanswered; a Runner whose
    template will not or cannot fork (or whose socket is gone) starts its zygote cold and grades."""
    assert session_template is not None, "the session's template did not start (tests/conftest.py)"
    for other in ({"python": "/usr/bin/python3"}, {"root": str(tmp_path)}, {"base": 7}):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"t": "spawn", "base": str(tmp_path), "python": PY, "root": str(ROOT), **other}
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(session_template)
            socket.send_fds(s, [json.dumps(request).encode()], [theirs.fileno()])
        theirs.close()
        mine.settimeout(30)
        assert mine.recv(1 << 16) == b"", other   # closed: no zygote forked
        mine.close()
    monkeypatch.setattr(launch, "ROOT", str(tmp_path))   # this process now asks as another checkout would
    with Runner(limits=Limits(wall_s=10)) as r:
        [out] = r.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])
        assert out.stop == "completed" and not isinstance(r.proc, launch.Forked)
    monkeypatch.setenv(launch.TEMPLATE_SOCKET_ENV, str(tmp_path / "no-such-socket"))
    with Runner(limits=Limits(wall_s=10)) as r:
        [out] = r.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py")])
        assert out.stop == "completed" and not isinstance(r.proc, launch.Forked)


def test_the_zygote_asks_glibc_for_huge_pages_without_overriding_a_tunable_it_was_given():
    from grader.processes.launch import HUGE_HEAP_TUNABLE, _huge_heap
    assert _huge_heap(None) == _huge_heap("") == HUGE_HEAP_TUNABLE == "glibc.malloc.hugetlb=1"
    assert _huge_heap("glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert _huge_heap("glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"   # a TA's own choice stands


# -- pods: a graded run's pid 1, kept for the next run (pods.Pods) ---------------------------------

DAEMON = """
import os, time, torch, torch.distributed as dist
def run_worker(rank, world_size):
    if os.fork() == 0:            # a double-forked daemon in a session of its own, left running
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:   # what each is: /dev/null, pipe, socket, /memfd (less the one listdir held, closed now)
            kinds.append(os.readlink(f"/proc/self/fd/{fd}").split(":")[0])
        except OSError:
            pass
    print("fds", sorted(kinds))
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    return t, None
"""

STUCK = """
import time, torch, torch.distributed as dist
def run_worker(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 gives up")
    time.sleep(60)
    return None, None
"""


def _run_uids_alive(runner) -> int:
    from grader.processes.limits import processes_by_uid, uid_range
    low, high = uid_range(runner.uid_block)
    return sum(count for uid, count in processes_by_uid().items() if low <= uid < high)


@pytest.mark.skipif(os.geteuid() != 0, reason="pods and uids per run need root")
@pytest.mark.timeout(90)
def test_nothing_of_a_run_outlives_it_and_a_later_rank_holds_only_its_own_socket(runner):
    """Run after run (the later ones in a pod an earlier run left): every rank holds stdin, stdout, stderr,
    its socket to the supervisor and the memfd it shares with the supervisor alone (processes/ring.py; its
    mapping keeps a duplicate of the fd), nothing of another rank or run; when run_many returns, no process
    of the run is left, a daemon that double-forked out of its session included."""
    own = str(["/dev/null", "/memfd", "pipe", "pipe", "socket"])
    for _ in range(3):
        [out] = runner.run_many([RunRequest(world_size=2, source=DAEMON, filename="d.py", quantities=("t", "u"))])
        assert out.stop == "completed", (out.stop, out.error)
        assert [rec.output_text().strip() for rec in out.ranks] == [f"fds {own}", f"fds {own}"]
        assert _run_uids_alive(runner) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="pods and uids per run need root")
@pytest.mark.timeout(90)
def test_a_run_stopped_midway_leaves_nothing_and_the_next_runs_go_on(runner):
    """A run the supervisor stops (rank 1 failed, rank 0 still sleeping) ends with every process killed; the
    runs after it, in the same pods, are unaffected."""
    outs = runner.run_many([RunRequest(world_size=2, source=STUCK, filename="s.py", quantities=("t", "u")),
                            RunRequest(world_size=3, source=ECHO, filename="echo.py", quantities=("t", "u"))])
    assert outs[0].stop == "failfast" and outs[1].stop == "completed"
    assert _run_uids_alive(runner) == 0
    [again] = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"))])
    assert again.stop == "completed"
    assert [values(rec.result.values["t"]).tolist() for rec in again.ranks] == [[3.0] * 4] * 2


@pytest.mark.timeout(60)
def test_a_watch_can_start_a_run_as_another_ends(runner):
    """run_many's watch may answer with requests to start: their outcomes follow the given ones, in order (a
    batch starts the real-backend run this way as soon as the visible perturbed run shows it is needed)."""
    asked = []

    def watch(index, outcome):
        if index == 0:
            asked.append(RunRequest(world_size=3, source=ECHO, filename="echo.py", quantities=("t", "u")))
            return asked
        return ()

    outs = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="echo.py", quantities=("t", "u"))], watch=watch)
    assert [out.request.world_size for out in outs] == [2, 3] and outs[1].request is asked[0]
    assert [out.stop for out in outs] == ["completed", "completed"]
    assert values(outs[1].ranks[2].result.values["t"]).tolist() == [6.0] * 4


@pytest.mark.timeout(120)
def test_a_zygote_that_preloads_for_a_run_is_given_the_time_it_takes(monkeypatch):
    """The zygote imports a run's preload (dynamo: ~800 modules; torch.compile's first header: minutes on a
    busy machine) before it answers that the run started: that wait is the grader's, never the 30 s in which
    a plain start must answer, so a slow preload is never a grader error. A cold zygote: the session's
    template has imported dynamo already (conftest.session_template)."""
    from grader.processes import launch, zygote_client
    monkeypatch.delenv(launch.TEMPLATE_SOCKET_ENV, raising=False)
    monkeypatch.setattr(zygote_client, "START_SECONDS", 0.01)   # far less than any import of dynamo
    with Runner() as runner:
        [run] = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="e.py", preload=("torch._dynamo",))])
    assert run.stop == "completed", (run.stop, run.error)


@pytest.mark.timeout(120)
def test_only_modules_new_to_the_zygote_lengthen_the_wait_for_a_start(monkeypatch):
    """Nearly every submission names some torch module: the long wait is for modules this zygote has not
    imported yet, so that a zygote that stops answering is still found out in START_SECONDS on later runs. A
    cold zygote, which has not imported dynamo (the session's template has)."""
    from grader.processes import launch, zygote_client
    monkeypatch.delenv(launch.TEMPLATE_SOCKET_ENV, raising=False)
    waits, recv = [], zygote_client.socket.recv_fds

    def spy(sock, *args, **kwargs):
        waits.append(sock.gettimeout())
        return recv(sock, *args, **kwargs)
    monkeypatch.setattr(zygote_client.socket, "recv_fds", spy)
    with Runner() as runner:
        runner._ready()
        for preload, wait in ((("torch._dynamo",), zygote_client.PRELOAD_SECONDS),   # new: imported first
                              (("torch._dynamo",), zygote_client.START_SECONDS), ((), zygote_client.START_SECONDS)):
            waits.clear()
            [run] = runner.run_many([RunRequest(world_size=2, source=ECHO, filename="e.py", preload=preload)])
            assert run.stop == "completed", (run.stop, run.error)
            assert waits[:1] == [wait], (preload, waits)
