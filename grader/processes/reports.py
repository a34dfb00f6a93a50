"""What a rank reports besides its operations, checked before it enters the rank's record.

A rank's frames are the student's process speaking: every field is checked for its type and cut to a size,
and what one rank may send in all is bounded (MAX_REPORTS). A rank that breaks the protocol is stopped
(ProtocolError); what it said before stays in its record. The operations themselves go to the run's switch.
"""
from __future__ import annotations

from .. import wire
from ..records import How, RankResult, Stop
from ..switch import MAX_OPS, ProtocolError
from .inflight import InFlight

MAX_REPORTS = 128 << 20  # what one rank may send besides its operations: answers (values.BUDGET_BYTES), snapshots
#                          (values.SNAPSHOT_BYTES) and the frames around them (MAX_OPS snapshots at most)
MAX_SNAPSHOT_NAMES = 512  # locals a rank's snapshot keeps (the entry function's, as it enters an operation)
MAX_CHECKS = 16           # failed checks of the student's own a rank's record keeps, with their values


def take(run: InFlight, r: int, header: dict, blobs: list) -> None:
    """A frame of rank `r` other than an operation, checked and taken into its record; ProtocolError: the rank
    broke the protocol (or the grader's code inside it), and is stopped."""
    record = run.outcome.ranks[r]
    kind = header.get("t")
    record.report_bytes += sum(len(b) for b in blobs) + 256
    if record.report_bytes > MAX_REPORTS:
        raise ProtocolError("too much reported")
    if kind == "snap":
        if isinstance(header.get("locals"), dict):
            taken = list(header["locals"].items())[:256]
            # a name costs its text and a descriptor, and the snapshot keeps MAX_SNAPSHOT_NAMES of them
            record.report_bytes += sum(len(str(k)) + 64 for k, _ in taken)
            if record.report_bytes > MAX_REPORTS:
                raise ProtocolError("too much reported")
            for k, v in taken:
                name = str(k)[:100]
                if name in record.snapshot or len(record.snapshot) < MAX_SNAPSHOT_NAMES:
                    record.snapshot[name] = wire.value(v, blobs)
    elif kind == "check":
        if len(record.checks) >= MAX_CHECKS or not isinstance(header.get("locals"), dict):
            record.checks_dropped += 1
        else:
            names = list(run.request.quantities)
            found = header["locals"]
            line = header.get("line")
            record.checks.append({"line": line if type(line) is int and 0 < line < 1 << 31 else None,
                                  "values": {n: wire.value(found[n], blobs) for n in names if n in found}})
    elif kind == "ready":
        record.ready = True
        if header.get("ring") is True and r in run.rings:   # it mapped its shared memory (ring.py)
            run.rings[r].ready = True
    elif kind == "memory":   # the rank ends now (channel.Channel.out_of_memory)
        record.out_of_memory = True
        run.fail_soon()
    elif kind == "note":
        if len(record.notes) < 64:
            record.notes.append(str(header.get("what"))[:2000])
    elif kind == "timing_start" and run.request.real:
        record.last_started = {k: header[k] if type(header[k]) is int else header[k][:80]
                               for k in ("op", "line", "api") if type(header.get(k)) in (int, str)}
    elif kind == "timing" and run.request.real and len(record.timings) < MAX_OPS:
        record.timings.append({k: header.get(k) for k in ("op", "method", "line", "api", "ms", "bytes")
                               if isinstance(header.get(k), (int, float, str))})
    elif kind == "result" and record.result is None:
        found = header.get("values") if isinstance(header.get("values"), dict) else {}
        names = list(run.request.quantities)
        how = header.get("how")
        source = header.get("source")
        record.result = RankResult(how=How(how) if how in tuple(How) else How.RAISE,
                                   error=error_record(header.get("error")),
                                   values={n: wire.value(found.get(n), blobs) if n in found else None for n in names},
                                   source=source if source in ("return", "locals") else "return",
                                   returned_type=str(header.get("returned_type", "?"))[:80])
        if run.switch is not None:
            run.switch.finish(r)
        if not record.result.returned:
            run.fail_soon()
    elif kind == "setup_error" and not record.ready:
        # before "ready" no student code has run: the grader's own failure to set the rank up
        record.setup_error = str(header.get("error"))[:2000]
        run.outcome.error = f"rank {r}: {record.setup_error}"
        run.set_stop(Stop.GRADER_ERROR, r)
    elif kind == "setup_error":
        # after it, the student's code has broken the grader's code inside its rank (patched modules ...)
        record.broken = one_line(header.get("error"))
        raise ProtocolError("the grader's code inside the rank was broken")
    elif kind == "end":
        if record.result is None:
            raise ProtocolError("an end before any result")
        record.done = True
        if run.switch is not None:
            run.switch.finish(r)
    elif kind != "result":
        raise ProtocolError(f"unexpected frame {str(kind)[:40]!r}")


def status(run: InFlight, msg: dict) -> bool:
    """What the run's pid 1 says: how each rank ended, or that the sandbox could not be built. True: the switch
    has more to deliver (a rank it waited for has ended)."""
    kind = msg.get("t")
    if kind == "exit" and isinstance(msg.get("rank"), int) and 0 <= msg["rank"] < len(run.outcome.ranks):
        record = run.outcome.ranks[msg["rank"]]
        record.exit = {k: msg[k] for k in ("code", "signal") if k in msg}
        if record.result is None:
            run.fail_soon()
        if run.switch is not None:
            run.switch.finish(record.rank)
            return True
    elif kind == "leader_error":
        run.outcome.error = f"sandbox could not be set up: {msg.get('error')}"
        run.set_stop(Stop.GRADER_ERROR)
    return False


def one_line(text) -> str:
    """A rank's words shown as data: one line, printable, short."""
    return "".join(c if c.isprintable() else " " for c in str(text))[:300]


def error_record(error) -> dict | None:
    """An exception as the rank described it: its type, message and the student's frames, checked."""
    if not isinstance(error, dict):
        return None
    frames = []
    for frame in (error.get("frames") or [])[:8] if isinstance(error.get("frames"), list) else []:
        if isinstance(frame, dict):
            frames.append({"line": frame.get("line") if type(frame.get("line")) is int else None,
                           "function": str(frame.get("function", ""))[:100], "text": str(frame.get("text", ""))[:200],
                           **({"file": str(frame["file"])[:100]} if isinstance(frame.get("file"), str) else {})})
    return {"type": str(error.get("type", "?"))[:100], "message": str(error.get("message", ""))[:2000], "frames": frames}
