"""InferMax's waiting queue: request positions sorted by priority key, cheap to take from its head.

A plain sorted list shifts every element behind the head each time requests are
admitted from the head (``del waiting[:k]``) or an evicted request is put back
near it (``insort``). With 10,000 requests waiting (every ShareGPT request
arriving at t = 0) those shifts were 4% of the simulation. Here the list keeps a
*head* offset instead: admitted requests only move it, the dead prefix is
dropped once it is more than half the list, and a request inserted near the
head shifts the few entries before its place one step into the dead prefix.
The order of the requests, and so every decision, is exactly the sorted list's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

#: A dead prefix shorter than this is never dropped (dropping costs a shift of the whole list).
_KEEP = 64


class WaitingQueue:
    """Request positions sorted by a key, the first :attr:`head` entries of :attr:`items` removed.

    Attributes
    ----------
    items
        The list; its live part is ``items[head:]``, in priority order. An empty
        queue has an empty list (so ``not items`` says empty).
    head
        Entries before it are gone.
    """

    __slots__ = ("head", "items")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.items) - self.head

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[int]:
        # A list iterator moved to the head (its pickling state is its index): islice would step
        # through the dead prefix one entry at a time.
        it = iter(self.items)
        it.__setstate__(self.head)  # type: ignore[attr-defined]
        return it

    def __eq__(self, other: object) -> bool:
        """The same requests in the same order (as a list, or another queue)."""
        if isinstance(other, WaitingQueue | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"WaitingQueue({list(self)!r})"

    def __getitem__(self, j: int) -> int:
        """The ``j``-th request in priority order (``-1``: the last)."""
        return self.items[self.head + j if j >= 0 else j]

    def append(self, r: int) -> None:
        """Put ``r`` last (its key is not below any other's)."""
        self.items.append(r)

    def insort(self, r: int, key: Callable[[int], Any]) -> None:
        """Insert ``r`` after every request whose key is not above its own (``bisect.insort``)."""
        items, head = self.items, self.head
        pos = bisect.bisect_right(items, key(r), lo=head, key=key)
        if head and pos - head <= len(items) - pos:
            # Nearer the head: the entries before its place move one step into the dead prefix.
            items[head - 1 : pos - 1] = items[head:pos]
            items[pos - 1] = r
            self.head = head - 1
        else:
            items.insert(pos, r)

    def take_head(self, k: int) -> list[int]:
        """Remove and return the first ``k`` requests."""
        items, head = self.items, self.head
        out = items[head : head + k]
        head += k
        if head == len(items):
            items.clear()
            head = 0
        elif head > _KEEP and 2 * head > len(items):
            del items[:head]
            head = 0
        self.head = head
        return out

    def take(self, taken: list[int]) -> list[int]:
        """Remove and return the requests at the increasing indices ``taken`` (in priority order)."""
        if taken[-1] == len(taken) - 1:
            return self.take_head(len(taken))
        items, head = self.items, self.head
        out = [items[head + j] for j in taken]
        for j in reversed(taken):
            del items[head + j]
        if head == len(items):
            items.clear()
            self.head = 0
        return out


__all__ = ["WaitingQueue"]
