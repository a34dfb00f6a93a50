"""Student versions are generated from the instructor's, for every exercise: the .py stub by
grader.integrations.release, the notebook by nbgrader (tests/test_nbgrader_e2e.py regenerates it); a
notebook's autograder cells are exactly the exercise's checks."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from conftest import CLI_TIMEOUT, PY, ROOT
from grader.exercise import registry
from grader.integrations import release
from grader.processes.limits import Limits

EXERCISES = sorted(registry.available())


def paths(name: str) -> dict:
    return {"solution_py": ROOT / "solutions" / name / f"{name}.py", "solution_nb": ROOT / "solutions" / name / f"{name}.ipynb",
            "release_py": ROOT / "assignments" / name / f"{name}.py", "release_nb": ROOT / "assignments" / name / f"{name}.ipynb"}


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def nbgrader_meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_every_exercise_has_its_files():
    assert "dist_primitives" in EXERCISES
    for name in EXERCISES:
        assert all(p.is_file() for p in paths(name).values()), name


@pytest.mark.parametrize("name", EXERCISES)
def test_py_stub_is_generated_from_the_solution(name):
    p = paths(name)
    assert p["release_py"].read_text(encoding="utf-8") == release.clear_solutions(p["solution_py"].read_text(encoding="utf-8"))


def test_nbgrader_config_uses_the_release_stub_and_folders():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert config.ClearSolutions.code_stub == {"python": release.STUB}
    assert config.CourseDirectory.source_directory == "solutions"
    assert config.CourseDirectory.release_directory == "assignments"
    assert Path(config.CourseDirectory.root) == ROOT
    assert "*.py" in config.CourseDirectory.ignore  # never copy the .py solution (nor exercise.py) into the release
    # a hanging entry function is ended by the grader (at most two rounds of runs) before nbgrader's cell timeout
    assert config.Execute.timeout >= 2 * Limits.wall_s + 20
    assert config.OverwriteCells.add_missing_cells is True
    # autograde restores untouched hidden-test cells without nbgrader's false "checksum has changed" alarm
    from grader.integrations.nbhidden import RestoreHiddenTests
    assert RestoreHiddenTests in config.Autograde.sanitize_preprocessors


@pytest.mark.parametrize("name", EXERCISES)
def test_a_released_hidden_test_cell_is_its_source_without_the_hidden_region(name):
    """What RestoreHiddenTests recognises as untouched is what nbgrader released, cell by cell."""
    from grader.integrations.nbhidden import released
    release_cells = {nbgrader_meta(c).get("grade_id"): c for c in cells(paths(name)["release_nb"])}
    hidden = [c for c in cells(paths(name)["solution_nb"]) if "### BEGIN HIDDEN TESTS" in source(c)]
    assert hidden
    for cell in hidden:
        assert released(source(cell)) == source(release_cells[nbgrader_meta(cell)["grade_id"]])


@pytest.mark.parametrize("name", EXERCISES)
def test_notebook_autograder_cells_are_the_exercises_checks(name):
    """One grade cell per check, in the rubric's order, with its points; hidden checks inside the hidden
    block. (Grade ids are the notebook's: a hidden one never names its world size.)"""
    exercise = registry.get(name)
    graded = [c for c in cells(paths(name)["solution_nb"]) if nbgrader_meta(c).get("grade")]
    assert len({nbgrader_meta(c)["grade_id"] for c in graded}) == len(graded) == len(exercise.checks)
    for check, cell in zip(exercise.checks, graded):
        text = source(cell)
        call = f'nbcheck.check("{check.id}", "{name}")'
        assert nbgrader_meta(cell)["points"] == check.points and nbgrader_meta(cell)["locked"]
        assert call in text, (check.id, text)
        if check.hidden:  # the whole check sits inside the hidden block
            inside = text.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            assert call in inside
            assert "nbcheck" not in text.split("### BEGIN HIDDEN TESTS")[0]
        else:
            assert "HIDDEN TESTS" not in text
    assert sum(nbgrader_meta(c)["points"] for c in graded) == exercise.total


# A number a name gives as a world size: ws3, ws_3, world_size3, 3ranks, 3-ranks, np3, 3procs, 3gpus
WORLD_SIZE_IN_NAME = re.compile(r"(?:ws|world_?size|np)[-_]?(\d+)(?![0-9])|(?<![0-9])(\d+)[-_]?(?:ranks?|procs?|gpus?)", re.I)


def named_world_sizes(text: str) -> set[int]:
    return {int(a or b) for a, b in WORLD_SIZE_IN_NAME.findall(text)}


def metadata_strings(value) -> list[str]:
    """Every key and string value of a cell's metadata, nbgrader's checksum left out (a hash of the released
    cell itself)."""
    if isinstance(value, dict):
        return [s for k, v in value.items() if k != "checksum" for s in (k, *metadata_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in metadata_strings(v)]
    return [value] if isinstance(value, str) else []


def test_the_world_size_rule_finds_what_it_must():
    assert named_world_sizes("test_ws3_all_reduce test-ws4-all-gather ws_5 8ranks 6-procs np7") == {3, 4, 5, 6, 7, 8}
    assert named_world_sizes("test_hidden_values_3 python3 ipython3 test_static_all_reduce") == set()


@pytest.mark.parametrize("name", EXERCISES)
def test_a_released_notebook_names_no_hidden_world_size(name):
    """The student's notebook names a hidden check's cell by its order, never its world size: no cell id,
    grade id or other metadata says `ws3` where 3 ranks are a hidden check's (notebook metadata too)."""
    exercise = registry.get(name)
    hidden = {c.world_size for c in exercise.checks if c.hidden} - {c.world_size for c in exercise.checks if not c.hidden}
    assert hidden
    nb = json.loads(paths(name)["release_nb"].read_text(encoding="utf-8"))
    names = metadata_strings(nb.get("metadata", {}))
    for cell in nb["cells"]:
        names += [cell.get("id", ""), *metadata_strings(cell.get("metadata", {}))]
    assert {s: named_world_sizes(s) & hidden for s in names if named_world_sizes(s) & hidden} == {}


@pytest.mark.parametrize("name", EXERCISES)
def test_release_notebook_has_no_answer_and_no_hidden_test(name):
    p, exercise = paths(name), registry.get(name)
    text = p["release_nb"].read_text(encoding="utf-8")
    for secret in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS"):
        assert secret not in text, secret
    for check in exercise.checks:
        if check.hidden:
            assert f'check(\\"{check.id}\\"' not in text
    answers = [c for c in cells(p["release_nb"]) if nbgrader_meta(c).get("solution")]
    assert answers and all(release.STUB in source(c) for c in answers)
    # the solution's own lines are gone from the student version
    released = {ln.strip() for c in answers for ln in source(c).splitlines()}   # hint comments may quote code
    for cell in cells(p["solution_nb"]):
        for block in re.findall(r"### BEGIN SOLUTION(.*?)### END SOLUTION", source(cell), re.S):
            for line in [ln.strip() for ln in block.splitlines() if len(ln.strip()) > 25]:
                assert line not in released, line


@pytest.mark.parametrize("name", EXERCISES)
def test_markdown_explains_in_chinese_and_english(name):
    locked_md = [source(c) for c in cells(paths(name)["solution_nb"])
                 if c["cell_type"] == "markdown" and nbgrader_meta(c).get("locked")]
    assert len(locked_md) >= 3
    for text in locked_md:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in text)           # Chinese
        assert sum(ch.isascii() and ch.isalpha() for ch in text) > 100   # with English


# -- a release never leaks: refused with the file and line, nothing written ---------------------------------

RELEASE_CMD = [PY, "-m", "grader.integrations.release"]


def release_cli(*args: str, cwd: Path = ROOT, lang: str = "en") -> subprocess.CompletedProcess:
    return subprocess.run([*RELEASE_CMD, *args], cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          env={**os.environ, "LANG": "en_US.UTF-8" if lang == "en" else "zh_CN.UTF-8"})


def refused(tmp_path: Path, solution: str, lang: str = "en") -> str:
    """`release SRC DST` of this solution: refused (exit 1, no traceback, no stub written); its message."""
    src, dst = tmp_path / "answer.py", tmp_path / "out" / "answer.py"
    src.write_text(solution, encoding="utf-8")
    proc = release_cli(str(src), str(dst), lang=lang)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not dst.exists()
    return proc.stderr


def test_a_solution_without_a_region_is_refused_at_its_function(tmp_path):
    err = refused(tmp_path, "import torch\n\n\ndef run_worker(rank, world_size):\n    return torch.ones(2)\n")
    assert f"{tmp_path / 'answer.py'}:4: no ### BEGIN SOLUTION / ### END SOLUTION region" in err
    assert "Nothing was released" in err
    zh = refused(tmp_path, "def run_worker(rank, world_size):\n    return 1\n", lang="zh")
    assert f"{tmp_path / 'answer.py'}:1：没有 ### BEGIN SOLUTION" in zh


@pytest.mark.parametrize("marker", ["    x = 1  ### BEGIN SOLUTION", "    #### BEGIN SOLUTION", "    ### begin solution",
                                    "    ### BEGIN SOLUTION (all_reduce)", "    # BEGIN SOLUTION"])
def test_a_marker_the_release_would_not_recognise_is_refused(tmp_path, marker):
    """The stub would still hold such a region, answer and all: refused at the marker's line."""
    solution = f"def run_worker(rank, world_size):\n{marker}\n    y = 2\n    ### END SOLUTION\n    return y\n"
    err = refused(tmp_path, solution)
    assert f"{tmp_path / 'answer.py'}:2: {marker.strip()} is not a marker the release recognises" in err


@pytest.mark.parametrize("body, line, words", [
    ("    ### BEGIN SOLUTION\n    x = 1\n", 2, "never closed by ### END SOLUTION"),
    ("    x = 1\n    ### END SOLUTION\n", 3, "with no ### BEGIN SOLUTION before it"),
    ("    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION\n", 3, "inside another solution region (opened at line 2)"),
])
def test_an_unbalanced_region_is_refused_at_its_line(tmp_path, body, line, words):
    err = refused(tmp_path, f"def run_worker(rank, world_size):\n{body}    return 1\n")
    assert f"answer.py:{line}: " in err and words in err


def test_the_released_stubs_are_what_the_release_writes(tmp_path):
    """An honest solution still releases as before: the stub line at the region's indentation."""
    src, dst = tmp_path / "a.py", tmp_path / "b.py"
    src.write_text("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n", encoding="utf-8")
    assert release_cli(str(src), str(dst)).returncode == 0
    assert dst.read_text(encoding="utf-8") == f"def f():\n    {release.STUB}\n"


def course_copy(tmp_path: Path) -> Path:
    """This checkout's tracked files (no venv, no git), where `make release` may run and fail."""
    course = tmp_path / "course"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, course / name)
    return course


