"""The greedy's batch log and its conversion into a :class:`~kvsched.schedule.ir.Schedule`.

The kernel writes flat arrays (one row per item, offsets per batch). Building the
schedule slices them without copying (read-only views) and folds repeated
decode-only batches of the same requests into :class:`~kvsched.schedule.ir.Run`
entries, which the core replays in one step each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.schedule.ir import Batch, Phase, Run, Schedule

_DECODE = int(Phase.DECODE)


#: Items compared at once where runs are folded (bounds the temporary arrays: 32 MB of positions).
FOLD_CHUNK = 1 << 22


def _same_as_previous(req: np.ndarray, ptr: np.ndarray, batches: np.ndarray) -> np.ndarray:
    """For each of ``batches`` (each the size of the batch before it), whether its items' requests equal the
    previous batch's, position by position: compared a chunk of items at a time with numpy (one
    ``np.array_equal`` per batch took 3.5 of the 7.8 s of building a 100k-request schedule)."""
    lens = ptr[batches + 1] - ptr[batches]
    cum = np.concatenate(([0], np.cumsum(lens)))
    out = np.empty(batches.size, dtype=bool)
    i = 0
    while i < batches.size:
        j = max(i + 1, int(np.searchsorted(cum, cum[i] + FOLD_CHUNK, side="right")) - 1)
        counts = lens[i:j]
        local = cum[i : j + 1] - cum[i]
        pos = np.repeat(ptr[batches[i:j]] - local[:-1], counts) + np.arange(local[-1])
        differs = np.concatenate(([0], np.cumsum(req[pos] != req[pos - np.repeat(counts, counts)])))
        out[i:j] = differs[local[1:]] == differs[local[:-1]]
        i = j
    return out


def with_room(arr: np.ndarray, need: int) -> np.ndarray:
    """``arr`` itself where its last axis holds ``need`` entries, else a copy with room for at least
    twice as many (zeros past the old ones).

    The greedy kernels' log buffers grow so, one at a time and only when full: at 100,000 requests the
    item log reaches a gigabyte, and copying it (the fresh pages zeroed by the kernel) once took 60% of
    the knapsack greedy's run.
    """
    size = arr.shape[-1]
    if size >= need:
        return arr
    out = np.zeros((*arr.shape[:-1], max(2 * size, need)), dtype=arr.dtype)
    out[..., :size] = arr
    return out


def sealed(arr: np.ndarray) -> np.ndarray:
    """A read-only view of ``arr``, for a buffer its producer will not write again: the schedule built
    from the log then shares it instead of copying it (at 100,000 requests each item array is 276 MB,
    and copying the log twice, its pages zeroed by the kernel, took seconds of every greedy run)."""
    out = arr.view()
    out.flags.writeable = False
    return out


def _frozen(arr: np.ndarray, dtype: type) -> np.ndarray:
    """``arr`` as a read-only contiguous array of ``dtype``: itself where it is one already (sealed by
    its producer), else a copy (so that the schedule never shares memory someone may still write)."""
    out = np.ascontiguousarray(arr, dtype=dtype)
    if out is arr:
        if not arr.flags.writeable:
            return arr
        out = arr.copy()
    out.flags.writeable = False
    return out


@dataclass(frozen=True, slots=True, eq=False)
class BatchLog:
    """Batches as flat arrays: batch ``b`` has items ``item_ptr[b]:item_ptr[b+1]`` and evictions ``ev_ptr[b]:ev_ptr[b+1]``.

    Parameters
    ----------
    start, duration
        Per batch.
    item_ptr, ev_ptr
        Offsets (length batches + 1).
    requests, tokens, context, phases
        Per item: request position, tokens processed, KV held before the batch, phase code.
    evicted
        Evicted request positions, per batch in ``ev_ptr`` order.
    finished
        Whether every request completes in these batches (False: the producer was cut short for time,
        and :func:`~kvsched.csp.incumbents.complete.reserved_batches` finishes the rest).
    """

    start: np.ndarray
    duration: np.ndarray
    item_ptr: np.ndarray
    ev_ptr: np.ndarray
    requests: np.ndarray
    tokens: np.ndarray
    context: np.ndarray
    phases: np.ndarray
    evicted: np.ndarray
    finished: bool = True

    @property
    def num_batches(self) -> int:
        return int(self.start.size)

    @property
    def num_evictions(self) -> int:
        return int(self.evicted.size)

    def to_schedule(self, meta: dict[str, Any] | None = None) -> Schedule:
        """The schedule: one :class:`Batch` per batch, decode-only repeats folded into runs."""
        req = _frozen(self.requests, np.int64)
        tok = _frozen(self.tokens, np.int64)
        ph = _frozen(self.phases, np.int8)
        ev = _frozen(self.evicted, np.int64)
        ip, ep = self.item_ptr.tolist(), self.ev_ptr.tolist()
        starts, durs = self.start.tolist(), self.duration
        firsts = np.flatnonzero(~self._continues(req)).tolist()  # the batch each entry starts at
        entries: list[Batch | Run] = []
        for b, e in zip(firsts, [*firsts[1:], self.num_batches], strict=True):
            lo, hi = ip[b], ip[b + 1]
            if e - b > 1:
                entries.append(Run.of(starts[b], durs[b:e], req[lo:hi]))
            else:
                # The log's own arrays, of one length and dtype by construction: the unchecked constructor
                # (a user's Batch(...) is checked for form; the replay judges these batches).
                entries.append(
                    Batch._trusted(
                        float(starts[b]),
                        float(durs[b]),
                        req[lo:hi],
                        tok[lo:hi],
                        ph[lo:hi],
                        ev[ep[b] : ep[b + 1]],
                    )
                )
        return Schedule(tuple(entries), dict(meta or {}))

    def _continues(self, req: np.ndarray) -> np.ndarray:
        """Per batch, whether it extends the previous batch's run: both decode-only and eviction-free, the
        same requests in the same order, and back to back (each start the previous start plus its
        duration, as the run's clock adds them)."""
        ptr = self.item_ptr
        # The batches holding a prompt or refill chunk (few items: searched, not summed over every item).
        mixed = np.zeros(self.num_batches, dtype=bool)
        mixed[np.searchsorted(ptr, np.flatnonzero(self.phases != _DECODE), side="right") - 1] = True
        foldable = ~mixed & (self.ev_ptr[1:] == self.ev_ptr[:-1])
        sizes = np.diff(ptr)
        out = np.zeros(self.num_batches, dtype=bool)
        maybe = (
            foldable[1:]
            & foldable[:-1]
            & (sizes[1:] == sizes[:-1])
            & (self.start[1:] == self.start[:-1] + self.duration[:-1])
        )
        later = np.flatnonzero(maybe) + 1
        out[later] = _same_as_previous(req, ptr, later)
        return out
