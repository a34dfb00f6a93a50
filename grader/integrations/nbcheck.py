"""The in-notebook check: grade the `run_worker` this kernel defined, with real rank processes.

    from grader.integrations import nbcheck
    nbcheck.report("dist_primitives")                 # the report `python -m grader check` prints, and the
                                                      # space-time diagram of the visible run below it
    nbcheck.check("ws2.all_reduce", "dist_primitives")  # one check: prints its verdict, raises CheckFailed

Why source text: processes cannot import a function defined in a notebook cell (pickling by reference
fails with `Can't get attribute 'run_worker' on <module '__main__'>`). The ranks get the cells this
kernel executed instead, in the order it executed them (IPython's raw input history), with magics and
shell lines neutralised exactly as `python -m grader grade x.ipynb` does. That is the kernel's state,
helpers, imports and constants included, which `inspect.getsource(run_worker)` alone would miss;
a cell that does not parse is skipped, because it never ran. Ranks load definitions only
(definitions.definitions_only), so the history's launch calls and check calls do not run again.

One grading per distinct program (a hash of the definitions the ranks execute), every check at once
(hidden ones too), cached in the kernel: the eight autograder cells of a notebook cost one grading.
The runner's own time limit ends a hanging run_worker well inside nbgrader's cell timeout (nbgrader_config.py). Nothing is written to stderr on a
correct answer: nbgrader scores any stderr output in a test cell as a failure.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import io
import os
import sys
import traceback
import warnings

from ..submission import load

from ..submission import notebook

from ..submission import definitions
from ..feedback.messages import LANGS, default_lang, render
from ..model import CheckResult, GradingResult, Outcome
from ..feedback.render import check_lines, checks_of, note, status, title
from ..feedback.report import text_report

FILENAME = "notebook.ipynb"   # what messages and tracebacks call the kernel's code
TIME_LIMIT_ENV = "GRADER_TIME_LIMIT"   # seconds per run (default: the grader's); the course's config may set it
CACHE_SIZE = 8
_CACHE: dict[str, GradingResult] = {}


class CheckFailed(AssertionError):
    """A failed check. IPython shows `_render_traceback_` instead of a traceback, so a failing cell shows
    the check's feedback only, never the test cell's code (which, for hidden tests, is hidden)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def _render_traceback_(self) -> list[str]:
        return self.text.splitlines()


def language(lang: str | None = None) -> str:
    lang = lang or os.environ.get("GRADER_LANG")
    return lang if lang in LANGS else default_lang()


# -- what to grade ------------------------------------------------------------------------------

def kernel_cells() -> list[str]:
    """The raw text of every cell this kernel executed, in order; outside IPython, the __main__ file."""
    try:   # here: only a kernel has one (a rank imports this module, and no IPython)
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        return [cell for cell in shell.history_manager.input_hist_raw if isinstance(cell, str)]
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return [fh.read()]
        except (OSError, UnicodeDecodeError):
            pass
    return []


def _course_tool(stmt: ast.stmt) -> bool:
    """`import grader...` / `from grader... import ...`: the course's own tools (check and bench cells),
    never part of an answer."""
    if isinstance(stmt, ast.Import):
        return all(a.name == "grader" or a.name.startswith("grader.") for a in stmt.names)
    return isinstance(stmt, ast.ImportFrom) and not stmt.level and (stmt.module or "").split(".")[0] == "grader"


def _canonical(code: str) -> str | None:
    """What a cell contributes to the ranks' module (its definitions, unparsed; imports of the course's tools
    left out, so a check or bench cell contributes nothing); None if it does not parse."""
    try:
        tree = definitions.definitions_only(ast.parse(code))
        tree.body = [stmt for stmt in tree.body if not _course_tool(stmt)]
        return ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        return None


def kernel_program(cells: list[str] | None = None) -> tuple[str, str]:
    """(source, key). The source: the cells as one module, magics and shell lines neutralised, cells that do
    not parse left out, cells that define nothing (check and bench cells) left out, and a cell whose
    definitions a later cell repeats exactly (a re-run) kept only at its last run. The key: a hash of what the ranks
    execute, so running more check cells does not grade again."""
    kept: dict[str, str] = {}
    for cell in kernel_cells() if cells is None else cells:
        code = notebook.cell_source({"source": cell})
        canonical = _canonical(code) if code.strip() else None
        if canonical:
            kept.pop(canonical, None)
            kept[canonical] = code.rstrip("\n") + "\n"
    key = hashlib.sha256("\n\0".join(kept).encode("utf-8", "surrogatepass")).hexdigest()
    return "\n".join(kept.values()), key


