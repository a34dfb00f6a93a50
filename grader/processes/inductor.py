"""torch.compile in ranks, made cheap by the zygote: a precompiled header built by the grader, and a warm-up.

A rank that compiles a step builds a C++ kernel with g++, and ~1.2 of the ~1.7 s that g++ takes go to parsing
inductor's prelude (`torch/csrc/inductor/cpp_prefix.h` and the ATen headers it includes); a rank's first
compile also imports ~200 more modules and sets up inductor's pattern matchers (~0.7 s). Every rank of every
run paid both. Here the zygote pays them once, before it forks the ranks of a submission that compiles:

- `warm_up()` compiles a function of the grader's own with inductor's precompiled headers turned on, in the
  zygote (a trusted process: no student code has run in it). Inductor builds the header (`.h` + a `.gch` of
  ~130 MB, made aside and moved in whole) under HEADERS, a folder of the grader's user that persists between gradings (built once per
  machine and torch: ~5 s), or finds it there through a manifest (no preprocessing of the prelude); the
  warm-up's own kernel is kept beside it (`inductor-warm-up`), so a later zygote skips its g++ too.
- Every run's root holds HEADERS read-only (tree.CODE), and a rank's inductor asks `_precompile_header` for
  the header of its compile command: it gets the one the zygote built for that same command line, or None
  (compile without one). A rank never builds, preprocesses or writes a header, and takes no lock for one.

Nothing compiled from student code is shared: each rank still compiles its own kernels in its own /tmp. What
ranks share is the grader's header, read-only, and the zygote's memory (modules and inductor's set-up). A
machine where the warm-up fails (no g++, no room for the header) compiles as before: every rank from
scratch, correct and slower.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

# torch.compile in a rank: no pool of compile workers (processes a rank's budget has no room for), scalar C++
# kernels (the vectorized ones take g++ ~10 s per rank to compile, the scalar ones ~2 s: a grading's tensors
# are small), and no precompiled header of a rank's own (hundreds of MB, past a rank's file-size limit):
# warm_up() turns on the grader's. Read when inductor is imported.
ENVIRONMENT = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1",
               "TORCHINDUCTOR_VEC_ISA_OK": "0"}
HEADERS = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                       "grader", "inductor-headers")
_STATE: dict = {}   # "done": the warm-up ran; "headers": {(header, command line): header path}


def set_environment() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def _own_folder(path: str) -> str | None:
    """`path`, made (mode 0755) if it can be; None where it cannot, or where it or its parent is not the
    grader user's own alone (a folder another user could write could hand ranks a header, or this zygote a
    kernel, of theirs)."""
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
        stats = [os.stat(path), os.stat(os.path.dirname(path))]
    except OSError:
        return None
    return path if all(st.st_uid == os.geteuid() and not st.st_mode & 0o022 for st in stats) else None


def warm_up() -> bool:
    """Once per zygote, after torch._inductor is imported: build or find the precompiled header, compile
    the grader's own small function so that a rank's first compile finds inductor set up, and leave the
    ranks' `_precompile_header` answering from what was built. Whether headers are in use."""
    if "done" in _STATE:
        return bool(_STATE.get("headers"))
    _STATE["done"] = True
    folder = _own_folder(HEADERS)
    scratch = _own_folder(os.path.join(os.path.dirname(HEADERS), "inductor-warm-up"))
    if folder is None or scratch is None or shutil.which("g++") is None:
        return False
    import torch
    from torch._inductor import codecache, config

    original = codecache._precompile_header
    try:
        manifest = _manifest_path(folder, torch)
    except (OSError, subprocess.SubprocessError):   # no prelude, a compiler that does not answer
        return False
    built = _read_manifest(manifest, folder)
    known = dict(built)

    def recording(header, command_line, **options):
        """Inductor's own build (it preprocesses the header, ~0.7 s, and builds it), unless this machine's
        manifest already names a header for this command line."""
        key = (header, command_line)
        if not _usable(built.get(key)):
            built[key] = _built_whole(codecache, original, folder, header, command_line, options)
        return built[key]

    saved_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # scratch keeps the warm-up kernel's own build for the next zygote (g++ ~0.5 s); the graph caches stay
    # off, so that inductor lowers and generates code (and imports what that takes) as a rank's compile will
    codecache._precompile_header = recording
    config.cpp_cache_precompile_headers = True
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = scratch
    # g++ runs as this process's child: the zygote's SIGCHLD handler must not reap it before subprocess does
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        with config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
            torch.compile(_scaled)(torch.ones(8), 2)
        codecache.torch_key()   # a hash of torch's ~2,300 source files, for the graph cache's keys (~0.1 s)
        codecache.CacheBase.get_system()
        ok = all(_usable(path) for path in built.values()) and bool(built)
        for path in built.values() if ok else ():   # ranks run as other users: whatever this process's umask was
            for name in (path, path + ".gch"):
                os.chmod(name, 0o644)
    except Exception:  # noqa: BLE001  (no toolchain, no room: ranks compile without a header, as before)
        ok = False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if saved_env is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_env
        torch._dynamo.reset()
    if not ok:
        codecache._precompile_header = original
        config.cpp_cache_precompile_headers = False
        return False
    if built != known:
        _write_manifest(manifest, built)
    _STATE["headers"] = dict(built)
    codecache._precompile_header = _prebuilt
    return True


