"""Decode-only batches at bucketed sizes over static buffers: CUDA graphs on a GPU.

A decode-only batch of n requests is padded to the smallest of vLLM's capture
sizes (:data:`CAPTURE_SIZES`) that holds it, and runs over static buffers of
that size: token ids, positions, KV write slots, slot table and lengths. The
padding rows are no-ops: their length is 0, so attention gives them zeros and
reads nothing, and their KV goes to the pool's scratch row, which no request
owns. Real rows do not see them (every other operator works row by row).

On CUDA, the forward pass over a bucket's buffers is captured once as a CUDA
graph (after one warm-up call) and replayed; the batch time is measured with
CUDA events around the replay alone, so the host's kernel launches drop out
of it. Elsewhere (CPU tests) the same buffers run eagerly: padding, buckets
and buffers are tested there, and only the capture is CUDA-only
(:meth:`DecodeGraphs._graph`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvsched.executor.batch import BatchPlan
from kvsched.executor.device import Timer, capture_graph
from kvsched.executor.fused import SmallOps
from kvsched.executor.kvcache import KVPool
from kvsched.executor.model import Decoder
from kvsched.executor.paged import AttentionKernels, InPlaceAttention, SlotTable

#: vLLM's CUDA-graph capture sizes (its V1 default up to 512): 1, 2, 4, steps of 8 to 256, steps of 16 to 512.
CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def bucket_for(n: int, sizes: tuple[int, ...] = CAPTURE_SIZES) -> int | None:
    """The smallest size that holds n rows, or None when n is larger than every size."""
    k = bisect.bisect_left(sizes, n)
    return sizes[k] if k < len(sizes) else None


class BucketGraphs:
    """Batches over static buffers, padded to buckets, with one CUDA graph per bucket on CUDA.

    A subclass says which batches fit (:meth:`fits`), copies a batch into the buffers and names
    its bucket (:meth:`load`), runs the buffers' forward pass (:meth:`forward`, what a graph
    captures) and reads the sampled tokens back (:meth:`sampled`).
    """

    def __init__(
        self,
        model: Decoder,
        pool: KVPool,
        kernels: AttentionKernels,
        capture: bool | None,
        ops: SmallOps | None,
    ) -> None:
        self.model, self.pool, self.kernels, self.ops = model, pool, kernels, ops
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.graphs: dict[Any, Any] = {}
        self._mempool: Any = None
        self.replays = 0

    def fits(self, plan: BatchPlan) -> bool:
        raise NotImplementedError

    def load(self, plan: BatchPlan) -> Any:
        raise NotImplementedError

    def forward(self, key: Any) -> None:
        raise NotImplementedError

    def sampled(self, plan: BatchPlan, key: Any) -> list[int]:
        raise NotImplementedError

    @contextmanager
    def _own_ops(self) -> Iterator[None]:
        """The model runs with the buffers' operators inside, with its own again after."""
        if self.ops is None:
            yield
            return
        before = self.model.ops
        self.model.use_ops(self.ops)
        try:
            yield
        finally:
            self.model.use_ops(before)

    def _graph(self, key: Any) -> Any:
        """The CUDA graph of a bucket, captured on first use (after one warm-up call on a side stream)."""
        if key not in self.graphs:
            with self._own_ops():
                graph = capture_graph(lambda: self.forward(key), self._mempool)
            self._mempool = graph.pool()
            self.graphs[key] = graph
        return self.graphs[key]

    def run(self, plan: BatchPlan, timer: Timer, repeat: int) -> tuple[list[int], float]:
        """Run the batch; its sampled tokens (item order) and the median time of the forward pass."""
        key = self.load(plan)
        if self.capture:
            graph = self._graph(key)
            _, secs = timer.median(graph.replay, repeat)
        else:
            with self._own_ops():
                _, secs = timer.median(lambda: self.forward(key), repeat)
        self.replays += 1
        return self.sampled(plan, key), secs


