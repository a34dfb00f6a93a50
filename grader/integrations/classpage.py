"""OUT/report.html: a class report (classreport.ClassReport) as one self-contained page.

It works offline and from disk: no script, font, style or image is fetched (the page's Content Security
Policy forbids it), the pictures are plain HTML/CSS bars, and the only script is the small inline one that
sorts the students' table (`#sort=COLUMN` or `#sort=COLUMN-desc` in the address sorts it on opening).
Every name and text is HTML-escaped. Each figure carries its numbers as data-* attributes (data-count,
data-passed ...) beside the text a reader sees, so tests read the same numbers the bars are drawn from.
"""
from __future__ import annotations

import html
from urllib.parse import quote

from ..feedback.messages import render
from .classreport import OTHER, ClassReport, cause_words, check_words, mean_median, printable

WHO_SHOWN = 12     # a cause's students are listed up to this many; more are folded away (<details>)
CAUSE_WORDS = 160  # characters of a cause's words in the students' table (all of them on hover)
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI","Noto Sans CJK SC","PingFang SC","Microsoft YaHei",sans-serif;
 margin:2rem auto;max-width:70rem;padding:0 1rem;color:#1f2328;background:#fff;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2.2rem;border-bottom:1px solid #d0d7de;padding-bottom:.3rem}
