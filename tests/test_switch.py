"""The switch (grader/switch/): what it refuses it names, in gloo's words, on the rank that made the call; calls
that do not fit are named with what differs; every byte from a rank is hostile input; its records are its own
measurements. (What it delivers is compared with torch's own gloo in tests/test_differential.py.)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grader import wire
from grader.processes.runner import Runner
from grader.records import RunRequest
from grader.processes.limits import Limits
from grader.switch import ProtocolError, Switch
from grader.switch.arith import reduce_arrays
from switchsim import Sim

# -- what the switch names instead of gloo's silence, hang or abort ------------------------------------

def _errors(sim, seq=-1):
    return [sim.switch.calls[r][seq].error for r in range(sim.ws)]


def test_mismatched_calls_name_what_differs_on_every_rank():
    sim = Sim(2, perturb=())
    sim.op(0, "allreduce", [np.ones(4)], [(4,)], reduce="SUM")
    sim.op(1, "allgather", [np.ones(3)], [[(3,), (3,)]])
    errors = _errors(sim)
    assert errors[0] == errors[1] == ("the ranks called different operations: rank 0: allreduce(float32(4), op=SUM); "
                                      "rank 1: allgather(float32(3))")
    cases = [   # (what differs, rank 0's call, rank 1's call) -> the words naming it, each rank's call
        ("reduce operations", dict(reduce="SUM"), dict(reduce="MAX"), "op=SUM", "op=MAX"),
        ("shapes", dict(reduce="SUM"), dict(reduce="SUM", size=5), "float32(4)", "float32(5)"),
    ]
    for what, mine, theirs, a, b in cases:
        sim = Sim(2, perturb=())
        for rank, options in enumerate((mine, theirs)):
            size = options.pop("size", 4)
            sim.op(rank, "allreduce", [np.ones(size)], [(size,)], **options)
        error = _errors(sim)[0]
        assert error.startswith(f"the ranks called all_reduce with different {what}: ") and a in error and b in error
        assert error == _errors(sim)[1]
    sim = Sim(2, perturb=())   # different roots
    sim.op(0, "broadcast", [np.ones(2)], [(2,)], root=0)
    sim.op(1, "broadcast", None, [(2,)], root=1)
    assert _errors(sim) == ["the ranks called broadcast with different roots: rank 0: broadcast(float32(2), src=0); "
                            "rank 1: broadcast(float32(2), src=1)"] * 2
    sim = Sim(2, perturb=())   # different dtypes
    sim.op(0, "allreduce", [np.ones(2)], [(2,)])
    sim.dtype = "torch.float64"
    sim.op(1, "allreduce", [np.ones(2)], [(2,)])
    assert _errors(sim)[0] == ("the ranks called all_reduce with different dtypes: rank 0: allreduce(float32(2)); "
                               "rank 1: allreduce(float64(2))")


def test_all_to_all_splits_that_do_not_match_are_named_with_each_ranks_splits():
    sim = Sim(2, perturb=())
    sim.op(0, "alltoall_base", np.ones((4, 2)), (4, 2), splits=[[2, 2], [2, 2]])
    sim.op(1, "alltoall_base", np.ones((4, 2)), (4, 2), splits=[[1, 3], [3, 1]])
    error = _errors(sim)[0]
    assert error.startswith("the ranks called all_to_all with splits that do not match")
    assert "rank 0: alltoall_base(float32(4, 2), output_splits=[2, 2], input_splits=[2, 2])" in error
    assert "rank 1: alltoall_base(float32(4, 2), output_splits=[1, 3], input_splits=[3, 1])" in error


def test_an_all_to_all_output_of_another_size_is_the_calls_own_error_not_a_mismatch():
    """gloo refuses it on the rank that made it, whatever the others called."""
    sim = Sim(2, perturb=())
    sim.op(0, "alltoall", [np.ones(2), np.ones(2)], [(3,), (3,)])
    assert sim.switch.calls[0][0].error == \
        "ProcessGroupGloo::alltoall: input and output tensors must have the same size"
    assert not sim.switch.calls[1]   # rank 1 made no call yet: nothing paired


def test_a_root_out_of_range_is_gloos_error_on_every_rank_and_the_group_goes_on():
    for root in (2, -1):
        sim = Sim(2, perturb=())
        sim.op(0, "broadcast", [np.ones(2)], [(2,)], root=root)
        sim.op(1, "broadcast", None, [(2,)], root=root)
        assert _errors(sim) == [f"ProcessGroupGloo::broadcast: invalid root rank: {root}"] * 2
        assert sim.all_reduce([np.ones(2), np.ones(2)])[0].tolist() == [2.0, 2.0]   # the next call pairs
    for method, op in (("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter")):
        sim = Sim(2, perturb=())
        sim.op(0, method, [np.ones(2)], [(2,)], root=2)
        assert sim.switch.calls[0][0].error == f"ProcessGroupGloo::{op}: invalid root rank: 2"
    switch = Switch(2)   # gloo's rootRank is an int64: any of them is gloo's error, not a broken protocol
    switch.receive(0, {"t": "op", "seq": 0, "method": "broadcast", "group": [0, 1], "root": 1 << 40,
                       "outputs": [{"dtype": "torch.float32", "shape": [1]}]}, [])
    assert switch.calls[0][0].error == f"ProcessGroupGloo::broadcast: invalid root rank: {1 << 40}"
    with pytest.raises(ProtocolError):   # no torch call makes a root past an int64
        Switch(2).receive(0, {"t": "op", "seq": 0, "method": "broadcast", "group": [0, 1], "root": 1 << 64,
                              "outputs": [{"dtype": "torch.float32", "shape": [1]}]}, [])


def test_what_gloo_refuses_is_refused_on_the_rank_that_made_it():
    sim = Sim(2, perturb=())
    sim.dtype = "torch.complex64"
    sim.op(0, "gather", [np.ones(2)], [[(2,), (2,)]], root=0)
    sim.op(0, "reduce", [np.ones(2)], [(2,)], root=0, reduce="MAX")
    assert sim.switch.calls[0][0].error == "Invalid scalar type"
    assert sim.switch.calls[0][1].error == "reduce does not support\x04on complex tensors"   # c10 prints the enum
    sim.dtype = "torch.float32"
    sim.op(0, "alltoall", [np.ones(1), np.ones(2)], [(1,), (2,)])
    assert sim.switch.calls[0][2].error == \
        "ProcessGroupGloo::alltoall: invalid tensor size at index 1 (expected (1), got (2))"
    header = {"t": "op", "seq": 3, "method": "send", "group": [0, 1], "peer": 1, "tag": 0,
              "inputs": [{"dtype": "torch.float32", "shape": [2, 2], "blob": 0, "contiguous": False,
                          "strides": [1, 2]}]}
    sim.switch.receive(0, header, [np.ones(4, np.float32).tobytes()])
    assert sim.switch.calls[0][3].error == "input tensor has to be contiguous"
    assert all(c.completed and not c.ok for c in sim.switch.calls[0])   # nothing waits: each raised on its rank


def test_a_bool_sum_leaves_the_count_in_each_byte_as_gloo_does():
    sim = Sim(3, perturb=(), dtype="torch.bool")
    sim.all_reduce([np.array([True, True, False])] * 3)
    blob = wire.to_bytes(sim.switch.calls[0][0].delivered_arrays[0], "torch.bool")
    assert blob == bytes([3, 3, 0])


def test_empty_tensors_of_any_shape_go_through():
    for shape in ((0,), (0, 3), (2, 0, 3)):
        sim = Sim(3, perturb=("all_reduce",))
        out = sim.all_reduce([np.zeros(shape)] * 3)
        assert all(o.size == 0 for o in out) and all(c.ok for calls in sim.switch.calls for c in calls)
        gathered = sim.all_gather([np.zeros(shape)] * 3)
        assert all(g.size == 0 for g in gathered)


def test_two_groups_under_one_name_are_refused_and_named():
    """torch names a group by the order groups were made in: ranks that made different groups give two groups
    one name, which gloo connects under one store prefix (ranks of both pair up, or hang). The switch refuses
    the second group and says which."""
    from grader.verify import diagnose
    sim = Sim(4, perturb=())
    for rank in (0, 1):
        sim.op(rank, "allreduce", [np.ones(2)], [(2,)], group=[0, 1], gname="1", reduce="SUM")
    assert all(sim.switch.calls[r][0].ok for r in (0, 1))
    sim.op(2, "allreduce", [np.ones(2)], [(2,)], group=[2, 3], gname="1", reduce="SUM")
    error = sim.switch.calls[2][0].error
    assert "named '1'" in error and "[0, 1]" in error and "[2, 3]" in error and "use_local_synchronization" in error
    note = diagnose.group_name_conflict(sim.run())
    assert note.key == "cause.group_name" and (note.params["ranks"], note.params["other"]) == ([2, 3], [0, 1])
    sim = Sim(4, perturb=())   # each group under a name of its own (every rank made both): no conflict
    for rank in range(4):
        sim.op(rank, "allreduce", [np.ones(2)], [(2,)], group=[0, 2] if rank % 2 == 0 else [1, 3],
               gname="2" if rank % 2 == 0 else "3", reduce="SUM")
    assert all(sim.switch.calls[r][0].ok for r in range(4)) and diagnose.group_name_conflict(sim.run()) is None


def test_calls_are_compared_per_group_among_its_members():
    """A hierarchy's non-leaders make no call on the leaders' group: no mismatch. A member that skips a call
    of its group is one, named with that group's calls."""
    from grader.verify import diagnose
    sim = Sim(4, perturb=())
    for rank in range(4):
        sim.op(rank, "allreduce", [np.ones(2)], [(2,)], group=[rank - rank % 2, rank - rank % 2 + 1],
               gname=str(1 + rank // 2), reduce="SUM")
    for rank in (0, 2):
        sim.op(rank, "allreduce", [np.ones(2)], [(2,)], group=[0, 2], gname="3", reduce="SUM")
    for rank in range(4):
        sim.switch.finish(rank)
    assert diagnose.mismatched_calls(sim.run()) is None
    sim = Sim(2, perturb=())
    sim.op(0, "allreduce", [np.ones(2)], [(2,)], reduce="SUM")
    sim.switch.finish(1)
    note = diagnose.mismatched_calls(sim.run())
    assert note.key == "cause.mismatch" and note.params["calls"] == [{"rank": 0, "ops": ["all_reduce(2)"]},
                                                                     {"rank": 1, "ops": []}]


def test_values_past_the_dtype_become_inf_without_a_warning():
    """A student's data that overflows (500 doublings of ones, say) is inf, as torch gives; no numpy warning
    in the grader's own output."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in ("torch.float32", "torch.float16", "torch.bfloat16"):
            assert np.isinf(wire.round_to(np.array([1e300, -1e300]), dtype)).all()
        sim = Sim(2, perturb=("all_reduce",))
        delivered = sim.all_reduce([np.full(3, 3e38), np.full(3, 3e38)])
    assert all(np.isinf(d).all() for d in delivered)


def test_point_to_point_rules():
    sim = Sim(2, perturb=())
    sim.op(0, "send", [np.ones(6)], None, peer=1, tag=0)
    assert not sim.switch.calls[0][0].completed               # a send completes when its receive is posted
    sim.op(1, "recv", None, [(4,)], peer=0, tag=0)
    for rank in (0, 1):
        assert "message of 6 elements into a receive buffer of 4" in sim.switch.calls[rank][0].error
    sim.op(0, "send", [np.ones(2)], None, peer=0, tag=0)       # to oneself: gloo's ValueError
    assert sim.switch.calls[0][1].error == ("Invalid destination rank: destination rank should not be the same as the "
                                            "rank of the current process.")
    sim.op(0, "send", [np.ones(2)], None, peer=1, tag=5)
    sim.op(1, "recv", None, [(2,)], peer=0, tag=6)             # another tag: no pairing
    assert not sim.switch.calls[0][2].completed and not sim.switch.calls[1][1].completed


def test_a_deadlock_is_known_at_once():
    sim = Sim(2, perturb=())
    for rank in range(2):
        sim.op(rank, "send", [np.ones(3)], None, peer=1 - rank, tag=0)
        sim.switch.receive(rank, {"t": "wait", "seq": 0}, [])
    assert sim.switch.stuck() and sim.switch.waiting_on(0).op == "send"
    sim = Sim(2, perturb=())
    sim.all_reduce([np.ones(2), np.ones(2)])
    sim.op(0, "allgather", [np.ones(2)], [[(2,), (2,)]])
    sim.switch.receive(0, {"t": "wait", "seq": 1}, [])
    assert not sim.switch.stuck()                              # rank 1 is still running
    sim.switch.finish(1)                                       # ... until it returns without calling it
    assert sim.switch.stuck()


def test_every_floating_element_is_perturbed_one_element_tensors_included():
    sim = Sim(2)
    out = sim.all_reduce([np.ones(1), np.ones(1)])
    assert out[0][0] > 2.0 and all((c.deltas() > 0).all() for c in (sim.switch.calls[0][0], sim.switch.calls[1][0]))
    sim = Sim(2, dtype="torch.float16")
    out = sim.all_reduce([np.full(4, 1000.0), np.full(4, 1000.0)])
    assert (out[0] > 2000 + 2 * 1001 / 8 - 1).all()            # beyond float16's rounding and tolerance


def test_float16_deltas_are_beyond_its_tolerance_and_keep_an_honest_sum_in_range():
    """c (1 + |x|) with c from 1/8 to 1/4 for float16: at least 1/8 of 1 + |x| (its tolerance is 2%), and a sum
    of four ranks' 12000 (48000, under 4/5 of float16's 65504) perturbed stays in range (at most 1.25 x 48000 + 1;
    with c up to 1 it could reach 96004), while the other dtypes' c reaches 1 (a delta as large as the value)."""
    from grader.switch import perturb
    rng = np.random.default_rng(7)
    x = np.tile(np.array([-15000.0, -1.0, 0.0, 0.5, 1000.0, 15000.0]), 500)
    delta = perturb.perturbed(x, "torch.float16", rng) - x
    assert (delta >= (1 + np.abs(x)) / 8 * (1 - 2e-3) - 1e-3).all() and (delta <= (1 + np.abs(x)) / 4 * (1 + 2e-3) + 1e-3).all()
    assert len({round(float(d), 6) for d in delta[x == 0.0]}) == 5                  # 4/32 .. 8/32
    sim = Sim(4, dtype="torch.float16")
    out = sim.all_reduce([np.full(64, 12000.0)] * 4)
    assert np.isfinite(out[0]).all() and (out[0] <= 1.25 * 48000 + 64).all() and (out[0] >= 48000 + 4 * 12001 / 8 - 64).all()
    wide = perturb.perturbed(np.zeros(4000), "torch.float32", rng)
    assert wide.max() == 1.0 and wide.min() == 1 / 256


def test_reductions_in_the_dtype():
    bf = [np.array([1.0, 1 / 3], dtype=np.float32)] * 3
    total = reduce_arrays([wire.round_to(a.astype(np.float64), "torch.bfloat16") for a in bf], "SUM", "torch.bfloat16", 3)
    assert total.tolist() == wire.round_to(total.astype(np.float64), "torch.bfloat16").tolist()   # still bfloat16 values
    assert reduce_arrays([np.array([200], np.uint8), np.array([100], np.uint8)], "SUM", "torch.uint8", 2).tolist() == [44]
    assert reduce_arrays([np.array([True, False]), np.array([False, False])], "SUM", "torch.bool", 2).tolist() == [True, False]


def test_float_sums_are_added_in_gloos_ring_order():
    """At 3 ranks gloo's ring adds chunk c as x[c] + (x[c+1] + x[c+2]) (arith.py): the same bits as torch adding
    in that order, chunk by chunk, and not those of adding rank 0, 1, 2 (the values are built so that the order
    shows)."""
    from grader.switch.arith import chunk_bounds
    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal(1000) * np.exp(3 * rng.standard_normal(1000))).astype(np.float32) for _ in range(3)]
    got = reduce_arrays(xs, "SUM", "torch.float32", 3)
    t = [torch.from_numpy(x) for x in xs]
    for c, (start, stop) in enumerate(chunk_bounds(1000, 4, 3)):
        ring = t[c % 3][start:stop] + (t[(c + 1) % 3][start:stop] + t[(c + 2) % 3][start:stop])
        assert np.array_equal(got[start:stop], ring.numpy())
    assert not np.array_equal(got, ((t[0] + t[1]) + t[2]).numpy())
    # 4000 bytes in 6 segments of 668 (667 rounded up to whole elements), two to a chunk
    assert [stop - start for start, stop in chunk_bounds(1000, 4, 3)] == [334, 334, 332]


