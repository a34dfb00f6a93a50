"""A grading worker: a fork of the batch's parent that owns one Runner (one zygote) and grades one student at a
time, told over a pipe of JSON lines; and the parent's view of it (`Worker`).

A worker that dies or overruns is killed by process group (its own session) and replaced by the scheduler
(schedule.py).
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ... import api
from ...exercise import registry
from ...feedback.results import failed_results, to_gradescope
from ...processes import launch
from ...processes.runner import Runner
from ...processes.cgroup import default_total_mb
from ...processes.limits import Limits
from ...processes.linux import set_parent_death_signal
from ...submission import load as loader
from .discover import Student

ROOT = Path(__file__).resolve().parents[3]
FAULT_ENV = "GRADER_BATCH_FAULT"  # test hook: a worker exits at once when given this student


def worker_main(argv: list[str]) -> int:
    """A worker, in a fork of the batch's parent (Worker): argv is LANG BACKEND WALL_S MEMORY_MB SANDBOX TOTAL_MB
    TMP_MB EXERCISE [EXERCISES_DIR ...].

    Reads {"name", "path"} lines on stdin, answers one {"name", "results", "timeline"} line each on its protocol
    fd (the original stdout; fd 1 then points at stderr so nothing else can write into the protocol): the
    timeline is the page of the student's visible run (feedback/timeline.py), or None."""
    from ...feedback import timeline
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)       # the batch was SIGKILLed: this worker goes too (and so
    if os.getppid() != parent:                    # its zygote, which exits when its socket closes)
        return 1
    langs, backend, wall_s, memory_mb, sandbox = argv[0].split(","), argv[1], float(argv[2]), int(argv[3]), argv[4] == "1"
    lang = langs[0]   # the results and the page; the others' results beside them (--also-lang)
    total_mb, tmp_mb = int(argv[5]), int(argv[6])
    exercise = registry.get(argv[7], argv[8:])
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    fault = os.environ.get(FAULT_ENV)
    limits = Limits(wall_s=wall_s, memory_mb=memory_mb, total_mb=total_mb, tmp_mb=tmp_mb)
    with Runner(limits=limits, sandbox=sandbox) as runner:
        for line in sys.stdin:
            task = json.loads(line)
            if fault and task["name"] == fault:
                os._exit(3)
            try:
                submission = loader.load(Path(task["path"]))
                result = api.grade(submission, runner=runner, exercise=exercise, include_hidden=True, backend=backend,
                                   show_output=False, timeline=True)
                data, *others = (_rendered(result, submission, other) for other in langs)
                page = None if result.timeline is None else timeline.page(result.timeline, lang, result.submission)
                reply = json.dumps({"name": task["name"], "results": data, "timeline": page,
                                    "also": dict(zip(langs[1:], others))})
            except Exception:  # this student only: the worker carries on with the next one
                error = traceback.format_exc()
                data, *others = (failed_results(loader.display_name(Path(task["path"]).name), error, other) for other in langs)
                for one in (data, *others):
                    one["extra_data"]["scores"] = {c.id: 0 for c in exercise.checks}
                reply = json.dumps({"name": task["name"], "results": data, "also": dict(zip(langs[1:], others))})
            proto.write(reply + "\n")
            proto.flush()
    return 0


def _rendered(result, submission, lang: str) -> dict:
    data = to_gradescope(result, lang)
    data["extra_data"]["scores"] = {c.spec.id: c.score for c in result.checks}
    if submission.problem is not None:
        data["extra_data"]["problem"] = submission.problem.key
    return data


class _ForkedProcess:
    """A worker forked from this process (the parent), seen as subprocess.Popen would show it: its pid, its
    stdin and stdout pipes, poll and wait. The parent has imported everything a worker uses (api, the
    runner, numpy) and never torch, so a fork costs milliseconds where a fresh interpreter would spend
    ~0.2 s of CPU on the same imports. The child keeps only its pipes, its log and the template's socket."""

    def __init__(self, argv: list[str], log: int, template: int | None):
        child_in, to_child = os.pipe()      # (read end, write end)
        from_child, child_out = os.pipe()
        for stream in (sys.stdout, sys.stderr):   # nothing buffered here is written twice
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _worker_child(argv, child_in, child_out, log, template)
        os.close(child_in)
        os.close(child_out)
        self.pid, self.returncode = pid, None
        self.stdin = os.fdopen(to_child, "wb")
        self.stdout = os.fdopen(from_child, "rb", buffering=0)

    def poll(self, block: bool = False) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            return self.poll(block=True)
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["worker"], timeout)
            time.sleep(0.01)
        return self.returncode


def _worker_child(argv: list[str], stdin: int, stdout: int, log: int, template: int | None):
    """In the fork: a session of its own, the pipes as stdin and stdout, the log as stderr, every other
    descriptor of the parent but the template's socket closed (another worker's pipes, the output folder's
    lock), then worker_main."""
    code = 1
    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (stdin, stdout, log)]   # none overwritten by a dup2
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        wanted = sorted({0, 1, 2} | ({template} if template is not None else set()))
        for low, high in zip(wanted, wanted[1:] + [os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low + 1, high)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        atexit._clear()   # the parent's (its template's stop) are not this process's
        os.chdir(ROOT)
        if template is not None:   # the worker's zygote is a fork of it: no import torch of its own
            os.environ[launch.TEMPLATE_ENV] = str(template)
        sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
        launch.forget_parent()
        launch.prestart()
        code = worker_main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001  (the parent reads the log: why_dead)
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Worker:
    """A worker process seen from the parent: its pipes, its current student, its deadline."""

    def __init__(self, args, log_dir: Path, index: int):
        argv = [",".join(args.langs), args.backend, str(args.time_limit), str(args.memory_mb), "0" if args.no_sandbox else "1",
                str(args.memory_total_mb or default_total_mb(args.jobs)), str(args.tmp_mb), args.exercise_spec.name,
                *args.exercises_dir]
        self.log = log_dir / f"worker-{index}.log"
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = _ForkedProcess(argv, log, launch.template_fd())
        finally:
            os.close(log)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buffer = bytearray()
        self.student: Student | None = None
        self.deadline = 0.0
        self.first = True      # the first student also waits for the zygote's torch import

    def assign(self, student: Student, budget: float) -> bool:
        self.student = student
        self.deadline = time.monotonic() + budget + (120 if self.first else 0)
        self.first = False
        try:
            self.proc.stdin.write((json.dumps({"name": student.name, "path": os.path.abspath(student.path)}) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def read_lines(self) -> tuple[list[dict], bool]:
        """Complete lines received so far, and whether the worker closed its end."""
        eof = False
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        lines = []
        while (nl := self.buffer.find(b"\n")) >= 0:
            raw, self.buffer[:] = bytes(self.buffer[:nl]), self.buffer[nl + 1:]
            try:
                lines.append(json.loads(raw))
            except ValueError:
                pass
        return lines, eof

    def why_dead(self) -> str:
        code = self.proc.poll()
        how = "still running" if code is None else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        try:
            tail = self.log.read_text(errors="replace")[-1500:]
        except OSError:
            tail = ""
        return f"grading worker {how}" + (f"; its log ends with:\n{tail}" if tail.strip() else "")

    def kill(self) -> None:
        """By process group (the worker's own session); its zygote exits when the worker's socket closes."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.proc.wait()

    def ask_to_stop(self) -> None:
        """EOF on stdin: the worker closes its Runner and exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self) -> None:
        """Normal end: EOF on stdin lets the worker close its Runner; killed if it does not exit soon."""
        self.ask_to_stop()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
