"""What the class got wrong: a batch's per-student results brought together, for TAs.

    report = build(rows, exercise, lang)          # rows: [(student, results.json dict)], as batch.run has them
    causes_csv(report)                            # OUT/causes.csv (and classpage.page(report): OUT/report.html)
    print(terminal(report))                       # per check: pass rate, common causes, who has them

Everything is read from each student's results (`extra_data`: outcomes, scores, causes, and traffic when
an exercise records it), so a resumed batch gives the same report as a fresh one.

Which causes count ("named causes"). A failed check's results list catalog keys
(feedback/results.py::causes). Its named causes are the keys of the first of these tiers it has:
  1. `cause.*` and `<exercise>.cause.*`: the mistake, in the student's terms ("divide by world_size");
  2. failure verdicts: `fail.*` (timeout, deadlock, exception, missing value, not from the communication,
     a resource limit ...), `static.*` (syntax error, operation never reached), `load.*`;
     except `fail.stopped`, `fail.grader`, `fail.grader_run`, which say nothing of the student's code;
  3. `why.*`: what the provenance tracer found (a rank's data counted twice, not delivered ...).
A tier below is left out when a tier above is there: "rank 1 raised ValueError" is not counted beside the
cause that explains it. A failed check with none of these counts as `other` (OTHER); a student whose
grading failed counts as `summary.grader_failed` on every check. A student with one cause on several
checks is one student for that cause.
"""
from __future__ import annotations

import csv
import io
import os
import re
import statistics
from dataclasses import dataclass, field

from ..feedback.messages import render
from ..feedback.render import HINTS, words
from ..model import Outcome
from .gradebook import cell, printable, verdict

OTHER = "other"
GRADER_FAILED = "summary.grader_failed"
WHOLE = "*"              # the check of a cause that stopped the whole submission (causes.csv)
BLANKET = ("not_submitted", "syntax_error", "no_entry", "no_exercise")   # outcomes of nothing that could be graded
NOT_ABOUT_THE_CODE = ("fail.stopped", "fail.grader", "fail.grader_run")
TERMINAL_CAUSES = 3      # named causes shown per check on the terminal (then "other")
TIMELINE_NAME = re.compile(r"[\w.\-]+\.timeline\.html")   # a page batch wrote beside the results: no path
TERMINAL_NAMES = 10      # students named per cause on the terminal (all of them: causes.csv, report.html)
TERMINAL_TEXT = 110      # characters of a cause's example words on the terminal


# -- text that is safe to show ------------------------------------------------------------------------
def one_line(text: str) -> str:
    """A cause's words on one line: runs of whitespace (the indent of why.*, an exception's newlines) as one space."""
    return printable(re.sub(r"\s+", " ", str(text)).strip())


# -- the figures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cause:
    """One named cause of one failed check of one student, with its words in the batch's language."""
    student: str
    check: str
    key: str
    text: str


@dataclass
class CheckFigures:
    id: str
    title: str
    points: float
    hidden: bool
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    causes: dict[str, list[str]] = field(default_factory=dict)   # key -> students, most common first; OTHER last

    @property
    def count(self) -> int:
        return len(self.passed) + len(self.failed)

    @property
    def rate(self) -> float:
        return 100.0 * len(self.passed) / self.count if self.count else 0.0


@dataclass
class StudentFigures:
    name: str
    score: float
    verdict: str
    causes: list[str]            # distinct keys, in rubric order of the checks they explain
    timeline: str | None = None  # the page of the student's visible run, beside its results (batch)


@dataclass
class Bin:
    label: str
    low: float                   # a total t is in the bin when low <= t < high (the last: t == total)
    high: float
    count: int


@dataclass
class Traffic:
    """One student's traffic for one check (see `traffic_of`)."""
    student: str
    check: str
    world_size: int
    size: int                    # S: the bytes of the tensor
    bound: int                   # what a ring lets one rank send
    sent: list[int]              # bytes each rank sent

    @property
    def most(self) -> int:
        return max(self.sent)

    @property
    def ratio(self) -> float:
        return self.most / self.bound if self.bound else 0.0


