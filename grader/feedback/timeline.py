"""The space-time diagram of a run: a self-contained HTML page (or a fragment a notebook shows) with one
inline SVG, drawn from runview.RunView. No script, font or image from anywhere: the page's own Content
Security Policy forbids every fetch.

One lane per rank; time runs left to right on the switch's clock, which counts events (frames it received,
operations it completed), so the x axis keeps their order and spends its width where the labels need it: a
box is at least as wide as its label. Each operation is a box from entry to completion, labelled with its
name, group and size; a point-to-point message an arrow from the send's entry to its delivery, labelled with
its element count; a collective a bar joining the ranks of its group where it completed, in its group's
colour (dots mark the ranks, so a group reads without colour too). An operation a rank still waited on when
the run ended is hatched and open to the right, its line named; calls that did not fit are red and crossed;
each rank's end (returned, raised where, still waiting) and the run's end (a deadlock, the time limit) are
written at the right. Every element has a title (a tooltip, read by screen readers) and the legend says what
each mark means in words, so nothing relies on colour.

A page stays under PAGE_BYTES: runview keeps at most LIMIT operations (the rest are counted, and the picture
says so), and every text is bounded.
"""
from __future__ import annotations

import hashlib
import unicodedata
from html import escape

from . import runview
from .runview import RunView
from .timeline_words import ending, say, stop as stop_words, why

PAGE_BYTES = 512 << 10   # the page of a run of any length (tests/test_timeline.py measures the worst case)
LEFT, TOP, PAD, BOX_H, ROW_GAP, MAX_ROWS = 86, 72, 14, 30, 4, 3
STEP, GAP_W, CHAR_W, WIDE_W, SANS_W = 10, 150, 6.7, 12.0, 7.0
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
SANS = "DejaVu Sans, Helvetica, Arial, sans-serif"
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D1F", "#000000")  # Okabe-Ito
TINTS = ("#cce3f0", "#fbecc8", "#c7ece2", "#f4e2ec", "#ddf0fb", "#f7d9c7", "#e8e0cc", "#d9d9d9")
RED, INK, GREY = "#c00000", "#222222", "#777777"


def _width(text: str, char: float = CHAR_W) -> float:
    return sum(WIDE_W if unicodedata.east_asian_width(c) in "WF" else char for c in text)


def _a(**attrs) -> str:
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items() if v is not None)


def _text(x, y, text, cls: str = "") -> str:
    """A text of one of the figure's classes (its <style>): l(abel), s(ize), n(umber on an arrow), ax(is),
    red, grey, b(old), c(entred)."""
    return f"<text{_a(x=round(x, 1), y=round(y, 1), class_=cls or None)}>{escape(text)}</text>"


def _style(uid: str) -> str:
    """The figure's own classes, under its id: nothing of a notebook's page is touched."""
    mono = f"font-family:{MONO}"
    rules = {"text": f"font:12px {SANS};fill:{INK}", ".l": f"{mono};font-size:11px", ".s": f"{mono};font-size:10px;fill:#444",
             ".n": f"{mono};font-size:10px;paint-order:stroke;stroke:#fff;stroke-width:3px", ".ax": "font-size:9px;fill:#777",
             ".red": f"fill:{RED}", ".grey": f"fill:{GREY}", ".b": "font-weight:bold", ".c": "text-anchor:middle"}
    return "<style>" + "".join(f"#{uid} {sel}{{{rule}}}" for sel, rule in rules.items()) + "</style>"


def _labels(op: runview.Op, view: RunView) -> tuple[str, str]:
    mark = {"failed": "✕ ", "blocked": "‖ "}.get(op.state, "")
    arrow = "" if op.collective else ("→" if op.op == "send" else "←") + ("?" if op.peer is None else str(op.peer))
    group = view.group_names[op.group]
    whole = view.groups[op.group] == tuple(range(view.world_size))
    size = f"{op.numel}×{op.dtype}" if op.dtype != "?" else ""   # a barrier carries nothing
    return mark + op.name + arrow, size if not op.collective and whole else f"{group} {size}".strip()