def test_a_transposed_view_is_added_in_the_order_its_elements_lie_in_memory():
    from grader.switch.arith import memory_order
    view = torch.arange(15.0).reshape(5, 3).t()
    order = memory_order(tuple(view.shape), tuple(view.stride()))
    assert np.array_equal(view.reshape(-1).numpy()[order], np.arange(15.0))
    assert memory_order((7,), (2,)) is None   # a view with gaps: gloo's bug, not reproduced


# -- hostile frames: a named stop of that rank, never the grader's failure -----------------------------

BAD_FRAMES = [
    ({"t": "op", "seq": 0, "method": "allreduce", "group": [0, 1], "inputs": [{"dtype": "<U1", "shape": [1], "blob": 0}],
      "outputs": [{"dtype": "<U1", "shape": [1]}]}, [b"x"]),                                        # a numpy format as dtype
    ({"t": "op", "seq": 0, "method": "allreduce", "group": [0, 1], "inputs": [{"dtype": "torch.float32", "shape": [4], "blob": 0}],
      "outputs": [{"dtype": "torch.float32", "shape": [4]}]}, [b"\0" * 3]),                         # bytes that do not fit
    ({"t": "op", "seq": 0, "method": "exec", "group": [0, 1]}, []),                                 # no such method
    ({"t": "op", "seq": 5, "method": "barrier", "group": [0, 1]}, []),                              # out of order
    ({"t": "op", "seq": 0, "method": "barrier", "group": [0, 7]}, []),                              # a rank that is not there
    ({"t": "op", "seq": 0, "method": "allreduce", "group": [0, 1], "inputs": [{"dtype": "torch.float32", "shape": [4]}],
      "outputs": [{"dtype": "torch.float32", "shape": [4]}]}, []),                                  # sent without values
    ({"t": "op", "seq": 0, "method": "allreduce", "group": [0, 1], "inputs": [[[[{}]]]]}, []),      # nested too deep
    ({"t": "op", "seq": 0, "method": "allreduce", "group": [0, 1], "inputs": [{"dtype": "torch.float32", "shape": [-1]}]}, []),
    ({"t": "wait", "seq": 3}, []),
]


