"""Pictures of a run (grader/feedback/runview.py, timeline.py, trace.py): runs played against the real switch
(tests/switchsim.py) in the shapes of the exercises and in every way a run ends, drawn, opened in headless
Chromium and read back from the page; the trace checked against the trace-event format; then a few through
the command line and a notebook's report."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from browser import open_in_browser
from conftest import FIXTURES, ROOT, run_cli, stretched
from htmltree import parse
from switchsim import Sim
from grader import wire
from grader.records import RankResult, Stop
from grader.feedback import runview, timeline, trace

F32 = np.float32


# -- runs in the shapes of the exercises, and in every way a run ends -----------------------------------

def _wait(sim: Sim, rank: int) -> None:
    """The rank waits on its last operation (the frame its transport sends at wait())."""
    sim.switch.receive(rank, {"t": "wait", "seq": len(sim.switch.calls[rank]) - 1}, [])


def _ended(sim: Sim, stop: str = "completed", how: dict | None = None):
    """The run as the runner hands it over: how it stopped, each rank's result, what each waited on."""
    run = sim.run()
    run.stop = Stop(stop)
    for rank, rec in enumerate(run.ranks):
        rec.inside = sim.switch.waiting_on(rank)
        if how and rank in how:
            rec.result = how[rank]
        elif stop == "completed":
            rec.result = RankResult("return")
    return run


def ring(n: int = 4, chunk: int = 258):
    """ring_allreduce: 2(N-1) steps, each an isend to the right and an irecv from the left on every rank."""
    sim = Sim(n, perturb=False)
    for _ in range(2 * (n - 1)):
        for r in range(n):
            sim.op(r, "send", [np.ones(chunk, F32)], None, peer=(r + 1) % n, tag=0, api="isend", line=12)
            sim.op(r, "recv", None, [(chunk,)], peer=(r - 1) % n, tag=0, api="irecv", line=13)
    return _ended(sim)


def seed_deadlock(n: int = 4):
    """The chapter's blocking-send ring: every rank sends before it receives, and gloo does not buffer sends."""
    sim = Sim(n, perturb=False)
    for r in range(n):
        sim.op(r, "send", [np.ones(258, F32)], None, peer=(r + 1) % n, tag=0, api="send", line=14)
        _wait(sim, r)
    return _ended(sim, "deadlock")


