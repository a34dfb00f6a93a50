"""Shared memory beside a rank's socket: the large tensors of its frames, each way, without the socket.

A socket copies a frame's bytes twice (into the kernel, out of it), in pieces of its buffer. In a graded run
the supervisor also gives each rank a memfd of SIZE bytes (with the first bytes of its spec), which both map:
a control page, then a region of REGION bytes for each way (`up`: the rank writes, the supervisor reads;
`down`: the other way). A frame's blob of at least LEAST bytes is copied into the sender's region, once, and
travels as a reference in its header; the frame itself still goes through the socket, in order with every
other frame:

    header["shm"] = [[blob index, offset, bytes], ...]   the blob's inline size is 0
    header["shm_end"] = the sender's running total of bytes placed, after this frame's

The receiver takes each referenced blob, then writes `shm_end` into the control word of that way: all that
was placed so far is taken. A sender starts again at its region's beginning only when all it placed was
taken; otherwise it goes on after its last blob, and a blob that does not fit travels inline, in the socket,
as before. So a sender never writes what was not taken yet, and nothing depends on the shared memory but
speed. The supervisor takes a blob by copying it into memory of its own, before anything reads the frame
(`take`); a rank takes it by reading it where it lies, when it delivers it into the student's tensors, and
says so once no view it was lent is left (`lend`).

The rank is hostile; the supervisor never trusts the shared memory:
  - the memfd is sealed against shrinking (and growing, and any further seal) before the rank gets it:
    whatever the rank does with its fd, no access of the supervisor's can fault (SIGBUS);
  - a reference is checked (index, bounds, no blob twice) and its bytes copied once: what the rank writes
    there afterwards never reaches what the switch holds;
  - the rank's control word only decides where the supervisor writes the rank's own deliveries next: a rank
    that lies about it overwrites its own answers, nothing else.
A rank maps the memfd before any student code runs, and says in its "ready" frame whether it could (its
memory limit); the supervisor writes to a rank's region only once it has said so.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref

import numpy as np

from .. import wire

CTRL = 4096                 # the control page: u64 taken-up-to of the up region, then of the down region
REGION = 16 << 20           # each way: an all_reduce of 4M float32 in one piece
SIZE = CTRL + 2 * REGION
LEAST = 64 << 10            # smaller blobs travel inline (a copy through the socket costs less than a reference)
MAX_TAKEN = 2 << 30         # what the supervisor copies out of one rank's region in a run (twice what a run's
#                             operations may send, switch.core.TRAFFIC_BYTES): a reference costs the rank a few
#                             bytes, its copy the supervisor up to REGION, so references alone are counted
_ALIGN = 64                 # each blob starts a cache line (the arrays viewing it are aligned for any dtype)


def make() -> int:
    """A new memfd for one rank, of SIZE bytes, sealed so that it can never shrink (or grow, or be resealed)."""
    fd = os.memfd_create("grader-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, SIZE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except OSError:
        os.close(fd)
        raise
    return fd


class Ring:
    """One side's mapping of a rank's memfd: `grader` writes down and reads up, `rank` the other way. Mapped
    at once (OSError or ValueError if it cannot be); the caller closes its fd (the mapping keeps a duplicate)."""

    def __init__(self, fd: int, side: str):
        if os.fstat(fd).st_size != SIZE or not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
            raise ValueError("not a ring of the grader's")
        self.map = mmap.mmap(fd, SIZE)
        whole = np.frombuffer(self.map, np.uint8)
        self.ctrl = np.frombuffer(self.map, np.uint64, count=2)
        up, down = whole[CTRL:CTRL + REGION], whole[CTRL + REGION:]
        grader = side == "grader"
        self.mine, self.theirs = (down, up) if grader else (up, down)
        self.mine_taken, self.theirs_taken = (1, 0) if grader else (0, 1)   # control words
        self.ready = not grader   # the grader writes to a rank's region once the rank has mapped it
        self.taken = 0            # bytes copied out of the other side's region (`take`)
        self.placed = 0           # running total of bytes this side placed in its region ...
        self.at = 0               # ... and where its next blob goes
        self.lock = threading.RLock()   # a lent view may be collected (and returned) inside `lend` itself
        self.lent = 0             # views of the other side's region still out (`lend`) ...
        self.end = 0              # ... and the total it placed, once they are all back

    def pack(self, header: dict, blobs) -> list:
        """wire.pack, with every blob of at least LEAST bytes that fits placed in this side's region."""
        views = [memoryview(b).cast("B") for b in blobs]
        if not self.ready or self.mine is None or all(len(v) < LEAST for v in views):
            return wire.pack(header, views)
        if int(self.ctrl[self.mine_taken]) == self.placed:   # all taken: start again at the beginning
            self.at = 0
        refs = []
        for i, view in enumerate(views):
            if len(view) < LEAST or self.at + len(view) > REGION:
                continue
            self.mine[self.at:self.at + len(view)] = np.frombuffer(view, np.uint8)
            refs.append([i, self.at, len(view)])
            step = -(-len(view) // _ALIGN) * _ALIGN
            self.at += step
            self.placed += step
            views[i] = b""
        return wire.pack(dict(header, shm=refs, shm_end=self.placed) if refs else header, views)

    def _refs(self, header: dict, blobs: list) -> tuple[list, int]:
        refs, end = header.get("shm"), header.get("shm_end")
        if self.theirs is None or not isinstance(refs, list) or len(refs) > len(blobs) or type(end) is not int \
                or not 0 <= end < 1 << 62:
            raise wire.WireError("bad shared-memory references")
        seen = set()
        for ref in refs:
            if not (isinstance(ref, list) and len(ref) == 3 and all(type(v) is int for v in ref)):
                raise wire.WireError("bad shared-memory reference")
            i, at, size = ref
            if not 0 <= i < len(blobs) or i in seen or len(blobs[i]) or not 0 <= at <= at + size <= REGION:
                raise wire.WireError("bad shared-memory reference")
            seen.add(i)
        return refs, end

    def take(self, header: dict, blobs: list) -> list:
        """The frame's blobs, each referenced one copied out of the other side's region into memory of this
        side's own (wire.WireError for references that break the rules); then all placed so far is taken."""
        refs, end = self._refs(header, blobs)
        self.taken += sum(size for _, _, size in refs)
        if self.taken > MAX_TAKEN:
            raise wire.WireError("more bytes through shared memory than a run may pass")
        blobs = list(blobs)
        for i, at, size in refs:
            own = np.empty(size, np.uint8)
            own[...] = self.theirs[at:at + size]
            blobs[i] = memoryview(own)
        self.ctrl[self.theirs_taken] = end
        return blobs

    def lend(self, header: dict, blobs: list) -> list:
        """`take` without the copy: each referenced blob as a view of the other side's region, lent until it is
        gone (delivered into the student's tensors, or the operation's handle dropped). Once none is out, all
        placed so far is taken."""
        refs, end = self._refs(header, blobs)
        blobs = list(blobs)
        with self.lock:
            for i, at, size in refs:
                view = self.theirs[at:at + size]
                self.lent += 1
                weakref.finalize(view, self._returned)
                blobs[i] = view
            self.end = end
        return blobs

    def _returned(self) -> None:
        with self.lock:
            self.lent -= 1
            if not self.lent and self.ctrl is not None:
                self.ctrl[self.theirs_taken] = self.end

    def close(self) -> None:
        """Unmapped (once no view of it is left: a blob still viewing it keeps the mapping until it goes)."""
        with self.lock:
            self.mine = self.theirs = self.ctrl = None
        try:
            self.map.close()
        except BufferError:
            pass
