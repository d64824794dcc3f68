"""Attention over the KV pool in place: per-sequence slot tables, one call for the decodes, one for the chunks.

A batch's packed input has its one-token items (decodes) first, then its
multi-token chunks (:func:`kvsched.executor.batch.plan_batch` orders it so).
Each layer then makes two attention calls, whatever the number of items:

* the decodes: one query each over its sequence's slots
  (:func:`decode_reference`, or the Triton kernel
  :func:`kvsched.executor.triton_attention.decode_attention`);
* the chunks: packed queries (``cu_q``) over their slots, causal from the
  lower right (:func:`prefill_reference`; the Triton kernel
  :func:`~kvsched.executor.triton_attention.prefill_attention`; or, on CUDA,
  torch's flash ``varlen_attn`` over a packed copy of only the chunks' KV).

The reference functions are plain torch and run anywhere; they are the oracle
the kernels are tested against, and the CPU path. Which implementation runs is
an :class:`AttentionKernels` setting.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from kvsched.executor.kvcache import KVPool

Kernel = Literal["torch", "triton"]
Prefill = Literal["torch", "triton", "varlen"]


@dataclass(frozen=True, slots=True)
class AttentionKernels:
    """Which implementation attends the decodes and the chunks.

    Parameters
    ----------
    decode
        ``torch`` (the reference) or ``triton`` (in place).
    prefill
        ``torch``, ``triton`` (in place) or ``varlen`` (torch's flash varlen
        attention over a packed copy of the chunks' KV; CUDA only).
    splits
        KV splits of the decode kernel; 0 chooses from the batch (:func:`decode_splits`).
    partition
        Keys per KV partition of the decode kernel (a multiple of ``block_n``): splits by length,
        ceil(L / partition) programs for a sequence of L keys (:func:`decode_splits`); 0: by ``splits``.
    block_n, block_m
        Tile sizes of the kernels (keys per tile; chunk rows per tile).
    """

    decode: Kernel = "torch"
    prefill: Prefill = "torch"
    splits: int = 0
    partition: int = 0
    block_n: int = 64
    block_m: int = 64


@dataclass(frozen=True, slots=True, eq=False)
class SlotTable:
    """Sequences' KV slots: ``table[i, :lens[i]]`` are sequence i's slots, in position order.

    ``cu_q`` (n + 1,) are the sequences' query rows in the packed input, offset
    by ``first_row``; ``rows`` their number (``cu_q[-1]``, kept on the host: reading
    it from the device in every layer made each layer wait for the GPU); ``max_q``
    the longest chunk. For the varlen path,
    ``packed`` (sum of lens,) lists every sequence's slots back to back and
    ``cu_k`` (n + 1,) their offsets.
    """

    table: torch.Tensor  # (n, width) int32; padding repeats slot 0
    lens: torch.Tensor  # (n,) int32
    cu_q: torch.Tensor  # (n + 1,) int32, from 0
    max_q: int
    max_k: int
    first_row: int
    packed: torch.Tensor  # (sum lens,) int64
    cu_k: torch.Tensor  # (n + 1,) int32
    rows: int  # cu_q[-1]

    @property
    def size(self) -> int:
        return int(self.table.shape[0])


def slot_table(
    slots: list[np.ndarray], chunk: list[int], first_row: int, device: torch.device, width: int | None = None
) -> SlotTable:
    """The :class:`SlotTable` of sequences with these slots (new tokens included) and chunk sizes."""
    n = len(slots)
    lens = np.array([s.size for s in slots], dtype=np.int64)
    width = max(int(lens.max()) if n else 0, 1, width or 0)
    table = np.zeros((n, width), dtype=np.int32)
    for i, s in enumerate(slots):
        table[i, : s.size] = s
    cu_q = np.zeros(n + 1, dtype=np.int32)
    cu_q[1:] = np.cumsum(chunk)
    cu_k = np.zeros(n + 1, dtype=np.int32)
    cu_k[1:] = np.cumsum(lens)
    packed = np.concatenate(slots) if n else np.zeros(0, np.int64)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, device=device)

    return SlotTable(
        t(table),
        t(lens.astype(np.int32)),
        t(cu_q),
        max(chunk, default=0),
        int(lens.max()) if n else 0,
        first_row,
        t(packed.astype(np.int64)),
        t(cu_k),
        int(cu_q[-1]),
    )


# ------------------------------------------------------------------ torch references
def _over_slots(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor
) -> torch.Tensor:
    """SDPA of q (n, C, heads, d) over keys (n, L, kv_heads, d) with ``seen`` (n, C, L)."""
    n, width, heads, dim = q.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads
    # A KV head's query heads go along the query axis: no KV copied per head.
    qh = q.reshape(n, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, -1, dim)
    mask = seen[:, None, None].expand(n, 1, group, width, seen.shape[-1]).reshape(n, 1, group * width, -1)
    o = F.scaled_dot_product_attention(qh, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask)
    return o.reshape(n, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4).reshape(n, width, heads, dim)


def decode_reference(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """One query per sequence (q: (n, heads, d)) over its slots; zeros for a sequence of length 0."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    idx = table.long()
    keys = torch.arange(idx.shape[1], device=q.device)
    # A sequence of length 0 (graph padding) sees key 0 so its softmax stays finite, then gets zeros.
    seen = (keys[None, :] < lens[:, None].clamp_min(1))[:, None, :]
    o = _over_slots(q[:, None], k_pool[idx], v_pool[idx], seen)[:, 0]
    return torch.where((lens > 0)[:, None, None], o, torch.zeros_like(o))


def prefill_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    cu_q: torch.Tensor,
    max_q: int,
) -> torch.Tensor:
    """Packed chunks (rows ``cu_q[i] .. cu_q[i+1]-1`` of q) over their slots, causal from the lower right."""
    n = table.shape[0]
    if n == 0 or q.shape[0] == 0:
        return torch.empty_like(q)
    c = (cu_q[1:] - cu_q[:-1]).long()
    j = torch.arange(max_q, device=q.device)
    real = j[None, :] < c[:, None]  # (n, C)
    # Padded rows read row 0 (any real row): a trailing empty chunk starts at q.shape[0], past the end.
    rows = torch.where(real, cu_q[:-1, None].long() + j[None, :], 0)
    keys = torch.arange(table.shape[1], device=q.device)
    past = (lens.long() - c)[:, None, None]
    seen = keys[None, None, :] <= past + j[None, :, None]  # padded rows see keys too: finite softmax
    idx = table.long()
    o = _over_slots(q[rows], k_pool[idx], v_pool[idx], seen)
    out = torch.empty_like(q)
    out[rows[real]] = o[real]
    return out


def varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
) -> torch.Tensor:
    """What ``torch.nn.attention.varlen.varlen_attn(..., window_size=(-1, 0), enable_gqa=True)`` computes.

    Packed queries and packed keys; sequence i's queries ``cu_q[i] ..`` attend
    its keys ``cu_k[i] ..``, causal aligned to the lower right. Stands in for
    the flash kernel where there is none (CPU), so the packing is tested.
    """
    n = cu_q.shape[0] - 1
    lens = cu_k[1:] - cu_k[:-1]
    j = torch.arange(max(max_k, 1), device=q.device)
    table = torch.where(j[None, :] < lens[:, None], cu_k[:-1, None] + j[None, :], cu_k[:-1, None])
    return prefill_reference(q, k, v, table[:n], lens, cu_q, max_q)


# ------------------------------------------------------------------ the attend function
def varlen_flash(
    q: torch.Tensor, pool: KVPool, layer: int, st: SlotTable, reference: bool = False
) -> torch.Tensor:
    """Chunks through one flash varlen call over a packed copy of only their KV (CUDA)."""
    k = pool.k[layer].index_select(0, st.packed)
    v = pool.v[layer].index_select(0, st.packed)
    if reference:
        return varlen_reference(q, k, v, st.cu_q, st.cu_k, st.max_q, st.max_k)
    from torch.nn.attention.varlen import varlen_attn

    heads, kv_heads = q.shape[1], k.shape[1]
    gqa: dict[str, bool] = {}
    if heads != kv_heads:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            gqa["enable_gqa"] = True
        else:  # torch 2.11's varlen_attn has no GQA: repeat the (few) chunks' KV per query head
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
    return varlen_attn(q, k, v, st.cu_q, st.cu_k, st.max_q, st.max_k, window_size=(-1, 0), **gqa)


@cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def decode_splits(
    n: int, kv_heads: int, max_len: int, kernels: AttentionKernels, device: torch.device
) -> int:
    """The decode kernel's KV splits for n decodes whose longest has ``max_len`` keys.

    By length (``kernels.partition``): enough partitions for ``max_len``; in a bucket of static
    buffers ``max_len`` is the slot table's width, so the captured grid holds any batch of the
    bucket. Fixed (``kernels.splits``). Else by count: enough programs to fill the GPU twice, at
    least four tiles per split, at most 16.
    """
    if kernels.partition:
        return max(1, -(-max_len // kernels.partition))
    if kernels.splits:
        return kernels.splits
    if device.type != "cuda":
        return 1
    sms = _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    want = -(-2 * sms // max(1, n * kv_heads))
    return max(1, min(want, 16, -(-max_len // (4 * kernels.block_n))))


class InPlaceAttention:
    """The attend function of one batch: write the new KV into the pool, attend over it in place."""

    def __init__(
        self, pool: KVPool, decodes: SlotTable, chunks: SlotTable, kernels: AttentionKernels
    ) -> None:
        self.pool = pool
        self.decodes = decodes
        self.chunks = chunks
        self.kernels = kernels
        self.write_slots: torch.Tensor | None = None
        kv_heads = pool.k.shape[2]
        self.splits = decode_splits(decodes.size, kv_heads, decodes.max_k, kernels, pool.k.device)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.write_slots is not None, "set write_slots before the forward pass"
        self.pool.write(layer, self.write_slots, k, v)
        kp, vp = self.pool.k[layer], self.pool.v[layer]
        kn = self.kernels
        d, c = self.decodes, self.chunks
        parts = []
        if d.size:
            qd = q[: d.size]
            if kn.decode == "triton":
                from kvsched.executor import triton_attention as ta

                parts.append(
                    ta.decode_attention(
                        qd,
                        kp,
                        vp,
                        d.table,
                        d.lens,
                        splits=self.splits,
                        partition=kn.partition,
                        block_n=kn.block_n,
                    )
                )
            else:
                parts.append(decode_reference(qd, kp, vp, d.table, d.lens))
        if c.size:
            qc = q[c.first_row : c.first_row + c.rows]
            if kn.prefill == "triton":
                from kvsched.executor import triton_attention as ta

                parts.append(
                    ta.prefill_attention(
                        qc, kp, vp, c.table, c.lens, c.cu_q, c.max_q, block_m=kn.block_m, block_n=kn.block_n
                    )
                )
            elif kn.prefill == "varlen":
                parts.append(varlen_flash(qc, self.pool, layer, c, reference=q.device.type != "cuda"))
            else:
                parts.append(prefill_reference(qc, kp, vp, c.table, c.lens, c.cu_q, c.max_q))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
