"""Headless Chromium (Debian's, which .ci/run installs) for tests that read what a page shows: the DOM after
its script ran, every console message it logged, or a screenshot. Started with a fresh profile, reaching
nothing on the network, killed by process group if it overruns."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str:
    """Required in CI; elsewhere its absence skips, saying why."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs it with apt-get")
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does): the page was not opened in a browser")
    return found


def _run(args: list[str], profile: Path, timeout: float = 90) -> tuple[str, str]:
    proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def open_in_browser(url: str, profile: Path) -> tuple[str, list[str]]:
    """The DOM after the page's script ran, and every console message it logged."""
    dom, err = _run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000", "--dump-dom", url], profile)
    return dom, [line for line in err.splitlines() if ":CONSOLE" in line]


def screenshot(url: str, path: Path, profile: Path, size: tuple[int, int] = (1200, 700)) -> None:
    _run([f"--screenshot={path}", f"--window-size={size[0]},{size[1]}", "--hide-scrollbars", url], profile)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot of {url}"
