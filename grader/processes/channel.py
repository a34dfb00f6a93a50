"""Inside a rank: its one socket to the grader (the supervisor, which hosts the run's switch).

Frames are wire.py's. `send` may be called from any thread (the student's, the transport's); `start`
runs a reader thread that hands every frame from the grader to a handler (the transport's completions).
"""
from __future__ import annotations

import socket
import struct
import threading

from .. import wire

_recv_into = socket.socket.recv_into
_sendmsg = socket.socket.sendmsg


class Channel:
    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def send(self, header: dict, blobs: list | tuple = ()) -> None:
        buffers = wire.pack(header, blobs)
        with self.lock:
            while buffers:
                sent = _sendmsg(self.sock, buffers[:512])   # at most IOV_MAX buffers at once
                while buffers and sent >= len(buffers[0]):
                    sent -= len(buffers[0])
                    buffers.pop(0)
                if buffers and sent:
                    buffers[0] = memoryview(buffers[0])[sent:]

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = _recv_into(self.sock, view[got:])
            if not k:
                raise EOFError("the grader closed the channel")
            got += k
        return buf

    def recv(self) -> tuple[dict, list]:
        """The next frame from the grader (blocking)."""
        (length,) = struct.unpack("<I", self._exactly(4))
        return wire.unpack(bytes(self._exactly(length)))

    def start(self, handler) -> None:
        """Read every later frame in a daemon thread: handler(header, blobs); EOF ends the thread."""
        def loop():
            while True:
                try:
                    header, blobs = self.recv()
                except (EOFError, OSError, wire.WireError):
                    handler(None, None)
                    return
                handler(header, blobs)
        self.thread = threading.Thread(target=loop, name="grader-channel", daemon=True)
        self.thread.start()
