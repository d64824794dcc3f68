"""One engine's step loop: a policy drives the semantic core, batch by batch.

This is InferMax's Algorithm 1 outer loop (seed 003 Sec. 3.1): fetch the
arrived requests, ask the policy for the next batch, process it. Processing is
not re-implemented here: every batch is built by
:meth:`~kvsched.schedule.core.EngineState.make_batch` (phases and duration from
the cost model) and applied by :meth:`~kvsched.schedule.core.EngineState.step`,
which raises :class:`~kvsched.schedule.core.ScheduleError` if the policy asked
for something illegal.

:class:`Stepper` splits the loop into its two moves, so that every driver runs
the same rules: :meth:`Stepper.decide` (ask the policy at a time, build the
batch) and :meth:`Stepper.commit` (apply it). :meth:`Stepper.run` is the
single-engine loop to completion; the multi-engine lock-step run
(:mod:`kvsched.heuristics.multiengine`) interleaves ``decide`` and ``commit``
of several engines by time.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsched.costmodel import CostModel
from kvsched.errors import KvschedError
from kvsched.heuristics.base import Policy, SchedulerView
from kvsched.instances.model import Instance
from kvsched.schedule.core import BatchRecord, EngineState
from kvsched.schedule.ir import Batch

#: Batches allowed per token of work (sum of I + O) before a run counts as an eviction loop.
BATCHES_PER_TOKEN = 50


def batch_limit(instance: Instance) -> int:
    """The most batches a run may take before it is reported as an eviction loop."""
    work = sum(r.prompt + r.output for r in instance.requests)
    return BATCHES_PER_TOKEN * work + len(instance)


class Stepper:
    """A policy driving one engine's state through the semantic core.

    Parameters
    ----------
    instance
        The requests the engine may see (positions index the state).
    policy
        The scheduler; :meth:`Policy.reset` is called here.
    cost_model
        Batch durations.

    Attributes
    ----------
    state
        The engine state (only :meth:`commit` changes it).
    view
        The policy's read-only view of ``state``.
    batches, records
        The committed batches and the core's record of each, in order (with
        ``state``, what :func:`~kvsched.schedule.validate.replay` of ``batches``
        would build).
    """

    def __init__(self, instance: Instance, policy: Policy, cost_model: CostModel) -> None:
        self.state = EngineState(instance, cost_model)
        self.view = SchedulerView(self.state, expose_output=policy.uses_true_output)
        self.policy = policy
        policy.reset(instance)
        self.batches: list[Batch] = []
        self.records: list[BatchRecord] = []
        self.limit = batch_limit(instance)

    def decide(self, now: float, view: SchedulerView | None = None) -> Batch | None:
        """Ask the policy for a batch at ``now`` and build it (not applied); ``None`` when it idles.

        ``view`` is what the policy reads (default :attr:`view`; a wrapper of it, such
        as a gated view, must read the same state). ``now`` must not precede the end
        of the last committed batch.

        Raises
        ------
        KvschedError
            The policy evicted without scheduling anything, or the engine has run
            :func:`batch_limit` batches (an eviction loop).
        """
        self.view._advance(now)
        policy = self.policy
        decision = policy.next_batch(view if view is not None else self.view)
        if decision is None or decision.empty:
            if decision is not None and len(decision.evict):
                raise KvschedError(
                    f"policy {policy.name!r} evicted {len(decision.evict)} request(s) at t={now:g} "
                    "but scheduled nothing to run"
                )
            return None
        if len(self.batches) >= self.limit:
            state = self.state
            raise KvschedError(
                f"policy {policy.name!r} ran {self.limit} batches without finishing "
                f"({state.n - state.num_done} requests left, {int(state.evictions.sum())} "
                "evictions so far): probably an eviction loop"
            )
        return self.state.make_batch(now, decision.requests, decision.tokens, decision.evict)

    def commit(self, batch: Batch) -> BatchRecord:
        """Check and apply ``batch`` (from :meth:`decide`); record it."""
        record = self.state.step(batch)
        self.batches.append(batch)
        self.records.append(record)
        return record

    def run(self, on_record: Callable[[BatchRecord], None] | None = None) -> None:
        """Step until every request completes, idling to the next arrival when the policy waits.

        ``on_record`` is called with every committed batch's record (a progress bar).

        Raises
        ------
        KvschedError
            As :meth:`decide`, or the policy stalled: it returned nothing while
            requests remain and none is still to arrive.
        """
        state = self.state
        now = 0.0
        while not state.all_done:
            now = max(now, state.clock)
            batch = self.decide(now)
            if batch is None:
                upcoming = self.view.next_arrival()
                if upcoming is None:
                    left = state.n - state.num_done
                    raise KvschedError(
                        f"policy {self.policy.name!r} stalled at t={now:g} with {left} unfinished "
                        f"request{'s' * (left != 1)} and none still to arrive"
                    )
                now = upcoming  # idle until the next arrival
                continue
            record = self.commit(batch)
            if on_record is not None:
                on_record(record)


__all__ = ["BATCHES_PER_TOKEN", "Stepper", "batch_limit"]
