"""A trace's per-entry columns, read off its records in one pass.

The metrics of a trace (:mod:`kvsched.schedule.tokens`,
:mod:`kvsched.schedule.metrics`) read a few fields of every
:class:`~kvsched.schedule.records.BatchRecord` and
:class:`~kvsched.schedule.records.RunRecord`. At trace scale (100,000 requests:
400,000 entries) reading them costs more than the numpy work on them, and most
of that is reaching each object in memory: a record's six numbers read together
cost little more than one of them alone, and a Python call per record (a
property, a generator) costs more than the read. So every field a metric needs
is read here once, with C-level getters, each object reached as few times as
possible, and the metrics share the columns through the trace's
:class:`~kvsched.schedule.tokens.BatchClock`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, itemgetter
from typing import TYPE_CHECKING

import numpy as np

from kvsched.schedule.records import BatchRecord, RunRecord

if TYPE_CHECKING:
    from kvsched.schedule.ir import Run

#: The numbers of a batch record read together (one visit per record). Every one but the times is
#: an integer below 2**53, which float64 holds exactly.
_RECORD_NUMBERS = attrgetter("index", "start", "end", "kv_blocks", "num_items", "num_tokens", "num_evicted")
_RUN_NUMBERS = attrgetter("index", "kv_blocks", "block_size")
_generated, _run_of = attrgetter("generated"), attrgetter("run")
_start, _durations, _requests, _chunk = map(attrgetter, ("start", "durations", "requests", "chunk"))
_dtype = attrgetter("dtype")
_chunk_tokens = itemgetter(1)  # Chunk is a named tuple (request, tokens, phase, last)


@dataclass(frozen=True, slots=True, eq=False)
class TraceColumns:
    """What the metrics read of each entry of a trace (``E`` entries: ``R`` batch records, ``U`` runs).

    Build with :func:`read_trace`.

    Parameters
    ----------
    is_run
        Per entry: whether it is a run record (bool, ``E``).
    starts
        Per entry: the start of its (first) batch (float64, ``E``).
    lengths
        Per entry: its batches (1 for a batch record, ``k`` for a run; int64, ``E``).
    rec_at, run_at
        The entry index of each batch record, of each run record (int64, ``R`` and ``U``).
    rec_ends, rec_blocks, rec_items, rec_tokens, rec_evicted
        Per batch record: its end (float64), KV blocks held, items, tokens and evictions (int64).
    rec_parts, rec_sizes
        Per batch record: the requests that generated a token (int64 positions), and how many.
    run_parts, run_decodes
        Per run: the requests it decodes in every batch, and how many.
    run_blocks, run_chunk
        Per run: KV blocks held before it and its chunk's tokens per batch (0 without one; int64).
    run_unit_blocks
        Whether every run's block size is 1 (its KV blocks then grow by its tokens per batch).
    runs
        The run records (what block sizes above 1 need).
    """

    is_run: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    rec_at: np.ndarray
    run_at: np.ndarray
    rec_ends: np.ndarray
    rec_blocks: np.ndarray
    rec_items: np.ndarray
    rec_tokens: np.ndarray
    rec_evicted: np.ndarray
    rec_parts: list[np.ndarray]
    rec_sizes: np.ndarray
    run_parts: list[np.ndarray]
    run_decodes: np.ndarray
    run_blocks: np.ndarray
    run_chunk: np.ndarray
    run_unit_blocks: bool
    runs: list[RunRecord]

    @property
    def num_entries(self) -> int:
        return int(self.is_run.size)

    def positions(self) -> np.ndarray:
        """Every request in a record's ``generated``, then every decode of a run (a new int64 array).

        The records' in entry order, then the runs' in entry order; :meth:`entries` says whose.
        """
        total = int(self.rec_sizes.sum() + self.run_decodes.sum())
        return _joined([*self.rec_parts, *self.run_parts], np.int64, total)

    def entries(self) -> np.ndarray:
        """The entry of each of :meth:`positions` (int32)."""
        at = np.concatenate([self.rec_at, self.run_at]).astype(np.int32)
        return np.repeat(at, np.concatenate([self.rec_sizes, self.run_decodes]))

    def entry_parts(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Each entry's requests (a record's ``generated``, a run's decodes) in entry order, and how many.

        The same arrays as :meth:`positions` joins (not copies), in the trace's order.
        """
        sizes = np.empty(self.num_entries, dtype=np.int64)
        sizes[self.rec_at] = self.rec_sizes
        sizes[self.run_at] = self.run_decodes
        if not self.run_parts or not self.rec_parts:
            return [*self.rec_parts, *self.run_parts], sizes
        where = np.empty(self.num_entries, dtype=np.int64)
        where[self.rec_at] = np.arange(self.rec_at.size)
        where[self.run_at] = np.arange(self.rec_at.size, self.num_entries)
        return list(map([*self.rec_parts, *self.run_parts].__getitem__, where.tolist())), sizes


