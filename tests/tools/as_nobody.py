"""Run a command as the unprivileged user nobody, as on a student's laptop, wherever this clone lives.

    python tests/tools/as_nobody.py CMD...        (as root)

nobody must reach three folders: this checkout, the venv's real folder and the interpreter's. Any of them
may lie below a folder nobody cannot enter (/root is mode 700 here; a clone made inside `mktemp -d` is below
a mode-700 folder). In a private mount namespace of its own, this tool covers each such folder with an empty
tmpfs and binds the needed folders back at their own paths (the checkout read-only), then drops to nobody
and runs CMD with HOME and TMPDIR at /tmp. The host's view of the files does not change.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from grader.processes.linux import (CLONE_NEWNS, MS_BIND, MS_PRIVATE, MS_RDONLY, MS_REC,  # noqa: E402
                                    MS_REMOUNT, mount, unshare)

NOBODY = 65534


def blocked_ancestor(path: str) -> str | None:
    """The highest folder above `path` that others cannot enter, if any."""
    current = "/"
    for part in [p for p in path.split("/") if p][:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def main(argv: list[str]) -> None:
    needed = {str(ROOT): True, os.path.realpath(sys.prefix): False, os.path.realpath(sys.base_prefix): False}
    blocked = {b for p in needed if (b := blocked_ancestor(p + "/x")) is not None}
    blocked = sorted(b for b in blocked if not any(b != c and b.startswith(c + "/") for c in blocked))
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in needed if any(p.startswith(b + "/") for b in blocked)}
    for folder in blocked:
        mount("tmpfs", folder, "tmpfs", 0, "mode=0755,size=64k")
    for path, fd in sorted(keep.items()):
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        if needed[path]:
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TMPDIR")}
    os.execvpe(argv[0], argv, {**env, "HOME": "/tmp", "TMPDIR": "/tmp"})


if __name__ == "__main__":
    main(sys.argv[1:])
