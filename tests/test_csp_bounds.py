"""Every bound of the portfolio holds for every legal schedule: chunked, evicting, idling, under budgets.

Checked three ways: against the brute-force optimum (Dijkstra over engine states, tests/brute.py) on
tiny instances, against random legal schedules built through the semantic core, and against the
validated schedules of every registered policy. Plus the by-hand values each argument gives.
"""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.costmodel import BatchView, make_cost_model
from kvsched.csp import SolverOptions, solve
from kvsched.csp.bounds import best, lower_bounds, mbt, portfolio, seconds_report, separable_forms
from kvsched.csp.bounds.mbt import preemptive_mean_busy
from kvsched.csp.bounds.separable import minorant_lines
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.generators import Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.conventions import mcsf_instance
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline, DeadlineReached
from tests.brute import brute_force
from tests.strategies import build_legal_schedule, instances, legal_schedules

#: A stepped token term with a negative step (like the shipped A100 set's step160), a hinge and a staircase,
#: in the unit-scale times the strategies' unit instances use (arrivals 0..5).
STEPPED = TimeModel(
    "calibrated", {"a0": 0.6, "a1": 0.05, "step2": 0.5, "step3": -0.4, "b1": 0.02, "p1": 0.01}
)
HINGE = TimeModel("hinge", {"c": 1.0, "a": 0.3, "b0": 2.0})
STAIRCASE = TimeModel("staircase", {"c": 0.5, "a": 1.0, "b0": 3.0})
LINEAR = TimeModel("infermax-linear", {"a0": 0.5, "a1": 0.1, "b0": 0.2, "b1": 0.05, "p0": 0.3, "p1": 0.02})
SECONDS_MODELS = (STEPPED, HINGE, STAIRCASE, LINEAR)
#: Models whose coefficients are seconds (arrivals in the strategies' infermax-linear scale).
REAL_MODELS = (
    TimeModel("infermax-linear"),
    TimeModel("roofline"),
    TimeModel("rad"),
    TimeModel(
        "calibrated",
        {
            "a0": 0.009,
            "a1": 1.26e-05,
            "b0": 4.4e-4,
            "b1": 2.7e-07,
            "b2": 3.2e-05,
            "p0": 1.2e-3,
            "p1": 1.6e-09,
            "p2": 3.5e-07,
            "p4": 3.9e-09,
            "step4": 1.5e-3,
            "step6": -1.9e-3,
            "step8": 1.3e-3,
            "hinge12": 4e-5,
        },
    ),
)
TOL = 1e-9


def _check_all(instance: Instance, trace_value) -> None:
    for name in OBJECTIVES:
        for bound in portfolio(instance, name):
            assert bound.scope == Scope.ALL
            assert bound.value <= trace_value(name) + TOL * max(1.0, abs(trace_value(name))), (name, bound)


# ----------------------------------------------------------------------- random legal schedules
@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(legal_schedules(instances(cost="unit")))
def test_unit_bounds_hold_for_random_legal_schedules(built):
    trace = replay(built.instance, built.schedule)
    bounds = lower_bounds(built.instance)
    for name, measure in OBJECTIVES.items():
        assert bounds.for_objective(name) <= measure(trace) + 1e-9, name
    _check_all(built.instance, lambda name: OBJECTIVES[name](trace))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(instances(cost="unit"), st.sampled_from(SECONDS_MODELS), st.integers(0, 2**16))
def test_seconds_bounds_hold_for_random_legal_schedules(inst, model, seed):
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    trace = replay(inst, built.schedule)
    _check_all(inst, lambda name: OBJECTIVES[name](trace))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(instances(cost="infermax-linear"), st.sampled_from(REAL_MODELS), st.integers(0, 2**16))
def test_real_cost_model_bounds_hold_for_random_legal_schedules(inst, model, seed):
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    trace = replay(inst, built.schedule)
    _check_all(inst, lambda name: OBJECTIVES[name](trace))


