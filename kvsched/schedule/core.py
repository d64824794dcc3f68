"""The one semantic core: what a batch does to the engine state.

Everything that runs or checks a schedule goes through :class:`EngineState`:
the simulator steps it, the validator replays through it, solver results are
decoded into batches and replayed through it, and the executor follows it.

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

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kvsched.costmodel.base import BatchView, CostModel
from kvsched.errors import KvschedError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Batch, Phase

#: Absolute tolerance on times (overlap, arrival).
TIME_TOL = 1e-9
#: Relative tolerance of a batch's duration against its cost model.
DURATION_RTOL = 1e-6

_PREFILL, _DECODE, _REFILL = int(Phase.PREFILL), int(Phase.DECODE), int(Phase.REFILL)


class Rule(StrEnum):
    """The rule a violation breaks."""

    EMPTY_BATCH = "empty-batch"
    OVERLAP = "overlap"
    WRONG_DURATION = "wrong-duration"
    UNKNOWN_REQUEST = "unknown-request"
    BEFORE_ARRIVAL = "before-arrival"
    AFTER_COMPLETION = "after-completion"
    DUPLICATE_ITEM = "duplicate-item"
    BAD_TOKENS = "bad-tokens"
    TOO_MANY_TOKENS = "too-many-tokens"
    DECODE_BEFORE_PREFILL = "decode-before-prefill"
    PHASE_MISMATCH = "phase-mismatch"
    BAD_EVICTION = "bad-eviction"
    TOKEN_BUDGET = "token-budget"
    PREFILL_BUDGET = "prefill-budget"
    MAX_RUNNING = "max-running"
    KV_CAPACITY = "kv-capacity"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule, located by batch index and request id where it applies."""

    rule: Rule
    message: str
    batch: int | None = None
    request: str | None = None

    def __str__(self) -> str:
        where = []
        if self.batch is not None:
            where.append(f"batch {self.batch}")
        if self.request is not None:
            where.append(f"request {self.request!r}")
        prefix = ", ".join(where)
        return f"{prefix}: [{self.rule}] {self.message}" if prefix else f"[{self.rule}] {self.message}"


