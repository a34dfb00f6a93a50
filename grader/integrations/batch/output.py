"""What a batch prints: the progress line while it grades, the class's summary when it is done. Names are
printed with their control characters escaped (gradebook.printable) and fitted to the terminal's columns.

The progress line is not tqdm's: tqdm draws the bar on a terminal, but off one (a batch under nohup, in CI,
its stderr in a log) it writes the same carriage-return frames into the file, or nothing at all (disable=None),
where a log wants a plain line at most every 10% or 10 s. That half is the one tests and logs see; the bar
is the dozen lines left, not worth a dependency of the grading machine.
"""
from __future__ import annotations

import statistics
import sys
import time

from ...feedback.messages import render
from ..gradebook import fit, number, printable, sorted_rows, verdict, width

NAME_COLUMNS = 32      # the widest student name the terminal summary shows whole


def summary(rows: list[tuple[str, dict]], lang: str, exercise) -> str:
    total = exercise.total
    totals = [float(d.get("score", 0)) for _, d in rows]
    verdicts: dict[str, int] = {}
    for _, d in rows:
        verdicts[verdict(d, exercise)] = verdicts.get(verdict(d, exercise), 0) + 1
    names = [printable(name) for name, _ in sorted_rows(rows)]
    column = min(NAME_COLUMNS, max([width(n) for n in names] + [len("student")]))   # display columns (CJK: 2 each)
    lines = [f"{fit('student', column)} {'total':>6}  verdict"]
    lines += [f"{fit(shown, column)} {number(d.get('score', 0)):>6}  {verdict(d, exercise)}"
              for shown, (_, d) in zip(names, sorted_rows(rows))]
    lines.append("")
    lines.append(render("batch.verdicts", {}, lang) + "  " + ", ".join(f"{v}: {n}" for v, n in sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0]))))
    if totals:
        lines.append(render("batch.mean_median", {"count": len(totals), "mean": statistics.fmean(totals),
                                                  "median": statistics.median(totals), "max": total}, lang))
        lines.append(render("batch.histogram", {}, lang))
        bins = [0] * 11
        for t in totals:
            bins[min(int(t * 10 // total), 10)] += 1
        scale = max(1.0, max(bins) / 40)
        for i, n in enumerate(bins):
            low = total * i / 10
            label = f"{low:g}" if i == 10 else f"{low:g}-{low + total / 10 - 1:g}"
            lines.append(f"  {label:>7} | {'#' * round(n / scale):<40} {n}")
    return "\n".join(lines) + "\n"


class Progress:
    """A bar with an ETA on a terminal; otherwise a line at most every 10% or 10 s."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = self.last_line = time.monotonic()
        self.last_pct = -1
        self.current = ""

    def eta(self) -> str:
        if not self.done:
            return "--:--"
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        return f"{int(left // 60):02d}:{int(left % 60):02d}"

    def advance(self, name: str) -> None:
        self.done += 1
        self.current = name
        self.tick(force=not self.tty)

    def tick(self, force: bool = False) -> None:
        if not self.total:
            return
        pct = 100 * self.done // self.total
        if self.tty:
            width = 30
            bar = "#" * (width * self.done // self.total)
            self.stream.write(f"\r[{bar:<{width}}] {self.done}/{self.total} {pct:3d}%  ETA {self.eta()}  {fit(self.current, 20)}")
            if self.done == self.total:
                self.stream.write("\n")
        elif force and (self.done == self.total or pct >= self.last_pct + 10 or time.monotonic() - self.last_line > 10):
            self.stream.write(f"graded {self.done}/{self.total} ({pct}%), ETA {self.eta()}\n")
            self.last_pct, self.last_line = pct, time.monotonic()
        self.stream.flush()
