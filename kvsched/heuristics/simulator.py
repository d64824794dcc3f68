"""The iteration-level simulator: a policy drives the semantic core, batch by batch.

This is InferMax's Algorithm 1 outer loop (seed 003 Sec. 3.1): fetch the
arrived requests, ask the policy for the next batch, process it. Processing is
not re-implemented here: every batch is built by
:meth:`~kvsched.schedule.core.EngineState.make_batch` (phases and duration from
the cost model) and applied by :meth:`~kvsched.schedule.core.EngineState.step`,
which raises :class:`~kvsched.schedule.core.ScheduleError` if the policy asked
for something illegal. The result carries the same :class:`Trace` a replay of
the schedule would give.

The loop is :meth:`Stepper.run <kvsched.heuristics.step.Stepper.run>` (the
multi-engine lock-step run drives the same :class:`~kvsched.heuristics.step.Stepper`).
Coalesced runs: after a decode-only batch (no eviction, no completion), a policy
that opted in (:func:`~kvsched.heuristics.base.steady_decodes`) says how many
times in a row it would return that batch again, up to the next event (an
arrival, a completion, the KV capacity: :meth:`EngineState.run_limit`). Those
batches become one :class:`~kvsched.schedule.ir.Run`, checked and applied by the
core in one step (:meth:`EngineState.step_run`). The batches are exactly those
of batch-by-batch simulation; only their storage is shorter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsched.costmodel import CostModel
from kvsched.costmodel.base import expect_cost_model
from kvsched.errors import InputError
from kvsched.heuristics.base import Policy
from kvsched.heuristics.own import CheckedPolicy, is_own
from kvsched.heuristics.step import BATCHES_PER_TOKEN, Entry, Record, Stepper, batch_limit
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Schedule
from kvsched.schedule.records import ScheduleError
from kvsched.schedule.validate import Trace, instance_cost_model
from kvsched.stop import Deadline, DeadlineReached

if TYPE_CHECKING:
    from rich.progress import Progress


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
    #: Requests the policy had left when the deadline passed, finished by :func:`simulate`'s ``finish``
    #: (0: the policy's own schedule throughout).
    cut: int = 0

    def __repr__(self) -> str:
        # Short and cheap: the generated repr spelled out every batch's arrays (tens of seconds, megabytes).
        return (
            f"SimResult(policy={self.schedule.meta.get('policy')!r}, runtime={self.runtime:.3f}, "
            f"schedule={self.schedule!r}, trace={self.trace!r})"
        )


def simulate(
    instance: Instance,
    policy: Policy,
    cost_model: CostModel | None = None,
    *,
    progress: bool = False,
    coalesce: bool = True,
    deadline: Deadline | None = None,
    finish: Callable[[EngineState], Iterable[Entry]] | None = None,
    finish_seconds: float = 0.0,
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
    deadline
        Stop once it has passed (checked every :data:`DEADLINE_EVERY` entries): for callers that
        run a policy inside a time limit (a solver's warm starts), where a simulation of millions
        of batches must not outlast it.
    finish
        What completes a run the deadline cut short: ``finish(state)`` yields entries from the state the
        policy's batches leave, each checked and applied by the core before the next is asked for (e.g.
        :func:`~kvsched.csp.incumbents.complete.reserved_batches`). The result is then a complete, legal
        schedule that is no longer the policy's alone: ``cut`` says how many requests it left.
    finish_seconds
        With ``finish``: seconds finishing costs per request left (a high estimate). The policy stops once
        what is left of ``deadline`` falls below that times the requests left, so that the finished
        schedule is ready by the deadline.

    Raises
    ------
    ScheduleError
        The policy returned an illegal batch (the message names the rule).
    KvschedError
        The policy stalled (returned nothing while requests remain and none is
        still to arrive), evicted without scheduling anything, or ran past
        :func:`batch_limit` batches (an eviction loop).
    InputError
        ``instance`` is not an :class:`Instance`, or ``policy`` is a name rather than a policy.
    DeadlineReached
        ``deadline`` passed before the last request completed and no ``finish`` was given (nothing is
        returned); a :class:`~kvsched.errors.KvschedError` whose message says how many requests were done.
    """
    expect_instance(instance)
    if isinstance(policy, str):
        raise InputError(
            f"policy: expected a Policy, got the name {policy!r}: use kvsched.make_policy({policy!r})"
        )
    if not isinstance(policy, Policy):
        raise InputError(f"policy: expected a Policy (kvsched.make_policy), got {type(policy).__name__}")
    if cost_model is not None:
        expect_cost_model(cost_model)
    if deadline is not None and not isinstance(deadline, Deadline):
        raise InputError(
            f"deadline: expected a kvsched.Deadline (Deadline.after(seconds)), got {type(deadline).__name__}"
        )
    instance.check_feasible()
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    wall = time.perf_counter()
    if is_own(policy):  # a scheduler of one's own: its decisions' form is checked (registered ones skip it)
        policy = CheckedPolicy(policy)
    stepper = Stepper(instance, policy, cost_model, coalesce=coalesce)
    bar = _progress_bar() if progress else None
    with bar if bar is not None else nullcontext():
        on_record: Callable[[Record], None] | None = None
        if bar is not None:
            task = bar.add_task(policy.name, total=len(instance))

            def advance_bar(record: Record) -> None:
                completed = record.completed.size
                if completed:
                    bar.advance(task, completed)

            on_record = advance_bar
        if deadline is not None and deadline.bounded:
            reserve = (stepper.state, finish_seconds) if finish is not None else None
            on_record = _checking(deadline, on_record, reserve)
        cut = 0
        try:
            stepper.run(on_record)
        except DeadlineReached:  # (a KvschedError) the user's, or a solver stage's that catches it
            if finish is None:
                raise DeadlineReached(
                    f"simulate: the deadline passed before the last request completed "
                    f"({stepper.state.num_done:,} of {len(instance):,} done)"
                ) from None
            cut = len(instance) - stepper.state.num_done
            for entry in finish(stepper.state):
                stepper.commit(entry)  # checked and applied by the core, as the policy's own are
            unfinished = stepper.state.finish()
            if unfinished:  # a finisher that left requests: named as the core sees it
                raise ScheduleError(unfinished) from None
    meta = {"policy": policy.name, "params": dict(policy.params)}
    if cut:
        meta["cut_for_time"] = cut
    schedule = Schedule(tuple(stepper.entries), meta)
    trace = Trace(instance, stepper.state, stepper.records)
    return SimResult(schedule, trace, time.perf_counter() - wall, cut)


#: A bounded deadline is read once every this many entries (a clock read each is about 1% of an entry).
DEADLINE_EVERY = 64


def _checking(
    deadline: Deadline, then: Callable[[Record], None] | None, reserve: tuple[EngineState, float] | None
) -> Callable[[Record], None]:
    """An ``on_record`` that raises :class:`~kvsched.stop.DeadlineReached` once ``deadline`` has
    passed (read every :data:`DEADLINE_EVERY` records), after calling ``then``; with ``reserve`` (the
    state and the seconds finishing costs per request left), once what is left no longer covers that."""
    seen = 0

    def on_record(record: Record) -> None:
        nonlocal seen
        if then is not None:
            then(record)
        seen += 1
        if seen % DEADLINE_EVERY == 0:
            if reserve is not None:
                state, per_request = reserve
                if deadline.remaining() <= per_request * (state.n - state.num_done):
                    raise DeadlineReached
            deadline.check()

    return on_record


def _progress_bar() -> Progress:
    # Imported here: rich's progress and live modules cost every command without a bar 4 ms.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
    )


__all__ = ["BATCHES_PER_TOKEN", "SimResult", "batch_limit", "simulate"]