def _title(op: runview.Op, view: RunView, lang: str) -> str:
    parts = [say("op", {"rank": op.rank, "n": op.seq + 1, "name": op.name}, lang)]
    if op.collective or view.groups[op.group] != tuple(range(view.world_size)):
        parts.append(say("op_group", {"group": view.group_names[op.group]}, lang))
    if not op.collective:
        key = "op_any" if op.peer is None else "op_to" if op.op == "send" else "op_from"
        parts.append(say(key, {"peer": op.peer}, lang))
    if op.dtype != "?":
        parts.append(say("op_size", {"numel": op.numel, "dtype": op.dtype}, lang))
    if op.line is not None:
        parts.append(say("op_line", {"line": op.line}, lang))
    parts.append(say("op_time", {"entered": op.entered, "completed": op.completed}, lang) if op.completed is not None
                 else say("op_never", {"entered": op.entered}, lang))
    if op.state in ("blocked", "open"):
        parts.append(say("state_" + op.state, {}, lang))
    if op.why is not None:
        parts.append(why(op.why, lang))
    return "\n".join(parts)


class _Layout:
    """Where each clock tick, lane and row is: ticks in order, STEP apart at least, a box's end at least its
    label's width after its start, the operations left out given GAP_W; rows where a rank's operations
    overlap (an isend still open while an irecv runs)."""

    def __init__(self, view: RunView):
        self.view = view
        self.row, rows = runview.rows(view, MAX_ROWS)
        self.top, y = [], TOP
        for r in range(view.world_size):
            self.top.append(y)
            y += rows[r] * (BOX_H + ROW_GAP) + 2 * PAD
        self.bottom = y
        # a tick is (clock, 0) where the switch took a call, (clock, 1) where calls completed: a call that
        # failed as it arrived completes at the clock it entered, after its entry
        need: dict[tuple, list] = {}
        self.end = (view.end, 0)
        ticks = {self.end} | {(e.at, 1) for e in view.ends}
        for op in view.ops:
            end = self.done(op)
            ticks |= {(op.entered, 0), end}
            need.setdefault(end, []).append(((op.entered, 0), max(_width(t) for t in _labels(op, view)) + 12))
        self.x: dict[tuple, float] = {}
        self.gap: float | None = None
        prev = None
        for t in sorted(ticks):
            x = LEFT + 12 if prev is None else self.x[prev] + STEP
            if view.hidden is not None and self.gap is None and prev is not None and prev[0] < view.hidden.last <= t[0]:
                self.gap = x
                x += GAP_W
            for start, width in need.get(t, ()):
                x = max(x, self.x[start] + width)
            self.x[t] = x
            prev = t
        if view.hidden is not None and self.gap is None:
            self.gap = self.x[prev] + STEP
        self.right = self.x[self.end]

    def done(self, op) -> tuple:
        return (op.completed, 1) if op.completed is not None else self.end

    def box_y(self, rank: int, seq: int) -> float:
        return self.top[rank] + PAD + self.row.get((rank, seq), 0) * (BOX_H + ROW_GAP)

    def lane_mid(self, rank: int) -> float:
        return self.top[rank] + PAD + BOX_H / 2


def figure(view: RunView | None, lang: str = "zh") -> str:
    """The diagram as an HTML fragment: inline styles, and the SVG's own classes under its own id, so that a
    notebook shows it without touching its page."""
    if view is None:
        return f'<div class="grader-timeline" data-kind="none"><p>{escape(say("none", {}, lang))}</p></div>'
    uid = "tl" + hashlib.sha1(repr((view.world_size, view.total, view.end, view.ops[:4])).encode()).hexdigest()[:10]
    stop = stop_words(view, lang)
    caption = say("caption", {"ws": view.world_size, "ops": view.total, "stop": stop}, lang)
    if view.hidden is not None:
        caption += " " + say("hidden", {"n": view.hidden.ops, "first": view.hidden.first, "last": view.hidden.last}, lang)
    return (f'<div class="grader-timeline" style="font-family:{SANS};color:{INK}">'
            f'<p style="margin:4px 0">{escape(caption)}</p>'
            f'<div style="overflow-x:auto;max-width:100%;border:1px solid #ddd">{_svg(view, lang, uid, stop, caption)}</div>'
            f'{_legend(view, lang)}</div>')


