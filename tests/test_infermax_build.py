"""InferMax's batch accumulator: its items against the plain join of what was added."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvsched.costmodel.small import SMALL
from kvsched.heuristics.infermax_build import Build


def _build() -> Build:
    empty = np.zeros(0, dtype=np.int64)
    return Build(None, empty, empty, np.zeros(0, dtype=bool), 0, 0, 0, -1)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(30))
def test_items_are_the_joined_parts(seed: int) -> None:
    """Decodes in bulk and items one by one, in any interleaving, come back in the order they joined
    (the filled path, one part then a few items, included), as fresh read-only int64 arrays."""
    rng = random.Random(seed)
    ones = np.ones(4 * SMALL, dtype=np.int64)
    ones.setflags(write=False)
    pool = np.array(rng.sample(range(100_000), 4 * SMALL), dtype=np.int64)
    build = _build()
    plain_req: list[int] = []
    plain_tok: list[int] = []
    at = 0
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if rng.random() < 0.3:  # items one by one before the part
            for _ in range(rng.randint(1, 3)):
                r, c = rng.randrange(100_000, 200_000), rng.randint(1, 600)
                build.requests.append(r)
                build.tokens.append(c)
                plain_req.append(r)
                plain_tok.append(c)
        size = rng.randint(1, SMALL + 4)
        pos = pool[at : at + size]  # a view of the policy's array, as the decodes' part is
        at += size
        build.add_decodes(pos, ones[:size], -1)
        plain_req += pos.tolist()
        plain_tok += [1] * size
    for _ in range(rng.choice((0, 1, 1, 2, 5))):  # the chunks after the decodes
        r, c = rng.randrange(100_000, 200_000), rng.randint(1, 600)
        build.requests.append(r)
        build.tokens.append(c)
        plain_req.append(r)
        plain_tok.append(c)
    req, tok = build.items()
    assert list(req) == plain_req
    assert list(tok) == plain_tok
    if isinstance(req, np.ndarray):
        assert req.dtype == np.int64 and tok.dtype == np.int64
        assert not req.flags.writeable and not tok.flags.writeable
        assert req.base is None and tok.base is None  # not views of the policy's arrays
        assert not np.shares_memory(req, pool) and not np.shares_memory(tok, ones)


def test_one_part_then_chunks_takes_the_filled_path() -> None:
    """Many decodes then one or two chunks: the values np.concatenate gives, as fresh arrays."""
    ones = np.ones(64, dtype=np.int64)
    pos = np.arange(7, 7 + 3 * SMALL, dtype=np.int64)
    for extra in ([5], [5, 9]):
        build = _build()
        build.add_decodes(pos, ones[: pos.size], -1)
        build.requests += extra
        build.tokens += [300] * len(extra)
        req, tok = build.items()
        expect = np.concatenate((pos, extra), dtype=np.int64)
        assert isinstance(req, np.ndarray) and np.array_equal(req, expect)
        assert np.array_equal(tok, np.concatenate((ones[: pos.size], [300] * len(extra)), dtype=np.int64))
        assert req.base is None and not req.flags.writeable


def test_every_running_request_in_order_is_the_order_array_itself():
    """Decodes of ranks 0 to k - 1, then the others in rank order: the batch is ``order`` itself (the
    core takes its reads of it); ranks out of turn, another request, or an item before the decodes
    give a fresh array of the same items."""
    order = np.arange(100, 100 + 3 * SMALL, dtype=np.int64)
    order.setflags(write=False)
    ones = np.ones(order.size, dtype=np.int64)
    k = order.size - 2
    rest = order[k:].tolist()
    cases = (
        ([], rest, True),
        ([], rest[::-1], False),
        ([], [rest[0], 7], False),
        ([rest[0]], [rest[1]], False),
    )
    for before, after, whole in cases:
        build = Build(None, order, order, np.zeros(order.size, dtype=bool), 0, 0, 0, -1)  # type: ignore[arg-type]
        build.requests += before
        build.tokens += [5] * len(before)
        build.add_decodes(order[:k], ones[:k], 0)
        build.requests += after
        build.tokens += [5] * len(after)
        req, tok = build.items()
        assert (req is order) == whole
        assert list(req) == [*before, *order[:k].tolist(), *after]
        assert list(tok) == [5] * len(before) + [1] * k + [5] * len(after)
        assert not req.flags.writeable and not tok.flags.writeable
