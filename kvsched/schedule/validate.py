"""Replay a schedule through the semantic core: the validator.

:func:`replay` runs a schedule batch by batch through
:class:`~kvsched.schedule.core.EngineState` and returns a :class:`Trace` (the
records the metrics are computed from). In strict mode the first illegal
batch raises; otherwise every violation is collected and replay goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsched.costmodel import CostModel, make_cost_model
from kvsched.instances.model import Instance
from kvsched.schedule.core import BatchRecord, EngineState, ScheduleError, Violation
from kvsched.schedule.ir import Schedule


@dataclass(eq=False)
class Trace:
    """The outcome of replaying a schedule: final state, per-batch records, violations."""

    instance: Instance
    state: EngineState
    records: list[BatchRecord] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def instance_cost_model(instance: Instance) -> CostModel:
    """The cost model an instance names."""
    return make_cost_model(instance.time_model.name, instance.time_model.params)


def replay(
    instance: Instance,
    schedule: Schedule,
    cost_model: CostModel | None = None,
    *,
    strict: bool = True,
    check_durations: bool = True,
) -> Trace:
    """Replay ``schedule`` on ``instance`` through the semantic core.

    Parameters
    ----------
    cost_model
        The model durations must match; defaults to the instance's own.
    strict
        Raise :class:`ScheduleError` on the first illegal batch (or on
        unfinished requests at the end). With ``strict=False`` every violation
        is collected in the trace instead.
    check_durations
        Check each batch's duration against the cost model. Turn off to replay
        a schedule with measured (not modelled) durations.
    """
    if cost_model is None and check_durations:
        cost_model = instance_cost_model(instance)
    state = EngineState(instance, cost_model if check_durations else None)
    trace = Trace(instance, state)
    for k, batch in enumerate(schedule.batches):
        found = state.check(batch, k)
        if found:
            if strict:
                raise ScheduleError(found)
            trace.violations.extend(found)
        trace.records.append(state.apply(batch))
    unfinished = state.finish()
    if unfinished and strict:
        raise ScheduleError(unfinished)
    trace.violations.extend(unfinished)
    return trace


def validate(instance: Instance, schedule: Schedule, cost_model: CostModel | None = None) -> Trace:
    """Every violation of ``schedule`` (empty ``trace.violations`` means legal)."""
    return replay(instance, schedule, cost_model, strict=False)
