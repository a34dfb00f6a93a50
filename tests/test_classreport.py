"""The class report (grader/integrations/classreport.py, classpage.py): which causes count, causes.csv,
the terminal summary and report.html, first on a made-up class, then on one real `batch` run whose
report.html is read back (its figures against grades.csv) and opened in headless Chromium."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from browser import open_in_browser
from conftest import FIXTURES, run_cli
from htmltree import parse
from grader.exercise.spec import Check, Exercise, Quantity
from grader.integrations import classreport
from grader.integrations.batch.discover import results_name, timeline_name
from grader.integrations.classpage import page
from grader.integrations.classreport import OTHER, build, causes_csv, named_causes, terminal

TOY = Exercise(
    name="toy", title=("玩具练习", "Toy exercise"),
    quantities=(Quantity("total", local=lambda r, ws: [r + 1.0], combine="sum", through=("all_reduce",)),),
    checks=(Check("static.op", "static", 10, ("静态检查", "Static check"), op="all_reduce"),
            Check("ws2.sum", "value", 45, ("求和（{ws} 个进程）", "Sum ({ws} ranks)"), world_size=2, quantity="total", op="all_reduce"),
            Check("ws3.sum", "value", 45, ("求和（{ws} 个进程）", "Sum ({ws} ranks)"), hidden=True, world_size=3, quantity="total",
                  op="all_reduce")),
)
HOSTILE = '=cmd|"/c calc"!A0<script>alert(1)</script>\x1b[31m'
SUMMED = [{"key": "fail.exception", "text": "Rank 1 raised ValueError: x", "rank": 1},
          {"key": "cause.summed_not_averaged", "text": "Cause: total is world_size times the mean.", "rank": None},
          {"key": "why.weights", "text": "  In element 0 ...", "rank": 0}]


def student(outcomes: dict, causes: dict, score: float, **extra) -> dict:
    full = {c.id: outcomes.get(c.id, "pass") for c in TOY.checks}
    return {"score": score, "extra_data": {"exercise": "toy", "outcomes": full, "causes": causes,
                                           "scores": {c.id: (c.points if full[c.id] == "pass" else 0) for c in TOY.checks},
                                           **extra}}


def toy_class() -> list[tuple[str, dict]]:
    return [
        ("frank", student({"ws2.sum": "wrong"}, {"ws2.sum": SUMMED}, 55)),
        ("alice", student({}, {}, 100)),
        ("bob", student({"ws2.sum": "exception", "ws3.sum": "exception"}, {"ws2.sum": SUMMED, "ws3.sum": SUMMED}, 10)),
        ("carol", student({"ws2.sum": "timeout", "ws3.sum": "wrong"},
                          {"ws2.sum": [{"key": "fail.timeout_inside", "text": "Time limit: rank 0\nwas stuck"},
                                       {"key": "why.not_delivered", "text": "  Element 0 ..."}],
                           "ws3.sum": [{"key": "why.weights", "text": "  In element 0, rank 1 counts twice"}]}, 10)),
        ("dave", student({"ws2.sum": "crash", "ws3.sum": "wrong"},
                         {"ws2.sum": [{"key": "fail.stopped", "text": "Rank 1 was stopped because rank 0 had failed."}], "ws3.sum": []}, 10)),
        ("erin", {"score": 0, "extra_data": {"submission": "erin.py", "grader_error": "Traceback ..."}}),
        (HOSTILE, student({"ws2.sum": "wrong"}, {"ws2.sum": [{"key": "toy.cause.custom", "text": "=1+1 <b>bold</b> \x1b[2J"}]}, 55)),
    ]


# -- which causes count ------------------------------------------------------------------------------
@pytest.mark.parametrize("keys, named", [
    (["fail.exception", "cause.summed_not_averaged", "why.weights", "cause.hardcoded_ws"],
     ["cause.summed_not_averaged", "cause.hardcoded_ws"]),                       # the mistake explains the crash
    (["why.not_delivered", "fail.not_collective", "fail.not_collective"], ["fail.not_collective"]),
    (["why.weights"], ["why.weights"]),
    (["static.syntax_error"], ["static.syntax_error"]),
    (["fail.exception", "toy.cause.custom"], ["toy.cause.custom"]),            # an exercise's own cause
    (["fail.stopped", "fail.grader"], [OTHER]),                                 # nothing about the student's code
    ([], [OTHER]),
])
def test_named_causes_take_the_most_specific_tier(keys, named):
    got = named_causes([{"key": k, "text": f"words of {k}"} for k in keys], "wrong", "en")
    assert [k for k, _ in got] == named


def test_other_keeps_some_words():
    assert named_causes([{"key": "fail.stopped", "text": "Rank 1 was\n stopped."}], "crash", "en") == [(OTHER, "Rank 1 was stopped.")]
    assert named_causes([], "timeout", "en") == [(OTHER, "Time limit: a rank hung in a communication or looped forever.")]
    assert named_causes([], "timeout", "zh")[0][1].startswith("运行超时")


# -- the figures ------------------------------------------------------------------------------------
def test_figures_of_a_class():
    report = build(toy_class(), TOY, "en")
    assert [s.name for s in report.students][1:] == ["alice", "bob", "carol", "dave", "erin", "frank"]
    by = {c.id: c for c in report.checks}
    assert (len(by["static.op"].passed), by["static.op"].count) == (6, 7)          # erin's grading failed
    assert by["ws2.sum"].passed == ["alice"] and sorted(by["ws3.sum"].passed) == sorted(["alice", "frank", classreport.printable(HOSTILE)])
    assert {k: v for k, v in by["ws2.sum"].causes.items()} == {
        "cause.summed_not_averaged": ["bob", "frank"], "fail.timeout_inside": ["carol"],
        "toy.cause.custom": [classreport.printable(HOSTILE)], OTHER: ["dave"]}
    assert report.whole == {"summary.grader_failed": ["erin"]}          # failed as a whole: once, not per check
    assert list(by["ws2.sum"].causes)[0] == "cause.summed_not_averaged" and list(by["ws2.sum"].causes)[-1] == OTHER
    assert by["ws3.sum"].causes == {"cause.summed_not_averaged": ["bob"], "why.weights": ["carol"], OTHER: ["dave"]}
    top = report.top_causes()
    assert top[0][:3] == ("cause.summed_not_averaged", ["bob", "frank"], ["ws2.sum", "ws3.sum"])   # bob counts once
    assert top[0][3].student == "bob" and top[0][3].text == "Cause: total is world_size times the mean."
    assert top[-1][0] == OTHER
    assert {s.name: s.verdict for s in report.students}["erin"] == "grader_failed"
    assert [b.count for b in report.bins] == [1, 3, 0, 0, 0, 2, 0, 0, 0, 0, 1]
    assert report.traffic == []


def test_causes_csv_is_sorted_escaped_and_the_same_whatever_the_order():
    rows = toy_class()
    text = causes_csv(build(rows, TOY, "en"))
    assert text == causes_csv(build(list(reversed(rows)), TOY, "en"))
    table = list(csv.reader(io.StringIO(text)))
    assert table[0] == ["student", "check", "cause", "text"]
    body = table[1:]
    report = build(rows, TOY, "en")
    assert len(body) == sum(len(c.causes[k]) for c in report.checks for k in c.causes) + 1
    assert [r[:3] for r in body if r[0] == "erin"] == [["erin", "*", "summary.grader_failed"]]
    assert [r[:3] for r in body if r[0] == "bob"] == [["bob", "ws2.sum", "cause.summed_not_averaged"],
                                                      ["bob", "ws3.sum", "cause.summed_not_averaged"]]
    assert ["carol", "ws2.sum", "fail.timeout_inside", "Time limit: rank 0 was stuck"] in body
    assert ["dave", "ws2.sum", OTHER, "Rank 1 was stopped because rank 0 had failed."] in body
    hostile = [r for r in body if "calc" in r[0]]
    assert hostile and all(r[0].startswith("'=cmd") and "\x1b" not in r[0] and "\\x1b" in r[0] for r in hostile)
    assert hostile[0][3].startswith("'=1+1")
    for prefix in ("+", "-", "@", "\t", "\r"):
        assert classreport.cell(prefix + "SUM(A1)").startswith("'")
    assert classreport.cell("alice") == "alice" and classreport.cell("1.5") == "1.5"
    assert "\n" not in "".join(body[i][3] for i in range(len(body)))   # every cause on one line


def test_terminal_names_the_students_per_cause(monkeypatch):
    monkeypatch.setattr(classreport, "TERMINAL_CAUSES", 2)
    text = terminal(build(toy_class(), TOY, "en"))
    assert text.index("Submissions that could not be graded") < text.index("  summary.grader_failed: 1 student: ") \
        < text.index("      students: erin\n") < text.index("static.op (")
    assert "ws2.sum (Sum (2 ranks)): 1/7 passed (14%)" in text
    assert "ws3.sum (Sum (3 ranks)): 3/7 passed (43%)" in text       # hidden checks too, for TAs
    block = text[text.index("ws2.sum ("):text.index("ws3.sum (")]
    assert "  cause.summed_not_averaged: 2 students: Cause: total is world_size times the mean.\n      students: bob, frank\n" in block
    assert "  other (no named cause): 1 student\n      students: dave\n" in block
    assert block.index("cause.summed_not_averaged") < block.index("further causes") < block.index("other (no named")
    assert "  further causes: 1 (see report.html)" in block            # three named causes, two shown
    monkeypatch.setattr(classreport, "TERMINAL_CAUSES", 10)
    text = terminal(build(toy_class(), TOY, "en"))
    assert "toy.cause.custom: 1 student: =1+1 <b>bold</b> \\x1b[2J" in text and "further causes" not in text
    assert "\x1b" not in text and 'students: =cmd|"/c calc"!A0<script>alert(1)</script>\\x1b[31m\n' in text


def test_terminal_cuts_long_lists_and_speaks_chinese():
    rows = [(f"s{i:02d}", student({"ws2.sum": "wrong"}, {"ws2.sum": SUMMED}, 55)) for i in range(13)]
    en = terminal(build(rows, TOY, "en"))
    assert "13 students" in en and "s09, and 3 more (all in causes.csv)" in en and "s10" not in en
    zh = terminal(build(rows, TOY, "zh"))
    assert "ws2.sum（求和（2 个进程））：通过 0/13（0%）" in zh and "13 名学生" in zh and "，另有 3 人" in zh


def test_an_empty_class_and_odd_results_still_make_a_report():
    empty = build([], TOY, "en")
    assert "0/0 passed" in terminal(empty) and "No check failed." in page(empty)
    odd = build([("x", {"score": "n/a", "extra_data": {"outcomes": {}, "causes": {"ws2.sum": 3}, "traffic": {}}})], TOY, "en")
    assert odd.students[0].score == 0 and all(c.causes == {OTHER: ["x"]} for c in odd.checks)


# -- report.html ------------------------------------------------------------------------------------
def test_page_escapes_names_and_words():
    text = page(build(toy_class(), TOY, "en"))
    doc = parse(text)
    assert len(doc.find_all("script")) == 1 and "alert" not in doc.find("script").text()
    assert not doc.find_all("b") and "\x1b" not in text
    row = [r for r in doc.find("table", id="student-table").find_all("tr") if "calc" in r.attrs.get("data-student", "")]
    assert row and row[0].find("td").text() == classreport.printable(HOSTILE)
    assert "=1+1 <b>bold</b> \\x1b[2J" in doc.find("section", id="causes").text()


def test_page_is_self_contained():
    text = page(build(toy_class(), TOY, "en"))
    doc = parse(text)
    csp = doc.find("meta", http_equiv="Content-Security-Policy").attrs["content"]
    assert "default-src 'none'" in csp
    for el in doc.iter():
        for attr in ("src", "href", "action", "srcset", "poster"):
            assert attr not in el.attrs, (el.tag, attr)
    assert not re.search(r"url\(|@import|https?://", text)


def test_page_figures():
    report = build(toy_class(), TOY, "en")
    doc = parse(page(report))
    assert [int(b.attrs["data-count"]) for b in doc.find_all("div", class_="bin")] == [1, 3, 0, 0, 0, 2, 0, 0, 0, 0, 1]
    checks = {c.attrs["data-check"]: c for c in doc.find_all("div", class_="check")}
    assert {k: (c.attrs["data-passed"], c.attrs["data-count"]) for k, c in checks.items()} == {
        "static.op": ("6", "7"), "ws2.sum": ("1", "7"), "ws3.sum": ("3", "7")}
    assert "1/7 passed (14%)" in checks["ws2.sum"].text() and "hidden" in checks["ws3.sum"].text()
    causes = doc.find("section", id="causes").find_all("tr", class_="cause")
    assert (causes[0].attrs["data-cause"], causes[0].attrs["data-count"]) == ("cause.summed_not_averaged", "2")
    assert "Cause: total is world_size times the mean." in causes[0].text() and "bob, frank" in causes[0].text()
    assert not doc.find_all("section", id="traffic")


def test_page_in_chinese():
    doc = parse(page(build(toy_class(), TOY, "zh")))
    assert doc.find("html").attrs["lang"] == "zh-CN"
    assert doc.find("h1").text() == "班级报告：玩具练习"
    assert "通过 1/7（14%）" in doc.find("div", data_check="ws2.sum").text()


def test_traffic_section_from_the_students_figures():
    rows = toy_class()
    rows[0][1]["extra_data"]["traffic"] = [{"check": "ws2.sum", "world_size": 4, "size": 4096, "bound": 6144,
                                            "sent": [6144, 6144, 6144, 6144]}]
    rows[1][1]["extra_data"]["traffic"] = [{"check": "ws2.sum", "world_size": 4, "size": 4096, "bound": 6144,
                                            "sent": [0, 4096, 4096, 12288]},
                                           {"check": "ws2.sum", "world_size": 4, "size": "garbage"}]   # left out
    doc = parse(page(build(rows, TOY, "en")))
    section = doc.find("section", id="traffic")
    group = section.find("div", class_="traffic")
    assert (group.attrs["data-world-size"], group.attrs["data-over"]) == ("4", "1")
    figures = {r.attrs["data-student"]: (r.attrs["data-sent"], r.attrs["data-bound"]) for r in group.find_all("tr", data_student=True)}
    assert figures == {"frank": ("6144", "6144"), "alice": ("12288", "6144")}
    assert "1 within the bound, 1 over it" in section.text() and "2.00" in section.text()


# -- one real batch: report.html against grades.csv, then in a browser ------------------------------
NAMES = {"alice": "honest.py", "bob": "summed.py", "carol": "broken.py", "<img src=x onerror=console.error(1)> & 'q'": "summed.py",
         "erin": None}   # None: an empty file


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classreport")
    cls = tmp / "cls"
    cls.mkdir()
    for name, fixture in NAMES.items():
        if fixture is None:
            (cls / f"{name}.py").write_text("")
        else:
            shutil.copy(FIXTURES / "batch" / fixture, cls / f"{name}.py")
    out = tmp / "out"
    proc = run_cli("batch", str(cls), "--out", str(out), "--exercise", "dist_primitives", "--jobs", "2", "--lang", "en")
    assert proc.returncode == 0, proc.stderr
    return cls, out, proc


def _grades(out: Path) -> dict[str, dict]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


@pytest.mark.timeout(150)
def test_batch_report_equals_the_gradebook(graded):
    from grader.exercise import registry
    cls, out, proc = graded
    exercise = registry.get("dist_primitives")
    grades = _grades(out)
    assert len(grades) == len(NAMES)
    doc = parse((out / "report.html").read_text(encoding="utf-8"))
    # the histogram: its bins hold the totals of grades.csv
    for b in doc.find_all("div", class_="bin"):
        low, high = float(b.attrs["data-low"]), float(b.attrs["data-high"])
        inside = [t for t in (float(r["total"]) for r in grades.values()) if low <= t < high or low == high == t]
        assert int(b.attrs["data-count"]) == len(inside), b.attrs
    assert sum(int(b.attrs["data-count"]) for b in doc.find_all("div", class_="bin")) == len(grades)
    # the pass rates: a check passed where grades.csv gives it its full points
    for check in exercise.checks:
        bar = doc.find("div", data_check=check.id)
        passed = sum(1 for r in grades.values() if float(r[check.id]) == check.points)
        assert (int(bar.attrs["data-passed"]), int(bar.attrs["data-count"])) == (passed, len(grades)), check.id
        assert f"{passed}/{len(grades)} passed" in bar.text()
        assert f"{check.id} (" in proc.stdout and f"{passed}/{len(grades)} passed" in proc.stdout
    # the students' table: one row per line of grades.csv, same score and verdict
    table = {r.attrs["data-student"]: [td.text() for td in r.find_all("td")]
             for r in doc.find("table", id="student-table").find_all("tr", data_student=True)}
    assert {n: (cells[1], cells[2]) for n, cells in table.items()} == {n: (r["total"], r["verdict"]) for n, r in grades.items()}
    # causes.csv: bob's mistake is named on every all_reduce check; the other student with it too
    causes = list(csv.DictReader(io.StringIO((out / "causes.csv").read_text(encoding="utf-8"))))
    summed = {(r["student"], r["check"]) for r in causes if r["cause"] == "cause.summed_not_averaged"}
    hostile = next(n for n in NAMES if n.startswith("<img"))
    assert summed == {(n, f"ws{ws}.all_reduce") for n in ("bob", hostile) for ws in (2, 3, 4)}
    # a submission that cannot be graded at all (a syntax error, an empty file) fails every check for one
    # reason: one row, for every check ("*"), not one per check
    assert [(r["check"], r["cause"]) for r in causes if r["student"] == "carol"] == [("*", "static.syntax_error")]
    assert [(r["check"], r["cause"]) for r in causes if r["student"] == "erin"] == [("*", "load.empty")]
    assert not [r for r in causes if r["student"] == "alice"]
    for r in causes:   # every row is a cause that student's results hold for that check (for every check: "*")
        data = json.loads((out / f"{r['student']}.json").read_text(encoding="utf-8")) if "<" not in r["student"] else None
        checks = [c.id for c in exercise.checks] if r["check"] == "*" else [r["check"]]
        if data and r["cause"] != OTHER:
            assert all(r["cause"] in {c["key"] for c in data["extra_data"]["causes"][check]} for check in checks)
    assert doc.find("p", id="whole").attrs["data-count"] == "2"
    assert "Submissions that could not be graded" in proc.stdout and "      students: carol\n" in proc.stdout
    assert proc.stdout.count("static.syntax_error: 1 student") == 1 and proc.stdout.count("load.empty: 1 student") == 1
    top = doc.find("tr", data_cause="cause.summed_not_averaged")
    assert top.attrs["data-count"] == "2" and "Cause: gradient is world_size times the mean" in top.text()
    # the terminal: the cause, how many, who
    assert "  cause.summed_not_averaged: 2 students: Cause: gradient is world_size times the mean" in proc.stdout
    assert re.search(r"students: <img src=x onerror=console\.error\(1\)> & 'q', bob\n", proc.stdout)
    assert "Class report: " in proc.stdout and str(out / "report.html") in proc.stdout


@pytest.mark.timeout(150)
def test_each_students_row_links_the_diagram_of_their_visible_run(graded):
    """batch draws each graded student's run at the visible world size beside their results; the report's row
    links it. A submission that never ran (a syntax error, an empty file) has no page and no link."""
    _, out, _ = graded
    doc = parse((out / "report.html").read_text(encoding="utf-8"))
    rows = {r.attrs["data-student"]: r for r in doc.find("table", id="student-table").find_all("tr", data_student=True)}
    for name, fixture in NAMES.items():
        data = json.loads((out / results_name(name)).read_text(encoding="utf-8"))
        links = rows[name].find_all("a")
        if name in ("carol", "erin"):
            assert not links and "timeline" not in data["extra_data"]["batch"] and not (out / timeline_name(name)).exists()
            continue
        (link,) = links
        assert link.attrs["href"] == timeline_name(name) == data["extra_data"]["batch"]["timeline"] and link.text() == name
        page = parse((out / link.attrs["href"]).read_text(encoding="utf-8"))
        assert page.find("svg", data_kind="timeline").attrs["data-world-size"] == "2"   # the visible run only
        ops = page.find_all("g", data_kind="op")
        assert {(g.attrs["data-name"], g.attrs["data-state"]) for g in ops} == {("all_reduce", "ok"), ("all_gather", "ok")}
        assert not page.find_all("img")   # the hostile name is text in its page too


@pytest.mark.timeout(150)
def test_the_students_table_names_each_cause_in_words(graded):
    """A TA reads bob's row: the cause as his feedback words it, not its catalog key (which stays in
    data-cause, for a script); the whole words on hover where they are cut."""
    _, out, _ = graded
    doc = parse((out / "report.html").read_text(encoding="utf-8"))
    rows = {r.attrs["data-student"]: r for r in doc.find("table", id="student-table").find_all("tr", data_student=True)}
    causes = rows["bob"].find_all("td")[3]
    shown = causes.find_all("span", class_="cause-words")
    assert [s.attrs["data-cause"] for s in shown] == ["cause.summed_not_averaged"]
    assert "Cause: gradient is world_size times the mean" in causes.text()
    assert "cause.summed_not_averaged" not in causes.text() and "cause." not in shown[0].attrs["title"]
    assert "empty" in rows["erin"].find_all("td")[3].text() and "load.empty" not in rows["erin"].find_all("td")[3].text()
    assert rows["alice"].find_all("td")[3].text() == ""


@pytest.mark.timeout(150)
def test_a_resumed_batch_rebuilds_the_same_report(graded):
    cls, out, _ = graded
    before = (out / "report.html").read_bytes(), (out / "causes.csv").read_bytes()
    (out / "report.html").unlink()
    (out / "causes.csv").write_text("stale")
    again = run_cli("batch", str(cls), "--out", str(out), "--exercise", "dist_primitives", "--lang", "en")
    assert again.returncode == 0 and f"Graded 0, reused {len(NAMES)}" in again.stdout, again.stdout + again.stderr
    assert ((out / "report.html").read_bytes(), (out / "causes.csv").read_bytes()) == before


@pytest.mark.timeout(200)
def test_report_renders_in_a_browser_with_no_console_message(graded, tmp_path):
    _, out, _ = graded
    grades = _grades(out)
    # the probe sees console errors: a page with one is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><title>x</title><script>undefined_function()</script>")
    _, messages = open_in_browser(bad.as_uri(), tmp_path / "profile-bad")
    assert any("undefined_function" in m for m in messages), messages
    # the report, sorted by score, highest first, through its address
    dom, messages = open_in_browser((out / "report.html").as_uri() + "#sort=1-desc", tmp_path / "profile")
    assert messages == []
    doc = parse(dom)
    table = doc.find("table", id="student-table")
    assert table.attrs.get("data-ready") == "1"
    assert table.find("th", aria_sort="descending").text().strip() == "Score"
    order = [(r.attrs["data-student"], float(r.find_all("td")[1].text())) for r in table.find_all("tr", data_student=True)]
    assert [s for _, s in order] == sorted((float(r["total"]) for r in grades.values()), reverse=True)
    assert len(order) == len(grades) and not table.find_all("img")     # the name is text, not an element
