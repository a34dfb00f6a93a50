"""What README.md and docs/*.md name exists: every module path (`grader/...`, `grader.x.y`, attributes
included), every `python -m grader <verb>` and the options written after it, every option named alone
(`--lang`) and every `<verb> --option` mention. The command line comes from grader.cli.build_parser, so
the docs cannot drift from it again."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from conftest import ROOT
from grader.cli import build_parser

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])grader/[\w/.]*\w")
DOTTED = re.compile(r"(?<![\w/.-])grader(?:\.\w+)+")
# `python -m grader VERB`, `.venv/bin/grader VERB`, and the console script `grader VERB` opening a line or a span
COMMAND = re.compile(r"(?:python -m |\.venv/bin/(?=grader )|^(?=grader )|(?<=`)(?=grader ))(grader(?:\.[\w.]+)?)\b([^`#|]*)")
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
SPAN = re.compile(r"`([^`]+)`")
# options of other tools that the docs name alone, with the tool the same page shows them with
FOREIGN = {"--force": "nbgrader generate_assignment"}


def _verbs() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: {opt for action in p._actions for opt in action.option_strings} for verb, p in sub.choices.items()}


VERBS = _verbs()


def _lines(text: str) -> list[str]:
    """The page's lines, a shell line continued with a backslash joined to the next."""
    return text.replace("\\\n", " ").splitlines()


def _resolve(dotted: str) -> bool:
    """A module, or an attribute of one (grader.integrations.release.STUB)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def missing_modules(text: str) -> list[str]:
    return [p for p in PATH.findall(text) if not (ROOT / p).exists()] + [d for d in DOTTED.findall(text) if not _resolve(d)]


def wrong_commands(text: str) -> list[str]:
    every = set().union(*VERBS.values())
    wrong = []
    for line in _lines(text):
        for module, rest in COMMAND.findall(line):
            if module != "grader":   # python -m grader.integrations.release --all
                source = Path(importlib.import_module(module).__file__).read_text(encoding="utf-8")
                wrong += [f"{module} {opt}" for opt in OPTION.findall(rest) if f'"{opt}"' not in source]
                continue
            verb = (rest.split() or [""])[0]
            if verb in ("", "--help", "-h"):   # the command alone, or its usage
                continue
            if verb not in VERBS:
                wrong.append(f"python -m grader {verb}")
                continue
            wrong += [f"{verb} {opt}" for opt in OPTION.findall(rest) if opt not in VERBS[verb]]
        for span in SPAN.findall(line):
            words = span.split()
            if not words or "python -m" in span:
                continue
            if words[0] in VERBS and len(words) > 1 and words[1].startswith("--"):   # `grade --results`
                wrong += [f"{words[0]} {opt}" for opt in OPTION.findall(span) if opt not in VERBS[words[0]]]
            elif words[0].startswith("--"):                                         # `--lang en`
                opt = words[0].split("=")[0]
                if opt not in every and FOREIGN.get(opt, "\0") not in text:
                    wrong.append(opt)
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_path_named_exists(doc):
    assert missing_modules(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_and_option_named_exists(doc):
    assert wrong_commands(doc.read_text(encoding="utf-8")) == []


def test_the_rules_find_what_does_not_exist():
    text = """Workers run `grader.batch.worker_main`; see grader/checks.py and `grader.comm.OPS`, grader/api.py.
```
python -m grader check answer.py --lang en --results r.json    # check writes no results.json
python -m grader grade x.py \\
    --exercise NAME --no-such-option
python -m grader regrade x.py
.venv/bin/grader check a.py --jobs 2
grader regrade x.py
python -m grader.integrations.release --all --every
```
Use `--lang zh`, `--langs`, `batch --jobs 2`, `check --jobs 2` and `--force` (nbgrader's, named without its command).
"""
    assert missing_modules(text) == ["grader/checks.py", "grader.batch.worker_main"]
    assert wrong_commands(text) == ["check --results", "grade --no-such-option", "python -m grader regrade",
                                    "check --jobs", "python -m grader regrade", "grader.integrations.release --every", "--langs", "check --jobs", "--force"]
