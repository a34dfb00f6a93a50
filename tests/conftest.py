"""Shared helpers: grade fixture submissions through the real command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PY = sys.executable
CLI_TIMEOUT = 120


def run_cli(*args: str, timeout: float = CLI_TIMEOUT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m grader ARGS` from the repository root; killed by process group if it overruns."""
    proc = subprocess.Popen([PY, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def grade_cli(path: Path, tmp_path: Path, *extra: str, lang: str = "en") -> tuple[dict, subprocess.CompletedProcess]:
    """`grade PATH --results ...`: (results.json as a dict, the finished process)."""
    results = tmp_path / f"{Path(path).name}.results.json"
    proc = run_cli("grade", str(path), "--results", str(results), "--lang", lang, *extra)
    assert results.exists(), proc.stderr
    return json.loads(results.read_text(encoding="utf-8")), proc


def scores_by_name(results: dict) -> dict:
    return {t["name"]: t["score"] for t in results["tests"]}


def outcomes(results: dict) -> dict:
    return results["extra_data"]["outcomes"]


@pytest.fixture
def grade(tmp_path):
    def _grade(path, *extra, lang="en"):
        return grade_cli(path, tmp_path, *extra, lang=lang)
    return _grade


# The files that take longest go to the workers first (--dist loadfile hands out files in collection
# order): the workers then finish together instead of one running the last big file alone.
SLOWEST_FIRST = ["test_grade_fixtures.py", "test_ring_allreduce.py", "test_sandbox.py", "test_zero_sharded_step.py",
                 "test_grad_accum_no_sync.py", "test_hierarchical_allreduce.py", "test_fp16_allreduce.py",
                 "test_cli.py", "test_batch.py", "test_nbgrader_e2e.py", "test_notebook.py", "test_discovery.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)
    items.sort(key=rank)   # stable: each file keeps its own order
