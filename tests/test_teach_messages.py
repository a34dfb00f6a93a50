"""The teaching report's numbers (verify/teach.py) and the message catalog (feedback/messages.py), directly."""
from __future__ import annotations

import string

import pytest

from grader.feedback import messages, render
from grader.model import Note
from grader.records import RankRecord, RunOutcome, RunRequest
from grader.switch import Call
from grader.verify.teach import ring_volume, teaching_notes


@pytest.mark.parametrize("op, n, size, volume, formula", [
    ("all_reduce", 2, 4096, 4096, "2(2-1)/2 x 4096"),
    ("all_reduce", 4, 4096, 6144, "2(4-1)/4 x 4096"),
    ("all_reduce", 8, 8000, 14000, "2(8-1)/8 x 8000"),
    ("all_gather", 2, 1024, 512, "(2-1)/2 x 1024"),
    ("all_gather", 4, 2048, 1536, "(4-1)/4 x 2048"),
])
def test_ring_volume(op, n, size, volume, formula):
    assert ring_volume(op, n, size) == (volume, formula)


def _call(rank, seq, op, method, numel, dtype, outputs=1, api=None, group=(0, 1, 2, 3), sends=True):
    """A completed operation as the switch records it (switch.Call): `numel` elements sent per rank (none
    where `sends` is False: a broadcast's receiver), on the group of these global ranks."""
    tensor = {"dtype": dtype, "shape": [numel], "numel": numel}
    call = Call(rank=rank, seq=seq, method=method, op=op, group=tuple(group), sends=sends, receives=True,
                api=api or op, inputs=[tensor] if sends else [], outputs=[tensor] * outputs)
    call.completed, call.ok = True, True
    call.delivered = [tensor] * outputs
    return call


def _run(world_size: int, calls_per_rank, times_per_rank=None):
    """A graded run whose ranks made `calls_per_rank(r)`, and (with `times_per_rank`) the real-backend run
    whose ranks timed the same calls."""
    ranks, timed = [], []
    for r in range(world_size):
        rec = RankRecord(r)
        rec.calls = calls_per_rank(r)
        ranks.append(rec)
        real = RankRecord(r)
        real.timings = times_per_rank(r) if times_per_rank else []
        timed.append(real)
    run = RunOutcome(RunRequest(world_size=world_size, source="", filename="s.py"), ranks)
    real = RunOutcome(RunRequest(world_size=world_size, source="", filename="s.py", mode="real"), timed)
    return run, (real if times_per_rank else None)


def test_teaching_notes_per_rank_and_collective():
    run, real = _run(4, lambda r: [_call(r, 0, "all_reduce", "allreduce", 1024, "torch.float64"),
                                   _call(r, 1, "all_gather", "allgather", 128, "torch.float32", outputs=4)],
                     lambda r: [{"op": "all_reduce", "ms": 2.0}, {"op": "all_gather", "ms": 0.5}])
    assert teaching_notes(run)[0] == Note("teach.header_untimed", {"ws": 4, "backend": "-"})   # no real run: no times
    assert all(n.key == "teach.collective_untimed" for n in teaching_notes(run)[1:])
    notes = teaching_notes(run, real=real)
    assert notes[0] == Note("teach.header", {"ws": 4, "backend": "gloo"})
    by = {(n.params["rank"], n.params["op"]): n for n in notes[1:-1]}
    assert len(by) == 8
    # all-reduce of 1024 float64 = 8192 bytes: a ring sends 2(N-1)/N x 8192 = 12288 bytes; a first call, so a
    # time labelled as one and no bandwidth
    mine = by[3, "all_reduce"]
    assert mine.key == "teach.collective_first" and {k: v for k, v in mine.params.items() if k != "ring"} == {
        "rank": 3, "op": "all_reduce", "ms": 2.0, "size": 8192, "volume": 12288, "formula": "2(4-1)/4 x 8192"}
    # all-gather of 4 x 128 float32 = 2048 bytes in total: (N-1)/N x 2048 = 1536 bytes
    assert {k: v for k, v in by[0, "all_gather"].params.items() if k != "ring"} == {
        "rank": 0, "op": "all_gather", "ms": 0.5, "size": 2048, "volume": 1536, "formula": "(4-1)/4 x 2048"}
    text = messages.render("teach.collective_first", by[0, "all_gather"].params, "en")
    assert text == ("  rank 0 all_gather: 0.50 ms (its first call, set-up included); 2048 bytes of data, a ring sends "
                    "about 1536 bytes per rank ((4-1)/4 x 2048)")
    assert "B/s" not in "".join(messages.render(n.key, n.params, lang) for n in notes for lang in ("zh", "en"))
    # and the report says why no bandwidth, and where it is measured
    assert notes[-1] == Note("teach.no_bandwidth", {"min": "1 MiB", "command": "python -m grader bench"})
    assert "python -m grader bench" in messages.render("teach.no_bandwidth", notes[-1].params, "zh")


