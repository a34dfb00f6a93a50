"""OUT/report.html: a class report (classreport.ClassReport) as one self-contained page.

It works offline and from disk: no script, font, style or image is fetched (the page's Content Security
Policy forbids it), the pictures are plain HTML/CSS bars, and the only script is the small inline one that
sorts the students' table (`#sort=COLUMN` or `#sort=COLUMN-desc` in the address sorts it on opening).
Each figure carries its numbers as data-* attributes (data-count, data-passed ...) beside the text a reader
sees, so tests read the same numbers the bars are drawn from.

The page is a Jinja2 template (PAGE): every value it shows is HTML-escaped by Jinja2's autoescape, and shown
with its control characters escaped (gradebook.printable, the template's `finalize`), so a student's name or
words can never become markup, whatever the template forgets. Only the page's own style, script and policy
are marked safe (Markup).
"""
from __future__ import annotations

from urllib.parse import quote

import jinja2
from markupsafe import Markup

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

PAGE = """\
{%- macro joined(items, sep) %}{% for x in items %}{% if not loop.first %}{{ sep }}{% endif %}{{ x }}{% endfor %}{% endmacro -%}
{%- macro who(students) %}{% if students | length <= who_shown %}{{ joined(students, comma) }}
{%- else %}<details><summary>{{ students | length }}</summary>{{ joined(students, comma) }}</details>{% endif %}{% endmacro -%}
<!DOCTYPE html>
<html lang="{{ 'zh-CN' if lang == 'zh' else 'en' }}"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ t('classreport.title', title=report.title) }}</title><style>{{ style }}</style></head><body>
<header><h1>{{ t('classreport.title', title=report.title) }}</h1>
<p class="note"><code>{{ report.exercise }}</code> · {{ mean_median }}</p></header>
<section id="histogram"><h2>{{ t('classreport.histogram') }}</h2><div class="hist">
{%- for b in report.bins %}<div class="bin" data-label="{{ b.label }}" data-low="{{ num(b.low) }}" \
data-high="{{ num(b.high) }}" data-count="{{ b.count }}" title="{{ b.label }}: {{ b.count }}"><span class="n">{{ b.count }}</span>\
<div class="col" style="height:{{ '%.1f' | format(100 * b.count / top) }}%"></div></div>{% endfor %}</div>\
<div class="labels">{% for b in report.bins %}<span>{{ b.label }}</span>{% endfor %}</div>\
<p class="note">{{ t('classreport.histogram_note') }}</p></section>
<section id="checks"><h2>{{ t('classreport.pass_rates') }}</h2>
{%- for c in report.checks %}<div class="check" data-check="{{ c.id }}" data-passed="{{ c.passed | length }}" \
data-count="{{ c.count }}"><div><code>{{ c.id }}</code> {{ c.title }}\
{% if c.hidden %}<span class="tag">{{ t('classreport.hidden') }}</span>{% endif %}</div>\
<div class="track"><div class="fill" style="width:{{ '%.1f' | format(c.rate) }}%"></div></div>\
<div class="rate">{{ t('classreport.rate', passed=c.passed | length, count=c.count, rate=c.rate) }}</div>\
{% if c.causes %}<ul class="why">{% for key, names in c.causes.items() %}<li data-cause="{{ key }}" \
data-count="{{ names | length }}">{{ words(key) }}: {{ names | length }}</li>{% endfor %}</ul>{% endif %}</div>{% endfor %}\
{% if whole %}<p class="note" id="whole" data-count="{{ whole | length }}">{{ t('classreport.whole_note', count=whole | length) }}</p>\
{% endif %}</section>
<section id="causes"><h2>{{ t('classreport.top_causes') }}</h2>
{%- if not top_causes %}<p>{{ t('classreport.no_causes') }}</p></section>
{% else %}<p class="note">{{ t('classreport.top_causes_note') }}</p><table><thead><tr>\
<th class="num">{{ t('classreport.col_count') }}</th><th>{{ t('classreport.col_cause') }}</th>\
<th>{{ t('classreport.col_checks') }}</th><th>{{ t('classreport.col_example') }}</th><th>{{ t('classreport.col_who') }}</th>\
</tr></thead><tbody>
{%- for key, students, checks, ex in top_causes %}<tr class="cause" data-cause="{{ key }}" data-count="{{ students | length }}">\
<td class="num">{{ students | length }}</td><td><code>{{ words(key) }}</code></td>\
<td>{% for c in checks %}{% if not loop.first %}{{ comma }}{% endif %}{{ check_words(c) }}{% endfor %}</td><td>\
{% if key != other or ex.text %}<blockquote>{{ ex.text }}</blockquote><span class="note">\
{{ t('classreport.example', student=ex.student, check=check_words(ex.check)) }}</span>{% endif %}</td>\
<td>{{ who(students) }}</td></tr>{% endfor %}</tbody></table></section>
{% endif -%}
<section id="students"><h2>{{ t('classreport.students') }}</h2><p class="note">{{ t('classreport.sort_note') }}</p>\
<table id="student-table"><thead><tr>
{%- for key, kind in columns %}<th data-type="{{ kind }}"{% if kind == 'number' %} class=num{% endif %}\
{% if loop.first %} aria-sort=ascending{% endif %}><button type="button">{{ t(key) }}</button></th>{% endfor %}</tr></thead><tbody>
{%- for s in report.students %}<tr data-index="{{ loop.index0 }}" data-student="{{ s.name }}"\
{% if s.verdict == 'pass' %} class=pass{% endif %}><td>{% if s.timeline is not none %}<a href="{{ quote(s.timeline) }}" \
title="{{ t('classreport.timeline') }}">{{ s.name }}</a>{% else %}{{ s.name }}{% endif %}</td>\
<td class="num" data-sort="{{ num(s.score) }}">{{ num(s.score) }}</td><td>{{ s.verdict }}</td><td data-sort="{{ s.causes | join(' ') }}">
{%- for k in s.causes %}{% if not loop.first %}<br>{% endif %}{% set text = said(s.name, k) %}<span class="cause-words" \
data-cause="{{ k }}" title="{{ text }}">{{ text if text | length <= cause_words else text[:cause_words - 1] ~ '…' }}</span>\
{% endfor %}</td></tr>{% endfor %}</tbody></table></section>
{% if traffic %}<section id="traffic"><h2>{{ t('classreport.traffic') }}</h2><p class="note">{{ t('classreport.traffic_note') }}</p>
{%- for g in traffic %}<div class="traffic" data-check="{{ g.check }}" data-world-size="{{ g.ws }}" data-over="{{ g.over }}">\
<p>{{ t('classreport.traffic_check', check=g.check, ws=g.ws, within=g['items'] | length - g.over, over=g.over) }}</p>\
<table><thead><tr>{% for k in traffic_columns %}<th{% if k != 'classreport.col_student' %} class=num{% endif %}>{{ t(k) }}</th>\
{% endfor %}<th></th></tr></thead><tbody>
{%- for i in g['items'] %}<tr data-student="{{ i.student }}" data-sent="{{ i.most }}" data-bound="{{ i.bound }}">\
<td>{{ i.student }}</td><td class="num">{{ i.size }}</td><td class="num">{{ i.most }}</td><td class="num">{{ i.bound }}</td>\
<td class="num">{{ '%.2f' | format(i.ratio) }}</td><td><div class="ratio"><div class="fill{% if i.ratio > 1 %} over{% endif %}" \
style="width:{{ '%.1f' | format(100 * i.ratio / g.scale) }}%;height:100%"></div>\
<div class="bound" style="left:{{ '%.1f' | format(100 / g.scale) }}%"></div></div></td></tr>{% endfor %}</tbody></table></div>\
{% endfor %}</section>
{% endif %}<script>{{ script }}</script></body></html>
"""