@pytest.mark.parametrize("header, blobs", BAD_FRAMES)
def test_hostile_frames_are_refused(header, blobs):
    with pytest.raises((ProtocolError, wire.WireError)):
        Switch(2).receive(0, header, blobs)


def test_the_frame_reader_refuses_what_does_not_parse():
    for raw in (b"\xff\xff\xff\xff", b"\x05\0\0\0\x01\0\0\0x", b"\x0a\0\0\0\x06\0\0\0[1, 2]", b"\x08\0\0\0\x04\0\0\0{\"a\""):
        with pytest.raises(wire.WireError):
            wire.FrameReader().feed(raw)
    assert wire.value({"kind": "tensor", "dtype": "<U1", "shape": [1], "blob": 0}, [b"x"])["kind"] == "other"


HOSTILE_RANK = """
import os, socket, stat, struct, json
def run_worker(rank, world_size):
    def sock_fd(f):
        try:
            return stat.S_ISSOCK(os.fstat(int(f)).st_mode)
        except OSError:   # the listing's own descriptor, closed by now
            return False
    fd = next(int(f) for f in os.listdir("/proc/self/fd") if f.isdigit() and sock_fd(f))
    sock = socket.socket(fileno=os.dup(fd))      # the rank's own channel to the grader
    {body}
    return None
"""
MALFORMED = {
    "unicode_dtype": 'h = json.dumps({"t": "result", "how": "return", "values": {"t": {"kind": "tensor", "dtype": "<U1", '
                     '"shape": [1], "blob": 0}}, "blobs": [1]}).encode(); '
                     'sock.sendall(struct.pack("<II", 4 + len(h) + 1, len(h)) + h + b"x")',
    "garbage": 'sock.sendall(b"\\xff" * 64)',
    "huge_length": 'sock.sendall(struct.pack("<I", 2**31))',
}


