"""One batch's tensor work: allocate its KV, build its tensors, one forward pass over every item.

An item processes the tokens at positions ``start .. start + c - 1`` of one
request, on top of the ``start`` KV tokens the request holds; what the item is
(prefill chunk, decode, refill) is the semantic core's business, not this
module's -- here every item is "append c tokens to a cache of start tokens".

All items go through each layer's matmuls together (the input is packed: T =
sum of c rows, the one-token items first, then the chunks). Attention is one
of two implementations (:data:`ATTENTION`):

* ``paged`` (default): the KV pool is read in place through per-sequence slot
  tables, one call for all one-token items and one for all chunks
  (:mod:`kvsched.executor.paged`, with torch references or Triton kernels);
* ``gather``: the first GPU run's attention, KV gathered into padded groups
  (:mod:`kvsched.executor.gather`), kept for comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from kvsched.errors import InputError
from kvsched.executor.gather import GatherAttention, ItemGroup, item_groups
from kvsched.executor.kvcache import KVPool
from kvsched.executor.model import AttendFn, Decoder
from kvsched.executor.paged import AttentionKernels, InPlaceAttention, SlotTable, slot_table

Attention = Literal["paged", "gather"]
#: Attention implementations, by name.
ATTENTION = ("paged", "gather")


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
    """The device tensors of one batch (built, and its KV slots allocated, by :func:`plan_batch`).

    Rows are packed one-token items first, then chunks, each in item order;
    ``logit_rows`` lists the sampled rows in item order.
    """

    ids: torch.Tensor  # (T,) token ids
    positions: torch.Tensor  # (T,)
    write_slots: torch.Tensor  # (T,) pool slot of each new token
    logit_rows: torch.Tensor  # (R,) rows whose logits are sampled
    num_tokens: int
    attention: Attention
    decodes: SlotTable  # the one-token items (rows 0 .. n - 1)
    chunks: SlotTable  # the chunks (rows n .. T - 1)
    groups: tuple[ItemGroup, ...] = ()  # the gather path's groups

    @property
    def decode_only(self) -> bool:
        return self.chunks.size == 0


def plan_batch(
    pool: KVPool, items: Sequence[ItemWork], device: torch.device, attention: Attention = "paged"
) -> BatchPlan:
    """Allocate the items' new KV in ``pool`` and build the batch's tensors.

    Raises :class:`~kvsched.executor.kvcache.KvPoolError` when the pool cannot hold them.
    """
    if attention not in ATTENTION:
        raise InputError(f"--attention: expected one of {', '.join(ATTENTION)}, got {attention!r}")
    single, multi = [], []
    for k, it in enumerate(items):
        if pool.held(it.owner) != it.start:
            raise RuntimeError(
                f"executor bug: request {it.label or it.owner} holds {pool.held(it.owner)} KV tokens in the "
                f"pool but the schedule's state says {it.start}"
            )
        writes = pool.append(it.owner, int(it.ids.size), it.label)
        (single if it.ids.size == 1 else multi).append((k, it, writes))
    ids, positions, writes, last = [], [], [], {}
    row = 0
    for k, it, w in single + multi:
        c = int(it.ids.size)
        ids.append(it.ids)
        positions.append(np.arange(it.start, it.start + c, dtype=np.int64))
        writes.append(w)
        last[k] = row + c - 1
        row += c
    logit_rows = np.array([last[k] for k, it in enumerate(items) if it.sample], dtype=np.int64)

    def tensor(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.as_tensor(np.concatenate(parts) if parts else np.zeros(0, np.int64), device=device)

    seq = {k: pool.slots(it.owner) for k, it, _ in single + multi}
    decodes = slot_table([seq[k] for k, _, _ in single], [1] * len(single), 0, device)
    chunks = slot_table(
        [seq[k] for k, _, _ in multi], [int(it.ids.size) for _, it, _ in multi], len(single), device
    )
    groups: tuple[ItemGroup, ...] = ()
    if attention == "gather":
        rows = np.cumsum([0] + [int(it.ids.size) for _, it, _ in single + multi])
        entries = [(int(rows[j]), int(it.ids.size), seq[k]) for j, (k, it, _) in enumerate(single + multi)]
        groups = item_groups(entries[: len(single)], entries[len(single) :], device)
    return BatchPlan(
        ids=tensor(ids),
        positions=tensor(positions),
        write_slots=tensor(writes),
        logit_rows=torch.as_tensor(logit_rows, device=device),
        num_tokens=row,
        attention=attention,
        decodes=decodes,
        chunks=chunks,
        groups=groups,
    )


def attend_fn(pool: KVPool, plan: BatchPlan, kernels: AttentionKernels | None = None) -> AttendFn:
    """The attend function of the planned batch (writes its KV, attends over the pool)."""
    if plan.attention == "gather":
        return GatherAttention(pool, plan.write_slots, plan.groups)
    attend = InPlaceAttention(pool, plan.decodes, plan.chunks, kernels or AttentionKernels())
    attend.write_slots = plan.write_slots
    return attend


def run_batch(
    model: Decoder, pool: KVPool, plan: BatchPlan, kernels: AttentionKernels | None = None
) -> torch.Tensor:
    """One forward pass over the planned batch; greedy next tokens of the sampled rows (on the device)."""
    logits = model(plan.ids, plan.positions, attend_fn(pool, plan, kernels), plan.logit_rows)
    return logits.argmax(dim=-1)
