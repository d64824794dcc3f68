"""The greedy's running cap (admission control) and its per-instance search in best_incumbent."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.csp import SolverOptions, pipeline, solve
from kvsched.csp.incumbents import Incumbent, greedy
from kvsched.csp.incumbents.admission import LOWEST, RATIO, cap_grid, peak_running, running_cap_search
from kvsched.csp.incumbents.base import confirmed
from kvsched.csp.incumbents.best import (
    VARIANTS,
    best_incumbent,
    run_variant,
    search_running_caps,
    variant_of,
    variants_for,
)
from kvsched.csp.incumbents.lns import rerunner
from kvsched.csp.objectives import OBJECTIVES
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

A100 = "llama-2-7b_a100-80gb_tp1"


def _instance(rng: np.random.Generator, n: int, model: TimeModel, m: int = 20_000) -> Instance:
    """``n`` requests (prompts up to 900 tokens, outputs up to 60) arriving over a second, C = P = 512: dozens
    hold KV at once, so a cap binds."""
    reqs = tuple(
        Request(f"r{k}", float(rng.uniform(0, 1)), int(rng.integers(1, 900)), int(rng.integers(1, 60)))
        for k in range(n)
    )
    return Instance(reqs, Limits(kv_capacity=m, max_batch_tokens=512, max_prefill_tokens=512), model)


def _a100(seed: int = 3, n: int = 60) -> Instance:
    return _instance(np.random.default_rng(seed), n, TimeModel(*resolve_cost_model(A100)))


def test_cap_grid_walks_down_from_the_peak_geometrically():
    grid = list(cap_grid(105))
    assert grid[:4] == [88, 74, 62, 52]
    assert all(b < a for a, b in zip([105, *grid], grid, strict=False))
    assert grid[-1] >= LOWEST and round(grid[-1] * RATIO) < LOWEST
    # Small peaks still give distinct caps (each one below the last), none below LOWEST.
    assert list(cap_grid(7)) == [6, 5, 4]
    assert list(cap_grid(LOWEST)) == []


@pytest.mark.parametrize("cap", [3, 8, 20])
def test_a_capped_greedy_schedule_replays_through_the_core_within_the_cap(cap):
    inst = _a100()
    cost = instance_cost_model(inst)
    free = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=384)
    assert peak_running(free.trace) > 20  # the instance is one where every cap here binds
    capped = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=384, running_cap=cap)
    assert capped.trace is not None and capped.trace.ok
    assert 0 < peak_running(capped.trace) <= cap
    # The core itself holds the schedule to the cap: replayed under an instance whose max_running is the
    # cap, it is legal.
    tight = replace(inst, limits=replace(inst.limits, max_running=cap))
    assert replay(tight, capped.schedule, cost).ok
    assert capped.name.endswith(f"/token-cap=384/running-cap={cap}")
    assert capped.schedule.meta["params"]["running_cap"] == cap
    # Valued on its own log (no replay), the same number.
    unreplayed = greedy(
        inst,
        "remaining-area",
        preempt=False,
        lookahead=16,
        token_cap=384,
        running_cap=cap,
        replay_schedule=False,
    )
    assert unreplayed.value == pytest.approx(capped.value)


def test_a_cap_at_or_above_the_peak_changes_nothing():
    inst = _a100()
    free = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=384)
    peak = peak_running(free.trace)
    same = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=384, running_cap=peak)
    assert same.value == pytest.approx(free.value)
    # The instance's own max_running still holds under a looser cap.
    tight = replace(inst, limits=replace(inst.limits, max_running=5))
    loose = greedy(tight, "remaining-area", preempt=False, lookahead=16, token_cap=384, running_cap=50)
    assert peak_running(loose.trace) <= 5


def _fake(values: dict[int, float]):
    """A run function returning an incumbent of the given value per cap, and the caps it was asked for."""
    asked: list[int] = []

    def run(cap: int) -> Incumbent:
        asked.append(cap)
        return Incumbent(f"cap={cap}", Schedule(()), values[cap], "total-latency")

    return run, asked


def test_the_search_goes_down_while_it_improves_then_tries_the_midpoints():
    start = Incumbent("free", Schedule(()), 100.0, "total-latency")
    grid = list(cap_grid(105))  # 88, 74, 62, 52, ...
    values = {cap: 200.0 for cap in range(1, 106)}
    values.update({88: 99.0, 74: 98.0, 62: 97.0, 52: 98.5, 68: 96.0, 57: 99.5})
    run, asked = _fake(values)
    tried: dict[str, float] = {}
    best = running_cap_search(start, 105, run, lambda: True, tried)
    assert asked == [*grid[:4], 68, 57]  # down to the first cap that does not improve, then both midpoints
    assert best.name == "cap=68" and best.value == 96.0
    assert tried == {f"cap={c}": values[c] for c in asked}


def test_the_search_keeps_the_uncapped_schedule_when_no_cap_beats_it_and_stops_when_out_of_time():
    start = Incumbent("free", Schedule(()), 100.0, "total-latency")
    run, asked = _fake({cap: 101.0 for cap in range(1, 106)})
    assert running_cap_search(start, 105, run, lambda: True) is start
    assert asked == [88]  # no midpoints around no cap
    run, asked = _fake({cap: 50.0 for cap in range(1, 106)})
    budget = iter([True, True, False])
    best = running_cap_search(start, 105, run, lambda: next(budget, False))
    assert asked == [88, 74] and best.name == "cap=88"  # 74 ties 88: the first stays


def test_best_incumbent_searches_running_caps_on_its_best_variant_under_a_stepped_model():
    inst = _a100()
    cost = instance_cost_model(inst)
    best = best_incumbent(inst, policies=(), deadline=Deadline.after(60))
    capped = {name: value for name, value in best.stats["tried"].items() if "/running-cap=" in name}
    assert capped, "no running cap was tried"
    # The caps are the best variant's, on the grid below the first variant's peak.
    uncapped = {v: run_variant(inst, v, cost) for v in variants_for(inst, cost)}
    variant = min(uncapped, key=lambda v: uncapped[v].value)
    peak = peak_running(uncapped[variants_for(inst, cost)[0]].trace)
    first_cap = next(cap_grid(peak))
    for name, value in capped.items():
        cap = int(name.split("/running-cap=")[1].split("/")[0])
        assert cap < peak
        again = run_variant(inst, replace(variant, running_cap=cap), cost)
        assert again.name == name and value == pytest.approx(again.value)
    assert any(f"/running-cap={first_cap}" in name for name in capped)
    assert best.value == min(best.stats["tried"].values())
    assert best.trace is not None and best.trace.ok and replay(inst, best.schedule).ok


@pytest.mark.parametrize("model", ["unit", "unit-budget"])
def test_no_running_cap_is_tried_under_unit_time(model):
    rng = np.random.default_rng(5)
    inst = _instance(rng, 30, TimeModel("unit"), m=3000)
    if model == "unit":
        inst = replace(inst, limits=Limits(kv_capacity=3000))
    best = best_incumbent(inst, policies=(), deadline=Deadline.after(30))
    assert not any("running-cap" in name for name in best.stats["tried"])


def test_the_local_search_re_makes_a_capped_incumbent_with_its_cap():
    inst = _a100()
    cost = instance_cost_model(inst)
    variant = replace(variants_for(inst, cost)[0], running_cap=8)
    inc = run_variant(inst, variant, cost)
    again = confirmed(inst, rerunner(inst, inc, cost)(np.ones(len(inst)), Deadline.never(), "again"), cost)
    assert again.value == pytest.approx(inc.value)
    assert again.schedule.meta["params"]["running_cap"] == 8
    assert peak_running(replay(inst, again.schedule, cost)) <= 8


def test_a_variants_incumbent_says_which_variant_made_it():
    inst = _a100(n=12)
    cost = instance_cost_model(inst)
    for variant in [*variants_for(inst, cost), replace(variants_for(inst, cost)[0], running_cap=9)]:
        assert variant_of(run_variant(inst, variant, cost)) == variant
    # A schedule of external priorities, or no greedy's, names no variant.
    assert variant_of(greedy(inst, priority=np.arange(len(inst), dtype=float))) is None
    assert variant_of(Incumbent("policy:sarathi", Schedule(()), 1.0, "total-latency")) is None
    # Params that make no variant (a warm start read from a file may carry anything) name none either.
    for params in (
        {"rule": "nonsense"},
        {"rule": "area", "lookahead": None},
        {"rule": "area", "token_cap": "x"},
    ):
        meta = {"policy": "greedy:area", "params": params}
        assert variant_of(Incumbent("warm start", Schedule((), meta=meta), 1.0, "total-latency")) is None


def test_search_running_caps_only_where_eviction_costs_seconds_and_on_an_uncapped_variant():
    inst = _a100()
    cost = instance_cost_model(inst)
    head = variants_for(inst, cost)[0]
    inc = run_variant(inst, head, cost)
    tried: dict[str, float] = {}
    best = search_running_caps(inst, inc, tried=tried)
    assert tried and all("/running-cap=" in name for name in tried)
    assert best.value == min([inc.value, *tried.values()])
    assert best.trace is not None and best.trace.ok and replay(inst, best.schedule, cost).ok
    # Its grid starts below the incumbent's own peak.
    assert next(iter(tried)).endswith(
        f"/running-cap={next(cap_grid(peak_running(inc.trace)))}/prompt-weighted"
    )
    # A capped incumbent is not searched again, and under unit time nothing is searched.
    capped = run_variant(inst, replace(head, running_cap=10), cost)
    assert search_running_caps(inst, capped, tried=(none := {})) is capped and not none
    unit = replace(inst, time_model=TimeModel("unit"))
    plain = run_variant(unit, VARIANTS["budget"][0], instance_cost_model(unit))
    assert search_running_caps(unit, plain, tried=(none := {})) is plain and not none
    # Out of time: the incumbent, replayed.
    assert search_running_caps(inst, inc, Deadline.after(1e-9), tried=(none := {})).value == inc.value
    assert not none


def test_the_pipeline_searches_running_caps_after_its_bounds_and_keeps_a_better_capped_schedule(monkeypatch):
    # The bounds' stage takes 75% of what the incumbents leave and the caps get a share of the rest: under load
    # that share has held no variant (KeyError 'running_caps'). A smaller bounds stage keeps the order tested.
    monkeypatch.setattr(pipeline, "LAGRANGIAN_SHARE", 0.3)
    inst = _a100()
    result = solve(
        inst, formulation="auto", options=SolverOptions(time_limit=12.0), deadline=Deadline.after(12.0)
    )
    caps = result.stats["running_caps"]
    assert caps and all("/running-cap=" in name for name in caps)
    assert not any("/running-cap=" in name for name in result.stats["incumbents"])  # not before the bounds
    assert result.objective <= min(caps.values()) + 1e-9
    assert result.best_bound <= min(caps.values())
    again = replay(inst, result.schedule)
    assert again.ok and OBJECTIVES["total-latency"](again) == result.objective
