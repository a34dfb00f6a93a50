"""Grade a whole class: one results file per student, a gradebook, resumable after any kill.

    python -m grader batch DIR --out OUT [--jobs N] [--lang zh|en]

Each entry of DIR is one student: `alice.py`, `bob.ipynb`, or a folder `carol/` holding one submission
(nbgrader's submitted/<student>/<assignment>/ works as is). Writes OUT/<student>.json (the results.json
of `grade`, plus `extra_data.batch` with the submission's content hash) and OUT/grades.csv.

Processes: this parent never imports torch and never runs student code. It starts N workers
(`worker_main`), each owning one Runner (one zygote), and hands each a student at a time over a pipe
of JSON lines. A worker that dies or overruns is killed by process group and replaced; its student is
graded again once in a fresh worker, then gets a "grader failed" result. Only the parent writes files,
each atomically, so a SIGKILL at any moment leaves whole files only; a rerun skips every student whose
results hold the same content hash (and language and rubric) and sweeps stale temporary files.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..exercise import registry
from ..submission import load as loader
from ..feedback.messages import default_lang, render
from ..feedback.results import failed_results, write_atomic
from ..processes.sandbox import default_total_mb

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


def discover(folder: Path, out: Path) -> tuple[list[Student], list[str]]:
    """Students in `folder`, sorted by name; and what was skipped, with why."""
    students, skipped, seen = [], [], {}
    out = out.resolve()
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name.startswith("__") or entry.resolve() == out:
            continue
        if entry.is_dir():
            name = entry.name
        elif entry.is_file() and entry.suffix in loader.SUFFIXES:
            name = entry.stem
        else:
            skipped.append(f"{entry.name} (not a .py, .ipynb or folder)")
            continue
        if name in seen or name == "grades":
            skipped.append(f"{entry.name} (student {name!r} already taken by {seen.get(name, 'grades.csv')})")
            continue
        seen[name] = entry.name
        students.append(Student(name, entry))
    return students, skipped


def content_hash(path: Path) -> str:
    """sha256 of what would be graded: the entry file's name inside the student's folder and its bytes."""
    submission = loader.load(path)
    entry = submission.path.relative_to(path).as_posix() if path.is_dir() and submission.path != path else ""
    return hashlib.sha256(entry.encode() + b"\0" + submission.raw).hexdigest()


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


def sweep_temporaries(out: Path) -> int:
    """Remove what write_atomic leaves when killed between its write and its rename."""
    count = 0
    for tmp in out.glob(".*.tmp"):
        try:
            tmp.unlink()
            count += 1
        except FileNotFoundError:
            pass
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
    """`python -c 'from grader.integrations.batch import worker_main; ...' LANG BACKEND WALL_S MEMORY_MB SANDBOX TOTAL_MB
    EXERCISE [EXERCISES_DIR ...]`.

    Reads {"name", "path"} lines on stdin, answers one {"name", "results"} line each on its protocol fd
    (the original stdout; fd 1 then points at stderr so nothing else can write into the protocol)."""
    from .. import api
    from ..feedback.results import to_gradescope
    from ..processes.runner import Runner
    from ..processes.sandbox import Limits, set_parent_death_signal

    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)       # the batch was SIGKILLed: this worker goes too (and so
    if os.getppid() != parent:                    # its zygote, which exits when its socket closes)
        return 1
    lang, backend, wall_s, memory_mb, sandbox = argv[0], argv[1], float(argv[2]), int(argv[3]), argv[4] == "1"
    total_mb = int(argv[5])
    exercise = registry.get(argv[6], argv[7:])
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    fault = os.environ.get(FAULT_ENV)
    with Runner(limits=Limits(wall_s=wall_s, memory_mb=memory_mb, total_mb=total_mb), sandbox=sandbox) as runner:
        for line in sys.stdin:
            task = json.loads(line)
            if fault and task["name"] == fault:
                os._exit(3)
            result = api.grade_path(Path(task["path"]), runner=runner, exercise=exercise, include_hidden=True, backend=backend,
                                    show_output=False)
            data = to_gradescope(result, lang)
            data["extra_data"]["scores"] = {c.spec.id: c.score for c in result.checks}
            proto.write(json.dumps({"name": task["name"], "results": data}, ensure_ascii=False) + "\n")
            proto.flush()
    return 0


class Worker:
    """A worker process seen from the parent: its pipes, its current student, its deadline."""

    def __init__(self, args, log_dir: Path, index: int):
        cmd = [sys.executable, "-c", "import sys; from grader.integrations.batch import worker_main; sys.exit(worker_main(sys.argv[1:]))",
               args.lang, args.backend, str(args.time_limit), str(args.memory_mb), "0" if args.no_sandbox else "1",
               str(args.memory_total_mb or default_total_mb(args.jobs)), args.exercise_spec.name, *args.exercises_dir]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.log = log_dir / f"worker-{index}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                                         env=env, start_new_session=True)
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
            self.proc.stdin.write((json.dumps({"name": student.name, "path": str(student.path.resolve())}) + "\n").encode())
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

    def stop(self) -> None:
        """Normal end: EOF on stdin lets the worker close its Runner; killed if it does not exit soon."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


