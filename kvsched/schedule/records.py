"""What the core reports: broken rules, and what each applied batch or run did.

:class:`Violation` (with its :class:`Rule`) and :class:`ScheduleError` say why
a batch is illegal; :class:`BatchRecord` and :class:`RunRecord` say what an
applied batch or coalesced run did (the input of the metrics). They live apart
from :mod:`kvsched.schedule.core` so that the core stays one module about the
rules; the core re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

import numpy as np

from kvsched.errors import KvschedError
from kvsched.schedule.ir import Run

_NONE = np.zeros(0, dtype=np.int64)
_NONE.flags.writeable = False


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
    BAD_RUN = "bad-run"  # legal batches that a run cannot stand for (its chunk finishes a prompt)


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


@dataclass(frozen=True, slots=True, eq=False)
class RunRecord:
    """What happened in one applied :class:`~kvsched.schedule.ir.Run` of ``k`` batches.

    Everything a :class:`BatchRecord` says about each of the ``k`` batches follows
    from these fields (:meth:`records` spells them out): batch ``j`` (0-based)
    holds ``kv_tokens + (j + 1) (n + c)`` KV tokens (``n`` decodes, ``c`` the
    chunk's tokens, 0 without one), every decode generates a token, the chunk
    never does, and only the last batch completes requests. (The record of a
    run whose last chunk finishes its prompt is the record of its first
    ``k - 1`` batches, with :attr:`tail` the :class:`BatchRecord` of its last.)
    """

    index: int  # index of the first batch
    run: Run
    kv_before: np.ndarray  # KV each decode's request held before the run
    kv_tokens: int  # KV tokens held before the run
    kv_blocks: int  # KV blocks held before the run
    block_size: int
    num_running: int  # requests holding KV during the run (constant through it)
    completed: np.ndarray  # positions that completed in the last batch
    chunk_kv: int = 0  # KV the chunk's request held before the run
    # A run whose last chunk finishes its prompt is recorded as the run of its first k - 1 batches
    # (``run`` is that head) and this record of its last batch: the record lists hold both, in order.
    tail: BatchRecord | None = None

    @property
    def repeat(self) -> int:
        return self.run.repeat

    @property
    def start(self) -> float:
        return self.run.start

    @property
    def end(self) -> float:
        return self.run.end

    @property
    def requests(self) -> np.ndarray:
        """The decodes' requests: each generates a token in every batch."""
        return self.run.requests

    @property
    def chunk_tokens(self) -> int:
        """Prompt (or refill) tokens per batch: the chunk's, 0 without one."""
        chunk = self.run.chunk
        return chunk.tokens if chunk is not None else 0

    def ends(self) -> np.ndarray:
        """End of each batch."""
        return self.run.starts() + self.run.durations

    def kv_blocks_during(self) -> np.ndarray:
        """KV blocks held during each batch."""
        k, kv, bs = self.repeat, self.kv_before, self.block_size
        steps = np.arange(1, k + 1, dtype=np.int64)
        if bs == 1:
            return self.kv_blocks + (kv.size + self.chunk_tokens) * steps
        base = -(-kv // bs)
        grown = (-(-(kv[None, :] + steps[:, None]) // bs) - base[None, :]).sum(axis=1)
        chunk = self.run.chunk
        if chunk is not None:
            m = self.chunk_kv
            grown += -(-(m + chunk.tokens * steps) // bs) - (-(-m // bs))
        return self.kv_blocks + grown

    def records(self) -> Iterator[BatchRecord]:
        """The :class:`BatchRecord` of each batch, as batch-by-batch application makes them."""
        n, k = self.run.requests.size, self.repeat
        c = self.chunk_tokens
        items, tokens = self.run.size, n + c
        blocks = self.kv_blocks_during().tolist()
        starts = self.run.starts().tolist()
        for j, (s, d) in enumerate(zip(starts, self.run.durations.tolist(), strict=True)):
            yield BatchRecord(
                index=self.index + j,
                start=s,
                end=s + d,
                num_items=items,
                num_tokens=tokens,
                prefill_tokens=c,
                num_decodes=n,
                kv_tokens=self.kv_tokens + (j + 1) * tokens,
                kv_blocks=blocks[j],
                num_running=self.num_running,
                num_evicted=0,
                generated=self.run.requests,
                completed=self.completed if j == k - 1 else _NONE,
            )


_new = object.__new__
(
    _b_index,
    _b_start,
    _b_end,
    _b_items,
    _b_tokens,
    _b_prefill,
    _b_decodes,
    _b_kv,
    _b_blocks,
    _b_running,
    _b_evicted,
    _b_generated,
    _b_completed,
) = (BatchRecord.__dict__[f.name].__set__ for f in fields(BatchRecord))
(
    _r_index,
    _r_run,
    _r_kv_before,
    _r_kv,
    _r_blocks,
    _r_block_size,
    _r_running,
    _r_completed,
    _r_chunk_kv,
    _r_tail,
) = (RunRecord.__dict__[f.name].__set__ for f in fields(RunRecord))


def new_batch_record(
    index: int,
    start: float,
    end: float,
    num_items: int,
    num_tokens: int,
    prefill_tokens: int,
    num_decodes: int,
    kv_tokens: int,
    kv_blocks: int,
    num_running: int,
    num_evicted: int,
    generated: np.ndarray,
    completed: np.ndarray,
) -> BatchRecord:
    """``BatchRecord(...)`` (positional, every field), for the core's once-per-batch records.

    The fields are set through their slot descriptors, as the frozen dataclass's ``__init__``
    sets them through ``object.__setattr__``: the same object at about half the cost
    (``tests/test_records_fast.py`` compares them field by field).
    """
    record = _new(BatchRecord)
    _b_index(record, index)
    _b_start(record, start)
    _b_end(record, end)
    _b_items(record, num_items)
    _b_tokens(record, num_tokens)
    _b_prefill(record, prefill_tokens)
    _b_decodes(record, num_decodes)
    _b_kv(record, kv_tokens)
    _b_blocks(record, kv_blocks)
    _b_running(record, num_running)
    _b_evicted(record, num_evicted)
    _b_generated(record, generated)
    _b_completed(record, completed)
    return record


def new_run_record(
    index: int,
    run: Run,
    kv_before: np.ndarray,
    kv_tokens: int,
    kv_blocks: int,
    block_size: int,
    num_running: int,
    completed: np.ndarray,
    chunk_kv: int,
    tail: BatchRecord | None,
) -> RunRecord:
    """``RunRecord(...)`` (positional, every field), set as :func:`new_batch_record` sets a batch's."""
    record = _new(RunRecord)
    _r_index(record, index)
    _r_run(record, run)
    _r_kv_before(record, kv_before)
    _r_kv(record, kv_tokens)
    _r_blocks(record, kv_blocks)
    _r_block_size(record, block_size)
    _r_running(record, num_running)
    _r_completed(record, completed)
    _r_chunk_kv(record, chunk_kv)
    _r_tail(record, tail)
    return record


def expand_records(entries: Sequence[BatchRecord | RunRecord]) -> list[BatchRecord]:
    """One :class:`BatchRecord` per batch, runs spelled out."""
    out: list[BatchRecord] = []
    for e in entries:
        if type(e) is RunRecord:
            out.extend(e.records())
        else:
            out.append(e)  # type: ignore[arg-type]
    return out
