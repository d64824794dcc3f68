"""The core's vectorised quick path never accepts a batch the full check rejects."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch
from tests.strategies import instances, legal_schedules


def _mutations(batch: Batch, state: EngineState, rng: np.random.Generator) -> list[Batch]:
    """Legal and illegal variants of ``batch``: tokens, phases, evictions, times."""
    n = state.n
    out = [batch]
    req, tok, ph, ev = batch.requests, batch.tokens, batch.phases, batch.evicted
    if req.size:
        k = int(rng.integers(req.size))
        out.append(
            Batch.of(
                batch.start, batch.duration, req, np.where(np.arange(req.size) == k, tok + 1, tok), ph, ev
            )
        )
        out.append(Batch.of(batch.start, batch.duration, req, tok, (ph + 1) % 3, ev))
        out.append(
            Batch.of(
                batch.start, batch.duration, np.append(req, req[k]), np.append(tok, 1), np.append(ph, 1), ev
            )
        )
        out.append(Batch.of(batch.start, batch.duration, req, tok, ph, np.append(ev, req[k])))
    holders = np.flatnonzero(state.kv > 0)
    for extra in (holders[:1], np.flatnonzero((state.kv == 0) & ~state.done)[:1]):
        if extra.size:
            out.append(Batch.of(batch.start, batch.duration, req, tok, ph, np.append(ev, extra)))
    out.append(Batch.of(batch.start - 0.5, batch.duration, req, tok, ph, ev))
    out.append(Batch.of(batch.start, batch.duration * 1.5 + 0.1, req, tok, ph, ev))
    if n:
        out.append(
            Batch.of(batch.start, batch.duration, np.append(req, n), np.append(tok, 1), np.append(ph, 0), ev)
        )
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(legal_schedules(instances()), st.integers(0, 2**31))
def test_quick_path_implies_full_check_passes(built, seed):
    rng = np.random.default_rng(seed)
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        for variant in _mutations(batch, state, rng):
            if state._quick_ok(variant):
                assert state._full_check(variant) == [], variant.items()
        # Legal batches should take the quick path (else the speed-up is lost silently).
        assert state._quick_ok(batch)
        state.apply(batch)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(legal_schedules(instances()))
def test_batches_built_by_make_batch_take_the_quick_path(built):
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        again = state.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted)
        assert state._quick_ok(again) and state._full_check(again) == []
        state.step(again)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(legal_schedules(instances()), st.integers(0, 2**31))
def test_evictions_drop_the_kv_and_ask_for_every_known_token_again(built, seed):
    """EngineState._evict (scalar reads and writes, one request at a time): an evicted request holds no
    KV, its KV joins what it dropped, all S tokens are left, it refills once it has generated, its
    eviction count grows by one and the totals lose it; nobody else changes."""
    import copy

    rng = np.random.default_rng(seed)
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        holders = np.flatnonzero(state.kv > 0)
        if holders.size:
            ev = rng.permutation(holders)[: int(rng.integers(1, holders.size + 1))]
            after = copy.copy(state)
            after._evict(ev)
            others = np.setdiff1d(np.arange(state.n), ev)
            m, g = state.kv[ev], state.generated[ev]
            assert not after.kv[ev].any() and np.array_equal(after._dropped[ev], state._dropped[ev] + m)
            assert np.array_equal(after._left[ev], state.prompt[ev] + g)
            assert np.array_equal(after.refilling[ev], g > 0)
            assert np.array_equal(after._phase[ev], np.where(g > 0, 2, 0))
            assert np.array_equal(after.evictions[ev], state.evictions[ev] + 1)
            blocks = -(-m // state.block_size)
            assert (
                after.kv_tokens == state.kv_tokens - m.sum()
                and after.kv_blocks == state.kv_blocks - blocks.sum()
            )
            assert after.num_holding == state.num_holding - ev.size
            for name in ("kv", "_dropped", "_left", "refilling", "_phase", "evictions", "generated"):
                assert np.array_equal(getattr(after, name)[others], getattr(state, name)[others]), name
        state.apply(batch)


def test_make_batch_shares_a_frozen_array_it_alone_can_read_and_copies_the_rest():
    """A read-only int64 array that owns its data (a policy's frozen items) becomes the batch's own;
    a writeable one, a view or another dtype is copied (the caller's stays as it was). The batches
    are the same either way."""
    from kvsched.instances.model import Instance, Limits, Request, TimeModel
    from kvsched.schedule.validate import instance_cost_model

    inst = Instance(
        (Request("A", 0, 3, 5), Request("B", 0, 4, 20)), Limits(kv_capacity=100), TimeModel("unit")
    )
    state = EngineState(inst, instance_cost_model(inst))
    frozen_req, frozen_tok = np.array([0, 1]), np.array([3, 4])
    frozen_req.setflags(write=False)
    frozen_tok.setflags(write=False)
    shared = state.make_batch(0.0, frozen_req, frozen_tok)
    assert shared.requests is frozen_req and shared.tokens is frozen_tok
    writeable = np.array([0, 1])
    view = np.array([9, 0, 1])[1:]
    view.setflags(write=False)
    for req, tok in ((writeable, [3, 4]), (view, (3, 4)), (np.array([0, 1], dtype=np.int32), [3, 4])):
        copied = state.make_batch(0.0, req, tok)
        assert copied.requests is not req and not copied.requests.flags.writeable
        assert copied.requests.dtype == np.int64 and copied.tokens.dtype == np.int64
        assert np.array_equal(copied.requests, shared.requests)
        assert np.array_equal(copied.tokens, shared.tokens) and copied.duration == shared.duration
    assert writeable.flags.writeable  # the caller's array is left writeable
    assert state._quick_ok(shared)
    state.step(shared)


def _many(n: int = 100):
    """A state of ``n`` requests (prompt 2, output 3, all at t = 0) and its cost model: batches of more
    than SMALL items take the quick path's array tests."""
    from kvsched.instances.model import Instance, Limits, Request, TimeModel
    from kvsched.schedule.validate import instance_cost_model

    inst = Instance(
        tuple(Request(f"r{i}", 0, 2, 3) for i in range(n)), Limits(kv_capacity=10 * n), TimeModel("unit")
    )
    return EngineState(inst, instance_cost_model(inst))


def test_many_items_in_any_order_distinct_or_not_as_the_full_check_says():
    """Strictly increasing positions are distinct without the slot test; any other order, duplicates
    and a negative position (which a gather wraps) are still found."""
    state = _many()
    rising = np.arange(10, 90)
    cases = {
        "rising": (rising, True),
        "falling": (rising[::-1], True),
        "shuffled": (np.random.default_rng(0).permutation(rising), True),
        "repeat in order": (np.sort(np.append(rising, 50)), False),
        "repeat unordered": (np.append(rising, 50), False),
        "negative first": (np.append(-1, rising), False),
        "negative unordered": (np.append(rising, -1), False),
    }
    for name, (req, legal) in cases.items():
        assert state._valid_positions(req) == legal, name
        assert not state._valid_positions(np.append(req, state.n)), name  # past the end
        batch = state.make_batch(0.0, req, np.ones(req.size, dtype=np.int64))
        assert state._quick_ok(batch) == legal, name
        assert (state._full_check(batch) == []) == legal, name


def test_many_items_count_new_holders_as_the_array_test():
    """Decodes then a few chunks: only the chunks may hold no KV (counted on their list); chunks first
    or between decodes are counted on the array, with the same result."""
    state = _many()
    state.step(state.make_batch(0.0, np.arange(80), np.full(80, 2)))  # 80 prompts done: 80 decodes
    decodes = np.arange(80)
    for chunks in ([80, 81, 82], [83], []):
        for order in ("decodes first", "chunks first", "mixed"):
            req = np.concatenate((decodes, chunks)).astype(np.int64)
            if order == "chunks first":
                req = np.concatenate((chunks, decodes)).astype(np.int64)
            elif order == "mixed" and chunks:
                req = np.insert(decodes, 40, chunks).astype(np.int64)
            tok = np.where(req >= 80, 2, 1)
            batch = state.make_batch(state.clock, req, tok)
            legal = state._quick(batch)
            assert legal is not None and state._full_check(batch) == []
            assert legal.new_holders == int((state.kv[req] == 0).sum()) == len(chunks), (chunks, order)
            assert legal.decodes_first == (order == "decodes first" or not chunks)
