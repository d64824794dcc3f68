"""The record of one solve: its clock, the bounds and schedules it has seen, and its progress reports.

The driver (:mod:`kvsched.csp.driver`) and the certified pipeline
(:mod:`kvsched.csp.pipeline`) both keep one, so that every schedule they see is
checked against every bound (:func:`kvsched.csp.certify.check_bounds`) and the
anytime curve (incumbent and bound over time) is the same kind of record.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvsched.csp.certificate import Bound, Scope, scope_of
from kvsched.csp.certify import Seen
from kvsched.csp.objectives import objective_function, objective_origin
from kvsched.csp.result import AnytimePoint
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import Trace, replay
from kvsched.stop import Deadline

Progress = Callable[[AnytimePoint], None]

#: Batches the semantic core replays per second, generously (a quiet 2-core machine does 10-50 thousand).
#: A schedule that cannot be replayed in the time left cannot be returned validated.
REPLAY_BATCHES_PER_SECOND = 200_000


def least_batches(instance: Instance) -> int:
    """Batches every legal schedule of ``instance`` has: a request's prompt in chunks of at most
    min(C, P) tokens and then one decode per batch, run alone (batches never overlap)."""
    lim = instance.limits
    caps = [c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None]
    q = min(caps) if caps else None
    return (
        max((-(-r.prompt // q) if q else 1) + r.output - 1 for r in instance.requests) if len(instance) else 0
    )


def check_replayable(instance: Instance, deadline: Deadline) -> None:
    """One clear error when no schedule of ``instance`` could even be replayed by ``deadline``."""
    if not isinstance(deadline, Deadline):  # (solve's deadline=5 met an AttributeError here)
        raise InputError(
            f"deadline: expected a kvsched.Deadline (Deadline.after(seconds)), got {type(deadline).__name__}"
        )
    need = least_batches(instance)
    left = deadline.remaining() + deadline.grace()
    if need > REPLAY_BATCHES_PER_SECOND * left:
        raise InputError(
            f"every schedule of this instance has at least {need:,} batches (request prompts in chunks of "
            f"at most min(C, P) tokens, then one decode per batch); validating one takes longer than the "
            f"{deadline.limit:g} s limit allows: raise --time-limit"
        )


class SolveLog:
    """The state of one solve: its clock, what it has seen, and its progress reports."""

    def __init__(self, instance: Instance, objective: str, progress: Progress | None) -> None:
        self.instance = instance
        self.measure = objective_function(objective)
        #: Where the objective counts from (tolerances between its values scale with the value less it).
        self.origin = objective_origin(instance, objective)
        self.started = time.perf_counter()
        self.progress = progress
        self.points: list[AnytimePoint] = []
        self.bounds: list[Bound] = []
        self.seen: list[Seen] = []
        self.best_value: float | None = None
        self._best_trace: tuple[float, Trace] | None = None
        self._pending: dict[int, Trace] = {}
        self._replayed: dict[int, Trace] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def report(self, incumbent: float | None = None, bound: float | None = None) -> None:
        if incumbent is not None:
            self.best_value = incumbent if self.best_value is None else min(self.best_value, incumbent)
        best = max((b.value for b in self.bounds), default=None) if bound is None else bound
        point = AnytimePoint(self.elapsed(), self.best_value, best)
        self.points.append(point)
        if self.progress is not None:
            self.progress(point)

    def add_bound(self, bound: Bound | None) -> None:
        if bound is not None:
            self.bounds.append(bound)

    def evaluate(
        self, schedule: Schedule, what: str, scope: Scope | None = None, *, incumbent: bool = True
    ) -> float:
        """Replay ``schedule`` strictly (raises if illegal) and remember its value and scope.

        ``incumbent=False``: a schedule that may lie outside the result's scope; it
        is checked against every bound of its own scope but not reported as the
        best schedule (the caller reports it once it knows it is in scope).
        """
        trace = self._replayed.pop(id(schedule), None) or replay(self.instance, schedule)
        value = self.measure(trace)
        if incumbent and (self._best_trace is None or value < self._best_trace[0]):
            self._best_trace = (value, trace)  # the result reuses it: no second replay
        self.record(value, what, scope or scope_of(schedule), incumbent=incumbent)
        if not incumbent:
            self._pending[id(schedule)] = trace
        return value

    def replayed(self, schedule: Schedule, trace: Trace) -> None:
        """Let the first :meth:`evaluate` of ``schedule`` read ``trace``, its strict replay made elsewhere
        (the caller keeps ``schedule`` alive: the key is its identity)."""
        self._replayed[id(schedule)] = trace

    def adopt(self, schedule: Schedule, value: float) -> None:
        """Report a schedule evaluated with ``incumbent=False`` as in scope after all."""
        trace = self._pending.pop(id(schedule), None)
        if trace is not None and (self._best_trace is None or value < self._best_trace[0]):
            self._best_trace = (value, trace)
        self.report(incumbent=value)

    def record(self, value: float, what: str, scope: Scope, *, incumbent: bool = True) -> None:
        """Remember the value of a schedule that the semantic core has already replayed."""
        self.seen.append(Seen(value, scope, what))
        if incumbent:
            self.report(incumbent=value)

    def keep(self, value: float, trace: Trace | None) -> None:
        """Keep ``trace`` (a replay made elsewhere) if it is of the best schedule so far."""
        if trace is not None and (self._best_trace is None or value < self._best_trace[0]):
            self._best_trace = (value, trace)

    def trace_of(self, value: float) -> Trace | None:
        """The replay of the best schedule evaluated, if its value is ``value``."""
        if self._best_trace is not None and self._best_trace[0] == value:
            return self._best_trace[1]
        return None


def with_meta(schedule: Schedule, **meta: object) -> Schedule:
    """``schedule`` (its batches and runs as they are) with ``meta`` added to its provenance."""
    return Schedule(schedule.entries, {**schedule.meta, **meta})
