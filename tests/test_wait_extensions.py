"""Seed 002 §7: the segment design (§7.2) and time-varying arrival rates (§7.1, §8.1).

Every simulated schedule is replayed through the semantic core. The segment
design is checked against a hand-computed Eq. (17) and the paper's equal-count
segments; the adaptive policies against a trace whose arrival rate doubles.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from kvsched.errors import InputError
from kvsched.heuristics import simulate
from kvsched.heuristics.fluid import eq1_cost_model, fluid_equilibrium, from_paper
from kvsched.heuristics.registry import POLICIES, make_policy
from kvsched.heuristics.wait import (
    AdaptiveNestedWAIT,
    AdaptiveWAIT,
    NestedWAIT,
    boundary_theta,
    design_segments,
    segment_groups,
)
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay

D0, D1 = 5e-3, 1e-6
TYPES = (from_paper(10, 10), from_paper(10, 20))  # §6.2's low-demand types: (I, O) = (10, 11), (10, 21)
RATE = 1000.0  # total arrivals per second before the change, 2 * RATE after


@cache
def doubling(n: int = 600, capacity: int = 137_000, seed: int = 0) -> Instance:
    """``n`` Poisson arrivals at RATE, then ``2 n`` at 2 RATE (two Poisson segments end to end)."""
    rng = np.random.default_rng(seed)
    gaps = np.concatenate([rng.exponential(1 / RATE, n), rng.exponential(1 / (2 * RATE), 2 * n)])
    arrivals = np.round(np.cumsum(gaps), 6)
    kinds = rng.integers(0, 2, arrivals.size)
    reqs = tuple(
        Request(f"r{k}", float(a), *TYPES[j]) for k, (a, j) in enumerate(zip(arrivals, kinds, strict=True))
    )
    return Instance(reqs, Limits(kv_capacity=capacity), eq1_cost_model(D0, D1), name="rate doubles")


def run(inst: Instance, policy) -> None:
    result = simulate(inst, policy)
    assert replay(inst, result.schedule, strict=True).state.all_done


def change_time(inst: Instance, n: int = 600) -> float:
    return sorted(r.arrival for r in inst.requests)[n]


# ============================================================================ §7.2 segment design


def test_segments_are_consecutive_and_equal_count_as_in_the_paper() -> None:
    groups = segment_groups(6, 3)  # types 1..2, 3..4, 5..6
    assert [g.tolist() for g in groups] == [[0, 1], [2, 3], [4, 5]]
    # §6 / §7.2: 500 unit-spaced lengths in 10 segments are the bins [1-50], [51-100], ...
    lengths = np.arange(1, 501)
    assert [int(lengths[g[-1]]) for g in segment_groups(500, 10)] == list(range(50, 501, 50))
    with pytest.raises(ValueError):
        segment_groups(3, 4)


def test_design_segments_minimises_eq17_on_a_hand_case() -> None:
    # Lengths 1 and 10, rates 3 and 1, prompt 1, d0 = 1, d1 = 0: Delta T* = 1.
    # L = 1: n_1 = 4 over stages 0..9 (KV 1..10): Term 1 = 4 * 55 = 220, no boundary.
    # L = 2 (eps = 0.05): n = (4, ceil(1.05) = 2); Term 1 = 4 * 1 + 2 * (2 + ... + 10) = 112;
    #   the boundary holds KV 1 + 1 - 1 = 1: Term 2 = 2, Term 3 = ln(2 * 10^4 / 0.1) / theta.
    choice = design_segments([1, 10], [3.0, 1.0], 1, 1.0, 0.0)
    theta = boundary_theta(4, 2, 0.25)
    assert choice.memory[0].tolist() == [220.0, 0.0, 0.0]
    assert choice.memory[1].tolist() == pytest.approx([112.0, 2.0, math.log(2 * 10_000 / 0.1) / theta])
    assert choice.count == 2 and choice.ends.tolist() == [1, 10] and choice.rates.tolist() == [3.0, 1.0]
    # Near-equal lengths: one segment is cheaper (the boundary queue costs more than it saves).
    assert design_segments([99, 100], [1.0, 1.0], 20, D0, D1).count == 1


def test_design_segments_is_u_shaped_on_many_types_and_none_in_overload() -> None:
    lengths = np.arange(1, 201)
    rates = 500.0 / lengths  # many short outputs, a long tail
    choice = design_segments(lengths, rates / rates.sum() * 500, 62, 0.05, 1e-8, max_segments=30)
    total = choice.total
    finite = np.flatnonzero(np.isfinite(total)) + 1  # some L break Eq. (16) (rounded thresholds)
    assert 1 < choice.count < finite.max()
    assert total[choice.count - 1] < min(total[0], total[finite.max() - 1])
    assert total[choice.count - 1] == total[np.isfinite(total)].min()
    assert design_segments([10, 20], [1e6, 1e6], 10, D0, D1) is None  # unstable fluid: no (16)


def test_nested_wait_auto_segments_runs_with_the_designed_segments() -> None:
    inst = doubling()
    pol = make_policy("nested-wait", segments="auto")
    run(inst, pol)
    assert pol.segment_choice_ is not None
    assert pol.design_.ends.tolist() == pol.segment_choice_.ends.tolist() == [11, 21]
    assert NestedWAIT(segments="3").segments == 3  # from the command line
    with pytest.raises(InputError):
        make_policy("nested-wait", segments=0)


# ============================================================================ §7.1 time-varying rates


def _before_after(history: list[tuple[float, tuple[int, ...]]], t: float) -> tuple[float, float]:
    """Median threshold sum of the changes before ``t`` and over the second half of the run after it."""
    before = [sum(n) for s, n in history[1:] if s < t]
    after = [sum(n) for s, n in history if t + 0.5 < s < 2 * t]
    return float(np.median(before)), float(np.median(after))


def test_wait_adaptive_thresholds_follow_a_rate_doubling() -> None:
    inst = doubling()
    pol = AdaptiveWAIT()
    run(inst, pol)
    before, after = _before_after(pol.threshold_history_, change_time(inst))
    eq = [
        fluid_equilibrium([r / 2, r / 2], [10, 10], [11, 21], D0, D1).per_stage.sum()
        for r in (RATE, 2 * RATE)
    ]
    assert after > 2 * before  # per-stage thresholds scale with lambda * Delta T*, which more than doubles
    assert before == pytest.approx(eq[0], rel=0.5) and after == pytest.approx(eq[1], rel=0.5)


def test_wait_adaptive_follows_a_known_schedule_exactly() -> None:
    inst = doubling()
    t = change_time(inst)
    pol = make_policy("wait-adaptive", schedule=[(0.0, (RATE / 2, RATE / 2)), (t, (RATE, RATE))])
    run(inst, pol)
    # Fluid thresholds: ceil(lambda_j Delta T*) = ceil(3.53) = 4 at 1000/s, ceil(12.05) = 13 at 2000/s.
    changes = pol.threshold_history_[1:]
    assert changes[0][1] == (4, 4) and changes[0][0] < t
    assert changes[1][1] == (13, 13) and changes[1][0] >= t


def test_nested_wait_adaptive_thresholds_rise_with_the_total_rate() -> None:
    inst = doubling(capacity=20_000)
    pol = AdaptiveNestedWAIT()
    run(inst, pol)
    before, after = _before_after(pol.threshold_history_, change_time(inst))
    assert after > 1.5 * before
    assert max(sum(n) for _, n in pol.threshold_history_) > sum(pol.threshold_history_[0][1])


def test_adaptive_policies_are_registered_and_reject_bad_parameters() -> None:
    for name in ("wait-adaptive", "nested-wait-adaptive"):
        assert POLICIES[name].source.startswith("seed 002 §7.1")
        with pytest.raises(InputError):
            make_policy(name, window=0)
        with pytest.raises(InputError):
            make_policy(name, given=(1, 1))
    with pytest.raises(InputError, match="rate schedule"):
        run(doubling(), make_policy("wait-adaptive", schedule=[(0.0, (1.0, 2.0, 3.0))]))


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("wait-adaptive", {"window": float("inf")}, "window must be a positive integer; got inf"),
        ("nested-wait-adaptive", {"min_arrivals": 2.5}, "min_arrivals must be a positive integer"),
        ("nested-wait", {"segments": float("inf")}, "segments must be a positive integer"),
        ("nested-wait", {"horizon": 0}, "horizon must be a positive integer; got 0"),
        ("nested-wait", {"buffer": "no"}, "buffer must be true or false; got 'no'"),
        ("wait-adaptive", {"tolerance": float("nan")}, "tolerance must be a finite number >= 0"),
        ("wait-adaptive", {"schedule": 0}, "schedule must be a list of"),
    ],
)
def test_wait_options_are_checked_where_given(name, params, message):
    # inf raised OverflowError in int() (an internal error on the command line), "no" turned the buffer
    # on, NaN and 0 passed without a word.
    with pytest.raises(InputError, match=message):
        make_policy(name, **params)


@pytest.mark.parametrize(("name", "params"), [("wait", {"margin": 1e308}), ("nested-wait", {"eps": 1e308})])
def test_thresholds_beyond_any_count_are_one_error_not_a_stall(name, params):
    # 1e308 made the thresholds inf, cast to int64 garbage: the run "stalled" naming no parameter.
    shape = [(0, 5, 3), (0, 3, 4), (1, 8, 2), (2.5, 2, 5), (3, 4, 1)]  # arrivals over time: rates to plan for
    reqs = tuple(Request(f"r{k}", float(a), i, o) for k, (a, i, o) in enumerate(shape))
    inst = Instance(reqs, Limits(kv_capacity=16), TimeModel("unit"))
    with pytest.raises(InputError, match="margin, eps, d0 or d1 is far too large"):
        simulate(inst, make_policy(name, **params))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("slai", {"offset": float("inf")}),
        ("slai", {"offset_low": True}),
        ("slai", {"default_tbt": float("inf")}),
        ("alpha-greedy", {"loop_limit": True}),
        ("infermax-sec6", {"quantile": True}),
        ("infermax-sec6", {"warmup": True}),
    ],
)
def test_other_policies_refuse_infinite_and_boolean_numbers(name, params):
    with pytest.raises(InputError, match=f"{next(iter(params))} must be"):
        make_policy(name, **params)