def test_a_call_on_a_smaller_group_counts_its_own_ring_and_a_broadcast_receiver_its_tensor():
    """Hierarchical all-reduce at 4 ranks: each node of 2 reduces to its leader, the leaders (0 and 2)
    all-reduce, each leader broadcasts in its node. A ring of 2 sends (2-1)/2 or 2(2-1)/2 of the data, not
    what a ring of 4 would; a broadcast's receiver sent nothing but its tensor is the S of the formula."""
    node = lambda r: (0, 1) if r < 2 else (2, 3)
    def calls(r):
        out = [_call(r, 0, "reduce", "reduce", 512, "torch.float32", group=node(r))]
        if r in (0, 2):
            out.append(_call(r, 1, "all_reduce", "allreduce", 512, "torch.float32", group=(0, 2)))
        out.append(_call(r, 2, "broadcast", "broadcast", 512, "torch.float32", group=node(r), sends=r in (0, 2)))
        return out
    run, _ = _run(4, calls)
    by = {(n.params["rank"], n.params["op"]): n.params for n in teaching_notes(run)[1:]}
    assert (by[1, "reduce"]["volume"], by[1, "reduce"]["formula"]) == (1024, "(2-1)/2 x 2048")
    assert (by[2, "all_reduce"]["volume"], by[2, "all_reduce"]["formula"]) == (2048, "2(2-1)/2 x 2048")
    assert (by[3, "broadcast"]["size"], by[3, "broadcast"]["volume"]) == (2048, 1024)   # a receiver
    assert (by[0, "broadcast"]["size"], by[0, "broadcast"]["volume"]) == (2048, 1024)   # its root


def test_repeated_calls_show_the_first_and_the_median_of_the_rest_and_a_bandwidth_only_when_large():
    """A loop of 5 all-reduces of 4 MiB and 5 of 4 KiB: each size one line, its first call apart (set-up),
    the median of the other four; a bandwidth from the 4 MiB ones only."""
    big, small = 1 << 20, 1024   # float32 elements: 4 MiB and 4 KiB
    calls = lambda r: ([_call(r, k, "all_reduce", "allreduce", big, "torch.float32", group=(0, 1)) for k in range(5)]
                       + [_call(r, 5 + k, "all_reduce", "allreduce", small, "torch.float32", group=(0, 1)) for k in range(5)])
    times = lambda r: [{"op": "all_reduce", "ms": ms} for ms in (30.0, 4.0, 5.0, 6.0, 100.0, 3.0, 0.4, 0.5, 0.3, 0.6)]
    run, real = _run(2, calls, times)
    notes = teaching_notes(run, real=real)
    lines = {(n.params["rank"], n.params.get("size")): n for n in notes if n.key.startswith("teach.collective")}
    assert len(lines) == 4
    large = lines[0, 4 << 20]
    assert large.key == "teach.collective_rate"
    assert (large.params["calls"], large.params["first_ms"], large.params["ms"]) == (5, 30.0, 5.5)
    # a ring all-reduce of 4 MiB on 2 ranks sends 4 MiB per rank: 4194304 bytes in 5.5 ms
    assert large.params["bandwidth"] == "762.60 MB/s"
    small_line = lines[1, 4096]
    assert small_line.key == "teach.collective_repeated" and "bandwidth" not in small_line.params
    assert (small_line.params["first_ms"], small_line.params["ms"]) == (3.0, 0.45)
    assert messages.render(small_line.key, small_line.params, "en") == (
        "  rank 1 all_reduce: 5 calls, the first 3.00 ms (set-up included), then a median of 0.45 ms; 4096 bytes of "
        "data each, a ring sends about 4096 bytes per rank per call (2(2-1)/2 x 4096)")
    assert notes[-1].key == "teach.no_bandwidth"


def test_a_large_message_called_once_gets_no_bandwidth_and_one_called_again_does():
    big = lambda r: [_call(r, 0, "all_reduce", "allreduce", 1 << 20, "torch.float32", group=(0, 1))]
    run, real = _run(2, big, lambda r: [{"op": "all_reduce", "ms": 8.0}])
    assert [n.key for n in teaching_notes(run, real=real)[1:]] == ["teach.collective_first"] * 2 + ["teach.no_bandwidth"]
    twice = lambda r: [_call(r, k, "all_reduce", "allreduce", 1 << 20, "torch.float32", group=(0, 1)) for k in range(2)]
    run, real = _run(2, twice, lambda r: [{"op": "all_reduce", "ms": 8.0}, {"op": "all_reduce", "ms": 2.0}])
    assert [n.key for n in teaching_notes(run, real=real)[1:]] == ["teach.collective_rate"] * 2   # nothing withheld


