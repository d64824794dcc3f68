"""The processor-sharing LP (kvsched.csp.bounds.sharing_lp): below the optimum and below every legal schedule."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp.bounds.sharing_lp import (
    cheapest_tangents,
    done_lines,
    planned_intervals,
    sharing_lp_bound,
)
from kvsched.csp.objectives import OBJECTIVES
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.seconds_bound_checks import (
    LINEAR,
    STEPPED,
    TOL,
    congested,
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_done_lines_lie_above_the_smallest_first_count(sizes):
    """For every amount x, the most requests whose sizes sum to at most x is below every line."""
    sizes = np.array(sizes, dtype=np.float64)
    lines = done_lines(sizes, 4)
    ordered = np.sort(sizes)
    for x in np.linspace(0.0, sizes.sum() + 3.0, 57):
        count = int(np.searchsorted(np.cumsum(ordered), x, side="right"))
        assert all(count <= b + slope * x + 1e-9 for b, slope in lines)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=9), st.integers(0, 2**16))
def test_cheapest_tangents_lie_below_the_cheapest_sum(counts, seed):
    """For every op count x, the x cheapest ops cost at least every tangent (costs nondecreasing in S)."""
    counts = np.array(counts, dtype=np.float64)
    unit = np.sort(np.random.default_rng(seed).uniform(0.0, 2.0, counts.size))
    lines = cheapest_tangents(counts, unit, 3)
    ops = np.repeat(unit, counts.astype(int))
    cheapest = np.concatenate([[0.0], np.cumsum(ops)])
    for x, least in enumerate(cheapest):
        assert all(c0 + slope * x <= least + 1e-9 for c0, slope in lines)


def test_refuses_unit_time_and_returns_nothing_when_out_of_time():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    assert sharing_lp_bound(inst).bound is None
    inst = congested(12, LINEAR, 3)
    got = sharing_lp_bound(inst, Deadline(time.monotonic() - 2.0, 1.0))
    assert got.bound is None and got.status == "deadline while building" and got.rounds == 0


def test_cutting_planes_raise_the_bound_on_a_congested_instance():
    """Each round's LP is a relaxation, and the tangents added where the point violated V^2/R tighten it: the
    later rounds are strictly above the first (here 36.19 -> 36.41), and every round is below a policy's
    schedule."""
    inst = congested(12, STEPPED, 5)
    got = sharing_lp_bound(inst, step=1.0)
    values = [v for _, v in got.history]
    assert got.rounds >= 2 and values[-1] > values[0] * (1 + 1e-3)
    assert got.bound.value == pytest.approx(max(values) * (1 - 1e-9))
    above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    assert got.bound.value <= above + TOL * above


def test_the_grid_is_sized_from_the_time_left():
    assert planned_intervals(float("inf"), 6) == 226
    assert planned_intervals(0.01, 6) == 32 and planned_intervals(1e6, 6) == 600
    assert planned_intervals(20.0, 6) < planned_intervals(20.0, 2)
    # From a round timed on this machine: 64 intervals in 1 s, so three rounds of n cost 3 (n / 64)^1.5 s.
    scale = 1.0 / 64**1.5
    assert planned_intervals(24.0, 6, scale) == int((24.0 / (3 * scale)) ** (2 / 3))
    assert planned_intervals(24.0, 6, 1e6) == 32  # a very slow machine: the coarsest grid


def test_a_bounded_solve_times_a_coarse_round_first_and_keeps_its_value():
    # The calibration planned a grid three times too fine on a slower machine (the A100 1k row finished one
    # round of its 23 s); a round on a 64-interval grid is timed first, and its value is a bound too.
    inst = congested(12, STEPPED, 5)
    got = sharing_lp_bound(inst, Deadline.after(30.0))
    assert got.bound is not None and len(got.history) == got.rounds + 1
    assert got.bound.value >= got.history[0][1] * (1 - 1e-6)
    above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    assert got.bound.value <= above + TOL * above


def test_rounds_stop_once_the_value_stalls():
    from kvsched.csp.bounds.sharing_lp import stalled

    rising = [(float(k), 100.0 + 10 * k) for k in range(6)]
    assert not stalled(rising)
    flat = [*rising, (6.0, 150.02), (7.0, 149.9), (8.0, 150.05)]
    assert stalled(flat) and not stalled(flat[:-1])


def test_the_bound_counts_time_from_the_first_arrival():
    # Arrivals in Unix time (1.7e9 s) once made intervals of 3e7 s, which bound nothing.
    from dataclasses import replace

    from kvsched.csp.bounds.fluid_lp import fluid_lp_bound

    inst = congested(12, STEPPED, 5)
    late = replace(inst, requests=tuple(replace(r, arrival=r.arrival + 1.7e9) for r in inst.requests))
    for bound in (sharing_lp_bound, fluid_lp_bound):
        before, after = bound(inst, step=1.0), bound(late, step=1.0)
        assert after.bound is not None and before.bound is not None
        assert after.bound.value == pytest.approx(before.bound.value, rel=1e-6), bound.__name__
