"""The ranks' shared memory with the supervisor (grader/processes/ring.py): the large blobs of frames travel
there, each way; nothing the rank writes there reaches what the switch holds, and a reference that breaks
the rules is a protocol break, never a fault of the supervisor."""
from __future__ import annotations

import fcntl
import gc
import os
import socket
import struct

import numpy as np
import pytest

from conftest import FIXTURES
from grader import wire
from grader.processes import ring
from grader.processes.channel import Channel
from grader.processes.limits import Limits
from grader.processes.runner import Runner
from grader.records import RunRequest

RING = FIXTURES / "ring"


@pytest.fixture
def pair():
    """The two sides of one memfd, as the supervisor and a rank map it; the rank has said it is ready."""
    fd = ring.make()
    try:
        grader, rank = ring.Ring(fd, "grader"), ring.Ring(fd, "rank")
    finally:
        os.close(fd)
    grader.ready = True
    yield grader, rank
    grader.close()
    rank.close()


def _frame(buffers) -> tuple[dict, list]:
    """What the receiver's FrameReader makes of packed buffers."""
    data = b"".join(bytes(b) for b in buffers)
    return wire.unpack(memoryview(data)[4:])


def _array(count: int) -> np.ndarray:
    return np.arange(count, dtype=np.float32)


def test_the_memfd_is_sealed_against_shrinking_before_any_rank_gets_it():
    fd = ring.make()
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)   # what would make the supervisor's next access fault (SIGBUS)
        assert os.fstat(fd).st_size == ring.SIZE
    finally:
        os.close(fd)
    plain = os.memfd_create("not-sealed")
    try:
        os.ftruncate(plain, ring.SIZE)
        with pytest.raises(ValueError):
            ring.Ring(plain, "grader")
    finally:
        os.close(plain)


def test_large_blobs_travel_in_the_region_small_ones_inline(pair):
    grader, rank = pair
    big, small = _array(1 << 18), _array(16)
    header, blobs = _frame(rank.pack({"t": "op", "seq": 0}, [big, small]))
    assert header["shm"] == [[0, 0, big.nbytes]] and header["blobs"] == [0, small.nbytes]
    got = grader.take(header, blobs)
    assert np.array_equal(np.frombuffer(got[0], np.float32), big)
    assert np.array_equal(np.frombuffer(got[1], np.float32), small)
    # the other way: lent as views of the region
    header, blobs = _frame(grader.pack({"t": "done", "seq": 0}, [big]))
    assert header["shm"] == [[0, 0, big.nbytes]]
    lent = rank.lend(header, blobs)
    assert np.array_equal(lent[0].view(np.float32), big)


def test_what_the_supervisor_took_is_its_own_copy(pair):
    grader, rank = pair
    header, blobs = _frame(rank.pack({"t": "op", "seq": 0}, [_array(1 << 18)]))
    got = grader.take(header, blobs)
    rank.mine[:] = 0xFF   # the rank writes its region again, after the supervisor took the frame
    assert np.array_equal(np.frombuffer(got[0], np.float32), _array(1 << 18))


