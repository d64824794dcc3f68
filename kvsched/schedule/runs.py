"""The semantic core's rules for coalesced runs: what ``k`` identical batches do to the state.

Part of the one semantic core (:mod:`kvsched.schedule.core`, whose
:class:`~kvsched.schedule.core.EngineState` inherits :class:`RunSteps`): a
:class:`~kvsched.schedule.ir.Run` is ``k`` back-to-back batches of the same
items, none evicted:

* each of its ``n`` decodes (distinct held requests whose next item is a
  decode, arrived) processes one token per batch: its KV grows by one and it
  generates a token; a decode may complete only in the last batch;
* in a *mixed* run, a chunk of ``c`` tokens of one prefilling (or refilling)
  request ``p`` follows the decodes in every batch: p's KV grows by c per batch
  and p never finishes its prompt inside the run (``k c`` is less than what it
  has left), so it never generates there;
* the budgets hold in every batch (``n + c <= C``, ``c <= P``, the requests
  holding KV, p included, within ``max_running``), and the KV held during the
  last batch, the largest of the run, fits in M.

Everything is checked and applied in time proportional to the run's items plus
its ``k`` durations, never ``k`` times its items. Which runs a policy wants is
the policy's concern (:mod:`kvsched.heuristics.step`); how far a run may go
before the next arrival is the simulator's.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import numpy as np

from kvsched.costmodel.base import chunk_run_times, decode_run_times
from kvsched.costmodel.small import NUM_OPERANDS, OPERANDS, SMALL, imin, isum, nonzero, operand
from kvsched.schedule.ir import Chunk, Phase, Run, batch_starts
from kvsched.schedule.records import (
    Rule,
    RunRecord,
    ScheduleError,
    Violation,
    new_batch_record,
    new_run_record,
)
from kvsched.schedule.search import last_fitting
from kvsched.schedule.violations import DURATION_RTOL, TIME_TOL

if TYPE_CHECKING:
    from kvsched.schedule.core import EngineState

_PREFILL, _DECODE, _REFILL = int(Phase.PREFILL), int(Phase.DECODE), int(Phase.REFILL)
_DECODE_CODE = np.array(_DECODE, dtype=np.int8)
_ONE = np.array(1, dtype=np.int64)
_NO_ITEMS = np.zeros(0, dtype=np.int64)
_NO_ITEMS.flags.writeable = False
_count = nonzero
_UNSET = object()

#: What :meth:`RunSteps._plan_limit` finds: the limit, the last chunk's tokens, the first completion's
#: batch, and the decodes' tokens left to generate (on a few decodes).
_Plan = tuple[int, int, int, "list[int] | None"]
_NO_PLAN: _Plan = (0, 0, 0, None)

#: ``EngineState._applied[2]`` after a batch the quick path accepted: what a run may repeat of it.
NOT_STEADY, STEADY_DECODES, STEADY_CHUNK = 0, 1, 2


def _with(req: np.ndarray, p: int) -> np.ndarray:
    """``req`` then ``p`` (a fresh int64 array; ``np.append`` costs several times more on a few items)."""
    out = np.empty(req.size + 1, dtype=np.int64)
    out[:-1] = req
    out[-1] = p
    return out


def _cut(
    clock: float, durations: np.ndarray, until: float
) -> tuple[np.ndarray, list[float] | np.ndarray | None]:
    """The ``durations`` of the batches that start before ``until`` (within :data:`TIME_TOL`) from
    ``clock``, and each one's end (the running sum, added one by one as the engine clock adds them;
    ``None`` when all of many batches start before it)."""
    size = durations.size
    if size <= SMALL:
        # On Python floats: the same running sum of the same durations as batch_starts, cheaper on a few.
        start, ends = clock, []
        for d in durations.tolist():
            if start + TIME_TOL >= until:
                break
            start += d
            ends.append(start)
        k = len(ends)
    else:
        starts = batch_starts(clock, durations)  # a fresh array
        k = int((starts + TIME_TOL).searchsorted(until, "left"))
        ends = starts[1 : k + 1] if k < size else None  # (batch j ends where j + 1 starts)
    if k < size:  # a copy, not a view: a run keeps no more than its own k durations
        durations = durations[:k].copy()
    return durations, ends


class RunSteps:
    """The run half of :class:`~kvsched.schedule.core.EngineState` (its methods read and write the state)."""

    # The cost model's decode_run_until (costmodel.base.decode_run_until's getattr), bound on first use.
    _run_until: object = _UNSET

    # ------------------------------------------------------------- planning
    def run_limit(self: EngineState, requests: np.ndarray, chunk: int = 0) -> int:
        """The most batches of a run of these items the rules allow from now (0: none).

        ``requests`` are the decodes' positions (distinct held decodes, arrived by
        now); with ``chunk`` > 0 the last of ``requests`` is instead the request
        whose next ``chunk`` tokens of prompt (or refill) every batch processes. The
        limit is the first completion of a decode (that batch may end a run), the
        end of the prompt and the KV capacity; the budgets and ``max_running`` do
        not change through a run. A run may end with the prompt's last chunk (then
        of what is left, up to ``chunk`` tokens) after at least one full chunk.
        """
        return self._plan_limit(requests, chunk)[0]

    def _plan_limit(self: EngineState, requests: np.ndarray, chunk: int) -> _Plan:
        """:meth:`run_limit`, the tokens of the last chunk if the limit's last batch finishes the prompt
        (else 0), the batch (1-based) in which a decode first completes (0: none does) and, on a
        few decodes, each one's tokens left to generate (a list; else ``None``)."""
        req = requests
        size = req.size  # (a Python int already: no int() call)
        # The (read-only) positions of the batch just applied were found in range and distinct by the
        # quick path; its flag says whether its items are a run's again (decodes, then a chunk that
        # did not finish, nothing completed).
        applied = self._applied
        steady = (
            applied[2]
            if applied is not None and applied[0] is req and applied[1] == self.num_batches
            else NOT_STEADY
        )
        checked = steady != NOT_STEADY and not req.flags.writeable
        if not checked and (not size or not self._valid_positions(req)):
            return _NO_PLAN
        if chunk:
            p = req.item(-1)  # (a Python int, without a numpy scalar)
            if chunk < 0 or self._phase[p] == _DECODE:
                return _NO_PLAN
            return self._limit(req[:-1], steady == STEADY_CHUNK, p, chunk)
        return self._limit(req, steady == STEADY_DECODES, -1, 0)

    def _limit(self: EngineState, dec: np.ndarray, steady: bool, p: int, c: int) -> _Plan:
        """:meth:`_plan_limit` of the decodes ``dec`` (in range, distinct) and p's chunks of c (p = -1: none)."""
        n = dec.size
        # A live decode has exactly its last token left (a finished request none): known of the
        # decodes of a batch just applied that completed nothing.
        if n and not steady:
            if n <= SMALL:  # (on the lists: a count is cheaper than a comparison and a count of arrays)
                if self._phase[dec].tolist().count(_DECODE) != n or self._left[dec].tolist().count(1) != n:
                    return _NO_PLAN
            elif _count(self._phase[dec] != _DECODE_CODE) or _count(self._left[dec] != _ONE):
                return _NO_PLAN
        max_tokens, max_prefill, max_running = self._budgets
        if max_tokens is not None and n + c > max_tokens:
            return _NO_PLAN
        holding = self.num_holding
        rem = None
        if not n:
            decodes = None
        elif n <= SMALL:  # the first completion, on the lists (cheaper than a subtraction on a few items)
            rem = list(map(operator.sub, self.output[dec].tolist(), self.generated[dec].tolist()))
            decodes = min(rem)
        else:
            decodes = imin(self.output[dec] - self.generated[dec])
        left = m = chunks = 0
        tail = False
        if p >= 0:
            if max_prefill is not None and c > max_prefill:
                return _NO_PLAN
            left, m = self._left.item(p), self.kv.item(p)
            holding += m == 0  # p holds KV from the first batch of the run on
            chunks = (left - 1) // c  # full chunks before the last (left 0: done, none)
            limit = chunks if decodes is None or chunks < decodes else decodes  # (min, without the call)
            # The last chunk may end the run (it generates, as a decode may complete, in its last batch).
            tail = chunks >= 1 and (decodes is None or decodes > chunks)
        else:
            limit = decodes  # type: ignore[assignment]
        if limit is None or (limit <= 0 and not tail) or (max_running is not None and holding > max_running):
            return _NO_PLAN
        free = self.kv_block_capacity - self.kv_blocks
        bs = self.block_size
        if bs == 1:
            k = free // (n + c)
            k = limit if limit < k else k
            k = k if k > 0 else 0  # max(0, min(limit, k)), without two calls
            if tail and k == chunks and n * (chunks + 1) + left <= free:
                return chunks + 1, left - chunks * c, decodes or 0, rem
            return k, 0, decodes or 0, rem
        kv = self.kv[dec]
        blocks = self._blocks
        base = isum(blocks(kv))
        first = -(-m // bs)

        def grown(j: int) -> int:  # blocks the run's first j batches add (p's KV: min(j c, left))
            more = isum(blocks(kv + j)) - base if n else 0
            return more + (-(-(m + min(j * c, left)) // bs) - first if p >= 0 else 0)

        k = last_fitting(grown, free, limit)
        if tail and k == chunks and grown(chunks + 1) <= free:
            return chunks + 1, left - chunks * c, decodes or 0, rem
        return k, 0, decodes or 0, rem

    def plan_run(
        self: EngineState, requests: np.ndarray, chunk: int = 0, until: float | None = None
    ) -> tuple[int, np.ndarray]:
        """:meth:`run_limit` and the durations of that many batches (kept for :meth:`make_run`).

        With ``until``, only the batches that start before it (within :data:`TIME_TOL`) from the
        engine's clock: the run a simulator may take before it must show the policy the request
        arriving then. The batches' ends, added one by one as the clock adds them, are kept too
        (a run made from the clock then needs no second pass over its durations).
        """
        if self.cost_model is None:
            raise ValueError("plan_run needs a cost model")
        limit, last, completes, rem = self._plan_limit(requests, chunk)
        ends: list[float] | np.ndarray | float | None = None
        kv = None  # the decodes' KV (a fresh array: apply_run's record keeps it)
        if not limit:
            durations = np.zeros(0)
        elif chunk:
            p = requests.item(-1)
            kv = self.kv[requests[:-1]]
            durations = chunk_run_times(
                self.cost_model,
                kv,
                self.kv.item(p),
                chunk,
                self._phase.item(p),
                limit,
                last,
            )
        else:
            kv = self.kv[requests]
            priced = None
            if until is not None:  # only the batches that start before it, where the model can
                fn = self._run_until
                if fn is _UNSET:
                    fn = self._run_until = getattr(self.cost_model, "decode_run_until", None)
                if fn is not None:
                    priced = fn(kv, limit, self.clock, until, TIME_TOL)  # type: ignore[operator]
            if priced is not None:
                durations, ends = priced  # (the end of the last one: make_run's end for all of them)
                if durations.size < limit:
                    limit = int(durations.size)
                until = None  # (cut)
            else:
                durations = decode_run_times(self.cost_model, kv, limit)
        if until is not None and limit:
            durations, ends = _cut(self.clock, durations, until)
            if durations.size < limit:
                limit, last = int(durations.size), 0  # (the prompt's last chunk is cut off)
        durations.setflags(False)  # a run of all of them keeps the array itself
        self._planned = (self.num_batches, requests, chunk, limit, durations, last, completes, ends, kv, rem)
        return limit, durations

    def planned_durations(self: EngineState) -> np.ndarray | None:
        """The batch durations :meth:`plan_run` planned in this state (None: no plan since the last batch)."""
        planned = self._planned
        return planned[4] if planned is not None and planned[0] == self.num_batches else None

    def make_run(self: EngineState, start: float, requests: np.ndarray, k: int, chunk: int = 0) -> Run:
        """The run of the first ``k`` batches planned by :meth:`plan_run` for these items, from ``start``.

        With a chunk, the run ends with the prompt's last chunk when ``k`` is the
        plan's limit and the plan's last batch finishes the prompt.
        """
        planned = self._planned
        if (
            planned is None
            or planned[0] != self.num_batches
            or planned[1] is not requests
            or planned[2] != chunk
        ):
            raise ValueError("make_run needs a plan_run of the same items in this state")
        limit = planned[3]
        if not 1 <= k <= limit:
            raise ValueError(f"a run of {k} batches is outside the plan's 1..{limit}")
        durations = planned[4]
        if k < durations.size:  # a copy, not a view: a run keeps no more than its own k durations
            durations = durations[:k].copy()
            durations.setflags(False)
        start = float(start)
        ends = planned[7]  # (planned from the clock: each batch's end, or a float, the last one's)
        end = None
        if ends is not None and start == self.clock:
            if not isinstance(ends, float):  # (np.float64 is a float too)
                end = ends[k - 1]
            elif k == limit:
                end = ends
        if chunk:
            p = requests.item(-1)
            last = planned[5] if k == limit else 0
            run = Run._trusted(
                start, durations, requests[:-1], Chunk(p, chunk, self._phase.item(p), last), end
            )
        else:
            run = Run._trusted(start, durations, requests, None, end)
        # Whether a decode completes in the run (in its last batch, k being the plan's first completion),
        # and which one when the plan knows it is exactly one (a read-only view of the run's decodes).
        completes = k == planned[6]
        completed = None
        if completes:
            rem = planned[9]
            if rem is not None and rem.count(k) == 1:
                i = rem.index(k)
                completed = run.requests[i : i + 1]
        # A mixed run's items as one read-only array (the record of a last chunk's batch keeps them).
        items = requests if chunk and not requests.flags.writeable else None
        self._made_run = (run, self.num_batches, completes, planned[8], completed, items)
        return run

    def left_decoding(self: EngineState) -> np.ndarray | None:
        """The requests of the batch or run just applied that are decoding now, in its order (read-only).

        Only after an entry in which every item generated a token in the last batch
        (decodes, and prompt or refill chunks that finished their prompt): its items but
        the ones that completed, each now a decode with one token left. :meth:`plan_run`
        knows them as such (no re-check). ``None`` after any other entry, or if none is left.
        """
        last = self._generated_all
        if last is None or last[0] != self.num_batches:
            return None
        _, items, completed = last
        if not completed.size:
            left = items
        elif completed.size == 1:
            left = items[items != completed[0]]
        else:
            left = items[~self.done[items]]  # the completed ones are the only done ones among them
        if not left.size:
            return None
        left.setflags(False)
        self._applied = (left, self.num_batches, STEADY_DECODES)
        return left

    # --------------------------------------------------------------- checks
    def check_run(self: EngineState, run: Run, index: int | None = None) -> list[Violation]:
        """Every rule ``run`` breaks if applied now: O(items + k), state unchanged.

        A run that fails the closed-form test is spelled out on a copy of the state,
        so its violations are worded and located exactly as for single batches.
        """
        if self._run_ok(run):
            return []
        first = self.num_batches if index is None else index
        probe = self.__copy__()
        out: list[Violation] = []
        for j, batch in enumerate(run.batches()):
            out += probe.check(batch, first + j)
            probe.apply(batch)
        chunk = run.chunk
        if not out and chunk is not None:
            # Legal batches, but not as the run says: its chunks finish the prompt without a last
            # chunk (or a last chunk leaves some of it), so apply_run would not stand for them.
            p = chunk.request
            out.append(
                Violation(
                    Rule.BAD_RUN,
                    f"the run's chunks of {chunk.tokens} tokens (last {chunk.last or 'none'}) do not end "
                    "as its last chunk says: a chunk finishes the prompt only as a run's last (Chunk.last)",
                    first,
                    self.ids[p],
                )
            )
        return out

    def _arrived(self: EngineState, run: Run) -> bool:
        """Whether every request of ``run`` has arrived by its start."""
        start = run.start
        if start + TIME_TOL >= self._last_arrival:
            return True
        req, chunk = run.requests, run.chunk
        size = req.size
        if size and (
            max(self.arrival[req].tolist()) > start + TIME_TOL  # (a few items: cheaper on the list)
            if size <= SMALL and self._plain_arrivals
            else _count(self.arrival[req] > start + TIME_TOL)
        ):
            return False
        # (NaN never compares greater: a missing arrival counts as arrived, as for single batches.)
        return chunk is None or not self.arrival[chunk.request] > start + TIME_TOL

    def _run_ok(self: EngineState, run: Run) -> bool:
        start, dur, req, chunk = run.start, run.durations, run.requests, run.chunk
        if not (math.isfinite(start) and start >= self.clock - TIME_TOL):
            return False
        made = self._made_run
        if made is not None and made[0] is run and made[1] == self.num_batches:
            # make_run took its length and durations from this very state: only the start is new. From
            # the clock on, its decodes have arrived: each was scheduled before (a prompt precedes its
            # decodes), in a batch that started after its arrival and no later than the clock.
            if start < self.clock:
                return self._arrived(run)
            chunk = run.chunk
            return chunk is None or not self.arrival[chunk.request] > start + TIME_TOL
        if not (np.isfinite(dur).all() and np.min(dur) >= 0):
            return False
        if chunk is None:
            if self.run_limit(req) < run.repeat:
                return False
        else:
            p, c = chunk.request, chunk.tokens
            if not (0 <= p < self.n and c >= 1 and int(self._phase[p]) == chunk.phase != _DECODE):
                return False
            if req.size and not self._valid_positions(req):
                return False
            limit, last, _, _ = self._limit(req, False, p, c)
            # With a last chunk, exactly the planner's run that ends with it; without, none of its chunks
            # may finish the prompt (a limit that ends with the last chunk is one batch too long).
            if chunk.last:
                if limit != run.repeat or last != chunk.last:
                    return False
            elif limit - (last > 0) < run.repeat:
                return False
        if not self._arrived(run):
            return False
        if self.cost_model is not None:
            if chunk is None:
                expected = decode_run_times(self.cost_model, self.kv[req], run.repeat)
            else:
                kv_p = int(self.kv[chunk.request])
                expected = chunk_run_times(
                    self.cost_model, self.kv[req], kv_p, chunk.tokens, chunk.phase, run.repeat, chunk.last
                )
            if _count(np.abs(dur - expected) > DURATION_RTOL * np.maximum(1.0, np.abs(expected))):
                return False
        return True

    # ---------------------------------------------------------------- apply
    def apply_run(self: EngineState, run: Run) -> RunRecord:
        """Apply a legal ``run`` (checked by :meth:`check_run`) in one step: O(items).

        A run whose last chunk finishes its prompt is recorded as its head (the
        first ``k - 1`` batches) with the record of its last batch as ``tail``.
        """
        req, k, chunk = run.requests, run.durations.size, run.chunk  # (k: run.repeat, without the call)
        n = req.size
        made = self._made_run  # (make_run's, when it made this run in this state)
        if made is not None and (made[0] is not run or made[1] != self.num_batches):
            made = None
        record_kv, record_blocks = self.kv_tokens, self.kv_blocks
        chunk_kv = last = p = 0
        bs = self.block_size
        if chunk is not None:
            p, last = chunk.request, chunk.last
            grown = chunk.tokens * (k - 1) + last if last else chunk.tokens * k
            chunk_kv = self.kv.item(p)  # (scalar reads: .item, no numpy scalar)
            if not chunk_kv:
                self.num_holding += 1
                if math.isnan(self.first_scheduled.item(p)):
                    self.first_scheduled[p] = run.start
            self.kv[p] = chunk_kv + grown
            self._left[p] = self._left.item(p) - grown  # 0 only after a last chunk (below)
            self.kv_tokens += grown
            self.kv_blocks += (
                grown if bs == 1 else (chunk_kv + grown + bs - 1) // bs - (chunk_kv + bs - 1) // bs
            )
        running = self.num_holding
        if n:
            # make_run's plan read the decodes' KV in this state (a fresh array).
            kv_before = made[3] if made is not None and made[3] is not None else self.kv[req]
            # A 0-d operand (numpy converts a Python int on every call), from the table without a call.
            grow = OPERANDS[k] if k < NUM_OPERANDS else operand(k)
            kv_after = kv_before + grow
            self.kv[req] = kv_after
            self.generated[req] += grow  # distinct positions: one gather, add and scatter
            self.kv_tokens += n * k
            self.kv_blocks += n * k if bs == 1 else isum(self._blocks(kv_after) - self._blocks(kv_before))
            if made is not None and not made[2]:
                completed = _NO_ITEMS  # make_run's plan: no decode completes within these k batches
            elif made is not None and made[4] is not None:
                completed = made[4]  # the plan's one decode that completes in the last batch
            else:
                finished = self.generated[req] >= self.output[req]
                completed = req[finished] if _count(finished) else _NO_ITEMS
        else:
            kv_before = completed = _NO_ITEMS
        tail = None
        if last:
            # The last chunk finished p's prompt: p generates at the end of the run, as a batch's item.
            g = self.generated.item(p) + 1
            self.generated[p] = g
            self._left[p] = 1  # the token just generated
            self.refilling[p] = False
            self._phase[p] = _DECODE
            if g == 1:
                self.first_token[p] = run.end
            if g >= self.output.item(p):
                completed = np.append(completed, p)
            head = run.head()
            tail = new_batch_record(
                self.num_batches + k - 1,
                head.end,
                run.end,
                n + 1,
                n + last,
                last,
                n,
                self.kv_tokens,
                self.kv_blocks,
                running,
                0,
                made[5] if made is not None and made[5] is not None else _with(req, p),
                completed,
            )
        if completed.size:
            self._complete(completed, run.end)
        # Every item generated in the last batch (a chunk only when it was its prompt's last).
        if chunk is None or last:
            self._generated_all = (
                self.num_batches + k,
                tail.generated if tail is not None else req,
                completed,
            )
        record = new_run_record(
            self.num_batches,
            run if not last else head,
            kv_before,
            record_kv,
            record_blocks,
            bs,
            running,
            completed if not last else _NO_ITEMS,
            chunk_kv,
            tail,
        )
        end = run.end
        if end > self.clock:  # (max(clock, end), without the call)
            self.clock = end
        self.num_batches += k
        return record

    def step_run(self: EngineState, run: Run) -> RunRecord:
        """Check ``run`` and apply it; raise :class:`ScheduleError` if it is illegal."""
        made = self._made_run
        if (
            made is not None
            and made[0] is run
            and made[1] == self.num_batches
            and run.chunk is None
            and run.start == self.clock
        ):
            # _run_ok's first case, without the call (most runs): make_run planned this run of decodes
            # in this state, and from the clock on its decodes have arrived.
            return self.apply_run(run)
        if not self._run_ok(run):  # (check_run's closed-form test, which nearly every run passes)
            violations = self.check_run(run)
            if violations:
                raise ScheduleError(violations)
        return self.apply_run(run)


__all__ = ["NOT_STEADY", "STEADY_CHUNK", "STEADY_DECODES", "RunSteps"]
