"""Red team of the switch design: attack submissions graded as a class, each scoring what it deserves.

Every folder of tests/fixtures/attacks/<exercise>/ is graded by ONE `python -m grader batch` call (the
a* files: the d* files attack the grader's time and memory and are measured one at a time below, bounded).
Per attack: the score it deserves (0 on every check it fakes: usually only the static points, or what its
code legitimately earns), no check blamed on the grader (outcome grader_error: "a grader problem: tell your
TA", "the grader could not complete this run"), no "autograder failed", no Traceback from the grader.
An attack that succeeds is kept and marked xfail (strict: a fix makes it pass, and the mark must go), with
the hole in one line; the red-team report describes each.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import FIXTURES, PY, ROOT, run_cli

ATTACKS = FIXTURES / "attacks"

# A forged or broken protocol (raw frames, a sabotaged reporter, a setup_error frame after "ready") stops the
# run with a verdict that names the rank (Outcome.PROTOCOL): what was right before it (a snapshot) still counts.

# attack -> (the score it deserves, why it is expected to fail today (None: the grader holds))
EXPECTED = {
    "dist_primitives": {
        "a01_wrap_channel_send_forge_result": (10, None),
        "a02_fake_link_answers_ops_locally": (10, None),
        "a03_rewrite_pending_deliveries": (10, None),
        "a04_collective_on_a_group_of_one": (55, None),
        "a05_raw_bad_json": (10, None),
        "a06_raw_huge_length": (10, None),
        "a07_raw_numpy_format_dtype": (10, None),
        "a08_raw_wrong_blob_sizes": (10, None),
        "a09_raw_out_of_order_seq": (10, None),
        "a10_raw_result_before_any_op": (10, None),
        "a11_raw_many_frames": (100, None),
        "a12_raw_setup_error_frame": (10, None),
        "a13_raw_end_frame_first": (10, None),
        "a14_library_copy_kernel": (10, None),
        "a15_library_contiguous_kernel": (55, None),
        "a16_side_channels_between_ranks": (100, None),
        "a17_own_gloo_group_on_loopback": (100, None),
        "a18_probe_zeros_same_op_then_local": (55, None),
        "a19_launder_gradient_through_all_gather": (50, None),   # no all_reduce in its text either
        "a20_one_rank_contributes_for_all": (55, None),
        "a21_racing_thread_writes_answer": (55, None),
        "a22_read_delivery_before_wait": (10, None),
        "a23_exit_inside_future_callback": (10, None),
        "a24_close_own_socket": (10, None),
        "a25_sigkill_self_mid_collective": (55, None),   # its gradient was right before it died (snapshot)
        "a26_exception_that_breaks_reporting": (50, None),  # the gradient from the locals; no all_gather
        "a27_patched_linecache_breaks_error_record": (55, None),
        "a28_entry_object_whose_getattr_raises": (100, None),
        # its result cannot be sent: a protocol verdict for the run; the gradient was right before (snapshot)
        "a29_wire_pack_fails_for_results": (55, None),
        "a30_patch_rank_reporter": (10, None),
        "a31_library_view_kernel": (55, None),
        # communicating at the top level (a decorator, a table of operations): the module is loaded before
        # the run's group exists, as under plain Python, so it fails there (static points only)
        "a32_decorator_communicates_at_import": (10, None),
        "a33_top_level_communicates_through_a_table": (10, None),
        "a34_nested_lambdas_at_the_top_level": (100, None),   # honest: analysed in bounded time
        # telling a perturbed run from a clean one by the student's own checks: a handler that catches their
        # AssertionError turns recording off; the hook cannot be rebound by an assignment
        "a35_catches_its_own_assert_to_tell_runs_apart": (10, None),
        "a36_rebinds_the_check_hook": (10, None),
    },
    "ring_allreduce": {
        # an answer the operations' data did not make (the values' numbers stay the same when the data in
        # flight changes) earns no "uses" points either (issue 19): 10 for the static check alone
        # every run is judged: the perturbed run's whole-tensor sends fail the traffic checks and, at 3 ranks
        # and more, the ring; at 2 ranks, two ranks that send only to each other are the ring's shape (+5)
        "a01_tell_runs_apart_fake_ring_in_clean_run": (65, None),
        "a02_float16_chunks": (20, None),
        "a03_int32_bit_view_chunks": (20, None),
        "a04_int16_chunks": (20, None),
        "a05_whole_tensor_ring_padded_sends": (80, None),
        "a06_functional_collective_on_own_group": (0, None),
        "a07_one_rank_sends_the_answer": (10, None),
        "a08_probe_zeros_then_local": (20, None),
        "a09_racing_thread_writes_answer": (10, None),
        "a10_read_before_wait": (20, None),
        "a11_exit_mid_ring": (20, None),
        "a12_raw_garbage_mid_ring": (20, None),
        # a value returned in half precision keeps float32's tolerance (the exercise asks for no less)
        "a13_float16_ring_float16_result": (20, None),
        "a14_wrap_channel_send_forge_result": (10, None),
        "a15_library_copy_kernel": (10, None),
        "a16_side_channel_chunks": (100, None),
    },
    "zero_sharded_step": {
        # every run is judged: the all_reduce of its perturbed run fails the primitives check
        "a01_tell_runs_apart_all_reduce_in_perturbed_run": (85, None),
        # the primitives check counts calls (dummy ones too, as for the fixtures' c01): the disguised
        # all-reduce earns them; its values do not pass
        "a02_all_reduce_dressed_as_reduce_scatter": (25, None),
        "a03_launder_params_through_all_gather": (55, None),
        "a04_one_rank_contributes_for_all": (25, None),
        "a05_probe_zeros_then_local": (25, None),
        "a06_racing_thread_on_gathered_params": (40, None),
        "a07_read_gathered_before_wait": (55, None),
        "a08_wrap_channel_send_forge_result": (10, None),
        "a09_library_copy_kernel": (10, None),
        # a protocol verdict for the run; momentum was right before (rank 0's snapshot, as for a12)
        "a10_raw_setup_error_frame": (55, None),
        "a11_exit_between_reduce_scatter_and_all_gather": (10, None),
        # the momentum of rank 1's last snapshot passes (as for a rank left waiting); params never reported
        "a12_raw_bad_json": (55, None),
    },
}

_GRADED: dict = {}


def _graded(exercise: str, tmp_path_factory) -> dict:
    """{attack: results.json} of ONE batch call over the exercise's attack folder (its a* files)."""
    if exercise not in _GRADED:
        source = tmp_path_factory.mktemp(f"attacks-{exercise}")
        for path in sorted((ATTACKS / exercise).glob("a*.py")):
            shutil.copy(path, source / path.name)
        out = tmp_path_factory.mktemp(f"attacks-{exercise}-out")
        proc = run_cli("batch", str(source), "--out", str(out), "--exercise", exercise, "--lang", "en",
                       "--jobs", "2", timeout=600)
        _GRADED[exercise] = (proc, {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in out.glob("*.json")})
    return _GRADED[exercise]


