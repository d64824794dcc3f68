"""Retiming: the same batches on a new timeline, each started as early as it may.

A schedule's batches (requests, tokens, evictions) fix what runs; retiming
gives them new durations and starts them back to back: batch ``k`` starts at
``max(end of batch k - 1, last arrival among its requests)`` (the first at
``max(0, ...)``; a batch with no items at the previous end). The durations come
either from given numbers (measured times) or from a cost model, in which case
every batch is rebuilt by the semantic core
(:meth:`~kvsched.schedule.core.EngineState.make_batch`: phases derived from the
state, duration from the cost model), so a producer that only knows requests
and tokens (an InferMax import, a solver's batch sequence) never restates the
rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvsched.costmodel import CostModel
from kvsched.errors import InputError
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Schedule, bind_instance, expect_schedule_of
from kvsched.stop import Deadline

#: A bounded deadline is read once every this many batches.
DEADLINE_EVERY = 4096


def retime(
    instance: Instance,
    schedule: Schedule,
    timing: CostModel | Sequence[float] | np.ndarray,
    *,
    check: bool = False,
    deadline: Deadline | None = None,
) -> Schedule:
    """``schedule``'s batches back to back, each started as early as its predecessor and arrivals allow.

    Parameters
    ----------
    instance
        The problem (arrival times; with a cost model, the state the batches act on).
    schedule
        The batches to retime; their starts and durations are ignored, ``meta`` is kept.
    timing
        A :class:`~kvsched.costmodel.CostModel`: every batch is rebuilt by the core
        from its requests, tokens and evictions (phases re-derived, duration from the
        model) and applied to an engine state; or one duration per batch: the batches
        keep their items and phases as they are.
    check
        Apply every batch with :meth:`~kvsched.schedule.core.EngineState.step`, which
        raises :class:`~kvsched.schedule.core.ScheduleError` on the first illegal one
        (durations checked only against a cost model). By default a cost-model retime
        applies batches unchecked (:meth:`~kvsched.schedule.core.EngineState.apply`:
        legality is then the validator's verdict) and a duration retime does not
        replay the batches at all.
    deadline
        Stop once it has passed (read every :data:`DEADLINE_EVERY` batches): a schedule of
        coalesced runs can stand for millions of batches, and retiming spells each out.

    Raises
    ------
    InputError
        When ``timing`` is neither a cost model nor numbers, or the number of durations differs
        from the number of batches.
    DeadlineReached
        ``deadline`` passed before the last batch.
    """
    expect_instance(instance)
    # (another instance's schedule read for it, same size and ids: refused, not retimed on wrong arrivals)
    count = len(expect_schedule_of(schedule, instance))
    # Duck-typed like the core: any object with batch_time is a cost model (the protocol also names `name`).
    if hasattr(timing, "batch_time"):
        cost_model: CostModel | None = timing  # type: ignore[assignment]
        durations = None
    else:
        cost_model = None
        try:
            durations = np.asarray(timing, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InputError(
                f"timing: expected a cost model or one duration per batch, got {type(timing).__name__}"
            ) from None
        if durations.size != count:
            raise InputError(f"timing: {durations.size} durations for {count} batches")
        bad = np.flatnonzero(~(np.isfinite(durations) & (durations > 0)))
        if bad.size:  # a NaN or negative duration once went on into a schedule file no reader accepts
            k = int(bad[0])
            raise InputError(
                f"timing: batch {k}'s duration is {float(durations[k])!r}; durations are finite and > 0"
            )
    state = EngineState(instance, cost_model) if cost_model is not None or check else None
    arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64)
    out = []
    clock = 0.0
    watch = deadline is not None and deadline.bounded
    # The batches one by one (a run's spelled out as they come, none kept but the retimed ones).
    for k, b in enumerate(schedule):
        if watch and k % DEADLINE_EVERY == 0:
            deadline.check()  # type: ignore[union-attr]
        start = max(clock, float(arrival[b.requests].max())) if b.requests.size else clock
        if state is not None and cost_model is not None:
            nb = state.make_batch(start, b.requests, b.tokens, b.evicted)
        else:
            assert durations is not None
            nb = Batch.of(start, float(durations[k]), b.requests, b.tokens, b.phases, b.evicted)
        if state is not None:
            if check:
                state.step(nb)
            else:
                state.apply(nb)
        out.append(nb)
        clock = nb.end
    # The same batches on the same instance: the binding to it goes with them.
    return bind_instance(Schedule(tuple(out), dict(schedule.meta)), schedule._instance)


__all__ = ["retime"]
