"""The first GPU run's attention: KV gathered from the pool, items in padded groups (the comparison path).

Items are attended in groups of similar size, each group in one padded
scaled-dot-product-attention call over KV gathered from the pool:

* decodes (and other one-token items) are grouped among themselves, chunks of
  several tokens among themselves;
* a group's mask is causal from the lower right: token j of an item over m
  cached tokens sees keys 0 .. m + j, and no padding. An item alone in its
  group gets the ``causal_lower_right`` bias instead, which lets CUDA pick the
  flash kernel;
* the query heads of a KV head are laid along the query axis, so grouped-query
  attention copies no KV.

Items join a group while its padded area (items x longest item x longest KV)
stays within twice the area they need, plus :data:`GROUP_SLACK`. The gather
copies up to twice the KV read; :mod:`kvsched.executor.paged` reads it in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from kvsched.executor.kvcache import KVPool

#: Padded query x key cells a group may waste beyond twice what it needs (small items always merge).
GROUP_SLACK = 1 << 12


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


def item_groups(
    singles: list[tuple[int, int, np.ndarray]],
    chunks: list[tuple[int, int, np.ndarray]],
    device: torch.device,
) -> tuple[ItemGroup, ...]:
    """Groups of (packed row, tokens, slots) one-token items and of multi-token chunks."""
    return tuple(_item_group(g, device) for g in _group(singles) + _group(chunks))


class GatherAttention:
    """The attend function of one batch: write the new KV into the pool, attend over the cache."""

    def __init__(self, pool: KVPool, write_slots: torch.Tensor, groups: tuple[ItemGroup, ...]) -> None:
        self.pool = pool
        self.write_slots = write_slots
        self.groups = groups
        self._masks: dict[tuple[int, int, int], torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer, self.write_slots, k, v)
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        group = heads // kv_heads
        out = torch.empty_like(q)
        for g in self.groups:
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
            keys = torch.arange(length, device=self.write_slots.device)
            queries = torch.arange(width, device=keys.device) + (length - width)
            self._masks[key] = (keys[None, :] <= queries[:, None]).repeat(group, 1)[None, None]
        return self._masks[key]
