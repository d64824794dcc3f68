"""Replay a schedule through the semantic core: the validator.

:func:`replay` runs a schedule batch by batch through
:class:`~kvsched.schedule.core.EngineState` and returns a :class:`Trace` (the
records the metrics are computed from). In strict mode the first illegal
batch raises; otherwise every violation is collected and replay goes on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvsched.costmodel import CostModel
from kvsched.costmodel.base import expect_cost_model
from kvsched.errors import InputError
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.core import BatchRecord, EngineState, ScheduleError, Violation
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Run, Schedule, expect_schedule
from kvsched.schedule.records import RunRecord, expand_records


@dataclass(eq=False)
class Trace:
    """The outcome of replaying a schedule: final state, per-batch and per-run records, violations.

    ``entries`` holds one :class:`BatchRecord` per batch and one :class:`RunRecord`
    per coalesced run (followed by its ``tail``'s :class:`BatchRecord` when it
    ends with its prompt's last chunk), in order; :attr:`records` spells the runs out.
    """

    instance: Instance
    state: EngineState
    entries: list[BatchRecord | RunRecord] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def records(self) -> list[BatchRecord]:
        """One record per batch (runs expanded: built on each call, so read it once)."""
        if not any(type(e) is RunRecord for e in self.entries):
            return self.entries  # type: ignore[return-value]
        return expand_records(self.entries)

    @property
    def num_batches(self) -> int:
        return sum(e.repeat if type(e) is RunRecord else 1 for e in self.entries)

    def __repr__(self) -> str:
        # Short and cheap: the generated repr spelled out the instance, the engine state and every record.
        name = self.instance.name or "unnamed"
        return (
            f"<Trace of {name!r}: {len(self.instance):,} requests, {self.num_batches:,} batches, "
            f"{len(self.violations):,} violations>"
        )


def expect_trace(value: object, name: str = "trace", instance: Instance | None = None) -> Trace:
    """``value`` if it is a :class:`Trace` (of ``instance``, where given), else one
    :class:`~kvsched.errors.InputError` naming ``name`` (a simulation's or a solve's result is the common
    mistake: its ``.trace`` is the trace)."""
    if not isinstance(value, Trace):
        hint = " (pass its .trace)" if isinstance(getattr(value, "trace", None), Trace) else ""
        raise InputError(
            f"{name}: expected a Trace (kvsched.validate or a run's .trace), got {type(value).__name__}{hint}"
        )
    # (Equal instances loaded twice are two objects: compared by value where they are not one.)
    if instance is not None and value.instance is not instance and value.instance != instance:
        raise InputError(f"{name}: a replay of another instance ({value.instance.name or 'unnamed'})")
    return value


def instance_cost_model(instance: Instance) -> CostModel:
    """The cost model an instance names (built once per instance: :class:`ProblemData`)."""
    return ProblemData.of(instance).cost_model


def replay(
    instance: Instance,
    schedule: Schedule,
    cost_model: CostModel | None = None,
    *,
    strict: bool = True,
    check_durations: bool = True,
    then: Callable[[EngineState], Iterable[Batch | Run]] | None = None,
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
    then
        Entries that continue ``schedule``, made from the state it leaves: a generator function, whose
        ``then(state)`` is first resumed after the schedule's last entry, and each entry it yields is checked and applied like the
        schedule's own before the next is asked for (a producer may read the state as it goes, e.g.
        :func:`~kvsched.csp.incumbents.complete.reserved_batches`). The caller keeps what it yields.
    """
    expect_instance(instance)
    expect_schedule(schedule)
    if cost_model is not None:
        expect_cost_model(cost_model)
    if then is not None and not callable(then):
        raise InputError(
            f"then: expected a function of the engine state (or None), got {type(then).__name__}"
        )
    if cost_model is None and check_durations:
        cost_model = instance_cost_model(instance)
    state = EngineState(instance, cost_model if check_durations else None)
    trace = Trace(instance, state)
    k = 0  # index of the next batch
    entries: Iterable[Batch | Run] = schedule.entries
    if then is not None:
        # (then(state) is a generator: its body first runs once the schedule's entries are applied.)
        entries = itertools.chain(entries, then(state))
    for entry in entries:
        if type(entry) is Run:
            found = state.check_run(entry, k)
            if not found:
                record = state.apply_run(entry)
                trace.entries.append(record)
                if record.tail is not None:  # a run that ends with its prompt's last chunk
                    trace.entries.append(record.tail)
                k += entry.repeat
                continue
            if strict:
                raise ScheduleError(found)
            trace.violations.extend(found)
            for batch in entry.batches():  # keep replaying an illegal run batch by batch
                trace.entries.append(state.apply(batch))
            k += entry.repeat
            continue
        found, record = state.check_and_apply(entry, k)
        if found:
            if strict:
                raise ScheduleError(found)
            trace.violations.extend(found)
        trace.entries.append(record)
        k += 1
    unfinished = state.finish()
    if unfinished and strict:
        raise ScheduleError(unfinished)
    trace.violations.extend(unfinished)
    return trace


def validate(instance: Instance, schedule: Schedule, cost_model: CostModel | None = None) -> Trace:
    """Every violation of ``schedule`` (empty ``trace.violations`` means legal)."""
    return replay(instance, schedule, cost_model, strict=False)