def _svg(view: RunView, lang: str, uid: str, stop: str, caption: str) -> str:
    lay = _Layout(view)
    right_texts = {e.rank: _end_lines(e, view, lang) for e in view.ends}
    column = max([_width(t, SANS_W) for lines in right_texts.values() for t in lines] + [_width(stop, SANS_W)])
    width = int(lay.right + 20 + column + 16)
    height = int(lay.bottom + 12)
    arrow = '<marker id="{id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" ' \
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{fill}"/></marker>'
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" id="{uid}"{_a(width=width, height=height)}'
           f' aria-labelledby="{uid}-t {uid}-d" data-kind="timeline" data-world-size="{view.world_size}">',
           f'<title id="{uid}-t">{escape(say("figure", {}, lang))}</title><desc id="{uid}-d">{escape(caption)}</desc>',
           _style(uid), "<defs>", arrow.format(id=f"{uid}-arrow", fill=INK), arrow.format(id=f"{uid}-bad", fill=RED),
           f'<pattern id="{uid}-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
           f'<rect width="6" height="6" fill="#fff3f3"/><line x1="0" y1="0" x2="0" y2="6" stroke="{RED}" stroke-width="2" '
           f'stroke-opacity="0.35"/></pattern></defs>']
    out += _lanes(view, lay, lang, width)
    out += _axis(lay, lang)
    if view.hidden is not None:
        out += _hidden(view, lay, lang)
    out += [_box(op, view, lay, lang, uid) for op in view.ops]
    out += [_band(b, view, lay, lang) for b in view.bands]
    out += [_message(m, lay, lang, uid) for m in view.messages]
    out += _ends(view, lay, right_texts, stop)
    out.append("</svg>")
    return "".join(out)


def _lanes(view: RunView, lay: _Layout, lang: str, width: int) -> list[str]:
    out = []
    for r in range(view.world_size):
        bottom = lay.top[r + 1] if r + 1 < view.world_size else lay.bottom
        name = say("lane", {"rank": r}, lang)
        out.append(f'<g data-kind="lane" data-rank="{r}"><title>{escape(name)}</title>'
                   f'<rect{_a(x=0, y=lay.top[r], width=width, height=bottom - lay.top[r], fill="#f7f7f7" if r % 2 else "#ffffff")}/>'
                   f'<line{_a(x1=LEFT, y1=lay.lane_mid(r), x2=round(lay.right, 1), y2=lay.lane_mid(r), stroke="#bbbbbb", stroke_dasharray="2 3")}/>'
                   + _text(8, lay.lane_mid(r) + 4, name, "b") + "</g>")
    return out


def _axis(lay: _Layout, lang: str) -> list[str]:
    """The switch's clock above the lanes: a reading wherever there is room for one."""
    y = TOP - 24
    out = [f'<g data-kind="axis"><line{_a(x1=LEFT, y1=y, x2=round(lay.right, 1), y2=y, stroke=GREY)}/>',
           _text(8, y + 4, say("axis", {}, lang), "ax")]
    last = -1e9
    for (t, phase), x in sorted(lay.x.items()):
        if x - last >= 56 and x <= lay.right and not phase:
            out.append(f'<line{_a(x1=round(x, 1), y1=y - 3, x2=round(x, 1), y2=y + 3, stroke=GREY)}/>'
                       + _text(x, y - 6, str(t), "ax c"))
            last = x
    out.append("</g>")
    return out


def _box(op: runview.Op, view: RunView, lay: _Layout, lang: str, uid: str) -> str:
    x0, x1 = lay.x[(op.entered, 0)], lay.x[lay.done(op)]
    y = lay.box_y(op.rank, op.seq)
    w = max(x1 - x0, 4)
    colour, tint = (COLOURS[op.group % len(COLOURS)], TINTS[op.group % len(TINTS)]) if op.collective else ("#555555", "#f0f0f0")
    line1, line2 = _labels(op, view)
    attrs = dict(data_kind="op", data_rank=op.rank, data_seq=op.seq, data_name=op.name, data_op=op.op, data_state=op.state,
                 data_group=view.group_names[op.group], data_line=op.line if isinstance(op.line, int) else None)
    out = [f"<g{_a(**attrs)}><title>{escape(_title(op, view, lang))}</title>"]
    if op.state == "blocked":   # hatched, open to the right: it never ended
        out.append(f'<rect{_a(x=round(x0, 1), y=y, width=round(w, 1), height=BOX_H, fill=f"url(#{uid}-hatch)")}/>'
                   f'<path{_a(d=f"M{x1:.1f},{y} H{x0:.1f} V{y + BOX_H} H{x1:.1f}", fill="none", stroke=RED, stroke_width=2)}/>')
    else:
        failed = op.state == "failed"
        out.append(f'<rect{_a(x=round(x0, 1), y=y, width=round(w, 1), height=BOX_H, rx=3, fill="#ffecec" if failed else tint, stroke=RED if failed else colour, stroke_width=2.5 if failed else 1.2, stroke_dasharray="5 3" if op.state in ("failed", "open") else None)}/>')
    red = " red" if op.state in ("failed", "blocked") else ""
    out.append(_text(x0 + 5, y + 12, line1, "l" + red) + _text(x0 + 5, y + 25, line2, "s") + "</g>")
    return "".join(out)