def _shown(value):
    """What the page shows of a value: a text with its control characters escaped (then autoescaped)."""
    return printable(value) if isinstance(value, str) and not isinstance(value, Markup) else value


_ENV = jinja2.Environment(autoescape=True, finalize=_shown, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_PAGE = _ENV.from_string(PAGE)


def num(x: float) -> str:
    return f"{float(x):g}"


def page(report: ClassReport) -> str:
    lang = report.lang
    groups: dict[tuple[str, int], list] = {}
    for item in report.traffic:
        groups.setdefault((item.check, item.world_size), []).append(item)
    traffic = [{"check": check, "ws": ws, "items": items, "over": sum(1 for i in items if i.ratio > 1),
                "scale": max([i.ratio for i in items] + [1.25])} for (check, ws), items in sorted(groups.items())]
    own = {(c.student, c.key): c.text for c in reversed(report.causes)}   # the words a student's feedback used
    return _PAGE.render(
        report=report, lang=lang, csp=Markup(CSP), style=Markup(STYLE), script=Markup(SORT_SCRIPT),
        t=lambda key, **params: render(key, params, lang), words=lambda key: cause_words(key, lang),
        check_words=lambda check: check_words(check, lang), num=num, mean_median=mean_median(report),
        comma=render("list.comma", {}, lang), who_shown=WHO_SHOWN, other=OTHER,
        top=max([b.count for b in report.bins] + [1]),
        whole=sorted({s for names in report.whole.values() for s in names}),
        top_causes=report.top_causes(),
        columns=(("classreport.col_student", "text"), ("classreport.col_score", "number"),
                 ("classreport.col_verdict", "text"), ("classreport.col_causes", "text")),
        said=lambda student, key: " ".join(str(own.get((student, key)) or cause_words(key, lang)).split()),
        cause_words=CAUSE_WORDS, quote=quote,
        traffic=traffic,   # left out unless some student's results hold traffic figures (classreport.traffic_of)
        traffic_columns=("classreport.col_student", "classreport.col_size", "classreport.col_sent",
                         "classreport.col_bound", "classreport.col_ratio"))
