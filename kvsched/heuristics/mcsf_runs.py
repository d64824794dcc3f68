"""Seed 004's schedulers in coalesced decode runs: how long MC-SF's and α-protection's decision stays the same.

The simulator (:mod:`kvsched.heuristics.step`) offers a policy that opted in a run
of repeats of a decode-only batch it just applied
(:class:`~kvsched.heuristics.base.SteadyDecodes`): within the ``limit`` batches
offered no request arrives, none completes before the last of them, and each
batch decodes one token of every request of the decision (their KV grows by one
per batch, nothing else changes), and, after an entry in which a request completed
or finished its prompt, a run of decodes of the requests left
(:class:`~kvsched.heuristics.base.ContinueDecodes`), asked instead of a decision,
over the same stretch. The answers here are argued from
:class:`~kvsched.heuristics.mcsf.MCSF`'s and
:class:`~kvsched.heuristics.mcsf.AlphaProtection`'s ``next_batch``;
:class:`McsfRuns` and :class:`AlphaRuns` are the halves of those classes that
answer them. This module also holds what both halves read: the budgets left
while a batch is built (:class:`Room`) and MC-SF's future-memory profile
(:class:`Profile`).

MC-SF's decision through a run
------------------------------
Write ``s = 0, 1, ...`` for the calls of the run (call s sees the state after s
more decode batches than the view shows now). A decode-only decision admitted
no one: every running request stays and decodes, and the waiting requests it
tried failed. Through the run nothing arrives, completes or is evicted (with
predicted lengths ``_relieve`` evicts only when the running requests' next
batch would exceed M, and every batch of the run fits M), the waiting list and
its order (by length, then arrival) stay, and a waiting request's ``h_c = I +
G`` and ``r_c`` stay (it generates nothing). The budgets left for admission (C
less one token per running request, P, ``max_running`` less the running count)
stay: a candidate that failed them fails them at every call.

What moves is the running requests' profile: request i has ``h_i + s`` and
``r_i - s`` at call s, so the memory it predicts ``d`` rounds ahead is
``mem_s(d) = sum_i blocks(h_i + s + d) [d < r_i - s] = mem_0(d + s)``: in absolute
rounds ``a = d + s`` (counted from call 0) the running requests' future does not
move (their peaks ``I + O - 1`` are fixed). With predicted lengths this holds
while no running request outlives its prediction (``r = max(Ô - G, 1)``: the
clamp would stop the shift), so a run stops before that (``min_i (Ô_i - G_i)``
calls; with true lengths ``O_i - G_i`` exceeds every call of the run).

The candidate's check at call s, in absolute rounds: with ``a_i = r_i - 1`` the
running completions,

* a running completion is checked once the candidate would outlive it, ``r_i -
  s <= r_c``, i.e. from ``s >= join_i = max(0, r_i - r_c)`` on, where it needs
  ``mem_0(a_i) + blocks(h_c + a_i - s) <= M``; ``blocks(x) <= slack`` iff ``x <=
  b slack``, so it holds iff ``s >= need_i = h_c + a_i - b (M - mem_0(a_i))``.
  The point fails for ``s`` in ``[join_i, need_i)``, and (printed time list,
  ``include_candidate=False``, which checks every completion) also for ``s <
  join_i`` when ``mem_0(a_i) > M``;
* the candidate's own completion (``include_candidate``) is at ``a = r_c - 1 + s``
  with its peak ``blocks(h_c + r_c - 1)``, so it holds iff ``mem_0(r_c - 1 + s)
  <= M - blocks(h_c + r_c - 1)``. Between two running completions ``mem_0`` is
  non-decreasing in ``a`` (the same requests, each growing), so where it fails it
  fails up to the next completion round ``u > a`` (a distinct ``r_i``, where
  ``mem_0`` drops), and the first round it can hold again is the first such ``u``
  with ``mem_0(u)`` within the bound.

So for every check the first call ``>= s`` at which it holds is known in closed
form (``need_i``, or the next good completion round), and the first call at which
all hold is the fixed point of ``s <- max over the checks of that first call``:
it starts at 0 and only jumps over calls at which some check fails, so no call it
skips admits the candidate, and it stops at the first call where every check
holds. With ``on_fail="break"`` only the head of the waiting list is tried (it
fails, and while it fails admission stops there); with ``"continue"`` every
waiting request is tried and the run ends at the first call any of them passes.
The answer is the smallest of these first calls, at most the offer: the calls
before it return the same batch. (A run after an event counts the same calls from
the one it replaces: that call is s = 0.) The bookkeeping is the round counter (``_round``
grows by one per call; the paper's ``o`` of a running request is recomputed from
it at each call and does not change through the run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.instances.model import Limits

if TYPE_CHECKING:
    from kvsched.heuristics.mcsf import MCSF, AlphaProtection


def ceil_div(a: np.ndarray | int, b: int) -> Any:
    return -(-a // b)


def _running_as(
    policy: MCSF | AlphaProtection, view: SchedulerView, requests: np.ndarray
) -> np.ndarray | None:
    """The policy's running requests, after what ``next_batch`` does first (take the arrivals, drop the
    finished ones: both idempotent), if they are exactly ``requests`` in order; else ``None``."""
    policy._take_arrivals(view)
    run = np.asarray(policy._running, dtype=np.int64)
    run = run[~view.done[run]]
    policy._running = run.tolist()
    if run.size != requests.size or bool((run != requests).any()):
        return None
    return run


@dataclass(slots=True)
class Room:
    """What is left of the per-batch budgets (C, P, max_running) while a batch is built."""

    tokens: float
    prefill: float
    running: float

    @classmethod
    def of(cls, limits: Limits, tokens: int, prefill: int, running: int) -> Room:
        """The room left once the forced part of the batch (running requests) is in."""
        inf = float("inf")
        return cls(
            (limits.max_batch_tokens if limits.max_batch_tokens is not None else inf) - tokens,
            (limits.max_prefill_tokens if limits.max_prefill_tokens is not None else inf) - prefill,
            (limits.max_running if limits.max_running is not None else inf) - running,
        )

    def fits(self, tokens: int) -> bool:
        """Whether a new prefill or refill of ``tokens`` tokens (a new running request) fits."""
        return tokens <= self.tokens and tokens <= self.prefill and self.running >= 1

    def take(self, tokens: int) -> None:
        self.tokens -= tokens
        self.prefill -= tokens
        self.running -= 1


class Profile:
    """The future KV of a batch's requests: request j holds ``h_j + d`` in round d < r_j.

    Kept sorted by ``r`` with suffix sums of ``h``, so that the memory at any
    round is one :func:`numpy.searchsorted` away (block size 1), or a small
    matrix sum (paged KV).
    """

    def __init__(self, h: np.ndarray, r: np.ndarray, block: int) -> None:
        order = np.argsort(r, kind="stable")
        self.h = h[order].astype(np.int64)
        self.r = r[order].astype(np.int64)
        self.block = block
        self._sums()

    def _sums(self) -> None:
        self.suffix = np.zeros(self.h.size + 1, dtype=np.int64)
        self.suffix[:-1] = np.cumsum(self.h[::-1])[::-1]

    def add(self, h: int, r: int) -> None:
        k = int(np.searchsorted(self.r, r, side="right"))
        self.h = np.insert(self.h, k, h)
        self.r = np.insert(self.r, k, r)
        self._sums()

    def memory(self, d: np.ndarray) -> np.ndarray:
        """KV (blocks) the batch's requests hold in each round of ``d``."""
        if self.block == 1:
            k = np.searchsorted(self.r, d, side="right")  # the first request still active in round d
            return self.suffix[k] + d * (self.r.size - k)
        active = self.r[None, :] > d[:, None]
        held = ceil_div(self.h[None, :] + d[:, None], self.block)
        return np.where(active, held, 0).sum(axis=1)

    def peak_with(self, h: int, r: int, include_candidate: bool) -> int:
        """The most KV held at the checked rounds if a request ``(h, r)`` joins.

        Checked rounds: the completions ``r_j - 1`` of the batch's requests within
        the candidate's run, and the candidate's own ``r - 1`` (left out with
        ``include_candidate=False``, the printed time list, which then checks
        every completion of the batch and nothing else).
        """
        if include_candidate:
            k = int(np.searchsorted(self.r, r, side="right"))  # requests that end no later
            d = np.append(self.r[:k] - 1, r - 1)
        else:
            d = self.r - 1
            if d.size == 0:
                return 0
        own = np.where(d < r, ceil_div(h + d, self.block), 0)
        return int((self.memory(d) + own).max())


