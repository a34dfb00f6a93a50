"""Build autograder.zip for Gradescope.

    python -m grader gradescope-zip --exercise NAME [--out autograder.zip] [--lang zh|en] [--time-limit S]

Gradescope unpacks the zip into /autograder/source, runs setup.sh there once when it builds the image,
then for every submission copies run_autograder to /autograder/run_autograder and runs it; the student's
files are in /autograder/submission and the grade must be in /autograder/results/results.json.

The root is $AUTOGRADER_ROOT (default /autograder) and the interpreter $GRADER_PYTHON (default the venv
setup.sh made), so a test can run the same script against a temporary root. run_autograder always
writes results.json: if `grade` dies without one, a shell fallback writes an "autograder failed" zero.
"""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

from ..exercise import registry
from ..feedback.messages import default_lang, render

ROOT = Path(__file__).resolve().parents[2]
TORCH_VERSION = "2.13.0"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)   # same inputs, same zip bytes

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, in /autograder/source, when it builds the autograder image.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
cd "$(dirname "$0")"
if command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv python3-pip util-linux
fi
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install -q --upgrade pip
"$ROOT/venv/bin/python" -m pip install -q --index-url {index} torch=={torch} \\
    || "$ROOT/venv/bin/python" -m pip install -q torch=={torch}
"$ROOT/venv/bin/python" -m pip install -q numpy
"$ROOT/venv/bin/python" -m pip install -q .      # numpy, ipython (torch is there already)
# warm-up: import torch once, so that the first submission does not pay for .pyc compilation
"$ROOT/venv/bin/python" -c "import torch, torch.distributed, grader.cli"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade $ROOT/submission into $ROOT/results/results.json.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
LANGUAGE="${{GRADER_LANG:-{lang}}}"   # the zip's language unless the course sets GRADER_LANG: the report's and the fallback's
SOURCE="$ROOT/source"
RESULTS="$ROOT/results/results.json"
PY="${{GRADER_PYTHON:-$ROOT/venv/bin/python}}"
[ -x "$PY" ] || PY="$(command -v python3)"
mkdir -p "$ROOT/results"
rm -f "$RESULTS"
cd "$SOURCE" || cd "$ROOT"
export PYTHONPATH="$SOURCE${{PYTHONPATH:+:$PYTHONPATH}}"
status=0
timeout -k 10 "${{GRADER_TOTAL_TIMEOUT:-900}}" "$PY" -m grader grade "$ROOT/submission" --results "$RESULTS" \\
    --exercise {exercise} --lang "$LANGUAGE" --time-limit {time_limit} --memory-mb {memory_mb} --tmp-mb {tmp_mb} \\
    --backend {backend} || status=$?
if [ ! -s "$RESULTS" ]; then
    # The grader died before writing anything (no Python, say): a visible zero, never a missing file, in the
    # language the report would have had.
    if [ "$LANGUAGE" = en ]; then
        cat > "$RESULTS" <<'JSON'
{fallback_en}
JSON
    else
        cat > "$RESULTS" <<'JSON'
{fallback_zh}
JSON
    fi
    echo "grader exited with status $status and wrote no results" >&2
fi
exit 0
"""


def _fallback_json(lang: str) -> str:
    message = render("summary.grader_failed", {}, lang)
    return json.dumps({"score": 0, "output": message, "tests": [{
        "name": render("title.grader_failed", {}, lang), "score": 0, "max_score": 0, "status": "failed",
        "output": message, "visibility": "visible"}], "extra_data": {"grader_error": "run_autograder: no results"}},
        ensure_ascii=False)


def files(exercise, lang: str, time_limit: float, memory_mb: int, backend: str = "auto",
          tmp_mb: int = 64) -> dict[str, tuple[bytes, int]]:
    """Every file of the zip: name -> (bytes, unix mode). The grader, and the exercise's definition
    (never its solution)."""
    out = {
        "setup.sh": (SETUP_SH.format(index=TORCH_INDEX, torch=TORCH_VERSION).encode(), 0o755),
        "run_autograder": (RUN_AUTOGRADER.format(exercise=exercise.name, lang=lang, time_limit=time_limit,
                                                 memory_mb=memory_mb, backend=backend, tmp_mb=tmp_mb,
                                                 fallback_en=_fallback_json("en"),
                                                 fallback_zh=_fallback_json("zh")).encode(), 0o755),
        "pyproject.toml": ((ROOT / "pyproject.toml").read_bytes(), 0o644),
    }
    for path in sorted((ROOT / "grader").rglob("*.py")):
        out[path.relative_to(ROOT).as_posix()] = (path.read_bytes(), 0o644)
    out[f"solutions/{exercise.name}/exercise.py"] = ((Path(exercise.folder) / "exercise.py").read_bytes(), 0o644)
    return out


def build(out: Path, *, exercise, lang: str = "zh", time_limit: float = 15.0, memory_mb: int = 2048,
          backend: str = "auto", tmp_mb: int = 64) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (data, mode) in sorted(files(exercise, lang, time_limit, memory_mb, backend, tmp_mb).items()):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(out)
    return out


def run(args) -> int:
    lang = args.lang or default_lang()
    try:
        if not args.exercise:   # a zip is for one exercise, named: there is no submission to infer it from
            raise registry.ExerciseError("exercise.name_required", known=sorted(registry.available(args.exercises_dir)))
        exercise = registry.get(args.exercise, args.exercises_dir)
    except registry.ExerciseError as err:
        print(render(err.key, err.params, lang), file=sys.stderr)
        return 2
    path = build(Path(args.out), exercise=exercise, lang=lang, time_limit=args.time_limit, memory_mb=args.memory_mb,
                 backend=args.backend, tmp_mb=args.tmp_mb)
    print(render("gradescope.written", {"path": path}, lang), file=sys.stderr)
    return 0



def register(subparsers, add_common_options) -> None:
    p = subparsers.add_parser("gradescope-zip", help="build autograder.zip for Gradescope")
    p.add_argument("--out", default="autograder.zip", help="where to write the zip (default %(default)s)")
    add_common_options(p)
    p.set_defaults(func=run)

