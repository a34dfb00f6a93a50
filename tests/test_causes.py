"""Causes across every exercise, graded through the real command (one `batch` per fixture folder):
an honest fixture's report names no cause at all; every cause the engine or an exercise can name is
named for some mistake fixture, and for no honest one. A cause is said only where it is certain, so a
cause that no mistake shows is either missing a fixture or never said.
"""
from __future__ import annotations

import re

import pytest

from conftest import graded_folder, results_of
from grader.exercise import registry
from grader.feedback.messages import CATALOG
from grader.feedback.render import HIDDEN_VARIANTS

# folder -> its exercise (the ZeRO folder holds its honest styles, mistakes and cheats together: h*, m*, c*)
FOLDERS = {"honest": "dist_primitives", "mistakes": "dist_primitives",
           "ring_allreduce/honest": "ring_allreduce", "ring_allreduce/mistakes": "ring_allreduce",
           "zero_sharded_step": "zero_sharded_step",
           **{f"{ex}/{kind}": ex for ex in ("grad_accum_no_sync", "fp16_allreduce", "hierarchical_allreduce", "tensor_parallel_mlp")
              for kind in ("honest", "mistakes")}}
EXERCISES = registry.available()   # loading them adds their messages to the catalog under their names
# Traffic shapes that no correct ring all-reduce can have, while the traffic checks judge correct sums only
# (cause.traffic_needs_value otherwise): a rank with no exchange at all never sees the others' data; ranks
# that turn different ways, each with one peer each way, can only form pairs; a rank that receives from the
# side it sends to waits for a send that goes elsewhere. tests/test_ring_allreduce.py names each from
# synthetic figures (test_traffic_rules_on_synthetic_exchanges).
NO_FIXTURE_CAN_SHOW = {"cause.traffic_none", "cause.traffic_direction", "cause.traffic_same_side"}
# Counts no exercise of the course declares: a count over all ranks together, and one that a right answer can
# fall short of (grad_accum_no_sync's one all-reduce is what makes its gradient right). The toy exercise of
# tests/test_toy_exercise.py declares both and names them (test_counts_volume_and_groups_checks_graded_end_to_end).
NOT_IN_THE_COURSE = {"cause.counts_all", "cause.counts_fewer"}
# Causes only a real-backend run that runs out of time shows: each costs a time limit twice over (the run is
# tried again with twice the time), so one fixture of its own names it, graded with a short limit in
# tests/test_cli.py (test_an_isend_request_dropped_hangs_on_gloo_and_is_named).
REAL_BACKEND_HANGS = {"cause.isend_not_waited"}


def emittable() -> set[str]:
    """Every cause key the engine or an exercise can name (the value-free hidden variants are the same
    causes, worded for hidden checks)."""
    engine = {key for key in CATALOG if key.startswith("cause.")} - set(HIDDEN_VARIANTS.values())
    own = {f"{ex.name}.{key}" for ex in EXERCISES.values() for key in (ex.messages or {}) if key.startswith("cause.")}
    return engine | own


# folder -> (feedback language, options): the gradings the exercise's own test files make, shared with them
# (conftest.graded_folder); the causes are keys, whatever the language
GRADINGS = {"honest": ("en", ()), "mistakes": ("en", ("--time-limit", "2")), "ring_allreduce/honest": ("en", ()),
            "ring_allreduce/mistakes": ("en", ()), "zero_sharded_step": ("zh", ()),
            **{folder: ("zh", ()) for folder in FOLDERS if folder.split("/")[0] in
               ("grad_accum_no_sync", "fp16_allreduce", "hierarchical_allreduce", "tensor_parallel_mlp")}}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """{folder: {student: results.json}}: every folder once."""
    return {folder: results_of(graded_folder(tmp_path_factory, folder, exercise, GRADINGS[folder][0], *GRADINGS[folder][1]))
            for folder, exercise in FOLDERS.items()}


def honest(graded) -> dict:
    return {f"{folder}/{name}": results for folder, group in graded.items() for name, results in group.items()
            if folder.endswith("honest") or (folder == "zero_sharded_step" and name.startswith("h"))}


def mistakes(graded) -> dict:
    return {f"{folder}/{name}": results for folder, group in graded.items() for name, results in group.items()
            if folder.endswith("mistakes") or (folder == "zero_sharded_step" and name.startswith("m"))}


def named(results: dict) -> set[str]:
    return {c["key"] for found in results["extra_data"]["causes"].values() for c in found}


def test_every_cause_is_worded_as_a_cause():
    """So that a report in either language shows a cause as a line of its own: 原因：... / Cause: ..."""
    for key in emittable() | set(HIDDEN_VARIANTS.values()):
        zh, en = CATALOG[key]
        assert zh.startswith("原因：") and en.startswith("Cause: "), key
        assert re.search(r"[\u4e00-\u9fff]", zh) and not re.search(r"[\u4e00-\u9fff]", en), key


@pytest.mark.timeout(900)
def test_honest_reports_name_no_cause(graded):
    found = honest(graded)
    assert len(found) >= 60
    for name, results in found.items():
        assert results["score"] == 100, name
        lines = [line.strip() for text in [results["output"], *(t["output"] for t in results["tests"])]
                 for line in text.splitlines()]
        assert not [line for line in lines if line.startswith(("原因：", "Cause:"))], name
        assert not named(results), name


@pytest.mark.timeout(900)
def test_every_cause_is_named_for_a_mistake_and_never_for_an_honest_style(graded):
    wanted = emittable()
    assert NO_FIXTURE_CAN_SHOW <= wanted
    said = set().union(*(named(results) for results in mistakes(graded).values()))
    assert REAL_BACKEND_HANGS <= wanted
    assert sorted(wanted - NO_FIXTURE_CAN_SHOW - NOT_IN_THE_COURSE - REAL_BACKEND_HANGS - said) == []
    assert said & NO_FIXTURE_CAN_SHOW == set()
    for name, results in honest(graded).items():
        assert not named(results) & wanted, name
