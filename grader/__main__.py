"""`python -m grader ...`, and the venv's `grader` console script (pyproject.toml): see cli.py."""
import atexit
import importlib.util
import os
import sys

# numpy's OpenBLAS starts a thread pool in every process that imports it (the supervisor, batch workers, the
# zygote): ~0.1 s of CPU each, taken from the ranks beside it, for the small arrays the grader never hands to
# BLAS. One thread unless the caller chose otherwise (ranks get the zygote's OpenBLAS, set up at its import).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _leave(code) -> None:
    """Exit as sys.exit would, after the atexit handlers (a zygote's stop, temporary folders), without the
    interpreter's teardown of every module it imported (~30 ms, after the work is done and written)."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: what is left unwritten cannot be written
            pass
    os._exit(code & 0xFF)


# Said before any of the grader can be imported (its message catalog needs numpy too), so kept here, in both
# languages: a Python without the grader's dependencies (the system's, not the venv's) gets this, not a traceback.
NO_DEPENDENCY = {
    "zh": "{python} 里没有 {module} 模块：评分器要用它的虚拟环境运行：.venv/bin/grader 或 .venv/bin/python -m grader（见 README 的 Set up 一节）。",
    "en": "{python} has no module named {module}: the grader runs in its venv: .venv/bin/grader or "
          ".venv/bin/python -m grader (README, \"Set up\").",
}


def _missing_dependency() -> str | None:
    for module in ("numpy", "torch"):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def run() -> None:
    """The command line: `python -m grader` and the `grader` script both come here, so that both start the
    zygote (its torch import) before the command line's own imports, and both leave without the teardown."""
    missing = _missing_dependency()
    if missing:
        lang = "en" if (os.environ.get("LANG", "") or os.environ.get("LC_ALL", "")).lower().startswith("en") else "zh"
        print(NO_DEPENDENCY[lang].format(python=sys.executable, module=missing), file=sys.stderr)
        _leave(2)
    if len(sys.argv) > 1 and sys.argv[1] in ("grade", "check", "batch"):
        from .processes import launch   # the zygote's torch import runs beside the imports below
        if sys.argv[1] == "batch":
            launch.start_template()     # its workers' zygotes are forks of this one
        else:
            launch.prestart()
    from .cli import main
    prog = "python -m grader" if sys.argv[0].endswith("__main__.py") else os.path.basename(sys.argv[0])
    try:
        status = main(prog=prog)
    except SystemExit as stop:
        status = stop.code
    _leave(status)


if __name__ == "__main__":
    run()
