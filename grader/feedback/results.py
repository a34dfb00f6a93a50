"""results.json in Gradescope's schema; the only module that knows its keys. Written atomically."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .messages import render
from ..model import GradingResult
from .render import check_lines, checks_of, note, title, visible


def to_gradescope(result: GradingResult, lang: str = "zh") -> dict:
    tests = [{
        "name": title(check, lang, checks_of(result)),
        "score": check.score,
        "max_score": check.spec.points,
        "status": "passed" if check.passed else "failed",
        "output": visible("\n".join(check_lines(check, lang))),
        "visibility": check.spec.visibility,
    } for check in result.checks]
    graded = bool(result.checks or result.exercise)   # else no exercise could be told: no score out of 0
    summary = [render("summary.score", {"score": result.score, "max_score": result.max_score}, lang)] if graded else []
    summary += [note(n, lang) for n in result.summary]
    if result.grader_error:
        summary.insert(0, render("summary.grader_failed", {}, lang))
        tests.insert(0, {"name": render("title.grader_failed", {}, lang), "score": 0, "max_score": 0,
                         "status": "failed", "output": render("summary.grader_failed", {}, lang),
                         "visibility": "visible"})
    hidden = sum(1 for c in result.checks if c.spec.hidden)
    if hidden:
        summary.append(render("summary.hidden_pending", {"count": hidden}, lang))
    return {
        "score": 0 if result.grader_error else result.score,
        "execution_time": round(result.execution_time, 3),
        "output": visible("\n".join(summary)),
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {
            "submission": result.submission,
            "exercise": result.exercise,
            "outcomes": {c.spec.id: c.outcome.value for c in result.checks},
            "causes": {c.spec.id: causes(c, lang) for c in result.checks if not c.passed},
            "sandbox": result.layers,
            "grader_error": result.grader_error,
            "runs": result.runs,
            "staff": [note(n, "en") for n in result.staff],
        },
    }


def causes(check, lang: str) -> list[dict]:
    """A failed check's named causes, for staff: catalog key and words (a class report counts them)."""
    out = []
    for n in check.notes:
        if n.key.startswith(("cause.", "why.", "fail.", "static.", "load.", "exercise.")) or ".cause." in n.key:
            out.append({"key": n.key, "text": note(n, lang), "rank": n.params.get("rank")})
    return out


def write_atomic(path: Path, data: str) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file. The temporary
    name is short whatever `path` is called (`.<hash of the name>.<random>.tmp`, under 40 bytes), so any
    name the file system allows for `path` works."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:12]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{tag}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared with TAs
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_results(result: GradingResult, path: Path, lang: str = "zh") -> None:
    write_atomic(path, json.dumps(to_gradescope(result, lang), ensure_ascii=False, indent=2) + "\n")


def failed_results(submission: str, error: str, lang: str = "zh") -> dict:
    """results.json when the grader could not even start: a visible 'autograder failed' test and a zero."""
    return {"score": 0, "execution_time": 0, "output": render("summary.grader_failed", {}, lang),
            "tests": [{"name": render("title.grader_failed", {}, lang), "score": 0, "max_score": 0,
                       "status": "failed", "output": render("summary.grader_failed", {}, lang),
                       "visibility": "visible"}],
            "extra_data": {"submission": submission, "grader_error": error}}
