"""Red team of issue 10, sandbox half: what a rank can read, keep, or pass to another run.

The fixtures (tests/fixtures/sandbox/escape.py, lock_signal.py, keyring_relay.py, read_checkout.py) are
attacks that also answer honestly, so a sandbox that holds gives them full marks and their output (shown
in the report) says what each attempt got. Without the sandbox (--no-sandbox) the same attacks succeed:
test_lock_channel_is_real_without_the_sandbox keeps the tests honest. Batch and input red-team tests are
in tests/test_discovery.py.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import threading

import pytest

from conftest import FIXTURES, run_cli
from grader.processes import limits, linux, seccomp
from grader.processes.runner import Runner
from grader.records import RunRequest

SANDBOX = FIXTURES / "sandbox"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="uids per run need root (as_nobody covers the rest)")


def output_lines(stdout: str, rank: int = 0) -> dict[str, str]:
    """`key: value` lines of one rank's output in a text report."""
    block = stdout.split(f"Output of rank {rank} ")[1].split("\n\n")[0]
    lines = [line[4:] for line in block.splitlines()[1:] if line.startswith("  | ")]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


# -- the filter itself (in-process, a forked child) ---------------------------------------------------
def _in_child(fn) -> dict:
    """Run fn() in a forked child after seccomp.install(); return what it reports (JSON over a pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            seccomp.install()
            os.write(write, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def _errno_of(name: str, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    ret = libc.syscall(seccomp.syscall_number(name), *[ctypes.c_long(a) for a in args])
    return 0 if ret >= 0 else ctypes.get_errno()


@pytest.mark.skipif(not seccomp.supported(), reason="no filter for this architecture")
def test_filter_checks_the_architecture_first_and_denies_what_the_issue_names():
    code = seccomp.program()
    assert len(code) % 8 == 0
    first = [code[i:i + 8] for i in range(0, 24, 8)]
    assert first[0][:2] == (0x20).to_bytes(2, "little") and int.from_bytes(first[0][4:], "little") == 4  # ld arch
    required = {"ptrace", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot", "unshare",
                "setns", "bpf", "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module",
                "delete_module", "process_vm_readv", "process_vm_writev", "flock"}
    assert required <= set(seccomp.denied_calls())
    assert "flock" not in seccomp.denied_calls(deny_locks=False)


@pytest.mark.skipif(not seccomp.supported(), reason="no filter for this architecture")
def test_filter_answers_eperm_and_leaves_threads_forks_and_plain_fcntl_alone():
    def probe():
        import fcntl
        import subprocess
        out = {name: _errno_of(name, *args) for name, args in [
            ("ptrace", (16, 1, 0, 0)), ("keyctl", (0, -4, 0, 0)), ("unshare", (0x10000000,)), ("bpf", (0, 0, 0)),
            ("perf_event_open", (0, 0, -1, -1, 0)), ("clone3", (0, 0)), ("clone", (0x10000000 | 17, 0, 0, 0, 0)),
            ("mount", (0, 0, 0, 0, 0))]}
        with open(__file__, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH)
                out["flock"] = 0
            except OSError as err:
                out["flock"] = err.errno
            out["getfl"] = fcntl.fcntl(f, fcntl.F_GETFL) >= 0
        box = []
        thread = threading.Thread(target=lambda: box.append(1))
        thread.start()
        thread.join()
        out["thread"] = box == [1]
        out["subprocess"] = subprocess.run(["true"]).returncode == 0
        out["status"] = seccomp.status()
        return out

    got = _in_child(probe)
    for name in ("ptrace", "keyctl", "unshare", "bpf", "perf_event_open", "clone", "mount", "flock"):
        assert got[name] == errno.EPERM, (name, got)
    assert got["clone3"] == errno.ENOSYS   # glibc then falls back to clone, whose flags the filter reads
    assert got["getfl"] and got["thread"] and got["subprocess"]
    assert got["status"] == {"NoNewPrivs": 1, "Seccomp": 2}


# -- uids: a block per grader process, a new uid per run ----------------------------------------------
def test_uid_blocks_are_claimed_per_process_and_never_shared():
    block, held = limits.claim_uid_block(pid=12345)
    try:
        other, held2 = limits.claim_uid_block(pid=12345)   # same first choice: taken, so the next one
        assert other != block
        held2.close()
        low, high = limits.uid_range(block)
        assert high - low == limits.UID_BLOCK and limits.uid_range(limits.UID_BLOCKS - 1)[1] < 2 ** 32 - 1
    finally:
        held.close()


@ROOT_ONLY
@pytest.mark.timeout(60)
def test_the_next_student_gets_a_new_uid_and_finds_no_key():
    """Two students one after the other on one Runner (the same slot, as in a batch worker): the second
    gets another uid, and the keyring, which no namespace covers, is closed to both."""
    source = (SANDBOX / "keyring_relay.py").read_text()
    with Runner() as runner:
        first, second = (runner.run_many([RunRequest(world_size=2, source=source, filename="s.py")])[0]
                         for _ in range(2))
    lines = [run.ranks[0].output_text().strip() for run in (first, second)]
    uids = [line.split(";")[0] for line in lines]
    assert uids[0] != uids[1], lines
    for line in lines:
        assert "found previous: EPERM; left one: EPERM" in line, line


# -- through the command line ----------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_escape_attempts_from_a_rank_all_fail():
    proc = run_cli("check", str(SANDBOX / "escape.py"), "--lang", "en", "--tmp-mb", "16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = output_lines(proc.stdout)
    for name in ("add_key", "keyctl", "unshare_user", "clone_newuser", "setns", "ptrace", "process_vm_readv", "mount",
                 "chroot", "bpf", "perf_event_open", "kexec_load", "init_module"):
        assert got[name] == "EPERM", (name, got[name])
    # every file of a run's root is its own (overlays, copies, its own device nodes): locks and watches on them
    # reach no other run, so they are allowed (torch.compile takes a lock); test_a_visible_run_learns_nothing...
    for name in ("inotify", "flock", "lockf"):
        assert got[name] == "ok", (name, got[name])
    assert got["status"] == "{'NoNewPrivs': '1', 'Seccomp': '2'}"
    assert got["usr_nosuid"] == "True"                 # setuid binaries are inert, and NO_NEW_PRIVS is set
    assert got["write_root"] == "EROFS" and got["write_torch"] in ("EROFS", "EACCES")
    assert got["tmp"] == "stopped at 16 MiB: ENOSPC"   # the run's /tmp is a tmpfs of --tmp-mb MiB
    assert got["abstract_socket"] == "ECONNREFUSED"    # the grader's abstract sockets are in another netns
    assert len(json.loads(got["proc"])) == 1   # a rank's /proc shows its own uid's processes only: itself
    assert "Sandbox:" not in proc.stdout   # every layer applied: a student's report leaves the line to staff
    #                                        (`grade` names them, the /tmp one included: tests/test_sandbox.py)


@pytest.mark.timeout(60)
def test_a_visible_run_learns_nothing_from_hidden_runs_through_locks(tmp_path):
    results = tmp_path / "r.json"
    proc = run_cli("grade", str(SANDBOX / "lock_signal.py"), "--results", str(results), "--lang", "en")
    got = output_lines(proc.stdout)
    assert got == {"flock": "ok", "hidden run seen": "no", "lockf": "ok"}, proc.stdout   # allowed, and blind
    assert json.loads(results.read_text())["score"] == 100


@pytest.mark.timeout(60)
def test_lock_channel_is_real_without_the_sandbox(tmp_path):
    """The same attack with --no-sandbox: the visible run sees the hidden ones (what the issue measured)."""
    proc = run_cli("grade", str(SANDBOX / "lock_signal.py"), "--results", str(tmp_path / "r.json"), "--lang", "en",
                   "--no-sandbox")
    assert output_lines(proc.stdout)["hidden run seen"] == "yes", proc.stdout


@pytest.mark.timeout(90)
def test_the_ranks_of_a_graded_run_reach_each_other_only_through_the_switch():
    """Each rank of a graded run has its own network, /tmp, /dev/shm, IPC and uid: rank 1 finds nothing rank 0
    offered. The same code on the real backend (whose ranks share a network for gloo) does connect: the
    fixture can see what it looks for."""
    graded = output_lines(run_cli("check", str(SANDBOX / "rank_channels.py"), "--lang", "en", "--backend", "none").stdout, rank=1)
    assert graded == {"tcp": "ECONNREFUSED", "abstract": "ECONNREFUSED", "/tmp/rank0.txt": "absent",
                      "/dev/shm/rank0.txt": "absent", "proc": "[]"}, graded
    real = output_lines(run_cli("check", str(SANDBOX / "rank_channels.py"), "--lang", "en").stdout, rank=1)
    assert real["tcp"] == "connected" and real["proc"] == "[]", real


SYSV_RELAY = """
import ctypes, os
import torch, torch.distributed as dist
IPC_CREAT, KEY = 0o1000, 0x5eed
libc = ctypes.CDLL(None, use_errno=True)