@pytest.mark.timeout(60)
def test_malformed_messages_end_that_rank_with_a_named_verdict():
    with Runner(limits=Limits(wall_s=10)) as runner:
        outs = runner.run_many([RunRequest(world_size=2, source=HOSTILE_RANK.format(body=body), filename="h.py",
                                           quantities=("t",)) for body in MALFORMED.values()])
    for name, out in zip(MALFORMED, outs):
        if name == "unicode_dtype":   # a well-formed frame with a value the grader will not read
            assert out.stop == "completed" and out.ranks[0].result.values["t"]["kind"] == "other", name
        else:
            assert out.stop == "protocol" and out.stop_rank in (0, 1), (name, out.stop, out.error)


def test_values_kept_are_the_first_operations_then_a_window_of_the_latest():
    """The switch keeps values for verification within a budget per rank (switch.core.RETAIN_FIRST, then
    RETAIN_LATEST): the first operations, then the latest, the oldest of the window making way; every record
    (operation, sizes, what was delivered) stays, so counts and traffic are judged on all of them."""
    from grader.switch import core
    sim = Sim(2)
    n, total = 1 << 16, 100
    rng = np.random.default_rng(0)
    for _ in range(total):
        sim.all_reduce([rng.standard_normal(n), rng.standard_normal(n)])
    per_op = 3 * 4 * n    # sent, what entered (perturbed), delivered: float32
    first, latest = core.RETAIN_FIRST // per_op, (core.RETAIN_LATEST - core.RETAIN_LATEST_SMALL) // per_op
    assert per_op > core.SMALL_OP   # these are large operations: their own window
    for calls in sim.switch.calls:
        assert [c.retained for c in calls] == [True] * first + [False] * (total - first - latest) + [True] * latest
        assert len(calls) == total and all(c.completed and c.delivered for c in calls)
        dropped, kept = calls[first], calls[-1]
        assert dropped.sent_values() == [None] and dropped.delivered_values() == [None]
        assert kept.sent_values()[0].size == n and kept.delivered_values()[0].size == n


