"""The paged KV pool: exactly M token slots, allocated in blocks.

One tensor per K and V holds every layer's cache: ``(layers, slots, kv_heads,
head_dim)``, with ``slots = (M // block_size) * block_size`` -- the blocks the
semantic core counts (``Limits.kv_blocks``), nothing more. Requests own lists
of blocks (a block table, as in vLLM's PagedAttention); a token at position p
of a request lives in slot ``table[p // block_size] * block_size + p % block_size``.

The pool keeps its own books: allocating a block that is not free raises
:class:`KvPoolError`. So a schedule whose memory claim is wrong is refused by
the executor itself, not only by the validator. Evicting or completing a
request frees its blocks; a refill recomputes its KV into fresh blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from kvsched.errors import KvschedError


class KvPoolError(KvschedError):
    """The KV pool has too few free blocks for an allocation."""


class KVPool:
    """A paged KV cache of ``capacity // block_size`` blocks of ``block_size`` token slots.

    Parameters
    ----------
    capacity
        M, in tokens.
    block_size
        Tokens per block.
    layers, kv_heads, head_dim
        Shape of one token's KV (per layer: K and V of ``kv_heads x head_dim``).
    dtype, device
        Where and how the cache is stored.
    """

    def __init__(
        self,
        capacity: int,
        block_size: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if block_size < 1 or capacity < block_size:
            raise KvPoolError(f"KV pool: capacity {capacity} holds no block of {block_size} tokens")
        self.capacity = capacity
        self.block_size = block_size
        self.num_blocks = capacity // block_size
        self.num_slots = self.num_blocks * block_size
        #: The row padding tokens write to; never allocated, never read by a real token.
        self.scratch = self.num_slots
        shape = (layers, self.num_slots + 1, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._free: list[int] = []
        self._tables: dict[int, list[int]] = {}
        self._held: dict[int, int] = {}
        self.reset()

    # ------------------------------------------------------------- books
    def reset(self) -> None:
        """Free every block."""
        # A stack: the lowest-numbered free block is handed out first.
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._tables.clear()
        self._held.clear()

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def used_tokens(self) -> int:
        return sum(self._held.values())

    def held(self, owner: int) -> int:
        """KV tokens ``owner`` holds."""
        return self._held.get(owner, 0)

    def append(self, owner: int, n: int, label: str | None = None) -> np.ndarray:
        """Slots for ``n`` more tokens of ``owner``, allocating blocks as needed.

        Raises
        ------
        KvPoolError
            When the blocks needed are not free (nothing is allocated then).
        """
        held = self._held.get(owner, 0)
        table = self._tables.setdefault(owner, [])
        need = -(-(held + n) // self.block_size) - len(table)
        if need > len(self._free):
            who = repr(label) if label is not None else f"at position {owner}"
            raise KvPoolError(
                f"KV pool full: request {who} needs {need} more block(s) of {self.block_size} tokens "
                f"to hold {held + n} KV tokens, but only {len(self._free)} of {self.num_blocks} blocks are "
                f"free (M = {self.capacity} tokens)"
            )
        for _ in range(max(0, need)):
            table.append(self._free.pop())
        self._held[owner] = held + n
        return self._slots(table, held, held + n)

    def slots(self, owner: int, upto: int | None = None) -> np.ndarray:
        """Slots of ``owner``'s positions ``0 .. upto - 1`` (default: all it holds)."""
        held = self._held.get(owner, 0)
        upto = held if upto is None else upto
        if upto > held:
            raise ValueError(f"owner {owner} holds {held} tokens, not {upto}")
        return self._slots(self._tables.get(owner, []), 0, upto)

    def _slots(self, table: list[int], lo: int, hi: int) -> np.ndarray:
        pos = np.arange(lo, hi, dtype=np.int64)
        blocks = np.asarray(table, dtype=np.int64)
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def free(self, owner: int) -> None:
        """Release every block of ``owner`` (eviction or completion)."""
        self._free.extend(reversed(self._tables.pop(owner, [])))
        self._held.pop(owner, None)

    # ------------------------------------------------------------- tensors
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K and V (T, kv_heads, head_dim) of new tokens in ``slots`` (T,)."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (any shape S): tensors of shape (*S, kv_heads, head_dim)."""
        return self.k[layer][slots], self.v[layer][slots]
