"""The step loop: a policy drives one engine's state through the semantic core.

This is InferMax's Algorithm 1 outer loop (seed 003 Sec. 3.1): fetch the
arrived requests, ask the policy for the next batch, process it. Processing is
not re-implemented here: every batch is built by
:meth:`~kvsched.schedule.core.EngineState.make_batch` (phases and duration from
the cost model) and applied by :meth:`~kvsched.schedule.core.EngineState.step`,
which raises :class:`~kvsched.schedule.core.ScheduleError` if the policy asked
for something illegal.

Coalesced runs: after a decode-only batch (no eviction, no completion), a
policy that opted in (:func:`~kvsched.heuristics.base.steady_decodes`) says how
many times in a row it would return that batch again, up to the next event (an
arrival, a completion, the KV capacity: :meth:`EngineState.run_limit`). Those
batches become one :class:`~kvsched.schedule.ir.Run`, checked and applied by the
core in one step (:meth:`EngineState.step_run`). Mixed runs likewise: after a
batch of decodes followed by one prompt (or refill) chunk that did not finish
its prompt, with no eviction and no completion, a policy that opted in
(:func:`~kvsched.heuristics.base.steady_chunks`) says how many times in a row it
would return that batch again, up to the next event (the same ones, and the
prompt's last chunk, which the run leaves out). Runs after events: after a
batch or run without evictions in which some request completed or finished its
prompt, every other item decoding now, a policy that opted in
(:func:`~kvsched.heuristics.base.continue_decodes`) says, instead of a decision,
how many batches in a row it would decode exactly those requests (a
:class:`Run` again, up to the same events). Runs ahead: a decision of a few
decodes then one prompt chunk that does not finish its prompt is offered to a
policy that opted in (:func:`~kvsched.heuristics.base.chunks_ahead`) before its
batch applies; the batch and its repeats are then one mixed run (planned by the
core from the clock, where the batch starts). The batches are exactly those of
batch-by-batch stepping; only their storage and the policy calls are fewer.

:class:`Stepper` splits the loop into its two moves, so that every driver runs
the same rules: :meth:`Stepper.decide` (ask the policy at a time, build the
batch or the run) and :meth:`Stepper.commit` (apply it). :meth:`Stepper.run` is
the single-engine loop to completion (what
:func:`~kvsched.heuristics.simulator.simulate` runs, the two moves in one loop on
the same helpers, with its reads bound once: it runs once per policy call); the multi-engine lock-step run
(:mod:`kvsched.heuristics.multiengine`) interleaves ``decide`` and ``commit`` of
several engines by time, cutting runs at the next dispatch (``horizon``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np

from kvsched.costmodel import CostModel
from kvsched.costmodel.small import SMALL
from kvsched.errors import KvschedError
from kvsched.heuristics.base import (
    Decision,
    Policy,
    SchedulerView,
    chunks_ahead,
    continue_decodes,
    steady_chunks,
    steady_decodes,
)
from kvsched.instances.model import Instance
from kvsched.schedule.collector import resume_collector
from kvsched.schedule.core import TIME_TOL, BatchRecord, EngineState
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Phase, Run, batch_starts
from kvsched.schedule.records import RunRecord, expand_records

#: Batches allowed per token of work (sum of I + O) before a run counts as an eviction loop.
BATCHES_PER_TOKEN = 50

Entry = Batch | Run
Record = BatchRecord | RunRecord
#: What a policy's run offer is: ``repeat_decodes`` or ``repeat_chunks`` (view, decision, limit) -> k.
Ask = Callable[[SchedulerView, Decision, int], int]
#: ``continue_decodes`` (view, requests, limit) -> k, the limit computed on demand.
Follow = Callable[[SchedulerView, np.ndarray, Callable[[], int]], int]
#: ``chunks_ahead`` (view, decision, limit) -> k, the limit computed on demand.
Ahead = Callable[[SchedulerView, Decision, Callable[[], int]], int]
_DECODE = int(Phase.DECODE)


def batch_limit(instance: Instance) -> int:
    """The most batches a run may take before it is reported as an eviction loop."""
    # The state's arrays (built once per instance): no pass over the requests.
    data = ProblemData.of(instance)
    work = int(data.prompt.sum()) + int(data.output.sum())
    return BATCHES_PER_TOKEN * work + data.n


def _evicted_nothing(policy: Policy, evicted: int, now: float) -> KvschedError:
    return KvschedError(
        f"policy {policy.name!r} evicted {evicted} request(s) at t={now:g} but scheduled nothing to run"
    )


def _eviction_loop(policy: Policy, limit: int, state: EngineState) -> KvschedError:
    return KvschedError(
        f"policy {policy.name!r} ran {limit} batches without finishing "
        f"({state.n - state.num_done} requests left, {int(state.evictions.sum())} "
        "evictions so far): probably an eviction loop"
    )


def _stalled(policy: Policy, state: EngineState, now: float) -> KvschedError:
    left = state.n - state.num_done
    return KvschedError(
        f"policy {policy.name!r} stalled at t={now:g} with {left} unfinished "
        f"request{'s' * (left != 1)} and none still to arrive"
    )


def _batch_wanted(policy: Policy, decision: Decision | None, now: float) -> bool:
    """Whether ``decision`` (the policy's at ``now``) asks for a batch; ``False``: the policy idles.

    Raises
    ------
    KvschedError
        It evicted without scheduling anything.
    """
    if decision is None:
        return False
    if type(decision) is not Decision and not isinstance(decision, Decision):
        raise KvschedError(
            f"policy {policy.name!r} returned {type(decision).__name__} at t={now:g}: next_batch returns a "
            "kvsched Decision(requests, tokens, evict) or None (to idle until the next arrival)"
        )
    if not len(decision.requests):
        if len(decision.evict):
            raise _evicted_nothing(policy, len(decision.evict), now)
        return False
    return True


def _repeat_offer(
    record: BatchRecord, batch: Batch, steady: Ask | None, chunks: Ask | None
) -> tuple[Ask, int] | None:
    """What a run may repeat of ``batch`` (just applied without evictions, below the batch limit): the
    policy's offer and the chunk's tokens, or ``None``.

    Nothing completed, and either decodes only (``steady``, the policy's ``repeat_decodes``; chunk 0)
    or decodes then a prompt or refill chunk that did not finish (generated nothing): ``chunks``, its
    ``repeat_chunks``, with the last item's tokens. An offer the policy did not opt in to is ``None``.
    """
    if record.completed.size:
        return None
    num_decodes, num_items = record.num_decodes, record.num_items
    if num_decodes == num_items:
        return None if steady is None else (steady, 0)
    if (
        chunks is not None
        and num_decodes == num_items - 1
        and record.generated.size == num_decodes
        and batch.phases[-1] != _DECODE
    ):
        return chunks, int(batch.tokens[-1])
    return None


def _follow_batch(state: EngineState, batch: Batch, record: BatchRecord) -> np.ndarray | None:
    """The requests a run may continue with after ``batch`` (just applied, ``record``), without a decision.

    After a batch without evictions in which some request completed or finished its
    prompt: its items but the completed ones, when all of them are decoding now
    (:meth:`EngineState.left_decoding`). ``None`` otherwise (a decode-only batch that
    completed nothing is a repeat's, not a continuation's).
    """
    if batch.evicted.size or (record.num_decodes == record.num_items and not record.completed.size):
        return None
    return state.left_decoding()


def _follow_run(state: EngineState, run: Run, record: RunRecord) -> np.ndarray | None:
    """:func:`_follow_batch` after a run: when a decode completed or its last chunk finished the prompt."""
    if record.tail is None and (run.chunk is not None or not record.completed.size):
        return None  # the chunk's request is still in its prompt, or nothing happened but the run's end
    return state.left_decoding()


def _run_limit(
    state: EngineState, view: SchedulerView, req: np.ndarray, horizon: float | None = None, chunk: int = 0
) -> int:
    """The most batches a run of the items ``req`` may take from the engine's clock (0: none), planned.

    The core's limit (:meth:`EngineState.plan_run`, whose plan :meth:`EngineState.make_run`
    then takes), planned up to the first batch that starts once the next request has arrived
    (the policy would see it) and, with a ``horizon``, cut to the batches that start before
    ``horizon`` and end by it (as the lock-step run decides and commits them; both
    within :data:`TIME_TOL`).
    """
    # A batch that starts once the next request has arrived sees it: the core plans up to it.
    limit, durations = state.plan_run(req, chunk, view.next_arrival())
    if horizon is None or not limit:
        return limit
    starts = batch_starts(state.clock, durations)  # a fresh array
    # Decided while start < horizon - TOL, committed while end <= horizon + TOL
    # (ends are the next starts: the same running sum, bit for bit).
    ends = starts + durations
    return min(
        limit,
        int(starts.searchsorted(horizon - TIME_TOL, "left")),
        int(ends.searchsorted(horizon + TIME_TOL, "right")),
    )


def _repeat(
    state: EngineState,
    view: SchedulerView,
    ask: Ask,
    decision: Decision,
    req: np.ndarray,
    horizon: float | None = None,
    chunk: int = 0,
) -> Run | None:
    """The run of repeats of the batch just applied (items ``req``) that the policy would ask for next.

    The batch is decode-only (``chunk`` 0, ``ask`` the policy's ``repeat_decodes``)
    or decodes then a chunk of ``chunk`` tokens (``repeat_chunks``); ``view`` still
    reads at the decision's time. At most :func:`_run_limit` batches; ``None`` when
    none is left or the policy wants none.
    """
    limit = _run_limit(state, view, req, horizon, chunk)
    k = ask(view, decision, limit) if limit else 0
    return state.make_run(state.clock, req, k, chunk) if k else None


def _continue(
    state: EngineState, view: SchedulerView, follow: Follow, req: np.ndarray, horizon: float | None = None
) -> Run | None:
    """The run of decodes of ``req`` (left decoding after a completion or a finished prompt) that the
    policy's ``continue_decodes`` (``follow``) says it would decide from now on; ``None`` for a decision.

    ``view`` reads at the run's start. The policy asks for :func:`_run_limit` only once it has
    found no cheaper reason to decline (planning costs the run's durations).
    """
    if horizon is None:  # (the single-engine loop: _run_limit without its layer, once per continuation)
        k = follow(view, req, lambda: state.plan_run(req, 0, view.next_arrival())[0])
    else:
        k = follow(view, req, lambda: _run_limit(state, view, req, horizon))
    return state.make_run(state.clock, req, k) if k else None


def _ahead(state: EngineState, view: SchedulerView, ahead: Ahead, decision: Decision) -> Run | None:
    """The mixed run that starts with ``decision``'s own batch (not yet applied), when the policy's
    ``chunks_ahead`` says it repeats; ``None``: the batch is applied alone, as usual.

    The batch must be a mixed run's (decodes of one token, then a chunk of ``c`` >= 1
    tokens of the last request that does not finish its prompt, no evictions): the core's
    plan (:func:`_run_limit` from the engine's clock, where the batch starts) checks the
    items and counts the batch itself, so the policy is offered one batch fewer.
    """
    planned: list[tuple[np.ndarray, int]] = []

    def limit() -> int:
        req = np.array(decision.requests, dtype=np.int64)  # the run's items (a fresh array)
        tok = np.array(decision.tokens, dtype=np.int64)
        if req.ndim != 1 or tok.shape != req.shape or not req.size or len(decision.evict):
            return 0
        tokens = tok.tolist()  # (a few items: one list for the checks)
        c = tokens[-1]
        # Every item but the last a decode (ints: all equal to 1 where the count of 1s is their number).
        if c < 1 or tokens[:-1].count(1) != len(tokens) - 1:
            return 0
        req.setflags(False)  # (the run's positions, and its last batch's items)
        most = _run_limit(state, view, req, None, c)
        planned.append((req, c))
        return most - 1 if most > 1 else 0

    k = ahead(view, decision, limit)
    if not k:
        return None
    if not planned:
        raise KvschedError("chunks_ahead answered a run without planning it (limit())")
    req, c = planned[-1]
    return state.make_run(state.clock, req, k + 1, c)


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
    coalesce
        Let a policy that opted in repeat a decode-only batch as one
        :class:`~kvsched.schedule.ir.Run` (same batches, shorter storage).

    Attributes
    ----------
    state
        The engine state (only :meth:`commit` and :meth:`run` change it).
    view
        The policy's read-only view of ``state``.
    entries, records
        The committed batches and runs, and the core's record of each, in order
        (with ``state``, what :func:`~kvsched.schedule.validate.replay` of
        ``entries`` would build).
    num_batches
        Batches committed so far (a run of ``k`` counts ``k``).
    limit
        :func:`batch_limit` of the instance.
    """

    def __init__(
        self, instance: Instance, policy: Policy, cost_model: CostModel, *, coalesce: bool = True
    ) -> None:
        self.state = EngineState(instance, cost_model)
        self.view = SchedulerView(self.state, expose_output=policy.uses_true_output)
        self.policy = policy
        policy.reset(instance)
        self.entries: list[Entry] = []
        self.records: list[Record] = []
        self.num_batches = 0
        self.limit = batch_limit(instance)
        steady = steady_decodes(policy) if coalesce else None
        chunks = steady_chunks(policy) if coalesce else None
        # The policy's run offers (None: it did not opt in), bound once.
        self.steady: Ask | None = steady.repeat_decodes if steady is not None else None
        self.chunks: Ask | None = chunks.repeat_chunks if chunks is not None else None
        follow = continue_decodes(policy) if coalesce else None
        self.follow: Follow | None = follow.continue_decodes if follow is not None else None
        ahead = chunks_ahead(policy) if coalesce else None
        # (Only the single-engine loop asks it: decide and commit keep batch, then repeats.)
        self.ahead: Ahead | None = ahead.chunks_ahead if ahead is not None else None
        self._decided: tuple[Decision, Batch] | None = None  # the last batch decide built
        # A committed batch a run may repeat: its decision, the batch, the offer and the chunk's tokens.
        self._repeatable: tuple[Decision, Batch, Ask, int] | None = None
        # The requests a run may continue with after a completion or a finished prompt (_follow_batch).
        self._following: np.ndarray | None = None

    @property
    def batches(self) -> list[Batch]:
        """The committed batches, runs spelled out."""
        out: list[Batch] = []
        for e in self.entries:
            if type(e) is Run:
                out.extend(e.batches())
            else:
                out.append(e)  # type: ignore[arg-type]
        return out

    @property
    def batch_records(self) -> list[BatchRecord]:
        """:attr:`records` with runs spelled out."""
        return expand_records(self.records)

    def decide(
        self, now: float, view: SchedulerView | None = None, horizon: float | None = None
    ) -> Entry | None:
        """The next batch or run at ``now``, built but not applied; ``None`` when the policy idles.

        Right after a decode-only batch that completed nothing, a policy that opted
        in is first asked how often it would repeat it (a :class:`Run`, read at
        the batch's decision time); otherwise it is asked for a batch at ``now``.
        ``view`` is what the policy reads (default :attr:`view`; a wrapper of it,
        such as a gated view, must read the same state). ``horizon``: a run keeps
        only the batches that start before it and end by it. ``now`` must not
        precede the end of the last committed batch.

        Raises
        ------
        KvschedError
            The policy evicted without scheduling anything, or the engine has run
            :func:`batch_limit` batches (an eviction loop).
        """
        if view is None:
            view = self.view
        repeatable, following = self._repeatable, self._following
        self._repeatable = self._following = None
        if repeatable is not None:
            decision, batch, ask, chunk = repeatable
            run = _repeat(self.state, view, ask, decision, batch.requests, horizon, chunk)
            if run is not None:
                return run
        self.view._advance(now)
        if following is not None and self.follow is not None and now <= self.state.clock:
            run = _continue(self.state, view, self.follow, following, horizon)
            if run is not None:
                return run
        policy = self.policy
        decision = policy.next_batch(view)
        if not _batch_wanted(policy, decision, now):
            return None
        if self.num_batches >= self.limit:
            raise _eviction_loop(policy, self.limit, self.state)
        batch = self.state.make_batch(now, decision.requests, decision.tokens, decision.evict)
        self._decided = (decision, batch)
        return batch

    def forget_repeat(self) -> None:
        """Ask the policy afresh at the next :meth:`decide` (a request was revealed since the batch)."""
        self._repeatable = self._following = None

    def commit(self, entry: Entry) -> Record:
        """Check and apply ``entry`` (from :meth:`decide`); record it."""
        state = self.state
        self._repeatable = self._following = None
        if type(entry) is Run:
            record: Record = state.step_run(entry)
            self.num_batches += entry.repeat
            if self.follow is not None and self.num_batches < self.limit:
                self._following = _follow_run(state, entry, record)  # type: ignore[arg-type]
        else:
            rec = state.step(entry)  # type: ignore[arg-type]
            record = rec
            self.num_batches += 1
            decided = self._decided
            if (
                decided is not None
                and decided[1] is entry
                and not entry.evicted.size  # type: ignore[union-attr]
                and self.num_batches < self.limit
            ):
                offer = _repeat_offer(rec, entry, self.steady, self.chunks)  # type: ignore[arg-type]
                if offer is not None:
                    self._repeatable = (*decided, *offer)
                elif self.follow is not None:
                    self._following = _follow_batch(state, entry, rec)  # type: ignore[arg-type]
        self._decided = None
        self.entries.append(entry)
        self.records.append(record)
        if type(record) is RunRecord and record.tail is not None:
            self.records.append(record.tail)  # a run that ends with its prompt's last chunk
        return record

    def run(self, on_record: Callable[[Record], None] | None = None) -> None:
        """Step until every request completes, idling to the next arrival when the policy waits.

        The moves of :meth:`decide` and :meth:`commit` in one loop, on their helpers (the
        same rules; the loop binds its reads once, as it runs once per policy call). ``on_record`` is called with every committed batch's or
        run's record (a progress bar).

        Raises
        ------
        KvschedError
            As :meth:`decide`, or the policy stalled: it returned nothing while
            requests remain and none is still to arrive.
        """
        state, view, policy = self.state, self.view, self.policy
        steady, chunks, follow, limit = self.steady, self.chunks, self.follow, self.limit
        declines = getattr(policy, "declines_continuations", None) if follow is not None else None
        ahead = self.ahead
        # Bound once: this loop runs once per policy call (tens of thousands of times).
        next_batch, make_batch, step, step_run = (
            policy.next_batch,
            state.make_batch,
            state.step,
            state.step_run,
        )
        add_entry, add_record = self.entries.append, self.records.append
        advance = view._advance
        n = state.n
        num_batches = self.num_batches
        now = 0.0
        following = None  # the requests a run may continue with (_follow_batch, _follow_run)
        # The loop makes no reference cycles (arrays, tuples, records): the cyclic collector's passes
        # over the growing trace cost 3-5% of it and free nothing, so it pauses until the loop ends.
        collecting = gc.isenabled()
        gc.disable()
        try:
            while state.num_done < n:
                clock = state.clock
                if clock > now:
                    now = clock
                advance(now)
                run = None
                if following is not None:
                    run = _continue(state, view, follow, following)  # type: ignore[arg-type]
                    following = None
                if run is None:
                    decision = next_batch(view)
                    if not _batch_wanted(policy, decision, now):
                        upcoming = view.next_arrival()
                        if upcoming is None:
                            raise _stalled(policy, state, now)
                        now = upcoming  # idle until the next arrival
                        continue
                    if num_batches >= limit:
                        raise _eviction_loop(policy, limit, state)
                    # The batch and its repeats as one run (decodes and a chunk), asked before it applies.
                    # Not on many items: there the batch's quick check is also its repeats' (a plan of a
                    # batch just applied skips the item checks), while a plan ahead checks them afresh
                    # and is often cut short by a completion among the decodes (measured at 225 items).
                    asked = ahead is not None and now == state.clock and len(decision.requests) <= SMALL
                    if asked:
                        run = _ahead(state, view, ahead, decision)  # type: ignore[arg-type]
                if run is None:
                    batch = make_batch(now, decision.requests, decision.tokens, decision.evict)
                    record = step(batch)
                    add_entry(batch)
                    add_record(record)
                    num_batches += 1
                    if on_record is not None:
                        on_record(record)
                    if num_batches >= limit or batch.evicted.size:
                        continue
                    # (A refused chunks_ahead is repeat_chunks' answer too: no second offer.)
                    offer = _repeat_offer(record, batch, steady, None if asked else chunks)
                    if offer is not None:
                        run = _repeat(state, view, offer[0], decision, batch.requests, None, offer[1])
                    if run is None:
                        # (No offer where the policy declines any: not even the requests left decoding.)
                        if follow is not None and (declines is None or not declines()):
                            following = _follow_batch(state, batch, record)
                        continue
                run_record = step_run(run)
                add_entry(run)
                add_record(run_record)
                num_batches += run.durations.size  # (run.repeat)
                tail = run_record.tail  # a run that ends with its prompt's last chunk
                if tail is not None:
                    add_record(tail)
                if on_record is not None:
                    on_record(run_record)
                    if tail is not None:
                        on_record(tail)
                if follow is not None and num_batches < limit:
                    following = _follow_run(state, run, run_record)
        finally:
            self.num_batches = num_batches
            if collecting:
                resume_collector()  # (with the loop's objects counted as old: no pass over them then)


__all__ = ["BATCHES_PER_TOKEN", "Entry", "Record", "Stepper", "batch_limit"]
