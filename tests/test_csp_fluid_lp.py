"""The batch-rate LP (kvsched.csp.bounds.fluid_lp): below the optimum and below every legal schedule."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from kvsched.csp.bounds.fluid_lp import fluid_lp_anytime, fluid_lp_bound
from kvsched.csp.bounds.seconds import op_costs
from kvsched.csp.bounds.separable import separable_forms
from kvsched.csp.objectives import OBJECTIVES
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.seconds_bound_checks import (
    LINEAR,
    MODELS,
    STEPPED,
    TOL,
    congested,
)


def test_refill_costs_are_the_least_over_the_chunk():
    """The generating op's least own term: no chunk size c of a refill is cheaper (brute force over c)."""
    for model in MODELS:
        for f in separable_forms(
            instance_cost_model(Instance((Request("a", 0, 1, 1),), Limits(kv_capacity=99), model)), 64
        ):
            s = np.arange(2, 40, dtype=np.float64)
            got = op_costs(f, s)
            for k, sv in enumerate(s):
                c = np.arange(1, sv + 1)
                chunk = (
                    (f.per_token + f.prefill_token) * c + f.prefill + f.prefill_quad * (c * c + 2 * (sv - c) * c)
                    + f.prefill_kv * (sv - c) + f.prefill_sq * c * c
                )  # fmt: skip
                decode = f.per_token + f.decode + f.decode_kv * (sv - 1)
                assert got[k] <= min(chunk.min(), decode) + 1e-12


def test_refuses_unit_time_and_returns_nothing_when_empty_handed():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    assert fluid_lp_bound(inst).bound is None
    inst = replace(inst, time_model=LINEAR)
    got = fluid_lp_bound(inst, Deadline(time.monotonic(), 1.0))
    assert got.bound is None or got.bound.value <= brute_force(inst, "total-latency") + TOL


def test_a_coarse_grid_is_not_run_and_the_anytime_rounds_are_valid():
    inst = congested(12, LINEAR, 3)
    assert fluid_lp_bound(inst, cells=1, coarsest=0.25).status == "grid too coarse"
    opt_above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    rounds = fluid_lp_anytime(inst, Deadline.after(5.0))
    assert rounds and all(r.bound is None or r.bound.value <= opt_above + TOL * opt_above for r in rounds)


def test_a_passed_deadline_stops_the_build():
    """The model build checks the deadline too: a spent one gives no bound and says why, and nothing is solved."""
    inst = congested(12, LINEAR, 3)
    got = fluid_lp_bound(inst, Deadline(time.monotonic() - 2.0, 1.0))
    assert got.bound is None and got.status == "deadline while building" and got.cells == 0


def test_a_stepped_fit_gets_the_flat_forms_machine_row_too(monkeypatch):
    """Each separable form's machine row holds for every schedule: the flat one (largest fixed part) joins
    the half-full batch's hull edge, which only tightens the LP, and the bound stays below the optimum."""
    from kvsched.costmodel.coeffile import resolve_cost_model
    from kvsched.csp.bounds import fluid_lp

    a100 = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))
    forms = separable_forms(instance_cost_model(Instance((Request("a", 0, 2, 2),), Limits(8), a100)), 512)
    first, flat = fluid_lp.machine_forms(forms, 512)
    assert first is fluid_lp.pick_form(forms, 512)
    assert flat.fixed > first.fixed and flat.per_token < first.per_token
    linear = separable_forms(instance_cost_model(Instance((Request("a", 0, 2, 2),), Limits(8), LINEAR)), 8)
    assert len(fluid_lp.machine_forms(linear, 8)) == 1
    inst = congested(10, STEPPED, 5)
    both = fluid_lp_bound(inst, step=1.0, window=50.0).bound.value
    monkeypatch.setattr(fluid_lp, "machine_forms", lambda forms, tau: [fluid_lp.pick_form(forms, tau)])
    one = fluid_lp_bound(inst, step=1.0, window=50.0).bound.value
    assert both >= one * (1 - 1e-6)
    above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    assert both <= above + TOL * above
