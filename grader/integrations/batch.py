"""Grade a whole class: one results file per student, a gradebook, resumable after any kill.

    python -m grader batch DIR --out OUT [--jobs N] [--lang zh|en]

Each entry of DIR is one student: `alice.py`, `bob.ipynb`, or a folder `carol/` holding one submission
(nbgrader's submitted/<student>/<assignment>/ works as is). Writes OUT/<student>.json (the results.json
of `grade`, plus `extra_data.batch` with the submission's content hash) and OUT/grades.csv.

Processes: this parent never imports torch and never runs student code. It forks N workers
(`worker_main`), each owning one Runner (one zygote), and hands each a student at a time over a pipe
of JSON lines. A worker that dies or overruns is killed by process group and replaced; its student is
graded again once in a fresh worker, then gets a "grader failed" result. Only the parent writes files,
each atomically, so a SIGKILL at any moment leaves whole files only; a rerun skips every student whose
results hold the same content hash (and language and rubric) and sweeps stale temporary files.

No entry can stop the class: discovery reads the folder with lstat only (a symbolic link is never followed:
not to a classmate's file, not out of the folder, not into a loop), one file under two names (hard links)
is graded once, sizes are checked before reading (load.py), any failure while hashing, grading or writing
one student becomes that student's row, and grades.csv is always written. Results files get a name that
is safe for any legal entry name; gradebook cells cannot start a spreadsheet formula; names printed on the
terminal have their control characters escaped.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..exercise import registry
from ..submission import load as loader
from ..feedback.messages import default_lang, render
from ..feedback.results import failed_results, to_gradescope, write_atomic
from ..model import CheckResult, GradingResult, Note, Outcome
from ..processes import launch
from ..processes.sandbox import default_total_mb
from . import classreport
from .gradebook import fit, gradebook, number, printable, sorted_rows, verdict, width

ROOT = Path(__file__).resolve().parents[2]
MAX_ATTEMPTS = 2                 # a student whose worker dies is graded once more, in a fresh worker
FAULT_ENV = "GRADER_BATCH_FAULT"  # test hook: a worker exits at once when given this student


# -- students and their state on disk ----------------------------------------------------------------
@dataclass
class Student:
    name: str
    path: Path
    digest: str = ""
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    problem: tuple[str, dict] | None = None   # cannot be graded at all (a symbolic link ...): its row says why


SAFE_NAME = re.compile(r"[\w][\w.\-]*")
MAX_RESULT_NAME = 120  # bytes of a results file's name; any legal entry name (up to 255 bytes) fits
NAME_COLUMNS = 32      # the widest student name the terminal summary shows whole


def results_name(student: str) -> str:
    """OUT/<this>: `<student>.json` when the name is plain and short; otherwise a readable part of it plus a
    hash of the whole name, so that every legal name (newlines, escapes, 255 bytes, undecodable bytes) maps to
    a distinct, harmless file name that write_atomic's temporary names can extend."""
    if SAFE_NAME.fullmatch(student) and len(os.fsencode(student)) <= MAX_RESULT_NAME - 5 and student.isprintable():
        return f"{student}.json"
    digest = hashlib.sha256(os.fsencode(student)).hexdigest()[:16]
    readable = re.sub(r"[^\w.\-]+", "_", os.fsencode(student).decode("utf-8", "replace")).strip("._-")
    while len(readable.encode()) > 48:
        readable = readable[:-1]
    return f"{readable}-{digest}.json" if readable else f"{digest}.json"


def _student_name(entry_name: str, is_dir: bool) -> str | None:
    """The student an entry of the class folder stands for, or None when it does not look like one."""
    if is_dir:
        return entry_name
    suffix = os.path.splitext(entry_name)[1]
    return entry_name[: -len(suffix)] if suffix in loader.SUFFIXES and entry_name[: -len(suffix)] else None