# -- scheduling -------------------------------------------------------------------------------------
def grade_all(todo: list[Student], args, out: Path, progress) -> dict[str, dict]:
    """Grade `todo` on args.jobs workers; every student gets a results dict, whatever happens to workers."""
    results: dict[str, dict] = {}
    queue = list(todo)
    budget = 60 + 4 * args.time_limit       # two rounds of runs of at most time_limit each, with margins
    log_dir = Path(tempfile.mkdtemp(prefix="grader-batch-"))
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()

    def finish(student: Student, data: dict) -> None:
        data.setdefault("extra_data", {})["batch"] = {"content_hash": student.digest, "lang": args.lang, "rubric": args.exercise_spec.rubric_key()}
        write_atomic(out / f"{student.name}.json", json.dumps(data, ensure_ascii=False, indent=2) + "\n")
        results[student.name] = data
        progress.advance(student.name)

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
                data = failed_results(student.name, error, args.lang)
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


# -- gradebook and summary --------------------------------------------------------------------------
def verdict(data: dict, exercise) -> str:
    """The first failing outcome in rubric order, or "pass"."""
    extra = data.get("extra_data") or {}
    if extra.get("grader_error"):
        return "grader_failed"
    outcomes = extra.get("outcomes") or {}
    for spec in exercise.checks:
        outcome = outcomes.get(spec.id, "missing")
        if outcome != "pass":
            return outcome
    return "pass"


def _num(x) -> str:
    return f"{float(x):g}"


def gradebook(rows: list[tuple[str, dict]], exercise) -> str:
    """grades.csv: the same submissions give the same bytes (sorted by student, no times)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student", "total", *(c.id for c in exercise.checks), "verdict"])
    for name, data in sorted(rows):
        scores = (data.get("extra_data") or {}).get("scores") or {}
        writer.writerow([name, _num(data.get("score", 0)), *(_num(scores.get(c.id, 0)) for c in exercise.checks), verdict(data, exercise)])
    return buf.getvalue()


def summary(rows: list[tuple[str, dict]], lang: str, exercise) -> str:
    total = exercise.total
    totals = [float(d.get("score", 0)) for _, d in rows]
    verdicts: dict[str, int] = {}
    for _, d in rows:
        verdicts[verdict(d, exercise)] = verdicts.get(verdict(d, exercise), 0) + 1
    lines = [f"{'student':<24} {'total':>6}  verdict"]
    lines += [f"{name:<24} {_num(d.get('score', 0)):>6}  {verdict(d, exercise)}" for name, d in sorted(rows)]
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
            self.stream.write(f"\r[{bar:<{width}}] {self.done}/{self.total} {pct:3d}%  ETA {self.eta()}  {self.current[:20]:<20}")
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
        students, skipped = discover(folder, out)
        for why in skipped:
            print(f"skipped: {why}", file=sys.stderr)
        try:
            args.exercise_spec = class_exercise(folder, students, args)
        except registry.ExerciseError as err:
            print(render(err.key, err.params, args.lang), file=sys.stderr)
            return 2
        todo, rows = [], []
        for student in students:
            student.digest = content_hash(student.path)
            data = read_results(out / f"{student.name}.json")
            if up_to_date(data, student.digest, args.lang, args.exercise_spec):
                rows.append((student.name, data))
            else:
                todo.append(student)
        reused = len(rows)
        progress = Progress(len(todo))
        graded = grade_all(todo, args, out, progress) if todo else {}
        rows += sorted(graded.items())
        write_atomic(out / "grades.csv", gradebook(rows, args.exercise_spec))
        from . import classreport   # the class report (issue 13): causes.csv, report.html, causes per check
        report = classreport.build(rows, args.exercise_spec, args.lang)
        causes_csv, report_html = classreport.write(out, report)
    sys.stdout.write(summary(rows, args.lang, args.exercise_spec))
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
        return registry.infer(folder.resolve(), None, args.exercises_dir)
    except registry.ExerciseError:
        pass
    votes: dict[str, int] = {}
    found = {}
    for student in students:
        submission = loader.load(student.path)
        try:
            exercise = registry.infer(submission.path, submission.source, args.exercises_dir)
        except registry.ExerciseError:
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