def _band(band: runview.Band, view: RunView, lay: _Layout, lang: str) -> str:
    x = lay.x[(band.at, 1)]
    ys = [lay.box_y(r, s) for r, s in zip(band.ranks, band.seqs)]
    y0, y1 = min(ys) - 4, max(ys) + BOX_H + 4
    colour = COLOURS[band.group % len(COLOURS)] if band.ok else RED
    group = view.group_names[band.group]
    title = say("band" if band.ok else "band_bad", {"name": band.name, "group": group, "n": band.index + 1, "at": band.at}, lang)
    out = [f'<g{_a(data_kind="band", data_name=band.name, data_group=group, data_ranks=",".join(map(str, band.ranks)), data_ok=int(band.ok))}>'
           f"<title>{escape(title)}</title>"
           f'<rect{_a(x=round(x - 2.5, 1), y=round(y0, 1), width=5, height=round(y1 - y0, 1), fill=colour, fill_opacity=0.85)}/>']
    out += [f'<circle{_a(cx=round(x, 1), cy=round(y + BOX_H / 2, 1), r=4.5, fill=colour, stroke="#ffffff", stroke_width=1.5)}/>' for y in ys]
    if not band.ok:   # where the ranks diverged
        out.append('<g data-kind="diverged">' + _text(x, y0 - 3, say("diverged", {}, lang), "red b c") + "</g>")
    out.append("</g>")
    return "".join(out)


def _message(m: runview.Message, lay: _Layout, lang: str, uid: str) -> str:
    down = m.dst > m.src
    y_src = lay.box_y(m.src, m.src_seq) + (BOX_H if down else 0)
    y_dst = lay.box_y(m.dst, m.dst_seq) + (0 if down else BOX_H)
    x0, x1 = lay.x[(m.sent, 0)] + 3, lay.x[(m.delivered, 1)] - 2
    title = say("message" if m.ok else "message_bad", {"src": m.src, "dst": m.dst, "numel": m.numel, "dtype": m.dtype,
                                                      "sent": m.sent, "delivered": m.delivered}, lang)
    marker = "arrow" if m.ok else "bad"
    return (f'<g{_a(data_kind="message", data_src=m.src, data_dst=m.dst, data_numel=m.numel, data_ok=int(m.ok))}>'
            f"<title>{escape(title)}</title>"
            f'<line{_a(x1=round(x0, 1), y1=round(y_src, 1), x2=round(x1, 1), y2=round(y_dst, 1), stroke=INK if m.ok else RED, stroke_width=1.6, stroke_dasharray=None if m.ok else "4 2", marker_end=f"url(#{uid}-{marker})")}/>'
            + _text((x0 + x1) / 2, (y_src + y_dst) / 2 + 4, str(m.numel), "n c" + ("" if m.ok else " red")) + "</g>")


def _end_lines(end: runview.End, view: RunView, lang: str) -> list[str]:
    """What the right column says of a rank: how it ended; where it waited, and for whom."""
    waiting = [op for op in view.ops if op.rank == end.rank and op.state == "blocked"]
    if waiting:
        op = waiting[-1]
        return [say("blocked_line" if op.line is not None else "blocked", {"name": op.name, "line": op.line}, lang)] + \
            ([why(op.why, lang)] if op.why else [])
    return [ending(end, lang)]