def discover(folder: Path, out: Path) -> tuple[list[Student], list[str]]:
    """Students in `folder`, sorted by name; and what was skipped, with why. Reads the folder with lstat
    only: nothing here follows a symbolic link or opens a file."""
    students, skipped, seen, inodes = [], [], {}, {}
    try:
        out_id = os.stat(out)
        out_key = (out_id.st_dev, out_id.st_ino)
    except OSError:
        out_key = None
    try:
        entries = sorted(os.scandir(folder), key=lambda e: os.fsencode(e.name))
    except OSError as err:
        raise SystemExit(f"cannot read the class folder {folder}: {err.strerror or err}")
    for entry in entries:
        name = entry.name
        shown = printable(name)
        if name.startswith("."):
            skipped.append(f"{shown} (hidden)")
            continue
        if name.startswith("__"):
            skipped.append(f"{shown} (starts with __: Python's own, such as __pycache__)")
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as err:
            student = _student_name(name, False) or name
            students.append(Student(student, Path(entry.path), problem=("load.unreadable", {"file": shown, "error": err.strerror or str(err)})))
            continue
        if (st.st_dev, st.st_ino) == out_key:
            skipped.append(f"{shown} (the output folder)")
            continue
        if stat.S_ISLNK(st.st_mode):
            student = _student_name(name, not os.path.splitext(name)[1])
            if student is None:
                skipped.append(f"{shown} (a symbolic link: not followed)")
                continue
            problem = ("load.symlink", {"file": shown})
        elif stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            student = _student_name(name, stat.S_ISDIR(st.st_mode))
            if student is None:
                skipped.append(f"{shown} (not a .py, .ipynb or folder)")
                continue
            problem = None
            if stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in inodes:
                    skipped.append(f"{shown} (the same file as {printable(inodes[key])}: a hard link, graded once)")
                    continue
                inodes[key] = name
        else:
            student = _student_name(name, False)
            if student is None:
                skipped.append(f"{shown} (not a regular file or folder)")
                continue
            problem = ("load.not_a_file", {"file": shown, "kind": "FIFO" if stat.S_ISFIFO(st.st_mode) else "special file"})
        if student in seen or student == "grades":
            taken = printable(seen.get(student, "grades.csv"))
            skipped.append(f"{shown} (student {printable(student)!r} already taken by {taken})")
            continue
        seen[student] = name
        students.append(Student(student, Path(entry.path), problem=problem))
    by_result = {}
    for student in students:  # distinct students never share a results file (hashed names, in theory)
        by_result.setdefault(results_name(student.name), []).append(student)
    clashes = {id(s) for group in by_result.values() for s in group[1:]}
    for student in [s for s in students if id(s) in clashes]:
        skipped.append(f"{printable(student.path.name)} (its results file name is taken by another student)")
    students = [s for s in students if id(s) not in clashes]
    return sorted(students, key=lambda s: os.fsencode(s.name)), skipped


def content_hash(path: Path) -> str:
    """sha256 of what would be graded: the entry file's name inside the student's folder and its bytes, or,
    when it cannot be read, the problem (so a file that becomes readable, or smaller, is graded again)."""
    submission = loader.load(path)
    entry = submission.path.relative_to(path).as_posix() if path.is_dir() and submission.path != path else ""
    problem = json.dumps(list(submission.problem), sort_keys=True, default=str) if submission.problem else ""
    return hashlib.sha256(os.fsencode(entry) + b"\0" + submission.raw + b"\0" + problem.encode()).hexdigest()


