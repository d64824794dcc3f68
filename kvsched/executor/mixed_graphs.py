"""Batches with prefill chunks at bucketed shapes over static buffers: CUDA graphs for mixed batches.

A batch outside the decode graphs is launched from the host, kernel by kernel; on the H100
such batches took at least about 25 ms whatever their size, 2.8-4.2 times the vLLM-profiled
model (docs/executor.md, second GPU run). Here a batch with chunks (and any decodes) is padded
to a bucket of three sizes, each from a short list, and replays the bucket's CUDA graph:

* the decodes, to a size of :data:`DECODE_SIZES` (0 and vLLM's capture sizes): padding decodes
  have length 0, as in :class:`~kvsched.executor.graphs.DecodeGraphs`;
* the chunks' rows, to a size of :data:`CHUNK_TOKENS`: the padding rows form one extra chunk
  sequence over the pool's scratch slot (its tokens are written there and it attends to them
  only), so no real row sees them;
* the chunk sequences, to a size of :data:`CHUNK_COUNTS` (the padding sequence included; any
  further ones are empty).

Every operator but attention works row by row, so padding rows change no real row. The chunks'
attention is the in-place Triton kernel when graphs are captured (its grid is sized by the
bucket, not the batch; torch's flash varlen call needs a packed copy of the chunks' KV, whose
size is the batch's); without capture (CPU tests) it is the engine's own prefill kernel.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from kvsched.executor.batch import BatchPlan
from kvsched.executor.fused import SmallOps
from kvsched.executor.graphs import CAPTURE_SIZES, BucketGraphs, bucket_for
from kvsched.executor.kvcache import KVPool
from kvsched.executor.model import Decoder
from kvsched.executor.paged import AttentionKernels, InPlaceAttention, SlotTable

#: Decode counts of a mixed bucket: none, or one of vLLM's capture sizes.
DECODE_SIZES = (0, *CAPTURE_SIZES)
#: Chunk rows of a mixed bucket (powers of two; a batch with more runs eagerly).
CHUNK_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048)
#: Chunk sequences of a mixed bucket, the padding sequence included. Up to 64: Sarathi's batches on
#: short prompts hold dozens of chunks (46 of 512 tokens in the lengths / 10 replay), and with 8 at
#: most the H100 run left 11 of 147 batches eager at 1.8-4 times the model. The attention grid grows
#: with the bucket, but a padding sequence's programs have no rows and return at once.
CHUNK_COUNTS = (1, 2, 4, 8, 16, 32, 64)

#: A bucket: (decodes, chunk rows, chunk sequences).
Key = tuple[int, int, int]


class MixedGraphs(BucketGraphs):
    """Batches with chunks over static buffers, padded to (decodes, chunk rows, chunks) buckets.

    Parameters
    ----------
    model, pool, kernels, capture, ops
        As :class:`~kvsched.executor.graphs.DecodeGraphs`; with capture, chunks use the Triton kernel.
    width
        Slot-table width: the longest sequence (at least the largest chunk bucket).
    """

    def __init__(
        self,
        model: Decoder,
        pool: KVPool,
        kernels: AttentionKernels,
        width: int,
        capture: bool | None = None,
        ops: SmallOps | None = None,
    ) -> None:
        super().__init__(model, pool, kernels, capture, ops)
        if self.capture:
            self.kernels = replace(kernels, prefill="triton")
        self.width = max(width, CHUNK_TOKENS[-1])
        # The decodes' static longest, which sizes a KV-partition grid: the caller's width, not the chunks'
        # (at least 2,048). The split-by-count rule keeps the width it was measured with (fourth, fifth runs).
        self.decode_max = width if kernels.partition else self.width
        dev, i64, i32 = model.device, torch.int64, torch.int32
        top_d, top_c, top_k = DECODE_SIZES[-1], CHUNK_TOKENS[-1], CHUNK_COUNTS[-1]
        rows = top_d + top_c
        self.ids = torch.zeros(rows, dtype=i64, device=dev)
        self.positions = torch.zeros(rows, dtype=i64, device=dev)
        self.write_slots = torch.full((rows,), pool.scratch, dtype=i64, device=dev)
        self.d_table = torch.zeros((top_d, self.width), dtype=i32, device=dev)
        self.d_lens = torch.zeros(top_d, dtype=i32, device=dev)
        self.d_cu = torch.arange(top_d + 1, dtype=i32, device=dev)
        self.c_table = torch.full((top_k, self.width), pool.scratch, dtype=i32, device=dev)
        self.c_lens = torch.zeros(top_k, dtype=i32, device=dev)
        self.c_cu = torch.zeros(top_k + 1, dtype=i32, device=dev)
        self.logit_rows = torch.zeros(top_d + top_k, dtype=i64, device=dev)
        self.tokens = torch.zeros(top_d + top_k, dtype=i64, device=dev)
        self._none = torch.zeros(0, dtype=i64, device=dev)
        self._zero = torch.zeros(1, dtype=i32, device=dev)

    def bucket(self, plan: BatchPlan) -> Key | None:
        """The batch's bucket, or None when it has no chunk or is larger than every bucket."""
        d, c = plan.decodes, plan.chunks
        if plan.attention != "paged" or c.size == 0 or d.max_k > self.decode_max or c.max_k > self.width:
            return None
        d_b = bucket_for(d.size, DECODE_SIZES)
        c_b = bucket_for(c.rows, CHUNK_TOKENS)
        if d_b is None or c_b is None:
            return None
        k_b = bucket_for(c.size + (c.rows < c_b), CHUNK_COUNTS)  # room for the padding sequence
        return None if k_b is None else (d_b, c_b, k_b)

    def fits(self, plan: BatchPlan) -> bool:
        return self.bucket(plan) is not None

    def load(self, plan: BatchPlan) -> Key:
        """Copy the batch into the buffers (decode rows first, chunk rows from the bucket's d_b), pad the rest."""
        key = self.bucket(plan)
        assert key is not None
        d_b, c_b, k_b = key
        d, c = plan.decodes, plan.chunks
        n, rows, k = d.size, c.rows, c.size
        pad = c_b - rows
        scratch = self.pool.scratch
        for buf, src, fill in (
            (self.ids, plan.ids, 0),
            (self.positions, plan.positions, 0),
            (self.write_slots, plan.write_slots, scratch),
        ):
            buf[:n].copy_(src[:n], non_blocking=True)
            buf[n:d_b].fill_(fill)
            buf[d_b : d_b + rows].copy_(src[n : n + rows], non_blocking=True)
            buf[d_b + rows : d_b + c_b].fill_(fill)
        if n:
            self.d_table[:n, : d.table.shape[1]].copy_(d.table, non_blocking=True)
            self.d_lens[:n].copy_(d.lens, non_blocking=True)
        self.d_lens[n:d_b].zero_()
        self.c_table[:k, : c.table.shape[1]].copy_(c.table, non_blocking=True)
        self.c_lens[:k].copy_(c.lens, non_blocking=True)
        self.c_cu[: k + 1].copy_(c.cu_q, non_blocking=True)
        # The padding rows: one sequence of `pad` tokens over the scratch slot (its table row is scratch
        # throughout), then empty sequences.
        self.c_table[k:k_b].fill_(scratch)
        self.c_lens[k:k_b].zero_()
        if pad:
            self.c_lens[k] = pad
        self.c_cu[k + 1 : k_b + 1] = c_b
        # Sampled rows: a chunk row moves down by the decode padding.
        r = int(plan.logit_rows.shape[0])
        self.logit_rows[:r].copy_(plan.logit_rows + (plan.logit_rows >= n) * (d_b - n), non_blocking=True)
        self.logit_rows[r : d_b + k_b].zero_()
        return key

    def forward(self, key: Key) -> None:
        """The forward pass and greedy sampling over the bucket's buffers (what a graph captures)."""
        d_b, c_b, k_b = key
        decodes = SlotTable(
            self.d_table[:d_b],
            self.d_lens[:d_b],
            self.d_cu[: d_b + 1],
            1,
            self.decode_max,
            0,
            self._none,
            self._zero,
            d_b,
        )
        chunks = SlotTable(
            self.c_table[:k_b],
            self.c_lens[:k_b],
            self.c_cu[: k_b + 1],
            c_b,
            self.width,
            d_b,
            self._none,
            self._zero,
            c_b,
        )
        attend = InPlaceAttention(self.pool, decodes, chunks, self.kernels)
        attend.write_slots = self.write_slots[: d_b + c_b]
        rows = d_b + k_b
        logits = self.model(
            self.ids[: d_b + c_b], self.positions[: d_b + c_b], attend, self.logit_rows[:rows]
        )
        self.tokens[:rows] = logits.argmax(dim=-1)

    def sampled(self, plan: BatchPlan, key: Any) -> list[int]:
        return self.tokens[: int(plan.logit_rows.shape[0])].tolist()
