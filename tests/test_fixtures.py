"""Every exercise the registry finds (solutions/, --exercises-dir, GRADER_EXERCISES), through its fixture
submissions: all of an exercise's graded by ONE `python -m grader batch` (honest, mistakes and cheats in one
class folder: a batch's start-up, its zygote's import of torch, once; each grading reported in English and,
with --also-lang, in Chinese), and every fixture
compared with its sidecar (tests/expectations.py; the format: docs/exercises.md, "Fixtures: what the tests
check"). Honest styles get full marks and name no cause; each mistake and cheat gets exactly the score,
outcomes and causes its sidecar says, and shows the messages it lists; no hidden check reveals a value. Every
cause an exercise declares is named for some mistake fixture of it, and every cause of the engine for some
mistake of some exercise.

Nothing here names an exercise: a new one with fixtures beside it is tested as it is
(tests/test_toy_exercise.py writes one into a temporary folder and runs this file on it).
"""
from __future__ import annotations

import re
from functools import cache

import pytest

import expectations
from conftest import BATCH_TIMEOUT, graded_files, results_of
from grader.exercise import registry
from grader.feedback.messages import CATALOG, render
from grader.feedback.render import HIDDEN_VARIANTS

EXERCISES = registry.available()   # loading them adds their messages to the catalog under their names
# The first test of an exercise grades its fixtures (one batch, shared with its other tests and with every worker)
GRADES_A_FOLDER = pytest.mark.timeout(BATCH_TIMEOUT + 60)
CJK = re.compile(r"[\u4e00-\u9fff]")

# Engine causes no fixture of the course shows, each tested where it can be:
# traffic shapes that no correct ring all-reduce can have, while the traffic checks judge correct sums only
# (cause.traffic_needs_value otherwise): a rank with no exchange at all never sees the others' data; ranks
# that turn different ways, each with one peer each way, can only form pairs; a rank that receives from the
# side it sends to waits for a send that goes elsewhere (tests/test_ring_allreduce.py,
# test_traffic_rules_on_synthetic_exchanges, names each from synthetic figures);
# and a narrower wire type beside a right value (the course's ring data lose precision in any narrower one, so
# the values check fails first: the synthetic test names it; m21_send_float64 shows the wider one)
NO_FIXTURE_CAN_SHOW = {"cause.traffic_none", "cause.traffic_direction", "cause.traffic_same_side", "cause.traffic_dtype"}
# counts no exercise of the course declares: a count over all ranks together, and one that a right answer can
# fall short of (tests/test_toy_exercise.py declares both and names them,
# test_counts_volume_and_groups_checks_graded_end_to_end),
# and a rooted quantity's wrong root: no exercise of the course declares one (combine="root"); the broadcast
# exercise tests/test_named_causes.py writes into a temporary folder does, and names it in zh and en
# (test_a_rooted_quantity_has_its_own_pass_words_and_wrong_root).
NOT_IN_THE_COURSE = {"cause.counts_all", "cause.counts_fewer", "cause.wrong_root"}
# causes only a real-backend run that runs out of time shows: each costs a time limit twice over (the run is
# tried again with twice the time), so one fixture of its own names it, graded with a short limit in
# tests/test_cli.py (test_an_isend_request_dropped_hangs_on_gloo_and_is_named).
REAL_BACKEND_HANGS = {"cause.isend_not_waited"}


def _every_fixture():
    for exercise in EXERCISES.values():
        for fixture in expectations.fixtures(exercise):
            marks = [GRADES_A_FOLDER]
            if fixture.expect.get("xfail"):   # a hole the red team found, kept until it is closed
                marks.append(pytest.mark.xfail(reason=fixture.expect["xfail"], strict=True))
            yield pytest.param(fixture, id=fixture.id, marks=marks)


FIXTURES = list(_every_fixture())


@cache
def _group(exercise: str, options: tuple) -> tuple:
    """The fixtures of one exercise (every kind, either language) graded together with the same options: one
    class folder, so each name is one student (a name in two kinds would be one student graded twice)."""
    group = tuple(f for f in expectations.fixtures(EXERCISES[exercise]) if f.options == options)
    names = [f.name for f in group]
    assert len(names) == len(set(names)), f"{exercise}: two fixtures of one name in different kinds"
    return group


_GRADED: dict = {}
LANGS = ("en", "zh")   # one batch reports each grading in both (--also-lang): a fixture of both is graded once


def graded(tmp_path_factory, fixture, lang: str) -> dict:
    """results.json of `fixture` in `lang`: its exercise's batch (one per session), whose results are in English
    in its --out folder and in Chinese in --out/zh/."""
    key = (fixture.exercise, fixture.options)
    if key not in _GRADED:
        files = [f.path for f in _group(*key)]
        out = graded_files(tmp_path_factory, files, fixture.exercise, LANGS[0], "--also-lang", LANGS[1], *fixture.options)
        _GRADED[key] = {LANGS[0]: results_of(out), LANGS[1]: results_of(out / LANGS[1])}
    return _GRADED[key][lang][fixture.name]


