"""``new_decision`` builds the same frozen ``Decision`` as its ``__init__`` (the policy's per-call path)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsched.heuristics.base import Decision, new_decision


@pytest.mark.parametrize(
    "args",
    [
        ([1, 2], [1, 7], [3]),
        ([0], [5], ()),
        (np.array([4, 2], dtype=np.int64), np.array([1, 1], dtype=np.int64), []),
    ],
)
def test_new_decision_equals_init(args):
    fast, plain = new_decision(*args), Decision(*args)
    assert type(fast) is Decision
    for f in dataclasses.fields(Decision):
        assert getattr(fast, f.name) is getattr(plain, f.name)
    assert repr(fast) == repr(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.requests = []  # type: ignore[misc]


def test_new_decision_default_evict():
    fast = new_decision([1], [1])
    assert fast.evict == () and fast.evict is Decision([1], [1]).evict