# ----------------------------------------------------------------------- brute-force optimum
#: The same with phase fixed parts, which the per-phase form charges per token at the cheapest load.
STEPPED_FIXED = TimeModel(
    "calibrated",
    {"a0": 0.6, "a1": 0.05, "step2": 0.5, "step3": -0.4, "b0": 0.3, "b1": 0.02, "p0": 0.45, "p1": 0.01},
)
tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    tiny, st.sampled_from([TimeModel("unit"), LINEAR, HINGE, STEPPED]), st.sampled_from(sorted(OBJECTIVES))
)
def test_bounds_below_the_brute_force_optimum(inst, model, objective):
    inst = replace(inst, time_model=model)
    # The optimum over all schedules (evictions allowed) is the smaller one: every bound must be below it.
    opt = brute_force(inst, objective, allow_eviction=True)
    for bound in portfolio(inst, objective):
        assert bound.value <= opt + TOL * max(1.0, opt), bound


@pytest.mark.parametrize("evict", [True, False])
@pytest.mark.parametrize("model", [TimeModel("unit"), STAIRCASE, STEPPED, STEPPED_FIXED])
def test_bounds_below_the_brute_force_optimum_with_budgets(evict, model):
    inst = Instance(
        (Request("a", 0, 3, 2), Request("b", 0, 1, 2), Request("c", 1, 1, 2)),
        Limits(kv_capacity=4, max_batch_tokens=3, max_prefill_tokens=2),
        model,
    )
    for objective in OBJECTIVES:
        opt = brute_force(inst, objective, allow_eviction=evict)
        for bound in portfolio(inst, objective):
            assert bound.value <= opt + TOL * max(1.0, opt), (objective, bound)


def test_bounds_count_the_refill_route_when_eviction_pays():
    # Decodes reading KV are dear and refills cheap: the optimum evicts before every token (1.36 against
    # 11.92 without eviction). A bound that charged every token a decode would exceed it.
    model = TimeModel("infermax-linear", {"a0": 0.1, "a1": 0.01, "b0": 0.0, "b1": 1.0, "p0": 0.0, "p1": 0.0})
    inst = Instance((Request("a", 0, 2, 3), Request("b", 0, 1, 3)), Limits(kv_capacity=6), model)
    for objective in OBJECTIVES:
        opt = brute_force(inst, objective, allow_eviction=True)
        assert best(inst, objective).value <= opt + 1e-9
    assert brute_force(inst, "total-latency", allow_eviction=True) < 0.2 * brute_force(
        inst, "total-latency", allow_eviction=False
    )


# ----------------------------------------------------------------------- every policy
def _policy_instances() -> list[Instance]:
    lengths = {"prompt": Uniform(1, 10), "output": Uniform(1, 10)}
    base = synthetic(10, 3, Limits(kv_capacity=40), TimeModel("unit"), **lengths)
    tight = synthetic(
        10,
        4,
        Limits(kv_capacity=24, max_batch_tokens=16, max_prefill_tokens=16),
        TimeModel("unit"),
        **lengths,
    )
    return [base, tight, replace(tight, time_model=STEPPED), replace(base, time_model=LINEAR)]


@pytest.mark.parametrize("k", range(4))
def test_bounds_below_every_policy(k):
    inst = _policy_instances()[k]
    bounds = {name: best(inst, name).value for name in OBJECTIVES}
    for name in POLICIES:
        result = simulate(inst, make_policy(name))
        trace = replay(inst, result.schedule)
        for objective, bound in bounds.items():
            assert bound <= OBJECTIVES[objective](trace) + 1e-9, (name, objective)


# ----------------------------------------------------------------------- by hand
def test_bounds_by_hand():
    # Two requests at 0: (I=4, O=3) and (I=2, O=2), M = 8, C = 4 (so the 4-token prompt fits one batch).
    inst = Instance(
        (Request("a", 0, 4, 3), Request("b", 0, 2, 2)),
        Limits(kv_capacity=8, max_batch_tokens=4),
        TimeModel("unit"),
    )
    b = lower_bounds(inst)
    # alone: a needs 1 + 2 = 3 batches, b needs 1 + 1 = 2: isolated total 5.
    assert b.isolated == 5
    # areas: a = 4 + 5 + 6 = 15, b = 2 + 3 = 5; by area: ceil(5/8) = 1, ceil(20/8) = 3 -> sorted max(2,1)+max(3,3) = 5.
    assert b.total_latency == 5
    assert b.makespan_area == 3 and b.makespan_tokens == 3 and b.makespan == 3  # 9 tokens, C = 4
    assert b.sum_ttft == 2


