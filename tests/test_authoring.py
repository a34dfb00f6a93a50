"""An instructor writes an exercise from the docs alone: what can go wrong in a declaration is said when it
loads (the file, the line, why, in zh and en), a broken exercise never blocks the others, `local` takes the
run only when the declaration says so, the stub's TODOs are named one by one, and gradescope-zip asks for
the exercise it packages.

Fixtures: tests/fixtures/authoring/declarations/*.py, one mistake each (`# expect: KEY [param=value]` on
the first line, `# <- here` on the line the error must name); course/, a working and a broken exercise
side by side, graded through the real commands.
"""
from __future__ import annotations

import ast

import builtins
import re
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_cli
from grader.exercise import Check, DeclarationError, Exercise, Quantity, Todo, registry
from grader.feedback.messages import render

HERE = FIXTURES / "authoring"
DECLARATIONS = sorted((HERE / "declarations").glob("*.py"))
COURSE = HERE / "course"
ALICE = FIXTURES / "batch" / "honest.py"     # a correct dist_primitives answer


def marked_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if line.rstrip().endswith("# <- here"))


@pytest.mark.parametrize("path", DECLARATIONS, ids=lambda p: p.stem)
def test_a_declaration_that_cannot_work_is_refused_at_load_at_its_line(path, tmp_path):
    folder = tmp_path / path.stem
    folder.mkdir()
    shutil.copy(path, folder / "exercise.py")
    expect = path.read_text(encoding="utf-8").splitlines()[0].removeprefix("# expect: ").split()
    failed = registry.broken([str(folder)])
    assert path.stem not in registry.available([str(folder)]) and list(failed) == [path.stem]
    err = failed[path.stem]
    assert err.key == "exercise.broken"
    assert err.params["path"] == f"{folder / 'exercise.py'}:{marked_line(path)}"
    cause, zh = err.__cause__, render(err.key, err.params, "zh")
    assert f"exercise.py:{marked_line(path)}" in zh and f"exercise.py:{marked_line(path)}" in render(err.key, err.params, "en")
    if expect[0].startswith("declare."):
        assert isinstance(cause, DeclarationError) and cause.key == expect[0], cause
        for pair in expect[1:]:
            name, value = pair.split("=")
            assert cause.params[name] == value, cause.params
        assert re.search(r"[\u4e00-\u9fff]", zh.split("无法加载：")[1])   # the reason in Chinese too
    else:   # Python's own error (a typo, a syntax error): its line and its words
        assert type(cause) is getattr(builtins, expect[0]) and f"{expect[0]}: " in zh, cause


def test_allreduce_is_refused_with_a_suggestion_in_both_languages(tmp_path):
    folder = tmp_path / "d01"
    folder.mkdir()
    shutil.copy(HERE / "declarations" / "d01_through_allreduce.py", folder / "exercise.py")
    err = registry.broken([str(folder)])["d01_through_allreduce"]
    assert "'allreduce' is not an operation of grader.comm.OPS: did you mean all_reduce?" in render(err.key, err.params, "en")
    assert "'allreduce' 不是 grader.comm.OPS 中的操作名：是不是 all_reduce？" in render(err.key, err.params, "zh")


def test_a_check_naming_a_missing_quantity_never_reaches_grading():
    """It used to load, then fail every grading with a bare StopIteration ("The autograder failed")."""
    total = Quantity("total", local=lambda rank, ws: [1.0], combine="sum", through=("all_reduce",))
    check = Check("ws2.t", "value", 1, ("t", "t"), world_size=2, quantity="totl")
    with pytest.raises(DeclarationError) as raised:
        Exercise(name="x", title=("x", "x"), quantities=(total,), checks=(check,))
    assert raised.value.key == "declare.missing_quantity"
    assert raised.value.where == check.where and check.where[0] == __file__   # the line of that Check(...)
    counts = Check("ws2.n", "counts", 1, ("n", "n"), world_size=2, op="all_reduce", quantity="total",
                   params={"count": 1, "quantities": ("total", "totl")})   # the quantities whose calls are counted
    with pytest.raises(DeclarationError) as raised:
        Exercise(name="x", title=("x", "x"), quantities=(total,), checks=(counts,))
    assert raised.value.key == "declare.missing_quantity" and "totl" in raised.value.params["name"]


