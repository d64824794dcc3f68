"""One batch's tensor work: paged attention and one forward pass over every item.

An item processes the tokens at positions ``start .. start + c - 1`` of one
request, on top of the ``start`` KV tokens the request holds; what the item is
(prefill chunk, decode, refill) is the semantic core's business, not this
module's -- here every item is "append c tokens to a cache of start tokens".

All items go through each layer's matmuls together (the input is packed: T =
sum of c rows). Attention runs over KV gathered from the pool, in groups of
items of similar size, each group in one padded scaled-dot-product-attention
call:

* decodes (and other one-token items) are grouped among themselves, chunks of
  several tokens among themselves;
* a group's mask is causal from the lower right: token j of an item over m
  cached tokens sees keys 0 .. m + j, and no padding. An item alone in its
  group gets the ``causal_lower_right`` bias instead, which lets CUDA pick the
  flash kernel;
* the query heads of a KV head are laid along the query axis, so grouped-query
  attention copies no KV.

Grouping bounds both costs of an eager engine: every call is a launch (a
vLLM-style prefill batch of 180 short prompts would otherwise be 180 calls per
layer), and every padded key is KV copied for nothing (one padded call for 150
decodes reading 50 to 3,500 tokens would gather 150 x 3,500). Items join a group
while its padded area (items x longest item x longest KV) stays within twice
the area they need, plus :data:`GROUP_SLACK`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from kvsched.executor.kvcache import KVPool
from kvsched.executor.model import Decoder

#: Padded query x key cells a group may waste beyond twice what it needs (small items always merge).
GROUP_SLACK = 1 << 12


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
    groups: tuple[ItemGroup, ...]  # every item, in groups attended together
    num_tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class ItemGroup:
    """Items attended in one call, padded to the longest item and the longest KV."""

    rows: torch.Tensor  # (n, C) packed row of each item token; padding repeats a real row
    take: torch.Tensor  # (K,) the real tokens' places in the flattened (n * C) padded block
    dest: torch.Tensor  # (K,) their packed rows
    slots: torch.Tensor  # (n, L) KV slots; padding repeats a real slot
    mask: torch.Tensor | None  # (n, 1, C, L) True where a query sees a key; None for a lone item (causal)


def _group(items: list[tuple[int, int, np.ndarray]]) -> list[list[tuple[int, int, np.ndarray]]]:
    """Greedy grouping of (row, tokens, slots) items by KV length, bounded padded area."""
    groups: list[list[tuple[int, int, np.ndarray]]] = []
    area = max_c = max_l = 0
    for ch in sorted(items, key=lambda ch: (ch[2].size, ch[1])):
        c, length = ch[1], ch[2].size
        n = len(groups[-1]) if groups else 0
        padded = (n + 1) * max(max_c, c) * max(max_l, length)
        if groups and padded <= 2 * (area + c * length) + GROUP_SLACK:
            groups[-1].append(ch)
            area, max_c, max_l = area + c * length, max(max_c, c), max(max_l, length)
        else:
            groups.append([ch])
            area, max_c, max_l = c * length, c, length
    return groups


def _item_group(group: list[tuple[int, int, np.ndarray]], device: torch.device) -> ItemGroup:
    n = len(group)
    width = max(c for _, c, _ in group)
    length = max(s.size for _, _, s in group)
    rows = np.zeros((n, width), dtype=np.int64)
    valid = np.zeros((n, width), dtype=bool)
    slots = np.zeros((n, length), dtype=np.int64)
    # A lone item needs no mask (attention uses the causal bias). Padded queries see every key, so no
    # softmax row is empty.
    mask = np.ones((n, 1, width, length), dtype=bool) if n > 1 else None
    keys = np.arange(length)
    for g, (row, c, s) in enumerate(group):
        rows[g, :] = row
        rows[g, :c] = np.arange(row, row + c)
        valid[g, :c] = True
        slots[g, : s.size] = s
        slots[g, s.size :] = s[0]
        if mask is not None:
            mask[g, 0, :c, :] = keys[None, :] <= s.size - c + np.arange(c)[:, None]
    tensor = partial(torch.as_tensor, device=device)
    # Index tensors, not a boolean mask: a boolean index would make the host wait for the device every layer.
    take = np.flatnonzero(valid)
    return ItemGroup(
        tensor(rows),
        tensor(take),
        tensor(rows.reshape(-1)[take]),
        tensor(slots),
        None if mask is None else tensor(mask),
    )


def plan_batch(pool: KVPool, items: Sequence[ItemWork], device: torch.device) -> BatchPlan:
    """Allocate the items' new KV in ``pool`` and build the batch's tensors.

    Raises :class:`~kvsched.executor.kvcache.KvPoolError` when the pool cannot hold them.
    """
    ids, positions, writes, logit_rows = [], [], [], []
    singles, chunks = [], []
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
        (singles if c == 1 else chunks).append((row, c, slots))
        if it.sample:
            logit_rows.append(row + c - 1)
        row += c

    def tensor(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.as_tensor(np.concatenate(parts) if parts else np.zeros(0, np.int64), device=device)

    return BatchPlan(
        ids=tensor(ids),
        positions=tensor(positions),
        write_slots=tensor(writes),
        logit_rows=torch.as_tensor(np.array(logit_rows, dtype=np.int64), device=device),
        groups=tuple(_item_group(g, device) for g in _group(singles) + _group(chunks)),
        num_tokens=row,
    )


class PagedAttention:
    """The attend function of one batch: write the new KV into the pool, attend over the cache."""

    def __init__(self, pool: KVPool, plan: BatchPlan) -> None:
        self.pool = pool
        self.plan = plan
        self._masks: dict[tuple[int, int, int], torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        self.pool.write(layer, plan.write_slots, k, v)
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        group = heads // kv_heads
        out = torch.empty_like(q)
        for g in plan.groups:
            n, width = g.rows.shape
            length = g.slots.shape[1]
            keys, values = self.pool.gather(layer, g.slots)  # (n, L, kv_heads, d)
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)
            # A KV head's query heads go along the query axis: (n, kv_heads, group * C, d), no KV copied.
            qc = q[g.rows].reshape(n, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
            qc = qc.reshape(n, kv_heads, group * width, dim)
            if g.mask is None:
                # One item: causal from the lower right, in the block of queries of each head of a group.
                mask = (
                    causal_lower_right(width, length) if group == 1 else self._lone_mask(width, length, group)
                )
            else:
                mask = (
                    g.mask if group == 1 else g.mask.expand(n, group, width, length).reshape(n, 1, -1, length)
                )
            o = F.scaled_dot_product_attention(qc, keys, values, attn_mask=mask)
            o = (
                o.reshape(n, kv_heads, group, width, dim)
                .permute(0, 3, 1, 2, 4)
                .reshape(n * width, heads, dim)
            )
            out[g.dest] = o[g.take]
        return out

    def _lone_mask(self, width: int, length: int, group: int) -> torch.Tensor:
        """The lower-right causal mask of one chunk, repeated for each query head of a KV head (built once)."""
        key = (width, length, group)
        if key not in self._masks:
            keys = torch.arange(length, device=self.plan.ids.device)
            queries = torch.arange(width, device=keys.device) + (length - width)
            self._masks[key] = (keys[None, :] <= queries[:, None]).repeat(group, 1)[None, None]
        return self._masks[key]


def run_batch(model: Decoder, pool: KVPool, plan: BatchPlan) -> torch.Tensor:
    """One forward pass over the planned batch; greedy next tokens of the sampled rows (on the device)."""
    logits = model(plan.ids, plan.positions, PagedAttention(pool, plan), plan.logit_rows)
    return logits.argmax(dim=-1)
