"""Seed 004's schedulers: MC-SF (Algorithms 1 and 2) and the α-protection baselines of Sec. 7.

Jaillet, Jiang, Podimata and Zhou (seed 004; digest ``shared/notes/003_004.md``
B3, B5) schedule in *rounds*: every batch is one round, a request is prefilled
whole when it starts and then decodes in every round until it completes (no
pause, no chunking). Here a round is one batch of the simulator, whatever its
duration, as in the paper's experiments ("Eq. (1) evaluated in rounds").

The future-memory check of Eq. (1), in our accounting
----------------------------------------------------
The paper's request (s, o) started in round p occupies ``s + (t' - p)`` in
round t' while ``o >= t' - p``. Under :func:`~kvsched.schedule.conventions.from_mcsf`
(``"eq1"``: I = s, O = o + 1) that is exactly our KV held *during* the batch of
round t' (the appended KV counted, the completing request released after its
last batch). In our terms, a request about to run in the next round (d = 0)
holds

* ``h = I + G`` KV during that round, G the tokens generated so far (a prefill
  holds I; a decode holding m = I + G - 1 holds m + 1; a whole refill after an
  eviction holds I + G), and
* ``h + d`` in round d, for ``d = 0 .. r - 1``, where ``r = O - G`` rounds are
  left (its peak ``I + O - 1``; with predicted lengths Ô, ``r = max(Ô - G, 1)``:
  a request that outlives its prediction is expected to finish in this round).

Memory over the coming rounds is ``mem(d) = sum_j (h_j + d) [d < r_j]``. It
increases between completions and drops at them, so it peaks in the *last* round
``d = r_j - 1`` of some request: Eq. (1) at the paper's completion times ``t' =
p_j + o_j``. A candidate ``(h, r)`` is admitted to the batch ``B`` (running
requests plus those already admitted this round) when

    mem_B(d) + h + d <= M   for every d in {r_j - 1 : j in B, r_j <= r} ∪ {r - 1}

(rounds after the candidate's last one are unchanged by it and were already
checked). The last point is the candidate's own completion, which the printed
Algorithms 1 and 2 leave out of the time list; without it the check can admit a
batch that overflows M a few rounds later (``include_candidate=False``
reproduces the printed list, and the semantic core then refuses the batch). With
paged KV (block size b) each request's term is rounded up to blocks; the peaks
are still at completions.

:class:`MCSF` (Algorithm 2, the online MC-SF) evaluates the check above with
suffix sums over the batch sorted by ``r``. :class:`MCSFAlgorithm1` evaluates
Eq. (1) *literally*, in the paper's coordinates: each started request keeps its
``(s, o, p)`` (s = h and o = r - 1 when it starts, p its start round) and the
inequality is summed over the printed time list ``p_j + o_j`` plus the
candidate's ``t + o_i``. The two are independent codings of one rule, and the
tests check they give identical schedules.

Algorithm 1 is semi-online (every request at t = 0). On an online instance it is
applied to the requests that have arrived, which is Algorithm 2; the paper's
Algorithm 2 is the same loop over the waiting requests.

The α-protection baselines in our engine
----------------------------------------
α-protection greedy (FCFS) keeps every running request in the batch and admits
waiting requests in arrival order while the KV of the batch (running requests
grown by one token, plus the admitted prompts) stays within ``(1 - α) M``; the
first that does not fit stops admission. Running requests keep growing, so the
KV the batch would hold can exceed M, and the paper then *clears* the active
requests: all of them (greedy), or each independently with probability β
(β-clearing; ``alpha-beta``), back to the waiting queue.

The semantic core refuses a batch over M, so the overflowing batch never runs:
the policy predicts the next batch's KV (every running request holds one more
token) and, when it exceeds M, clears *before* it, as evictions listed on the
batch. With β < 1 clearing passes are repeated until the survivors fit (the
passes cost no time here; in the paper each overflow costs a round). The core
also forbids processing a request in the batch that evicts it, so cleared
requests sit out that one batch, as in the paper, where the overflowing round's
work on them is lost; admission proceeds with the other waiting requests, and the
cleared ones are back at their arrival position (at the head, FCFS) from the next
round. Under overload the requests admitted in that batch hold the memory the
cleared ones would take, so two groups tend to alternate where the paper re-admits
the cleared group at once. The core cannot run an empty batch: when clearing
would leave nothing to run, the oldest running request is spared (it would be the
first one re-admitted).

What a cleared request loses is a flag (the paper says "sent back to the waiting
queue as unprocessed"):

* ``cleared="restart"`` (default): it starts over. Our core keeps generated
  tokens, so a restart is emulated exactly in memory and rounds by *chunked
  refill*: a first chunk of I tokens (KV I, as a prefill), then one token per
  round (KV I + 1, ..., I + G), the last of which generates token G + 1 -- the
  paper's re-prefill and G repeated decodes. Only the phase label differs
  (refill chunks are costed as prefill chunks by the cost models).
* ``cleared="recompute"``: vLLM's preemption by recompute, one whole refill of
  I + G tokens, then decoding resumes.

With ``restart``, a small α gives the paper's *infinite processing loop* (Sec. 7,
Fig. 7): the same requests are admitted, overflow, are cleared, and are admitted
again. The policy detects it: the greedy variant (β = 1) is deterministic, so
once every request has arrived, a clearing event that repeats an earlier one
exactly (the same requests cleared, the same tokens generated so far, the same
survivors) with no token generated in between proves a cycle, and raises
:class:`ClearingLoopError`. For β < 1, ``loop_limit`` clearing events in a row
without any new token raise it too (a heuristic: the random clearing could still
break out). With ``recompute`` no progress is ever lost, so there is no loop.

Budgets: the paper has no token budget C, prefill budget P or ``max_running``.
When an instance sets them, admission respects them (a candidate that does not
fit them fails like one that does not fit M); running requests then never exceed
them, since each ran in the previous batch with at least one token.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from kvsched.errors import InputError, KvschedError
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_choice, check_positive
from kvsched.heuristics.mcsf_runs import AlphaRuns, McsfRuns, Profile, Room, ceil_div
from kvsched.heuristics.spec import PolicySpec
from kvsched.instances.model import Instance

Lengths = Literal["true", "predicted"]
OnFail = Literal["break", "continue"]
Cleared = Literal["restart", "recompute"]


class ClearingLoopError(KvschedError):
    """An α-protection run cycles through overflow and clearing without progress (seed 004 Fig. 7)."""


def _check_whole_prompts(instance: Instance, policy: str) -> None:
    """Refuse instances whose prompts can never run whole (the paper has no chunked prefill)."""
    lim = instance.limits
    caps = [c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None]
    if not caps:
        return
    cap = min(caps)
    for r in instance.requests:
        if r.prompt > cap:
            raise InputError(
                f"policy {policy!r} processes whole prompts, but request {r.id!r} has {r.prompt} prompt "
                f"tokens, more than the budget ({cap})"
            )


# ============================================================================ MC-SF


class MCSF(McsfRuns):
    """MC-SF: seed 004's Algorithm 2 (online), shortest output first under the future-memory check.

    Every round: every running request stays in the batch (never preempted);
    waiting requests are considered in ascending output length (ties by arrival)
    and each joins when Eq. (1) holds at the completion rounds (see the module
    docstring); the first that fails stops admission (``on_fail="break"``) or is
    skipped (``"continue"``).

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    lengths
        ``"true"``: the true output lengths (the paper's perfect prediction;
        hindsight, ``uses_true_output``). ``"predicted"``: the instance's
        ``predicted_output``, capped so that I + Ô - 1 fits M. A request
        that outlives its prediction is expected to finish in the current round;
        if the running requests would then overflow M, the most recently started
        ones are evicted (recompute) and wait again.
    on_fail
        ``"break"`` (the paper: the first failure ends admission for the round)
        or ``"continue"`` (try the next candidate: with unequal prompts a later,
        smaller request may fit, digest B3).
    include_candidate
        Check the candidate's own completion round too (the fix of digest B3;
        default). ``False`` reproduces the printed time list, which can admit a
        batch that overflows M later (the core then raises).
    """

    def __init__(
        self,
        name: str = "mcsf",
        *,
        lengths: Lengths = "true",
        on_fail: OnFail = "break",
        include_candidate: bool = True,
    ) -> None:
        check_choice("lengths", lengths, Lengths)
        check_choice("on_fail", on_fail, OnFail)
        if not isinstance(include_candidate, bool):
            raise ValueError(f"include_candidate must be true or false; got {include_candidate!r}")
        self.name = name
        self.lengths = lengths
        self.on_fail = on_fail
        self.include_candidate = include_candidate
        self.uses_true_output = lengths == "true"

    @property
    def params(self) -> Mapping[str, Any]:
        return {"lengths": self.lengths, "on_fail": self.on_fail, "include_candidate": self.include_candidate}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ----------------------------------------------------------------- set-up
    def reset(self, instance: Instance) -> None:
        lim = instance.limits
        _check_whole_prompts(instance, self.name)
        if self.lengths == "predicted" and any(r.predicted_output is None for r in instance.requests):
            raise InputError(
                f"policy {self.name!r}: lengths='predicted' needs predicted_output on every request"
            )
        n = len(instance)
        self._limits = lim
        self._block = lim.block_size
        self._capacity = lim.kv_blocks
        self._prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
        self._length: np.ndarray | None = None  # O or Ô per request, read from the view
        self._cursor = 0  # arrivals taken so far (a prefix of view.arrival_order)
        self._rank = np.zeros(n, dtype=np.int64)  # arrival rank (tie-break)
        self._waiting: list[int] = []  # sorted by (length, arrival rank)
        self._running: list[int] = []  # in start order (the last started is evicted first)
        self._round = 0  # batches issued so far: the paper's round index t
        # The paper's coordinates of each started request: s (KV in its first round), o, start round p.
        self._s = np.zeros(n, dtype=np.int64)
        self._o = np.zeros(n, dtype=np.int64)
        self._p = np.full(n, -1, dtype=np.int64)

    def _lengths_from(self, view: SchedulerView) -> np.ndarray:
        if self.lengths == "true":
            return np.asarray(view.output, dtype=np.int64)
        assert view.predicted_output is not None
        # A prediction whose peak cannot fit M could never be admitted: cap it at the largest that fits.
        fit = self._capacity * self._block - self._prompt + 1
        return np.clip(np.asarray(view.predicted_output, dtype=np.int64), 1, fit)

    def _key(self, r: int) -> tuple[int, int]:
        assert self._length is not None
        return (int(self._length[r]), int(self._rank[r]))

    def _take_arrivals(self, view: SchedulerView) -> None:
        arrived = view.num_arrived
        for r in view.arrival_order[self._cursor : arrived].tolist():
            self._rank[r] = self._cursor
            self._cursor += 1
            bisect.insort(self._waiting, r, key=self._key)

    def _remaining(self, view: SchedulerView, idx: np.ndarray | int) -> np.ndarray:
        """Rounds left, r = O - G (true) or max(Ô - G, 1) (predicted)."""
        assert self._length is not None
        return np.maximum(self._length[idx] - view.generated[idx], 1)

    # ------------------------------------------------------------ next batch
    def next_batch(self, view: SchedulerView) -> Decision | None:
        if self._length is None:
            self._length = self._lengths_from(view)
        self._take_arrivals(view)
        run = np.array(self._running, dtype=np.int64)
        run = run[~view.done[run]]
        evicted: list[int] = []
        if self.lengths == "predicted":
            run, evicted = self._relieve(view, run)
        self._running = run.tolist()

        gen = view.generated
        h_run = self._prompt[run] + gen[run]  # KV during the next round: m + 1 for a decode
        r_run = self._remaining(view, run)
        self._running_rounds(run, r_run)
        profile = Profile(h_run, r_run, self._block)
        room = Room.of(self._limits, tokens=run.size, prefill=0, running=run.size)
        members = list(self._running)

        admitted: list[int] = []
        tokens: list[int] = []
        kept: list[int] = []
        fresh = set(evicted)
        for k, cand in enumerate(self._waiting):
            if cand in fresh:  # evicted before this very batch: it cannot also run in it
                kept.append(cand)
                continue
            h = int(self._prompt[cand] + gen[cand])  # a prefill (I) or a whole refill (I + G)
            r = int(self._remaining(view, cand))
            if room.fits(h) and self._fits(profile, members, h, r):
                room.take(h)
                profile.add(h, r)
                members.append(cand)
                self._start(cand, h, r)
                admitted.append(cand)
                tokens.append(h)
            else:
                kept.append(cand)
                if self.on_fail == "break":
                    kept.extend(self._waiting[k + 1 :])
                    break
        self._waiting = kept
        self._running.extend(admitted)

        if not self._running:
            self._explain_stall(view)
            return None
        self._round += 1
        return Decision(run.tolist() + admitted, [1] * run.size + tokens, evicted)

    def _running_rounds(self, run: np.ndarray, r_run: np.ndarray) -> None:
        """Keep the paper's o of each running request current (it only grows, with predictions)."""
        # A request still running in round t has o >= t - p: extend it to end at t + r - 1.
        self._o[run] = (self._round - self._p[run]) + r_run - 1

    def _start(self, cand: int, h: int, r: int) -> None:
        """Record a start in the paper's coordinates: (s, o, p) = (h, r - 1, t)."""
        self._s[cand], self._o[cand], self._p[cand] = h, r - 1, self._round

    def _fits(self, profile: Profile, members: list[int], h: int, r: int) -> bool:
        """Whether a candidate (h, r) passes the future-memory check (Alg. 2: suffix sums)."""
        return profile.peak_with(h, r, self.include_candidate) <= self._capacity

    def _relieve(self, view: SchedulerView, run: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """With predicted lengths: evict the latest-started running requests until the next round fits M."""
        held = ceil_div(view.kv[run] + 1, self._block)
        total = int(held.sum())
        if total <= self._capacity:
            return run, []
        k = run.size
        while total > self._capacity and k > 1:
            k -= 1
            total -= int(held[k])
        out = run[k:].tolist()
        for r in out:
            bisect.insort(self._waiting, r, key=self._key)
        return run[:k], out

    def _explain_stall(self, view: SchedulerView) -> None:
        """Fail clearly when nothing runs and a waiting request can never be admitted."""
        if not self._waiting or view.next_arrival() is not None:
            return
        r = self._waiting[0]
        h = int(self._prompt[r] + view.generated[r])
        raise KvschedError(
            f"policy {self.name!r} stalled: request {r} needs a whole prefill/refill of {h} tokens, "
            f"which the token budgets (C = {self._limits.max_batch_tokens}, "
            f"P = {self._limits.max_prefill_tokens}) never allow"
        )


class MCSFAlgorithm1(MCSF):
    """Seed 004's Algorithm 1 (semi-online), with Eq. (1) evaluated literally in the paper's coordinates.

    Same loop as :class:`MCSF`; the check sums ``(s_j + t' - p_j) 1{o_j >= t' - p_j}``
    over the batch's started requests plus the candidate's ``(s + t' - t) 1{o >=
    t' - t}``, at every time of the list ``t' = p_j + o_j`` (j in S ∪ U) and,
    with ``include_candidate``, ``t + o``. Each request's ``(s, o, p)`` is its KV
    in its first round, its rounds less one, and its start round (so ``(I, O - 1)``
    for a fresh request: the ``"eq1"`` mapping of
    :func:`~kvsched.schedule.conventions.to_mcsf`).
    """

    def __init__(
        self,
        name: str = "mcsf-alg1",
        *,
        lengths: Lengths = "true",
        on_fail: OnFail = "break",
        include_candidate: bool = True,
    ) -> None:
        super().__init__(name, lengths=lengths, on_fail=on_fail, include_candidate=include_candidate)

    def _fits(self, profile: Profile, members: list[int], h: int, r: int) -> bool:
        t = self._round
        idx = np.array(members, dtype=np.int64)
        s, o, p = self._s[idx], self._o[idx], self._p[idx]
        s_i, o_i = h, r - 1
        times = p + o
        if self.include_candidate:
            times = np.append(times, t + o_i)
        if times.size == 0:
            return True
        tp = times[:, None]
        held = np.where(o[None, :] >= tp - p[None, :], ceil_div(s[None, :] + tp - p[None, :], self._block), 0)
        own = np.where(o_i >= times - t, ceil_div(s_i + times - t, self._block), 0)
        return bool((held.sum(axis=1) + own <= self._capacity).all())


# ============================================================================ α-protection


class AlphaProtection(AlphaRuns):
    """Seed 004 Sec. 7's baselines: α-protection greedy (β = 1) and α-protection β-clearing.

    Every round: running requests stay in the batch; waiting requests join in
    arrival order (FCFS) while the batch's KV stays within ``(1 - α) M``, the
    first that does not fit stopping admission. When the running requests alone
    would overflow M, active requests are cleared before the batch: each with
    probability β, in passes until the rest fit (β = 1: all of them). See the
    module docstring for how clearing maps onto our engine.

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    alpha
        Protected share of M, in (0, 1).
    beta
        Clearing probability, in (0, 1]; 1 is the greedy variant (clear everything).
    seed
        Seed of the clearing draws.
    cleared
        ``"restart"`` (the paper's "as unprocessed", emulated by chunked refill)
        or ``"recompute"`` (one whole refill, as vLLM).
    loop_limit
        Clearing events in a row with no token generated in between after which
        the run is declared an infinite clearing loop (``None``: never; the
        greedy variant's exact cycle detection still applies).

    Attributes
    ----------
    clears, passes
        Clearing events and clearing passes in the last run.
    """

    def __init__(
        self,
        name: str = "alpha-greedy",
        *,
        alpha: float = 0.25,
        beta: float = 1.0,
        seed: int = 0,
        cleared: Cleared = "restart",
        loop_limit: int | None = 1000,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1); got {alpha!r}")
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1]; got {beta!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
        check_choice("cleared", cleared, Cleared)
        check_positive("loop_limit", loop_limit)  # (True passed isinstance(int))
        self.name = name
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.seed = seed
        self.cleared = cleared
        self.loop_limit = loop_limit
        self.uses_true_output = False
        self.clears = 0
        self.passes = 0

    @property
    def params(self) -> Mapping[str, Any]:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "seed": self.seed,
            "cleared": self.cleared,
            "loop_limit": self.loop_limit,
        }

    def __repr__(self) -> str:
        return f"AlphaProtection({self.name!r}, alpha={self.alpha:g}, beta={self.beta:g})"

    # ----------------------------------------------------------------- set-up
    def reset(self, instance: Instance) -> None:
        lim = instance.limits
        _check_whole_prompts(instance, self.name)
        self._limits = lim
        self._n = len(instance)
        self._block = lim.block_size
        self._capacity = lim.kv_blocks
        # Admission threshold (1 - α) M, in tokens; KV is compared in whole blocks.
        self._threshold = (1.0 - self.alpha) * lim.kv_capacity
        self._prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
        self._rng = np.random.default_rng(self.seed)
        self._cursor = 0
        self._rank = np.zeros(self._n, dtype=np.int64)
        self._waiting: list[int] = []  # FCFS: by arrival rank
        self._running: list[int] = []  # in admission order (the oldest first)
        self.clears = 0
        self.passes = 0
        self._progress = -1  # tokens generated at the last clearing event
        self._idle_clears = 0  # clearing events in a row without progress
        self._seen: set[bytes] = set()  # clearing events since the last progress (all arrived)

    def _take_arrivals(self, view: SchedulerView) -> None:
        arrived = view.num_arrived
        for r in view.arrival_order[self._cursor : arrived].tolist():
            self._rank[r] = self._cursor
            self._cursor += 1
            self._waiting.append(r)  # arrivals come in rank order

    def _need(self, view: SchedulerView, r: int) -> int:
        """Tokens of a waiting request's first item: its prompt, or I + G for a whole refill."""
        if self.cleared == "recompute":
            return int(self._prompt[r] + view.generated[r])
        return int(self._prompt[r])  # a fresh prefill, or the first chunk of a restart

    # ------------------------------------------------------------ next batch
    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._take_arrivals(view)
        run = np.array(self._running, dtype=np.int64)
        run = run[~view.done[run]]
        # Every running request processes one token (a decode, or the next chunk of a restart).
        held = ceil_div(view.kv[run] + 1, self._block)
        evicted: list[int] = []
        if int(held.sum()) > self._capacity:
            run, held, evicted = self._clear(view, run, held)
        self._running = run.tolist()

        b = self._block
        used = int(held.sum())
        room = Room.of(self._limits, tokens=run.size, prefill=self._refilling(view, run), running=run.size)
        admitted: list[int] = []
        tokens: list[int] = []
        fresh = set(evicted)
        kept: list[int] = []
        for k, cand in enumerate(self._waiting):
            if cand in fresh:  # cleared before this batch: back in the queue from the next round
                kept.append(cand)
                continue
            need = self._need(view, cand)
            blocks = int(ceil_div(need, b))
            if (used + blocks) * b <= self._threshold and room.fits(need):
                used += blocks
                room.take(need)
                admitted.append(cand)
                tokens.append(need)
            else:
                kept.extend(self._waiting[k:])  # FCFS: the first that does not fit stops admission
                break
        self._waiting = kept
        self._running.extend(admitted)
        if not self._running:
            self._explain_stall(view)
            return None
        return Decision(run.tolist() + admitted, [1] * run.size + tokens, evicted)

    def _refilling(self, view: SchedulerView, run: np.ndarray) -> int:
        """Refill tokens the running requests process in the next batch (restart chunks count for P)."""
        return int(view.refilling[run].sum())

    def _clear(
        self, view: SchedulerView, run: np.ndarray, held: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Clear running requests (each with probability β, in passes) until the rest fit M."""
        self.clears += 1
        keep = np.ones(run.size, dtype=bool)
        while int(held[keep].sum()) > self._capacity and keep.any():
            self.passes += 1
            if self.beta >= 1.0:
                keep[:] = False
            else:
                keep &= self._rng.random(run.size) >= self.beta
        if not keep.any() and not self._head_admissible(view):
            keep[0] = True  # the core cannot run an empty batch: spare the oldest running request
        out = run[~keep]
        self._check_loop(view, out, run[keep])
        for r in out.tolist():
            bisect.insort(self._waiting, r, key=self._rank.__getitem__)
        return run[keep], held[keep], out.tolist()

    def _head_admissible(self, view: SchedulerView) -> bool:
        """Whether the head of the waiting queue (before the cleared requests rejoin it) fits an empty batch."""
        if not self._waiting:
            return False
        head = self._waiting[0]
        need = self._need(view, head)
        room = Room.of(self._limits, 0, 0, 0)
        return int(ceil_div(need, self._block)) * self._block <= self._threshold and room.fits(need)

    def _check_loop(self, view: SchedulerView, out: np.ndarray, survivors: np.ndarray) -> None:
        progress = int(view.generated.sum())
        if progress != self._progress:
            self._progress = progress
            self._idle_clears = 0
            self._seen.clear()
        else:
            self._idle_clears += 1
        if self.loop_limit is not None and self._idle_clears >= self.loop_limit:
            raise ClearingLoopError(
                f"policy {self.name!r} (alpha = {self.alpha:g}, beta = {self.beta:g}) cleared "
                f"{self._idle_clears} times in a row at t = {view.now:g} without generating a token: "
                "an infinite clearing loop (seed 004 Sec. 7, Fig. 7)"
            )
        if self.beta < 1.0 or view.num_arrived < self._n:
            return
        # Deterministic and every request in: the state after this clearing decides the rest.
        key = hashlib.blake2b(digest_size=16)
        key.update(np.sort(out).tobytes())
        key.update(survivors.tobytes())
        key.update(view.kv[survivors].tobytes())
        digest = key.digest()
        if digest in self._seen:
            raise ClearingLoopError(
                f"policy {self.name!r} (alpha = {self.alpha:g}) repeats the same clearing of "
                f"{out.size} requests at t = {view.now:g} with no token generated in between: an "
                "infinite clearing loop (seed 004 Sec. 7, Fig. 7)"
            )
        self._seen.add(digest)

    def _explain_stall(self, view: SchedulerView) -> None:
        """Fail clearly when nothing runs and the head of the queue can never be admitted."""
        if not self._waiting or view.next_arrival() is not None:
            return
        r = self._waiting[0]
        raise KvschedError(
            f"policy {self.name!r} stalled: request {r} needs {self._need(view, r)} tokens at admission, "
            f"more than (1 - alpha) M = {self._threshold:g} or the token budgets allow"
        )


# ============================================================================ registry entries

_SOURCE = "seed 004"

#: Seed 004's policies, to merge into :data:`kvsched.heuristics.registry.POLICIES`.
SEED004_POLICIES: dict[str, PolicySpec] = {
    "mcsf-alg1": PolicySpec(
        "mcsf-alg1",
        MCSFAlgorithm1,
        "Algorithm 1 (semi-online): running requests stay; waiting requests join in ascending output "
        "length while Eq. (1) holds at the completion times, the candidate's own included (the printed "
        "list omits it); the first failure stops admission (on_fail=break) or is skipped (continue). "
        "Eq. (1) is evaluated literally in the paper's (s, o, p) coordinates. On online instances it "
        "admits among the arrived requests, which is Algorithm 2. Hindsight with lengths=true (the "
        "paper's perfect prediction); lengths=predicted uses predicted_output. Not optimal: see "
        "docs/reproductions.md (Theorem 4.2 fails on small integer instances).",
        _SOURCE + " Sec. 4, Algorithm 1 and Eq. (1)-(2)",
        MappingProxyType({"lengths": "true", "on_fail": "break", "include_candidate": True}),
    ),
    "mcsf": PolicySpec(
        "mcsf",
        MCSF,
        "MC-SF, Algorithm 2 (online): every running request stays in the batch (never preempted); "
        "waiting requests join shortest output first while the future-memory check of Eq. (1) holds "
        "at every completion round (the candidate's included), counted in batches; the first failure "
        "stops admission. Never exceeds M with true lengths. Hindsight with lengths=true (the paper "
        "assumes exact predictions); with lengths=predicted a request outliving its prediction is "
        "expected to end in the current round and, on overflow, the latest-started requests are evicted.",
        _SOURCE + " Sec. 5.1, Algorithm 2",
        MappingProxyType({"lengths": "true", "on_fail": "break", "include_candidate": True}),
    ),
    "alpha-greedy": PolicySpec(
        "alpha-greedy",
        AlphaProtection,
        "α-protection greedy (vLLM-like 'magic number', FCFS): running requests stay; waiting requests "
        "join in arrival order while the batch's KV stays within (1 - α) M. When the running requests "
        "would overflow M every active request is cleared (evicted before that batch) and restarts "
        "(cleared=restart, chunked refill) or recomputes (cleared=recompute). Small α loops forever "
        "(ClearingLoopError). The paper runs α = 0.3 and 0.25.",
        _SOURCE + " Sec. 7, Benchmark Algorithms",
        MappingProxyType({"alpha": 0.25, "beta": 1.0, "seed": 0, "cleared": "restart", "loop_limit": 1000}),
    ),
    "alpha-beta": PolicySpec(
        "alpha-beta",
        AlphaProtection,
        "α-protection β-clearing: α-protection greedy, but on overflow each active request is cleared "
        "independently with probability β (seeded), in passes until the rest fit M. The paper runs "
        "(α, β) = (0.2, 0.2), (0.2, 0.1), (0.1, 0.2), (0.1, 0.1).",
        _SOURCE + " Sec. 7, Benchmark Algorithms",
        MappingProxyType({"alpha": 0.2, "beta": 0.2, "seed": 0, "cleared": "restart", "loop_limit": 1000}),
    ),
}

__all__ = [
    "MCSF",
    "SEED004_POLICIES",
    "AlphaProtection",
    "ClearingLoopError",
    "MCSFAlgorithm1",
]
