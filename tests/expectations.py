"""Fixture submissions as data: where an exercise's fixtures live, what each one is expected to get, and the
comparison of a grading with that expectation (docs/exercises.md, "Fixtures: what the tests check"). Not
collected by pytest (no test_ prefix): tests/test_fixtures.py runs it for every exercise the registry finds.

An exercise's fixtures are `tests/fixtures/<exercise>/{honest,mistakes,cheats}/` (or, for an exercise folder
outside this checkout, `<its folder>/fixtures/{honest,mistakes,cheats}/`). Beside each submission
`<stem>.py` (or `.ipynb`) its expectation is the sidecar `<stem>.toml`; an honest fixture needs none (it gets
full marks, passes every check, names no cause). `<fixtures>/<exercise>/defaults.toml` may give the language
the fixtures are graded in and the fixed words with digits a hidden check may show.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: pytest's own dependency
    import tomli as tomllib

from grader.model import Outcome

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KINDS = ("honest", "mistakes", "cheats")
SUFFIXES = (".py", ".ipynb")
SIDECAR_KEYS = {"score", "lang", "options", "outcomes", "causes", "causes_exact", "not_named", "says", "xfail"}
# What depends on the deltas a perturbed run drew (the tracer's account of what it found, why.*) or on timing
# (which rank a first failure stopped, fail.stopped): a sidecar's causes name every other key a check names,
# and of these only the ones it lists, which must be there
ACCOUNT = ("why.", "fail.stopped")
SAYS_KEYS = {"key", "params", "text", "match", "check", "lang", "absent", "exact", "staff"}
DEFAULT_KEYS = {"lang", "hidden_may_show"}
LANGS = ("en", "zh")
# An outcome a sidecar may give a check whose failure depends on timing (which rank a forged frame or an exit
# stopped first): any outcome but pass
ANY_FAILURE = "not pass"
# What a hidden check shows besides its verdict, hint and named mistakes: never a digit (a value, a size, a
# rank, a line) once the exercise's own fixed words are taken out, nor these words (an expected value, a line)
HIDDEN_TITLE = re.compile(r"隐藏测试 \d+|Hidden check \d+")
HIDDEN_NEVER = ("expected", "期望", "line ", "行）")


class SidecarError(ValueError):
    pass


@dataclass(frozen=True)
class Fixture:
    exercise: str
    kind: str
    path: Path
    expect: dict = field(default_factory=dict, compare=False, hash=False)
    langs: tuple = ("en",)
    options: tuple = ()
    error: str = ""       # the sidecar cannot be read (the fixture is still collected, and its test says why)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def id(self) -> str:
        return f"{self.exercise}/{self.kind}/{self.name}"

    @property
    def sidecar(self) -> Path:
        return self.path.with_suffix(".toml")


def root_of(exercise) -> Path | None:
    """The folder holding the exercise's honest/, mistakes/ and cheats/: tests/fixtures/<name>/, else the
    exercise folder's own fixtures/ (an exercise found through --exercises-dir or GRADER_EXERCISES)."""
    for root in (FIXTURES / exercise.name, Path(exercise.folder) / "fixtures" if exercise.folder else None):
        if root is not None and root.is_dir():
            return root
    return None


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise SidecarError(f"{path}: {err}") from err


def defaults(exercise) -> dict:
    root = root_of(exercise)
    path = root / "defaults.toml" if root else None
    if path is None or not path.exists():
        return {}
    found = read_toml(path)
    if set(found) - DEFAULT_KEYS:
        raise SidecarError(f"{path}: unknown keys {sorted(set(found) - DEFAULT_KEYS)}")
    return found


def _one_or_more(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value)


def fixtures(exercise) -> list[Fixture]:
    """Every fixture of the exercise, kind by kind, in name order; each with its sidecar read."""
    root = root_of(exercise)
    if root is None:
        return []
    base = defaults(exercise)
    found = []
    for kind in KINDS:
        for path in sorted(p for p in (root / kind).glob("*") if p.suffix in SUFFIXES and p.is_file()):
            side, error = path.with_suffix(".toml"), ""
            try:
                expect = read_toml(side) if side.exists() else {}
            except SidecarError as err:
                expect, error = {}, str(err)
            langs = _one_or_more(expect.get("lang", base.get("lang", "en")))
            found.append(Fixture(exercise.name, kind, path, expect, langs, tuple(expect.get("options", ())), error))
    return found


