"""The wire between a rank and the grader: one socket per rank, length-prefixed frames.

    frame  = u32 length of the rest | u32 header length | header | blob 0 | blob 1 | ...
    header = a JSON object (UTF-8): {"t": kind, ..., "blobs": [bytes of blob 0, bytes of blob 1, ...]}

A tensor travels as a descriptor in the header, {"dtype": "torch.float32", "shape": [4, 2], "blob": i}, and
its raw bytes in C order as blob i ("blob" absent: its shape and dtype only, as for an output buffer). In a
graded run a large blob may lie in the memory its rank shares with the grader instead, named by the header's
"shm" (processes/ring.py: its inline size is then 0).

    rank -> grader   ready, op, wait, snap, result, note, end
    grader -> rank   spec, done

Both sides use this module: the rank packs tensors it holds (torch), the grader unpacks them with numpy
only. Every frame from a rank is hostile input: `FrameReader` and `tensor` check sizes, counts, JSON
types, dtypes (a fixed table: never a numpy format a rank names) and shapes, and raise `WireError` for
anything else; nothing is unpickled or evaluated.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np

MAX_FRAME = 96 << 20       # one frame: an operation's payload (MAX_PAYLOAD) and its header
MAX_PAYLOAD = 64 << 20     # the tensors one operation sends
MAX_HEADER = 1 << 20
MAX_BLOBS = 4096
MAX_DIMS = 64             # numpy's own limit (torch goes further; 17 dimensions of size 1 are honest code)
_HEAD = struct.Struct("<II")
ALIGN = 64                 # where a frame's first blob starts (bytes into the body: a multiple of a cache line)

# torch dtype -> (bytes per element, numpy dtype of its values; None: carried as bytes, no arithmetic)
DTYPES: dict[str, tuple[int, str | None]] = {
    "torch.float64": (8, "<f8"), "torch.float32": (4, "<f4"), "torch.float16": (2, "<f2"),
    "torch.bfloat16": (2, "bf16"), "torch.int64": (8, "<i8"), "torch.int32": (4, "<i4"), "torch.int16": (2, "<i2"),
    "torch.int8": (1, "i1"), "torch.uint8": (1, "u1"), "torch.bool": (1, "?"), "torch.uint16": (2, "<u2"),
    "torch.uint32": (4, "<u4"), "torch.uint64": (8, "<u8"), "torch.complex64": (8, "<c8"),
    "torch.complex128": (16, "<c16"), "torch.float8_e4m3fn": (1, None), "torch.float8_e5m2": (1, None),
}
FLOATING = ("torch.float64", "torch.float32", "torch.float16", "torch.bfloat16")
HALF = ("torch.float16", "torch.bfloat16")


class WireError(ValueError):
    """A frame or a descriptor that breaks the rules: the rank that sent it is stopped (a named verdict)."""


# -- frames --------------------------------------------------------------------------------------------

def pack(header: dict, blobs: list | tuple = ()) -> list:
    """The buffers of one frame (header with its "blobs" sizes filled in, then the blobs, uncopied). The header
    is padded with spaces so that the first blob starts a multiple of ALIGN bytes into the frame's body (after
    its length): the reader's arrays then view it in place (`tensor`), aligned for any dtype."""
    views = [memoryview(b).cast("B") for b in blobs]
    header = dict(header, blobs=[len(v) for v in views])
    head = json.dumps(header, separators=(",", ":"), default=_plain).encode()
    if views:
        head += b" " * (-(4 + len(head)) % ALIGN)
    total = 4 + len(head) + sum(len(v) for v in views)
    return [_HEAD.pack(total, len(head)), head, *views]


def _plain(value):
    """JSON for what a rank's header may hold beyond plain types (numpy scalars, say); never code."""
    try:
        return value.item()
    except AttributeError:
        return repr(value)[:200]