def _built_whole(codecache, original, folder: str, header: str, command_line: str, options: dict) -> str:
    """Inductor's build of a header, made in a folder of this zygote's own and then moved into `folder`, the
    .gch before the .h: a zygote killed half-way through a build (a batch's worker past its budget) never
    leaves a half-written header that a later zygote would take for built. Builds older than an hour that such
    a zygote left behind are removed first."""
    for stale in os.listdir(folder):
        path = os.path.join(folder, stale)
        try:
            if stale.startswith(".building-") and os.stat(path).st_mtime < time.time() - 3600:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass
    private = tempfile.mkdtemp(prefix=".building-", dir=folder)
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = private, os.path.join(private, "locks")
    try:
        made = original(header, command_line, **options)
        final = os.path.join(folder, os.path.basename(made))
        os.replace(made + ".gch", final + ".gch")
        os.replace(made, final)
        return final
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _manifest_path(folder: str, torch) -> str:
    """Which header each compile command uses, for this torch (its version, place and prelude) and this
    compiler: a later zygote skips inductor's preprocessing of the header to find it."""
    prelude = os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "inductor", "cpp_prefix.h")
    st = os.stat(prelude)
    compiler = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=30).stdout
    key = "\n".join([torch.__version__, torch.__file__, f"{st.st_size} {st.st_mtime_ns}", compiler])
    return os.path.join(folder, f"manifest-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json")


def _read_manifest(path: str, folder: str) -> dict:
    """{(header, command line): header path} of the headers still there, all in `folder`."""
    try:
        with open(path) as f:
            rows = json.load(f)
        return {(h, c): p for h, c, p in rows if all(isinstance(x, str) for x in (h, c, p))
                and os.path.dirname(p) == folder and _usable(p)}
    except (OSError, ValueError, TypeError):
        return {}


def _write_manifest(path: str, built: dict) -> None:
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".manifest-")
        with os.fdopen(fd, "w") as f:
            json.dump([[h, c, p] for (h, c), p in sorted(built.items())], f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:   # the next zygote preprocesses the header again to find it
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _scaled(x, n):
    return x * n + 1


def _usable(path) -> bool:
    return isinstance(path, str) and os.access(path, os.R_OK) and os.access(path + ".gch", os.R_OK)


def _prebuilt(header, command_line, **options):
    """A rank's `_precompile_header`: the zygote's header for this exact command line, if the rank can read
    it (a run without its own root cannot read the grader's home); None compiles without one."""
    path = _STATE.get("headers", {}).get((header, command_line))
    return path if path is not None and _usable(path) else None