def sidecar_problems(fixture: Fixture, exercise, catalog: dict) -> list[str]:
    """What is wrong with a fixture's sidecar without grading it: unknown keys, patterns that match no check,
    outcomes or cause keys that do not exist, an honest fixture expected to fail."""
    expect, problems = fixture.expect, []
    if fixture.error:
        return [fixture.error]
    if fixture.kind != "honest" and not fixture.sidecar.exists():
        return [f"{fixture.sidecar.name} is missing: a {fixture.kind[:-1]} says what it is expected to get"]
    if set(expect) - SIDECAR_KEYS:
        problems.append(f"unknown keys {sorted(set(expect) - SIDECAR_KEYS)}")
    checks = [c.id for c in exercise.checks]
    score = expect.get("score")
    if fixture.kind != "honest" and score is None:
        problems.append("no score")
    if fixture.kind == "honest" and (score is not None or expect.get("outcomes") or expect.get("causes")):
        problems.append("an honest fixture gets full marks, passes every check and names no cause: "
                        "no score, outcomes or causes")
    if score is not None and not (isinstance(score, (int, float)) or (isinstance(score, list) and len(score) == 2)):
        problems.append(f"score {score!r}: a number or [lowest, highest]")
    for lang in fixture.langs:
        if lang not in LANGS:
            problems.append(f"lang {lang!r}: one of {LANGS}")
    for key in expect.get("not_named", []):
        if key not in catalog:
            problems.append(f"not_named: {key!r} is no message of the catalog")
    known = {o.value for o in Outcome} | {ANY_FAILURE}
    for table in ("outcomes", "causes"):
        for pattern, value in expect.get(table, {}).items():
            if not fnmatch.filter(checks, pattern):
                problems.append(f"[{table}] {pattern!r} matches no check of {exercise.name}: {checks}")
            if table == "outcomes" and set(_one_or_more(value)) - known:
                problems.append(f"[outcomes] {pattern!r}: {sorted(set(_one_or_more(value)) - known)} is no outcome")
            if table == "causes":
                for key in value:
                    if key not in catalog:
                        problems.append(f"[causes] {key!r} is no message of the catalog")
    for i, say in enumerate(expect.get("says", [])):
        where = f"says[{i}]"
        if set(say) - SAYS_KEYS:
            problems.append(f"{where}: unknown keys {sorted(set(say) - SAYS_KEYS)}")
        if sum(k in say for k in ("key", "text", "match")) != 1:
            problems.append(f"{where}: one of key (a catalog message, with params), text or match (a regex)")
        if "key" in say and say["key"] not in catalog:
            problems.append(f"{where}: {say['key']!r} is no message of the catalog")
        if "check" in say and not fnmatch.filter(checks, say["check"]):
            problems.append(f"{where}: check {say['check']!r} matches no check of {exercise.name}")
        if "lang" in say and say["lang"] not in fixture.langs:
            problems.append(f"{where}: lang {say['lang']!r}, but the fixture is graded in {list(fixture.langs)}")
    return problems


def first_match(table: dict, check_id: str):
    """The value of the first pattern of `table` (in the sidecar's order) that matches the check, else None."""
    for pattern, value in table.items():
        if fnmatch.fnmatchcase(check_id, pattern):
            return value
    return None


def named(results: dict, check_id: str | None = None) -> set[str]:
    """The catalog keys of the causes one check names (or all of them)."""
    causes = results["extra_data"].get("causes") or {}
    found = causes.values() if check_id is None else [causes.get(check_id, [])]
    return {c["key"] for group in found for c in group}


def output_of(results: dict, check_id: str) -> str:
    """One check's feedback as the student reads it (results.json keeps the tests in rubric order)."""
    return results["tests"][list(results["extra_data"]["outcomes"]).index(check_id)]["output"]