def read_trace(entries: Sequence[BatchRecord | RunRecord]) -> tuple[TraceColumns, np.ndarray]:
    """The :class:`TraceColumns` of a trace's ``entries`` and every run's durations, the runs in order.

    The durations (one per batch of a run) are for laying out the batch clock; they
    are not kept with the columns.
    """
    e = len(entries)
    is_run = np.fromiter(map(RunRecord.__instancecheck__, entries), dtype=bool, count=e)
    recs: list[BatchRecord] = list(compress(entries, ~is_run))  # type: ignore[arg-type]
    runs: list[RunRecord] = list(compress(entries, is_run))  # type: ignore[arg-type]
    r, u = len(recs), len(runs)
    rec_at, run_at = np.flatnonzero(~is_run), np.flatnonzero(is_run)
    rec = _numbers(recs, _RECORD_NUMBERS, 7)
    run = _numbers(runs, _RUN_NUMBERS, 3)
    run_objs: list[Run] = list(map(_run_of, runs))
    durations = list(map(_durations, run_objs))
    index = np.empty(e, dtype=np.int64)
    index[rec_at] = rec[:, 0]
    index[run_at] = run[:, 0]
    lengths = _lengths(index, len(durations[-1]) if e and is_run[-1] else 1)
    run_batches = int(lengths[run_at].sum())
    flat_durations = _joined(durations, np.float64, run_batches)
    if run_batches != flat_durations.size or (lengths[rec_at] != 1).any() or (lengths[run_at] < 1).any():
        # The records' indices do not follow each other: count the durations.
        lengths = np.ones(e, dtype=np.int64)
        lengths[run_at] = np.fromiter(map(len, durations), dtype=np.int64, count=u)
    del durations
    starts = np.empty(e, dtype=np.float64)
    starts[rec_at] = rec[:, 1]
    starts[run_at] = np.fromiter(map(_start, run_objs), dtype=np.float64, count=u)
    rec_parts, run_parts = list(map(_generated, recs)), list(map(_requests, run_objs))
    chunks = list(map(_chunk, run_objs))
    mixed = np.fromiter(map(is_not, chunks, repeat(None)), dtype=bool, count=u)
    run_chunk = np.zeros(u, dtype=np.int64)
    run_chunk[mixed] = np.fromiter(
        map(_chunk_tokens, compress(chunks, mixed)), dtype=np.int64, count=int(mixed.sum())
    )
    counts = rec[:, 3:].astype(np.int64).T
    columns = TraceColumns(
        is_run=is_run,
        starts=starts,
        lengths=lengths,
        rec_at=rec_at,
        run_at=run_at,
        rec_ends=np.ascontiguousarray(rec[:, 2]),
        rec_blocks=counts[0],
        rec_items=counts[1],
        rec_tokens=counts[2],
        rec_evicted=counts[3],
        rec_parts=rec_parts,
        rec_sizes=np.fromiter(map(len, rec_parts), dtype=np.int64, count=r),
        run_parts=run_parts,
        run_decodes=np.fromiter(map(len, run_parts), dtype=np.int64, count=u),
        run_blocks=run[:, 1].astype(np.int64),
        run_chunk=run_chunk,
        run_unit_blocks=bool((run[:, 2] == 1).all()),
        runs=runs,
    )
    return columns, flat_durations


def _numbers(objects: list, getter: attrgetter, width: int) -> np.ndarray:
    """``width`` numbers of each object (one visit each) as a float64 table, one row per object."""
    flat = np.fromiter(
        chain.from_iterable(map(getter, objects)), dtype=np.float64, count=width * len(objects)
    )
    return flat.reshape(len(objects), width)


def _lengths(index: np.ndarray, last: int) -> np.ndarray:
    """Each entry's batches, if the indices of the entries' first batches follow each other.

    A record's index is its batch's, a run record's its first batch's (the core's
    batch count when it applied it), so in a trace an entry's batches are the
    next entry's index minus its own; ``last`` is the last entry's. The caller
    checks the result: 1 for every batch record, and for the runs their durations.
    """
    lengths = np.full(index.size, last, dtype=np.int64)
    np.subtract(index[1:], index[:-1], out=lengths[:-1])
    return lengths


#: Mean array size from which :func:`_joined` leaves joining to numpy (its per-array checks are
#: then cheap next to the copy, which ``tobytes`` makes twice).
_JOIN_MAX_MEAN = 64


def _joined(arrays: list[np.ndarray], dtype: type, total: int) -> np.ndarray:
    """``np.concatenate(arrays)`` (``total`` items) as ``dtype``: a new, writable array.

    Many small arrays of that dtype (the usual trace: a few requests per record)
    have their bytes joined without numpy's per-array checks, in a third of its
    time (``tobytes``: not the buffer protocol, whose export numpy keeps with
    each array for its lifetime, about 50 bytes an array).
    """
    if not arrays:
        return np.zeros(0, dtype=dtype)
    if total > _JOIN_MAX_MEAN * len(arrays) or set(map(_dtype, arrays)) != {np.dtype(dtype)}:
        return np.concatenate(arrays).astype(dtype, copy=False)
    return np.frombuffer(bytearray().join(map(np.ndarray.tobytes, arrays)), dtype=dtype)