def test_the_kinds_are_one_table():
    from grader.exercise import KINDS
    assert set(KINDS) == {"static", "value", "uses", "traffic", "counts", "volume", "groups"}
    with pytest.raises(DeclarationError, match="there is no kind 'latency'"):
        Check("ws2.c", "latency", 1, ("c", "c"), world_size=2)
    with pytest.raises(DeclarationError) as raised:   # a kind's own fields, checked at load
        Check("ws2.c", "counts", 1, ("c", "c"), world_size=2)
    assert raised.value.key == "declare.needs"
    for kind, params in (("counts", {"count": 1, "least": 32}), ("volume", {"dtypes": ["torch.float16"], "least": 32})):
        with pytest.raises(DeclarationError) as raised:   # a param the kind does not read (once a size threshold)
            Check("ws2.c", kind, 1, ("c", "c"), world_size=2, op="all_reduce", quantity="q", params=params)
        assert raised.value.key == "declare.params" and raised.value.params["field"] == "params['least']"
        assert "not a param of " + kind in raised.value.params["value"]
    with pytest.raises(DeclarationError) as raised:   # names of quantities, not one name
        Check("ws2.c", "counts", 1, ("c", "c"), world_size=2, op="all_reduce", quantity="q", params={"count": 1, "quantities": "q"})
    assert raised.value.params["field"] == 'params["quantities"]'


# -- Quantity.local takes the run only when the declaration says so ---------------------------------

def test_local_never_reads_a_run():
    """An exercise declares data, never code over a run: local(rank, ws) only. A local that wants a third
    argument, or a kept state declared as proven, is refused with what to declare instead."""
    def accumulated(rank, ws, divide=True):
        return [rank / ws if divide else float(rank)]
    plain = Quantity("q", local=accumulated, combine="sum", through=("all_reduce",))
    assert not plain.derived and plain.local_array(1, 2).tolist() == [0.5]   # called as local(rank, ws)
    with pytest.raises(DeclarationError) as raised:
        Quantity("q", local=lambda rank, ws, ctx: [0.0], combine="sum", through=("all_reduce",))
    assert raised.value.key == "declare.local_wants_context" and "combine=\"reference\"" in str(raised.value)
    with pytest.raises(DeclarationError) as raised:
        Quantity("q", local=lambda rank, ws: [0.0], combine="own", through=("all_reduce",))
    assert raised.value.key == "declare.own_proven"
    kept = Quantity("q", local=lambda rank, ws: [float(rank)], combine="own", provenance=False)
    assert kept.expected_array(1, 2).tolist() == [1.0]


# -- a broken exercise beside working ones, through the real commands ---------------------------------

@pytest.mark.timeout(60)
def test_list_shows_a_broken_exercise_with_its_line_and_the_others():
    line = marked_line(COURSE / "broken_sum" / "exercise.py")
    where = f"{COURSE / 'broken_sum' / 'exercise.py'}:{line}"
    en = run_cli("list", "--exercises-dir", str(COURSE), "--lang", "en")
    assert en.returncode == 0, en.stderr
    for name in ("dist_primitives", "ring_allreduce", "zero_sharded_step", "toy_sum"):
        assert f"  {name}: " in en.stdout
    assert (f"  broken_sum: broken: {where}: Quantity('total').through: 'allreduce' is not an operation of "
            "grader.comm.OPS: did you mean all_reduce?") in en.stdout
    zh = run_cli("list", "--exercises-dir", str(COURSE), "--lang", "zh")
    assert f"  broken_sum：无法加载：{where}：" in zh.stdout and "是不是 all_reduce？" in zh.stdout


