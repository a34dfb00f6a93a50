"""grader/twocores.py: large numpy work on the caller's thread and one helper at once; and the switch's large
operations through it give what one thread gives, bit for bit."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from grader import twocores
from grader.switch import arith, perturb
from switchsim import Sim


def test_results_come_back_in_order_and_small_work_stays_on_the_callers_thread():
    tasks = [lambda i=i: (i, threading.get_ident()) for i in range(5)]
    small = twocores.run_all(tasks, twocores.LEAST - 1)
    assert [i for i, _ in small] == list(range(5))
    assert {ident for _, ident in small} == {threading.get_ident()}
    assert [i for i, _ in twocores.run_all(tasks, twocores.LEAST)] == list(range(5))


def _both_at_once() -> bool:
    """Two tasks, each waiting for the other to have started: only two threads at once end them with True."""
    started = [threading.Event(), threading.Event()]

    def task(i):
        started[i].set()
        return started[1 - i].wait(timeout=20)

    return twocores.run_all([lambda: task(0), lambda: task(1)], twocores.LEAST) == [True, True]


@pytest.mark.timeout(60)
def test_two_tasks_run_at_once():
    assert _both_at_once()


def test_an_exception_is_raised_once_every_task_has_ended():
    ended = []

    def fails():
        raise ValueError("task 0")

    def slow():
        ended.append(sum(range(100_000)))
        return 1

    with pytest.raises(ValueError, match="task 0"):
        twocores.run_all([fails, slow, slow], twocores.LEAST)
    assert len(ended) == 2


@pytest.mark.timeout(60)
def test_a_forked_child_starts_its_own_helper():
    twocores.run_all([lambda: 1, lambda: 2], twocores.LEAST)   # the parent's helper is started
    pid = os.fork()
    if pid == 0:   # the child: the parent's helper thread is not here
        ok = False
        try:
            ok = _both_at_once()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_large_sum_on_two_cores_has_the_bits_of_one_thread(monkeypatch, ranks):
    """Chunk by chunk along gloo's ring (floats, 3 ranks or more), in halves otherwise: the same additions."""
    rng = np.random.default_rng(ranks)
    n = (1 << 19) + 37
    floats = [(rng.standard_normal(n) * np.exp(3 * rng.standard_normal(n))).astype(np.float32) for _ in range(ranks)]
    ints = [rng.integers(-1 << 40, 1 << 40, n) for _ in range(ranks)]
    both = [arith.reduce_arrays(a, "SUM", d, ranks) for a, d in ((floats, "torch.float32"), (ints, "torch.int64"))]
    monkeypatch.setattr(twocores, "LEAST", 1 << 62)   # one thread
    one = [arith.reduce_arrays(a, "SUM", d, ranks) for a, d in ((floats, "torch.float32"), (ints, "torch.int64"))]
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(both, one))


def test_a_large_perturbed_all_reduce_draws_each_ranks_deltas_from_a_generator_of_its_own():
    """Two ranks' 4 MiB perturbed at once: every element carries a delta of its dtype's steps, the two ranks'
    deltas are not the same draw, and what was delivered is the sum of what entered."""
    n = 1 << 20
    sim = Sim(2, perturb=("all_reduce",))
    x = np.linspace(-3, 3, n, dtype=np.float32)
    out = sim.all_reduce([x, x])
    calls = [sim.switch.calls[r][0] for r in range(2)]
    c = [(call.perturbed[0] - x) / (1 + np.abs(x)) for call in calls]
    assert all(((ci > 0) & (ci <= perturb.reach("torch.float32") * 1.001)).all() for ci in c)
    assert np.mean(np.isclose(c[0], c[1], rtol=1e-3)) < 0.05
    assert np.array_equal(out[0], (calls[0].perturbed[0] + calls[1].perturbed[0]).astype(np.float64))
