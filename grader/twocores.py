"""Large numpy work on two cores: the supervisor's one helper thread.

While the switch computes an operation, the ranks of its run wait for it: on a machine of two cores, one
core would sit idle. A perturbed all_reduce of 1M float32 at 2 ranks perturbs each rank's 4 MiB (about
1.4 ms each) and copies the sum into each rank's shared memory (about 0.4 ms each), one after the other.
`run_all` runs such independent pieces of work on the calling thread and on one helper thread at once
(numpy releases the GIL in its loops over large arrays: two perturbations of 4 MiB take 1.2 ms together
where they took 2.1 ms one after the other, docs/bench.md).

    results = twocores.run_all([fn, fn, ...], nbytes)   # each fn's result, in order

A piece of work is a function of no argument; pieces share nothing they write. Below LEAST bytes of work,
the pieces run one after the other on the calling thread: a thread's wake-up costs more than small work
saves. Both threads take the next piece nobody took, so the caller never waits on a helper that is busy
(with another caller's pieces: `run_all` may be called from several threads); it waits only for a piece the
helper has begun. An exception of a piece is raised by `run_all` once every piece has ended.

A process forked from one that started the helper has no helper (fork copies one thread): the child starts
its own when it first needs one.
"""
from __future__ import annotations

import os
import queue
import threading

LEAST = 1 << 20   # bytes of work worth a second thread


class _Batch:
    """The pieces of one `run_all`, taken in turn by whichever thread asks next."""

    def __init__(self, fns: list):
        self.fns = fns
        self.results: list = [None] * len(fns)
        self.errors: list = [None] * len(fns)
        self.next = 0
        self.ended = 0
        self.lock = threading.Lock()
        self.all_ended = threading.Event()

    def work(self) -> None:
        while True:
            with self.lock:
                i = self.next
                if i >= len(self.fns):
                    return
                self.next += 1
            try:
                self.results[i] = self.fns[i]()
            except BaseException as err:  # noqa: BLE001  (raised by run_all, on the caller's thread)
                self.errors[i] = err
            with self.lock:
                self.ended += 1
                if self.ended == len(self.fns):
                    self.all_ended.set()


_HELPER: list = []            # [its queue of batches], once started in this process
_HELPER_LOCK = threading.Lock()


def _helper() -> queue.SimpleQueue:
    with _HELPER_LOCK:
        if not _HELPER:
            batches: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(batches,), name="grader-twocores", daemon=True).start()
            _HELPER.append(batches)
        return _HELPER[0]


def _serve(batches: queue.SimpleQueue) -> None:
    while True:
        batches.get().work()


def _forget_helper() -> None:
    """In a forked child: the parent's helper thread is not here (nor may its locks be free)."""
    global _HELPER_LOCK
    _HELPER.clear()
    _HELPER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_helper)


def run_all(fns: list, nbytes: int) -> list:
    """Each function's result, in order: on this thread and the helper at once when there are several and
    `nbytes` (the work's size) reaches LEAST, else one after the other here."""
    if len(fns) < 2 or nbytes < LEAST:
        return [fn() for fn in fns]
    batch = _Batch(list(fns))
    _helper().put(batch)
    batch.work()
    batch.all_ended.wait()
    for err in batch.errors:
        if err is not None:
            raise err
    return batch.results