def test_isolated_counts_one_prefill_batch_without_a_budget():
    # No budget: the prompt still takes a batch, so a request needs O batches (not O - 1).
    inst = Instance((Request("a", 0, 5, 3), Request("b", 2, 1, 1)), Limits(kv_capacity=64), TimeModel("unit"))
    b = lower_bounds(inst)
    assert b.isolated == 3 + 1 and b.sum_ttft == 2 and b.makespan == 3


def test_mean_busy_time_by_hand():
    # (I=1, O=2): w = 1, 2, A = 3; M = 3. Alone at 0: slot 0 carries 3 units: MB = 0, delta = (1*2 + 2*1)/3.
    inst = Instance((Request("a", 0, 1, 2),), Limits(kv_capacity=3), TimeModel("unit"))
    values = {b.source: b.value for b in portfolio(inst, "total-latency")}
    assert values["mean-busy-time"] == pytest.approx(4 / 3)
    assert values["isolated"] == 2  # the true optimum
    # Two equal jobs of A = 3 on M = 3: slots 0 and 1, MB = 0 and 1.
    inst2 = Instance((Request("a", 0, 1, 2), Request("b", 0, 1, 2)), Limits(kv_capacity=3), TimeModel("unit"))
    values = {b.source: b.value for b in portfolio(inst2, "total-latency")}
    assert values["mean-busy-time"] == pytest.approx(0 + 1 + 2 * 4 / 3)


def test_preemptive_mean_busy_with_release_dates():
    # Job 0 (work 4) at 0 is preempted at 1 by job 1 (work 1): job 0 runs [0,1] and [2,5].
    mean = preemptive_mean_busy(np.array([4.0, 1.0]), np.array([0.0, 1.0]), slotted=False)
    assert mean[1] == pytest.approx(1.5)
    assert mean[0] == pytest.approx((0.5 * 1 + 3.5 * 3) / 4)
    slotted = preemptive_mean_busy(np.array([4.0, 1.0]), np.array([0.0, 1.0]), slotted=True)
    assert slotted.tolist() == pytest.approx([(0 * 1 + 2 + 3 + 4) / 4, 1.0])


@pytest.mark.parametrize("slotted", [True, False])
def test_event_loop_agrees_with_the_closed_form_when_everything_arrives_at_once(slotted):
    rng = np.random.default_rng(1)
    work = rng.uniform(0.1, 3.0, 200)
    release = np.full(200, 2.0)
    closed = preemptive_mean_busy(work, release, slotted=slotted)
    g = mbt._slotted_scalar if slotted else mbt._continuous_scalar
    acc, done = mbt._preemptive(work, release, g, by_remaining=False)
    assert acc / work == pytest.approx(closed)
    assert np.sort(done) == pytest.approx(mbt.srpt_completions(work, release))


def test_event_loops_stop_at_the_deadline():
    work = np.ones(10_000)
    release = np.arange(10_000, dtype=float)
    with pytest.raises(DeadlineReached):
        preemptive_mean_busy(work, release, slotted=True, deadline=Deadline.after(1e-9))
    with pytest.raises(DeadlineReached):
        mbt.srpt_completions(work, release, Deadline.after(1e-9))