def _ends(view: RunView, lay: _Layout, texts: dict, stop: str) -> list[str]:
    x, bad = lay.right + 20, view.stop != "completed"
    out = [f'<g{_a(data_kind="stop", data_stop=view.stop)}><title>{escape(stop)}</title>'
           f'<line{_a(x1=round(lay.right + 8, 1), y1=TOP - 36, x2=round(lay.right + 8, 1), y2=lay.bottom, stroke=RED if bad else GREY, stroke_width=2, stroke_dasharray="6 3")}/>'
           + _text(x, TOP - 40, stop, "b red" if bad else "b") + "</g>"]
    for end in view.ends:
        y = lay.lane_mid(end.rank)
        lines = texts[end.rank]
        red = "" if end.how == "returned" else "red"
        glyph = {"returned": "✓", "blocked": "", "running": "", "unknown": "?"}.get(end.how, "✕")
        at = lay.x.get((end.at, 1), LEFT) + 9
        if at > lay.right - 12:   # at the run's end the right column says it
            glyph = ""
        out.append(f'<g{_a(data_kind="end", data_rank=end.rank, data_how=end.how)}><title>{escape(" ".join(lines))}</title>'
                   + (_text(at, y + 4, glyph, f"b {red}") if glyph else "")
                   + "".join(_text(x, y + 4 + 15 * (i - (len(lines) - 1) / 2), t, red if i == 0 else "") for i, t in enumerate(lines))
                   + "</g>")
    return out


def _hidden(view: RunView, lay: _Layout, lang: str) -> list[str]:
    h = view.hidden
    x, w = lay.gap + 6, GAP_W - 12
    words = say("hidden", {"n": h.ops, "first": h.first, "last": h.last}, lang)
    out = [f'<g{_a(data_kind="hidden", data_ops=h.ops)}><title>{escape(words)}</title>'
           f'<rect{_a(x=round(x, 1), y=TOP - 4, width=w, height=lay.bottom - TOP + 4, fill="#eeeeee", stroke=GREY, stroke_dasharray="2 2")}/>'
           + _text(x + w / 2, TOP + 8, "…", "grey b c")]
    for rank, count, names in h.per_rank:
        listing = say("hidden_rank", {"rank": rank, "n": count, "names": [say("hidden_name", {"name": n, "n": c}, lang)
                                                                          for n, c in names[:8]]}, lang)
        out.append(f'<g{_a(data_kind="hidden-rank", data_rank=rank, data_ops=count)}><title>{escape(listing)}</title>'
                   + _text(x + w / 2, lay.lane_mid(rank) + 4, say("hidden_count", {"n": count}, lang), "l grey c") + "</g>")
    out.append("</g>")
    return out


def _legend(view: RunView, lang: str) -> str:
    """What every mark means, in words (the drawing reads without colour)."""
    swatch = '<span style="display:inline-block;margin-right:12px"><span style="display:inline-block;width:12px;height:12px;' \
             'background:{colour};vertical-align:middle;margin-right:4px"></span>{name}</span>'
    groups = sorted({b.group for b in view.bands} | {op.group for op in view.ops if op.collective})
    swatches = "".join(swatch.format(colour=COLOURS[g % len(COLOURS)], name=escape(say("legend.group", {"group": view.group_names[g]}, lang)))
                       for g in groups)
    states = {op.state for op in view.ops}
    shown = ["lane", "box"] + ["arrow"] * bool(view.messages) + ["band"] * bool(groups) + \
        [state for state in ("blocked", "open", "failed") if state in states] + ["ends"]
    items = [escape(say(f"legend.{key}", {}, lang)) + (" " + swatches if key == "band" else "") for key in shown]
    if view.hidden is not None:
        items.append(escape(say("legend.bound", {"limit": runview.LIMIT, "head": runview.HEAD, "tail": runview.TAIL}, lang)))
    return (f'<details open data-kind="legend" style="margin:6px 0;font-size:13px"><summary>{escape(say("legend", {}, lang))}'
            f'</summary><ul style="margin:4px 0;padding-left:20px">{"".join(f"<li>{item}</li>" for item in items)}</ul></details>')


def page(view: RunView | None, lang: str = "zh", filename: str = "") -> str:
    """A whole page: the figure and its title; its Content Security Policy allows no fetch of any kind."""
    title = say("page_title", {"file": filename}, lang)
    return ("<!DOCTYPE html>\n"
            f'<html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title></head>'
            f'<body style="margin:16px;font-family:{SANS}"><h1 style="font-size:18px">{escape(title)}</h1>'
            f"{figure(view, lang)}</body></html>\n")
