"""kvsched.schedule.collector: the collector resumes without a pass over what was made while paused."""

from __future__ import annotations

import gc

from kvsched.schedule.collector import collector_paused


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_resumes_enabled_with_nothing_young() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        kept = [_Node() for _ in range(5000)]
    assert gc.isenabled()
    assert gc.get_count()[0] < 100  # the objects made in the block count as old
    assert gc.get_freeze_count() == 0 and all(gc.is_tracked(x) for x in kept[:10])


def test_cycles_made_while_paused_are_still_collected() -> None:
    with collector_paused():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        del a, b
    assert gc.collect() >= 2  # a full pass finds the cycle (now in the oldest generation)


def test_leaves_a_paused_collector_paused_and_others_frozen_objects_frozen() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    frozen = [_Node() for _ in range(10)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with collector_paused():
            pass
        assert gc.get_freeze_count() == before  # a forking server's frozen objects stay frozen
    finally:
        gc.unfreeze()
    del frozen