def zero(n: int = 2, size: int = 1030):
    """zero_sharded_step: the gradient reduce-scattered, the updated shards all-gathered."""
    sim = Sim(n, perturb=False)
    for r in range(n):
        sim.op(r, "_reduce_scatter_base", np.ones(size, F32), (size // n,), api="reduce_scatter_tensor", line=20,
               reduce="AVG")
    for r in range(n):
        sim.op(r, "_allgather_base", np.ones(size // n, F32), (size,), api="all_gather_into_tensor", line=25)
    return _ended(sim)


def hierarchical(n: int = 4):
    """hierarchical_allreduce: reduce in each node of 2, all-reduce across the leaders, broadcast in the node."""
    sim = Sim(n, perturb=False)
    nodes = [[0, 1], [2, 3]]
    for node in nodes:
        for r in node:
            sim.op(r, "reduce", [np.ones(6, F32)], None, group=node, root=0, api="reduce", line=30)
    for r in (0, 2):
        sim.op(r, "allreduce", [np.ones(6, F32)], [(6,)], group=[0, 2], api="all_reduce", line=32)
    for node in nodes:
        for r in node:
            sim.op(r, "broadcast", [np.ones(6, F32)] if r == node[0] else None, [(6,)], group=node, root=0,
                   api="broadcast", line=34)
    return _ended(sim)


def mismatch(n: int = 2):
    """dist_primitives: rank 1 calls all_gather where rank 0 calls its second all_reduce."""
    sim = Sim(n, perturb=False)
    for r in range(n):
        sim.op(r, "allreduce", [np.ones(4, F32)], [(4,)], api="all_reduce", line=9)
    sim.op(0, "allreduce", [np.ones(4, F32)], [(4,)], api="all_reduce", line=10)
    sim.op(1, "allgather", [np.ones(4, F32)], [[(4,)] * n], api="all_gather", line=11)
    raised = {r: RankResult("raise", {"type": "RuntimeError", "message": "3.1415 secret", "frames": [{"line": 10 + r}]})
              for r in range(n)}
    run = _ended(sim, "failfast", raised)
    run.stop_rank = 0
    return run


def timed_out(n: int = 2):
    """dist_primitives: rank 0 waits in its second all_reduce while rank 1 loops for ever (no operation)."""
    sim = Sim(n, perturb=False)
    sim.all_reduce([np.ones(3)] * n)
    sim.op(0, "allreduce", [np.ones(3, F32)], [(3,)], api="all_reduce", line=40)
    _wait(sim, 0)
    return _ended(sim, "timeout")


CASES = {"ring": ring, "seed_deadlock": seed_deadlock, "zero": zero, "hierarchical": hierarchical,
         "mismatch": mismatch, "timed_out": timed_out}


def names(view, rank: int) -> list[str]:
    return [op.name for op in sorted(view.ops, key=lambda o: o.seq) if op.rank == rank]


# -- what a view holds ------------------------------------------------------------------------------

def test_each_exercise_shows_its_steps():
    v = runview.view(ring(4))
    for r in range(4):   # 2(N-1) steps around the ring, one chunk a message, each to the right-hand neighbour
        assert names(v, r) == ["isend", "irecv"] * 6
    assert len(v.messages) == 4 * 6 and {(m.src, m.dst) for m in v.messages} == {(r, (r + 1) % 4) for r in range(4)}
    assert {m.numel for m in v.messages} == {258} and all(m.ok and m.sent < m.delivered for m in v.messages)
    assert not v.bands and all(op.state == "ok" for op in v.ops) and v.stop == "completed"

    v = runview.view(zero())
    assert names(v, 0) == names(v, 1) == ["reduce_scatter_tensor", "all_gather_into_tensor"]
    first, then = v.bands
    assert (first.name, then.name) == ("reduce_scatter_tensor", "all_gather_into_tensor") and first.at < then.at
    assert [op.numel for op in v.ops if op.rank == 0] == [1030, 515]

    v = runview.view(hierarchical())
    assert v.group_names == ["{0,1}", "{2,3}", "{0,2}"]
    assert names(v, 0) == names(v, 2) == ["reduce", "all_reduce", "broadcast"] and names(v, 1) == ["reduce", "broadcast"]
    phases = [(b.name, v.group_names[b.group]) for b in sorted(v.bands, key=lambda b: b.at)]
    assert phases == [("reduce", "{0,1}"), ("reduce", "{2,3}"), ("all_reduce", "{0,2}"), ("broadcast", "{0,1}"),
                      ("broadcast", "{2,3}")]


def test_how_a_run_ended_is_in_its_view():
    v = runview.view(seed_deadlock(4))   # every rank stuck in send, each waiting for its right-hand neighbour
    assert v.stop == "deadlock" and [op.state for op in v.ops] == ["blocked"] * 4
    assert [(op.name, op.peer, op.line, op.completed) for op in v.ops] == [("send", (r + 1) % 4, 14, None) for r in range(4)]
    assert [op.why for op in v.ops] == [("waits.p2p", {"peer": (r + 1) % 4, "other": "recv"}) for r in range(4)]
    assert [e.how for e in v.ends] == ["blocked"] * 4 and not v.messages

    v = runview.view(mismatch())   # the calls did not fit: both failed, where they diverged
    bad = [op for op in v.ops if op.state == "failed"]
    assert [(op.rank, op.name) for op in bad] == [(0, "all_reduce"), (1, "all_gather")]
    key, params = bad[0].why
    assert key == "failed.diverged" and [c["rank"] for c in params["calls"]] == [0, 1]
    assert "all_gather(float32(4))" in params["calls"][1]["ops"][0]
    assert [b.ok for b in v.bands] == [True, False]
    assert [(e.how, e.type, e.line) for e in v.ends] == [("raised", "RuntimeError", 10), ("raised", "RuntimeError", 11)]
    assert "3.1415" not in repr(v)   # an exception's message may quote a perturbed run's numbers: never kept

    v = runview.view(timed_out())   # rank 0 waits for rank 1, which never called its second all_reduce
    (waiting,) = [op for op in v.ops if op.state == "blocked"]
    assert (waiting.rank, waiting.name, waiting.why) == (0, "all_reduce", ("waits.collective", {"ranks": [1]}))
    assert v.stop == "timeout" and [e.how for e in v.ends] == ["blocked", "running"]


def test_a_notebooks_lines_are_its_cells_lines():
    """A notebook's code is graded as its cells joined: a line is shown where the student sees it."""
    from grader.model import CellLines
    v = runview.view(seed_deadlock(2), lambda line, file: CellLines(((3, line - 10),)))
    assert [op.line for op in v.ops] == [CellLines(((3, 4),))] * 2
    shown = [t.text() for t in parse(timeline.page(v, "en")).find_all("text")]
    assert "‖ blocked in send (cell 3, line 4)" in shown
    assert {e["args"]["line"] for e in trace.events(v, "en")["traceEvents"] if e["ph"] == "X"} == {"cell 3, line 4"}


def test_a_long_run_keeps_its_first_and_last_operations_and_counts_the_rest():
    sim = Sim(4, perturb=False)
    for _ in range(1500):
        sim.all_reduce([np.ones(3)] * 4)
    for r in range(4):   # and it ends in the seed's deadlock
        sim.op(r, "send", [np.ones(8, F32)], None, peer=(r + 1) % 4, tag=0, api="send", line=14)
        _wait(sim, r)
    v = runview.view(_ended(sim, "deadlock"))
    assert v.total == 6004 and len(v.ops) == runview.LIMIT and v.hidden.ops == 6004 - runview.LIMIT
    assert sum(count for _, count, _ in v.hidden.per_rank) == v.hidden.ops
    assert all(names == (("all_reduce", count),) for _, count, names in v.hidden.per_rank)
    assert [op.state for op in v.ops if op.name == "send"] == ["blocked"] * 4   # the end is drawn
    assert min(op.entered for op in v.ops) == 1                                 # and the start
    page = timeline.page(v, "en", "long.py")
    assert f"{v.hidden.ops} operations between clocks" in page
    doc = trace.events(v, "en")
    check_trace(doc)
    assert doc["otherData"]["not_drawn"] == v.hidden.ops
    assert sorted(e["args"]["operations"]["all_reduce"] for e in doc["traceEvents"] if e.get("cat") == "not_drawn") == \
        sorted(count for _, count, _ in v.hidden.per_rank)


def test_the_page_stays_under_its_bound_whatever_the_run():
    """The worst page: every drawn operation failed with the longest listing (the ranks' calls that did not fit,
    each with many tensors), every rank's line recorded, Chinese (three bytes a character)."""
    sim = Sim(4, perturb=False)
    deep = np.ones((1,) * wire.MAX_DIMS, F32)   # the longest shape a call may have
    for i in range(400):
        for r in range(4):
            if r == 0:
                sim.op(r, "allreduce", [deep], [deep.shape], api="all_reduce", line=100000 + i)
            else:
                sim.op(r, "allgather", [deep], [[deep.shape] * 4], api="all_gather", line=100000 + i)
    v = runview.view(_ended(sim, "failfast"))
    assert len(v.ops) == runview.LIMIT and all(op.state == "failed" for op in v.ops)
    for lang in ("zh", "en"):
        page = timeline.page(v, lang, "x" * 300 + ".py")
        assert len(page.encode("utf-8")) < timeline.PAGE_BYTES, len(page.encode("utf-8"))
        assert len(json.dumps(trace.events(v, lang)).encode("utf-8")) < timeline.PAGE_BYTES


# -- the pages, opened in a browser -------------------------------------------------------------------

PROBE = """<script>
const box = b => [b.x, b.y, b.width, b.height].map(v => v.toFixed(1)).join(",");
for (const g of document.querySelectorAll("svg [data-kind]")) {
  g.setAttribute("data-bbox", box(g.getBBox()));
  const shape = g.querySelector(":scope > rect, :scope > path");
  if (shape) g.setAttribute("data-shape", box(shape.getBBox()));
  g.setAttribute("data-texts", Array.from(g.querySelectorAll(":scope > text")).map(t => box(t.getBBox())).join(";"));
  const line = g.querySelector(":scope > line");
  if (line) g.setAttribute("data-ends", ["x1", "y1", "x2", "y2"].map(a => line[a].baseVal.value.toFixed(1)).join(","));
}
document.body.setAttribute("data-probed", "1");
</script>"""


def _said(g) -> list[str]:
    """The texts an element shows (not its title)."""
    return [t.text() for t in g.find_all("text") if t.text().strip()]


def _nums(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _drawn(section) -> dict:
    """What one figure draws, as the browser laid it out."""
    lanes = {int(g.attrs["data-rank"]): _nums(g.attrs["data-bbox"]) for g in section.find_all("g", data_kind="lane")}
    ops = section.find_all("g", data_kind="op")
    return {"lanes": {r: (b[1], b[1] + b[3]) for r, b in lanes.items()}, "ops": ops,
            "messages": section.find_all("g", data_kind="message"), "bands": section.find_all("g", data_kind="band"),
            "ends": {int(g.attrs["data-rank"]): g for g in section.find_all("g", data_kind="end")},
            "stop": section.find("g", data_kind="stop")}


def _check_geometry(d: dict) -> None:
    lanes = d["lanes"]
    assert [lanes[r][0] < lanes[r][1] <= lanes.get(r + 1, (1e9,))[0] + 0.5 for r in lanes] == [True] * len(lanes)
    stop_x = _nums(d["stop"].attrs["data-ends"])[0]
    starts: dict[int, list] = {}
    for g in d["ops"]:
        x, y, w, h = _nums(g.attrs["data-shape"])
        low, high = lanes[int(g.attrs["data-rank"])]
        assert low <= y and y + h <= high and w > 0, g.attrs     # in its rank's lane
        for text in g.attrs["data-texts"].split(";"):              # its label fits in it
            tx, _, tw, _ = _nums(text)
            assert x <= tx and tx + tw <= x + w + 1, (g.attrs["data-name"], text, (x, w))
        if g.attrs["data-state"] == "blocked":                      # open-ended up to the run's end
            assert abs(x + w - (stop_x - 8)) < 1, (x, w, stop_x)
        starts.setdefault(int(g.attrs["data-rank"]), []).append((int(g.attrs["data-seq"]), x))
    for seq_x in starts.values():   # a rank's operations from left to right in the order it called them
        xs = [x for _, x in sorted(seq_x)]
        assert xs == sorted(xs)
    for g in d["messages"]:         # an arrow from the sender's lane to the receiver's, forward in time
        x1, y1, x2, y2 = _nums(g.attrs["data-ends"])
        src, dst = lanes[int(g.attrs["data-src"])], lanes[int(g.attrs["data-dst"])]
        assert src[0] <= y1 <= src[1] and dst[0] <= y2 <= dst[1] and x2 > x1, g.attrs
    for g in d["bands"]:            # a bar across the lanes of its group's ranks
        _, y, _, h = _nums(g.attrs["data-shape"])
        for r in map(int, g.attrs["data-ranks"].split(",")):
            assert y <= sum(lanes[r]) / 2 - 10 and sum(lanes[r]) / 2 + 10 <= y + h or y <= lanes[r][0] + 40, (g.attrs, lanes[r])


@pytest.mark.timeout(180)
def test_the_diagrams_open_in_chromium_and_draw_what_the_runs_did(tmp_path):
    views = {name: runview.view(make()) for name, make in CASES.items()}
    body = "".join(f'<section data-case="{name}">{timeline.figure(v, "en")}</section>' for name, v in views.items())
    probe = tmp_path / "probe.html"
    probe.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{body}{PROBE}</body></html>',
                     encoding="utf-8")
    dom, console = open_in_browser(probe.as_uri(), tmp_path / "profile")
    assert console == [], console
    doc = parse(dom)
    assert doc.find("body").attrs.get("data-probed") == "1"
    drawn = {s.attrs["data-case"]: _drawn(s) for s in doc.find_all("section")}
    for name, d in drawn.items():
        v = views[name]
        assert len(d["lanes"]) == v.world_size and len(d["ops"]) == len(v.ops), name
        assert len(d["messages"]) == len(v.messages) and len(d["bands"]) == len(v.bands), name
        _check_geometry(d)
    ring_drawn = drawn["ring"]
    assert [g.attrs["data-name"] for g in ring_drawn["ops"] if g.attrs["data-rank"] == "0"] == ["isend", "irecv"] * 6
    assert {g.find("text").text() for g in ring_drawn["messages"]} == {"258"}
    dead = drawn["seed_deadlock"]
    assert [g.attrs["data-state"] for g in dead["ops"]] == ["blocked"] * 4
    for r, g in dead["ends"].items():
        assert _said(g) == ["‖ blocked in send (line 14)", f"rank {(r + 1) % 4} posted no matching recv"]
    assert "deadlock" in dead["stop"].text()
    bad = drawn["mismatch"]
    assert [g.attrs["data-ok"] for g in bad["bands"]] == ["1", "0"] and bad["bands"][1].find("g", data_kind="diverged")
    assert _said(bad["ends"][0]) == ["✕ raised RuntimeError (line 10)"]
    hier = drawn["hierarchical"]
    assert [(g.attrs["data-name"], g.attrs["data-group"]) for g in hier["bands"]] == [
        ("reduce", "{0,1}"), ("reduce", "{2,3}"), ("all_reduce", "{0,2}"), ("broadcast", "{0,1}"), ("broadcast", "{2,3}")]
    fills = {g.attrs["data-group"]: g.find("rect").attrs["fill"] for g in hier["bands"]}
    assert len(set(fills.values())) == 3   # the node groups and the leaders' group, each its own colour
    assert "time limit reached" in drawn["timed_out"]["stop"].text()
    assert _said(drawn["timed_out"]["ends"][0]) == ["‖ blocked in all_reduce (line 40)", "rank 1 had not called it"]
    assert _said(drawn["timed_out"]["ends"][1]) == ["… still running when the run ended, in no operation"]

    # the page itself: nothing fetched (its policy allows nothing), nothing logged, in both languages
    for lang in ("en", "zh"):
        page = tmp_path / f"deadlock.{lang}.html"
        page.write_text(timeline.page(views["seed_deadlock"], lang, "ring.py"), encoding="utf-8")
        text = page.read_text(encoding="utf-8")
        assert "<script" not in text and not re.search(r"""(src|href)=|url\((?!#)|@import|https?://(?!www\.w3\.org/2000/svg")""", text)
        dom, console = open_in_browser(page.as_uri(), tmp_path / f"profile-{lang}")
        assert console == [] and len(parse(dom).find_all("g", data_kind="op")) == 4


# -- the trace ----------------------------------------------------------------------------------------

def check_trace(doc: dict) -> None:
    """The trace-event format as Perfetto and chrome://tracing read it: every event has its fields, slices on
    a thread nest, every flow has one start and one end, each inside a slice on its thread."""
    json.dumps(doc, allow_nan=False)
    events = doc["traceEvents"]
    slices: dict[tuple, list] = {}
    for e in events:
        assert {"name", "ph", "pid", "tid", "ts"} <= set(e) and isinstance(e["name"], str), e
        assert e["ph"] in ("M", "X", "i", "s", "t", "f"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e.get("cat") and isinstance(e.get("args"), dict), e
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name") and e["args"], e
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
    for spans in slices.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 or b1 <= a1, (a0, a1, b0, b1)   # after it, or inside it
    flows: dict[tuple, list] = {}
    for e in events:
        if e["ph"] in "stf":
            flows.setdefault((e["cat"], e["name"], e["id"]), []).append(e)
            assert any(t0 <= e["ts"] <= t1 for t0, t1 in slices.get((e["pid"], e["tid"]), ())), e
    for key, steps in flows.items():
        phases = [e["ph"] for e in steps]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}, (key, phases)
        assert [e["ts"] for e in steps] == sorted(e["ts"] for e in steps) and steps[-1].get("bp") == "e", key


def test_traces_follow_the_trace_event_format():
    for name, make in CASES.items():
        v = runview.view(make())
        doc = trace.events(v, "en")
        check_trace(doc)
        slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert len(slices) == len(v.ops), name
        assert len([e for e in doc["traceEvents"] if e["ph"] == "s"]) == len(v.messages) + len(v.bands), name
        names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
        assert names == {f"rank {r}" for r in range(v.world_size)}, name
    doc = trace.events(runview.view(ring(4)), "en")   # an isend open while an irecv runs: two threads a rank
    assert {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {1, 2}
    v = runview.view(seed_deadlock())
    dead = trace.events(v, "en")
    blocked = [e for e in dead["traceEvents"] if e["ph"] == "X"]   # open up to where the run ended
    assert [(e["name"], e["args"]["state"], e["ts"] + e["dur"]) for e in blocked] == [("send (blocked)", "blocked", v.end)] * 4
    assert [e["name"] for e in dead["traceEvents"] if e.get("s") == "g"] == ["■ deadlock: no operation could complete any more"]
    assert trace.events(None, "en")["traceEvents"] == []


def test_the_words_are_in_both_languages():
    """The catalog's rules (tests/test_teach_messages.py) for the diagram's words: both languages with the same
    placeholders, Chinese punctuation beside Chinese words, no English sentence in Chinese, x and × each in
    its language."""
    from grader.feedback import timeline_words
    from grader.feedback.messages import CATALOG
    cjk = "\u4e00-\u9fff"
    for key, (zh, en) in timeline_words.WORDS.items():
        assert CATALOG[f"timeline.{key}"] == (zh, en) and zh and en and zh != en, key
        assert set(re.findall(r"\{(\w+)", zh)) == set(re.findall(r"\{(\w+)", en)), key
        assert not re.search(f"[{cjk}][:,;?!]|[:,;?!] ?[{cjk}]|[{cjk}]\\(|\\)[{cjk}]", zh), (key, zh)
        prose = re.sub(r"\{[^}]*\}|\S*[._=()\[\]/*]\S*", " ", zh)
        assert not re.search(r"\b[A-Za-z]{2,} [A-Za-z]{2,}\b", prose), (key, zh)
        assert "×" not in en, key
    zh = timeline.page(runview.view(seed_deadlock()), "zh", "ring.py")
    shown = [t.text() for t in parse(zh).find_all("text")] + [t.text() for t in parse(zh).find_all("title")]
    assert "‖ 卡在 send（第 14 行）" in shown and "进程 1 没有发起与它匹配的 recv" in shown
    assert not [t for t in shown if re.search(r"[A-Za-z]{3,} [A-Za-z]{3,}", t)], shown   # no English sentence


def _top_level_imports(module: str) -> set[str]:
    """The grader modules a module imports when it is loaded (not those its functions import when called)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(p for p in (base, node.module or "") if p)
            found |= {name} | {f"{name}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("grader") and ((ROOT / (m.replace(".", "/") + ".py")).exists()
                                                          or (ROOT / m.replace(".", "/") / "__init__.py").exists())}


def test_a_check_that_draws_nothing_loads_nothing_of_the_pictures():
    seen, todo = set(), ["grader.cli", "grader.integrations.nbcheck"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += _top_level_imports(module)
    assert "grader.api" in seen and "grader.feedback.report" in seen   # the walk sees the pipeline
    assert not seen & {"grader.feedback.runview", "grader.feedback.timeline", "grader.feedback.trace",
                       "grader.feedback.timeline_words"}, sorted(seen)


# -- through the command line and a notebook ------------------------------------------------------------

@pytest.mark.timeout(240)
def test_check_draws_the_seeds_deadlock_and_its_trace(tmp_path):
    html, js = tmp_path / "run.html", tmp_path / "run.json"
    proc = run_cli("check", str(FIXTURES / "ring_allreduce" / "mistakes" / "m04_deadlock_send_first.py"), "--lang", "en",
                   "--timeline", str(html), "--trace", str(js))
    assert proc.returncode == 1 and "every rank is blocked in send" in proc.stdout, proc.stdout + proc.stderr
    dom, console = open_in_browser(html.as_uri(), tmp_path / "profile")
    assert console == []
    doc = parse(dom)
    assert doc.find("svg", data_kind="timeline").attrs["data-world-size"] == "2"   # the visible world size only
    ops = doc.find_all("g", data_kind="op")
    assert [(g.attrs["data-name"], g.attrs["data-state"], g.attrs["data-line"]) for g in ops] == [("send", "blocked", "14")] * 2
    assert doc.find("g", data_kind="stop").attrs["data-stop"] == "deadlock"
    assert _said(doc.find("g", data_kind="end", data_rank="0")) == ["‖ blocked in send (line 14)", "rank 1 posted no matching recv"]
    data = json.loads(js.read_text(encoding="utf-8"))
    check_trace(data)
    assert data["otherData"]["stop"] == "deadlock" and data["otherData"]["world_size"] == 2


@pytest.mark.timeout(240)
def test_grade_draws_the_three_phases_of_the_hierarchical_exercise(tmp_path):
    html, results, blocked = tmp_path / "run.html", tmp_path / "results.json", tmp_path / "file"
    blocked.write_text("")
    proc = run_cli("grade", str(FIXTURES / "hierarchical_allreduce" / "honest" / "h01_new_group_reduce_broadcast.py"),
                   "--lang", "en", "--backend", "none", "--results", str(results), "--timeline", str(html),
                   "--trace", str(blocked / "run.json"))
    assert proc.returncode == 2 and f"cannot write {blocked}" in proc.stderr, proc.stderr   # said, not a traceback
    assert json.loads(results.read_text(encoding="utf-8"))["score"] == 100                  # the grade stands
    doc = parse(html.read_text(encoding="utf-8"))
    assert doc.find("svg", data_kind="timeline").attrs["data-world-size"] == "4"            # visible, never hidden
    bands = [(g.attrs["data-name"], g.attrs["data-group"]) for g in doc.find_all("g", data_kind="band")]
    phases = [name for name, _ in bands]
    assert phases.index("all_reduce") > max(i for i, n in enumerate(phases) if n == "reduce")
    assert phases.index("all_reduce") < min(i for i, n in enumerate(phases) if n == "broadcast")
    assert {g for n, g in bands if n in ("reduce", "broadcast")} == {"{0,1}", "{2,3}"}
    assert {g for n, g in bands if n == "all_reduce"} == {"{0,2}"}
    assert "group {0,1}" in doc.find("details", data_kind="legend").text()


INLINE_REPORT = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shown = []
shell = InteractiveShell.instance()
shell.display_pub.publish = lambda data, *a, **k: shown.append(data)
answer = open(sys.argv[1], encoding="utf-8").read()
for code in (answer, "from grader.integrations import nbcheck\\nnbcheck.report('ring_allreduce', 'en')"):
    shell.run_cell(code, store_history=True).raise_error()
html = [d["text/html"] for d in shown if "text/html" in d]
print("SHOWN", len(html), html[0].count('data-kind="op"'), 'data-world-size="2"' in html[0])
"""


@pytest.mark.timeout(240)
def test_a_notebook_report_shows_the_diagram_under_it():
    proc = subprocess.run([sys.executable, "-c", INLINE_REPORT, str(FIXTURES / "ring_allreduce" / "honest" / "h01_isend_irecv_pairs.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=stretched(230), env={**os.environ, "NBGRADER_EXECUTION": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Score: 40 / 40" in proc.stdout, proc.stdout
    assert "SHOWN 1 8 True" in proc.stdout, proc.stdout   # 2(N-1) = 2 steps of an isend and an irecv, on 2 ranks