@pytest.mark.parametrize("block", [1, 3, 16])
def test_block_rounded_areas_match_a_per_token_sum(block):
    rng = np.random.default_rng(2)
    reqs = tuple(Request(f"r{k}", 0, int(rng.integers(1, 40)), int(rng.integers(1, 40))) for k in range(50))
    inst = Instance(reqs, Limits(kv_capacity=160, block_size=block), TimeModel("unit"))
    arrays = mbt.RequestArrays.of(inst)
    for k, r in enumerate(reqs):
        w = [block * -(-(r.prompt + u - 1) // block) for u in range(1, r.output + 1)]
        assert arrays.area[k] == sum(w)
        assert arrays.area_tail[k] == sum(x * (r.output - u) for u, x in enumerate(w))


def test_ten_thousand_sharegpt_mean_busy_time_is_reproduced():
    # shared/notes/005 Sec. 2 gives 2.8474e7 on `generate sharegpt --n 10000`; a scaled copy keeps the test fast:
    # the bound is the slotted smallest-area-first schedule plus delta, here checked against a brute sum.
    rng = np.random.default_rng(0)
    reqs = tuple(Request(f"r{k}", 0, int(rng.integers(1, 30)), int(rng.integers(1, 30))) for k in range(300))
    inst = Instance(reqs, Limits(kv_capacity=400), TimeModel("unit"))
    value = {b.source: b.value for b in portfolio(inst, "total-latency")}["mean-busy-time"]
    w = [np.arange(r.prompt, r.prompt + r.output, dtype=float) for r in reqs]
    area = np.array([x.sum() for x in w])
    delta = np.array([(x * np.arange(x.size, 0, -1)).sum() / x.sum() for x in w])
    total = 0.0
    filled = 0.0
    for k in np.argsort(area, kind="stable"):
        units = np.arange(filled, filled + area[k], 0.25) + 0.125  # midpoint rule on quarter units
        total += np.floor(units / 400).mean() + delta[k]
        filled += area[k]
    assert value == pytest.approx(total, rel=1e-3)


# ----------------------------------------------------------------------- separable forms
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.sampled_from([*SECONDS_MODELS, *REAL_MODELS, TimeModel("unit")]),
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 60), st.booleans()), min_size=1, max_size=8),
)
def test_separable_forms_are_below_the_batch_time(model, items):
    cost = make_cost_model(model.name, model.params)
    tokens = np.array([1 if dec else c for c, _, dec in items])
    context = np.array([m + (1 if dec else 0) for _, m, dec in items])
    decode = np.array([dec for *_, dec in items])
    view = BatchView(tokens, context, np.where(decode, 1, 0))
    for form in separable_forms(cost, tau_max=int(tokens.sum()) + 40):
        assert form.lower(tokens, context, decode) <= cost.batch_time(view) * (1 + 1e-12) + 1e-15


