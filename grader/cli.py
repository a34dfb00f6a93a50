"""Command line: a few lines per verb over the keyword-only functions of api.py.

    python -m grader list                            # the exercises, their points and visible world sizes
    python -m grader check my_solution.py            # visible checks; exit 0 iff all pass
    python -m grader check my_solution.py --timeline run.html --trace run.json   # and pictures of the run
    python -m grader grade SUBMISSION --results results.json [--exercise NAME] [--lang zh|en]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from . import api
from .exercise import registry
from .integrations import batch, bench, gradescope
from .feedback.messages import default_lang, render
from .feedback.report import text_report
from .feedback.results import failed_results, write_atomic, write_results
from .processes.runner import Runner
from .processes.limits import Limits

EXIT_USAGE = 2


def _limits(args) -> Limits:
    return Limits(wall_s=args.time_limit, memory_mb=args.memory_mb, total_mb=args.memory_total_mb, tmp_mb=args.tmp_mb)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", choices=("zh", "en"), default=None, help="feedback language (default: from LANG, else zh)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl", "none"), default="auto",
                   help="the real backend the code also runs on, at the visible world size (grading itself goes "
                        "through the grader's switch): auto = nccl when at least world_size GPUs are visible, else "
                        "gloo; none = no real-backend run")
    p.add_argument("--time-limit", type=float, default=Limits.wall_s, help="seconds per run (default %(default)s)")
    p.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="address space per rank (default %(default)s)")
    p.add_argument("--memory-total-mb", type=int, default=0,
                   help="memory of all ranks together, a cgroup where the machine allows (default: 3/4 of RAM)")
    p.add_argument("--tmp-mb", type=int, default=Limits.tmp_mb,
                   help="size of each run's /tmp, a tmpfs shared by its ranks (default %(default)s)")
    p.add_argument("--no-sandbox", action="store_true", help="run ranks without namespaces or a uid change (debugging)")
    _exercise_options(p)


def _exercise_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exercise", default=None, help="the exercise (default: inferred from the file, its folder or its code)")
    p.add_argument("--exercises-dir", action="append", default=[], metavar="DIR",
                   help="also look for exercises in DIR (an exercise folder, or a folder of them)")


def _pictures(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeline", metavar="PATH.html", default=None,
                   help="write a space-time diagram of the run at the visible world size (a self-contained HTML page)")
    p.add_argument("--trace", metavar="PATH.json", default=None,
                   help="write the same run as Chrome trace-event JSON (open it in ui.perfetto.dev or chrome://tracing)")


def _grade(args, path: Path, include_hidden: bool):
    with Runner(limits=_limits(args), sandbox=not args.no_sandbox) as runner:
        return api.grade_path(path, runner=runner, exercise=args.exercise, include_hidden=include_hidden,
                              backend=args.backend, exercises_dir=args.exercises_dir,
                              timeline=bool(args.timeline or args.trace))


def _draw(args, result, path: Path) -> bool:
    """Write the pictures asked for (imported only then: a check that draws nothing loads nothing of them);
    False, said on stderr, where one cannot be written."""
    if not (args.timeline or args.trace):
        return True
    from .feedback import timeline, trace
    lang = args.lang or default_lang()
    try:
        if args.timeline:
            write_atomic(Path(args.timeline), timeline.page(result.timeline, lang, path.name))
        if args.trace:
            trace.write(result.timeline, Path(args.trace), lang)
    except OSError as err:
        print(f"cannot write {err.filename or args.timeline or args.trace}: {err.strerror or err}", file=sys.stderr)
        return False
    return True


def cmd_check(args) -> int:
    lang = args.lang or default_lang()
    path = Path(args.submission)
    if not _exists(path):
        print(f"no such file: {path}", file=sys.stderr)
        return EXIT_USAGE
    result = _grade(args, path, include_hidden=False)
    sys.stdout.write(text_report(result, lang))
    if _unreadable(result) or not _draw(args, result, path):
        return EXIT_USAGE
    return 0 if result.all_passed else 1


def cmd_grade(args) -> int:
    lang = args.lang or default_lang()
    path = Path(args.submission)
    results_path = Path(args.results) if args.results else None
    if not _exists(path):
        print(f"no such file or folder: {path}", file=sys.stderr)
        if results_path:
            write_atomic(results_path, json.dumps(failed_results(path.name, f"missing: {path}", lang), ensure_ascii=False))
        return EXIT_USAGE
    try:
        result = _grade(args, path, include_hidden=True)
    except Exception:
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        if results_path:
            write_atomic(results_path, json.dumps(failed_results(path.name, error, lang), ensure_ascii=False))
        return 0
    if results_path:
        write_results(result, results_path, lang)
    sys.stdout.write(text_report(result, lang, staff=True))
    if result.grader_error:
        print(result.grader_error, file=sys.stderr)
    drawn = _draw(args, result, path)
    return EXIT_USAGE if _unreadable(result) or not drawn else 0


def _unreadable(result) -> bool:
    """The path exists but cannot be read, or names no known exercise (and the submission has no problem of
    its own, which is then the news): a usage error, though results.json is written."""
    exercise = ("exercise.unknown", "exercise.ambiguous", "exercise.none", "exercise.broken")
    return any(note.key == "load.unreadable" for note in result.summary) or \
        bool(result.summary) and result.summary[0].key in exercise


def _exists(path: Path) -> bool:
    """Whether the path names anything (a link included); a path too long for the system counts as
    existing, so that loading it gives the student a message rather than this command a traceback."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return True


def cmd_list(args) -> int:
    lang = args.lang or default_lang()
    try:
        exercises = registry.available(args.exercises_dir)
    except registry.ExerciseError as err:
        print(render(err.key, err.params, lang), file=sys.stderr)
        return EXIT_USAGE
    print(render("list.header", {}, lang))
    for name, ex in sorted(exercises.items()):
        print(render("list.row", {"name": name, "title": ex.title[0] if lang == "zh" else ex.title[1],
                                  "points": ex.total, "visible": ", ".join(map(str, ex.visible_world_sizes)) or "-"}, lang))
    for name, err in sorted(registry.broken(args.exercises_dir).items()):   # listed, with why
        print(render("list.broken", {**err.params, "name": name}, lang))
    return 0


def build_parser(prog: str = "python -m grader") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Autograder for multi-process PyTorch exercises")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="the exercises, with their points and visible world sizes")
    p.add_argument("--lang", choices=("zh", "en"), default=None)
    _exercise_options(p)
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("check", help="run the visible checks on your own solution")
    p.add_argument("submission")
    _common(p)
    _pictures(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("grade", help="full grade (hidden checks included) and results.json")
    p.add_argument("submission")
    p.add_argument("--results", help="where to write results.json (Gradescope schema)")
    _common(p)
    _pictures(p)
    p.set_defaults(func=cmd_grade)
    for register in (batch.register, gradescope.register, bench.register):
        register(sub, _common)
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m grader") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    return args.func(args)
