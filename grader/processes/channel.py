"""Inside a rank: its one socket to the grader (the supervisor, which hosts the run's switch), and in a graded
run the memory it shares with the grader for the large blobs of frames (ring.py).

Frames are wire.py's. `send` may be called from any thread (the student's, the transport's); `start`
runs a reader thread that hands every frame from the grader to a handler (the transport's completions).
"""
from __future__ import annotations

import _thread
import os
import socket
import struct
import threading

import numpy as np

from .. import wire
from .ring import Ring

_recv_into = socket.socket.recv_into
_sendmsg = socket.socket.sendmsg


# What a rank says when the grader's own code inside it runs out of memory (a thread of its own cannot start,
# a frame cannot be read): built here, in the zygote, so that saying it allocates nothing.
OUT_OF_MEMORY = b"".join(bytes(b) for b in wire.pack({"t": "memory"}))
OUT_OF_MEMORY_EXIT = 71


class Channel:
    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()
        self.ring: Ring | None = None   # the shared memory with the grader, in a graded run (ring.py)

    def out_of_memory(self):
        """The rank's memory limit left the grader's code no room: say so and end the rank now (a thread of
        the grader's that died of it would otherwise leave the rank waiting until the time limit)."""
        try:
            if self.lock.acquire(timeout=1):   # never inside another thread's frame
                os.write(self.sock.fileno(), OUT_OF_MEMORY)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(OUT_OF_MEMORY_EXIT)

    def send(self, header: dict, blobs: list | tuple = ()) -> None:
        with self.lock:
            buffers = self.ring.pack(header, blobs) if self.ring is not None else wire.pack(header, blobs)
            while buffers:
                sent = _sendmsg(self.sock, buffers[:512])   # at most IOV_MAX buffers at once
                while buffers and sent >= len(buffers[0]):
                    sent -= len(buffers[0])
                    buffers.pop(0)
                if buffers and sent:
                    buffers[0] = memoryview(buffers[0])[sent:]

    def _exactly(self, n: int):
        buf = np.empty(n, np.uint8) if n > 1 << 16 else bytearray(n)   # a large one is not zeroed first
        view, got = memoryview(buf).cast("B"), 0
        while got < n:
            k = _recv_into(self.sock, view[got:])
            if not k:
                raise EOFError("the grader closed the channel")
            got += k
        return buf

    def recv(self, first: bool = False) -> tuple[dict, list]:
        """The next frame from the grader (blocking). The `first` (the spec) may come with the rank's shared
        memory, passed with its first bytes."""
        if first:
            got, fds, _, _ = socket.recv_fds(self.sock, 4, 1)
            for fd in fds:
                try:
                    self.ring = Ring(fd, "rank")
                except (OSError, ValueError):   # no room for it (the memory limit): every blob goes inline
                    pass
                os.close(fd)
            prefix = got + bytes(self._exactly(4 - len(got))) if len(got) < 4 else got
        else:
            prefix = self._exactly(4)
        (length,) = struct.unpack("<I", prefix)
        header, blobs = wire.unpack(self._exactly(length))   # the blobs view the frame's own buffer
        if "shm" in header and self.ring is not None:
            blobs = self.ring.lend(header, blobs)
        return header, blobs

    def start(self, handler) -> None:
        """Read every later frame in a daemon thread: handler(header, blobs); EOF ends the thread."""
        def loop():
            try:
                while True:
                    try:
                        header, blobs = self.recv()
                    except (EOFError, OSError, wire.WireError):
                        handler(None, None)
                        return
                    handler(header, blobs)
                    del header, blobs   # not held while the next frame is awaited: its blobs may be lent (ring.py)
            except MemoryError:
                self.out_of_memory()
        self.start_thread(loop)

    def start_thread(self, target) -> None:
        """A thread of the grader's inside the rank. Started low-level: threading's start waits, forever, for
        a thread that the memory limit killed before it said it had started."""
        started = threading.Event()

        def body():
            started.set()
            target()
        try:
            _thread.start_new_thread(body, ())
        except RuntimeError:   # "can't start new thread": the memory limit leaves no room for its stack
            self.out_of_memory()
        while not started.wait(2):
            try:   # not started yet: the memory limit, or only a busy machine?
                bytearray(16 << 20)
            except MemoryError:
                self.out_of_memory()