def test_point_to_point_traffic_per_rank():
    rec = RankRecord(0)
    send = _call(0, 0, "send", "send", 100, "torch.float32")
    send.receives, send.delivered, send.peer = False, [], 1
    recv = _call(0, 1, "recv", "recv", 50, "torch.float32")
    recv.sends, recv.inputs, recv.peer = False, [], 3
    rec.calls = [send, recv]
    run = RunOutcome(RunRequest(world_size=4, source="", filename="s.py"), [rec])
    p2p = [n for n in teaching_notes(run) if n.key == "teach.p2p"]
    assert p2p[0].params == {"rank": 0, "sends": 1, "sent": 400, "to": ["1"], "recvs": 1, "received": 200, "frm": ["3"]}
    assert messages.render("teach.p2p", p2p[0].params, "zh") == "  进程 0：发送 1 次共 400 字节（给进程 1），接收 1 次共 200 字节（来自进程 3）"


def test_no_teaching_notes_without_completed_collectives():
    run = RunOutcome(RunRequest(world_size=2, source="", filename="s.py"), [RankRecord(0), RankRecord(1)])
    assert teaching_notes(run) == []


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_catalog_has_both_languages_with_the_same_placeholders():
    for key, (zh, en) in messages.CATALOG.items():
        assert zh and en and zh != en or key.startswith("status"), key
        assert _fields(zh) == _fields(en), key


def test_hidden_causes_carry_no_values():
    """A hidden check shows only causes whose words name quantities and operations: no values, lines,
    ranks or world sizes; the value-carrying causes have value-free variants."""
    safe = [key for key in messages.CATALOG if render.hidden_safe(key)]
    assert "cause.summed_not_averaged" in safe and "cause.contribution" not in safe and "cause.mismatch" not in safe
    for key in safe:
        zh, en = messages.CATALOG[key]
        assert _fields(zh) <= render.SAFE_PARAMS and _fields(en) <= render.SAFE_PARAMS, key
    for key, variant in render.HIDDEN_VARIANTS.items():
        assert render.hidden_safe(variant) and not render.hidden_safe(key)


CJK = "\u4e00-\u9fff"


def test_chinese_is_chinese_throughout():
    """Full-width punctuation next to Chinese words; no English sentence inside a Chinese message."""
    import re
    for key, (zh, _) in messages.CATALOG.items():
        if not re.search(f"[{CJK}]", zh):
            continue
        assert not re.search(f"[{CJK}][:,;?!]|[:,;?!] ?[{CJK}]", zh), (key, zh)
        assert not re.search(f"[{CJK}]\\(|\\)[{CJK}]", zh), (key, zh)   # ASCII brackets around Chinese words
        # no English phrase (two plain words in a row) outside placeholders and code
        prose = re.sub(r"\{[^}]*\}|\S*[._=()\[\]/*]\S*", " ", zh)
        assert not re.search(r"\b[A-Za-z]{2,} [A-Za-z]{2,}\b", prose), (key, zh)


def test_exception_frames_are_worded_in_the_report_language():
    frames = [{"line": 8, "function": "run_worker", "text": "gradient /= world_size"}]
    params = {"rank": 0, "type": "RuntimeError", "message": "boom", "frames": frames}
    assert messages.render("fail.exception", params, "zh") == "进程 0 抛出异常 RuntimeError: boom（第 8 行，run_worker 中：gradient /= world_size）"
    assert messages.render("fail.exception", params, "en") == "Rank 0 raised RuntimeError: boom (line 8 in run_worker: gradient /= world_size)"
    listing = [{"rank": 0, "ops": ["all_reduce(1024)", "all_gather(128)"]}, {"rank": 1, "ops": ["all_reduce(1024)"]}]
    assert messages.render("cause.mismatch", {"calls": listing}, "zh").endswith("进程 0：all_reduce(1024)、all_gather(128)；进程 1：all_reduce(1024)")


@pytest.mark.parametrize("env, lang", [({"LANG": "en_US.UTF-8"}, "en"), ({"LANG": "zh_CN.UTF-8"}, "zh"),
                                       ({"LANG": ""}, "zh"), ({}, "zh"), ({"LANG": "C.UTF-8"}, "zh")])