class DecodeGraphs(BucketGraphs):
    """Decode-only batches over static buffers, padded to buckets; captured as CUDA graphs on CUDA.

    Parameters
    ----------
    model, pool
        The decoder and its KV pool.
    kernels
        The attention implementation inside the graphs.
    width
        Slot-table width: the longest sequence a decode may have (longer batches run eagerly).
    sizes
        Bucket sizes.
    capture
        Capture CUDA graphs (default: on CUDA); without, the buffers run eagerly.
    ops
        The small operators the bucket buffers run with (and graphs are captured with), e.g.
        :meth:`SmallOps.compiled`; None: the model's own. The model keeps its own operators for
        the batches that run outside the buffers.
    """

    def __init__(
        self,
        model: Decoder,
        pool: KVPool,
        kernels: AttentionKernels,
        width: int,
        sizes: tuple[int, ...] = CAPTURE_SIZES,
        capture: bool | None = None,
        ops: SmallOps | None = None,
    ) -> None:
        super().__init__(model, pool, kernels, capture, ops)
        self.width, self.sizes = width, sizes
        dev, top = model.device, sizes[-1]
        i64, i32 = torch.int64, torch.int32
        self.ids = torch.zeros(top, dtype=i64, device=dev)
        self.positions = torch.zeros(top, dtype=i64, device=dev)
        self.write_slots = torch.full((top,), pool.scratch, dtype=i64, device=dev)
        self.table = torch.zeros((top, width), dtype=i32, device=dev)
        self.lens = torch.zeros(top, dtype=i32, device=dev)
        self.rows = torch.arange(top, dtype=i64, device=dev)
        self.cu_q = torch.arange(top + 1, dtype=i32, device=dev)
        self.tokens = torch.zeros(top, dtype=i64, device=dev)

    def fits(self, plan: BatchPlan) -> bool:
        """Whether the batch can run here: decode-only, in place, within a bucket and the table width."""
        d = plan.decodes
        return (
            plan.attention == "paged"
            and plan.decode_only
            and d.size > 0
            and bucket_for(d.size, self.sizes) is not None
            and d.max_k <= self.width
        )

    def load(self, plan: BatchPlan) -> int:
        """Copy the batch into the buffers' first rows, make the rest padding; the bucket size."""
        n = plan.decodes.size
        b = bucket_for(n, self.sizes)
        assert b is not None and self.fits(plan)
        w = plan.decodes.table.shape[1]
        self.ids[:n].copy_(plan.ids, non_blocking=True)
        self.positions[:n].copy_(plan.positions, non_blocking=True)
        self.write_slots[:n].copy_(plan.write_slots, non_blocking=True)
        self.table[:n, :w].copy_(plan.decodes.table, non_blocking=True)
        self.lens[:n].copy_(plan.decodes.lens, non_blocking=True)
        self.ids[n:b].zero_()
        self.positions[n:b].zero_()
        self.write_slots[n:b].fill_(self.pool.scratch)
        self.lens[n:b].zero_()
        return b

    def forward(self, b: int) -> None:
        """The forward pass and greedy sampling of the first b buffer rows (what a graph captures)."""
        empty = torch.zeros(1, dtype=torch.int32, device=self.ids.device)
        decodes = SlotTable(
            self.table[:b], self.lens[:b], self.cu_q[: b + 1], 1, self.width, 0, self.rows[:0], empty, b
        )
        chunks = SlotTable(self.table[:0], self.lens[:0], empty, 0, 0, b, self.rows[:0], empty, 0)
        attend = InPlaceAttention(self.pool, decodes, chunks, self.kernels)
        attend.write_slots = self.write_slots[:b]
        logits = self.model(self.ids[:b], self.positions[:b], attend, self.rows[:b])
        self.tokens[:b] = logits.argmax(dim=-1)

    def sampled(self, plan: BatchPlan, key: int) -> list[int]:
        return self.tokens[:key][plan.logit_rows].tolist()