def test_small_operations_have_a_window_of_their_own_so_an_answer_between_loops_keeps_its_evidence():
    """A warm-up of MiB-sized all-reduces fills the first budget, the answer (a few KiB) follows, then a
    benchmark loop of MiB-sized tensors: the loop's own operations make way, never the answer's."""
    from grader.switch import core
    sim = Sim(2)
    big, small = 1 << 20, 1024
    rng = np.random.default_rng(1)
    for _ in range(3):
        sim.all_reduce([rng.standard_normal(big), rng.standard_normal(big)])
    sim.all_reduce([rng.standard_normal(small), rng.standard_normal(small)])
    for _ in range(12):
        sim.all_reduce([rng.standard_normal(big), rng.standard_normal(big)])
    for calls in sim.switch.calls:
        answer = calls[3]
        assert answer.retained and answer.delivered_values()[0].size == small
        assert not all(c.retained for c in calls[4:])          # the budget did run out
        kept = sum(c.retain_bytes for c in calls[4:] if c.retained)
        assert kept + answer.retain_bytes <= core.RETAIN_LATEST


def test_a_large_frame_is_read_in_place_and_what_it_carries_is_read_only_evidence():
    """A frame's rest is read straight into its buffer (FrameReader.room / filled); the tensors view it, aligned
    for their dtype, and nothing may write them (they are the record of what the rank sent)."""
    values = [np.arange(3, dtype=np.float64) / 7, np.arange(1 << 18, dtype=np.float32)]
    descs = [{"dtype": "torch.float64", "shape": [3], "blob": 0},
             {"dtype": "torch.float32", "shape": [1 << 18], "blob": 1}]
    raw = b"".join(bytes(b) for b in wire.pack({"t": "op", "inputs": descs}, values))
    reader = wire.FrameReader()
    assert reader.feed(raw[:4096]) == [] and reader.room(1 << 30) is None
    room = reader.room(1024)
    room[:] = raw[4096:]
    [(header, blobs)] = reader.filled(len(room))
    for desc, sent in zip(header["inputs"], values):
        got = wire.tensor(desc, blobs)
        assert got.tolist() == sent.tolist() and got.flags.aligned and not got.flags.owndata
        with pytest.raises(ValueError):
            got[0] = 1


