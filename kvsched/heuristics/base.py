"""What a scheduling policy sees and returns.

A policy is small: at every engine iteration the simulator hands it a
:class:`SchedulerView` (what a real engine knows at that moment) and it returns
a :class:`Decision` (the next batch), or ``None`` to idle until the next
arrival. Timing, memory accounting and metrics are the simulator's and the
core's business; a policy may keep its own reservation bookkeeping where the
paper's algorithm is defined by reservations (InferMax, seed 003 Sec. 3.1).

Coalesced decode runs: a policy may opt in by defining ``repeat_decodes`` (see
:class:`SteadyDecodes`); the simulator then asks it, after a decode-only batch,
how many times in a row it would return that same batch, and the core applies
them as one run. A policy without the method is stepped batch by batch. Mixed
runs (decodes plus one prompt chunk, repeated) are a second opt-in,
``repeat_chunks`` (:class:`SteadyChunks`), and runs that follow a completion or
a finished prompt without a call to ``next_batch`` a third,
``continue_decodes`` (:class:`ContinueDecodes`).

True output lengths are hindsight. The view hands them out only to policies
that declare ``uses_true_output = True`` (eviction-free reservation, Rank_O);
everyone else sees prompts, arrivals and what has been generated so far, plus
``predicted_output`` when the instance carries predictions.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from kvsched.errors import KvschedError
from kvsched.instances.model import Instance, Limits
from kvsched.schedule.core import TIME_TOL, EngineState
from kvsched.schedule.ir import batch_starts


class HindsightError(KvschedError):
    """A policy that did not declare ``uses_true_output`` asked for true output lengths."""


def _read_only(arr: np.ndarray) -> np.ndarray:
    # A view shares the state's memory (the core updates arrays in place), so it
    # stays current without copying, while the policy cannot write through it.
    out = arr.view()
    out.flags.writeable = False
    return out


class SchedulerView:
    """A read-only window on the engine state, as a real engine's scheduler sees it.

    Built once per simulation over an :class:`~kvsched.schedule.core.EngineState`;
    the simulator moves :attr:`now` forward. Per-request arrays are indexed by
    request position and reflect the state after the last applied batch.

    Parameters
    ----------
    state
        The engine state the simulator steps.
    expose_output
        Whether :attr:`output` (true output lengths) may be read.
    """

    def __init__(self, state: EngineState, *, expose_output: bool = False) -> None:
        self._state = state
        self._expose_output = expose_output
        self._now = 0.0
        inst = state.instance
        self.limits: Limits = inst.limits
        self.n: int = state.n
        self.block_size: int = state.block_size
        self.kv_block_capacity: int = state.kv_block_capacity
        self.prompt = _read_only(state.prompt)
        self.arrival = _read_only(state.arrival)
        self.generated = _read_only(state.generated)
        self.kv = _read_only(state.kv)
        self.refilling = _read_only(state.refilling)
        self.done = _read_only(state.done)
        self.evictions = _read_only(state.evictions)
        self._phase = _read_only(state._phase)
        self._output = _read_only(state.output)
        data = state.data
        predicted = data.predicted_output
        self.predicted_output: np.ndarray | None = None if predicted is None else _read_only(predicted)
        self.arrival_order = _read_only(data.arrival_order)
        self._sorted_arrival = data.sorted_arrival
        self._sorted_arrival_list: list[float] = self._sorted_arrival.tolist()  # bisect is cheaper
        self._arrived = -1  # num_arrived at now (-1: not yet read since the clock moved)
        # KV held and decode mask of the given requests (read-only arrays) and the decode count: the
        # core's EngineState.read_items itself (no call layer; a policy calls it once per batch). When
        # they are a frozen int64 array that owns its data and the policy's next batch is exactly that
        # array (no evictions), the core's batch takes these reads instead of gathering them again.
        self.read_items: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, int]] = state.read_items

    # ------------------------------------------------------------------ time
    @property
    def now(self) -> float:
        """The time at which the next batch would start."""
        return self._now

    def _advance(self, now: float) -> None:
        """Move the clock (simulator only)."""
        self._now = now
        self._arrived = -1

    @property
    def num_arrived(self) -> int:
        """How many requests have arrived by :attr:`now`: a prefix of :attr:`arrival_order`."""
        arrived = self._arrived
        if arrived < 0:  # (read by the policy and the stepper at each step: one search per clock move)
            arrived = self._arrived = bisect.bisect_right(self._sorted_arrival_list, self._now + TIME_TOL)
        return arrived

    def next_arrival(self) -> float | None:
        """The first arrival strictly after :attr:`now`, or ``None`` if every request has arrived."""
        k = self._arrived
        if k < 0:
            k = self.num_arrived
        return self._sorted_arrival_list[k] if k < self.n else None  # (the list's floats: no conversion)

    def active(self) -> np.ndarray:
        """Positions of the requests that have arrived and are not finished, in arrival order."""
        arrived = self.arrival_order[: self.num_arrived]
        return arrived[~self._state.done[arrived]]

    # ---------------------------------------------------------------- requests
    @property
    def output(self) -> np.ndarray:
        """True output lengths O (hindsight): only for policies with ``uses_true_output``."""
        if not self._expose_output:
            raise HindsightError(
                "true output lengths are hindsight: only a policy with uses_true_output = True may read them"
            )
        return self._output

    def unprocessed(self, idx: np.ndarray | int) -> np.ndarray:
        """Known tokens not yet processed (S - m): the whole prompt or refill, or 1 for a decode."""
        return self._state.unprocessed(idx)

    def phase_of(self, idx: np.ndarray) -> np.ndarray:
        """The :class:`~kvsched.schedule.ir.Phase` code of each request's next item."""
        if type(idx) is np.ndarray:
            return self._phase[idx]  # the core's phase_of, without a call (policies read this per batch)
        return self._state.phase_of(idx)

    @property
    def num_done(self) -> int:
        """How many requests have completed (it only grows: a count of completions so far)."""
        return self._state.num_done

    def completed_since(self, k: int) -> list[int]:
        """The requests that completed after the first ``k`` completions (``k`` a :attr:`num_done` read
        earlier), in the order they completed: a fresh list."""
        return self._state.completed_since(k)

    # ------------------------------------------------------------------ memory
    @property
    def kv_tokens_used(self) -> int:
        """KV tokens held now."""
        return self._state.kv_tokens

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks held now (each request's KV rounded up to whole blocks)."""
        return self._state.kv_blocks

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_block_capacity - self._state.kv_blocks

    @property
    def num_running(self) -> int:
        """Requests holding KV now."""
        return self._state.num_holding

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` KV tokens."""
        return -(-tokens // self.block_size)

    # ------------------------------------------------------------------ runs
    def run_starts(self) -> np.ndarray:
        """When each batch of the run offered to :meth:`SteadyDecodes.repeat_decodes` would start.

        Entry ``j - 1`` is the :attr:`now` the ``j``-th repeat would see: the end of
        the batch just applied plus the durations of the repeats before it, added one
        by one as the engine clock adds them (so the times are bit-exact). It covers at
        least the ``limit`` offered. Only valid inside ``repeat_decodes`` (a policy whose
        decision or bookkeeping reads time needs it).
        """
        durations = self._state.planned_durations()
        if durations is None:
            raise RuntimeError("run_starts is only defined while a run is being offered (repeat_decodes)")
        if not durations.size:
            return np.zeros(0)
        return batch_starts(self._state.clock, durations)


@dataclass(frozen=True, slots=True)
class Decision:
    """The next batch a policy asks for.

    Parameters
    ----------
    requests
        Positions of the requests to process, in the policy's order.
    tokens
        Tokens to process for each (1 for a decode; a prefill or refill chunk
        otherwise).
    evict
        Positions of running requests whose KV is dropped before the batch runs
        (they must refill later).
    """

    requests: Sequence[int]
    tokens: Sequence[int]
    evict: Sequence[int] = ()

    @property
    def empty(self) -> bool:
        return len(self.requests) == 0


_d_requests, _d_tokens, _d_evict = (Decision.__dict__[f.name].__set__ for f in fields(Decision))


def new_decision(requests: Sequence[int], tokens: Sequence[int], evict: Sequence[int] = ()) -> Decision:
    """``Decision(requests, tokens, evict)``, for a policy's once-per-call decision.

    The fields are set through their slot descriptors, as the frozen dataclass's ``__init__``
    sets them through ``object.__setattr__``: the same object at about 60% of the cost (3,500
    instructions against 5,700; ``tests/test_decision_fast.py`` compares them field by field).
    """
    decision = object.__new__(Decision)
    _d_requests(decision, requests)
    _d_tokens(decision, tokens)
    _d_evict(decision, evict)
    return decision


def check_whole_prompt_fits(name: str, view: SchedulerView, r: int, c: int, p: int, flag: str = "") -> None:
    """Fail clearly where request ``r``, the next of a policy ``name`` that runs whole prompts and refills,
    needs more tokens than the budgets C and P allow: it could never run (a stall, not a wait).

    The engine policies (:mod:`kvsched.heuristics.engines`) and
    :class:`~kvsched.heuristics.infermax.InferMax` stall so; ``flag`` names the option that makes the
    policy run whole prompts, where one does.
    """
    need = int(view.unprocessed(r))
    if need > min(c, p):
        raise KvschedError(
            f"policy {name!r} cannot run request {r}: it processes whole prompts and refills{flag} "
            f"but this one has {need} tokens, more than the budget (C = {c}, P = {p})"
        )


@runtime_checkable
class Policy(Protocol):
    """A scheduler: sees the state, returns the next batch.

    Attributes
    ----------
    name
        Registry name (recorded in the schedule's ``meta``).
    uses_true_output
        ``True`` for hindsight policies, which may read :attr:`SchedulerView.output`.
    params
        The parameters the policy runs with (recorded in the schedule's ``meta``).
    """

    name: str
    uses_true_output: bool
    params: Mapping[str, Any]

    def reset(self, instance: Instance) -> None:
        """Forget every request before a new run on ``instance``.

        Only the sizes and limits are meant to be used here; a policy without
        ``uses_true_output`` must not read :attr:`Request.output`.
        """
        ...

    def next_batch(self, view: SchedulerView) -> Decision | None:
        """The next batch at ``view.now``; ``None`` (or an empty decision) idles until the next arrival."""
        ...


@runtime_checkable
class SteadyDecodes(Protocol):
    """The opt-in contract of coalesced decode runs (a policy that lacks it is never coalesced).

    After the policy returned ``decision`` (decode-only: one token for each of its
    requests, no evictions) and the simulator applied it, the simulator calls
    :meth:`repeat_decodes` once instead of calling :meth:`Policy.next_batch`
    again and again. The view shows the state after that batch.
    """

    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """How many more times in a row (0 to ``limit``) :meth:`Policy.next_batch` would return ``decision``.

        The answer must be exact for the stretch the simulator guarantees: within
        the ``limit`` batches no request arrives, none completes before the last
        of them, and each decodes one token for each of ``decision.requests``
        (their KV grows by one per batch; nothing else changes). The policy then
        updates its own bookkeeping as if it had been called that many times,
        so that its next :meth:`Policy.next_batch` behaves as if it had been.

        A smaller answer than the longest stretch is safe (the simulator asks the
        policy again after the run, and gets the same batch and another run offer),
        only shorter storage is lost: a policy may stop where its proof of "same
        decision" ends, e.g. before a threshold it does not want to track. A larger
        answer is a bug. A policy whose decision or bookkeeping reads the clock finds
        the repeats' start times in :meth:`SchedulerView.run_starts`.
        """
        ...


def steady_decodes(policy: Policy) -> SteadyDecodes | None:
    """``policy`` if it opted in to coalesced decode runs, else ``None`` (the default "no")."""
    return cast(SteadyDecodes, policy) if callable(getattr(policy, "repeat_decodes", None)) else None


@runtime_checkable
class SteadyChunks(Protocol):
    """The opt-in contract of mixed runs: decodes plus one prompt chunk, repeated (default "no").

    After the policy returned ``decision`` (one token for each of its requests but
    the last, then a chunk of ``c`` prompt or refill tokens of the last, no
    evictions) and the simulator applied it, the chunk not finishing the prompt
    and nothing completing, the simulator calls :meth:`repeat_chunks` once
    instead of calling :meth:`Policy.next_batch` again and again.
    """

    def repeat_chunks(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """How many more times in a row (0 to ``limit``) :meth:`Policy.next_batch` would return ``decision``.

        As :meth:`SteadyDecodes.repeat_decodes`, for the stretch the simulator
        guarantees: within the ``limit`` batches no request arrives, none completes
        before the last of them, each decodes one token for each decode of
        ``decision`` and processes ``c`` more tokens of the chunk's request, which
        does not reach the end of its prompt (or refill) in any of them; nothing
        else changes. The policy updates its own bookkeeping as if it had been
        called that many times. A smaller answer is safe, a larger one is a bug.
        """
        ...


def steady_chunks(policy: Policy) -> SteadyChunks | None:
    """``policy`` if it opted in to mixed runs, else ``None`` (the default "no")."""
    return cast(SteadyChunks, policy) if callable(getattr(policy, "repeat_chunks", None)) else None


@runtime_checkable
class ChunksAhead(Protocol):
    """The opt-in contract of mixed runs that start with the decision's own batch (default "no").

    :class:`SteadyChunks`' offer, asked before the batch is applied: after the policy
    returned ``decision`` (decodes, then a chunk of ``c`` prompt or refill tokens of
    its last request, no evictions), the simulator calls :meth:`chunks_ahead` instead
    of applying that batch and then calling :meth:`SteadyChunks.repeat_chunks`. A
    positive answer ``k`` makes the batch and its ``k`` repeats one run (one check and
    apply instead of two; and a prompt of two chunks becomes one run with its last
    chunk, which a run that starts after the first chunk cannot hold).
    """

    def chunks_ahead(self, view: SchedulerView, decision: Decision, limit: Callable[[], int]) -> int:
        """:meth:`SteadyChunks.repeat_chunks`' answer (0 to ``limit()``), with the view still showing the
        state *before* the decision's batch (which will have processed one decode token of each decode
        and ``c`` tokens of the chunk's request).

        ``limit()`` plans the run (its batch durations) and returns the most batches
        *after* the decision's own (0: none may follow it, or the batch is not a run's:
        answer 0). A policy calls it once, after every cheaper reason to answer 0;
        the stretch is the one :meth:`SteadyChunks.repeat_chunks` is offered, except
        that its last batch may also be the prompt's last chunk right after this one.
        0 means "apply the batch alone": the policy must then be left as it was, and the
        answer stands for :meth:`SteadyChunks.repeat_chunks` too (the simulator does not
        offer it after this batch). Otherwise the policy updates its own bookkeeping as
        :meth:`SteadyChunks.repeat_chunks` would after the batch.
        """
        ...


def chunks_ahead(policy: Policy) -> ChunksAhead | None:
    """``policy`` if it opted in to mixed runs that start with its decision's batch, else ``None``."""
    return cast(ChunksAhead, policy) if callable(getattr(policy, "chunks_ahead", None)) else None


@runtime_checkable
class ContinueDecodes(Protocol):
    """The opt-in contract of runs that follow an event without a decision (default "no").

    After an entry (a batch or a run) in which some request completed, or a prompt
    (or refill) chunk finished its prompt, the requests of that entry that did not
    complete may all be decoding now, in the entry's order. Instead of calling
    :meth:`Policy.next_batch`, the simulator then calls :meth:`continue_decodes`
    once with those requests (the view at the next batch's time, as
    ``next_batch`` would see it): the answer says whether the next batches are
    exactly one decode of each of them, and how many in a row.

    A policy may also define ``declines_continuations() -> bool``: ``True`` only when
    :meth:`continue_decodes` would answer 0 to any offer made before the policy is
    next called (its own state says so, whatever the view then). Right after a
    decision's batch, the simulator then makes no offer and does not compute the
    requests left decoding.
    """

    def continue_decodes(self, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]) -> int:
        """How many times in a row (0 to ``limit()``) :meth:`Policy.next_batch` would now return one decode
        of each of ``requests``, in this order, with no evictions.

        ``limit()`` plans the run (it costs the run's batch durations): a policy calls
        it once, after every cheaper reason to answer 0. The stretch is the one
        :meth:`SteadyDecodes.repeat_decodes` is offered: within ``limit()`` batches no
        request arrives and none completes before the last of them. 0 means "ask
        me" (the simulator calls ``next_batch``): the policy must then be left as
        ``next_batch`` expects it. Otherwise the policy updates its own bookkeeping
        as if ``next_batch`` had been called that many times. A smaller answer is
        safe, a larger or a wrong one a bug.
        """
        ...


def continue_decodes(policy: Policy) -> ContinueDecodes | None:
    """``policy`` if it opted in to runs after completions and finished prompts, else ``None``."""
    return cast(ContinueDecodes, policy) if callable(getattr(policy, "continue_decodes", None)) else None