def read_results(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def up_to_date(data: dict | None, digest: str, lang: str, exercise) -> bool:
    extra = (data or {}).get("extra_data") or {}
    batch = extra.get("batch") or {}
    return (batch.get("content_hash") == digest and batch.get("lang") == lang and batch.get("rubric") == exercise.rubric_key()
            and not extra.get("grader_error") and isinstance(extra.get("scores"), dict))


WORKER_LOGS = ".grader-workers-"   # OUT/<prefix>XXXX: the workers' logs while a batch runs


def sweep_temporaries(out: Path) -> int:
    """Remove what a killed batch leaves (the lock is held: no batch is using them): write_atomic's
    temporaries, killed between their write and their rename, and the workers' logs."""
    count = 0
    for tmp in out.glob(".*.tmp"):
        try:
            tmp.unlink()
            count += 1
        except FileNotFoundError:
            pass
    for logs in out.glob(WORKER_LOGS + "*"):
        if logs.is_dir() and not logs.is_symlink():
            shutil.rmtree(logs, ignore_errors=True)
            count += 1
    return count


def lock(out: Path):
    """One batch per output folder; the lock dies with the process, so a SIGKILL never leaves it held."""
    handle = open(out / ".batch.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


# -- the worker: one Runner, one student at a time -----------------------------------------------------
def worker_main(argv: list[str]) -> int:
    """A worker, in a fork of the batch's parent (Worker): argv is LANG BACKEND WALL_S MEMORY_MB SANDBOX TOTAL_MB
    TMP_MB EXERCISE [EXERCISES_DIR ...].

    Reads {"name", "path"} lines on stdin, answers one {"name", "results"} line each on its protocol fd
    (the original stdout; fd 1 then points at stderr so nothing else can write into the protocol)."""
    from .. import api
    from ..processes.runner import Runner
    from ..processes.sandbox import Limits, set_parent_death_signal

    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)       # the batch was SIGKILLed: this worker goes too (and so
    if os.getppid() != parent:                    # its zygote, which exits when its socket closes)
        return 1
    lang, backend, wall_s, memory_mb, sandbox = argv[0], argv[1], float(argv[2]), int(argv[3]), argv[4] == "1"
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
                                   show_output=False)
                data = to_gradescope(result, lang)
                data["extra_data"]["scores"] = {c.spec.id: c.score for c in result.checks}
                if submission.problem is not None:
                    data["extra_data"]["problem"] = submission.problem.key
                reply = json.dumps({"name": task["name"], "results": data})
            except Exception:  # this student only: the worker carries on with the next one
                data = failed_results(loader.display_name(Path(task["path"]).name), traceback.format_exc(), lang)
                data["extra_data"]["scores"] = {c.id: 0 for c in exercise.checks}
                reply = json.dumps({"name": task["name"], "results": data})
            proto.write(reply + "\n")
            proto.flush()
    return 0


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
        argv = [args.lang, args.backend, str(args.time_limit), str(args.memory_mb), "0" if args.no_sandbox else "1",
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


def save(out: Path, student: Student, data: dict, lang: str, exercise) -> dict:
    """Write OUT/<results_name>; a failure to write is recorded in the row (the gradebook still lists it)."""
    extra = data.setdefault("extra_data", {})
    extra["batch"] = {"content_hash": student.digest, "lang": lang, "rubric": exercise.rubric_key(), "entry": printable(student.path.name)}
    try:
        write_atomic(out / results_name(student.name), json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    except (OSError, ValueError) as err:
        extra["write_error"] = f"{type(err).__name__}: {err}"
    return data


def problem_results(student: Student, key: str, params: dict, lang: str, exercise) -> dict:
    """The results of an entry that cannot be graded at all (a symbolic link, a FIFO): every check fails
    with the reason, exactly as `grade` reports a submission it cannot load."""
    note = Note(key, params)
    result = GradingResult(printable(student.path.name), [CheckResult(spec, Outcome.NOT_SUBMITTED, 0.0, [note])
                                                          for spec in exercise.checks], summary=[note])
    data = to_gradescope(result, lang)
    data["extra_data"].update(problem=key, scores={c.id: 0 for c in exercise.checks})
    return data


def entry_failed(student: Student, error: str, lang: str, exercise) -> dict:
    """A failure of the grader around one entry (hashing it, say): that entry's own 'grader failed' row."""
    data = failed_results(printable(student.path.name), error, lang)
    data["extra_data"]["scores"] = {c.id: 0 for c in exercise.checks}
    return data


# -- scheduling -------------------------------------------------------------------------------------
def grade_all(todo: list[Student], args, out: Path, progress, results: dict[str, dict] | None = None) -> dict[str, dict]:
    """Grade `todo` on args.jobs workers; every student gets a results dict, whatever happens to workers.
    `results` (filled in as students finish) stays valid if this raises: run() still writes the gradebook."""
    results = {} if results is None else results
    queue = list(todo)
    budget = 60 + 4 * args.time_limit       # two rounds of runs of at most time_limit each, with margins
    log_dir = Path(tempfile.mkdtemp(prefix=WORKER_LOGS, dir=out))
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()

    def finish(student: Student, data: dict) -> None:
        results[student.name] = save(out, student, data, args.lang, args.exercise_spec)
        progress.advance(printable(student.name))

    def worker_lost(worker: Worker) -> None:
        student, worker.student = worker.student, None
        sel.unregister(worker.proc.stdout)
        timed_out = student is not None and time.monotonic() > worker.deadline
        worker.kill()
        why = f"grading took longer than {budget:.0f} s; the worker was killed" if timed_out else worker.why_dead()
        workers.remove(worker)
        if student is not None and student.name not in results:
            student.errors.append(why)
            if student.attempts < MAX_ATTEMPTS:
                queue.insert(0, student)
            else:
                error = "\n\n".join(f"attempt {i + 1}: {e}" for i, e in enumerate(student.errors))
                data = failed_results(printable(student.path.name), error, args.lang)
                data["extra_data"]["scores"] = {c.id: 0 for c in args.exercise_spec.checks}
                finish(student, data)

    try:
        while queue or any(w.student for w in workers):
            while len(workers) < min(args.jobs, len(queue) + sum(1 for w in workers if w.student)):
                worker = Worker(args, log_dir, len(workers))
                workers.append(worker)
                sel.register(worker.proc.stdout, selectors.EVENT_READ, worker)
            for worker in list(workers):
                if worker.student is None and queue:
                    student = queue.pop(0)
                    student.attempts += 1
                    if not worker.assign(student, budget):
                        worker_lost(worker)
            now = time.monotonic()
            busy = [w for w in workers if w.student]
            timeout = max(0.0, min((w.deadline for w in busy), default=now + 1) - now)
            for key, _ in sel.select(min(timeout, 1.0)):
                worker: Worker = key.data
                lines, eof = worker.read_lines()
                for msg in lines:
                    if worker.student and msg.get("name") == worker.student.name and isinstance(msg.get("results"), dict):
                        student, worker.student = worker.student, None
                        finish(student, msg["results"])
                if eof:
                    worker_lost(worker)
            now = time.monotonic()
            for worker in [w for w in workers if w.student and now > w.deadline]:
                worker_lost(worker)
            progress.tick()
    finally:
        for worker in workers:   # every idle worker winds down at once (its zygote, its runs' folders)
            if worker.student is None:
                worker.ask_to_stop()
        for worker in workers:
            if worker.student is None:
                worker.stop()
            else:
                worker.kill()
        sel.close()
        for log in log_dir.glob("*"):
            log.unlink()
        log_dir.rmdir()
    return results


# -- summary ----------------------------------------------------------------------------------------
def summary(rows: list[tuple[str, dict]], lang: str, exercise) -> str:
    total = exercise.total
    totals = [float(d.get("score", 0)) for _, d in rows]
    verdicts: dict[str, int] = {}
    for _, d in rows:
        verdicts[verdict(d, exercise)] = verdicts.get(verdict(d, exercise), 0) + 1
    names = [printable(name) for name, _ in sorted_rows(rows)]
    column = min(NAME_COLUMNS, max([width(n) for n in names] + [len("student")]))   # display columns (CJK: 2 each)
    lines = [f"{fit('student', column)} {'total':>6}  verdict"]
    lines += [f"{fit(shown, column)} {number(d.get('score', 0)):>6}  {verdict(d, exercise)}"
              for shown, (_, d) in zip(names, sorted_rows(rows))]
    lines.append("")
    lines.append(render("batch.verdicts", {}, lang) + "  " + ", ".join(f"{v}: {n}" for v, n in sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0]))))
    if totals:
        lines.append(render("batch.mean_median", {"count": len(totals), "mean": statistics.fmean(totals),
                                                  "median": statistics.median(totals), "max": total}, lang))
        lines.append(render("batch.histogram", {}, lang))
        bins = [0] * 11
        for t in totals:
            bins[min(int(t * 10 // total), 10)] += 1
        scale = max(1.0, max(bins) / 40)
        for i, n in enumerate(bins):
            low = total * i / 10
            label = f"{low:g}" if i == 10 else f"{low:g}-{low + total / 10 - 1:g}"
            lines.append(f"  {label:>7} | {'#' * round(n / scale):<40} {n}")
    return "\n".join(lines) + "\n"


class Progress:
    """A bar with an ETA on a terminal; otherwise a line at most every 10% or 10 s."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = self.last_line = time.monotonic()
        self.last_pct = -1
        self.current = ""

    def eta(self) -> str:
        if not self.done:
            return "--:--"
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        return f"{int(left // 60):02d}:{int(left % 60):02d}"

    def advance(self, name: str) -> None:
        self.done += 1
        self.current = name
        self.tick(force=not self.tty)

    def tick(self, force: bool = False) -> None:
        if not self.total:
            return
        pct = 100 * self.done // self.total
        if self.tty:
            width = 30
            bar = "#" * (width * self.done // self.total)
            self.stream.write(f"\r[{bar:<{width}}] {self.done}/{self.total} {pct:3d}%  ETA {self.eta()}  {fit(self.current, 20)}")
            if self.done == self.total:
                self.stream.write("\n")
        elif force and (self.done == self.total or pct >= self.last_pct + 10 or time.monotonic() - self.last_line > 10):
            self.stream.write(f"graded {self.done}/{self.total} ({pct}%), ETA {self.eta()}\n")
            self.last_pct, self.last_line = pct, time.monotonic()
        self.stream.flush()


# -- the verb ---------------------------------------------------------------------------------------
def run(args) -> int:
    folder, out = Path(args.folder), Path(args.out)
    if not folder.is_dir():
        print(f"not a folder: {folder}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    held = lock(out)
    if held is None:
        print(f"another batch is writing {out}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with held:
        swept = sweep_temporaries(out)
        try:
            students, skipped = discover(folder, out)
        except SystemExit as err:
            print(err, file=sys.stderr)
            return 2
        for why in skipped:
            print(f"skipped: {why}", file=sys.stderr)
        try:
            exercise = args.exercise_spec = class_exercise(folder, students, args)
        except registry.ExerciseError as err:
            print(render(err.key, err.params, args.lang), file=sys.stderr)
            return 2
        todo, rows, graded = [], [], {}
        for student in students:
            if student.problem is not None:  # a symbolic link, a FIFO ...: its row says why, nothing is read
                data = problem_results(student, *student.problem, args.lang, exercise)
                graded[student.name] = save(out, student, data, args.lang, exercise)
                continue
            try:
                student.digest = content_hash(student.path)
                data = read_results(out / results_name(student.name))
            except Exception:
                failed = entry_failed(student, traceback.format_exc(), args.lang, exercise)
                graded[student.name] = save(out, student, failed, args.lang, exercise)
                continue
            if up_to_date(data, student.digest, args.lang, exercise):
                rows.append((student.name, data))
            else:
                todo.append(student)
        reused = len(rows)
        progress = Progress(len(todo))
        try:
            if todo:
                launch.start_template()   # one import torch for every worker's zygote (started early by __main__)
                grade_all(todo, args, out, progress, graded)
        except Exception:  # a fault of the batch itself: the students it reached keep their rows
            print(traceback.format_exc(), file=sys.stderr)
        finally:
            launch.stop_template()
            for student in todo:
                if student.name not in graded:
                    graded[student.name] = entry_failed(student, "the batch stopped before grading this entry",
                                                        args.lang, exercise)
            rows += list(graded.items())
            write_atomic(out / "grades.csv", gradebook(rows, exercise))
            report = classreport.build(rows, exercise, args.lang)   # what the class got wrong (issue 13)
            causes_csv, report_html = classreport.write(out, report)
    sys.stdout.write(summary(rows, args.lang, exercise))
    sys.stdout.write(classreport.terminal(report))
    print(render("classreport.written", {"html": report_html, "csv": causes_csv}, args.lang))
    print(render("batch.done", {"graded": len(graded), "reused": reused, "swept": swept,
                                "seconds": time.monotonic() - started, "csv": out / "grades.csv"}, args.lang))
    return 0


def class_exercise(folder: Path, students: list[Student], args):
    """The exercise of the whole class: --exercise; else the one the class folder names; else the one
    most submissions are for (inferred from each file, its folder and its code)."""
    if args.exercise:
        return registry.get(args.exercise, args.exercises_dir)
    try:
        return registry.infer(Path(os.path.abspath(folder)), None, args.exercises_dir)
    except registry.ExerciseError:
        pass
    votes: dict[str, int] = {}
    found = {}
    for student in students:
        if student.problem is not None:
            continue
        try:
            submission = loader.load(student.path)
            exercise = registry.infer(submission.path, submission.source, args.exercises_dir,
                                      getattr(submission, "files", None))
        except Exception:  # noqa: BLE001  (this entry tells nothing; its own grading will say why)
            continue
        votes[exercise.name] = votes.get(exercise.name, 0) + 1
        found[exercise.name] = exercise
    if not votes:
        raise registry.ExerciseError("exercise.ambiguous", known=", ".join(sorted(registry.available(args.exercises_dir))))
    return found[max(sorted(votes), key=votes.get)]


def register(subparsers, add_common_options) -> None:
    p = subparsers.add_parser("batch", help="grade every submission in a folder: OUT/<student>.json and OUT/grades.csv")
    p.add_argument("folder", help="one entry per student: alice.py, bob.ipynb or a folder carol/")
    p.add_argument("--out", required=True, help="output folder (reused: only missing or changed submissions are graded)")
    p.add_argument("--jobs", type=int, default=2, help="submissions graded at once, one worker process each (default %(default)s)")
    add_common_options(p)
    p.set_defaults(func=lambda args: run(_normalized(args)))


def _normalized(args):
    args.lang = args.lang or default_lang()
    args.jobs = max(1, args.jobs)
    return args