def _cases():
    for exercise, attacks in EXPECTED.items():
        for name, (score, hole) in attacks.items():
            marks = [pytest.mark.timeout(660)]
            if hole:
                marks.append(pytest.mark.xfail(reason=hole, strict=True))
            yield pytest.param(exercise, name, score, marks=marks, id=f"{exercise}/{name}")


def _texts(results: dict) -> str:
    return "\n".join([results.get("output", "")] + [t["name"] + "\n" + t["output"] for t in results.get("tests", [])])


@pytest.mark.timeout(660)
@pytest.mark.parametrize("exercise", list(EXPECTED))
def test_every_attack_is_listed_and_the_batch_runs_clean(exercise, tmp_path_factory):
    proc, graded = _graded(exercise, tmp_path_factory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    on_disk = sorted(p.stem for p in (ATTACKS / exercise).glob("a*.py"))
    assert sorted(EXPECTED[exercise]) == on_disk == sorted(graded)


@pytest.mark.parametrize("exercise, name, score", list(_cases()))
def test_attack_scores_what_it_deserves(exercise, name, score, tmp_path_factory):
    _, graded = _graded(exercise, tmp_path_factory)
    results = graded[name]
    text = _texts(results)
    outcomes = results["extra_data"].get("outcomes") or {}
    assert results["extra_data"].get("grader_error") is None
    assert "autograder failed" not in text.lower() and "Traceback" not in text
    assert "grader_error" not in outcomes.values(), {k: v for k, v in outcomes.items() if v != "pass"}
    assert results["score"] == score, {k: v for k, v in outcomes.items() if v != "pass"}


# ------------------------------------------------------------------------------------------------
# The grader's own time and memory (the d* fixtures), one at a time, bounded

PEAK = r"""
import json, resource, sys
from grader import plan
from grader.exercise import registry
from grader.processes.runner import Runner
from grader.records import RunRequest
ex = registry.get(sys.argv[2])
source = open(sys.argv[1], encoding="utf-8").read()
with Runner() as runner:   # this process is the supervisor: its peak memory is the switch's
    runner.run_many([RunRequest(world_size=2, source="def run_worker(rank, world_size):\n    return None\n",
                                filename="/warm.py")])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = runner.run_many([RunRequest(world_size=2, source=source, filename="/submission.py",
                                      quantities=tuple(q.name for q in ex.quantities),
                                      perturb=plan.perturbed_ops(ex))])[0]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"stop": out.stop, "grew_mib": (after - before) / 1024, "unread": [r.unread for r in out.ranks]}))
"""


def _supervisor_growth(fixture: str, exercise: str = "dist_primitives") -> dict:
    proc = subprocess.run([PY, "-c", PEAK, str(ATTACKS / exercise / fixture), exercise], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_one_operation_cannot_make_the_supervisor_build_far_more_than_was_sent():
    # K inputs of 16 KiB, K lists of K x N outputs (64 MiB at two ranks): refused before anything is built
    grown = _supervisor_growth("d02_allgather_output_amplification.py")
    assert grown["stop"] == "traffic_limit"
    assert grown["grew_mib"] < 64, grown     # 720 KiB sent per rank


@pytest.mark.timeout(300)
def test_a_rank_that_stops_reading_cannot_make_the_supervisor_hold_its_answers():
    # 16 MiB owed per all-gather: the rank is stopped once it leaves more than MAX_UNREAD (40 MiB) unread.
    # What the supervisor holds meanwhile is bounded per rank, whatever the number of operations: what its
    # operations not yet completed sent (MAX_IN_FLIGHT, 64 MiB, and its perturbed copy), its latest
    # snapshot (here 24 MiB of locals) and the frame being read
    grown = _supervisor_growth("d03_stalled_reader.py")
    assert grown["stop"] == "traffic_limit" and grown["unread"] == [True, False], grown
    assert grown["grew_mib"] < 400, grown


@pytest.mark.timeout(300)
def test_reports_cannot_make_the_supervisor_keep_far_more_than_their_budget():
    grown = _supervisor_growth("d04_snapshot_flood.py")
    assert grown["stop"] in ("completed", "protocol"), grown
    assert grown["grew_mib"] < 64, grown     # 2000 frames per rank: 500 KiB of report budget each


@pytest.mark.timeout(180)
def test_verification_of_a_run_is_bounded_in_time(tmp_path):
    # four identical delivered copies make every match tie: the tracer's work budget ends the search
    results = tmp_path / "results.json"
    proc = run_cli("grade", str(ATTACKS / "dist_primitives" / "d01_backtracking_bomb.py"), "--results", str(results),
                   "--exercise", "dist_primitives", "--lang", "en", timeout=150)
    assert proc.returncode == 0
    assert json.loads(results.read_text(encoding="utf-8"))["score"] == 55   # static + the honest gradient