def test_a_sender_reuses_its_region_only_once_all_is_taken_and_sends_inline_when_full(pair):
    grader, rank = pair
    quarter = np.zeros(ring.REGION // 4 // 4, np.float32)   # a quarter of the region
    first = _frame(rank.pack({"t": "op", "seq": 0}, [quarter]))
    grader.take(*first)
    assert _frame(rank.pack({"t": "op", "seq": 1}, [quarter]))[0]["shm"][0][1] == 0   # taken: from the start
    # not taken yet: each goes after the last, and what does not fit goes inline
    offsets = [_frame(rank.pack({"t": "op", "seq": s}, [quarter]))[0].get("shm") for s in range(2, 6)]
    assert [o[0][1] if o else None for o in offsets] == [ring.REGION // 4, ring.REGION // 2, 3 * ring.REGION // 4,
                                                        None]


def test_a_rank_says_it_took_its_deliveries_only_once_no_view_is_left(pair):
    grader, rank = pair
    one = _frame(grader.pack({"t": "done", "seq": 0}, [_array(1 << 16)]))
    two = _frame(grader.pack({"t": "done", "seq": 1}, [_array(1 << 16)]))
    a, b = rank.lend(*one)[0], rank.lend(*two)[0]
    assert int(grader.ctrl[grader.mine_taken]) == 0
    del b
    assert int(grader.ctrl[grader.mine_taken]) == 0   # the first is still out: the region is not free
    assert np.array_equal(a.view(np.float32), _array(1 << 16))
    del a
    assert int(grader.ctrl[grader.mine_taken]) == grader.placed
    assert _frame(grader.pack({"t": "done", "seq": 2}, [_array(1 << 16)]))[0]["shm"][0][1] == 0


@pytest.mark.timeout(20)
def test_a_view_collected_while_the_rank_lends_the_next_returns_without_a_deadlock(pair, monkeypatch):
    grader, rank = pair
    cycle = [rank.lend(*_frame(grader.pack({"t": "done", "seq": 0}, [_array(1 << 16)])))]
    cycle.append(cycle)   # a view in a reference cycle: only the garbage collector frees it ...
    del cycle
    finalize = ring.weakref.finalize

    def collecting(*args):   # ... and it may run at any allocation, here inside `lend`, its lock held
        gc.collect()
        return finalize(*args)
    monkeypatch.setattr(ring.weakref, "finalize", collecting)
    view = rank.lend(*_frame(grader.pack({"t": "done", "seq": 1}, [_array(1 << 16)])))[0]
    assert rank.lent == 1 and np.array_equal(view.view(np.float32), _array(1 << 16))


def test_the_supervisor_writes_to_a_rank_only_once_it_mapped_its_region(pair):
    grader, _ = pair
    grader.ready = False
    header, blobs = _frame(grader.pack({"t": "done", "seq": 0}, [_array(1 << 18)]))
    assert "shm" not in header and len(blobs[0]) == (1 << 18) * 4


@pytest.mark.parametrize("sealed", [True, False])
def test_a_rank_takes_its_memfd_with_its_spec_and_does_without_one_it_cannot_use(sealed):
    """The spec's first bytes carry the memfd (zygote_client._share); a rank that cannot map it (here: one
    that is not the grader's, unsealed) reads its spec all the same, and sends every blob inline."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)   # the inline frame fits: nobody reads yet
    fd = ring.make() if sealed else os.memfd_create("not-sealed")
    try:
        if not sealed:
            os.ftruncate(fd, ring.SIZE)
        frame = b"".join(bytes(b) for b in wire.pack({"t": "spec", "rank": 0}))
        socket.send_fds(mine, [frame[:8]], [fd])
        mine.sendall(frame[8:])
        channel = Channel(theirs.detach())
        header, _ = channel.recv(first=True)
        assert header["t"] == "spec" and header["rank"] == 0
        assert (channel.ring is not None) is sealed
        channel.send({"t": "note"}, [_array(1 << 16)])
        (length,) = struct.unpack("<I", mine.recv(4, socket.MSG_WAITALL))
        got = wire.unpack(mine.recv(length, socket.MSG_WAITALL))[0]
        assert ("shm" in got) is sealed   # in its region, or inline
    finally:
        os.close(fd)
        mine.close()


@pytest.mark.parametrize("refs, end", [
    ([[0, ring.REGION - 64, 128]], 128),          # past the region's end
    ([[0, -64, 64]], 64),                          # before its start
    ([[0, 0, 64], [0, 64, 64]], 128),              # one blob twice
    ([[3, 0, 64]], 64),                            # no such blob
    ([[1, 0, 64]], 64),                            # a blob that came inline too
    ([[0, 0, "64"]], 64),                          # not a number
    ([0, 0, 64], 64),                              # not a list of references
    ([[0, 0, 64]], -1),                            # a negative total
    ("everything", 64),
])
def test_references_that_break_the_rules_are_refused(pair, refs, end):
    grader, _ = pair
    header = {"t": "op", "seq": 0, "shm": refs, "shm_end": end, "blobs": [0, 4]}
    with pytest.raises(wire.WireError):
        grader.take(header, [memoryview(b""), memoryview(b"abcd")])
    assert int(grader.ctrl[grader.theirs_taken]) == 0   # nothing was said taken


def test_the_supervisor_copies_a_bounded_amount_however_often_a_region_is_referenced(pair, monkeypatch):
    grader, _ = pair
    monkeypatch.setattr(ring, "MAX_TAKEN", 3 * ring.REGION)
    header = {"t": "note", "shm": [[0, 0, ring.REGION]], "shm_end": 64, "blobs": [0]}
    for _ in range(3):   # a whole region, referenced again and again by frames of a few bytes
        grader.take(header, [memoryview(b"")])
    with pytest.raises(wire.WireError):
        grader.take(header, [memoryview(b"")])


# -- through the supervisor, with sandboxed ranks -----------------------------------------------------------

@pytest.fixture(scope="module")
def runner():
    with Runner(limits=Limits(wall_s=60)) as r:
        yield r


def _run(runner, name: str, perturb=()):
    [out] = runner.run_many([RunRequest(world_size=2, source=(RING / name).read_text(), filename=name,
                                        quantities=("t", "u"), perturb=perturb)])
    return out


@pytest.mark.timeout(240)
def test_large_operations_through_the_shared_memory_deliver_what_the_switch_computed(runner, monkeypatch):
    taken = []
    original = ring.Ring.take
    monkeypatch.setattr(ring.Ring, "take", lambda self, h, b: taken.append(len(h["shm"])) or original(self, h, b))
    out = _run(runner, "honest_burst.py")
    assert out.stop == "completed", (out.stop, out.error, [r.output_text()[-2000:] for r in out.ranks])
    # through the regions: both ranks' all_gather pieces, the broadcast's root, and the async all_reduces that
    # found room (the others, sent while the region was not yet all taken, went inline)
    assert sum(taken) >= 7, taken
    expected = [[2 * k + 1] * 2 for k in range(6)] + [[3, 3], [0, 0], [1, 1], [1, 1]]
    for rec in out.ranks:
        assert rec.result.values["t"]["array"].reshape(-1, 2).tolist() == expected
        assert rec.result.values["u"]["array"].tolist() == [1.0]
        last = rec.calls[6]   # the 20 MiB all_reduce: larger than a region, inline, the same answer
        assert last.delivered_arrays[0] is not None and float(last.delivered_arrays[0][0]) == 3.0


@pytest.mark.timeout(240)
def test_large_perturbed_operations_on_two_cores_deliver_gloos_sum_of_what_entered(runner):
    """At 3 ranks, perturbed: the 4 MiB and 20 MiB all_reduces are perturbed as each operation runs, the ranks'
    calls on two cores (grader/twocores.py), every element of every rank's data with its delta, and what was
    delivered is gloo's sum of what entered, bit for bit (wherever the record kept the values)."""
    from grader.switch.arith import reduce_arrays
    [out] = runner.run_many([RunRequest(world_size=3, source=(RING / "honest_burst.py").read_text(),
                                        filename="honest_burst.py", quantities=("t", "u"), perturb=("all_reduce",))])
    assert out.stop == "completed", (out.stop, out.error, [r.output_text()[-2000:] for r in out.ranks])
    kept = 0
    for rec in out.ranks:
        for call in rec.calls[:7]:   # the six 4 MiB all_reduces, then the 20 MiB one
            assert call.op == "all_reduce" and call.completed and call.sent_numel >= 1 << 20
            partners = [call.partners[g] for g in range(3)]
            if not all(p.retained for p in partners):
                continue
            kept += 1
            assert all((p.perturbed[0] > p.sent[0]).all() for p in partners)
            total = reduce_arrays([p.perturbed[0] for p in partners], "SUM", "torch.float32", 3)
            assert np.array_equal(call.delivered_arrays[0].view(np.uint32), total.view(np.uint32))
    assert kept >= 3


@pytest.mark.timeout(240)
def test_a_rank_that_rewrites_its_deliveries_changes_only_its_own_tensor_never_the_record(runner):
    out = _run(runner, "rewrites_delivery.py", perturb=("all_reduce",))
    assert out.stop == "completed", (out.stop, out.error)
    forged, honest = (rec.result.values["t"]["array"] for rec in out.ranks)
    assert forged.tolist() == [42.0] * 4   # what it wrote over its own answer
    delivered = [rec.calls[0].delivered_arrays[0] for rec in out.ranks]
    assert np.array_equal(delivered[0], delivered[1]) and np.array_equal(delivered[1][:4], honest)
    assert float(delivered[0][0]) != 42.0 and float(delivered[0][0]) > 3.0   # the perturbed sum the switch made


@pytest.mark.timeout(240)
def test_forged_references_are_a_protocol_break_and_the_supervisor_goes_on(runner):
    out = _run(runner, "forged_references.py")
    assert out.stop == "protocol"
    assert _run(runner, "honest_burst.py").stop == "completed"