# -- grading, once per source -------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    """No Python-level warning or stderr text reaches the cell (ranks and the zygote have their own pipes)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _failed(filename: str, error: str, checks=()) -> GradingResult:
    return GradingResult(filename, [CheckResult(spec, Outcome.GRADER_ERROR) for spec in checks], grader_error=error)


def grade_source(source: str, *, exercise: str | None = None, key: str | None = None, filename: str = FILENAME,
                 runner_factory=None) -> GradingResult:
    """Every check (hidden included) of `exercise` (default: inferred from the code) for this source;
    cached by `key` (default: the source's hash). Never raises."""
    key = (exercise or "") + ":" + (key or hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest())
    if key in _CACHE:
        return _CACHE[key]
    with _quiet():
        try:
            # here, not at the top: ranks import this module (a notebook's imports), never the pipeline, and the
            # zygote imports what ranks may import before its first fork (zygote.PRELOAD), on the batch's
            # critical path
            from .. import api
            if runner_factory is None:
                from ..processes.runner import Runner
                from ..processes.limits import Limits
                wall_s = float(os.environ.get(TIME_LIMIT_ENV) or Limits.wall_s)
                runner_factory = lambda: Runner(limits=Limits(wall_s=wall_s))  # noqa: E731
            with runner_factory() as runner:
                result = api.grade(load.from_source(source, filename), runner=runner, exercise=exercise,
                                   include_hidden=True, timeline=True)
        except Exception:
            result = _failed(filename, traceback.format_exc())
    while len(_CACHE) >= CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = result
    return result


def current(exercise: str | None = None) -> GradingResult:
    """The grading of this kernel's current state."""
    source, key = kernel_program()
    return grade_source(source, exercise=exercise, key=key)


# -- what a cell shows --------------------------------------------------------------------------

def check_text(result: GradingResult, check: CheckResult, lang: str) -> str:
    """One check as the report shows it; hidden checks: verdict, hint and named mistakes only."""
    mark = "PASS" if check.passed else "FAIL"
    lines = [f"[{mark}] {check.score:g}/{check.spec.points:g}  {title(check, lang, checks_of(result))}"]
    if check.passed and check.spec.hidden:
        return lines[0] + "  " + status(check, lang)
    if not check.passed:
        if result.grader_error:
            lines.append(render("summary.grader_failed", {}, lang))
        lines += [note(n, lang) for n in result.summary]
    lines += ["       " + line for text in check_lines(check, lang) for line in text.splitlines()]
    return "\n".join(dict.fromkeys(lines))


def check(check_id: str, exercise: str | None = None, lang: str | None = None) -> None:
    """Score one check of the exercise (an nbgrader test cell): print on a pass, raise CheckFailed on a
    failure. `exercise`: its name (default: inferred from this kernel's code)."""
    lang = language(lang)
    result = current(exercise)
    found = next((c for c in result.checks if c.spec.id == check_id), None)
    if found is None:
        if not result.checks:  # no exercise could be told: say why, as a failed check
            raise CheckFailed("\n".join(note(n, lang) for n in result.summary))
        raise ValueError(f"unknown check {check_id!r}; known: {', '.join(c.spec.id for c in result.checks)}")
    text = check_text(result, found, lang)
    if not found.passed:
        raise CheckFailed(text)
    print(text)


def report(exercise: str | None = None, lang: str | None = None) -> None:
    """Print the visible checks' report: what `python -m grader check` prints for this kernel's code."""
    lang = language(lang)
    result = current(exercise)
    visible = dataclasses.replace(result, checks=[c for c in result.checks if not c.spec.hidden])
    print(text_report(visible, lang), end="")   # it says how many points the hidden checks hold
    show_timeline(result, lang)


def show_timeline(result: GradingResult, lang: str) -> None:
    """The space-time diagram of the visible run, inline under the report (in IPython only: elsewhere the
    report is all there is)."""
    if result.timeline is None:
        return
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    from ..feedback import timeline
    display(HTML(timeline.figure(result.timeline, lang)))
