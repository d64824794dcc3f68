"""The one semantic core: what a batch does to the engine state.

Everything that runs or checks a schedule goes through :class:`EngineState`:
the simulator steps it, the validator replays through it, solver results are
decoded into batches and replayed through it, and the executor follows it.
Its run half, :class:`~kvsched.schedule.runs.RunSteps` (inherited), says what a
coalesced run of ``k`` identical batches does (decodes, and in a mixed run one
prompt chunk that never finishes its prompt) and checks it in one step.

Rules (InferMax accounting, seed 003 Sec. 2 and 5)
--------------------------------------------------
A request with prompt I and output O keeps ``S = I + G`` known tokens, where G
is the number of tokens generated so far, and holds ``m`` KV tokens (tokens
processed and cached).

* Evictions listed on a batch apply first: the request's KV is dropped (m = 0),
  its generated tokens join its prompt, and it must process all S tokens again
  (*refill*) before it decodes again.
* An item of c tokens appends c KV (m += c). When all S tokens are processed
  (m == S) the request generates a token (G += 1). A decode is exactly the
  one-token step after a generation. After O tokens the request is complete and
  its KV is released *after* the batch, so its peak is I + O - 1.
* During a batch the KV held (all held KV plus the batch's appends, before
  completed requests release), rounded up to blocks per request, must fit in M.
* Per batch: tokens <= C, prefill + refill tokens <= P, requests holding KV <=
  ``max_running``, at most one item per request, nothing before its arrival,
  nothing after its completion, no decode before the prompt (or refill) is done.
* Batches do not overlap, and a batch lasts exactly what the cost model says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import CostModel, time_of_counts
from kvsched.costmodel.small import SMALL, count, fmax, imax, imin, isum, nonzero
from kvsched.instances.model import Instance
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Phase, Run
from kvsched.schedule.records import BatchRecord, Rule, RunRecord, ScheduleError, Violation, new_batch_record
from kvsched.schedule.runs import NOT_STEADY, STEADY_CHUNK, STEADY_DECODES, RunSteps
from kvsched.schedule.violations import DURATION_RTOL, TIME_TOL, full_check

_PREFILL, _DECODE, _REFILL = int(Phase.PREFILL), int(Phase.DECODE), int(Phase.REFILL)

# Ufunc reductions called directly: the ndarray methods add a Python layer that costs more than
# the reduction itself on the small per-batch arrays of the hot path.
_sum = np.add.reduce
_min = np.minimum.reduce
_max = np.maximum.reduce
_count = nonzero
_NO_EVICTIONS = np.zeros(0, dtype=np.int64)
_NO_EVICTIONS.flags.writeable = False
# Constants of the per-batch array operations as 0-d arrays of the operand's dtype: numpy 2 converts
# a Python scalar operand on every call, which costs about as much as the operation itself on a few
# items. Same dtypes and values, so the same results.
_ZERO = np.array(0, dtype=np.int64)
_ONE = np.array(1, dtype=np.int64)
_DECODE_CODE = np.array(_DECODE, dtype=np.int8)
_TRUE = np.array(True)
_FALSE = np.array(False)
_ARRAY = np.ndarray
_INT64 = np.dtype(np.int64)
_SEQUENCES = (tuple, list)  # evictions given as a Python sequence (an empty one is the usual case)


@dataclass(slots=True, eq=False)
class _Made:
    """What :meth:`EngineState.make_batch` read of the state for its batch, valid until the next apply."""

    batch: Batch
    stamp: int  # num_batches when it was made
    kv: np.ndarray  # KV held by each item's request before the batch (and its evictions)
    is_decode: np.ndarray  # which items are decodes
    num_decodes: int
    num_tokens: int


@dataclass(slots=True, eq=False)
class _Legal:
    """Per-item reads of a batch the quick path accepted, reused to apply it."""

    kv: np.ndarray  # KV held before the batch
    left: np.ndarray  # S - m before the batch: an item of that many tokens makes its request generate
    num_decodes: int
    num_tokens: int
    grown_blocks: int
    new_holders: int  # items whose request held no KV before the batch
    # Whether the decodes are the batch's first num_decodes items (policies put them first or
    # alone): then the other items, a few chunks, are applied on their lists.
    decodes_first: bool


class EngineState(RunSteps):
    """Mutable state of every request of an instance, and the rules that change it.

    Parameters
    ----------
    instance
        The problem. Request positions index every array here.
    cost_model
        When given, every batch's duration is checked against it and
        :meth:`make_batch` fills durations from it.

    Notes
    -----
    The per-request arrays are public for reading (policies read them); only
    :meth:`apply` writes them.
    """

    def __init__(self, instance: Instance, cost_model: CostModel | None = None) -> None:
        self.instance = instance
        self.cost_model = cost_model
        data = ProblemData.of(instance)
        self.data = data
        self.block_size = data.block_size
        self.kv_block_capacity = data.kv_blocks
        n = data.n
        self.n = n
        self.ids = data.ids
        # Read-only arrays shared with every state, view and policy of the instance.
        self.arrival = data.arrival
        self.prompt = data.prompt
        self.output = data.output
        # Dynamic state.
        self.generated = np.zeros(n, dtype=np.int64)  # G
        self.kv = np.zeros(n, dtype=np.int64)  # m: KV tokens held
        self.refilling = np.zeros(n, dtype=bool)  # evicted after generating, refill not done
        # The phase of each request's next item (see phase_of), kept in step with generated and
        # refilling by their only writers (_evict, _advance, _advance_legal): reading it is one gather.
        self._phase = np.full(n, _PREFILL, dtype=np.int8)
        # Tokens each request's next item may process: S - m while unfinished, 0 once done (kept by the
        # same writers), so that one gather and one comparison check both "not done" and "not too many".
        self._left = self.prompt.copy()
        self.done = np.zeros(n, dtype=bool)
        self.evictions = np.zeros(n, dtype=np.int64)
        # KV dropped so far (evictions and completions): every processed token is held or was dropped.
        self._dropped = np.zeros(n, dtype=np.int64)
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.completion = np.full(n, np.nan)
        self.clock = 0.0  # end of the last batch
        self.kv_tokens = 0  # sum of kv
        self.kv_blocks = 0  # sum of blocks(kv)
        self.num_holding = 0  # requests with kv > 0
        self.num_done = 0
        # The completed requests in the order they completed (num_done of them): a policy reads the ones
        # since its last look (completed_since) instead of gathering `done` over the ones it runs.
        self._completed: list[int] = []
        self.num_batches = 0
        self._made: _Made | None = None  # last make_batch result
        # The last read_items of a frozen array: (it, num_batches, phases, KV, decode mask and count).
        self._read: tuple | None = None
        self._planned: tuple | None = None  # last plan_run (RunSteps.plan_run)
        self._made_run: tuple[Run, ...] | None = None  # last make_run result (RunSteps.make_run says what)
        # The positions of the last batch the quick path accepted, the batch count after it, and what
        # a run may repeat of it (runs.STEADY_*): decode-only, or decodes then a chunk that did not
        # finish its prompt, having completed nothing (its items are a run's items again).
        self._applied: tuple[np.ndarray, int, int] | None = None
        # After a batch or run whose every item generated a token: the batch count, its items and the
        # completed ones (RunSteps.left_decoding reads them).
        self._generated_all: tuple[int, np.ndarray, np.ndarray] | None = None
        self._mark = np.zeros(n, dtype=bool)  # scratch for membership tests; all False between calls
        self._slot = np.zeros(n, dtype=np.int64)  # scratch for the duplicate test
        self._arange = np.arange(n, dtype=np.int64)
        self._last_arrival = float(self.arrival.max()) if n else 0.0
        self._plain_arrivals = not np.isnan(self.arrival).any()  # a max stands for "any later than"
        self._time_of = time_of_counts(cost_model) if cost_model is not None else None
        lim = instance.limits  # read per batch by the quick check
        self._budgets = (lim.max_batch_tokens, lim.max_prefill_tokens, lim.max_running)

    def __copy__(self) -> EngineState:
        """An independent copy of the state (the instance and the cost model are shared).

        Every array is copied, the private bookkeeping too, so that stepping the copy
        never changes the original (search code clones states to branch on batches).
        """
        new = object.__new__(type(self))
        new.__dict__.update(
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self.__dict__.items()}
        )
        new._made = new._planned = new._made_run = new._applied = new._generated_all = new._read = None
        new._completed = list(self._completed)
        return new

    # ------------------------------------------------------------------ reads
    def unprocessed(self, idx: np.ndarray | int) -> np.ndarray:
        """Tokens known but not yet processed (S - m) for the given requests."""
        return self.prompt[idx] + self.generated[idx] - self.kv[idx]

    def phase_of(self, idx: np.ndarray) -> np.ndarray:
        """The phase each request's next item would have (before evictions).

        Prefill while nothing is generated, refill while ``refilling``, decode otherwise
        (plain int8 codes, not :class:`Phase` members: enum lookups dominate the hot path).
        """
        if isinstance(idx, np.ndarray):
            return self._phase[idx]  # a gather: always a fresh array
        return np.array(self._phase[idx], dtype=np.int8)  # never a view of the state (slices)

    @property
    def processed(self) -> np.ndarray:
        """All tokens ever processed per request (a fresh array): the KV held plus the KV dropped."""
        return self.kv + self._dropped

    @property
    def all_done(self) -> bool:
        return self.num_done == self.n

    def completed_since(self, k: int) -> list[int]:
        """The requests that completed after the first ``k`` completions, in the order they completed
        (a fresh list; ``completed_since(0)`` is every completed request)."""
        return self._completed[k:]

    def read_items(self, req: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """KV held and decode mask of ``req`` now (read-only arrays), and the decode count.

        When ``req`` is a read-only int64 vector that owns its data (nobody holds a writeable view of
        it), :meth:`make_batch` of exactly this array, before the next apply and without evictions,
        takes these reads instead of gathering them again (a policy that schedules every request it
        read, in that order, saves the core's gathers).
        """
        phases = self._phase[req]  # (kept here alone: make_batch freezes it with its batch)
        kv = self.kv[req]
        is_decode = phases == _DECODE_CODE
        num_decodes = count(is_decode)
        kv.setflags(False)
        is_decode.setflags(False)
        owned = type(req) is _ARRAY and req.base is None and req.dtype is _INT64 and req.ndim == 1
        if owned and not req.flags.writeable:  # (the flags last: making their object costs the most)
            self._read = (req, self.num_batches, phases, kv, is_decode, num_decodes)
        return kv, is_decode, num_decodes

    def breaks_limits(self, num_tokens: int, prefill_tokens: int, holding: int, blocks: int) -> bool:
        """Whether a batch with these totals breaks a batch-wide limit now: ``num_tokens`` over C,
        ``prefill_tokens`` (prefill and refill) over P, ``holding`` (requests holding KV during it) over
        ``max_running``, or ``blocks`` (KV blocks held during it) over M."""
        max_tokens, max_prefill, max_running = self._budgets
        return (
            (max_tokens is not None and num_tokens > max_tokens)
            or (max_prefill is not None and prefill_tokens > max_prefill)
            or (max_running is not None and holding > max_running)
            or blocks > self.kv_block_capacity
        )

    def _blocks(self, tokens: np.ndarray) -> np.ndarray:
        if self.block_size == 1:
            return tokens
        return -(-tokens // self.block_size)

    # ------------------------------------------------------------ build batches
    def make_batch(
        self,
        start: float,
        requests: Sequence[int] | np.ndarray,
        tokens: Sequence[int] | np.ndarray,
        evicted: Sequence[int] | np.ndarray = (),
    ) -> Batch:
        """Build the batch that processes ``tokens`` for ``requests`` after ``evicted``.

        Phases are derived from the state and the duration from the cost model
        (which must be set), so producers of schedules never restate the rules.
        """
        time_of = self._time_of
        if time_of is None or self.cost_model is None:
            raise ValueError("make_batch needs a cost model")
        read = self._read
        if read is not None and requests is read[0] and read[1] == self.num_batches:
            # The very array read_items read from this state (frozen, owning its data): its reads are
            # this batch's unless an eviction changes them.
            req = requests
        elif type(requests) is _ARRAY and requests.base is None and requests.dtype is _INT64:
            # Fresh arrays (never the caller's), frozen and handed to the batch without another copy; a
            # read-only int64 array that owns its data (a policy's frozen items) is shared as it is, as
            # a run shares its frozen durations (Run.of): nobody holds a writeable view of it.
            read = None
            req = requests if not requests.flags.writeable else np.array(requests)
        else:
            read = None
            req = np.array(requests, dtype=np.int64)
        if type(tokens) is _ARRAY and tokens.base is None and tokens.dtype is _INT64:
            tok = tokens if not tokens.flags.writeable else np.array(tokens)
        else:
            tok = np.array(tokens, dtype=np.int64)
        if req.ndim != 1:
            req = req.reshape(-1)
        if tok.ndim != 1:
            tok = tok.reshape(-1)
        if req.size != tok.size:
            raise ValueError("requests, tokens and phases must have the same length")
        if type(evicted) in _SEQUENCES and not evicted:
            # No evictions (most batches): the phases and KV of the items are the state's.
            ev = _NO_EVICTIONS
            if read is not None:
                phases, context, is_decode, num_decodes = read[2:]
            else:
                phases = self._phase[req]
                context = self.kv[req]
                is_decode = phases == _DECODE_CODE
                num_decodes = count(is_decode)
        else:
            ev = np.array(evicted, dtype=np.int64).reshape(-1)
            if not ev.size:
                ev = _NO_EVICTIONS
            phases, context = self._phases_after(req, ev)
            ev.setflags(False)
            is_decode = phases == _DECODE_CODE
            num_decodes = count(is_decode)
        num_tokens = isum(tok)
        duration = time_of(tok, context, phases, is_decode, num_decodes, num_tokens)
        # (write=False, positional: half the keyword's cost, a third of .flags'; a shared array is already)
        if req is not requests:
            req.setflags(False)
        if tok is not tokens:
            tok.setflags(False)
        phases.setflags(False)
        batch = Batch._trusted(float(start), float(duration), req, tok, phases, ev)
        # Its duration is right by construction while the state is unchanged: check() skips recomputing it.
        self._made = _Made(batch, self.num_batches, context, is_decode, num_decodes, num_tokens)
        return batch

    def _phases_after(self, req: np.ndarray, ev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Phases and KV context of ``req`` once the evictions ``ev`` have applied (fresh arrays)."""
        phases = self._phase[req]
        context = self.kv[req]
        if ev.size:
            hit = self._member(req, ev)
            if _count(hit):
                context[hit] = 0
                phases[hit] = np.where(self.generated[req[hit]] == 0, Phase.PREFILL, Phase.REFILL)
        return phases, context

    def _valid_positions(self, req: np.ndarray, gathered: bool = False) -> bool:
        """Whether the positions ``req`` (at least one) are distinct and in range, ``0 <= p < n``: the one
        test of a batch's and a run's items. ``gathered``: a gather of them read the state already,
        which fails past the end (a negative position wraps: still tested)."""
        size = req.size
        if size <= SMALL:  # builtins win on a few items: the list once for the three tests
            items = req.tolist()
            return min(items) >= 0 and (gathered or max(items) < self.n) and len(set(items)) == size
        # Strictly increasing positions are distinct and bounded by their ends: a comparison and a count,
        # half the general test (a policy's priority order is often the positions', arrival order).
        if not _count(req[1:] <= req[:-1]):
            return req.item(0) >= 0 and (gathered or req.item(-1) < self.n)
        if size > self.n or _count(req < _ZERO) or not (gathered or imax(req) < self.n):
            return False
        # Each position finds its own index where all wrote theirs (O(size), no sort).
        slot, index = self._slot, self._arange[:size]
        slot[req] = index
        return not _count(slot[req] != index)

    def _member(self, values: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """``np.isin(values, pool)`` for request positions, in three calls when both are in range."""
        n = self.n
        if not (values.size and pool.size) or min(_min(values), _min(pool)) < 0:
            return np.isin(values, pool)
        if max(_max(values), _max(pool)) >= n:
            return np.isin(values, pool)
        return self._marked(values, pool)

    def _marked(self, values: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """:meth:`_member` of positions already known to be in range (no bounds' reductions)."""
        mark = self._mark
        mark[pool] = True
        hit = mark[values]
        mark[pool] = False
        return hit

    # ------------------------------------------------------------------ checks
    def check(self, batch: Batch, index: int | None = None) -> list[Violation]:
        """Every rule ``batch`` breaks if applied now (the state is not changed)."""
        if self._quick(batch) is not None:
            return []
        return self._full_check(batch, index)

    def _full_check(self, batch: Batch, index: int | None = None) -> list[Violation]:
        """Every rule ``batch`` breaks, each worded (the slow path of :meth:`check`)."""
        return full_check(self, batch, index)

    def _quick_ok(self, batch: Batch) -> bool:
        """Whether ``batch`` is certainly legal: one vectorised pass over the common case.

        False means "run the full check" (which finds and words the violations),
        not necessarily illegal.
        """
        return self._quick(batch) is not None

    def _quick(self, batch: Batch) -> _Legal | None:
        """The quick path of :meth:`check`: the reads :meth:`step` reuses if ``batch`` is certainly legal.

        ``None`` means "run the full check". Every rule of the full check is tested here,
        in as few calls as possible (this runs once per simulated batch).
        """
        req, tok, ev = batch.requests, batch.tokens, batch.evicted
        size = req.size
        start, duration = batch.start, batch.duration
        if size == 0:
            return None
        if not (math.isfinite(start) and start >= self.clock - TIME_TOL):
            return None
        if not (math.isfinite(duration) and duration >= 0):
            return None
        made = self._made
        if made is None or made.batch is not batch or made.stamp != self.num_batches:
            made = None
            if tok.shape != req.shape or batch.phases.shape != req.shape:
                return None
        # (A comparison and a count cost half a reduction on a few hundred items.)
        if (imin(tok) < 1) if size <= SMALL else _count(tok < _ONE):
            return None
        if not self._valid_positions(req, made is not None):  # (make_batch gathered them)
            return None
        ev_count = 0
        ev_blocks = 0
        if ev.size:
            # Distinct, known requests that hold KV and are not processed in this batch.
            if not self._valid_positions(ev):
                return None
            held = self.kv[ev]
            # Both in range by now (req's reads in make_batch or above, ev's bounds just checked).
            if not imin(held) > 0 or _count(self._marked(ev, req)):
                return None
            ev_count = int(ev.size)
            ev_blocks = isum(self._blocks(held))
        # Not done (left 0) and at most what is left (tok >= 1 was checked); no item is evicted, so
        # evictions change neither this nor the items' phases and KV.
        left = self._left[req]
        if _count(tok > left):
            return None
        if start + TIME_TOL < self._last_arrival and (
            fmax(self.arrival[req]) > start + TIME_TOL
            if self._plain_arrivals
            else _count(self.arrival[req] > start + TIME_TOL)
        ):
            return None
        if made is not None:
            # make_batch derived the phases, the counts and the duration from this very state.
            phases, kv = batch.phases, made.kv
            is_decode, num_decodes, num_tokens = made.is_decode, made.num_decodes, made.num_tokens
        else:
            phases, kv = self._phase[req], self.kv[req]
            if _count(phases != batch.phases):
                return None
            is_decode = phases == _DECODE_CODE
            num_decodes = count(is_decode)
            num_tokens = isum(tok)
        prefill_tokens = 0  # (summed only where there is a prefill budget to read it)
        if self._budgets[1] is not None and num_decodes < size:
            prefill_tokens = num_tokens - isum(tok[is_decode]) if num_decodes else num_tokens
        # Whether the decodes are the first num_decodes items; then the other items, a few chunks, are
        # the only ones that may hold no KV (a decode's request holds KV): counted on their list.
        decodes_first = (
            num_decodes == size or not num_decodes or count(is_decode[:num_decodes]) == num_decodes
        )
        if num_decodes == size:
            new_holders = 0
        elif size <= SMALL:
            new_holders = kv.tolist().count(0)
        elif decodes_first and size - num_decodes <= SMALL:
            new_holders = kv[num_decodes:].tolist().count(0)
        else:
            new_holders = count(kv == _ZERO)
        grown = num_tokens if self.block_size == 1 else isum(self._blocks(kv + tok) - self._blocks(kv))
        holding, blocks = self.num_holding - ev_count + new_holders, self.kv_blocks - ev_blocks + grown
        if self.breaks_limits(num_tokens, prefill_tokens, holding, blocks):
            return None
        if made is None and self._time_of is not None:
            expected = self._time_of(tok, kv, phases, is_decode, num_decodes, num_tokens)
            if abs(duration - expected) > DURATION_RTOL * max(1.0, abs(expected)):
                return None
        return _Legal(kv, left, num_decodes, num_tokens, grown, new_holders, decodes_first)

    # ------------------------------------------------------------------- apply
    def apply(self, batch: Batch) -> BatchRecord:
        """Apply ``batch`` to the state, without checking it.

        Safe on an illegal batch: unknown, duplicate or finished requests are
        skipped and tokens are capped at what is left, so a validator can keep
        replaying after a violation and report the later ones too.
        """
        n = self.n
        ev = np.unique(batch.evicted[(batch.evicted >= 0) & (batch.evicted < n)])
        ev = ev[self.kv[ev] > 0]
        req = batch.requests
        keep = (req >= 0) & (req < n)
        req, tok = req[keep], batch.tokens[keep]
        _, first = np.unique(req, return_index=True)
        if first.size != req.size:
            first.sort()
            req, tok = req[first], tok[first]
        ok = ~self.done[req] & (tok >= 1)
        req, tok = req[ok], tok[ok]
        self._evict(ev)
        tok = np.minimum(tok, self.prompt[req] + self.generated[req] - self.kv[req])
        return self._advance(batch, req, tok, self.phase_of(req) == _DECODE, int(ev.size))

    def step(self, batch: Batch) -> BatchRecord:
        """Check ``batch`` and apply it; raise :class:`ScheduleError` if it is illegal."""
        legal = self._quick(batch)
        if legal is not None:
            if batch.evicted.size:
                self._evict(batch.evicted)
            return self._advance_legal(batch, legal)
        violations = self._full_check(batch)
        if violations:
            raise ScheduleError(violations)
        # A legal batch needs none of apply()'s clean-up: its phases are the derived ones.
        self._evict(batch.evicted)
        return self._advance(
            batch, batch.requests, batch.tokens, batch.phases == _DECODE, int(batch.evicted.size)
        )

    def check_and_apply(self, batch: Batch, index: int | None = None) -> tuple[list[Violation], BatchRecord]:
        """:meth:`check` then :meth:`apply` (the validator's step), reusing the quick path's reads when legal."""
        legal = self._quick(batch)
        if legal is not None:
            self._evict(batch.evicted)
            return [], self._advance_legal(batch, legal)
        return self._full_check(batch, index), self.apply(batch)

    def _evict(self, ev: np.ndarray) -> None:
        """Drop the KV of ``ev`` (distinct requests that hold KV): each processes all S tokens again.

        One request at a time on scalars: a batch evicts one to three, where the dozen array calls of
        a vectorised pass cost several times more (and a rare large eviction about 1.5 us a request).
        """
        if not ev.size:
            return
        kv, dropped, generated, prompt = self.kv, self._dropped, self.generated, self.prompt
        bs = self.block_size
        for r in ev.tolist():
            m = kv.item(r)
            self.kv_tokens -= m
            self.kv_blocks -= m if bs == 1 else -(-m // bs)
            kv[r] = 0
            dropped[r] = dropped.item(r) + m
            g = generated.item(r)
            self._left[r] = prompt.item(r) + g  # all S tokens again
            self.refilling[r] = g > 0
            self._phase[r] = _REFILL if g > 0 else _PREFILL
            self.evictions[r] = self.evictions.item(r) + 1
        self.num_holding -= ev.size

    def _advance(
        self, batch: Batch, req: np.ndarray, tok: np.ndarray, is_decode: np.ndarray, num_evicted: int
    ) -> BatchRecord:
        """Process ``tok`` tokens of each of ``req`` (distinct, unfinished, within what is left)."""
        start, end = batch.start, batch.start + batch.duration
        fresh = np.isnan(self.first_scheduled[req])
        self.first_scheduled[req[fresh]] = start

        kv_old = self.kv[req]
        kv_new = kv_old + tok
        self.num_holding += int(((kv_old == 0) & (kv_new > 0)).sum())
        self.kv_tokens += int(tok.sum())
        self.kv_blocks += int((self._blocks(kv_new) - self._blocks(kv_old)).sum())
        self.kv[req] = kv_new
        kv_during, blocks_during, running = self.kv_tokens, self.kv_blocks, self.num_holding

        left = self.prompt[req] + self.generated[req] - kv_new
        self._left[req] = left
        gen = req[left == 0]
        self.generated[gen] += 1
        self._left[gen] = 1  # the token just generated
        self.refilling[gen] = False
        self._phase[gen] = _DECODE
        first_tok = gen[self.generated[gen] == 1]
        self.first_token[first_tok] = end
        completed = gen[self.generated[gen] >= self.output[gen]]
        if completed.size:
            self._complete(completed, end)

        num_tokens = int(tok.sum())
        decode_tokens = int(is_decode.sum())  # a decode is one token
        record = BatchRecord(
            index=self.num_batches,
            start=start,
            end=end,
            num_items=int(req.size),
            num_tokens=num_tokens,
            prefill_tokens=num_tokens - decode_tokens,
            num_decodes=decode_tokens,
            kv_tokens=kv_during,
            kv_blocks=blocks_during,
            num_running=running,
            num_evicted=num_evicted,
            generated=gen,
            completed=completed,
        )
        self.clock = max(self.clock, end)
        self.num_batches += 1
        return record

    def _complete(self, completed: np.ndarray, end: float) -> None:
        """Requests ``completed`` (non-empty) generated their last token in a batch ending at ``end``: their
        KV is freed, and they are done. A batch and a run (:mod:`kvsched.schedule.runs`) both end here."""
        if completed.size == 1:
            # The usual case (one completion): scalar reads and writes cost a fifth of the gathers.
            r = completed.item(0)
            m = self.kv.item(r)
            self.kv_tokens -= m
            self.kv_blocks -= m if self.block_size == 1 else -(-m // self.block_size)
            self.num_holding -= 1
            self.kv[r] = 0
            self._dropped[r] += m
            self._left[r] = 0
            self.done[r] = True
            self.completion[r] = end
            self.num_done += 1
            self._completed.append(r)
            return
        kv_c = self.kv[completed]
        self.kv_tokens -= isum(kv_c)
        self.kv_blocks -= isum(self._blocks(kv_c))
        self.num_holding -= int(completed.size)
        self.kv[completed] = 0
        self._dropped[completed] += kv_c
        self._left[completed] = _ZERO
        self.done[completed] = _TRUE
        self.completion[completed] = end
        self.num_done += int(completed.size)
        self._completed += completed.tolist()

    def _advance_legal(self, batch: Batch, legal: _Legal) -> BatchRecord:
        """:meth:`_advance` for a batch the quick path accepted, reusing its reads.

        Same effect on the state and the same record, with fewer array calls: a legal
        batch has distinct, unfinished items of at least one token within what is left.
        """
        req, tok = batch.requests, batch.tokens
        start = batch.start
        end = start + batch.duration
        kv_old = legal.kv
        size = req.size
        num_decodes = legal.num_decodes
        decode_only = num_decodes == size
        # The chunks (prompt or refill items) on their lists when they follow the decodes and are few.
        tail = (
            num_decodes if not decode_only and legal.decodes_first and size - num_decodes <= SMALL else None
        )
        if legal.new_holders and tail is None:  # (with a tail, in its pass below)
            # Only a request that never held KV can be scheduled for the first time (not a decode).
            first = self.first_scheduled
            if size <= SMALL:  # on the lists: a few items cost less than four array calls
                for r, m in zip(req.tolist(), kv_old.tolist(), strict=True):
                    if not m and math.isnan(first.item(r)):
                        first[r] = start
            else:
                cand = req[kv_old == _ZERO]
                first[cand[np.isnan(first[cand])]] = start
        self.num_holding += legal.new_holders  # every item processes >= 1 token
        self.kv_tokens += legal.num_tokens
        self.kv_blocks += legal.grown_blocks
        self.kv[req] = kv_old + tok
        kv_during, blocks_during, running = self.kv_tokens, self.kv_blocks, self.num_holding

        finished_prompts: list[int] = []  # chunks that finished their prompt (tail path)
        if decode_only:
            # A decode processes its one token left and generates: one token is left again.
            gen = req
        elif tail is not None:
            # Each decode generates and keeps one token left; a chunk generates when it takes all it has left.
            # One pass over the chunks: also the first scheduling of a request that held no KV (as above).
            left_of, first, new_holders = self._left, self.first_scheduled, legal.new_holders
            chunks: Iterable[tuple[int, int, int, int]]
            if tail == size - 1:  # one chunk (the usual): four scalar reads, not four slices and lists
                chunks = ((req.item(tail), kv_old.item(tail), legal.left.item(tail), tok.item(tail)),)
            else:
                chunks = zip(
                    req[tail:].tolist(),
                    kv_old[tail:].tolist(),
                    legal.left[tail:].tolist(),
                    tok[tail:].tolist(),
                    strict=True,
                )
            for r, m, have, c in chunks:
                if new_holders and not m and math.isnan(first.item(r)):
                    first[r] = start
                if have == c:
                    finished_prompts.append(r)
                    left_of[r] = 1  # the token just generated
                else:
                    left_of[r] = have - c
            # The record keeps these arrays for the whole run: share the batch's own (read-only)
            # positions when every item generated.
            if len(finished_prompts) == size - tail:
                gen = req
            elif not finished_prompts:
                gen = req[:tail]
            else:
                gen = np.concatenate((req[:tail], finished_prompts), dtype=np.int64)
        else:
            left = legal.left - tok
            made = left == _ZERO
            gen = req if _count(made) == size else req[made]
            left[made] = _ONE  # the token just generated
            self._left[req] = left
        generated = self.generated[gen] + _ONE
        self.generated[gen] = generated
        # A decode is already in the decode phase, and only a prefill makes a first token; when gen is
        # the decodes alone, no prompt or refill finished.
        if finished_prompts:
            generated_of, first_token = self.generated, self.first_token
            for r in finished_prompts:
                self.refilling[r] = False
                self._phase[r] = _DECODE
                if generated_of.item(r) == 1:
                    first_token[r] = end
        elif gen.size != num_decodes and tail is None:
            self.refilling[gen] = _FALSE
            self._phase[gen] = _DECODE_CODE
            self.first_token[gen[generated == _ONE]] = end
        finished = generated >= self.output[gen]
        # One shared empty array when nothing completed.
        completed = gen[finished] if _count(finished) else _NO_EVICTIONS
        if completed.size:
            self._complete(completed, end)

        # Positional: the keywords would cost more than the rest of this block (fields in order).
        num_tokens = legal.num_tokens
        record = new_batch_record(
            self.num_batches,
            start,
            end,
            size,
            num_tokens,
            num_tokens - num_decodes,
            num_decodes,
            kv_during,
            blocks_during,
            running,
            batch.evicted.size,
            gen,
            completed,
        )
        if end > self.clock:  # (max(clock, end), without the call)
            self.clock = end
        self.num_batches += 1
        if completed.size:
            steady = NOT_STEADY
        elif decode_only:
            steady = STEADY_DECODES
        elif num_decodes == size - 1 and gen.size == num_decodes and batch.phases[-1] != _DECODE_CODE:
            steady = STEADY_CHUNK  # decodes, then a chunk that did not finish its prompt
        else:
            steady = NOT_STEADY
        self._applied = (req, self.num_batches, steady)
        if gen.size == size:
            self._generated_all = (self.num_batches, req, completed)
        return record

    def finish(self) -> list[Violation]:
        """Violations of the end state: every request must have completed."""
        out = []
        for pos in np.flatnonzero(~self.done):
            g, o = int(self.generated[pos]), int(self.output[pos])
            out.append(
                Violation(
                    Rule.INCOMPLETE,
                    f"generated {g} of {o} output tokens by the end of the schedule",
                    None,
                    self.ids[pos],
                )
            )
        return out


__all__ = [
    "DURATION_RTOL",
    "TIME_TOL",
    "BatchRecord",
    "EngineState",
    "Rule",
    "RunRecord",
    "ScheduleError",
    "Violation",
]