class ScheduleError(KvschedError):
    """An illegal batch or schedule; carries every violation found."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = list(violations)
        first = str(self.violations[0]) if self.violations else "illegal schedule"
        more = len(self.violations) - 1
        super().__init__(first + (f" (and {more} more violation{'s' * (more > 1)})" if more else ""))


@dataclass(frozen=True, slots=True, eq=False)
class BatchRecord:
    """What happened in one applied batch (input to the metrics)."""

    index: int
    start: float
    end: float
    num_items: int
    num_tokens: int
    prefill_tokens: int
    num_decodes: int
    kv_tokens: int
    kv_blocks: int
    num_running: int
    num_evicted: int
    generated: np.ndarray  # positions of the requests that generated a token
    completed: np.ndarray  # positions of the requests that completed


class EngineState:
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
        lim = instance.limits
        self.block_size = lim.block_size
        self.kv_block_capacity = lim.kv_blocks
        reqs = instance.requests
        n = len(reqs)
        self.n = n
        self.ids = [r.id for r in reqs]
        self.arrival = np.array([r.arrival for r in reqs], dtype=np.float64)
        self.prompt = np.array([r.prompt for r in reqs], dtype=np.int64)
        self.output = np.array([r.output for r in reqs], dtype=np.int64)
        # Dynamic state.
        self.generated = np.zeros(n, dtype=np.int64)  # G
        self.kv = np.zeros(n, dtype=np.int64)  # m: KV tokens held
        self.refilling = np.zeros(n, dtype=bool)  # evicted after generating, refill not done
        self.done = np.zeros(n, dtype=bool)
        self.evictions = np.zeros(n, dtype=np.int64)
        self.processed = np.zeros(n, dtype=np.int64)  # all tokens ever processed
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.completion = np.full(n, np.nan)
        self.clock = 0.0  # end of the last batch
        self.kv_tokens = 0  # sum of kv
        self.kv_blocks = 0  # sum of blocks(kv)
        self.num_holding = 0  # requests with kv > 0
        self.num_done = 0
        self.num_batches = 0
        self._made: tuple[Batch, int] | None = None  # last make_batch result, and when

    # ------------------------------------------------------------------ reads
    def unprocessed(self, idx: np.ndarray | int) -> np.ndarray:
        """Tokens known but not yet processed (S - m) for the given requests."""
        return self.prompt[idx] + self.generated[idx] - self.kv[idx]

    def phase_of(self, idx: np.ndarray) -> np.ndarray:
        """The phase each request's next item would have (before evictions)."""
        # Plain ints, not Phase members: enum lookups dominate this hot path.
        return np.where(
            self.generated[idx] == 0, _PREFILL, np.where(self.refilling[idx], _REFILL, _DECODE)
        ).astype(np.int8)

    @property
    def all_done(self) -> bool:
        return self.num_done == self.n

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
        if self.cost_model is None:
            raise ValueError("make_batch needs a cost model")
        req = np.asarray(requests, dtype=np.int64)
        tok = np.asarray(tokens, dtype=np.int64)
        ev = np.asarray(evicted, dtype=np.int64)
        phases, context = self._phases_after(req, ev)
        duration = self.cost_model.batch_time(BatchView(tok, context, phases))
        batch = Batch.of(start, duration, req, tok, phases, ev)
        # Its duration is right by construction while the state is unchanged: check() skips recomputing it.
        self._made = (batch, self.num_batches)
        return batch

    def _phases_after(self, req: np.ndarray, ev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Phases and KV context of ``req`` once the evictions ``ev`` have applied."""
        phases = self.phase_of(req)
        context = self.kv[req].copy()
        if ev.size:
            hit = np.isin(req, ev)
            if hit.any():
                context[hit] = 0
                phases[hit] = np.where(self.generated[req[hit]] == 0, Phase.PREFILL, Phase.REFILL)
        return phases, context

    # ------------------------------------------------------------------ checks
    def check(self, batch: Batch, index: int | None = None) -> list[Violation]:
        """Every rule ``batch`` breaks if applied now (the state is not changed)."""
        if self._quick_ok(batch):
            return []
        return self._full_check(batch, index)

    def _full_check(self, batch: Batch, index: int | None = None) -> list[Violation]:
        """Every rule ``batch`` breaks, each worded (the slow path of :meth:`check`)."""
        idx = self.num_batches if index is None else index
        out: list[Violation] = []

        def add(rule: Rule, msg: str, pos: int | None = None) -> None:
            rid = self.ids[pos] if pos is not None and 0 <= pos < self.n else None
            out.append(Violation(rule, msg, idx, rid))

        req, tok, ev = batch.requests, batch.tokens, batch.evicted
        if req.size == 0:
            add(Rule.EMPTY_BATCH, "a batch must process at least one item")
        if not np.isfinite(batch.start):
            add(Rule.OVERLAP, f"start {batch.start!r} is not a finite time")
        elif batch.start < self.clock - TIME_TOL:
            add(Rule.OVERLAP, f"starts at {batch.start:g}, before the previous batch ends at {self.clock:g}")
        if not np.isfinite(batch.duration) or batch.duration < 0:
            add(Rule.WRONG_DURATION, f"duration {batch.duration!r} is not a finite non-negative number")

        # Unknown positions are reported and dropped from the remaining checks.
        known = (req >= 0) & (req < self.n)
        for k in np.flatnonzero(~known):
            add(Rule.UNKNOWN_REQUEST, f"item refers to request position {int(req[k])}, not in the instance")
        ev_known = (ev >= 0) & (ev < self.n)
        for k in np.flatnonzero(~ev_known):
            add(Rule.UNKNOWN_REQUEST, f"eviction of request position {int(ev[k])}, not in the instance")
        req, tok, phases_declared = req[known], tok[known], batch.phases[known]
        ev = ev[ev_known]

        # Evictions.
        ev_unique, ev_counts = np.unique(ev, return_counts=True)
        for pos in ev_unique[ev_counts > 1]:
            add(Rule.BAD_EVICTION, "evicted twice before the same batch", int(pos))
        for pos in ev_unique[self.kv[ev_unique] == 0]:
            what = "completed" if self.done[pos] else "holds no KV"
            add(Rule.BAD_EVICTION, f"evicted but it {what}", int(pos))
        for pos in np.intersect1d(ev_unique, req):
            add(Rule.BAD_EVICTION, "evicted and processed in the same batch", int(pos))

        # Items.
        uniq, counts = np.unique(req, return_counts=True)
        for pos in uniq[counts > 1]:
            add(Rule.DUPLICATE_ITEM, f"appears {int(counts[uniq == pos][0])} times in one batch", int(pos))
        for k in np.flatnonzero(self.done[req]):
            add(Rule.AFTER_COMPLETION, "processed after it completed", int(req[k]))
        late = self.arrival[req] > batch.start + TIME_TOL
        for k in np.flatnonzero(late):
            pos = int(req[k])
            add(
                Rule.BEFORE_ARRIVAL,
                f"processed at {batch.start:g}, before it arrives at {self.arrival[pos]:g}",
                pos,
            )
        for k in np.flatnonzero(tok < 1):
            add(Rule.BAD_TOKENS, f"{int(tok[k])} tokens; an item processes at least 1", int(req[k]))

        phases, context = self._phases_after(req, ev_unique)
        unprocessed = self.prompt[req] + self.generated[req] - context
        live = ~self.done[req]
        for k in np.flatnonzero(live & (phases_declared != phases)):
            pos = int(req[k])
            derived = Phase(int(phases[k]))
            code = int(phases_declared[k])
            if code == Phase.DECODE:
                rest = "prompt" if derived == Phase.PREFILL else "refill"
                add(
                    Rule.DECODE_BEFORE_PREFILL,
                    f"decode while {int(unprocessed[k])} {rest} tokens are unprocessed",
                    pos,
                )
            else:
                label = Phase(code).label if code in Phase._value2member_map_ else f"code {code}"
                add(Rule.PHASE_MISMATCH, f"labelled {label} but the request is in {derived.label}", pos)
        for k in np.flatnonzero(live & (tok > unprocessed)):
            add(
                Rule.TOO_MANY_TOKENS,
                f"{int(tok[k])} tokens but only {int(unprocessed[k])} are left to process",
                int(req[k]),
            )

        # Batch-wide budgets, on what the schedule claims to process.
        lim = self.instance.limits
        total = int(tok.sum())
        if lim.max_batch_tokens is not None and total > lim.max_batch_tokens:
            add(Rule.TOKEN_BUDGET, f"{total} tokens exceed the token budget C = {lim.max_batch_tokens}")
        prefill_tokens = int(tok[phases != Phase.DECODE].sum())
        if lim.max_prefill_tokens is not None and prefill_tokens > lim.max_prefill_tokens:
            add(
                Rule.PREFILL_BUDGET,
                f"{prefill_tokens} prefill/refill tokens exceed the prefill budget P = {lim.max_prefill_tokens}",
            )
        _, kv_blocks, running = self._during(req, np.maximum(tok, 0), ev_unique, context)
        if lim.max_running is not None and running > lim.max_running:
            add(Rule.MAX_RUNNING, f"{running} requests hold KV, more than max_running = {lim.max_running}")
        if kv_blocks > self.kv_block_capacity:
            held = kv_blocks * self.block_size
            add(Rule.KV_CAPACITY, f"holds {held} KV tokens during the batch, more than M = {lim.kv_capacity}")

        if self.cost_model is not None and req.size and np.isfinite(batch.duration):
            expected = self.cost_model.batch_time(BatchView(tok, context, phases))
            if abs(batch.duration - expected) > DURATION_RTOL * max(1.0, abs(expected)):
                add(
                    Rule.WRONG_DURATION,
                    f"lasts {batch.duration!r} but the cost model {self.cost_model.name!r} gives {expected!r}",
                )
        return out

    def _quick_ok(self, batch: Batch) -> bool:
        """Whether ``batch`` is certainly legal: one vectorised pass over the common case.

        False means "run the full check" (which finds and words the violations),
        not necessarily illegal.
        """
        req, tok, ev = batch.requests, batch.tokens, batch.evicted
        if req.size == 0 or not np.isfinite(batch.start):
            return False
        if batch.start < self.clock - TIME_TOL or not (np.isfinite(batch.duration) and batch.duration >= 0):
            return False
        if req.min() < 0 or req.max() >= self.n or tok.min() < 1:
            return False
        if req.size > 1:
            ordered = np.sort(req)
            if (ordered[1:] == ordered[:-1]).any():
                return False
        ev_count = 0
        ev_blocks = 0
        if ev.size:
            # Distinct, known requests that hold KV and are not processed in this batch.
            if ev.min() < 0 or ev.max() >= self.n:
                return False
            if ev.size > 1:
                ordered = np.sort(ev)
                if (ordered[1:] == ordered[:-1]).any():
                    return False
            held = self.kv[ev]
            if (held == 0).any() or np.isin(ev, req).any():
                return False
            ev_count = int(ev.size)
            ev_blocks = int(self._blocks(held).sum())
        if self.done[req].any() or (self.arrival[req] > batch.start + TIME_TOL).any():
            return False
        made = self._made is not None and self._made[0] is batch and self._made[1] == self.num_batches
        # make_batch derived the phases (and the duration) from this very state. No item is
        # evicted (checked above), so evictions change neither their phases nor their KV.
        phases = batch.phases if made else self.phase_of(req)
        if not made and not np.array_equal(phases, batch.phases):
            return False
        kv = self.kv[req]
        if (tok > self.prompt[req] + self.generated[req] - kv).any():
            return False
        lim = self.instance.limits
        if lim.max_batch_tokens is not None and int(tok.sum()) > lim.max_batch_tokens:
            return False
        if lim.max_prefill_tokens is not None and int(tok[phases != _DECODE].sum()) > lim.max_prefill_tokens:
            return False
        if (
            lim.max_running is not None
            and self.num_holding - ev_count + int((kv == 0).sum()) > lim.max_running
        ):
            return False
        grown = int((self._blocks(kv + tok) - self._blocks(kv)).sum())
        if self.kv_blocks - ev_blocks + grown > self.kv_block_capacity:
            return False
        if self.cost_model is not None and not made:
            expected = self.cost_model.batch_time(BatchView(tok, kv, phases))
            if abs(batch.duration - expected) > DURATION_RTOL * max(1.0, abs(expected)):
                return False
        return True

    def _during(
        self, req: np.ndarray, tok: np.ndarray, ev: np.ndarray, context: np.ndarray
    ) -> tuple[int, int, int]:
        """KV tokens, KV blocks and requests holding KV during the batch."""
        ev_kv = self.kv[ev]
        kv_tokens = self.kv_tokens - int(ev_kv.sum()) + int(tok.sum())
        blocks_before = self.kv_blocks - int(self._blocks(ev_kv).sum())
        kv_blocks = blocks_before + int((self._blocks(context + tok) - self._blocks(context)).sum())
        running = self.num_holding - int((ev_kv > 0).sum()) + int(((context == 0) & (tok > 0)).sum())
        return kv_tokens, kv_blocks, running

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
        violations = self.check(batch)
        if violations:
            raise ScheduleError(violations)
        # A legal batch needs none of apply()'s clean-up: its phases are the derived ones.
        self._evict(batch.evicted)
        return self._advance(
            batch, batch.requests, batch.tokens, batch.phases == _DECODE, int(batch.evicted.size)
        )

    def _evict(self, ev: np.ndarray) -> None:
        """Drop the KV of ``ev`` (distinct requests that hold KV)."""
        if not ev.size:
            return
        kv_ev = self.kv[ev]
        self.kv_tokens -= int(kv_ev.sum())
        self.kv_blocks -= int(self._blocks(kv_ev).sum())
        self.num_holding -= int(ev.size)
        self.kv[ev] = 0
        self.refilling[ev] = self.generated[ev] > 0
        self.evictions[ev] += 1

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
        self.processed[req] += tok
        kv_during, blocks_during, running = self.kv_tokens, self.kv_blocks, self.num_holding

        gen = req[kv_new == self.prompt[req] + self.generated[req]]
        self.generated[gen] += 1
        self.refilling[gen] = False
        first_tok = gen[self.generated[gen] == 1]
        self.first_token[first_tok] = end
        completed = gen[self.generated[gen] >= self.output[gen]]
        if completed.size:
            kv_c = self.kv[completed]
            self.kv_tokens -= int(kv_c.sum())
            self.kv_blocks -= int(self._blocks(kv_c).sum())
            self.num_holding -= int(completed.size)
            self.kv[completed] = 0
            self.done[completed] = True
            self.completion[completed] = end
            self.num_done += int(completed.size)

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