@pytest.mark.timeout(240)
def test_a_broken_exercise_blocks_no_other_and_names_itself_when_chosen(tmp_path):
    env = {"GRADER_EXERCISES": str(COURSE)}
    named = run_cli("check", str(ALICE), "--exercise", "dist_primitives", "--lang", "en", env=env)
    assert named.returncode == 0 and "Score: 40 / 40" in named.stdout, named.stdout + named.stderr
    inferred = run_cli("check", str(ALICE), "--exercises-dir", str(COURSE), "--lang", "en")   # from its functions
    assert inferred.returncode == 0 and "Score: 40 / 40" in inferred.stdout, inferred.stdout + inferred.stderr
    (tmp_path / "class").mkdir()
    shutil.copy(ALICE, tmp_path / "class" / "alice.py")
    batch = run_cli("batch", str(tmp_path / "class"), "--out", str(tmp_path / "out"), "--exercise", "dist_primitives",
                    "--jobs", "1", "--lang", "en", timeout=110, env=env)   # make grade's command
    assert batch.returncode == 0 and '"score": 100' in (tmp_path / "out" / "alice.json").read_text(), batch.stderr[-2000:]
    broken = run_cli("check", str(ALICE), "--exercise", "broken_sum", "--exercises-dir", str(COURSE), "--lang", "en")
    where = f"{COURSE / 'broken_sum' / 'exercise.py'}:{marked_line(COURSE / 'broken_sum' / 'exercise.py')}"
    assert broken.returncode == 2
    assert f"The exercise definition {where} cannot be loaded: " in broken.stdout and "did you mean all_reduce?" in broken.stdout


def test_a_submission_that_names_only_a_broken_exercise_gets_its_error():
    source = "def broken_average(rank, world_size):\n    return 0\n"
    with pytest.raises(registry.ExerciseError) as raised:
        registry.infer(Path("broken_sum.py"), source, [str(COURSE)])
    assert raised.value.key == "exercise.broken" and raised.value.params["name"] == "broken_sum"
    assert registry.infer(Path("answer.py"), ALICE.read_text(encoding="utf-8"), [str(COURSE)]).name == "dist_primitives"


@pytest.mark.timeout(120)
def test_a_local_with_a_default_parameter_grades_a_correct_answer_in_full():
    """toy_sum's local is accumulated(rank, ws, scale=1.0): once taken for local(rank, ws, ctx) by its arity."""
    proc = run_cli("check", str(HERE / "toy_sum_answer.py"), "--exercise", "toy_sum", "--exercises-dir", str(COURSE),
                   "--lang", "en")
    assert proc.returncode == 0 and "Score: 10 / 10" in proc.stdout, proc.stdout + proc.stderr


# -- TODOs named one by one ------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_only_the_open_todos_are_named():
    for lang, done, left in (("en", "TODO 1", "complete TODO 2 (all_gather) first"), ("zh", "TODO 1", "请先完成 TODO 2（all_gather）")):
        proc = run_cli("check", str(HERE / "todo1_done.py"), "--exercise", "dist_primitives", "--lang", lang)
        assert proc.returncode == 1, proc.stderr
        assert f"run_worker {'still raises NotImplementedError: ' if lang == 'en' else '仍然抛出 NotImplementedError：'}{left}" \
            in proc.stdout, proc.stdout
        assert done not in proc.stdout