def test_an_all_reduce_of_16m_float32_is_carried_perturbed_and_its_evidence_kept():
    """64 MiB sent by each rank and delivered to each: within the switch's limits (MAX_PAYLOAD, MAX_OUTPUT), every
    element perturbed, and the record keeps what was sent, what entered and what was delivered (an operation
    larger than a window is kept alone, the rank's latest such one)."""
    from grader.processes.linux import supervisor_memory
    supervisor_memory()   # the supervisor's memory settings, as a Runner makes them (10 s -> 1.5 s here)
    sim, n = Sim(2, perturb=("all_reduce",)), 1 << 24
    for r in range(2):
        sim.op(r, "allreduce", [np.full(n, r + 1.0, dtype=np.float32)], [(n,)], reduce="SUM")
    calls = [sim.switch.calls[r][-1] for r in range(2)]
    assert all(c.completed and c.ok and c.retained for c in calls), [c.error for c in calls]
    sent, entered = [c.sent[0] for c in calls], [c.perturbed[0] for c in calls]
    assert all((e > s).all() for s, e in zip(sent, entered))              # every element carries its delta
    assert calls[0].delivered_arrays[0] is calls[1].delivered_arrays[0]   # one result, made once
    assert np.array_equal(calls[0].delivered_arrays[0], entered[0] + entered[1])