class _Shifted:
    """The running requests' future at call 0 of a run, for the candidates' first admissible call."""

    def __init__(self, profile: Profile, capacity: int) -> None:
        self.profile = profile
        self.capacity = capacity
        self.r = profile.r
        self.peaks = profile.memory(profile.r - 1)  # mem_0 at each running completion a_i = r_i - 1
        self.over = bool((self.peaks > capacity).any())
        self.starts = np.unique(profile.r)  # rounds where mem_0 drops (a completion is behind)
        self.at_starts = profile.memory(self.starts)

    def first_admission(self, h: int, r: int, most: int, include_candidate: bool) -> int:
        """The first call (0 to ``most``; ``most``: none before it) at which a candidate ``(h, r)`` passes
        the future-memory check (the module docstring's fixed point)."""
        b, cap = self.profile.block, self.capacity
        join = self.r - r  # (negative: checked from call 0)
        need = h + self.r - 1 - b * (cap - self.peaks)
        bound = cap - int(ceil_div(h + r - 1, b))  # what mem_0 may hold at the candidate's own completion
        if include_candidate and bound < 0:
            return most  # its own peak exceeds M: never admitted
        s = 0
        while True:
            fail = (need > s) & (join <= s)
            if self.over and not include_candidate:  # the printed list checks every completion
                fail |= (need > s) & (self.peaks > cap)
            nxt = int(need[fail].max()) if fail.any() else s
            if include_candidate:
                a = r - 1 + s
                if int(self.profile.memory(np.array([a]))[0]) > bound:
                    i = int(np.searchsorted(self.starts, a, side="right"))
                    ok = np.flatnonzero(self.at_starts[i:] <= bound)
                    if not ok.size:
                        return most
                    nxt = max(nxt, int(self.starts[i + ok[0]]) - r + 1)
            if nxt == s:
                return s
            if nxt >= most:
                return most
            s = nxt


