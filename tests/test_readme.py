"""Every command README.md shows works as written, from the repository root: each `sh` block's lines are
taken in order, as a newcomer types them. The grader's own commands that name nothing to fill in really
run (`list`, `--help`, `check` of the stub the README copies, filled in as a student would), each through
the code the `grader` console script runs; those with placeholders (`SUBMISSION`, `[--exercise NAME]`,
`zh|en`) go through the real parser, every variant. Commands that make a venv or install into one are
checked for what they name: the make target, the module, the torch pin, the index, the project.
"""
from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import CLI_TIMEOUT, PY, ROOT, run_cli, stretched
from grader.cli import build_parser
from grader.integrations import release

README = ROOT / "README.md"
PLACEHOLDER = re.compile(r"\b[A-Z]{2,}\b|\[|\|")
GRADER = (".venv/bin/grader",)
GRADER_MODULE = (".venv/bin/python", "-m", "grader")
# exactly what pip writes into .venv/bin/grader for pyproject's [project.scripts] entry
CONSOLE_SCRIPT = "import sys; from {module} import {attr}; sys.argv[0] = 'grader'; sys.exit({attr}())"


def commands(text: str) -> list[list[str]]:
    """The words of each command line of the page's `sh` blocks, comments left out, in order."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def variants(args: list[str]) -> list[list[str]]:
    """A placeholder command's argument lists: each `[...]` left out and put in, each `a|b` one of its
    choices, NAME an exercise, other capitals a file."""
    text = " ".join(args)
    optional = re.findall(r"\[([^\]]*)\]", text)
    out = []
    for keep in itertools.product((False, True), repeat=len(optional)):
        parts = iter(keep)
        line = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1) if next(parts) else "", text)
        choices = [w.split("|") for w in line.split()]
        for words in itertools.product(*choices):
            out.append([{"NAME": "dist_primitives"}.get(w, w) for w in words])
    return out


def fill(stub: str, solution: str) -> str:
    """The stub with each of its `raise NotImplementedError(...)` lines replaced by the solution's region:
    what a student hands in who wrote the instructor's answer."""
    regions = iter(re.findall(rf"^[ \t]*{release.BEGIN}\n(.*?)^[ \t]*{release.END}\n", solution, re.S | re.M))
    filled = re.sub(rf"^[ \t]*{re.escape(release.STUB)}\n", lambda m: next(regions), stub, flags=re.M)
    assert next(regions, None) is None
    return filled


def console_script() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, attr = scripts["grader"].split(":")
    return CONSOLE_SCRIPT.format(module=module, attr=attr)


def run_script(*args: str) -> subprocess.CompletedProcess:
    """`.venv/bin/grader ARGS`: the console script's code, by this venv's Python, from the repository root."""
    return subprocess.run([PY, "-c", console_script(), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=stretched(CLI_TIMEOUT))


def grader_args(words: list[str]) -> list[str] | None:
    for prefix in (GRADER, GRADER_MODULE):
        if tuple(words[:len(prefix)]) == prefix:
            return words[len(prefix):]
    return None


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))


def check_install(words: list[str]) -> None:
    """`.venv/bin/pip install torch==V --index-url URL` or `.venv/bin/pip install -e .`"""
    assert words[:2] == [".venv/bin/pip", "install"], words
    rest = words[2:]
    if rest[:2] == ["-e", "."]:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        assert project["name"] and "grader" in project["scripts"]
        assert len(rest) == 2, words
        return
    (package,) = [w for w in rest if "==" in w]
    name, pinned = package.split("==")
    assert name == "torch"
    assert f"torch=={pinned}" in (ROOT / "Makefile").read_text(encoding="utf-8")   # what make venv installs
    assert version("torch").split("+")[0] == pinned                                    # what the tests run on
    index = rest[rest.index("--index-url") + 1]
    assert index.startswith("https://download.pytorch.org/whl/cpu"), index


def test_the_readme_commands_work_as_written(tmp_path):
    lines = commands(README.read_text(encoding="utf-8"))
    copied: dict[str, Path] = {}
    ran = []
    for words in lines:
        args = grader_args(words)
        if words[0] == "make":
            assert set(words[1:]) <= makefile_targets(), words
        elif words[:3] == ["python3", "-m", "venv"]:
            assert words[3:] == [".venv"]
        elif words[0] == ".venv/bin/pip":
            check_install(words)
        elif words[0] == "cp":
            source, target = words[1:]
            assert (ROOT / source).is_file(), source
            name = Path(source).stem
            solution = (ROOT / "solutions" / name / f"{name}.py").read_text(encoding="utf-8")
            copied[target] = tmp_path / target
            copied[target].write_text(fill((ROOT / source).read_text(encoding="utf-8"), solution), encoding="utf-8")
        elif args is not None and PLACEHOLDER.search(" ".join(args)):
            for variant in variants(args):
                build_parser().parse_args(variant)   # argparse exits (a test failure) on what it does not take
        elif args is not None:
            args = [str(copied.get(a, a)) for a in args]
            proc = run_script(*args) if "--help" in args else run_cli(*args)
            assert proc.returncode == 0, (words, proc.stdout[-2000:], proc.stderr[-2000:])
            assert "Traceback" not in proc.stdout + proc.stderr
            ran.append((args, proc.stdout))
        else:
            pytest.fail(f"README shows a command this test does not check: {' '.join(words)}")
    outputs = {" ".join(args): out for args, out in ran}
    assert "dist_primitives" in outputs["list"]
    (check,) = [out for args, out in outputs.items() if args.startswith("check ") and "--help" not in args]
    assert "[FAIL]" not in check and "[PASS]" in check
    assert outputs["--help"].startswith("usage: grader ")   # the console script's own name
    assert "--lang" in outputs["check --help"]


def test_the_filled_stub_is_the_solution_without_markers():
    """The stub the README copies, filled in, is the instructor's answer (so `check` passing it proves the
    student's route works), and the unfilled stub fails: the test above could not pass on the stub alone."""
    stub = (ROOT / "assignments/dist_primitives/dist_primitives.py").read_text(encoding="utf-8")
    solution = (ROOT / "solutions/dist_primitives/dist_primitives.py").read_text(encoding="utf-8")
    filled = fill(stub, solution)
    assert release.STUB not in filled and "run_worker" in filled
    assert filled == "".join(line for line in solution.splitlines(keepends=True)
                             if line.strip() not in (release.BEGIN, release.END))


def test_a_python_without_the_dependencies_is_told_to_use_the_venv():
    """`python3 -m grader` with the system's Python (no numpy there): a sentence naming the venv's commands,
    in the student's language, not an import traceback."""
    hide = "import sys, runpy; sys.modules['numpy'] = None; runpy.run_module('grader', run_name='__main__')"
    for lang, words in (("en_US.UTF-8", "has no module named numpy"), ("zh_CN.UTF-8", "里没有 numpy 模块")):
        proc = subprocess.run([PY, "-c", hide, "list"], cwd=ROOT, capture_output=True, text=True,
                              timeout=stretched(CLI_TIMEOUT),
                              env={"PATH": "/usr/bin:/bin", "LANG": lang})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert words in proc.stderr and ".venv/bin/python -m grader" in proc.stderr