def test_an_operation_larger_than_its_window_is_kept_alone_and_its_answer_proven(monkeypatch):
    """With windows smaller than one operation (as 16M float32 are): the warm-up makes way for the answer,
    whose value is proven from the record."""
    from grader.exercise.spec import Quantity
    from grader.switch import core
    from test_provenance import assert_proven, prove
    monkeypatch.setattr(core, "RETAIN_FIRST", 0)
    monkeypatch.setattr(core, "RETAIN_LATEST", 2048)
    monkeypatch.setattr(core, "RETAIN_LATEST_SMALL", 1024)
    monkeypatch.setattr(core, "SMALL_OP", 256)
    n = 128   # sent, entered and delivered: 3 x 512 bytes, more than the window of 1 KiB
    sim = Sim(2)
    sim.all_reduce([np.ones(n), np.ones(n)])
    out = sim.all_reduce([np.full(n, 1.0), np.full(n, 2.0)])
    for calls in sim.switch.calls:
        assert [c.retained for c in calls] == [False, True]
    mean = Quantity("gradient", local=lambda r, ws: [r + 1.0] * n, combine="mean", through=("all_reduce",))
    assert_proven(prove(sim, mean, [o / 2 for o in out]))


def test_a_max_all_reduce_travels_unperturbed_where_a_sum_is_perturbed():
    """A MAX (MIN, product) proves nothing and honest code branches on it (GradScaler's found_inf must stay 0
    where nothing overflowed); a sum in the same perturbed run carries the deltas."""
    sim = Sim(2, perturb=("all_reduce",))
    flags = sim.all_reduce([np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.float32)], reduce="MAX")
    assert all(f.tolist() == [0.0] for f in flags)
    sums = sim.all_reduce([np.ones(4, dtype=np.float32), np.ones(4, dtype=np.float32)])
    assert all((s > 2.0).all() for s in sums)   # 1 + 1 plus positive deltas
    maxed, summed = sim.switch.calls[0]
    assert maxed.perturbed is None and summed.perturbed is not None