class FrameReader:
    """Frames out of a byte stream, as (header, blobs): fed in chunks, checked before anything is kept.
    A frame's bytes are copied once, into a buffer of its announced length (which the blobs then view); a
    large frame's rest can be read straight into that buffer (`room`, then `filled`)."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self.max_frame = max_frame
        self.head = bytearray()             # the length prefix, while incomplete
        self.body: np.ndarray | None = None  # the frame being filled (bytes)
        self.got = 0

    def feed(self, chunk: bytes) -> list[tuple[dict, list[memoryview]]]:
        frames, view, at = [], memoryview(chunk), 0
        while at < len(view):
            if self.body is None:
                take = min(4 - len(self.head), len(view) - at)
                self.head += view[at:at + take]
                at += take
                if len(self.head) < 4:
                    break
                (need,) = struct.unpack("<I", self.head)
                self.head = bytearray()
                if not 4 <= need <= self.max_frame:
                    raise WireError(f"frame of {need} bytes")
                self.body, self.got = np.empty(need, np.uint8), 0   # not zeroed: every byte is read into it
            take = min(len(self.body) - self.got, len(view) - at)
            self.body[self.got:self.got + take] = view[at:at + take]
            self.got += take
            at += take
            if self.got == len(self.body):
                body, self.body = self.body, None
                frames.append(unpack(body))
        return frames

    def room(self, least: int) -> memoryview | None:
        """The rest of the frame being filled, when it is at least `least` bytes: read it in place."""
        if self.body is None or len(self.body) - self.got < least:
            return None
        return memoryview(self.body)[self.got:]

    def filled(self, count: int) -> list[tuple[dict, list[memoryview]]]:
        """`count` bytes were read into `room()`: the frame, once complete."""
        self.got += count
        if self.got < len(self.body):
            return []
        body, self.body = self.body, None
        return [unpack(body)]

    @property
    def pending(self) -> int:
        return len(self.head) + self.got


def unpack(body) -> tuple[dict, list[memoryview]]:
    """One frame's header and blobs (the bytes after its length: bytes, a bytearray or an array of uint8)."""
    view = memoryview(body).cast("B")
    if len(view) < 4:
        raise WireError("frame of fewer than 4 bytes")
    (head_len,) = struct.unpack_from("<I", view)
    if not 2 <= head_len <= min(MAX_HEADER, len(view) - 4):
        raise WireError(f"header of {head_len} bytes")
    try:
        header = json.loads(bytes(view[4:4 + head_len]))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise WireError(f"header is not JSON: {type(err).__name__}") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise WireError("header is not an object with a kind")
    sizes = header.get("blobs", [])
    if not isinstance(sizes, list) or len(sizes) > MAX_BLOBS or not all(_count(s) for s in sizes):
        raise WireError("bad blob sizes")
    if 4 + head_len + sum(sizes) != len(view):
        raise WireError("blob sizes do not add up to the frame")
    blobs, at = [], 4 + head_len
    for size in sizes:
        blobs.append(view[at:at + size])
        at += size
    return header, blobs


def _count(value, limit: int = MAX_FRAME) -> bool:
    return type(value) is int and 0 <= value <= limit


# -- tensors ----------------------------------------------------------------------------------------

