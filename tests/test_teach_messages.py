"""The teaching report's numbers (grader/teach.py) and the message catalog (grader/messages.py), directly."""
from __future__ import annotations

import string

import pytest

from grader.feedback import messages, render
from grader.model import Note
from grader.processes.runner import RankRecord, RunOutcome, RunRequest
from grader.feedback.teach import ring_volume, teaching_notes


@pytest.mark.parametrize("op, n, size, volume, formula", [
    ("all_reduce", 2, 4096, 4096, "2(2-1)/2 x 4096"),
    ("all_reduce", 4, 4096, 6144, "2(4-1)/4 x 4096"),
    ("all_reduce", 8, 8000, 14000, "2(8-1)/8 x 8000"),
    ("all_gather", 2, 1024, 512, "(2-1)/2 x 1024"),
    ("all_gather", 4, 2048, 1536, "(4-1)/4 x 2048"),
])
def test_ring_volume(op, n, size, volume, formula):
    assert ring_volume(op, n, size) == (volume, formula)


def _rank(rank, calls):
    rec = RankRecord(rank)
    for op, n, arg, ms in calls:
        rec.calls.append({"t": "enter", "op": op, "n": n, "args": arg})
        rec.calls.append({"t": "exit", "op": op, "n": n, "ok": True, "ms": ms})
    return rec


def test_teaching_notes_per_rank_and_collective():
    grad = {"tensor": {"dtype": "torch.float64", "shape": [1024], "numel": 1024}}
    feat = {"tensor_list": {"len": 4}, "tensor": {"dtype": "torch.float32", "shape": [128], "numel": 128}}
    run = RunOutcome(RunRequest(world_size=4, source="", filename="s.py"),
                     [_rank(r, [("all_reduce", 0, grad, 2.0), ("all_gather", 0, feat, 0.5)]) for r in range(4)])
    notes = teaching_notes(run)
    assert notes[0] == Note("teach.header", {"ws": 4, "backend": "gloo"})
    by = {(n.params["rank"], n.params["op"]): n.params for n in notes[1:]}
    assert len(by) == 8
    # all-reduce of 1024 float64 = 8192 bytes: a ring sends 2(N-1)/N x 8192 = 12288 bytes in 2 ms
    assert by[3, "all_reduce"] == {"rank": 3, "op": "all_reduce", "ms": 2.0, "size": 8192, "volume": 12288,
                                   "formula": "2(4-1)/4 x 8192", "bandwidth": "6.14 MB/s"}
    # all-gather of 4 x 128 float32 = 2048 bytes in total: (N-1)/N x 2048 = 1536 bytes in 0.5 ms
    assert by[0, "all_gather"] == {"rank": 0, "op": "all_gather", "ms": 0.5, "size": 2048, "volume": 1536,
                                   "formula": "(4-1)/4 x 2048", "bandwidth": "3.07 MB/s"}
    text = messages.render("teach.collective", by[0, "all_gather"], "en")
    assert text == ("  rank 0 all_gather: 0.50 ms; 2048 bytes of data, a ring sends about 1536 bytes per rank "
                    "((4-1)/4 x 2048), about 3.07 MB/s")


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
    for key in render.SAFE_CAUSES:
        zh, en = messages.CATALOG[key]
        assert _fields(zh) <= {"op"} and _fields(en) <= {"op"}, key
    for key, variant in render.HIDDEN_VARIANTS.items():
        assert variant in render.SAFE_CAUSES and key not in render.SAFE_CAUSES


@pytest.mark.parametrize("env, lang", [({"LANG": "en_US.UTF-8"}, "en"), ({"LANG": "zh_CN.UTF-8"}, "zh"),
                                       ({"LANG": ""}, "zh"), ({}, "zh"), ({"LANG": "C.UTF-8"}, "zh")])
def test_default_language_from_lang_else_chinese(monkeypatch, env, lang):
    monkeypatch.delenv("LANG", raising=False)
    monkeypatch.delenv("LC_ALL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert messages.default_lang() == lang