def run_worker(rank, world_size):
    if rank == 0:
        found = libc.shmget(KEY, 0, 0)        # what an earlier run left, if anything reached this one
        print("found:", "yes" if found >= 0 else os.strerror(ctypes.get_errno()))
        made = libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
        print("left one:", "yes" if made >= 0 else os.strerror(ctypes.get_errno()))
    t = torch.ones(2)
    dist.all_reduce(t)
    return t, None
"""


def _segments_held(zygote: int) -> int:
    """SysV segments in the IPC namespaces of the zygote and its children (its pods), read from inside each."""
    count = 0
    for pid in [zygote, *open(f"/proc/{zygote}/task/{zygote}/children").read().split()]:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                linux.setns(os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY), linux.CLONE_NEWIPC)
                with open("/proc/sysvipc/shm") as table:
                    os.write(write, str(len(table.read().splitlines()) - 1).encode())
            finally:
                os._exit(0)
        os.close(write)
        got = os.read(read, 32)
        os.close(read)
        os.waitpid(child, 0)
        count += int(got or 0)
    return count


@ROOT_ONLY
@pytest.mark.timeout(60)
def test_what_the_kernel_keeps_of_a_real_backend_run_never_reaches_the_next_run():
    """A SysV segment outlives the process that made it. Two real-backend runs one after the other on one
    Runner (the second in the pod the first left, pods.Pods): the second finds nothing of the first, because
    each run has an IPC (and network) namespace of its own, which goes when the run does (its memory too: a
    segment left in a pod would hold memory the next students' runs need)."""
    with Runner() as runner:
        runs = [runner.run_many([RunRequest(world_size=2, source=SYSV_RELAY, filename="s.py", mode="real")])[0]
                for _ in range(2)]
        # nor does its memory stay: no namespace a pod (or the zygote) is in still holds the segments
        assert _segments_held(runner.hello["pid"]) == 0
    lines = [run.ranks[0].output_text().split() for run in runs]
    for run, words in zip(runs, lines):
        assert run.stop == "completed", (run.stop, run.error, words)
        assert " ".join(words).startswith("found: No such file or directory left one: yes"), words


DEV_MARK = """
import os, torch, torch.distributed as dist

def run_worker(rank, world_size):
    try:
        os.utime("/dev/full")                 # a time another rank, or a later run, could read
        print("utime: ok")
    except OSError as err:
        print("utime:", err.strerror)
    with open(os.devnull, "w") as sink:       # the devices themselves still work
        print("devnull:", sink.write("x"))
    t = torch.ones(2)
    dist.all_reduce(t)
    return t, None
"""


@pytest.mark.timeout(60)
def test_a_rank_cannot_leave_a_mark_on_the_device_nodes():
    """/dev is the run's (or its pod's, kept for later runs): read-only once its nodes are made."""
    with Runner() as runner:
        [run] = runner.run_many([RunRequest(world_size=2, source=DEV_MARK, filename="d.py")])
    assert run.stop == "completed", (run.stop, run.error)
    for rec in run.ranks:
        utime, devnull = rec.output_text().split("\n")[:2]
        assert utime in ("utime: Read-only file system", "utime: Operation not permitted"), rec.output_text()
        assert devnull == "devnull: 1", rec.output_text()