def test_default_language_from_lang_else_chinese(monkeypatch, env, lang):
    monkeypatch.delenv("LANG", raising=False)
    monkeypatch.delenv("LC_ALL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert messages.default_lang() == lang


# -- formulas and counts (issue 19) --------------------------------------------------------------
def test_formulas_are_written_one_way_per_language():
    """English writes x (as comm.OPS and the exercises do), Chinese × (as its catalog does), in every message."""
    import re
    for key, (zh, en) in messages.CATALOG.items():
        assert "×" not in en and "−" not in en, key
        assert not re.search(r"[\dNS)] x [\dNS(]", zh) and "−" not in zh, key
    teach = {"rank": 0, "op": "all_reduce", "ms": 1.0, "size": 4096, "volume": 4096, "formula": "2(2-1)/2 x 4096"}
    assert "（2(2-1)/2 × 4096）" in messages.render("teach.ring", teach, "zh")
    assert "(2(2-1)/2 x 4096)" in messages.render("teach.ring", teach, "en")
    bound = {"rank": 0, "sent": 8, "k": 2, "size": 4, "formula": "2(N-1)/N x S", "bound_k": 1, "bound": 4}
    assert "上限 2(N-1)/N × S = 1 × S" in messages.render("cause.traffic_bytes", bound, "zh")
    assert "bound 2(N-1)/N x S = 1 x S" in messages.render("cause.traffic_bytes", bound, "en")


@pytest.mark.parametrize("key, params, text", [
    ("cause.traffic_sends", {"rank": 1, "count": 1, "formula": "2(N-1)", "expected": 2},
     "Cause: rank 1 sent 1 time; each rank should send 2(N-1) = 2 times."),
    ("cause.traffic_sends", {"rank": 0, "count": 3, "formula": "2(N-1)", "expected": 1},
     "Cause: rank 0 sent 3 times; each rank should send 2(N-1) = 1 time."),
    ("teach.p2p", {"rank": 1, "sends": 1, "sent": 8, "to": ["0"], "recvs": 2, "received": 16, "frm": ["0"]},
     "  rank 1: 1 send, 8 bytes (to rank 0); 2 receives, 16 bytes (from rank 0)"),
    ("cause.traffic_peers", {"rank": 1, "to": [0, 2], "frm": [0]},      # rank 1 sends: an id and a verb, unchanged
     "Cause: rank 1 sends to ranks 0, 2 and receives from ranks 0; in a ring each rank sends to one neighbour only and receives from the other only."),
    ("classreport.cause", {"key": "cause.x", "count": 1}, "  cause.x: 1 student"),
    ("batch.mean_median", {"count": 1, "mean": 5.0, "median": 5, "max": 10}, "1 submission: mean 5.0, median 5 (out of 10)"),
    ("summary.hidden_pending", {"count": 1}, "1 hidden check: shown once grades are published."),
    ("cause.hardcoded_ws", {"quantity": "g", "k": 1}, "Cause: g is what 1 rank would give, and your code has the constant 1: do not hard-code the world size, use the world_size argument."),
    ("fail.op_not_used", {"op": "send"}, "send was never used (none completed)."),
    ("why.weights", {"rank": 0, "quantity": "g", "element": 1, "source": 1, "weight": 1.0, "expected": 2.0, "missing": [], "twice": []},
     "  In element 1 of g on rank 0, rank 1's data counts 1 time where it should count 2 (ranks missing: -; counted twice: -)."),
])
def test_english_counts_agree_with_their_nouns(key, params, text):
    assert messages.render(key, params, "en") == text


def test_a_gather_or_scatter_line_says_no_ring_figure():
    """gather and scatter have no ring algorithm (a root's, comm.OPS ring None): their lines give the data
    alone, never 'a ring sends about 0 bytes per rank (-)'."""
    from grader.verify.teach import _collective
    for times in ([1.0], [1.0, 0.5, 0.5]):
        note, _ = _collective(0, "gather", "gather", 1024, 4, times)
        for lang in ("zh", "en"):
            text = messages.render(note.key, note.params, lang)
            assert "1024" in text and "0 bytes" not in text and "ring" not in text and "环形" not in text and "(-)" not in text
        note, _ = _collective(0, "all_reduce", "all_reduce", 1024, 4, times)
        assert "a ring sends about 1536 bytes per rank" in messages.render(note.key, note.params, "en")


def test_an_empty_list_of_ranks_reads_as_a_word():
    """teach.p2p of a rank that received nothing: 'from rank none' / '来自进程 无', never a dash."""
    params = {"rank": 1, "sends": 1, "sent": 8, "to": ["0"], "recvs": 0, "received": 0, "frm": ["-"]}
    assert "(from rank none)" in messages.render("teach.p2p", params, "en")
    assert "-" not in messages.render("teach.p2p", params, "zh").split("；")[-1]
