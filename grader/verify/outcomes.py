"""How each rank ended, as an outcome: the one place a run's stop and a rank's end become a verdict (an
exception, a time limit, a deadlock, a crash ...), with the note that says so and where the rank was."""
from __future__ import annotations

import signal

from ..feedback.messages import render
from ..model import Note, Outcome, Words
from ..records import RankRecord, RunOutcome, Stop
from ..switch.ops import MISMATCH_WORDS
from .diagnose import at, failed_call, op_name


def rank_failure(run: RunOutcome, record: RankRecord) -> tuple[Outcome, Note] | None:
    """The reason this rank did not finish the entry function normally, or None if it did."""
    r = record.rank
    result = record.result
    if result is not None:
        how = result.how
        error = result.error or {}
        if how == "load_error":
            return Outcome.LOAD_ERROR, Note("fail.load_error", {"rank": r, **error_params(error)})
        if how == "exit":
            return Outcome.EARLY_EXIT, Note("fail.sys_exit", {"rank": r, "code": error.get("message", "")})
        if how == "raise":
            kind = error.get("type", "")
            message = error.get("message", "")
            failed = failed_call(record)
            if failed is not None and "timed out" in (failed.error or "").lower():
                return Outcome.TIMEOUT, Note("fail.timeout_inside", {"rank": r, "op": op_name(failed), "n": failed.seq + 1})
            if kind == "NotImplementedError":
                return Outcome.TODO, Note("fail.todo", {"rank": r})
            if kind == "MemoryError" or "can't allocate memory" in message or "Cannot allocate memory" in message:
                return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
            if kind == "BlockingIOError" or "Resource temporarily unavailable" in message:
                return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
            facts = failed.problem if failed is not None else None
            if facts and facts.get("kind") == "mismatch" and MISMATCH_WORDS in message:
                # the switch's own error, raised in the student's call: worded in the report's language, with
                # what differs between the ranks and each rank's call
                return Outcome.EXCEPTION, Note("fail.mismatch_raised", {
                    "rank": r, "type": kind, "op": op_name(failed), "calls": facts["calls"],
                    "differs": Words(*(render(f"mismatch.{facts['differs']}", {}, lang) for lang in ("zh", "en"))),
                    "frames": error_params(error)["frames"]})
            if facts and facts.get("kind") in ("group_name", "peer_outside", "unlike") and failed.error and failed.error[:80] in message:
                # the switch's own words (gloo hangs or pairs garbage there): in the report's language
                return Outcome.EXCEPTION, Note(f"fail.{facts['kind']}_raised", {
                    "rank": r, "type": kind, "op": op_name(failed), **{k: v for k, v in facts.items() if k != "kind"},
                    "frames": error_params(error)["frames"]})
            return Outcome.EXCEPTION, Note("fail.exception", {"rank": r, **error_params(error)})
        return None
    if record.out_of_memory:   # the rank's memory limit left the grader's code inside it no room
        return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
    if run.stop == Stop.OUTPUT_LIMIT and run.stop_rank == r:
        return Outcome.OUTPUT_LIMIT, Note("fail.output", {"rank": r})
    if run.stop == Stop.TRAFFIC_LIMIT and run.stop_rank == r:
        return Outcome.TRAFFIC_LIMIT, Note("fail.unread" if record.unread else "fail.traffic", {"rank": r})
    if run.stop == Stop.PROTOCOL and run.stop_rank == r:
        if record.broken is not None:
            return Outcome.PROTOCOL, Note("fail.broken", {"rank": r, "error": record.broken})
        return Outcome.PROTOCOL, Note("fail.protocol", {"rank": r})
    exit_info = record.exit or {}
    sig = exit_info.get("signal")
    if sig == signal.SIGKILL and run.oom_killed:
        return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
    if sig is not None and not (sig == signal.SIGKILL and run.stop != Stop.COMPLETED):
        if sig == signal.SIGXCPU:
            return Outcome.CPU_LIMIT, Note("fail.cpu", {"rank": r})
        if sig == signal.SIGXFSZ:
            return Outcome.FILE_LIMIT, Note("fail.file_size", {"rank": r})
        text = record.output_text()
        if sig in (signal.SIGABRT, signal.SIGSEGV) and ("bad_alloc" in text or "allocate" in text):
            return Outcome.MEMORY_LIMIT, Note("fail.memory", {"rank": r})
        return Outcome.CRASH, Note("fail.signal", {"rank": r, "signal": sig, "name": _signal_name(sig)})
    if "code" in exit_info:
        return Outcome.EARLY_EXIT, Note("fail.os_exit", {"rank": r, "code": exit_info["code"]})
    if run.stop == Stop.PROCESS_LIMIT or (run.stop == Stop.TIMEOUT and run.process_limit_hit):
        return Outcome.PROCESS_LIMIT, Note("fail.processes", {"rank": r})
    if run.stop == Stop.TIMEOUT:
        return Outcome.TIMEOUT, _where(record, "fail.timeout")
    if run.stop == Stop.DEADLOCK:
        return Outcome.DEADLOCK, _where(record, "fail.deadlock")
    if run.stop in (Stop.FAILFAST, Stop.OUTPUT_LIMIT, Stop.TRAFFIC_LIMIT, Stop.PROTOCOL):
        return Outcome.EXCEPTION, Note("fail.stopped", {"rank": r, "other": run.stop_rank})
    return Outcome.GRADER_ERROR, Note("fail.grader", {"rank": r})


def last_call(record: RankRecord, failure: Note) -> list[Note]:
    """Where a rank was in its operations when it failed (timeouts and deadlocks say it already)."""
    if failure.key.startswith(("fail.timeout", "fail.deadlock", "fail.stopped", "fail.grader")):
        return []
    if not record.calls:
        return [Note("detail.no_collective", {"rank": record.rank})]
    last = record.calls[-1]
    return [Note("detail.last_collective", {"rank": record.rank, "op": op_name(last), "n": last.seq + 1,
                                            **at(last)})]


def _where(record: RankRecord, key: str) -> Note:
    inside = record.inside
    if inside is not None:
        return Note(key + "_inside", {"rank": record.rank, "op": op_name(inside), "n": inside.seq + 1,
                                      **at(inside)})
    last = record.last_started
    if last:   # a real-backend run: no switch saw where the rank waits, only the last call it started
        return Note(key + "_real", {"rank": record.rank, "op": last.get("api") or last.get("op") or "?",
                                    "line": last.get("line") or "?"})
    if key == "fail.timeout" and record.calls:   # between operations: how far it got (a loop of thousands, say)
        done = record.calls[-1]
        return Note("fail.timeout_after", {"rank": record.rank, "count": len(record.calls), "op": op_name(done),
                                           **at(done)})
    return Note(key + "_outside", {"rank": record.rank})


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def error_params(error: dict) -> dict:
    """An exception as the report shows it: its type, message and the student's frames (structured: the
    catalog words the frame, so a Chinese report is Chinese throughout)."""
    frames = [f for f in error.get("frames") or [] if isinstance(f, dict)][-3:]
    return {"type": error.get("type", "?"), "message": (error.get("message") or "")[:300],
            "frames": [{"line": f.get("line"), "function": f.get("function"), "text": f.get("text", "")} for f in frames]}
