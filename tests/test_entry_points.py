"""Every grader module that runs with `python -m` (a top-level `if __name__ == "__main__":`) prints its
usage on `--help` and exits 0, without starting anything or a traceback."""
from __future__ import annotations

import ast
import subprocess

import pytest

from conftest import CLI_TIMEOUT, PY, ROOT


def runnable_modules() -> list[str]:
    found = []
    for path in sorted((ROOT / "grader").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
               for node in tree.body):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return found


def test_the_runnable_modules_are_found():
    assert {"grader", "grader.integrations.release", "grader.processes.zygote"} <= set(runnable_modules())


@pytest.mark.parametrize("module", runnable_modules())
def test_help_prints_the_usage(module):
    proc = subprocess.run([PY, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:") and f"python -m {module}" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
