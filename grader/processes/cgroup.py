"""The memory cgroup that holds every rank of one grader (isolate's cg.c): many ranks at their per-rank limit
at once cannot exhaust the machine, and an out-of-memory kill there is the student's "memory limit"."""
from __future__ import annotations

import os
import time


def machine_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def default_total_mb(graders: int = 1) -> int:
    """Memory for every rank of one grader: 3/4 of the machine, shared by `graders` graders running at once."""
    return max(1024, machine_memory_mb() * 3 // 4 // max(1, graders))


class MemoryCgroup:
    """A cgroup (v1 memory controller) holding every rank of one Runner, so that many ranks at their
    per-rank limit at once cannot exhaust the machine: the kernel's OOM killer then picks a rank of
    this cgroup, and the verdict is "memory limit". Best effort: None where cgroups cannot be made."""

    ROOT = "/sys/fs/cgroup/memory"

    def __init__(self, path: str, limit_mb: int):
        self.path, self.limit_mb = path, limit_mb

    @classmethod
    def create(cls, name: str, limit_mb: int) -> MemoryCgroup | None:
        """`name` starts with "grader-<pid>-": cgroups of graders that died are removed on the way."""
        try:
            with open("/proc/self/cgroup") as f:
                rel = next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] == "memory")
            parent = os.path.join(cls.ROOT, rel.lstrip("/"))
            cls._sweep(parent)
            path = os.path.join(parent, name)
            os.mkdir(path)
            with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit_mb << 20))
            return cls(path, limit_mb)
        except (OSError, StopIteration, IndexError):
            return None

    @staticmethod
    def _sweep(parent: str) -> None:
        for entry in os.scandir(parent):
            pid = entry.name.split("-")[1] if entry.name.startswith("grader-") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(entry.path)
                except OSError:
                    pass

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_kills(self) -> int:
        try:
            with open(os.path.join(self.path, "memory.oom_control")) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def remove(self, patience: float = 2.5) -> None:
        """Remove the cgroup once its last process has left (the zygote's pods take ~10 ms to end after it):
        tried again after 1 ms, then twice as long each time up to 50 ms, for `patience` seconds in all."""
        deadline, pause = time.monotonic() + patience, 0.001
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:  # processes still leaving
                if time.monotonic() >= deadline:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.05)


def join_cgroup(procs_file: str) -> None:
    """Called by a rank, still root: move itself into the grader's memory cgroup."""
    with open(procs_file, "w") as f:
        f.write(str(os.getpid()))
