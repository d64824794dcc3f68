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
        nb = self.num_batches
        # Decode-only and eviction-free batches may fold into runs.
        not_decode = np.concatenate(([0], np.cumsum(self.phases != _DECODE)))
        foldable = ((not_decode[self.item_ptr[1:]] - not_decode[self.item_ptr[:-1]]) == 0) & (
            self.ev_ptr[1:] == self.ev_ptr[:-1]
        )
        sizes = np.diff(self.item_ptr)
        entries: list[Batch | Run] = []
        b = 0
        while b < nb:
            lo, hi = ip[b], ip[b + 1]
            e = b + 1
            if foldable[b]:
                # Extend while the next batch decodes the same requests, back to back.
                while (
                    e < nb
                    and foldable[e]
                    and sizes[e] == hi - lo
                    and starts[e] == starts[e - 1] + durs[e - 1]
                    and np.array_equal(req[ip[e] : ip[e + 1]], req[lo:hi])
                ):
                    e += 1
            if e - b > 1:
                entries.append(Run.of(starts[b], durs[b:e], req[lo:hi]))
            else:
                entries.append(
                    Batch(starts[b], float(durs[b]), req[lo:hi], tok[lo:hi], ph[lo:hi], ev[ep[b] : ep[b + 1]])
                )
            b = e
        return Schedule(tuple(entries), dict(meta or {}))