def test_per_type_form_charges_each_phase_at_its_cheapest_load():
    # The A100 Llama-2-7B set at C = 512: the token term per token is cheapest at 384 tokens (a 7 ms step
    # follows), so a phase's fixed part is charged over 384 tokens, not spread over 512 as the hull lines do.
    from kvsched.costmodel.coeffile import COEFFICIENT_DIR, load_coefficients

    coeffs = load_coefficients(COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json")
    cost = make_cost_model(coeffs.name, coeffs.params)
    forms = separable_forms(cost, 512)
    (form,) = [f for f in forms if f.fixed == f.fixed_decode == f.fixed_prefill == 0 and f.line[0] == 0]
    loads = np.arange(1, 513, dtype=float)
    phi_d = float(np.min((cost.b0 + cost.non_attention(loads)) / loads))
    phi_p = float(np.min((cost.p0 + cost.non_attention(loads)) / loads))
    assert form.per_token + form.decode - cost.b2 == pytest.approx(phi_d, rel=1e-8)
    assert form.per_token + form.prefill_token == pytest.approx(phi_p, rel=1e-8)
    hull = max(f.per_token + f.decode + f.fixed_decode / 512 for f in forms if f is not form)
    assert form.per_token + form.decode > hull  # it charges a decode more than any hull line does
    # Below the batch time for decode-only, prefill-only and mixed batches up to the budget.
    rng = np.random.default_rng(7)
    for _ in range(400):
        kind = rng.integers(3)
        decodes = 0 if kind == 1 else int(rng.integers(1, 385 if kind == 0 else 300))
        chunk = 0 if kind == 0 else int(rng.integers(1, 513 - decodes))
        tokens = np.array([1] * decodes + ([chunk] if chunk else []))
        context = np.array(
            list(rng.integers(1, 4000, decodes) + 1) + ([int(rng.integers(0, 4000))] if chunk else [])
        )
        decode = np.array([True] * decodes + ([False] if chunk else []))
        view = BatchView(tokens, context, np.where(decode, 1, 0))
        for f in forms:
            assert f.lower(tokens, context, decode) <= cost.batch_time(view) * (1 + 1e-12)


def test_minorant_of_a_negative_step_and_its_gap():
    # Token term 2, 2, 3, 1.5, 1.5 at loads 1..5 (a step up then down): the convex minorant is not the function.
    loads = np.arange(1, 6, dtype=float)
    values = np.array([2.0, 2.0, 3.0, 1.5, 1.5])
    lines, gap = minorant_lines(loads, values)
    for n0, n1 in lines:
        assert np.all(n0 + n1 * loads <= values + 1e-12) and n0 >= 0 and n1 >= 0
    assert gap == pytest.approx((3.0 - (2 - 0.5 / 3 * 2)) / 3.0)


def test_shipped_stepped_set_reports_its_minorant_gap():
    from kvsched.costmodel.coeffile import COEFFICIENT_DIR, load_coefficients

    coeffs = load_coefficients(COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json")
    inst = synthetic(
        50,
        0,
        Limits(kv_capacity=4000),
        TimeModel(coeffs.name, coeffs.params),
        prompt=Uniform(1, 200),
        output=Uniform(1, 200),
    )
    report = seconds_report(inst)
    assert report is not None and 0 < report.minorant_gap < 1
    assert report.bounds.mbt > report.bounds.isolated > 0


# ----------------------------------------------------------------------- entry point
def test_portfolio_checks_its_objective_and_takes_a_deadline():
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    with pytest.raises(InputError, match="objective"):
        portfolio(inst, "throughput")
    spent = Deadline.after(1e-9)
    assert 0 < len(portfolio(inst, "total-latency", spent)) <= len(portfolio(inst, "total-latency"))
    assert best(inst, "total-latency").value <= 16


def test_bounds_below_the_optimum_and_tight_when_memory_binds():
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    b = lower_bounds(inst)
    opt = solve(inst, formulation="time", options=SolverOptions(time_limit=10, threads=1)).objective
    assert b.total_latency <= best(inst, "total-latency").value <= opt == 16


def test_chunk_budget_counts_in_the_isolated_bound():
    inst = Instance(
        (Request("a", 1, 10, 2),), Limits(kv_capacity=16, max_prefill_tokens=4), TimeModel("unit")
    )
    assert lower_bounds(inst).isolated == 3 + 1  # ceil(10/4) prefill batches + 1 decode


def test_combinatorial_bounds_need_unit_time_and_unknown_models_get_none():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("infermax-linear"))
    with pytest.raises(InputError, match="unit time model"):
        lower_bounds(inst)
    assert best(inst, "total-latency").value > 0  # the seconds bounds apply


@pytest.mark.parametrize("objective", ["total-latency", "sum-ttft"])
@pytest.mark.parametrize("model", ["unit", "infermax-linear"])
def test_portfolio_bounds_do_not_move_with_the_clock(objective, model):
    # Latencies are differences of times: arrivals a million seconds later change no bound beyond float
    # rounding. The mean-busy-time bounds once differenced squares of absolute times: 0.0147 s at 1e6 + 1
    # for a request whose first token takes 0.0058 s.
    reqs = (Request("r0", 1.779, 4, 2), Request("r1", 1.528, 3, 3), Request("r2", 0.0, 2, 4))
    if model == "unit":
        reqs = tuple(replace(r, arrival=float(int(r.arrival))) for r in reqs)
    base = Instance(reqs, Limits(kv_capacity=10, max_batch_tokens=4, max_prefill_tokens=4), TimeModel(model))
    late = replace(base, requests=tuple(replace(r, arrival=r.arrival + 1e6) for r in reqs))
    before = {b.source: b.value for b in portfolio(base, objective)}
    after = {b.source: b.value for b in portfolio(late, objective)}
    assert before.keys() == after.keys()
    for source, value in before.items():
        assert after[source] == pytest.approx(value, rel=1e-7, abs=1e-9), source
