"""InferMax's waiting queue against a plain sorted list under random operations."""

from __future__ import annotations

import bisect
import random

import pytest

from kvsched.heuristics.infermax_queue import WaitingQueue


@pytest.mark.parametrize("seed", range(20))
def test_the_queue_is_the_sorted_list(seed: int) -> None:
    rng = random.Random(seed)
    key: dict[int, float] = {}
    queue, plain = WaitingQueue(), []
    fresh = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.35:  # arrivals: usually last, sometimes inside
            r, fresh = fresh, fresh + 1
            key[r] = rng.random() if rng.random() < 0.2 else fresh
            if not queue.items or key[queue.items[-1]] <= key[r]:
                queue.append(r)
            else:
                queue.insort(r, key.__getitem__)
            bisect.insort(plain, r, key=key.__getitem__)
        elif op < 0.55 and plain:  # an evicted request back near the head
            r, fresh = fresh, fresh + 1
            key[r] = key[plain[0]] + rng.uniform(-1, 3)
            queue.insort(r, key.__getitem__)
            bisect.insort(plain, r, key=key.__getitem__)
        elif op < 0.9 and plain:  # admissions from the head
            k = rng.randint(1, min(len(plain), 40))
            assert queue.take(list(range(k))) == plain[:k]
            del plain[:k]
        elif plain:  # admissions anywhere (probing)
            taken = sorted(rng.sample(range(len(plain)), rng.randint(1, min(len(plain), 5))))
            assert queue.take(taken) == [plain[j] for j in taken]
            for j in reversed(taken):
                del plain[j]
        assert list(queue) == plain and len(queue) == len(plain) and bool(queue) == bool(plain)
        assert queue == plain and (not queue.items) == (not plain)
        if plain:
            assert (
                queue[0] == plain[0]
                and queue[-1] == plain[-1]
                and queue[len(plain) // 2] == plain[len(plain) // 2]
            )
