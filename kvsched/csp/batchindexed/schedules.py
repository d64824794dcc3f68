"""Schedules of the batch-indexed class: warm starts, retiming, symmetry and the normal form.

The normal form (unit time, no C and no P) is what the dominance rows keep: see
"Strengthening" in the package docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from kvsched.csp.batchindexed.data import WARM_POLICIES, BatchData
from kvsched.csp.model import INF
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.retime import retime
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline, DeadlineReached


class ScheduleForms(BatchData):
    """The batch-indexed class's schedules, on top of its data."""

    def sequential_schedule(self) -> Schedule:
        """One request at a time, by arrival: prompt in chunks of min(C, P), then decodes. Always legal."""
        state = EngineState(self.instance, self.cost)
        lim = self.instance.limits
        chunk = min(c for c in (lim.max_batch_tokens, lim.max_prefill_tokens, 10**18) if c is not None)
        batches = []
        for i in np.lexsort((np.arange(self.n), self.arrival)):
            left = int(self.prompt[i])
            while not state.done[i]:
                tok = min(chunk, left) if left > 0 else 1
                left -= tok
                start = max(state.clock, float(self.instance.requests[i].arrival))
                b = state.make_batch(start, [int(i)], [tok])
                state.step(b)
                batches.append(b)
        return Schedule(tuple(batches), {"policy": "sequential"})

    def warm_starts(
        self, deadline: Deadline | None = None, batch_rate: float = math.inf
    ) -> list[tuple[Schedule, str]]:
        """The class's schedules to start a model from, each with its label.

        The sequential schedule, then each of :data:`WARM_POLICIES`' schedules that is in the class,
        retimed; with :attr:`normal_form`, each of those in normal form too (the dominance rows keep
        the normal form). The driver offers them as incumbents and the tests take their hints from
        them (:meth:`warm_start`).

        Parameters
        ----------
        deadline
            Stops the policy runs once it passes, keeping the schedules made (None: never).
        batch_rate
            Batches a model can be built over per second left: a policy's schedule of more batches
            than this many times the seconds left is skipped, since it could only be an incumbent,
            and spelling out its batches (retimed, replayed, normalised) would take the time the
            others need: long prompts in chunks make hundreds of thousands of them.
        """
        deadline = deadline or Deadline.never()
        out = [(self.sequential_schedule(), "sequential")]
        for name in WARM_POLICIES:
            if deadline.expired():
                break
            try:
                sched = simulate(self.instance, make_policy(name), deadline=deadline).schedule
            except KvschedError:
                continue
            except DeadlineReached:  # a policy's run outlasts the time limit: keep the warm starts made
                break
            if len(sched) > batch_rate * deadline.remaining() or not self.in_class(sched):
                continue
            try:
                out.append((self.retimed(sched, deadline), f"heuristic {name}"))
            except DeadlineReached:  # runs of millions of batches, spelled out one by one
                break
        if self.normal_form:
            out += [(self.normalised(sched), f"{label}, normalised") for sched, label in out]
        return out

    def warm_start(self, deadline: Deadline | None = None) -> Schedule:
        """The best of :meth:`warm_starts` by the objective (the first of equal ones)."""
        best, best_value = None, INF
        for sched, _ in self.warm_starts(deadline):
            val = self.value(sched)
            if val < best_value - 1e-12:
                best, best_value = sched, val
        assert best is not None  # the sequential schedule is always in the class
        return best

    def in_class(self, schedule: Schedule) -> bool:
        """Whether ``schedule`` is legal and (without eviction) evicts nothing."""
        try:
            replay(self.instance, schedule)
        except KvschedError:
            return False
        return self.allow_eviction or all(b.evicted.size == 0 for b in schedule.batches)

    def retimed(self, schedule: Schedule, deadline: Deadline | None = None) -> Schedule:
        """``schedule`` with every batch started as early as its predecessor and its arrivals allow
        (raises :class:`~kvsched.stop.DeadlineReached` once ``deadline`` has passed)."""
        return retime(self.instance, schedule, self.cost, check=True, deadline=deadline)

    def identical_groups(self) -> list[list[int]]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in range(self.n):
            groups[(int(self.prompt[i]), int(self.output[i]), float(self.arrival[i]))].append(i)
        return [g for g in groups.values() if len(g) > 1]

    def canonical(self, schedule: Schedule) -> Schedule:
        """``schedule`` with identical requests relabelled so that they complete in index order."""
        st = replay(self.instance, schedule).state
        new_pos = np.arange(self.n)
        for group in self.identical_groups():
            order = sorted(group, key=lambda i: (st.completion[i], st.first_token[i], i))
            for pos, old in zip(group, order, strict=True):
                new_pos[old] = pos
        if np.array_equal(new_pos, np.arange(self.n)):
            return schedule
        batches = tuple(
            Batch.of(b.start, b.duration, new_pos[b.requests], b.tokens, b.phases, new_pos[b.evicted])
            for b in schedule.batches
        )
        return Schedule(batches, dict(schedule.meta))

    def token_batches(self, schedule: Schedule) -> list[list[int]]:
        """For each request, the (1-based) batches in which it generates its tokens, replayed."""
        state = EngineState(self.instance, self.cost)
        out: list[list[int]] = [[] for _ in range(self.n)]
        for j, b in enumerate(schedule.batches, start=1):
            before = state.generated.copy()
            state.step(b)
            for i in np.flatnonzero(state.generated > before):
                out[int(i)].append(j)
        return out

    def normal_times(self, schedule: Schedule) -> list[list[int]]:
        """Token batches of ``schedule`` in normal form (:attr:`normal_form` instances only).

        Batches in which no request generates are dropped; with
        :attr:`left_shift`, a request's next token moves into an earlier batch
        while it fits there (KV during the batch: the generated tokens' weights
        ``I + k - 1``), repeated to a fixed point; identical requests (same I, O
        and arrival) then take, for each k, their k-th token batches in sorted
        order, so the first of them is never behind. No request completes later
        (identical ones trade completions), so the objective does not grow; each
        batch keeps its multiset of (token index, weight) items, and loads only
        fall.
        """
        times = self.token_batches(schedule)
        weight = [self.prompt[i] + np.arange(self.output[i]) for i in range(self.n)]
        while True:
            used = sorted({j for t in times for j in t})
            renum = {j: pos for pos, j in enumerate(used, start=1)}
            times = [[renum[j] for j in t] for t in times]
            if not self.left_shift:
                break
            load = np.zeros(len(used) + 1, dtype=np.int64)
            for i, t in enumerate(times):
                np.add.at(load, t, weight[i])
            moved = False
            for j in range(1, len(used) + 1):
                for i, t in enumerate(times):
                    k = int(np.searchsorted(t, j))  # tokens generated before batch j
                    if k == len(t) or t[k] == j or load[j] + weight[i][k] > self.kv_cap:
                        continue
                    load[t[k]] -= weight[i][k]
                    load[j] += weight[i][k]
                    t[k] = j
                    moved = True
            if not moved:
                break
        for group in self.identical_groups():
            for k in range(int(self.output[group[0]])):
                for i, j in zip(group, sorted(times[i][k] for i in group), strict=True):
                    times[i][k] = j
        return times

    def schedule_of_tokens(self, times: list[list[int]], meta: dict | None = None) -> Schedule:
        """The normal-form schedule in which request i generates its k-th token in batch ``times[i][k-1]``.

        Each request processes all its unprocessed tokens in the batches where
        it generates and nothing else; with evictions allowed, every request
        that sits a batch out while holding KV is evicted in it. Batches start
        as early as the previous end and their arrivals allow. Stepped through
        the core (raises ScheduleError if illegal, e.g. over M).
        """
        state = EngineState(self.instance, self.cost)
        arr = np.array([r.arrival for r in self.instance.requests])
        running: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(times):
            for j in t:
                running[j].append(i)
        batches = []
        for j in sorted(running):
            run = np.array(running[j], dtype=np.int64)
            held = np.flatnonzero(state.kv > 0)
            ev = [int(i) for i in held if i not in running[j]] if self.allow_eviction else []
            start = max(state.clock, float(arr[run].max()))
            b = state.make_batch(start, run, state.unprocessed(run), ev)
            state.step(b)
            batches.append(b)
        return Schedule(tuple(batches), dict(meta or {}))

    def normalised(self, schedule: Schedule) -> Schedule:
        """``schedule`` in the normal form that the dominance rows keep (see :meth:`normal_times`)."""
        return self.schedule_of_tokens(self.normal_times(schedule), schedule.meta)
