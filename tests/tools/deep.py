"""Folders nested deeper than Python's recursion limit, made and removed without recursion (os.makedirs and
shutil.rmtree both recurse). Used by the red-team tests of issue 10."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def make_deep(base: Path, depth: int, name: str = "d", file: str | None = None, data: bytes = b"") -> Path:
    """base/d/d/.../d (`depth` folders); with `file`, a file of `data` at the bottom. Returns the deepest path."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        if file is not None:
            out = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
            os.write(out, data)
            os.close(out)
    finally:
        os.close(fd)
    return Path(base, *([name] * depth))


def remove_deep(top: Path) -> None:
    """Remove a tree of any depth: pull each grandchild up one level, then remove the emptied child."""
    top = Path(top)
    while True:
        children = [c for c in top.iterdir() if c.is_dir() and not c.is_symlink()]
        if not children:
            break
        for child in children:
            grandchildren = [g for g in child.iterdir() if g.is_dir() and not g.is_symlink()]
            for i, grandchild in enumerate(grandchildren):
                grandchild.rename(top / f".up-{child.name}-{i}")
            shutil.rmtree(child)
            for i in range(len(grandchildren)):
                (top / f".up-{child.name}-{i}").rename(top / f"{child.name}-{i}" if i else child)
    shutil.rmtree(top)
