"""`python -m grader gradescope-zip`: the zip's layout, and run_autograder against a temporary /autograder."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, PY, run_cli, stretched


def build_root(tmp_path: Path, exercise: str = "dist_primitives", lang: str = "en") -> Path:
    """A temporary autograder root laid out as Gradescope does: source/ (the unpacked zip), submission/."""
    proc = run_cli("gradescope-zip", "--exercise", exercise, "--out", str(tmp_path / "autograder.zip"), "--lang", lang,
                   "--time-limit", "10")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(tmp_path / "autograder.zip") as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "pyproject.toml", "grader/cli.py", "grader/processes/zygote.py"} <= names
        for info in zf.infolist():
            if info.filename in ("setup.sh", "run_autograder"):
                assert (info.external_attr >> 16) & stat.S_IXUSR
        zf.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / name, 0o755)
    (root / "submission").mkdir()
    return root


def run_autograder(root: Path, python: str, **extra: str) -> dict:
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "GRADER_PYTHON": python, **extra}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([shutil.which("bash"), str(root / "source" / "run_autograder")], cwd=root, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=stretched(120))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    return json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


def test_setup_installs_torch_cpu_numpy_and_the_grader(tmp_path):
    proc = run_cli("gradescope-zip", "--exercise", "dist_primitives", "--out", str(tmp_path / "a.zip"))
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        setup = zf.read("setup.sh").decode()
        first = zf.read("run_autograder")
    assert "torch==2.13.0" in setup and "download.pytorch.org/whl/cpu" in setup and "numpy" in setup
    assert "pip install -q .      # numpy, ipython (torch is there already)" in setup
    run_cli("gradescope-zip", "--exercise", "dist_primitives", "--out", str(tmp_path / "b.zip"))
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()   # reproducible
    assert b'ROOT="${AUTOGRADER_ROOT:-/autograder}"' in first and b"$ROOT/submission" in first


@pytest.mark.timeout(150)
def test_run_autograder_grades_the_submission_folder(tmp_path):
    root = build_root(tmp_path)
    shutil.copy(FIXTURES / "batch" / "summed.py", root / "submission" / "solution.py")
    results = run_autograder(root, PY)
    assert results["score"] == 55
    assert len(results["tests"]) == 8 and {t["visibility"] for t in results["tests"]} == {"visible", "after_published"}
    assert not list((root / "results").glob(".*.tmp"))


@pytest.mark.timeout(60)
def test_run_autograder_writes_results_even_when_the_grader_cannot_start(tmp_path):
    root = build_root(tmp_path)
    shutil.copy(FIXTURES / "batch" / "honest.py", root / "submission" / "solution.py")
    results = run_autograder(root, "/bin/false")
    assert results["score"] == 0
    assert results["tests"][0]["name"] == "Autograder failed" and results["tests"][0]["visibility"] == "visible"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zip_lang, course_lang, title", [
    ("zh", None, "自动评分器出错"), ("zh", "en", "Autograder failed"), ("en", "zh", "自动评分器出错")])
def test_the_fallback_without_python_speaks_the_students_language(tmp_path, zip_lang, course_lang, title):
    """No Python at all (the grader cannot start): the zero that run_autograder writes is in the language the
    report would have been in, the zip's or the course's GRADER_LANG."""
    root = build_root(tmp_path, lang=zip_lang)
    shutil.copy(FIXTURES / "batch" / "honest.py", root / "submission" / "solution.py")
    tools = tmp_path / "bin"   # the shell's tools, and no python3 anywhere on the path
    tools.mkdir()
    for tool in ("mkdir", "rm", "cat", "timeout", "bash"):
        os.symlink(shutil.which(tool), tools / tool)
    extra = {"GRADER_LANG": course_lang} if course_lang else {}
    results = run_autograder(root, "/nonexistent/python", PATH=str(tools), **extra)
    assert results["score"] == 0 and results["tests"][0]["name"] == title
    assert results["output"] == results["tests"][0]["output"] and results["output"]