def test_a_float16_sum_near_the_limit_is_never_proven_whatever_the_draw():
    """Whether perturbed data can overflow a float16 sum is decided by what the ranks sent, never by the draw:
    positive parts past about 4/5 of 65504 (57344 = 13280 + 44064) are unproven in every grading; under it
    (52000), or a negative sum of any size (-61744: deltas move it toward zero), no draw ever overflows."""
    from grader.switch import perturb
    from grader.verify.evidence import near_overflow
    from grader.verify.observe import RunView
    for seed in range(40):
        for pair, unsafe in (([13280.0, 44064.0], True), ([26000.0, 26000.0], False), ([-9424.0, -52320.0], False),
                             ([50000.0, -20000.0], False)):
            sim = Sim(2, dtype="torch.float16", seed=seed)
            out = sim.all_reduce([np.array([v, 1.0]) for v in pair])
            if not unsafe:
                assert np.isfinite(out[0]).all()
            call = sim.switch.calls[0][0]
            finding = near_overflow(RunView(sim.run()), [call])
            assert (finding is not None) == unsafe and (finding is None or finding.key == "near_overflow")
    # the bound itself: the largest delta of float16 is 1/4, and each rank adds at most c
    assert perturb.may_overflow(np.array([52403.0 * 1.01]), 2, "torch.float16")
    assert not perturb.may_overflow(np.array([52000.0]), 2, "torch.float16")
    assert not perturb.may_overflow(np.array([3e38]), 2, "torch.float64")


def test_a_reported_tensor_too_large_to_carry_stays_a_tensor_of_its_shape():
    """A rank's answer of 2^40 elements (a stride-0 expand): no values, but a tensor of that shape (its check says
    the shape is wrong), not 'not a torch.Tensor'; a description that is no tensor at all is 'other'."""
    big = wire.value({"kind": "tensor", "plain": True, "type": "Tensor", "dtype": "torch.float32",
                      "shape": [1 << 40], "omitted": "size"}, [])
    assert big["kind"] == "tensor" and big["shape"] == [1 << 40] and big["array"] is None and big["omitted"] == "size"
    junk = wire.value({"kind": "tensor", "dtype": "torch.float32", "shape": "many"}, [])
    assert junk["kind"] == "other"