@dataclass
class ClassReport:
    exercise: str
    title: str
    lang: str
    total: float
    students: list[StudentFigures]
    checks: list[CheckFigures]
    causes: list[Cause]          # sorted: student, check (rubric order), key
    bins: list[Bin]
    traffic: list[Traffic]
    whole: dict[str, list[str]] = field(default_factory=dict)   # key -> students it stopped entirely, most first

    def top_causes(self) -> list[tuple[str, list[str], list[str], Cause]]:
        """(key, students, checks, an example) for every cause in the class, most students first; OTHER last."""
        students: dict[str, set[str]] = {}
        checks: dict[str, list[str]] = {}
        example: dict[str, Cause] = {}
        for c in self.causes:
            students.setdefault(c.key, set()).add(c.student)
            checks.setdefault(c.key, [])
            if c.check not in checks[c.key]:
                checks[c.key].append(c.check)
            example.setdefault(c.key, c)
        order = {check.id: i for i, check in enumerate(self.checks)}
        keys = sorted(students, key=lambda k: (k == OTHER, -len(students[k]), k))
        return [(k, sorted(students[k], key=os.fsencode), sorted(checks[k], key=lambda c: order.get(c, len(order))), example[k])
                for k in keys]


def tier(key: str) -> int | None:
    """1, 2 or 3 for a named cause (see the module's docstring), None for one that is not named."""
    if key == GRADER_FAILED:
        return 0
    if key.startswith("cause.") or ".cause." in key:
        return 1
    if key.startswith(("static.", "load.")) or (key.startswith("fail.") and key not in NOT_ABOUT_THE_CODE):
        return 2
    if key.startswith("why."):
        return 3
    return None


def named_causes(recorded: list, outcome: str | None, lang: str) -> list[tuple[str, str]]:
    """(key, words) of one failed check: its named causes (one per key, the first words), else OTHER with
    the first words recorded, or the hint for its outcome."""
    entries = [(str(c.get("key", "")), str(c.get("text", ""))) for c in recorded if isinstance(c, dict)]
    tiers = [t for t in (tier(k) for k, _ in entries) if t is not None]
    if not tiers:
        if entries:
            return [(OTHER, one_line(entries[0][1]))]
        try:
            hint = HINTS.get(Outcome(outcome), "hint.wrong")
        except ValueError:
            hint = "hint.wrong"
        return [(OTHER, render(hint, {}, lang))]
    best, out = min(tiers), {}
    for key, text in entries:
        if tier(key) == best and key not in out:
            out[key] = one_line(text)
    return list(out.items())


def check_title(check, lang: str) -> str:
    """A check's title for staff: hidden ones too show their world size."""
    try:
        return words(check.title, lang).format(ws=check.world_size, op=check.op, quantity=check.quantity)
    except (KeyError, IndexError, ValueError):
        return words(check.title, lang)


