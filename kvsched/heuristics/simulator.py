"""The iteration-level simulator: a policy drives the semantic core, batch by batch.

This is InferMax's Algorithm 1 outer loop (seed 003 Sec. 3.1): fetch the
arrived requests, ask the policy for the next batch, process it. Processing is
not re-implemented here: every batch is built by
:meth:`~kvsched.schedule.core.EngineState.make_batch` (phases and duration from
the cost model) and applied by :meth:`~kvsched.schedule.core.EngineState.step`,
which raises :class:`~kvsched.schedule.core.ScheduleError` if the policy asked
for something illegal. The result carries the same :class:`Trace` a replay of
the schedule would give.

Coalesced runs: after a decode-only batch (no eviction, no completion), a
policy that opted in (:func:`~kvsched.heuristics.base.steady_decodes`) says how
many times in a row it would return that batch again, up to the next event (an
arrival, a completion, the KV capacity: :meth:`EngineState.run_limit`). Those
batches become one :class:`~kvsched.schedule.ir.Run`, checked and applied by the
core in one step (:meth:`EngineState.step_run`). The batches are exactly those
of batch-by-batch simulation; only their storage is shorter.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvsched.costmodel import CostModel
from kvsched.errors import KvschedError
from kvsched.heuristics.base import Decision, Policy, SchedulerView, SteadyDecodes, steady_decodes
from kvsched.instances.model import Instance
from kvsched.schedule.core import TIME_TOL, EngineState
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Run, Schedule, batch_starts
from kvsched.schedule.validate import Trace, instance_cost_model

#: Batches allowed per token of work (sum of I + O) before a run counts as an eviction loop.
BATCHES_PER_TOKEN = 50


@dataclass(frozen=True, slots=True, eq=False)
class SimResult:
    """The outcome of :func:`simulate`.

    Parameters
    ----------
    schedule
        The batches the policy produced; ``meta`` holds ``policy`` and ``params``.
    trace
        The run's trace (final state and per-batch records), as
        :func:`~kvsched.schedule.validate.replay` of ``schedule`` would build it.
    runtime
        Wall-clock seconds the simulation took.
    """

    schedule: Schedule
    trace: Trace
    runtime: float


def batch_limit(instance: Instance) -> int:
    """The most batches a run may take before it is reported as an eviction loop."""
    return BATCHES_PER_TOKEN * ProblemData.of(instance).work + len(instance)


def simulate(
    instance: Instance,
    policy: Policy,
    cost_model: CostModel | None = None,
    *,
    progress: bool = False,
    coalesce: bool = True,
) -> SimResult:
    """Run ``policy`` on ``instance`` until every request completes.

    Parameters
    ----------
    instance
        The workload; it is checked for feasibility first (a request with
        I + O - 1 > M could only be evicted forever).
    policy
        The scheduler; :meth:`Policy.reset` is called first.
    cost_model
        Batch durations; defaults to the instance's own time model.
    progress
        Show a progress bar of completed requests.
    coalesce
        Let a policy that opted in repeat a decode-only batch as one
        :class:`~kvsched.schedule.ir.Run` (same batches, shorter storage).

    Raises
    ------
    ScheduleError
        The policy returned an illegal batch (the message names the rule).
    KvschedError
        The policy stalled (returned nothing while requests remain and none is
        still to arrive), evicted without scheduling anything, or ran past
        :func:`batch_limit` batches (an eviction loop).
    """
    instance.check_feasible()
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    wall = time.perf_counter()
    state = EngineState(instance, cost_model)
    view = SchedulerView(state, expose_output=policy.uses_true_output)
    policy.reset(instance)
    trace = Trace(instance, state)
    entries: list[Batch | Run] = []
    num_batches = 0
    limit = batch_limit(instance)
    now = 0.0
    steady = steady_decodes(policy) if coalesce else None

    bar = _progress_bar() if progress else None
    with bar if bar is not None else nullcontext():
        task = bar.add_task(policy.name, total=len(instance)) if bar is not None else None
        # Bound once: this loop runs once per policy call (tens of thousands of times).
        next_batch, make_batch, step = policy.next_batch, state.make_batch, state.step
        add_entry, add_record = entries.append, trace.entries.append
        n = state.n
        while state.num_done < n:
            clock = state.clock
            if clock > now:
                now = clock
            view._advance(now)
            decision = next_batch(view)
            if decision is None or not len(decision.requests):
                if decision is not None and len(decision.evict):
                    raise KvschedError(
                        f"policy {policy.name!r} evicted {len(decision.evict)} request(s) at t={now:g} "
                        "but scheduled nothing to run"
                    )
                upcoming = view.next_arrival()
                if upcoming is None:
                    left = state.n - state.num_done
                    raise KvschedError(
                        f"policy {policy.name!r} stalled at t={now:g} with {left} unfinished "
                        f"request{'s' * (left != 1)} and none still to arrive"
                    )
                now = upcoming  # idle until the next arrival
                continue
            if num_batches >= limit:
                raise KvschedError(
                    f"policy {policy.name!r} ran {limit} batches without finishing "
                    f"({state.n - state.num_done} requests left, {int(state.evictions.sum())} "
                    "evictions so far): probably an eviction loop"
                )
            batch = make_batch(now, decision.requests, decision.tokens, decision.evict)
            record = step(batch)
            add_entry(batch)
            add_record(record)
            num_batches += 1
            completed = record.completed.size
            decode_only = record.num_decodes == record.num_items and not batch.evicted.size
            if steady is not None and decode_only and not completed and num_batches < limit:
                run = _repeat(state, view, steady, decision, batch)
                if run is not None:
                    run_record = state.step_run(run)
                    add_entry(run)
                    add_record(run_record)
                    num_batches += run.repeat
                    completed = run_record.completed.size
            if bar is not None and task is not None and completed:
                bar.advance(task, completed)

    schedule = Schedule(tuple(entries), {"policy": policy.name, "params": dict(policy.params)})
    return SimResult(schedule, trace, time.perf_counter() - wall)


def _repeat(
    state: EngineState, view: SchedulerView, policy: SteadyDecodes, decision: Decision, batch: Batch
) -> Run | None:
    """The run of repeats of decode-only ``batch`` that ``policy`` would ask for next, if any."""
    req = batch.requests
    limit, durations = state.plan_run(req)
    if not limit:
        return None
    upcoming = view.next_arrival()  # the first request the policy has not seen (view.now is the decision's)
    if upcoming is not None:
        # A batch that starts once the next request has arrived sees it: the run stops before.
        starts = batch_starts(state.clock, durations)  # a fresh array
        starts += TIME_TOL
        limit = int(starts.searchsorted(upcoming, "left"))
        if not limit:
            return None
    k = policy.repeat_decodes(view, decision, limit)
    if not k:
        return None
    return state.make_run(state.clock, req, k)


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
    )


__all__ = ["BATCHES_PER_TOKEN", "SimResult", "batch_limit", "simulate"]
