"""Block-constant multipliers for the chain Lagrangian: the same prices, so the same valid bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp.bounds import _block_kernels, chain_lagrangian
from kvsched.csp.bounds import chain as chain_module
from kvsched.csp.bounds.chain import ChainData, evaluate
from kvsched.csp.bounds.chain_blocks import METHODS, block_spans, evaluate_blocks, finer_start
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.instances.io import load_instance
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.strategies import SETTINGS, instances, legal_schedules
from tests.test_examples import EXAMPLES

CHAIN_OBJECTIVES = ("total-latency", "sum-ttft")
TOL = 1e-9


def _random_blocks(rng: np.random.Generator, blocks: int, budget: bool) -> tuple[np.ndarray, np.ndarray]:
    y = rng.exponential(0.3, blocks) * (rng.random(blocks) < 0.7)
    z = rng.exponential(0.3, blocks) * (rng.random(blocks) < 0.5) if budget else np.zeros(0)
    return y, z


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    instances(max_requests=5, cost="unit"),
    st.integers(0, 2**31),
    st.integers(1, 5),
    st.sampled_from(CHAIN_OBJECTIVES),
)
def test_block_pricing_is_the_slot_pricing_at_block_constant_multipliers(inst, seed, span, objective):
    """Compiled block programme = plain-Python reference <= slot programme at the expanded multipliers.

    Equal without a chunk cap; under one the block programme prices a first op's prompt batches apart
    from its ops (a lower bound, the same at span 1) and leaves the gaps between ops free (a lower bound).
    """
    data = ChainData.from_instance(inst, objective)
    rng = np.random.default_rng(seed)
    y, z = _random_blocks(rng, int(rng.integers(1, 10)), data.budget is not None)
    value, chains, pslot, load, tokens = evaluate_blocks(data, span, y, z)
    slots = evaluate(data, np.repeat(y, span), np.repeat(z, span) if z.size else None).value
    if data.chunk == 0:
        assert value == pytest.approx(slots, abs=1e-9)
    assert value <= slots + 1e-9
    reference = _block_kernels.price_blocks_python(
        data.release, data.earliest, data.output, data.prompt, data.arrival, data.block, span, y,
        z if data.budget is not None else np.zeros(0), data.objective, data.chunk, data.growth,
    )  # fmt: skip
    assert value == pytest.approx(reference.sum() - data.capacity * span * y.sum() - (
        data.budget * span * z.sum() if z.size else 0.0), abs=1e-9)  # fmt: skip
    # The chains are chains (increasing slots from the earliest), their loads are summed per block,
    # and re-pricing from them narrows the bands only.
    for j in range(data.n):
        own = chains[data.offset[j] : data.offset[j] + data.output[j]]
        assert own[0] >= data.earliest[j]
        if objective == "total-latency":
            assert np.all(np.diff(own) > 0)
            assert data.release[j] <= pslot[j] <= own[0]
    assert load.size == y.size
    assert tokens.size == (y.size if z.size else 0)
    again = evaluate_blocks(data, span, y, z, prev=chains)
    assert again[0] == pytest.approx(value, abs=1e-9)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(max_requests=4, cost="unit"), st.integers(0, 2**31), st.sampled_from(CHAIN_OBJECTIVES))
def test_span_one_is_the_exact_pricing(inst, seed, objective):
    data = ChainData.from_instance(inst, objective)
    rng = np.random.default_rng(seed)
    y, z = _random_blocks(rng, int(rng.integers(1, 30)), data.budget is not None)
    blocks, slots = evaluate_blocks(data, 1, y, z)[0], evaluate(data, y, z).value
    if data.chunk == 0:  # under a cap the slot pricing also prices the gaps between ops
        assert blocks == pytest.approx(slots, abs=1e-9)
    assert blocks <= slots + 1e-9


tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(
    tiny,
    st.sampled_from(CHAIN_OBJECTIVES),
    st.sampled_from([(2,), (4, 2), (8, 4, 1)]),
    st.sampled_from(METHODS),
)
def test_block_bound_below_the_brute_force_optimum(inst, objective, spans, method):
    """With and without budgets and arrivals, evictions allowed; either block method."""
    opt = brute_force(inst, objective, allow_eviction=True)
    result = chain_lagrangian(inst, objective, max_iterations=40, spans=spans, block_method=method)
    assert result.bound.value <= opt + TOL * max(1.0, opt)


@settings(SETTINGS, max_examples=30)
@given(legal_schedules(instances(max_requests=6, cost="unit")), st.sampled_from([(2,), (4, 1), (16, 4)]))
def test_block_bound_below_every_legal_schedule(built, spans):
    """Random legal schedules: chunks, pauses, evictions, idle slots, real-valued arrivals."""
    trace = replay(built.instance, built.schedule)
    for objective in CHAIN_OBJECTIVES:
        value = OBJECTIVES[objective](trace)
        bound = chain_lagrangian(built.instance, objective, max_iterations=30, spans=spans).bound.value
        assert bound <= value + TOL * max(1.0, value)


def test_block_ladder():
    assert block_spans(100) == (2,)
    assert block_spans(17_000) == (512, 128, 32, 8)
    assert all(a % b == 0 for a, b in zip(block_spans(150_000), block_spans(150_000)[1:], strict=False))


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(max_requests=5, cost="unit"), st.integers(0, 2**31))
def test_finer_start_prices_levels_until_one_does_not_pay(inst, seed):
    """Each level is the block pricing of the shape's block means (a Lagrangian value, so a bound); the
    descent keeps the levels while each beats the one before and stops at the first that does not."""
    data = ChainData.from_instance(inst)
    spans = (8, 4, 2, 1)
    shape = np.random.default_rng(seed).exponential(0.5, 24)
    padded = np.zeros(24)
    padded[: shape.size] = shape
    values = [evaluate_blocks(data, s, padded.reshape(-1, s).mean(axis=1), None)[0] for s in spans]
    seen: list[float] = []
    got = finer_start(data, shape, spans, Deadline.never(), 0.0, on_value=seen.append)
    # The levels the descent priced: 1, 2, ... up to and including the first worth no more than the last kept.
    expected = 1
    while expected + 1 < len(spans) and values[expected + 1] > values[expected]:
        expected += 1
    assert got is not None and got.level == expected
    assert got.value == pytest.approx(values[expected], abs=TOL)
    assert seen == pytest.approx(values[1 : min(expected + 2, len(spans))], abs=TOL)
    assert got.y.size == 24 and np.allclose(
        got.y, np.repeat(padded.reshape(-1, spans[expected]).mean(1), spans[expected])
    )


@pytest.mark.parametrize("dear", [False, True])
def test_finer_start_takes_all_the_time_where_the_ascent_could_not_use_it(monkeypatch, dear):
    """Where fewer than ASCENT_PRICINGS coarse pricings fit in the time left, the block ascent cannot gain
    on a finer start, so the finer start may take all of it; otherwise half (FINER_SHARE)."""
    deadline = Deadline.after(120.0)
    shares: list[float] = []
    ray = chain_module.ray_search

    def priced(*args, **kwargs):
        start = ray(*args, **kwargs)
        return dataclasses.replace(start, cost=1e6 if dear else 0.0)

    def finer(data, shape, spans, share, cost, **kwargs):
        shares.append(share.remaining() / deadline.remaining())
        return None

    monkeypatch.setattr(chain_module, "ray_search", priced)
    monkeypatch.setattr(chain_module, "finer_start", finer)
    inst = load_instance(EXAMPLES / "tiny.json")
    lag = chain_lagrangian(inst, "total-latency", deadline=deadline, spans=(4, 2), max_iterations=10)
    assert lag.bound.value >= 0
    assert len(shares) == 1
    assert shares[0] == pytest.approx(1.0 if dear else chain_module.FINER_SHARE, abs=0.01)


@pytest.mark.parametrize("spans", [(2, 4), (4, 4), (6, 4), (0,)])
def test_spans_out_of_order_are_refused_by_name(spans):
    # Block lengths go coarse to fine, each dividing the previous; others used to fail deep in a reshape.
    with pytest.raises(InputError, match="spans"):
        chain_lagrangian(load_instance(EXAMPLES / "tiny.json"), "total-latency", spans=spans)


def test_an_unknown_block_method_is_refused_by_name():
    with pytest.raises(InputError, match="block_method"):
        chain_lagrangian(load_instance(EXAMPLES / "tiny.json"), "total-latency", block_method="newton")
