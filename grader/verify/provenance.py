"""Provenance: prove that a value came from what the communication delivered, made of every rank's own data.

In a perturbed run every tensor a rank sends carries secret deltas (switch/perturb.py), so delivered data
cannot be predicted by any rank. A final value F on rank r is proven when it can be decomposed, element
by element, into:
  - delivered data: F[i] = s * D[j] for an element j that an operation delivered to r (each delivered
    element used at most once, any number of calls, chunks, buckets at any offset, views); D[j] is in
    turn made of the elements the ranks sent (observe.RunView.sources), and each of those is explained
    the same way on its sender: as that rank's own data (`Quantity.local`, possibly scaled), as data it
    received earlier, or as its own data plus data it received (a ring's reduce-scatter step; or plus what
    two peers sent it, at any offsets: a leader that adds its node's data and its ring neighbour's chunk);
  - and the resulting weight of every rank's own data in F[i] is exactly what the exercise says
    (`combine`: 1/N of each rank's data for a mean, one rank's data for a concatenation ...).
A state a rank computes from what it received (`combine="own"`, an optimizer's momentum shard) is proven
when it equals the rank's own data, `local(rank, ws, ctx)`, computed from what was delivered to it.
Scales s are 1, N or 1/N, or 1/d for a delivered divisor d whose unperturbed value is N (an all-reduced
count). Numbers computed locally carry no deltas and match nothing; a value fed into a collective by
one rank for all, or laundered through it, has the wrong contributions; a buffer edited after the
operation completed no longer equals what was delivered.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from ..switch import Call
from .budget import tick
from .diagnose import at
from .pool import Pool, pool
from .proof import Finding, Proof, tolerance
from .observe import RunView

MAX_DEPTH = 12
MAX_TIES = 4        # equally long delivered matches tried in turn when the first cannot be explained
# The work one proof may take: decompositions tried (one per sent vector explained: EXPLAINS_PER x N^2 at N
# ranks, plus N per element of the value: a value made of one-element deliveries, a coalesced call of
# thousands of scalars, explains each element's senders apart) and elements compared (ELEMENTS_BASE +
# ELEMENTS_PER x the value's size). An honest ring of 5 ranks takes 31 decompositions and 25 comparisons per
# element of its value (the tests' fixtures; a ring's hops grow as N^2); data built so that every match ties
# (d01_backtracking_bomb) would take exponentially many: past the budget the value is not proven
# ("too_complex"), in bounded time.
EXPLAINS_PER = 16
ELEMENTS_BASE, ELEMENTS_PER = 20_000_000, 200
# Elements matched in a short run (under SHORT) from a value that recurs in what was delivered (RECURS times or
# more) are no evidence: constant data gives perturbed sums on a grid of 1/256 (float16: 5 steps, within 2%),
# and a rank can name likely ones without reading any (a pool of its own data all-reduced, likely sums
# returned: chance runs of a few). Honest values are runs (a chunk, a shard); a strided one draws on as much
# as it holds, where a value seldom recurs that often. Past AMBIGUOUS_MIN such elements and AMBIGUOUS_SHARE of
# the value: not proven ("ambiguous").
SHORT, RECURS, AMBIGUOUS_MIN, AMBIGUOUS_SHARE = 16, 8, 8, 0.1


class _TooComplex(Exception):
    pass


class Tracer:
    def __init__(self, view: RunView, quantity, dtype: str = "torch.float32", limit: int | None = None):
        self.view, self.quantity, self.ws = view, quantity, view.ws
        self.limit = limit    # search only deliveries of at most this many elements (None: all of them)
        self.options = [quantity.local_options(q, self.ws) for q in range(self.ws)]
        self.locals = [options[0] for options in self.options]
        self.atol, self.rtol = tolerance(dtype)
        self.through = set(quantity.through)
        self._usable_cache: dict = {}
        self.used: dict = {}             # (rank, seq, output) -> bool mask of delivered elements used (this frame)
        self.calls: list[Call] = []
        self.explains, self.elements, self.budget = 0, 0, ELEMENTS_BASE
        self.max_explains = EXPLAINS_PER * self.ws * self.ws

    # -- the target: which ranks' data make element i, at which local index, with what weight
    def target(self, n: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """(weights [ws, n], local index [ws, n] (-1: no part)) that the exercise expects for F[0:n] on `rank`."""
        ws, combine = self.ws, self.quantity.combine
        weights = np.zeros((ws, n))
        index = np.full((ws, n), -1)
        i = np.arange(n)
        if combine in ("mean", "sum"):
            weights[:] = 1.0 / ws if combine == "mean" else 1.0
            index[:] = i
        elif combine == "concat":
            sizes = [len(a) for a in self.locals]
            starts = np.cumsum([0] + sizes)
            for q in range(ws):
                inside = (i >= starts[q]) & (i < starts[q + 1])
                weights[q, inside] = 1.0
                index[q, inside] = i[inside] - starts[q]
        else:  # root, own
            owner = rank if combine == "own" else self.quantity.root
            weights[owner] = 1.0
            index[owner] = i
        return weights, index

    def prove(self, rank: int, value: np.ndarray) -> Proof:
        n = value.size
        weights, index = self.target(n, rank)
        self.index = index
        self._alone = (weights == 1.0) & (np.count_nonzero(weights, axis=0) == 1)[None, :]
        self.explains, self.elements, self.ambiguous = 0, 0, 0
        self.budget = ELEMENTS_BASE + ELEMENTS_PER * n
        self.max_explains = EXPLAINS_PER * self.ws * self.ws + self.ws * n
        try:
            result = self._explain(rank, value, np.arange(n), 0, None)
        except _TooComplex:
            return Proof(False, Finding("too_complex", {"rank": rank}), self.calls)
        if isinstance(result, Finding):
            return Proof(False, result, self.calls)
        w, _ = result
        bad = np.abs(w - weights) > 1e-6 * np.maximum(1, np.abs(weights))
        if bad.any():
            q, i = np.argwhere(bad)[0]
            return Proof(False, Finding("weights", {"rank": rank, "element": int(i), "source": int(q),
                                                     "weight": float(w[q, i]), "expected": float(weights[q, i]),
                                                     "missing": [int(s) for s in np.where(w[:, i] == 0)[0]
                                                                 if weights[s, i] != 0],
                                                     "twice": [int(s) for s in np.where(w[:, i] > weights[:, i] * 1.5)[0]
                                                               if weights[s, i] != 0]}), self.calls)
        if self.ambiguous > max(AMBIGUOUS_MIN, AMBIGUOUS_SHARE * n):
            return Proof(False, Finding("ambiguous", {"rank": rank, "count": self.ambiguous}), self.calls)
        return Proof(True, None, self.calls)

    # -- the search
    def _close(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.abs(a - b) <= self.atol + self.rtol * np.abs(b)

    def _pool(self, rank: int) -> Pool:
        """Built once per run and rank (the view keeps it for every proof of the run)."""
        key = ("pool", rank, self.limit)
        if key not in self.view.memo:
            self.view.memo[key] = pool(self.view, rank, self.limit)
        return self.view.memo[key]

    def _usable(self, rank: int, pool: Pool, before: int | None) -> np.ndarray:
        """Which entries of the pool this search may use: the quantity's operations, delivered before
        message `before` of the rank (None: any time)."""
        key = (rank, before)
        if key not in self._usable_cache:
            ok = np.array([self._allowed(call) for call, _, _ in pool.entries], dtype=bool)
            if before is not None and ok.size:
                ok &= pool.done < before
            self._usable_cache[key] = ok
        return self._usable_cache[key]

    def _entries(self, rank: int, pool: Pool, before: int | None) -> list:
        usable = self._usable(rank, pool, before)
        return [e for e, ok in zip(pool.entries, usable) if ok]

    def _allowed(self, call: Call) -> bool:
        if not self.through:
            return True
        if call.op in self.through:
            return True
        return call.op == "recv" and "send" in self.through

    def _lookup(self, pool: Pool, usable: np.ndarray, v: float, follow: float | None = None) -> list[tuple[int, int]]:
        """(entry, position) of the usable delivered values within tolerance of v that this decomposition
        has not used: the first 64 in the order of the calls (the earliest operation, then the lowest
        position, is tried first). Where more match, those whose next element also matches `follow` (the
        value's next element) come first: a warm-up's millions of delivered values hold many chance matches
        of one element, almost never of two in a row."""
        tol = self.atol + self.rtol * abs(v)
        lo = np.searchsorted(pool.order, v - tol, "left")
        hi = np.searchsorted(pool.order, v + tol, "right")
        found = pool.index[lo:hi]
        entry = np.searchsorted(pool.starts, found, "right") - 1
        found = np.sort(found[usable[entry]])
        self._spend(found.size)
        if found.size > 64:   # the first 64 not yet used in this decomposition (used ones cannot match)
            entry = np.searchsorted(pool.starts, found, "right") - 1
            keep = np.ones(found.size, dtype=bool)
            for j in np.unique(entry).tolist():
                call, k, _ = pool.entries[j]
                mask = self.used.get((call.rank, call.seq, k))
                if mask is not None:
                    here = entry == j
                    keep[here] = ~mask[found[here] - pool.starts[j]]
            found, entry = found[keep], entry[keep]
            if follow is not None and found.size > 64 and np.isfinite(follow):
                ends = np.append(pool.starts[1:], pool.flat.size)[entry]
                nxt = np.minimum(found + 1, pool.flat.size - 1)
                pairs = (found + 1 < ends) & (np.abs(pool.flat[nxt] - follow) <= self.atol + self.rtol * abs(follow))
                found = np.concatenate([found[pairs], found[~pairs]])
            found = found[:64]
        entry = np.searchsorted(pool.starts, found, "right") - 1
        return list(zip(entry.tolist(), (found - pool.starts[entry]).tolist()))

    def _recurs(self, pool: Pool, usable: np.ndarray, v: float) -> bool:
        """Whether RECURS or more values this search may use (used or not) are within tolerance of v."""
        tol = self.atol + self.rtol * abs(v)
        lo, hi = np.searchsorted(pool.order, v - tol, "left"), np.searchsorted(pool.order, v + tol, "right")
        return hi - lo >= RECURS and np.count_nonzero(usable[np.searchsorted(pool.starts, pool.index[lo:hi], "right") - 1]) >= RECURS

    def _scales(self, rank: int, before: int | None, top: bool) -> list[tuple[float, float]]:
        """(scale applied to delivered values, the scale it stands for) pairs to try."""
        n = float(self.ws)
        scales = [(1.0, 1.0), (1.0 / n, 1.0 / n), (n, n)]
        if top:
            for d, clean in self.view.divisors(rank, self.limit):
                scales.append((1.0 / d, 1.0 / clean))
        return scales

    def _spend(self, elements: int) -> None:
        tick()
        self.elements += elements
        if self.elements > self.budget:
            raise _TooComplex

    def _run_length(self, x: np.ndarray, start: int, s: float, data: np.ndarray, p: int, used: np.ndarray) -> int:
        """How far x[start:] equals s * data[p:] on unused elements: compared in growing windows, so that a
        candidate that fails early costs little."""
        m = min(x.size - start, data.size - p)
        done, window = 0, 64
        while done < m:
            end = min(m, done + window)
            self._spend(end - done)
            ok = self._close(x[start + done:start + end], s * data[p + done:p + end]) & ~used[p + done:p + end]
            bad = np.flatnonzero(~ok)
            if bad.size:
                return done + int(bad[0])
            done, window = end, window * 4
        return m

    def _leaf_run(self, rank: int, x: np.ndarray, I: np.ndarray, start: int, c: float) -> int:
        """How far x[start:] is this rank's own data times c (the longest of its alternatives)."""
        idx = self.index[rank, I[start:]]
        longest = 0
        for local in self.options[rank]:
            self._spend(idx.size)
            valid = (idx >= 0) & (idx < local.size)
            ok = valid.copy()
            ok[valid] = self._close(x[start:][valid], c * local[idx[valid]])
            bad = np.flatnonzero(~ok)
            longest = max(longest, int(bad[0]) if bad.size else ok.size)
        return longest

    def _explain(self, rank: int, x: np.ndarray, I: np.ndarray, depth: int, before: int | None):
        """Weights [ws, len(x)] of every rank's own data in x (values on `rank`, elements I of the final
        quantity), or a Finding."""
        if depth > MAX_DEPTH:
            return Finding("too_deep", {"rank": rank})
        self.explains += 1
        tick()
        if self.explains > self.max_explains:
            raise _TooComplex
        W = np.zeros((self.ws, x.size))
        pool = self._pool(rank)
        usable = self._usable(rank, pool, before)
        t = 0
        while t < x.size:
            best = None   # (length, kind, payload)
            # (a) the rank's own data, possibly scaled (divided by N before a sum, say); in the final value
            # only where the exercise wants this rank's data alone (the root of a broadcast)
            top = self._alone[rank, I[t]] and self.quantity.combine != "own"
            if depth > 0 or top:
                for c in (1.0, 1.0 / self.ws, float(self.ws)) if depth > 0 else (1.0,):
                    L = self._leaf_run(rank, x, I, t, c)
                    if L and (best is None or L > best[0]):
                        best = (L, "local", c)
                if best is not None and best[0] == x.size - t:
                    W[rank, t:] += best[2]
                    return W, None
            # (b) delivered data, scaled; (c) own data (once, or twice: a mistake worth naming) plus delivered data
            own = np.where(self.index[rank, I] >= 0,
                           self.locals[rank][np.clip(self.index[rank, I], 0, max(0, self.locals[rank].size - 1))], np.nan) \
                if self.locals[rank].size else np.full(x.size, np.nan)
            ties = []     # delivered candidates as long as the best one (data with repeated values match elsewhere too)
            for s, s_eff in self._scales(rank, before, depth == 0):
                for c, kind in ((0.0, "delivered"), (1.0, "accumulate"), (2.0, "accumulate")):
                    shifted = x - c * own if c else x
                    if np.isnan(shifted[t]):
                        continue
                    follow = shifted[t + 1] / s if t + 1 < x.size else None
                    for j, p in self._lookup(pool, usable, shifted[t] / s, follow):
                        L, parts = self._span(pool, usable, j, p, shifted, t, s)
                        if L and (best is None or L > best[0]):
                            best = (L, kind, (parts, s, s_eff, c))
                            ties = [best]
                        elif L and best[1] != "local" and L == best[0] and len(ties) < MAX_TIES:
                            ties.append((L, kind, (parts, s, s_eff, c)))
            if best is None or best[0] < x.size - t:
                summed = self._sum_of_deliveries(rank, x, I, t, self._entries(rank, pool, before))
                beat = max(best[0] if best else 0, summed[0] if summed else 0)
                if beat < x.size - t:
                    two = self._two_deliveries(rank, x, own, t, pool, usable, beat)
                    if two is not None and (summed is None or two[0] > summed[0]):
                        summed = two
                if summed is not None and (best is None or summed[0] > best[0]):
                    L, parts, with_own, offsets = summed
                    self.ambiguous += L if depth == 0 and L < SHORT else 0   # delivered values summed: pairs match easily
                    for (call, k), p in zip(parts, offsets):
                        size = next(d.size for c, kk, d in pool.entries if c is call and kk == k)
                        self.used.setdefault((call.rank, call.seq, k), np.zeros(size, dtype=bool))[p:p + L] = True
                        if call not in self.calls:
                            self.calls.append(call)
                        sub = self._through(call, k, np.arange(p, p + L), I[t:t + L], depth)
                        if isinstance(sub, Finding):
                            return sub
                        W[:, t:t + L] += sub
                    if with_own:
                        W[rank, t:t + L] += 1.0
                    t += L
                    continue
            if best is None:
                return self._unexplained(rank, x, t, depth, before)
            L, kind, payload = best
            if kind == "local":
                W[rank, t:t + L] += payload
                t += L
                continue
            first = None
            for L, kind, payload in ties or [best]:   # the first whose sender's data is explained in turn
                parts, s, s_eff, c = payload
                sub = self._parts_through(parts, I[t:t + L], depth)
                if not isinstance(sub, Finding):
                    break
                first = first or sub
            else:
                return first
            if depth == 0 and L < SHORT and self._recurs(pool, usable, (x[t] - c * own[t]) / s if c else x[t] / s):
                self.ambiguous += L
            if kind == "accumulate":
                W[rank, t:t + L] += c
            W[:, t:t + L] += s_eff * sub
            t += L
        return W, None

    def _span(self, pool: Pool, usable: np.ndarray, j: int, p: int, x: np.ndarray, t: int, s: float):
        """How far x[t:] equals s * what entry j of the pool delivered from its element p on, the run going on
        into the same call's next outputs where it reaches the end of one (a coalesced call's tensors, laid
        end to end as it reduced them: a thousand one-element tensors are one run, not a thousand matches
        that any chance coincidence of one value could misplace): (length, [(call, output, start, length)])."""
        parts, L = [], 0
        while True:
            call, k, data = pool.entries[j]
            used = self.used.setdefault((call.rank, call.seq, k), np.zeros(data.size, dtype=bool))
            n = self._run_length(x, t + L, s, data, p, used)
            if n:
                parts.append((call, k, p, n))
            L += n
            if n < data.size - p or t + L >= x.size or j + 1 >= len(pool.entries) or not usable[j + 1]:
                return L, parts
            after, k_after, _ = pool.entries[j + 1]
            if after is not call or k_after != k + 1:
                return L, parts
            j, p = j + 1, 0

    def _parts_through(self, parts: list, I: np.ndarray, depth: int):
        """The weights of every rank's own data in the delivered runs `parts` (consecutive in the value,
        elements I of the quantity), each marked used; a Finding (nothing left marked) where one cannot be
        explained."""
        subs, done, added, pos = [], [], [], 0
        for call, k, p, n in parts:
            self.used[(call.rank, call.seq, k)][p:p + n] = True
            done.append((call, k, p, n))
            if call not in self.calls:
                self.calls.append(call)
                added.append(call)
            sub = self._through(call, k, np.arange(p, p + n), I[pos:pos + n], depth)
            if isinstance(sub, Finding):
                for c, kk, pp, nn in done:
                    self.used[(c.rank, c.seq, kk)][pp:pp + nn] = False
                for c in added:
                    self.calls.remove(c)
                return sub
            subs.append(sub)
            pos += n
        return np.concatenate(subs, axis=1)

    def _sum_of_deliveries(self, rank: int, x: np.ndarray, I: np.ndarray, t: int, entries: list):
        """x[t:] as [the rank's own data +] the sum of several delivered vectors, each aligned with x
        (a root that adds what every other rank sent it): (length, [(call, output)], own data used, the
        position in each output where x[t] is)."""
        aligned = [(call, k, data) for call, k, data in entries
                   if data.size == x.size and not self.used.get((call.rank, call.seq, k), np.zeros(data.size, bool))[t]]
        if len(aligned) < 2 or len(aligned) > 12:
            return None
        idx = self.index[rank, I[t:]]
        local = self.locals[rank]
        own_values = np.where((idx >= 0) & (idx < local.size), local[np.clip(idx, 0, max(0, local.size - 1))], np.nan)
        best = None
        for size in range(2, min(len(aligned), 2 * self.ws) + 1):
            for combo in combinations(aligned, size):
                self._spend(2 * size * (x.size - t))
                total = np.sum([data[t:] for _, _, data in combo], axis=0)
                for own in (False, True):
                    target = total + (own_values if own else 0)
                    ok = self._close(x[t:], target)
                    bad = np.flatnonzero(~ok)
                    L = int(bad[0]) if bad.size else ok.size
                    if L and (best is None or L > best[0]):
                        best = (L, [(call, k) for call, k, _ in combo], own, [t] * size)
            if best is not None and best[0] == x.size - t:
                break
        return best

    def _two_deliveries(self, rank: int, x: np.ndarray, own: np.ndarray, t: int, pool: Pool, usable: np.ndarray,
                        beat: int = 0):
        """x[t:] as [the rank's own data +] A[a:] + B[b:], two delivered vectors at any offsets: a rank that
        adds what two peers sent it before it sends on (its node's data and its ring neighbour's chunk).
        (length, [(call, output)] x 2, own data used, [a, b]), or None. Each delivered element is tried as
        A[a] once per call, the value x[t] - A[a] (- own) looked up among the delivered: random deltas make
        a chance match of a run of them all but impossible; past the proof's budget, too complex. None at
        once where no usable vector is longer than `beat` (a match cannot be: the chunks of an all-gather
        that single deliveries explain already)."""
        if pool.flat.size == 0 or pool.flat.size > 1 << 16:
            return None
        entry_of, ends = pool.entry_of, pool.ends
        if not usable.any() or int((ends - pool.starts)[usable].max()) <= beat:
            return None
        free = usable[entry_of]
        for j, (call, k, data) in enumerate(pool.entries):
            mask = self.used.get((call.rank, call.seq, k))
            if mask is not None and free[pool.starts[j]:ends[j]].any():
                free[pool.starts[j]:ends[j]] &= ~mask
        candidates = np.flatnonzero(free)
        best = None
        for with_own in (True, False):
            base = x[t] - (own[t] if with_own else 0.0)
            if not np.isfinite(base):
                continue
            self._spend(2 * candidates.size)
            v = base - pool.flat[candidates]
            tol = self.atol + self.rtol * np.abs(v)
            lo = np.searchsorted(pool.order, v - tol, "left")
            hi = np.searchsorted(pool.order, v + tol, "right")
            for i in np.flatnonzero(hi > lo)[:256].tolist():
                a = int(candidates[i])
                for b in pool.index[lo[i]:hi[i]][:8].tolist():
                    if b == a or not free[b]:
                        continue
                    ja, jb = int(entry_of[a]), int(entry_of[b])
                    m = min(x.size - t, ends[ja] - a, ends[jb] - b)
                    if ja == jb:   # one vector as both terms: the two runs must not overlap
                        m = min(m, abs(a - b))
                    self._spend(3 * m)
                    rest = x[t:t + m] - (own[t:t + m] if with_own else 0.0)
                    ok = self._close(rest, pool.flat[a:a + m] + pool.flat[b:b + m]) & free[a:a + m] & free[b:b + m]
                    bad = np.flatnonzero(~ok)
                    L = int(bad[0]) if bad.size else m
                    if L and (best is None or L > best[0]):
                        best = (L, [pool.entries[ja][:2], pool.entries[jb][:2]], with_own,
                                [a - int(pool.starts[ja]), b - int(pool.starts[jb])])
            if best is not None and best[0] == x.size - t:
                break
        return best

    def _through(self, call: Call, k: int, positions: np.ndarray, I: np.ndarray, depth: int):
        """Weights of each rank's own data in delivered elements `positions` of output k of `call`."""
        terms = self.view.sources(call, k, positions)
        if isinstance(terms, str):
            return Finding(terms, {"rank": call.rank, "op": call.op, **at(call), "reduce": call.reduce})
        W = np.zeros((self.ws, positions.size))
        delivered = call.delivered_values()[k]
        expected = np.zeros(positions.size)
        for term in terms:
            mask = term.sent_positions >= 0
            entered = self.view.flat(term.call, "entered")
            pos = term.sent_positions[mask]
            if pos.size and pos.max() >= entered.size:
                return Finding("unobserved", {"rank": term.rank, "op": term.call.op})
            expected[mask] += term.weight * entered[pos]
        # What was delivered is what entered the operation, combined as the switch records it: anything
        # else is a record that does not hold together (never expected: the switch computed both), except a
        # sum past its dtype's largest value (inf, or nan from inf - inf), which no delivery can explain.
        if delivered is not None and not np.all(np.isfinite(delivered[positions])):
            return Finding("not_finite", {"rank": call.rank, "op": call.op, **at(call)})
        if delivered is None or not np.all(self._close(delivered[positions], expected)):
            return Finding("inconsistent", {"rank": call.rank, "op": call.op, **at(call), "n": call.seq + 1})
        for term in terms:
            mask = term.sent_positions >= 0
            sent = self.view.flat(term.call, "sent")
            pos = term.sent_positions[mask]
            # A fresh "used" scope per sent vector: one delivered element counts once in the value being
            # explained, but a rank may send what it received in several operations (forwarding).
            saved, self.used = self.used, {}
            try:
                sub = self._explain(term.rank, sent[pos], I[mask], depth + 1, term.call.entered_at)
            finally:
                self.used = saved
            if isinstance(sub, Finding):
                if sub.key == "not_delivered" and depth + 1 > 0:
                    return self._contribution(term, sent, pos, I[mask])
                return sub
            W[:, mask] += term.weight * sub[0]
        return W

    def _contribution(self, term, sent: np.ndarray, pos: np.ndarray, I: np.ndarray) -> Finding:
        """A rank sent something that is neither its own data nor what it received."""
        idx = self.index[term.rank, I]
        local = self.locals[term.rank]
        own = local[np.clip(idx, 0, max(0, local.size - 1))] if local.size else np.zeros(0)
        return Finding("contribution", {"rank": term.rank, "op": term.call.op, **at(term.call),
                                        "n": term.call.seq + 1, "sent": sent[pos][:4096].tolist(),
                                        "own": own[:4096].tolist()})

    def _unexplained(self, rank: int, x: np.ndarray, t: int, depth: int, before) -> Finding:
        return Finding("not_delivered", {"rank": rank, "element": int(t), "value": float(x[t]),
                                         "delivered": bool(self._entries(rank, self._pool(rank), before))})
