"""One batch's tensor work: paged attention and one forward pass over every item.

An item processes the tokens at positions ``start .. start + c - 1`` of one
request, on top of the ``start`` KV tokens the request holds; what the item is
(prefill chunk, decode, refill) is the semantic core's business, not this
module's -- here every item is "append c tokens to a cache of start tokens".

All items go through each layer's matmuls together (the input is packed: T =
sum of c rows). Attention is per item pattern, over KV gathered from the pool:

* items of one token (decodes, and one-token chunks) in one padded
  scaled-dot-product-attention call with a key mask, the query heads of a KV
  head laid along the query axis so grouped-query attention needs no copies;
* each multi-token chunk in its own call with a lower-right causal bias: token i
  of the chunk sees the cache and chunk tokens up to itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from kvsched.executor.kvcache import KVPool
from kvsched.executor.model import Decoder


@dataclass(frozen=True, slots=True, eq=False)
class ItemWork:
    """One item's tensor work.

    Parameters
    ----------
    owner
        The request's key in the KV pool (its position in the instance).
    start
        KV tokens the request holds before the batch: the position of the first token processed.
    ids
        Token ids at positions ``start .. start + len(ids) - 1``.
    sample
        Whether the logits of its last token are wanted (the request generates a token).
    label
        Name for error messages (the request id).
    """

    owner: int
    start: int
    ids: np.ndarray
    sample: bool
    label: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class BatchPlan:
    """The device tensors of one batch (built, and its KV slots allocated, by :func:`plan_batch`)."""

    ids: torch.Tensor  # (T,) token ids, items back to back
    positions: torch.Tensor  # (T,)
    write_slots: torch.Tensor  # (T,) pool slot of each new token
    logit_rows: torch.Tensor  # (R,) rows whose logits are sampled
    decode_rows: torch.Tensor | None  # (B,) rows of the one-token items
    decode_slots: torch.Tensor | None  # (B, L) their KV slots, padded
    decode_mask: torch.Tensor | None  # (B, 1, 1, L) True where a key is real
    chunks: tuple[tuple[int, int, torch.Tensor], ...]  # (first row, tokens, KV slots) per multi-token item
    num_tokens: int


def plan_batch(pool: KVPool, items: Sequence[ItemWork], device: torch.device) -> BatchPlan:
    """Allocate the items' new KV in ``pool`` and build the batch's tensors.

    Raises :class:`~kvsched.executor.kvcache.KvPoolError` when the pool cannot hold them.
    """
    ids, positions, writes, logit_rows = [], [], [], []
    dec_rows: list[int] = []
    dec_slots: list[np.ndarray] = []
    chunks = []
    row = 0
    for it in items:
        c = int(it.ids.size)
        if pool.held(it.owner) != it.start:
            raise RuntimeError(
                f"executor bug: request {it.label or it.owner} holds {pool.held(it.owner)} KV tokens in the "
                f"pool but the schedule's state says {it.start}"
            )
        writes.append(pool.append(it.owner, c, it.label))
        ids.append(it.ids)
        positions.append(np.arange(it.start, it.start + c, dtype=np.int64))
        slots = pool.slots(it.owner)
        if c == 1:
            dec_rows.append(row)
            dec_slots.append(slots)
        else:
            chunks.append((row, c, torch.as_tensor(slots, device=device)))
        if it.sample:
            logit_rows.append(row + c - 1)
        row += c

    def tensor(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.as_tensor(np.concatenate(parts) if parts else np.zeros(0, np.int64), device=device)

    decode_rows = decode_slots = decode_mask = None
    if dec_rows:
        width = max(s.size for s in dec_slots)
        padded = np.zeros((len(dec_slots), width), dtype=np.int64)
        lengths = np.array([s.size for s in dec_slots])
        for i, s in enumerate(dec_slots):
            padded[i, : s.size] = s
        mask = np.arange(width)[None, :] < lengths[:, None]
        decode_rows = torch.as_tensor(np.array(dec_rows, dtype=np.int64), device=device)
        decode_slots = torch.as_tensor(padded, device=device)
        decode_mask = torch.as_tensor(mask[:, None, None, :], device=device)
    return BatchPlan(
        ids=tensor(ids),
        positions=tensor(positions),
        write_slots=tensor(writes),
        logit_rows=torch.as_tensor(np.array(logit_rows, dtype=np.int64), device=device),
        decode_rows=decode_rows,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        chunks=tuple(chunks),
        num_tokens=row,
    )


class PagedAttention:
    """The attend function of one batch: write the new KV into the pool, attend over the cache."""

    def __init__(self, pool: KVPool, plan: BatchPlan) -> None:
        self.pool = pool
        self.plan = plan

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        self.pool.write(layer, plan.write_slots, k, v)
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        group = heads // kv_heads
        out = torch.empty_like(q)
        if plan.decode_rows is not None:
            b = plan.decode_rows.numel()
            keys, values = self.pool.gather(layer, plan.decode_slots)  # (B, L, kv_heads, d)
            # Head h uses KV head h // group: the group's query heads become the query axis.
            qd = q[plan.decode_rows].reshape(b, kv_heads, group, dim)
            o = F.scaled_dot_product_attention(
                qd, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=plan.decode_mask
            )
            out[plan.decode_rows] = o.reshape(b, heads, dim)
        for row, c, slots in plan.chunks:
            keys, values = self.pool.gather(layer, slots)  # (L, kv_heads, d)
            keys, values = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]
            if group > 1:
                keys = keys.repeat_interleave(group, dim=1)
                values = values.repeat_interleave(group, dim=1)
            qc = q[row : row + c].transpose(0, 1)[None]  # (1, heads, c, d)
            o = F.scaled_dot_product_attention(
                qc, keys, values, attn_mask=causal_lower_right(c, slots.numel())
            )
            out[row : row + c] = o[0].transpose(0, 1)
        return out


def run_batch(model: Decoder, pool: KVPool, plan: BatchPlan) -> torch.Tensor:
    """One forward pass over the planned batch; greedy next tokens of the sampled rows (on the device)."""
    logits = model(plan.ids, plan.positions, PagedAttention(pool, plan), plan.logit_rows)
    return logits.argmax(dim=-1)