def histogram(totals: list[float], total: float) -> list[Bin]:
    """Ten bins of a tenth of the total each, and one for full marks: the bins of batch's terminal histogram."""
    counts = [0] * 11
    for t in totals:
        counts[min(max(int(t * 10 // total), 0), 10) if total else 10] += 1
    bins = []
    for i, n in enumerate(counts):
        low = total * i / 10
        label = f"{low:g}" if i == 10 else f"{low:g}-{low + total / 10 - 1:g}"
        bins.append(Bin(label, low, total if i == 10 else total * (i + 1) / 10, n))
    return bins


def traffic_of(name: str, extra: dict) -> list[Traffic]:
    """An exercise that grades traffic records, for staff, in `extra_data["traffic"]` a list of
    {"check": id, "world_size": N, "size": bytes of the tensor, "bound": bytes a ring lets one rank send,
     "sent": [bytes sent by each rank]}. Records that do not have this shape are left out."""
    out = []
    for rec in _list(extra.get("traffic")):
        try:
            sent = [int(b) for b in rec["sent"]]
            item = Traffic(name, str(rec["check"]), int(rec["world_size"]), int(rec["size"]), int(rec["bound"]), sent)
        except (KeyError, TypeError, ValueError):
            continue
        if sent and item.bound > 0:
            out.append(item)
    return out


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def build(rows: list[tuple[str, dict]], exercise, lang: str) -> ClassReport:
    """The class's figures from each student's results; `rows` as batch.run has them."""

    checks = [CheckFigures(c.id, check_title(c, lang), c.points, c.hidden) for c in exercise.checks]
    order = {c.id: i for i, c in enumerate(exercise.checks)}
    students, causes, traffic, whole = [], [], [], {}
    for name, data in sorted(rows, key=lambda row: os.fsencode(row[0])):
        name = printable(name)
        extra = _dict(data.get("extra_data"))
        outcomes, recorded = _dict(extra.get("outcomes")), _dict(extra.get("causes"))
        failed_grading = bool(extra.get("grader_error"))
        mine = []
        if failed_grading or (outcomes and all(outcomes.get(spec.id) in BLANKET for spec in exercise.checks)):
            first = exercise.checks[0].id if exercise.checks else ""
            found = ([(GRADER_FAILED, render(GRADER_FAILED, {}, lang))] if failed_grading
                     else named_causes(_list(recorded.get(first)), outcomes.get(first), lang))
            for key, text in found:
                causes.append(Cause(name, WHOLE, printable(key), text))
                whole.setdefault(printable(key), []).append(name)
                mine.append(printable(key))
            for check in checks:
                check.failed.append(name)
        for check, spec in zip(checks, exercise.checks) if not mine else ():
            outcome = outcomes.get(spec.id)
            if outcome == "pass" and not failed_grading:
                check.passed.append(name)
                continue
            check.failed.append(name)
            found = ([(GRADER_FAILED, render(GRADER_FAILED, {}, lang))] if failed_grading
                     else named_causes(_list(recorded.get(spec.id)), outcome, lang))
            for key, text in found:
                causes.append(Cause(name, spec.id, printable(key), text))
                check.causes.setdefault(printable(key), []).append(name)
                mine.append(printable(key))
        try:
            score = float(data.get("score", 0))
        except (TypeError, ValueError):
            score = 0.0
        page = _dict(extra.get("batch")).get("timeline")
        page = page if isinstance(page, str) and TIMELINE_NAME.fullmatch(page) else None
        students.append(StudentFigures(name, score, printable(verdict(data, exercise)), list(dict.fromkeys(mine)), page))
        traffic += traffic_of(name, extra)
    for check in checks:
        check.causes = dict(sorted(check.causes.items(), key=lambda kv: (kv[0] == OTHER, -len(kv[1]), kv[0])))
    causes.sort(key=lambda c: (os.fsencode(c.student), order.get(c.check, -1), c.key))
    whole = dict(sorted(whole.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    return ClassReport(exercise.name, words(exercise.title, lang), lang, exercise.total, students, checks, causes,
                       histogram([s.score for s in students], exercise.total), traffic, whole)


# -- causes.csv and the terminal -----------------------------------------------------------------------
def causes_csv(report: ClassReport) -> str:
    """One row per student, check and cause: the same rows give the same bytes."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student", "check", "cause", "text"])
    for c in report.causes:
        writer.writerow([cell(c.student), cell(c.check), cell(c.key), cell(c.text)])
    return buf.getvalue()


def cause_words(key: str, lang: str) -> str:
    return render("classreport.other", {}, lang) if key == OTHER else key


def check_words(check: str, lang: str) -> str:
    """A check's id, or the words for every check (WHOLE)."""
    return render("classreport.every_check", {}, lang) if check == WHOLE else check


def terminal(report: ClassReport) -> str:
    """Per check: its pass rate; its most common causes, each with how many students, one example of
    its words and the students who have it; then how many causes were left off, and OTHER."""
    lang = report.lang
    example = {(c.check, c.key): c.text for c in reversed(report.causes)}   # the first student's words
    lines = [""]
    if report.whole:
        lines.append(render("classreport.whole", {}, lang))
        for key, names in report.whole.items():
            lines += _cause_lines(key, names, example.get((WHOLE, key), ""), lang)
    lines.append(render("classreport.checks", {}, lang))
    for check in report.checks:
        lines.append(render("classreport.check", {"check": check.id, "title": check.title, "passed": len(check.passed),
                                                  "count": check.count, "rate": check.rate}, lang))
        named = [(k, v) for k, v in check.causes.items() if k != OTHER]
        for key, names in named[:TERMINAL_CAUSES]:
            lines += _cause_lines(key, names, example.get((check.id, key), ""), lang)
        if len(named) > TERMINAL_CAUSES:
            lines.append(render("classreport.more_causes", {"count": len(named) - TERMINAL_CAUSES}, lang))
        if OTHER in check.causes:
            lines += _cause_lines(OTHER, check.causes[OTHER], "", lang)
    return "\n".join(lines) + "\n"


def _cause_lines(key: str, names: list[str], text: str, lang: str) -> list[str]:
    """`  cause.x: 12 students: <its words>` and, below, who they are."""
    if len(text) > TERMINAL_TEXT:
        text = text[:TERMINAL_TEXT - 1] + "…"
    head = render("classreport.cause_one" if len(names) == 1 else "classreport.cause", {"key": cause_words(key, lang), "count": len(names)}, lang)
    who = render("list.comma", {}, lang).join(names[:TERMINAL_NAMES])
    if len(names) > TERMINAL_NAMES:
        who += render("classreport.more", {"count": len(names) - TERMINAL_NAMES}, lang)
    return [head + (render("list.colon", {}, lang) + text if text else ""), render("classreport.who", {"names": who}, lang)]


def mean_median(report: ClassReport) -> str:
    totals = [s.score for s in report.students]
    if not totals:
        return ""
    return render("batch.mean_median", {"count": len(totals), "mean": statistics.fmean(totals),
                                        "median": statistics.median(totals), "max": report.total}, report.lang)