class McsfRuns:
    """The run half of :class:`~kvsched.heuristics.mcsf.MCSF` (its methods read and write its state)."""

    def repeat_decodes(self: MCSF, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode-only batch repeats
        until a waiting request could first pass the future-memory check (the module docstring's
        argument), or a running request would outlive its predicted length."""
        run = np.asarray(self._running, dtype=np.int64)
        if self._length is None or not run.size or len(decision.evict) or len(decision.requests) != run.size:
            return 0
        return self._quiet_calls(view, run, lambda: limit)

    def continue_decodes(
        self: MCSF, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]
    ) -> int:
        """Runs after a completion or a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`).

        :meth:`~kvsched.heuristics.mcsf.MCSF.next_batch` first takes the arrivals and
        drops the finished requests from the running list (so here: both are
        idempotent, so a 0 leaves it as it expects). When the running requests are then
        exactly ``requests`` (all decoding, in start order, the batch's order), its
        decision is one decode of each as long as no waiting request passes the check
        and, with predicted lengths, nothing is evicted: the offer's batches fit M, so
        ``_relieve`` evicts nothing, and the calls from this one on are those of
        :meth:`repeat_decodes`' argument, counted from the first.
        """
        if self._length is None:
            return 0
        run = _running_as(self, view, requests)
        if run is None:
            return 0
        return self._quiet_calls(view, run, limit)

    def _quiet_calls(self: MCSF, view: SchedulerView, run: np.ndarray, limit: Callable[[], int]) -> int:
        """The calls in a row, from the next one (at most ``limit()``), at which no waiting request is
        admitted and the running requests ``run`` stay within their predicted lengths; ``_round`` moves
        on by as many."""
        gen = view.generated
        h = self._prompt[run] + gen[run]
        left = self._length[run] - gen[run]  # r before the clamp at 1 (predicted lengths)
        most = int(left.min())
        if most <= 0:
            return 0
        waiting = self._waiting if self.on_fail == "continue" else self._waiting[:1]
        room = Room.of(self._limits, tokens=run.size, prefill=0, running=run.size)
        shifted: _Shifted | None = None
        candidates: list[tuple[int, int]] = []
        for cand in waiting:
            hc = int(self._prompt[cand] + gen[cand])
            if not room.fits(hc):
                continue  # the budgets stay: it never fits them in the run
            if shifted is None:
                shifted = _Shifted(Profile(h, left, self._block), self._capacity)
            rc = int(self._remaining(view, cand))
            if not shifted.first_admission(hc, rc, 1, self.include_candidate):
                return 0  # admitted at the next call (before planning the offer)
            candidates.append((hc, rc))
        k = min(most, limit())
        for hc, rc in candidates:
            if k <= 1:
                break
            assert shifted is not None
            k = min(k, shifted.first_admission(hc, rc, k, self.include_candidate))
        self._round += k
        return k


class AlphaRuns:
    """The run half of :class:`~kvsched.heuristics.mcsf.AlphaProtection`."""

    def repeat_decodes(self: AlphaProtection, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode-only batch repeats
        for the whole offer.

        Through the run nothing arrives or completes and the running requests all
        decode (a restart's one-token refill chunks are not decodes, so no run is
        offered while one is under way). Every batch of the run fits M, so the
        running requests' next batch never overflows and nothing is cleared (no
        random draw is made, no loop check runs). Admission is FCFS from the head
        of the waiting list, which did not fit at the decision: its need (its
        prompt, or I + G to recompute) and the budgets left stay, and the KV the
        running requests hold in the next batch only grows, so it still does not
        fit (or nothing waits) and the batch is the same.
        """
        if len(decision.evict):
            return 0
        return limit

    def continue_decodes(
        self: AlphaProtection, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]
    ) -> int:
        """Runs after a completion or a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`).

        :meth:`~kvsched.heuristics.mcsf.AlphaProtection.next_batch` first takes the arrivals
        and drops the finished requests from the running list (so here: both are idempotent,
        so a 0 leaves it as it expects). When the running requests are then exactly
        ``requests`` (all decoding, in admission order, the batch's order), their next batch
        fits M (nothing is cleared) and the head of the waiting list does not fit (or
        nothing waits), the decision is one decode of each, and it stays so for the
        reasons :meth:`repeat_decodes` gives.
        """
        run = _running_as(self, view, requests)
        if run is None:
            return 0
        used = int(ceil_div(view.kv[run] + 1, self._block).sum())
        if used > self._capacity:
            return 0  # next_batch clears
        if self._waiting:
            need = self._need(view, self._waiting[0])
            blocks = int(ceil_div(need, self._block))
            room = Room.of(self._limits, tokens=run.size, prefill=0, running=run.size)
            if (used + blocks) * self._block <= self._threshold and room.fits(need):
                return 0  # the head is admitted
        return limit()


__all__ = ["AlphaRuns", "McsfRuns"]