def report_text(results: dict) -> str:
    return "\n".join([results.get("output", "")] + [t["name"] + "\n" + t["output"] for t in results.get("tests", [])])


def problems(fixture: Fixture, results: dict, lang: str, exercise, render) -> list[str]:
    """Every way one grading (in `lang`) differs from what the fixture's sidecar expects: the score, each
    check's outcome, the causes each check names, the messages the report shows; and what no fixture may
    show (a grader error, a traceback)."""
    expect, found = fixture.expect, []
    outcomes = results["extra_data"].get("outcomes") or {}
    text = report_text(results)
    if results["extra_data"].get("grader_error") is not None or "grader_error" in outcomes.values():
        found.append(f"a grader error: {results['extra_data'].get('grader_error')}")
    if "Traceback" in text or "autograder failed" in text.lower():
        found.append("a traceback or 'autograder failed' in the report")
    if sorted(outcomes) != sorted(c.id for c in exercise.checks):
        found.append(f"checks {sorted(outcomes)}, not the exercise's")
    score = expect.get("score", sum(check.points for check in exercise.checks))   # an honest fixture: full marks
    low, high = (score, score) if not isinstance(score, list) else score
    if not low <= results["score"] <= high:
        found.append(f"score {results['score']:g}, expected {score}")
    for (check_id, outcome), test in zip(outcomes.items(), results.get("tests", [])):
        wanted = first_match(expect.get("outcomes", {}), check_id) or "pass"
        if outcome not in _one_or_more(wanted) and not (ANY_FAILURE in _one_or_more(wanted) and outcome != "pass"):
            found.append(f"{check_id}: {outcome}, expected {wanted}")
        if test["score"] != (test["max_score"] if outcome == "pass" else 0):   # a check's points: all or nothing
            found.append(f"{check_id}: {outcome} with {test['score']} of {test['max_score']} points")
    exact = expect.get("causes_exact", True)
    for check_id in outcomes:
        wanted = set(first_match(expect.get("causes", {}), check_id) or ())
        said = named(results, check_id)
        if not wanted <= said or (exact and {k for k in said - wanted if not k.startswith(ACCOUNT)}):
            found.append(f"{check_id} names {sorted(said)}, expected {'' if exact else 'at least '}{sorted(wanted)}")
    for key in expect.get("not_named", []):
        if key in named(results):
            found.append(f"names {key}, which it must not")
    if fixture.kind == "honest":
        lines = [line.strip() for line in text.splitlines()]
        found += [f"an honest report shows a cause: {line}" for line in lines
                  if line.startswith(("原因：", "Cause:"))]
    for say in expect.get("says", []):
        if say.get("lang", lang) != lang:
            continue
        shown = say.get("text") or say.get("match") or render(say["key"], say.get("params", {}), lang)
        where = [c for c in outcomes if fnmatch.fnmatchcase(c, say["check"])] if "check" in say else [None]
        for check_id in where:
            if say.get("staff"):   # the causes as results.json keeps them for staff: a hidden check's with its values
                causes = results["extra_data"].get("causes") or {}
                body = "\n".join(c["text"] for cid in ([check_id] if check_id else causes) for c in causes.get(cid, []))
            else:
                body = text if check_id is None else output_of(results, check_id)
            if "match" in say:
                there = re.search(shown, body) is not None
            else:
                there = body == shown if say.get("exact") else shown in body
            if there == bool(say.get("absent")):
                found.append(f"{check_id or 'the report'} {'shows' if there else 'does not show'}: {shown!r}")
    return found


def hidden_leaks(results: dict, allowed: list[str]) -> list[str]:
    """Hidden checks that show a digit or a value's words once their title and the exercise's fixed words
    (`allowed`, regexes) are taken out."""
    leaks = []
    for test in results.get("tests", []):
        if test["visibility"] != "after_published":
            continue
        shown = HIDDEN_TITLE.sub("", test["name"] + "\n" + test["output"])
        for pattern in allowed:
            shown = re.sub(pattern, "", shown)
        if re.search(r"\d", shown) or any(word in shown for word in HIDDEN_NEVER):
            leaks.append(f"{test['name']}: {test['output']}")
    return leaks