def meta(desc) -> tuple[str, tuple[int, ...], int]:
    """(dtype, shape, numel) of a tensor descriptor, checked."""
    if not isinstance(desc, dict):
        raise WireError("tensor descriptor is not an object")
    dtype, shape = desc.get("dtype"), desc.get("shape")
    if dtype not in DTYPES:
        raise WireError(f"unknown dtype {str(dtype)[:40]!r}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_count(n, 1 << 40) for n in shape):
        raise WireError("bad shape")
    numel = math.prod(shape)
    if numel * DTYPES[dtype][0] > MAX_FRAME:
        raise WireError("tensor too large")
    return dtype, tuple(shape), numel


def tensor(desc, blobs: list) -> np.ndarray | None:
    """The values of a descriptor's blob as a flat array in its own dtype (bfloat16 as float32, exactly),
    None when it carries no blob; raises WireError when the blob does not fit the descriptor."""
    dtype, _, numel = meta(desc)
    index = desc.get("blob")
    if index is None:
        return None
    if not _count(index, len(blobs) - 1):
        raise WireError("bad blob index")
    raw = blobs[index]
    size, fmt = DTYPES[dtype]
    if len(raw) != numel * size:
        raise WireError(f"{len(raw)} bytes for {numel} elements of {dtype}")
    if fmt == "bf16":
        return from_bf16(np.frombuffer(raw, dtype="<u2"))
    values = np.frombuffer(raw, dtype="u1" if fmt is None else fmt)
    # in place where it can: a frame's buffer is the frame's alone (FrameReader makes one per frame), and
    # nothing writes what a rank sent; else (immutable bytes, or an address the dtype cannot load from) a copy
    if not (values.flags.aligned and values.flags.writeable):
        return values.copy()
    values.setflags(write=False)   # what a rank sent is evidence: nothing may write it (its copies are new arrays)
    return values


def to_bytes(array: np.ndarray, dtype: str) -> bytes:
    """An array's values in the wire format of `dtype` (rounding to nearest even for bfloat16)."""
    fmt = DTYPES[dtype][1]
    if fmt is None:
        return np.ascontiguousarray(array, dtype="u1").tobytes()
    if fmt == "bf16":
        return to_bf16(np.asarray(array, dtype=np.float32)).tobytes()
    if fmt == "?" and np.asarray(array).dtype != np.bool_:   # a bool SUM's bytes hold counts, as gloo leaves them
        return np.ascontiguousarray(array, dtype="u1").tobytes()
    return np.ascontiguousarray(array, dtype=fmt).tobytes()


def buffer(array: np.ndarray, dtype: str):
    """What `to_bytes` gives, without a copy where the array already holds those bytes (a delivered array is
    never written once made: it is the record's too)."""
    fmt = DTYPES[dtype][1]
    if fmt not in (None, "bf16", "?"):
        array = np.asarray(array)
        if array.dtype == np.dtype(fmt) and array.flags.c_contiguous:
            return array.reshape(-1)
    return to_bytes(array, dtype)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even as torch does (NaN stays NaN)."""
    raw = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (raw + np.uint32(0x7FFF) + ((raw >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(values)
    return np.where(nan, (raw >> 16) | np.uint32(0x40), rounded).astype("<u2")


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values as `dtype` would hold them, back in the array type `tensor` gives for that dtype."""
    fmt = DTYPES[dtype][1]
    with np.errstate(over="ignore", invalid="ignore"):   # past the dtype's range: inf, as torch gives, unwarned
        if fmt == "bf16":
            return from_bf16(to_bf16(values.astype(np.float32)))
        return values.astype(fmt)


def as_float64(values: np.ndarray | None) -> np.ndarray | None:
    """Values for verification: float64 (complex: the real part; bytes-only dtypes: none)."""
    if values is None:
        return None
    if np.iscomplexobj(values):
        values = values.real
    return values.astype(np.float64)


def element_size(dtype) -> int:
    return DTYPES.get(dtype, (4, None))[0]


def value(desc, blobs: list) -> dict:
    """A value a rank reported (its answer, or a local of its entry function), checked and decoded:
    {"kind": "tensor" | "sequence" | "other" | "missing", "plain", "type", "dtype", "shape", "len",
    "omitted", "array"} with the values as float64 (None when the rank sent none or they do not fit)."""
    if not isinstance(desc, dict):
        return {"kind": "missing"}
    kind = desc.get("kind") if desc.get("kind") in ("tensor", "sequence", "other") else "other"
    out = {"kind": kind, "plain": desc.get("plain") is True, "type": str(desc.get("type", ""))[:80],
           "omitted": desc.get("omitted") if isinstance(desc.get("omitted"), str) else None}
    if kind == "sequence" and _count(desc.get("len"), 1 << 40):
        out["len"] = desc["len"]
    if kind != "tensor":
        return out
    try:
        dtype, shape, _ = meta(desc)
    except WireError:
        shape = desc.get("shape")
        if desc.get("dtype") in DTYPES and desc.get("blob") is None and isinstance(shape, list) and \
                len(shape) <= MAX_DIMS and all(type(s) is int and 0 <= s < 1 << 62 for s in shape):
            # a tensor too large to carry (a stride-0 view of 2^40 elements): still a tensor, of its shape
            return {**out, "dtype": desc["dtype"], "shape": shape, "array": None, "omitted": "size"}
        return {**out, "kind": "other", "omitted": "layout"}
    out.update(dtype=dtype, shape=list(shape), array=None)
    if desc.get("blob") is not None:
        try:
            out["array"] = as_float64(tensor(desc, blobs))
        except WireError:
            out["omitted"] = "unreadable"
    return out
