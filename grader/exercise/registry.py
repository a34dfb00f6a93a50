"""Where the engine finds exercises, and which one a submission is for.

An exercise is a folder with an `exercise.py` that defines `EXERCISE` (see spec.py). The engine looks in
`solutions/*/` of this checkout, then in every folder named by `--exercises-dir` or the environment
variable GRADER_EXERCISES (os.pathsep-separated): each such folder is an exercise folder itself or holds
exercise folders. Nothing in grader/ names an exercise.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

from .spec import Exercise

ROOT = Path(__file__).resolve().parents[2]
ENV = "GRADER_EXERCISES"
_CACHE: dict[tuple, dict[str, Exercise]] = {}


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


def _load(path: Path) -> Exercise:
    name = f"grader_exercise_{path.parent.name}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ExerciseError("exercise.broken", path=str(path), error=f"{type(err).__name__}: {err}") from err
    exercise = getattr(module, "EXERCISE", None)
    if not isinstance(exercise, Exercise):
        raise ExerciseError("exercise.broken", path=str(path), error="no EXERCISE = Exercise(...)")
    from ..feedback import messages
    messages.add(exercise.name, exercise.messages)
    return replace(exercise, folder=str(path.parent))


def available(extra: list[str] | None = None) -> dict[str, Exercise]:
    """Every exercise on the search path, by name (the first of a name wins)."""
    key = tuple(str(p) for p in search_path(extra))
    if key in _CACHE:
        return _CACHE[key]
    found: dict[str, Exercise] = {}
    for folder in search_path(extra):
        candidates = [folder / "exercise.py"] if (folder / "exercise.py").is_file() else sorted(folder.glob("*/exercise.py"))
        for path in candidates:
            exercise = _load(path)
            found.setdefault(exercise.name, exercise)
    _CACHE[key] = found
    return found


def get(name: str, extra: list[str] | None = None) -> Exercise:
    exercises = available(extra)
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
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def infer(path: Path | None, source: str | None, extra: list[str] | None = None) -> Exercise:
    """The exercise a submission is for: the only one there is; else the one its file or folder names;
    else the one whose functions it defines (the most specific). Raises ExerciseError when it cannot tell."""
    exercises = available(extra)
    if not exercises:
        raise ExerciseError("exercise.none")
    if len(exercises) == 1:
        return next(iter(exercises.values()))
    if path is not None:
        parts = [p.lower() for p in Path(path).parts[-4:]]
        named = [ex for ex in exercises.values()
                 if any(stem and any(stem.lower() in Path(part).stem for part in parts) for stem in (ex.name, *ex.files))]
        if len(named) == 1:
            return named[0]
    defined = _defined_functions(source)
    matching = [ex for ex in exercises.values() if ex.defines and set(ex.defines) <= defined]
    if matching:
        most = max(len(ex.defines) for ex in matching)
        best = [ex for ex in matching if len(ex.defines) == most]
        if len(best) == 1:
            return best[0]
    raise ExerciseError("exercise.ambiguous", known=", ".join(sorted(exercises)))
