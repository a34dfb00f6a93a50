"""Where the engine finds exercises, and which one a submission is for.

An exercise is a folder with an `exercise.py` that defines `EXERCISE` (see spec.py). The engine looks in
`solutions/*/` of this checkout, then in every folder named by `--exercises-dir` or the environment
variable GRADER_EXERCISES (os.pathsep-separated): each such folder is an exercise folder itself or holds
exercise folders. Nothing in grader/ names an exercise.

A folder whose exercise.py cannot be loaded (it raises, or declares something that cannot work) never
blocks the others: `available` returns the exercises that load, `broken` the others with their error,
which names the file and line; choosing a broken one (`get`, or a submission that names it) raises it.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from ..feedback import messages
from ..feedback.messages import render
from ..model import Words
from .spec import Exercise
from .validate import DeclarationError

ROOT = Path(__file__).resolve().parents[2]
ENV = "GRADER_EXERCISES"
_CACHE: dict[tuple, tuple[dict[str, Exercise], dict[str, "ExerciseError"]]] = {}


class ExerciseError(Exception):
    """No exercise, an unknown one, or an ambiguous choice: `key` and `params` make the message."""

    def __init__(self, key: str, **params):
        super().__init__(key)
        self.key, self.params = key, params


def search_path(extra: list[str] | None = None) -> list[Path]:
    folders = [ROOT / "solutions"]
    for entry in (extra or []) + [p for p in os.environ.get(ENV, "").split(os.pathsep) if p]:
        folders.append(Path(entry))
    return folders


def _broken(path: Path, err: BaseException) -> ExerciseError:
    """The error of an exercise.py that cannot be loaded, at the line that says why."""
    if isinstance(err, DeclarationError):
        where, error = err.where, Words(*err.words())
    elif isinstance(err, SyntaxError) and err.lineno:
        where, error = (err.filename or str(path), err.lineno), f"SyntaxError: {err.msg}"
    else:
        lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__) if frame.filename == str(path)]
        where, error = (str(path), lines[-1]) if lines else None, f"{type(err).__name__}: {err}"
    place = f"{where[0]}:{where[1]}" if where else str(path)
    return ExerciseError("exercise.broken", name=_declared_name(path), path=place, error=error)


def _declared_name(path: Path) -> str:
    """The name an exercise.py declares (`Exercise(name="...")`), read without running it; else its folder's."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return path.parent.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Exercise":
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return kw.value.value
    return path.parent.name


def _load(path: Path) -> Exercise:
    name = f"grader_exercise_{path.parent.name}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise _broken(path, err) from err
    exercise = getattr(module, "EXERCISE", None)
    if not isinstance(exercise, Exercise):
        raise ExerciseError("exercise.broken", name=path.parent.name, path=str(path), error=Words(
            render("exercise.no_declaration", {}, "zh"), render("exercise.no_declaration", {}, "en")))
    messages.add(exercise.name, exercise.messages)
    return replace(exercise, folder=str(path.parent))


def _scan(extra: list[str] | None) -> tuple[dict[str, Exercise], dict[str, ExerciseError]]:
    key = tuple(str(p) for p in search_path(extra))
    if key not in _CACHE:
        found: dict[str, Exercise] = {}
        broken: dict[str, ExerciseError] = {}
        for folder in search_path(extra):
            here = folder / "exercise.py"
            for path in [here] if here.is_file() else sorted(folder.glob("*/exercise.py")):
                try:
                    exercise = _load(path)
                except ExerciseError as err:
                    broken.setdefault(err.params["name"], err)
                    continue
                found.setdefault(exercise.name, exercise)
        _CACHE[key] = found, {name: err for name, err in broken.items() if name not in found}
    return _CACHE[key]


def available(extra: list[str] | None = None) -> dict[str, Exercise]:
    """Every exercise on the search path that loads, by name (the first of a name wins)."""
    return _scan(extra)[0]


def broken(extra: list[str] | None = None) -> dict[str, ExerciseError]:
    """The exercise folders whose exercise.py cannot be loaded, by the name it declares (else its
    folder's), each with its error (exercise.broken: the file and line, and why)."""
    return _scan(extra)[1]


def get(name: str, extra: list[str] | None = None) -> Exercise:
    exercises, failed = _scan(extra)
    if name in failed:
        raise failed[name]
    if name not in exercises:
        raise ExerciseError("exercise.unknown", name=name, known=", ".join(sorted(exercises)) or "-")
    return exercises[name]


def _defined_functions(source: str | None) -> set[str]:
    if not source:
        return set()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Call, ast.Lambda)):
            # a function made by a factory or wrapper: `run_worker = make_worker()`, `= timed(_impl)`
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def infer(path: Path | None, source: str | None, extra: list[str] | None = None,
          files: dict[str, str] | None = None) -> Exercise:
    """The exercise a submission is for: the only one there is; else the one its file or folder names;
    else the one whose functions it defines (the most specific), in its source or in the Python files its
    notebook cells write (`%%writefile ring_impl.py`). Raises ExerciseError when it cannot tell."""
    exercises, failed = _scan(extra)
    if not exercises:
        raise next(iter(failed.values())) if failed else ExerciseError("exercise.none")
    if len(exercises) == 1 and not failed:
        return next(iter(exercises.values()))
    if path is not None:
        parts = [p.lower() for p in Path(path).parts[-4:]]

        def names(stems) -> bool:
            return any(stem and any(stem.lower() in Path(part).stem for part in parts) for stem in stems)
        named = [ex for ex in exercises.values() if names((ex.name, *ex.files))]
        if len(named) == 1:
            return named[0]
        named_broken = [err for name, err in failed.items() if names((name,))]
        if not named and len(named_broken) == 1:
            raise named_broken[0]
    defined = _defined_functions(source).union(*(_defined_functions(text) for name, text in (files or {}).items()
                                                 if name.endswith(".py")))
    matching = [ex for ex in exercises.values() if ex.defines and set(ex.defines) <= defined]
    if matching:
        most = max(len(ex.defines) for ex in matching)
        best = [ex for ex in matching if len(ex.defines) == most]
        if len(best) == 1:
            return best[0]
    raise ExerciseError("exercise.ambiguous", known=", ".join(sorted(exercises)))