def test_todo_words_for_each_state_of_the_stub():
    import ast
    from grader.submission import static
    from grader.verify.score import todo_note
    zero = registry.get("zero_sharded_step")

    def said(source: str, exercise, lang="en"):
        note = todo_note(exercise, static.inspect_source(ast.parse(source), exercise.entry))
        return note and render(note.key, note.params, lang)
    head = "import torch.distributed as dist\ndef run_worker(rank, world_size):\n"
    stub = head + "    raise NotImplementedError\n"
    assert said(stub, zero) == ("run_worker still raises NotImplementedError: complete TODO 1 (reduce_scatter), "
                                "TODO 2 (the shard update) and TODO 3 (all_gather) first.")
    assert said(stub, zero, "zh") == ("run_worker 仍然抛出 NotImplementedError：请先完成 TODO 1（reduce_scatter）、"
                                      "TODO 2（分片更新）、TODO 3（all_gather）。")
    both = head + "    dist.reduce_scatter_single(a, b)\n    dist.all_gather_single(c, d)\n    raise NotImplementedError\n"
    assert said(both, zero) == "run_worker still raises NotImplementedError: complete TODO 2 (the shard update) first."
    dist_primitives = registry.get("dist_primitives")
    done = head + "    dist.all_reduce(a)\n    dist.all_gather(b, c)\n    raise NotImplementedError\n"
    assert said(done, dist_primitives) == render("static.todo_raise", {"entry": "run_worker"}, "en")
    assert said(head + "    return 1\n", dist_primitives) is None
    ring = registry.get("ring_allreduce")   # a single todo=(zh, en), as it is written
    assert said("def run_worker(rank, world_size):\n    raise NotImplementedError\n", ring).endswith(
        "complete the TODO in ring_all_reduce first.")
    by_quantity = Exercise(name="t", title=("t", "t"), quantities=(
        Quantity("total", local=lambda rank, ws: [1.0], combine="sum", through=("all_reduce",)),),
        checks=(Check("ws2.t", "value", 1, ("t", "t"), world_size=2, quantity="total"),),
        todo=(Todo(("TODO 1（total）", "TODO 1 (total)"), quantity="total"), Todo(("TODO 2", "TODO 2"), op="broadcast")))
    assert said(head + "    dist.all_reduce(a)\n    raise NotImplementedError\n", by_quantity).endswith("complete TODO 2 first.")


# -- gradescope-zip packages one exercise, named ----------------------------------------------------

@pytest.mark.timeout(60)
def test_gradescope_zip_asks_for_the_exercise(tmp_path):
    for lang, words in (("en", "Name the exercise to package with --exercise (exercises: dist_primitives, "),
                        ("zh", "请用 --exercise 指定要打包的练习（现有练习：dist_primitives、")):
        proc = run_cli("gradescope-zip", "--out", str(tmp_path / "a.zip"), "--lang", lang)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "submission" not in proc.stderr and "提交" not in proc.stderr
    assert not (tmp_path / "a.zip").exists()


def test_an_entry_made_by_a_factory_or_wrapper_names_its_exercise():
    """`run_worker = make_worker()` defines run_worker as surely as `def run_worker`: the exercise is inferred
    from it (a file named answer.py names none)."""
    made = (FIXTURES / "dist_primitives" / "honest" / "h72_closure_factory_entry.py").read_text(encoding="utf-8")
    assert registry.infer(Path("answer.py"), made).name == "dist_primitives"
    wrapped = "import functools\n\ndef _impl(rank, world_size):\n    return None\n\nrun_worker = functools.wraps(_impl)(_impl)\n"
    assert registry.infer(Path("answer.py"), wrapped).name == "dist_primitives"


# -- every exercise of the course is a declaration: data and a reference, never code over a run -------------

RUN_ATTRIBUTES = {"calls", "sent_values", "delivered_values", "entered_values", "delivered_arrays", "partners",
                  "pieces", "view", "memo", "ranks"}


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (ROOT / "solutions").glob("*/exercise.py")))
def test_an_exercise_declares_what_is_right_never_how_to_prove_it(name):
    """No function of an exercise reads what a rank sent or was delivered (a run's records, a view of one), nor
    imports the engine's verification, switch or processes; and the whole declaration, messages included, reads
    in one sitting."""
    exercise = registry.get(name)
    source = (ROOT / "solutions" / name / "exercise.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 150, (name, len(source.splitlines()))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert node.attr not in RUN_ATTRIBUTES, (name, node.attr, node.lineno)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert not (module or "").startswith(("grader.verify", "grader.switch", "grader.processes")), (name, module)
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            assert "ctx" not in [a.arg for a in node.args.args], (name, getattr(node, "name", "lambda"))
    assert exercise.diagnose is None and all(not callable(t) for t in exercise.teach)