# -- where the fixtures are, and what their sidecars say ------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_exercise_has_fixtures_of_each_kind_each_with_its_sidecar(name):
    exercise = EXERCISES[name]
    root = expectations.root_of(exercise)
    assert root is not None, f"no tests/fixtures/{name}/ (nor fixtures/ in {exercise.folder})"
    expectations.defaults(exercise)   # readable, known keys only
    found = expectations.fixtures(exercise)
    for kind in expectations.KINDS:
        stems = [f.name for f in found if f.kind == kind]
        assert stems, f"no fixture in {root / kind}"
        assert len(stems) == len(set(stems)), f"{root / kind}: two submissions with one name"
        submissions = {f.name for f in found if f.kind == kind}
        orphans = [p.name for p in (root / kind).glob("*.toml") if p.stem not in submissions]
        assert orphans == [], f"{root / kind}: sidecars without a submission"
    assert not [p.name for p in root.iterdir() if p.is_file() and p.name != "defaults.toml"], \
        f"{root}: a fixture belongs in honest/, mistakes/ or cheats/"


@pytest.mark.parametrize("fixture", [pytest.param(p.values[0], id=p.id) for p in FIXTURES])
def test_sidecar_is_sound(fixture):
    assert expectations.sidecar_problems(fixture, EXERCISES[fixture.exercise], CATALOG) == []


# -- each fixture, graded ------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_gets_what_its_sidecar_says(fixture, tmp_path_factory):
    """Its score, each check's outcome, the causes each check names, the messages it lists; and hidden checks
    that show their verdict, a hint and the mistakes they name: no number (a world size, a value, a rank, a
    line) beyond the exercise's own fixed words (defaults.toml, hidden_may_show)."""
    exercise = EXERCISES[fixture.exercise]
    allowed = expectations.defaults(exercise).get("hidden_may_show", [])
    hidden = sum(check.hidden for check in exercise.checks)
    for lang in fixture.langs:
        results = graded(tmp_path_factory, fixture, lang)
        assert expectations.problems(fixture, results, lang, exercise, render) == [], (lang, fixture.sidecar)
        assert sum(t["visibility"] == "after_published" for t in results["tests"]) == hidden
        assert expectations.hidden_leaks(results, allowed) == [], lang


# -- causes: each said somewhere, and only where it is certain ---------------------------------------

def _sidecar_causes(exercises, kind: str = "mistakes") -> set[str]:
    """The causes the sidecars of these exercises' fixtures of a kind say are named (each is compared with
    the grading by test_fixture_gets_what_its_sidecar_says)."""
    return {key for exercise in exercises for fixture in expectations.fixtures(exercise) if fixture.kind == kind
            for keys in fixture.expect.get("causes", {}).values() for key in keys}


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_cause_an_exercise_declares_is_named_for_one_of_its_mistakes(name):
    """A cause is said only where it is certain, so a cause no mistake shows is either missing a fixture or
    never said. (An honest fixture names no cause at all: test_fixture_gets_what_its_sidecar_says.)"""
    exercise = EXERCISES[name]
    declared = {f"{name}.{key}" for key in exercise.messages or {} if key.startswith("cause.")}
    assert sorted(declared - _sidecar_causes([exercise])) == []


def test_every_cause_of_the_engine_is_named_for_a_mistake_of_some_exercise():
    engine = {key for key in CATALOG if key.startswith("cause.")} - set(HIDDEN_VARIANTS.values())
    assert NO_FIXTURE_CAN_SHOW | NOT_IN_THE_COURSE | REAL_BACKEND_HANGS <= engine
    said = _sidecar_causes(EXERCISES.values())
    assert sorted(engine - NO_FIXTURE_CAN_SHOW - NOT_IN_THE_COURSE - REAL_BACKEND_HANGS - said) == []
    assert said & NO_FIXTURE_CAN_SHOW == set()


def test_every_cause_is_worded_as_a_cause():
    """So that a report in either language shows a cause as a line of its own: 原因：... / Cause: ..."""
    own = {f"{name}.{key}" for name, ex in EXERCISES.items() for key in ex.messages or {} if key.startswith("cause.")}
    engine = {key for key in CATALOG if key.startswith("cause.")}
    for key in own | engine:
        zh, en = CATALOG[key]
        assert zh.startswith("原因：") and en.startswith("Cause: "), key
        assert CJK.search(zh) and not CJK.search(en), key


def test_every_message_a_sidecar_names_has_its_own_words_in_both_languages():
    keys = set()
    for exercise in EXERCISES.values():
        for fixture in expectations.fixtures(exercise):
            keys |= {k for found in fixture.expect.get("causes", {}).values() for k in found}
            keys |= {say["key"] for say in fixture.expect.get("says", []) if "key" in say}
    for key in keys:
        zh, en = CATALOG[key]
        assert zh != en and CJK.search(zh) and not CJK.search(en), key
