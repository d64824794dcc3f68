"""SLAI, the SLO-Aware LLM Inference scheduler (seed 000 Sec. 6, experiments in Sec. 7).

Each decode has a *last schedulable time* (Eq. 8)::

    C_j = e_j + TBT_j - delta * t_batch

where ``e_j`` is the end of the batch that emitted request j's latest token,
``TBT_j`` its time-between-tokens SLO and ``t_batch`` the running mean of every
batch duration observed so far. At time t a decode is *critical* if ``t >= C_j``.
A batch is built in four steps, within the token budget ``tau``, the cap
``alpha`` on active requests (holding KV) and the decode limit ``beta``:

1. critical decodes, by increasing C_j;
2. prefills already started (mid-prefill, or preempted and waiting to refill),
   each chunk filling what the budget leaves;
3. new prefills, shortest prompt first (SPF) or FCFS, while fewer than alpha
   requests are active;
4. non-critical decodes, by increasing C_j, while the budget and beta allow.

Readings of what Sec. 6 leaves open (``shared/notes/000.md`` Sec. 2.6):

* "it must respect ... the token budget, the cap alpha and the decode limit
  beta" is read as binding on every step, critical decodes included (with the
  paper's alpha = beta = 128 and tau = 512 neither binds on decodes).
* Prefill chunks fill the budget left, as Sarathi's; several prefills may share
  a batch.
* ``e_j`` for the first decode is the end of the batch that completed the
  prefill (and emitted the first token); after a preemption, the end of the
  refill's last batch.
* The dynamic offset ("5 if GPU memory utilisation is below 96%, else 10") reads
  utilisation as KV-block occupancy, which is what a vLLM-based engine measures.
* ``t_batch`` is 0 before any batch has run, so the first decodes are critical
  only when overdue.
* A request without a TBT SLO uses ``default_tbt``; ``None`` makes all its
  decodes critical, which is Sarathi's treatment of every decode.

How the policy measures time: it sees only :attr:`SchedulerView.now`. The
simulator asks for the next batch when the previous one ends, so the gap
between the call that returned a batch and the next call is that batch's
duration, and a request whose generated count rose in it emitted at the
current time.

Memory follows the Sarathi-Serve / vLLM (v0) engine it was built on: a request
is admitted only when its whole prompt (or refill) fits in the free KV blocks,
and each decode then needs one more token; when blocks run out, the newest
running request not in the batch is preempted by recompute and waits, ahead of
new requests, to refill (seed 000 Sec. 6.1.2 describes this eviction and
recompute as what alpha is meant to avoid).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_choice, check_non_negative_number, check_positive
from kvsched.heuristics.engines import Draft, EngineBase
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Phase
from kvsched.schedule.search import last_fitting

PrefillOrder = Literal["spf", "fcfs"]

#: Token budget, alpha and beta of every SLAI run in seed 000 Sec. 7.
PAPER_TOKEN_BUDGET = 512
PAPER_ALPHA = 128
PAPER_BETA = 128


class SLAI(EngineBase):
    """Seed 000's SLAI scheduler (Sec. 6), paper defaults: SLAI (SPF, dynamic offset) of Sec. 7.

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    token_budget
        tau, tokens per batch (512). The instance's C and P are never exceeded.
    alpha
        Cap on active requests (128); new prefills are admitted only below it.
        The instance's ``max_running`` is never exceeded.
    beta
        Decode limit: decodes per batch (128).
    offset
        delta (10): how many mean batch times before its deadline a decode
        becomes critical.
    dynamic_offset
        Use ``offset_low`` while KV-block occupancy is below ``memory_threshold``
        and ``offset`` from it on (the paper's dynamic variant: 5 / 10 at 96%).
    offset_low, memory_threshold
        See ``dynamic_offset``.
    prefill_order
        New prefills by shortest prompt first (``"spf"``) or arrival (``"fcfs"``).
    priority_first
        New prefills of a higher :attr:`Request.priority` first, whatever their
        prompt (App. F.2, "SLAI (SPF with priority)").
    default_tbt
        TBT SLO of requests that carry none (``None``: their decodes are always critical).
    """

    def __init__(
        self,
        name: str = "slai",
        *,
        token_budget: int | None = PAPER_TOKEN_BUDGET,
        alpha: int | None = PAPER_ALPHA,
        beta: int | None = PAPER_BETA,
        offset: float = 10.0,
        dynamic_offset: bool = True,
        offset_low: float = 5.0,
        memory_threshold: float = 0.96,
        prefill_order: PrefillOrder = "spf",
        priority_first: bool = False,
        default_tbt: float | None = None,
    ) -> None:
        super().__init__(name, token_budget=token_budget, max_running=alpha, running_param="alpha")
        check_positive("beta", beta)
        for label, value in (("offset", offset), ("offset_low", offset_low)):
            check_non_negative_number(label, value)  # (inf and True passed "a number >= 0")
        if not (isinstance(memory_threshold, int | float) and 0 < memory_threshold <= 1):
            raise ValueError(f"memory_threshold must be in (0, 1]; got {memory_threshold!r}")
        check_choice("prefill_order", prefill_order, PrefillOrder)
        for label, flag in (("dynamic_offset", dynamic_offset), ("priority_first", priority_first)):
            if not isinstance(flag, bool):
                raise ValueError(f"{label} must be true or false; got {flag!r}")
        if default_tbt is not None and not (
            isinstance(default_tbt, int | float)
            and not isinstance(default_tbt, bool)
            and math.isfinite(default_tbt)
            and default_tbt > 0
        ):
            raise ValueError(f"default_tbt must be a finite number > 0 or None; got {default_tbt!r}")
        self.beta = beta
        self.offset = float(offset)
        self.dynamic_offset = dynamic_offset
        self.offset_low = float(offset_low)
        self.memory_threshold = float(memory_threshold)
        self.prefill_order = prefill_order
        self.priority_first = priority_first
        self.default_tbt = default_tbt

    def _own_params(self) -> dict[str, Any]:
        return {
            "token_budget": self.token_budget,
            "alpha": self.max_running,
            "beta": self.beta,
            "offset": self.offset,
            "dynamic_offset": self.dynamic_offset,
            "offset_low": self.offset_low,
            "memory_threshold": self.memory_threshold,
            "prefill_order": self.prefill_order,
            "priority_first": self.priority_first,
            "default_tbt": self.default_tbt,
        }

    def __repr__(self) -> str:
        return f"SLAI({self.name!r})"

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        n = len(instance)
        reqs = instance.requests
        # SLOs and classes are known at arrival: reading them is not hindsight.
        tbt = [r.tbt_slo if r.tbt_slo is not None else self.default_tbt for r in reqs]
        self._tbt = np.array([np.nan if x is None else x for x in tbt], dtype=np.float64)
        self._always_critical = bool(np.isnan(self._tbt).all())  # no SLO anywhere: time never matters
        prompt = np.array([r.prompt for r in reqs], dtype=np.int64)
        priority = np.array([r.priority for r in reqs], dtype=np.int64)
        rank = np.zeros(n, dtype=np.int64) if self.prefill_order == "fcfs" else prompt
        self._new_key = (-priority if self.priority_first else np.zeros(n, dtype=np.int64), rank)
        self._emitted = np.zeros(n, dtype=np.float64)  # e_j
        self._seen = np.zeros(n, dtype=np.int64)  # generated count when last looked at
        self._started = np.zeros(n, dtype=bool)  # scheduled at least once
        self._busy = 0.0  # sum of batch durations
        self._num_batches = 0
        self._last: tuple[float, list[int]] | None = None  # start and members of the last batch
        self.offsets_used: list[float] = []

    @property
    def mean_batch_time(self) -> float:
        """t_batch: the running mean of the batch durations observed so far (0 before any)."""
        return self._busy / self._num_batches if self._num_batches else 0.0

    # ------------------------------------------------------------------ batches
    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._observe(view)
        decision = super().next_batch(view)
        if decision is not None and len(decision.requests):
            members = list(decision.requests)
            self._started[members] = True
            self._last = (view.now, members)
        else:
            self._last = None
        return decision

    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`), when no request has a TBT SLO.

        Then every decode is always critical (its last schedulable time is -inf), so
        the decodes rank in admission order whatever the clock, the mean batch time
        and the offset, and the batch depends only on the queues, the budgets and the
        reservations, as the engines' (:meth:`EngineBase._repeat_reserved_decodes`): the
        critical decodes are the same (beta and the budget are fixed); a started
        prefill skipped at call 0 had no room in the budget left, which is the same;
        the first waiting request that stopped admission still stops it (budgets and
        the running count are fixed, and the free reservation only shrinks); the run
        ends before the decodes' reservations stop fitting (a preemption). With a TBT
        SLO the critical set moves with the clock: no runs.

        The bookkeeping follows every repeat exactly: the offset each would have used
        (KV occupancy only grows, so the dynamic offset switches at most once), the
        batch times it would have observed (from :meth:`SchedulerView.run_starts`, added
        one by one) and the emission times.
        """
        if not self._always_critical or self._last is None:
            return 0
        k = self._repeat_reserved_decodes(view, decision, limit)
        if not k:
            return 0
        members = self._last[1]
        idx = np.asarray(members, dtype=np.int64)
        if self.dynamic_offset:
            cap = max(view.kv_block_capacity, 1)
            used, kv, b = view.kv_blocks_used, view.kv[idx], view.block_size
            base = int((-(-kv // b)).sum())

            def high(j: int) -> int:  # call j sees KV kv + j - 1
                grown = int((-(-(kv + j - 1) // b)).sum()) - base
                return int(j > 0 and not (used + grown) / cap < self.memory_threshold)

            low = last_fitting(high, 0, k)
            self.offsets_used += [self.offset_low] * low + [self.offset] * (k - low)
        else:
            self.offsets_used += [self.offset] * k
        starts = view.run_starts()[:k]
        gaps = np.diff(np.concatenate(([self._last[0]], starts)))
        self._busy = float(np.add.accumulate(np.concatenate(([self._busy], gaps)))[-1])
        self._num_batches += k
        self._emitted[idx] = starts[-1]
        self._seen[idx] = view.generated[idx] + (k - 1)
        self._last = (float(starts[-1]), members)
        return k

    def _observe(self, view: SchedulerView) -> None:
        """The last batch has just ended at ``view.now``: its duration and who emitted a token in it."""
        if self._last is None:
            return
        start, members = self._last
        self._busy += view.now - start
        self._num_batches += 1
        idx = np.asarray(members, dtype=np.int64)
        emitted = idx[view.generated[idx] > self._seen[idx]]
        self._emitted[emitted] = view.now
        self._seen[idx] = view.generated[idx]

    def _offset(self, view: SchedulerView) -> float:
        if not self.dynamic_offset:
            return self.offset
        used = view.kv_blocks_used / max(view.kv_block_capacity, 1)
        return self.offset_low if used < self.memory_threshold else self.offset

    def _compose(self, view: SchedulerView, draft: Draft) -> None:
        running = np.array(self._running, dtype=np.int64)
        decode = view.phase_of(running) == Phase.DECODE  # what is_decode says of each, at once
        decodes = running[decode].tolist()
        started = running[~decode].tolist()  # running mid-prefill or mid-refill, in admission order
        delta = self._offset(view)
        self.offsets_used.append(delta)
        if self._always_critical:  # every last schedulable time is -inf: admission order, all critical
            ranked, critical = decodes, len(decodes)
        else:
            last = self._emitted[decodes] + self._tbt[decodes] - delta * self.mean_batch_time
            last = np.where(np.isnan(last), -np.inf, last)  # no SLO: always critical
            order = np.argsort(last, kind="stable")  # ties keep admission order
            ranked = [decodes[k] for k in order]
            critical = int(np.searchsorted(last[order], view.now, side="right"))
        # (1)-(2) Critical decodes, closest to their deadline first.
        num_decodes = self._add_decodes(view, draft, ranked[:critical], 0)
        # (3) Started prefills: running mid-prefill, then preempted ones waiting to refill ...
        for r in started:  # (decodes are skipped here; the budget check is the same between them)
            if draft.tokens_left < 1:
                break
            if r in draft.members or r in draft.gone:
                continue
            c = draft.room(int(view.unprocessed(r)), prefill=True)
            if c >= 1 and self._make_room(view, draft, r, c):
                draft.add(r, c, prefill=True)
        # ... then new ones, SPF or FCFS, below alpha.
        self._admit_ordered(view, draft)
        # (4) Non-critical decodes, within beta.
        self._add_decodes(view, draft, ranked[critical:], num_decodes)

    def _add_decodes(self, view: SchedulerView, draft: Draft, ranked: list[int], count: int) -> int:
        limit = self.beta if self.beta is not None else len(ranked) + count
        i = 0
        while i < len(ranked):
            if draft.tokens_left < 1 or count >= limit:
                break
            if not draft.gone:
                # The leading decodes whose KV + 1 fits without preempting, at once: each would
                # have grown its reservation in turn (no one is preempted, so none is skipped).
                lead = ranked[i : i + min(draft.tokens_left, limit - count)]
                idx = np.array(lead, dtype=np.int64)
                k = self._kv.grow_leading(idx, view.kv[idx] + 1)
                if k:
                    draft.add_decodes(lead[:k])
                    count += k
                    i += k
                    continue
            r = ranked[i]  # one at a time: it preempts (or was preempted for this batch)
            i += 1
            if r in draft.gone:
                continue
            if self._make_room(view, draft, r, 1):
                draft.add(r, 1, prefill=False)
                count += 1
        return count

    def _admit_ordered(self, view: SchedulerView, draft: Draft) -> None:
        """Waiting requests: preempted ones (started) in queue order, then new ones by the prefill order.

        The first that does not fit in memory stops admission, as in the engines.
        """
        if not self._waiting:
            return
        waiting = list(self._waiting)
        started = [r for r in waiting if self._started[r]]
        fresh = np.array([r for r in waiting if not self._started[r]], dtype=np.int64)
        if fresh.size:
            pri, rank = self._new_key
            fresh = fresh[np.lexsort((rank[fresh], pri[fresh]))]  # stable: ties keep arrival order
        for r in started + fresh.tolist():
            if draft.tokens_left < 1 or draft.prefill_left < 1:
                break
            if self._R is not None and len(self._running) >= self._R:
                break
            if r in draft.gone:
                continue  # preempted for this very batch
            left = int(view.unprocessed(r))
            c = draft.room(left, prefill=True)
            if c < 1 or not self._kv.grow(r, self._reservation(view, r, left)):
                break
            self._waiting.remove(r)
            self._running.append(r)
            draft.add(r, c, prefill=True)

    def _reservation(self, view: SchedulerView, r: int, c: int) -> int:
        # The whole prompt (or refill) at admission, as Sarathi-Serve's vLLM-v0 block manager allocates it.
        return int(view.kv[r]) + int(view.unprocessed(r))


__all__ = ["PAPER_ALPHA", "PAPER_BETA", "PAPER_TOKEN_BUDGET", "SLAI", "PrefillOrder"]
