"""The switch against torch's own gloo, byte for byte.

tests/fixtures/differential/cases.py (every operation x dtype x shape, the errors gloo raises, the object
collectives and point-to-point) runs through the grader's switch and through torch's gloo in the same sandbox;
every rank's outputs are compared case by case as bytes (dtype, shape and every byte; a bool SUM's counts
included), every error as its type and gloo's words. Where gloo kills the rank or waits forever, the switch
must raise; where gloo's result for a strided view is a bug (docs/switch.md), the switch's must be gloo's
result for the same data made contiguous.

`make test` runs the core (a few dtypes and shapes at 2 and 3 ranks, gloo's order of additions at 4); the
whole matrix (17 dtypes x 9 shapes x every operation at 2, 3 and 4 ranks, some 2,500 cases a world size):
    GRADER_DIFFERENTIAL=full .venv/bin/python -m pytest -q -n 0 tests/test_differential.py
"""
from __future__ import annotations

import json
import os
import re

import pytest

from conftest import FIXTURES
from grader.processes.runner import Runner, RunRequest
from grader.processes.limits import Limits

CASES = FIXTURES / "differential" / "cases.py"
MATRIX = os.environ.get("GRADER_DIFFERENTIAL", "core")
# (world size, shards, cases selected by a part of their name): a shard is one run of each mode, within one
# run's traffic limit and time
PLANS = {
    "core": [(2, 1, ""), (3, 1, ""), (4, 1, "order of additions")],
    "full": [(ws, 8, "") for ws in (2, 3, 4)],
}


def _source(matrix: str, shard: int, shards: int, select: str) -> str:
    text = CASES.read_text()
    for old, new in (('MATRIX = "core"', f'MATRIX = "{matrix}"'), ("SHARD = (0, 1)", f"SHARD = ({shard}, {shards})"),
                     ('SELECT = ""', f"SELECT = {select!r}")):
        assert old in text
        text = text.replace(old, new)
    return text


def _listing(matrix: str, ws: int, select: str) -> list[str]:
    """The names of the cases a run plays (the case file, read here without torch.distributed running)."""
    namespace: dict = {}
    exec(compile(_source(matrix, 0, 1, select), str(CASES), "exec"), namespace)
    return [name for name, _ in namespace["cases"](ws) if select in name]


def _rows(outcome) -> list[dict]:
    per_rank = []
    for record in outcome.ranks:
        lines = [json.loads(line[5:]) for line in record.output_text().splitlines() if line.startswith("CASE ")]
        per_rank.append({row["case"]: row for row in lines})
    return per_rank


@pytest.fixture(scope="module")
def runs():
    """{(world size, mode): [per rank: {case: row}]}, every shard merged, and the stops of every run."""
    plan = PLANS[MATRIX]
    requests = [RunRequest(world_size=ws, source=_source(MATRIX, k, shards, select), filename="cases.py",
                           quantities=("t",), mode=mode, label=f"{ws}:{k}:{select}")
                for ws, shards, select in plan for k in range(shards) for mode in ("switch", "real")]
    limits = Limits(wall_s=900 if MATRIX == "full" else 240, cpu_s=900, output_keep_kb=16384, processes=1024)
    with Runner(limits=limits) as runner:
        outcomes = runner.run_many(requests)
    merged: dict = {}
    stops = []
    for request, outcome in zip(requests, outcomes):
        stops.append((request.world_size, request.mode, request.label, outcome.stop, outcome.error))
        rows = merged.setdefault((request.world_size, request.mode), [{} for _ in range(request.world_size)])
        for rank, found in enumerate(_rows(outcome)):
            rows[rank].update(found)
    return merged, stops


def _clean(error: str) -> str:
    """An error as both sides word it: without c10's log prefix, or the addresses of gloo's unconnected pair."""
    error = re.sub(r"\[rank\d+\]:\[\S+ [\d:.]+ \S+\] ", "", error).strip()
    return re.sub(r"Pair is not connected \(.*\)$", "Pair is not connected", error)


def _strided_bug() -> tuple:
    namespace: dict = {}
    exec(compile(CASES.read_text().split("\ndef gloo_fails")[0], str(CASES), "exec"), namespace)
    return namespace["STRIDED_BUG"]


STRIDED_BUG = _strided_bug()


def _twin(name: str) -> str | None:
    """The contiguous copy a strided case is compared with, where gloo's result for the view is its bug."""
    if " strided" in name and ", copied" not in name and name.split()[0] in STRIDED_BUG:
        return name.replace("strided", "strided, copied")
    return None


def differences(ours: list[dict], gloos: list[dict]) -> list[tuple]:
    """(rank, case, what the switch did, what gloo did) wherever they differ."""
    wrong = []
    for rank, (mine, theirs) in enumerate(zip(ours, gloos)):
        for name, gloo in theirs.items():
            switch = mine.get(name)
            if switch is None:
                wrong.append((rank, name, "missing", gloo))
            elif "gloo" in gloo:   # gloo kills the rank or waits forever: the switch raises where gloo would
                if not ("error" in switch or switch.get("ok") == []):
                    wrong.append((rank, name, switch, gloo))
            elif _twin(name) is not None:
                if switch.get("ok") != theirs.get(_twin(name), {}).get("ok"):
                    wrong.append((rank, name, switch, theirs.get(_twin(name))))
            elif "error" in gloo or "error" in switch:
                if _clean(switch.get("error", "(no error)")) != _clean(gloo.get("error", "(no error)")):
                    wrong.append((rank, name, switch, gloo))
            elif switch["ok"] != gloo["ok"]:
                wrong.append((rank, name, switch, gloo))
    return wrong


@pytest.mark.timeout(3600 if MATRIX == "full" else 420)
@pytest.mark.parametrize("ws", sorted({ws for ws, _, _ in PLANS[MATRIX]}))
def test_the_switch_delivers_and_refuses_what_gloo_does(runs, ws):
    merged, stops = runs
    stopped = [stop for stop in stops if stop[0] == ws and stop[3] != "completed"]
    assert not stopped, stopped
    ours, gloos = merged[ws, "switch"], merged[ws, "real"]
    select = next(select for w, _, select in PLANS[MATRIX] if w == ws)
    expected = set(_listing(MATRIX, ws, select))
    assert all(set(rows) == expected for rows in ours + gloos)   # every case ran, on every rank, on both sides
    wrong = differences(ours, gloos)
    assert not wrong, "\n".join(f"rank {rank}, {name}: switch {mine}, gloo {theirs}"
                                 for rank, name, mine, theirs in wrong)
    if select == "":   # what the cases cover, at least
        errors = sum("error" in row for row in gloos[0].values())
        assert errors >= 60 and len(expected) >= 500
        assert {"all_reduce bool 0d SUM", "all_reduce bfloat16 1000 SUM, gloo's order of additions",
                "all_gather float32 empty2d", "broadcast src=-1 on the default group", "gather of complex tensors",
                "all_to_all with a different size for each peer", "all_to_all_single float32 transposed",
                "send and recv float32 transposed", "all_reduce float32 strided SUM"} <= expected
        assert any("gloo" in row for row in gloos[0].values())


def test_a_strided_case_is_compared_with_its_contiguous_copy():
    assert _twin("all_reduce float32 strided SUM") == "all_reduce float32 strided, copied SUM"
    assert _twin("gather float32 strided") is None and _twin("all_reduce float32 small SUM") is None
    listing = _listing("core", 3, "")
    assert "all_reduce float32 strided, copied SUM" in listing