def test_make_release_stops_on_a_solution_without_markers_before_nbgrader_writes(tmp_path):
    """`make release` with a solution whose markers were taken out: it fails, names the file and line, and
    leaves the committed student versions as they were (nbgrader never ran). The venv is this one; make's
    own venv step is left out (STAMP=)."""
    course = course_copy(tmp_path)
    solution = course / "solutions/dist_primitives/dist_primitives.py"
    text = solution.read_text(encoding="utf-8")
    solution.write_text("".join(line for line in text.splitlines(keepends=True)
                                if line.strip() not in (release.BEGIN, release.END)), encoding="utf-8")
    before = {p: p.read_bytes() for p in (course / "assignments").rglob("*") if p.is_file()}
    proc = subprocess.run(["make", "release", "STAMP=", f"BIN={Path(PY).parent}"], cwd=course, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT, env={**os.environ, "LANG": "en_US.UTF-8"})
    assert proc.returncode != 0
    definition = text.splitlines().index("def run_worker(rank, world_size):") + 1
    assert f"solutions/dist_primitives/dist_primitives.py:{definition}: no ### BEGIN SOLUTION" in proc.stderr, proc.stderr
    assert "nbgrader" not in proc.stdout.split("release --check", 1)[1]   # stopped before generate_assignment
    assert {p: p.read_bytes() for p in (course / "assignments").rglob("*") if p.is_file()} == before


def test_a_source_notebook_with_a_misspelt_hidden_marker_is_refused(tmp_path):
    """nbgrader would release a hidden check whose marker it does not recognise: `--check` names the
    notebook, the cell (counted as the notebook shows it) and the line."""
    course = course_copy(tmp_path)
    path = course / "solutions/dist_primitives/dist_primitives.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    at = next(i for i, c in enumerate(nb["cells"]) if "### BEGIN HIDDEN TESTS" in "".join(c["source"]))
    nb["cells"][at]["source"] = "".join(nb["cells"][at]["source"]).replace("### BEGIN HIDDEN TESTS", "### BEGIN HIDDEN TEST")
    path.write_text(json.dumps(nb), encoding="utf-8")
    proc = release_cli("--check", cwd=course)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = "".join(nb["cells"][at]["source"]).splitlines().index("### BEGIN HIDDEN TEST") + 1
    assert f"dist_primitives.ipynb, cell {at + 1}, line {line}: ### BEGIN HIDDEN TEST is not a marker" in proc.stderr


def test_release_check_passes_on_every_committed_exercise():
    proc = release_cli("--check")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
