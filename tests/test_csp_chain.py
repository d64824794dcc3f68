"""The chain Lagrangian: below every schedule, equal to its LP, the compiled and numpy pricings agree."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp.bounds import chain_lagrangian, portfolio
from kvsched.csp.bounds._chain_kernels import op_weight, op_weights
from kvsched.csp.bounds.chain import (
    ChainData,
    evaluate,
    evaluate_numpy,
    in_system,
    mean_busy_prices,
    warm_incumbent,
)
from kvsched.csp.bounds.chain_guide import ChainGuide
from kvsched.csp.bounds.chain_lp import chain_lp
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.strategies import SETTINGS, instances, legal_schedules

CHAIN_OBJECTIVES = ("total-latency", "sum-ttft")
TOL = 1e-9


def _lp_bound(inst: Instance, objective: str, horizon: int) -> float:
    """The best chain-Lagrangian bound over ``horizon``: the LP optimum, rounded as the bound is."""
    data = ChainData.from_instance(inst, objective)
    value, y, z = chain_lp(data, horizon)
    # The LP's duals reach its value: this is what any dual method is bounded by.
    assert evaluate(data, y, z).value == pytest.approx(value, abs=1e-6, rel=1e-7)
    return data.to_bound(value)


def _shaped(n: int, kv_share: float, *, budget: int | None = None, arrivals: bool = False) -> Instance:
    """``n`` ShareGPT-like requests (short), KV at ``kv_share`` of the summed peaks."""
    rng = np.random.default_rng(n)
    prompt = rng.integers(1, 12, n)
    output = rng.integers(1, 9, n)
    arrival = np.cumsum(rng.exponential(1.5, n)) if arrivals else np.zeros(n)
    reqs = tuple(
        Request(f"r{k}", float(np.floor(a)), int(i), int(o))
        for k, (a, i, o) in enumerate(zip(arrival, prompt, output, strict=True))
    )
    peaks = [r.peak_kv for r in reqs]
    kv = max(max(peaks), math.ceil(kv_share * sum(peaks)))
    return Instance(reqs, Limits(kv_capacity=kv, max_batch_tokens=budget), TimeModel("unit"), name="shaped")


# ------------------------------------------------------------------ validity
tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(tiny, st.sampled_from(CHAIN_OBJECTIVES))
def test_bound_below_the_brute_force_optimum(inst, objective):
    """With and without budgets and arrivals, evictions allowed: even the LP optimum is below."""
    opt = brute_force(inst, objective, allow_eviction=True)
    result = chain_lagrangian(inst, objective, max_iterations=20)
    assert result.bound.scope == Scope.ALL
    assert result.bound.value <= opt + TOL * max(1.0, opt)
    assert _lp_bound(inst, objective, 12) <= opt + TOL * max(1.0, opt)


@pytest.mark.parametrize("objective", CHAIN_OBJECTIVES)
def test_bound_below_the_optimum_with_budgets_and_eviction(objective):
    inst = Instance(
        (Request("a", 0, 3, 2), Request("b", 0, 2, 3), Request("c", 1, 1, 2)),
        Limits(kv_capacity=5, max_batch_tokens=3, max_prefill_tokens=2),
        TimeModel("unit"),
    )
    opt = brute_force(inst, objective, allow_eviction=True)
    assert _lp_bound(inst, objective, 16) <= opt + TOL
    assert chain_lagrangian(inst, objective).bound.value <= opt + TOL


@settings(SETTINGS, max_examples=30)
@given(legal_schedules(instances(max_requests=6, cost="unit")))
def test_bound_below_every_legal_schedule(built):
    """Random legal schedules: chunks, pauses, evictions, idle slots, real-valued arrivals."""
    trace = replay(built.instance, built.schedule)
    for objective in CHAIN_OBJECTIVES:
        value = OBJECTIVES[objective](trace)
        bound = chain_lagrangian(built.instance, objective, max_iterations=15).bound.value
        assert bound <= value + TOL * max(1.0, value)


@pytest.mark.parametrize("budget", [None, 16])
@pytest.mark.parametrize("objective", CHAIN_OBJECTIVES)
def test_the_bound_counts_slots_from_the_first_arrival(objective, budget):
    # Slots used to be indexed from 0: arrivals at 1e7 slots made arrays of 1e7 slots (822 MB, and the
    # bound fell back to the KV area within a 4 s limit). Both objectives are sums of times less
    # arrivals: a shift by whole slots changes nothing, and the arrays span the schedule only.
    inst = _shaped(12, 0.3, budget=budget, arrivals=True)
    moved = replace(inst, requests=tuple(replace(r, arrival=r.arrival + 1e7) for r in inst.requests))
    here, there = (chain_lagrangian(i, objective, max_iterations=30) for i in (inst, moved))
    assert there.data.origin == 1e7 and here.data.origin == 0
    assert there.y.size == here.y.size < 1000
    assert there.bound.value == here.bound.value > 0
    # What reads a trace's times against the relaxation's slots reads them from the same origin.
    traces = warm_incumbent(inst), warm_incumbent(moved)
    assert np.array_equal(in_system(here.data, traces[0], 50), in_system(there.data, traces[1], 50))
    if objective == "total-latency":
        guides = ChainGuide.from_lagrangian(here), ChainGuide.from_lagrangian(there)
        assert np.allclose(guides[0](traces[0]), guides[1](traces[1]))


def test_refuses_what_it_does_not_bound():
    inst = _shaped(3, 0.5)
    with pytest.raises(InputError, match="makespan"):
        chain_lagrangian(inst, "makespan")
    with pytest.raises(InputError, match="unit time"):
        chain_lagrangian(replace(inst, time_model=TimeModel("infermax-linear")))


def test_an_expired_deadline_still_returns_a_valid_bound():
    """Only the one cheap pricing at y = 0 runs: each request alone (its isolated service)."""
    inst = _shaped(6, 0.3)
    result = chain_lagrangian(inst, deadline=Deadline(end=0.0, limit=1.0))
    assert result.iterations == 1
    data = ChainData.from_instance(inst)
    assert result.bound.value == float(np.sum(data.earliest + data.output - data.arrival))


# ------------------------------------------------------------------ tightness
@pytest.mark.parametrize(
    ("n", "share", "budget", "arrivals", "objective"),
    [
        (10, 0.3, None, False, "total-latency"),
        (12, 0.2, None, True, "total-latency"),
        (8, 0.3, 6, False, "total-latency"),
        (8, 0.3, 4, True, "total-latency"),  # prompts of up to 11 tokens: up to two prompt batches
        (10, 0.3, None, True, "sum-ttft"),
    ],
)
def test_lagrangian_reaches_the_lp_value(n, share, budget, arrivals, objective):
    inst = _shaped(n, share, budget=budget, arrivals=arrivals)
    result = chain_lagrangian(inst, objective)
    data = ChainData.from_instance(inst, objective)
    lp, _, _ = chain_lp(data, len(result.y))
    assert result.value <= lp + 1e-6
    assert result.value >= lp - 0.005 * abs(lp)


# ------------------------------------------------------------------ the two pricings
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(instances(max_requests=5, cost="unit"), st.integers(0, 2**31), st.sampled_from(CHAIN_OBJECTIVES))
def test_numba_and_numpy_pricings_agree(inst, seed, objective):
    data = ChainData.from_instance(inst, objective)
    rng = np.random.default_rng(seed)
    horizon = int(rng.integers(1, 30))
    y = rng.exponential(0.3, horizon) * (rng.random(horizon) < 0.7)
    z = rng.exponential(0.3, horizon) * (rng.random(horizon) < 0.5)
    pricing = evaluate(data, y, z)
    assert pricing.value == pytest.approx(evaluate_numpy(data, y, z), abs=1e-9)
    # The chains it returns cost what it says, and are chains: increasing slots from the earliest.
    for j in range(data.n):
        slots = pricing.chains[data.offset[j] : data.offset[j] + data.output[j]]
        assert slots[0] >= data.earliest[j]
        if objective == "total-latency":
            assert np.all(np.diff(slots) > 0)
    # Re-pricing from last call's chains narrows the band only: same value.
    again = evaluate(data, y, z, prev=pricing.chains)
    assert again.value == pytest.approx(pricing.value, abs=1e-9)


@pytest.mark.parametrize("objective", CHAIN_OBJECTIVES)
def test_prompt_batches_before_the_first_token_hold_kv(objective):
    """I = 10 under q = 4 takes three batches; the two before the first token's hold >= 10 - 2*4 = 2 and
    >= 10 - 4 = 6 tokens. At y = 1 in every slot (40 of them: a chain past them costs more) the chain costs 2 + 6 + 10 (KV) + 2 + 1 (first token in
    slot 2) + 11 (the second token's KV) for total latency."""
    inst = Instance(
        (Request("a", 0.0, 10, 2),), Limits(kv_capacity=20, max_batch_tokens=4), TimeModel("unit")
    )
    data = replace(ChainData.from_instance(inst, objective), growth=0)  # ghosts apart (below)
    assert data.chunk == 4
    assert list(data.pre_offset) == [0, 2]
    pricing = evaluate(data, np.ones(40), np.zeros(40))
    kv = 2 + 6 + 10 + (11 if objective == "total-latency" else 0)
    assert pricing.price[0] == pytest.approx(kv + (4 if objective == "total-latency" else 3))
    assert evaluate_numpy(data, np.ones(40), np.zeros(40)) == pytest.approx(pricing.value)
    assert pricing.load[:3] == pytest.approx([2, 6, 10])


@pytest.mark.parametrize("objective", CHAIN_OBJECTIVES)
def test_prompt_batches_price_the_chain_lp_at_its_duals(objective):
    """The LP lets prompt batches sit anywhere before the first op and charges the KV held in the gaps;
    the kernel puts them just before it. At the LP's duals both give the LP's value."""
    inst = _shaped(8, 0.3, budget=4, arrivals=True)
    data = ChainData.from_instance(inst, objective)
    assert data.pre_offset[-1] > 0
    value, y, z = chain_lp(data, 60)
    assert evaluate(data, y, z).value == pytest.approx(value, abs=1e-6, rel=1e-7)
    assert evaluate_numpy(data, y, z) == pytest.approx(value, abs=1e-6, rel=1e-7)


def test_prompt_batches_hold_their_kv_until_the_first_token():
    """Nothing is evicted in the prompt's last pass, so a gap between its batches holds what they left.
    I = 10, O = 1, q = 4; slot 1 is dear (y = 50, else 1). Batches at 0 and 2 and the token at 3 would cost
    2 + 6 + 10 + 4 without the hold, but the first batch's 2 tokens are held through slot 1 (+100): the
    cheapest chain waits instead (batches at 2 and 3, the token at 4: 2 + 6 + 10 + 5 = 23). The numpy
    reference allows gaps (and prices them); the kernel places the batches just before the first op."""
    inst = Instance(
        (Request("a", 0.0, 10, 1),), Limits(kv_capacity=20, max_batch_tokens=4), TimeModel("unit")
    )
    data = replace(ChainData.from_instance(inst), growth=0)  # ghosts apart (below)
    y = np.ones(40)
    y[1] = 50.0
    pricing = evaluate(data, y, np.zeros(40))
    assert pricing.price[0] == pytest.approx(23.0)
    assert pricing.chains[0] == 4
    assert pricing.load[:5] == pytest.approx([0, 0, 2, 6, 10])
    assert evaluate_numpy(data, y, np.zeros(40)) == pytest.approx(pricing.value)
    # Cheap, the slot takes the second batch: 2 + 0.5 x 6 + 10 + 3.
    y[1] = 0.5
    cheap = evaluate(data, y, np.zeros(40))
    assert cheap.price[0] == pytest.approx(18.0)
    assert cheap.load[:4] == pytest.approx([2, 6, 10, 0])
    assert evaluate_numpy(data, y, np.zeros(40)) == pytest.approx(cheap.value)


@pytest.mark.parametrize(
    ("prompt", "y", "price", "load"),
    [
        # I = 3, q = 2: a prompt batch (1 token) then op 1 (3) and op 2 (4). Slot 2 is dear for op 2: the
        # gap there is a refill, whose one batch holds 4 - 2 = 2 tokens (holding op 1's 3 costs more).
        (3, [0, 0, 5, 0], 0 + 0 + 2 * 5 + 0 + 4, [1, 3, 2, 4]),
        # I = 5: two prompt batches (1, 3), op 1 (5), op 2 (6). A one-slot gap cannot fit the refill's two
        # batches, so it holds op 1's 5 tokens.
        (5, [0, 0, 0, 5, 0], 0 + 0 + 0 + 5 * 5 + 0 + 5, [1, 3, 5, 5, 6]),
    ],
)
def test_a_gap_between_ops_is_held_or_refilled_under_a_chunk_cap(prompt, y, price, load):
    """Under q = 2 a gap before op 2 holds op 1's KV or is an eviction with a refill just before op 2;
    the slots after those listed cost 9, so no chain gains by moving later."""
    inst = Instance(
        (Request("a", 0.0, prompt, 2),), Limits(kv_capacity=20, max_batch_tokens=2), TimeModel("unit")
    )
    data = replace(ChainData.from_instance(inst), growth=0)  # ghosts apart (below)
    prices = np.full(40, 9.0)
    prices[: len(y)] = y
    pricing = evaluate(data, prices, np.zeros(40))
    assert pricing.price[0] == pytest.approx(price)
    assert pricing.load[: len(load)] == pytest.approx(load)
    assert evaluate_numpy(data, prices, np.zeros(40)) == pytest.approx(pricing.value)


def test_op_weights_are_op_weight_for_each_op():
    """The numpy callers' array (the chain MILP and column-generation benchmarks) is the kernels' weight."""
    for prompt, output, block in [(1, 1, 1), (5, 4, 1), (7, 9, 4), (16, 3, 16)]:
        expected = [op_weight(prompt, u, block) for u in range(1, output + 1)]
        assert op_weights(prompt, output, block).tolist() == expected


def test_a_completion_leaves_a_ghost():
    """I = 5, O = 1 under C = 2: two prompt batches (1 and 3 tokens) and the first token's batch (5) in
    slots 0-2. The KV grows by at most 2 a slot, so the 5 tokens freed after slot 2 stay free by at least
    3 in slot 3 and 1 in slot 4: at y = 1 the chain costs 1 + 3 + 5 + 3 + 1 plus its latency 3."""
    inst = Instance((Request("a", 0.0, 5, 1),), Limits(kv_capacity=20, max_batch_tokens=2), TimeModel("unit"))
    data = ChainData.from_instance(inst)
    assert data.growth == 2
    pricing = evaluate(data, np.ones(40), np.zeros(40))
    assert pricing.price[0] == pytest.approx(16.0)
    assert pricing.load[:6] == pytest.approx([1, 3, 5, 3, 1, 0])
    assert evaluate_numpy(data, np.ones(40), np.zeros(40)) == pytest.approx(pricing.value)
    # No ghost without a budget, nor under the first-token objective (no last op to follow).
    assert ChainData.from_instance(replace(inst, limits=Limits(kv_capacity=20))).growth == 0
    assert ChainData.from_instance(inst, "sum-ttft").growth == 0


def test_ghosts_reach_the_optimum_where_the_lp_without_them_does_not():
    """Three requests under C = 2, M = 7: the chain LP without ghosts proves 15, the optimum is 16, and
    the ghosts prove it (rounded up to whole slots)."""
    inst = Instance(
        (Request("a", 2.0, 6, 2), Request("b", 0.0, 5, 2), Request("c", 2.0, 3, 2)),
        Limits(kv_capacity=7, max_batch_tokens=2),
        TimeModel("unit"),
    )
    data = ChainData.from_instance(inst)
    opt = brute_force(inst, "total-latency", allow_eviction=True)
    assert opt == pytest.approx(16.0)
    without, _, _ = chain_lp(replace(data, growth=0), 14)
    assert data.to_bound(without) == pytest.approx(15.0)
    assert _lp_bound(inst, "total-latency", 14) == pytest.approx(16.0)
    # The slot ascent (what a time-limited solve of a small instance runs) reaches it too.
    assert chain_lagrangian(inst, spans=()).bound.value == pytest.approx(16.0)


def test_warm_start_counts_requests_in_the_system():
    inst = _shaped(5, 0.5)
    trace = warm_incumbent(inst)
    data = ChainData.from_instance(inst)
    count = in_system(data, trace, 40)
    assert count[0] == 5
    assert count[int(np.ceil(trace.state.completion.max()))] == 0


def test_mean_busy_prices_are_the_divisible_machines_dual():
    # M = 10 KV tokens a slot; areas 1*4 = 4 (a) and 2*6 + 1 = 13 (b) at 0, 3*2 + 3 = 9 (c) at 3. Smallest
    # area first: a on [0, 0.4), b on [0.4, 1.7), idle, c on [3, 3.9). Backwards: y = (3.9 - t) / 9 on c,
    # (1.7 - t) / 13 on b (the machine idles after it), 0.1 + (0.4 - t) / 4 on a; read at slot midpoints.
    reqs = (Request("a", 0.0, 4, 1), Request("b", 0.0, 6, 2), Request("c", 3.0, 2, 3))
    inst = Instance(reqs, Limits(kv_capacity=10), TimeModel("unit"))
    y = mean_busy_prices(ChainData.from_instance(inst), 6)
    assert y == pytest.approx([1.2 / 13, 0.2 / 13, 0.0, 0.4 / 9, 0.0, 0.0], abs=1e-12)


def test_mean_busy_prices_start_the_chain_bound_above_mean_busy_time():
    """At memory load about 1 the chain Lagrangian at these prices already beats the mean-busy-time bound
    (its relaxation contains that LP), where each request alone (y = 0) is far below it."""
    inst = _shaped(60, 0.15, arrivals=True)
    data = ChainData.from_instance(inst)
    y = mean_busy_prices(data, 400)
    mbt = max(b.value for b in portfolio(inst, "total-latency") if b.source.startswith("mean-busy"))
    assert data.to_bound(evaluate(data, y).value) >= mbt - 1.0