.note{color:#59636e;font-size:.9rem}code{font-size:.85em;background:#f6f8fa;padding:0 .25em;border-radius:3px}
.hist{display:flex;align-items:flex-end;gap:.4rem;height:14rem;padding:.5rem 0;border-bottom:1px solid #8c959f}
.bin{flex:1;display:flex;flex-direction:column;justify-content:flex-end;align-items:center;height:100%}
.bin .col{width:100%;background:#0969da;border-radius:3px 3px 0 0;min-height:1px}
.bin .n{font-size:.85rem;color:#1f2328}.labels{display:flex;gap:.4rem}.labels span{flex:1;text-align:center;font-size:.75rem;color:#59636e}
.check{display:grid;grid-template-columns:minmax(14rem,1.3fr) 2fr 9rem;gap:.2rem .8rem;align-items:center;margin:.6rem 0}
.track{background:#ffebe9;height:1.1rem;border-radius:3px;overflow:hidden;position:relative}
.fill{background:#1a7f37;height:100%}.rate{font-variant-numeric:tabular-nums;font-size:.9rem}
.why{grid-column:2/4;margin:0;padding:0;list-style:none;font-size:.8rem;color:#59636e}.why li{display:inline-block;margin-right:.9rem}
.tag{font-size:.7rem;background:#eaeef2;border-radius:2em;padding:0 .5em;margin-left:.3em;color:#59636e}
table{border-collapse:collapse;width:100%;font-size:.9rem}th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #d0d7de}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}blockquote{margin:0 0 .2rem;white-space:pre-wrap}
th button{font:inherit;font-weight:600;background:none;border:0;padding:0;cursor:pointer;color:inherit}
th[aria-sort=ascending] button::after{content:" \\25B2"}th[aria-sort=descending] button::after{content:" \\25BC"}
tr.pass td:nth-child(3){color:#1a7f37}details summary{cursor:pointer;color:#0969da}
.ratio{position:relative;height:.9rem;background:#f6f8fa;border-radius:3px;min-width:8rem}
.ratio .fill{position:absolute;left:0;top:0;background:#0969da}.ratio .fill.over{background:#cf222e}
.ratio .bound{position:absolute;top:-.15rem;bottom:-.15rem;width:2px;background:#1f2328}
"""

SORT_SCRIPT = """
(function () {
  var table = document.getElementById("student-table");
  if (!table) return;
  var body = table.tBodies[0], heads = table.tHead.rows[0].cells;
  function value(row, col, numeric) {
    var cell = row.cells[col], v = cell.getAttribute("data-sort");
    if (v === null) v = cell.textContent;
    return numeric ? parseFloat(v) : v;
  }
  function sort(col, dir) {
    var numeric = heads[col].getAttribute("data-type") === "number";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = value(a, col, numeric), y = value(b, col, numeric);
      var r = numeric ? x - y : x.localeCompare(y);
      return r ? dir * r : +a.getAttribute("data-index") - +b.getAttribute("data-index");
    });
    rows.forEach(function (row) { body.appendChild(row); });
    for (var i = 0; i < heads.length; i++) heads[i].removeAttribute("aria-sort");
    heads[col].setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
  }
  Array.prototype.forEach.call(heads, function (head, col) {
    head.querySelector("button").addEventListener("click", function () {
      var dir = head.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      sort(col, dir);
      history.replaceState(null, "", "#sort=" + col + (dir < 0 ? "-desc" : ""));
    });
  });
  var wanted = /^#sort=(\\d+)(-desc)?$/.exec(location.hash);
  if (wanted && +wanted[1] < heads.length) sort(+wanted[1], wanted[2] ? -1 : 1);
  table.setAttribute("data-ready", "1");
})();
"""


def esc(text) -> str:
    """Any text from a submission or a student's name, safe inside an element or a quoted attribute."""
    return html.escape(printable(text), quote=True)


def num(x: float) -> str:
    return f"{float(x):g}"


def page(report: ClassReport) -> str:
    lang = report.lang
    t = lambda key, **params: esc(render(key, params, lang))   # noqa: E731  the page's words
    parts = [
        "<!DOCTYPE html>",
        f'<html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{t('classreport.title', title=report.title)}</title><style>{STYLE}</style></head><body>",
        f"<header><h1>{t('classreport.title', title=report.title)}</h1>",
        f'<p class="note"><code>{esc(report.exercise)}</code> · {esc(mean_median(report))}</p></header>',
        histogram_section(report, t),
        checks_section(report, t),
        causes_section(report, t),
        students_section(report, t),
        traffic_section(report, t),
        f"<script>{SORT_SCRIPT}</script></body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def histogram_section(report: ClassReport, t) -> str:
    top = max([b.count for b in report.bins] + [1])
    bars, labels = [], []
    for b in report.bins:
        bars.append(f'<div class="bin" data-label="{esc(b.label)}" data-low="{num(b.low)}" data-high="{num(b.high)}" '
                    f'data-count="{b.count}" title="{esc(b.label)}: {b.count}"><span class="n">{b.count}</span>'
                    f'<div class="col" style="height:{100 * b.count / top:.1f}%"></div></div>')
        labels.append(f"<span>{esc(b.label)}</span>")
    return (f'<section id="histogram"><h2>{t("classreport.histogram")}</h2><div class="hist">{"".join(bars)}</div>'
            f'<div class="labels">{"".join(labels)}</div><p class="note">{t("classreport.histogram_note")}</p></section>')


def checks_section(report: ClassReport, t) -> str:
    rows = []
    for c in report.checks:
        hidden = f'<span class="tag">{t("classreport.hidden")}</span>' if c.hidden else ""
        why = "".join(f'<li data-cause="{esc(key)}" data-count="{len(names)}">{esc(cause_words(key, report.lang))}: {len(names)}</li>'
                      for key, names in c.causes.items())
        rows.append(f'<div class="check" data-check="{esc(c.id)}" data-passed="{len(c.passed)}" data-count="{c.count}">'
                    f'<div><code>{esc(c.id)}</code> {esc(c.title)}{hidden}</div>'
                    f'<div class="track"><div class="fill" style="width:{c.rate:.1f}%"></div></div>'
                    f'<div class="rate">{t("classreport.rate", passed=len(c.passed), count=c.count, rate=c.rate)}</div>'
                    + (f'<ul class="why">{why}</ul>' if why else "") + "</div>")
    whole = sorted({s for names in report.whole.values() for s in names})
    note = (f'<p class="note" id="whole" data-count="{len(whole)}">{t("classreport.whole_note", count=len(whole))}</p>'
            if whole else "")
    return f'<section id="checks"><h2>{t("classreport.pass_rates")}</h2>{"".join(rows)}{note}</section>'


def causes_section(report: ClassReport, t) -> str:
    top = report.top_causes()
    if not top:
        return f'<section id="causes"><h2>{t("classreport.top_causes")}</h2><p>{t("classreport.no_causes")}</p></section>'
    comma = esc(render("list.comma", {}, report.lang))
    rows = []
    for key, students, checks, ex in top:
        example = "" if key == OTHER and not ex.text else (
            f'<blockquote>{esc(ex.text)}</blockquote><span class="note">{t("classreport.example", student=ex.student, check=check_words(ex.check, report.lang))}</span>')
        rows.append(f'<tr class="cause" data-cause="{esc(key)}" data-count="{len(students)}"><td class="num">{len(students)}</td>'
                    f'<td><code>{esc(cause_words(key, report.lang))}</code></td><td>{comma.join(esc(check_words(c, report.lang)) for c in checks)}</td>'
                    f'<td>{example}</td><td>{who(students, comma)}</td></tr>')
    head = "".join(f"<th{cls}>{t(k)}</th>" for k, cls in (("classreport.col_count", ' class="num"'), ("classreport.col_cause", ""),
                                                           ("classreport.col_checks", ""), ("classreport.col_example", ""),
                                                           ("classreport.col_who", "")))
    return (f'<section id="causes"><h2>{t("classreport.top_causes")}</h2><p class="note">{t("classreport.top_causes_note")}</p>'
            f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def who(students: list[str], comma: str) -> str:
    """The students who have a cause: listed, or folded away when there are many."""
    names = comma.join(esc(s) for s in students)
    return names if len(students) <= WHO_SHOWN else f"<details><summary>{len(students)}</summary>{names}</details>"


def name_cell(s, t) -> str:
    """The student's name, a link to the space-time diagram of their visible run where batch drew one."""
    if s.timeline is None:
        return esc(s.name)
    return f'<a href="{esc(quote(s.timeline))}" title="{t("classreport.timeline")}">{esc(s.name)}</a>'


def students_section(report: ClassReport, t) -> str:
    cols = (("classreport.col_student", "text"), ("classreport.col_score", "number"), ("classreport.col_verdict", "text"),
            ("classreport.col_causes", "text"))
    head = "".join(f'<th data-type="{kind}"{" class=num" if kind == "number" else ""}'
                   f'{" aria-sort=ascending" if i == 0 else ""}><button type="button">{t(key)}</button></th>'
                   for i, (key, kind) in enumerate(cols))
    own = {(c.student, c.key): c.text for c in reversed(report.causes)}     # a student's own words for a cause

    def words_of(student: str, key: str) -> str:
        """The cause in the words the student's feedback used (the catalog key stays in data-cause)."""
        text = " ".join(str(own.get((student, key)) or cause_words(key, report.lang)).split())
        short = text if len(text) <= CAUSE_WORDS else text[:CAUSE_WORDS - 1] + "…"
        return f'<span class="cause-words" data-cause="{esc(key)}" title="{esc(text)}">{esc(short)}</span>'
    rows = []
    for i, s in enumerate(report.students):
        causes = "<br>".join(words_of(s.name, k) for k in s.causes)
        rows.append(f'<tr data-index="{i}" data-student="{esc(s.name)}"{" class=pass" if s.verdict == "pass" else ""}>'
                    f'<td>{name_cell(s, t)}</td><td class="num" data-sort="{num(s.score)}">{num(s.score)}</td>'
                    f'<td>{esc(s.verdict)}</td><td data-sort="{esc(" ".join(s.causes))}">{causes}</td></tr>')
    return (f'<section id="students"><h2>{t("classreport.students")}</h2><p class="note">{t("classreport.sort_note")}</p>'
            f'<table id="student-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def traffic_section(report: ClassReport, t) -> str:
    """Left out unless some student's results hold traffic figures (classreport.traffic_of)."""
    if not report.traffic:
        return ""
    groups: dict[tuple[str, int], list] = {}
    for item in report.traffic:
        groups.setdefault((item.check, item.world_size), []).append(item)
    blocks = []
    for (check, ws), items in sorted(groups.items()):
        scale = max([i.ratio for i in items] + [1.25])
        over = sum(1 for i in items if i.ratio > 1)
        rows = "".join(
            f'<tr data-student="{esc(i.student)}" data-sent="{i.most}" data-bound="{i.bound}"><td>{esc(i.student)}</td>'
            f'<td class="num">{i.size}</td><td class="num">{i.most}</td><td class="num">{i.bound}</td><td class="num">{i.ratio:.2f}</td>'
            f'<td><div class="ratio"><div class="fill{" over" if i.ratio > 1 else ""}" style="width:{100 * i.ratio / scale:.1f}%;height:100%"></div>'
            f'<div class="bound" style="left:{100 / scale:.1f}%"></div></div></td></tr>' for i in items)
        head = "".join(f"<th{' class=num' if k != 'classreport.col_student' else ''}>{t(k)}</th>" for k in (
            "classreport.col_student", "classreport.col_size", "classreport.col_sent", "classreport.col_bound", "classreport.col_ratio"))
        blocks.append(f'<div class="traffic" data-check="{esc(check)}" data-world-size="{ws}" data-over="{over}">'
                      f'<p>{t("classreport.traffic_check", check=check, ws=ws, within=len(items) - over, over=over)}</p>'
                      f'<table><thead><tr>{head}<th></th></tr></thead><tbody>{rows}</tbody></table></div>')
    return (f'<section id="traffic"><h2>{t("classreport.traffic")}</h2><p class="note">{t("classreport.traffic_note")}</p>'
            f'{"".join(blocks)}</section>')
