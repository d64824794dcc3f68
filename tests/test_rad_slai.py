"""Seed 000's RAD and SLAI, and seed 001's class-priority wrapper: validity, hand-checked orders, structure."""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import numpy as np
import pytest

from kvsched.costmodel import UnitCost
from kvsched.errors import InputError
from kvsched.heuristics import POLICIES, RAD, SLAI, ClassPriority, make_policy, simulate
from kvsched.heuristics.rad import tiling_of
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Phase, Schedule
from kvsched.schedule.validate import replay
from tests.test_policies import KINDS, battery_instance

UNIT = TimeModel("unit")
LINEAR = TimeModel("infermax-linear")
NEW = ["rad", "slai", "slai-fixed", "slai-fcfs", "slai-priority", "class-priority"]


def names_of(inst: Instance, schedule: Schedule) -> list[tuple[list[str], list[int]]]:
    return [([inst.requests[i].id for i in b.requests], b.tokens.tolist()) for b in schedule.batches]


@cache
def battery_run(name: str, kind: str) -> tuple[Instance, Schedule]:
    inst = battery_instance(kind)
    return inst, simulate(inst, make_policy(name)).schedule


# ---------------------------------------------------------------- every schedule validates


@pytest.mark.parametrize("kind", [*KINDS, "small-p"])
@pytest.mark.parametrize("name", NEW)
def test_every_new_policy_completes_the_battery_and_replays(name, kind):
    inst, schedule = battery_run(name, kind)
    assert replay(inst, schedule, strict=True).state.all_done
    assert schedule.meta["policy"] == name


@pytest.mark.parametrize("kind", KINDS)
def test_rad_with_small_tiles_replays_and_evicts_only_under_pressure(kind):
    inst = battery_instance(kind)
    result = simulate(inst, RAD(t_col=3, t_lcm=4, n=5))
    assert replay(inst, result.schedule, strict=True).state.all_done
    if kind == "semi-online":  # M = 64 holds three requests of at most 19 tokens: no eviction
        assert result.trace.state.evictions.sum() == 0


def test_new_policies_are_registered_with_their_papers():
    for name in NEW[:-1]:
        assert POLICIES[name].source.startswith("seed 000"), name
    assert POLICIES["class-priority"].source.startswith("seed 001")
    slai = make_policy("slai")
    assert (slai.token_budget, slai.max_running, slai.beta) == (512, 128, 128)
    assert (slai.offset, slai.offset_low, slai.memory_threshold, slai.dynamic_offset) == (
        10.0,
        5.0,
        0.96,
        True,
    )
    assert make_policy("slai-fcfs").prefill_order == "fcfs" and not make_policy("slai-fixed").dynamic_offset
    assert make_policy("slai-priority").priority_first
    with pytest.raises(InputError, match="prefill_order must be"):
        make_policy("slai", prefill_order="sjf")
    with pytest.raises(InputError, match="inner must be another policy"):
        make_policy("class-priority", inner="class-priority")


# ---------------------------------------------------------------------------- RAD


def test_rad_hand_case_cycles_back_to_back_prefills_and_decode_batches():
    """t_col* = 2, t_lcm* = 4, n = 3; everything arrives at 0.

    A (I=5, O=3) prefills in chunks 4 + 1 (the printed L^P - i would leave a token),
    B joins D, |D| = 2 = t_col*: one decode batch, B completes; C prefills, |D| = 2
    again; then the cycle has started n = 3 requests, so only decodes (untiled,
    |D| = 1) until D empties; the next cycle starts with D.
    """
    inst = Instance(
        (Request("A", 0, 5, 3), Request("B", 0, 3, 2), Request("C", 0, 4, 4), Request("D", 0, 2, 2)),
        Limits(kv_capacity=100),
        UNIT,
    )
    policy = RAD(t_col=2, t_lcm=4, n=3)
    result = simulate(inst, policy)
    assert names_of(inst, result.schedule) == [
        (["A"], [4]),
        (["A"], [1]),
        (["B"], [3]),
        (["A", "B"], [1, 1]),
        (["C"], [4]),
        (["A", "C"], [1, 1]),
        (["C"], [1]),
        (["C"], [1]),
        (["D"], [2]),
        (["D"], [1]),
    ]
    assert policy.cycle_starts == [0, 8]


def test_rad_structure_on_an_online_instance():
    """Seed 000 digest T3: pure batches, back-to-back whole prompts in t_lcm* chunks, |D| <= t_col*."""
    t_col, t_lcm, n = 4, 8, 6
    inst = synthetic(
        60,
        3,
        Limits(kv_capacity=400),
        UNIT,
        prompt=Uniform(1, 30),
        output=Uniform(1, 20),
        arrival=Poisson(0.4),
    )
    policy = RAD(t_col=t_col, t_lcm=t_lcm, n=n)
    schedule = simulate(inst, policy).schedule
    trace = replay(inst, schedule)
    prompt = np.array([r.prompt for r in inst.requests])
    done_prefill: set[int] = set()
    current = None  # the request whose prompt is running
    for batch, rec in zip(schedule.batches, trace.records, strict=True):
        phases = set(batch.phases.tolist())
        assert len(phases) == 1  # never mixed
        if Phase.PREFILL in phases:
            (r,) = batch.requests.tolist()  # one request per prefill batch
            assert current in (None, r)  # whole prompt back to back
            (c,) = batch.tokens.tolist()
            assert c == t_lcm or c == prompt[r] % t_lcm  # optimally tiled chunks, the remainder last
            current = None if r in rec.generated.tolist() else r
            if current is None:
                done_prefill.add(r)
        else:
            assert current is None
            assert len(batch.requests) <= t_col
        assert rec.num_running <= t_col
    assert len(done_prefill) == len(inst)
    # Cycles: at most n requests start between two cycle starts.
    first_prefill = {}
    for k, batch in enumerate(schedule.batches):
        for r in batch.requests.tolist():
            first_prefill.setdefault(r, k)
    starts = sorted(first_prefill.values())
    bounds = [*policy.cycle_starts, len(schedule.batches)]
    assert len(policy.cycle_starts) > 1
    for lo, hi in pairwise(bounds):
        assert 1 <= sum(lo <= s < hi for s in starts) <= n


def test_rad_decodes_all_of_d_only_when_full_idle_or_cycle_done():
    inst = synthetic(
        40,
        5,
        Limits(kv_capacity=400),
        UNIT,
        prompt=Uniform(1, 10),
        output=Uniform(2, 12),
        arrival=Poisson(0.5),
    )
    schedule = simulate(inst, RAD(t_col=3, t_lcm=4, n=100)).schedule
    trace = replay(inst, schedule)
    arrival = np.array([r.arrival for r in inst.requests])
    first = trace.state.first_scheduled
    untiled = 0
    for batch in schedule.batches:
        if batch.phases[0] != Phase.DECODE or len(batch.requests) == 3:
            continue
        # An untiled decode batch: nothing was waiting to start (n = 100 never binds here).
        untiled += 1
        assert not ((arrival <= batch.start) & (first > batch.start)).any()
    assert untiled > 0 and trace.state.evictions.sum() == 0


def test_rad_tiles_come_from_the_rad_cost_model():
    assert tiling_of(Instance((), Limits(kv_capacity=10))) == (256, 256)  # 128 x 256, t_red = 32
    rad = TimeModel("rad", {"t_row": 64.0, "t_col": 32.0, "t_red": 48.0})
    assert tiling_of(Instance((), Limits(kv_capacity=10), rad)) == (32, 192)
    policy = RAD()
    policy.reset(Instance((Request("a", 0, 1, 1),), Limits(kv_capacity=10, max_running=8), rad))
    assert policy.params["effective"] == {"n": 128, "t_col": 32, "t_lcm": 192, "cap": 8}


# ---------------------------------------------------------------------------- SLAI


def slai_case(free_tbt: float) -> Instance:
    """P (paying, TBT 1) and F (free) decode while L's long prompt arrives at t = 1; unit batches."""
    reqs = (
        Request("P", 0, 1, 4, cls="paying", tbt_slo=1.0),
        Request("F", 0, 1, 4, cls="free", tbt_slo=free_tbt),
        Request("L", 1, 9, 1),
    )
    return Instance(reqs, Limits(kv_capacity=100), UNIT)


def test_slai_hand_case_critical_decodes_then_started_prefills_then_deferred_decodes():
    """Budget 4, delta = 1, mean batch 1: C_P = e_P (always critical), C_F = e_F + 4.

    F is deferred while L's started prefill takes the budget; P is never deferred.
    """
    inst = slai_case(free_tbt=5.0)
    result = simulate(inst, SLAI(token_budget=4, offset=1.0, dynamic_offset=False))
    assert names_of(inst, result.schedule) == [
        (["P", "F"], [1, 1]),
        (["P", "L"], [1, 3]),
        (["P", "L"], [1, 3]),
        (["P", "L"], [1, 3]),
        (["F"], [1]),
        (["F"], [1]),
        (["F"], [1]),
    ]
    # F's TBT (4 slots) stays within its SLO of 5, and L's first token comes a slot earlier than
    # under Sarathi, whose decode priority keeps F in every batch.
    ours = replay(inst, result.schedule).state
    assert ours.completion[1] == 7.0
    sarathi = replay(inst, simulate(inst, make_policy("sarathi", prefill_budget=4)).schedule).state
    assert (ours.first_token[2], sarathi.first_token[2]) == (4.0, 5.0)


def test_slai_critical_decodes_go_by_deadline_before_prefills():
    """With F's TBT = 3, F turns critical at t = 3 (C_F = 1 + 3 - 1) and goes before L's chunk."""
    inst = slai_case(free_tbt=3.0)
    result = simulate(inst, SLAI(token_budget=4, offset=1.0, dynamic_offset=False))
    assert names_of(inst, result.schedule) == [
        (["P", "F"], [1, 1]),
        (["P", "L"], [1, 3]),
        (["P", "L"], [1, 3]),
        (["P", "F", "L"], [1, 1, 2]),  # critical P then F (ties by admission), then L
        (["L", "F"], [1, 1]),  # C_F = 4 + 3 - 1 = 6 > 4: F is non-critical again
        (["F"], [1]),
    ]


def test_slai_without_slos_is_decode_first_like_sarathi():
    inst = slai_case(free_tbt=5.0)
    bare = Instance(
        tuple(Request(r.id, r.arrival, r.prompt, r.output) for r in inst.requests), inst.limits, UNIT
    )
    ours = names_of(bare, simulate(bare, SLAI(token_budget=4)).schedule)
    assert ours[1:4] == [(["P", "F", "L"], [1, 1, 2])] * 3  # every decode critical, L gets what is left


@pytest.mark.parametrize(("order", "first"), [("spf", (["B", "C"], [2, 2])), ("fcfs", (["A"], [4]))])
def test_slai_new_prefills_spf_or_fcfs(order, first):
    reqs = (Request("A", 0, 5, 2), Request("B", 0, 2, 2), Request("C", 0, 3, 2))
    inst = Instance(reqs, Limits(kv_capacity=100), UNIT)
    schedule = simulate(inst, SLAI(token_budget=4, prefill_order=order)).schedule
    assert names_of(inst, schedule)[0] == first


def test_slai_priority_first_and_alpha_and_beta():
    reqs = (
        Request("free-short", 0, 2, 3, priority=0),
        Request("paid-long", 0, 6, 3, priority=1),
        Request("free-mid", 0, 4, 3, priority=0),
    )
    inst = Instance(reqs, Limits(kv_capacity=100), UNIT)
    first = names_of(inst, simulate(inst, SLAI(token_budget=8, priority_first=True)).schedule)[0]
    assert first == (["paid-long", "free-short"], [6, 2])
    # alpha = 1: one active request at a time.
    trace = simulate(inst, SLAI(token_budget=8, alpha=1)).trace
    assert max(rec.num_running for rec in trace.records) == 1
    # beta = 2: at most two decodes per batch although three decode.
    crowd = synthetic(12, 2, Limits(kv_capacity=500), UNIT, prompt=Uniform(1, 3), output=Uniform(5, 9))
    trace = simulate(crowd, SLAI(beta=2)).trace
    assert max(rec.num_decodes for rec in trace.records) == 2


def test_slai_measures_the_running_mean_batch_time():
    inst = synthetic(20, 4, Limits(kv_capacity=2000), LINEAR, prompt=Uniform(5, 60), output=Uniform(2, 20))
    policy = SLAI()
    schedule = simulate(inst, policy).schedule
    durations = np.array([b.duration for b in schedule.batches])
    assert len(set(durations.round(12))) > 1
    # Every batch but the last is observed when the next is asked for.
    assert policy.mean_batch_time == pytest.approx(durations[:-1].mean(), rel=1e-12)


def test_slai_dynamic_offset_follows_kv_occupancy():
    inst = synthetic(30, 6, Limits(kv_capacity=60), UNIT, prompt=Uniform(5, 20), output=Uniform(5, 30))
    policy = SLAI(memory_threshold=0.5)
    schedule = simulate(inst, policy).schedule
    # Each batch's offset comes from the KV occupancy when it is built.
    state = EngineState(inst, UnitCost())
    expected = []
    for batch in schedule.batches:
        expected.append(5.0 if state.kv_blocks / 60 < 0.5 else 10.0)
        state.step(batch)
    assert policy.offsets_used == expected
    assert set(expected) == {5.0, 10.0}
    fixed = SLAI(dynamic_offset=False)
    simulate(inst, fixed)
    assert set(fixed.offsets_used) == {10.0}


# ------------------------------------------------------------------ class priority


def priority_instance(**extra: str) -> Instance:
    """One request runs at a time (max_running = 1): the service order is the admission order."""
    reqs = (
        Request("L1", 0.0, 2, 3, priority=0, cls="free"),
        Request("L2", 0.2, 2, 3, priority=0, cls="free"),
        Request("H1", 0.5, 2, 3, priority=1, cls="paying"),
        Request("H2", 0.7, 2, 3, priority=1, cls="paying"),
        Request("L3", 0.9, 2, 3, priority=0, cls="free"),
    )
    return Instance(reqs, Limits(kv_capacity=100, max_running=1), UNIT)


def service_order(inst: Instance, schedule: Schedule) -> list[str]:
    first = replay(inst, schedule).state.first_scheduled
    return [inst.requests[k].id for k in np.argsort(first, kind="stable")]


def test_class_priority_serves_the_higher_class_first_without_preempting():
    inst = priority_instance()
    assert service_order(inst, simulate(inst, make_policy("sarathi")).schedule) == [
        "L1",
        "L2",
        "H1",
        "H2",
        "L3",
    ]
    wrapped = simulate(inst, make_policy("class-priority")).schedule
    # L1 started before any paying request arrived and is not preempted.
    assert service_order(inst, wrapped) == ["L1", "H1", "H2", "L2", "L3"]
    by_class = simulate(inst, make_policy("class-priority", classes="paying,free")).schedule
    assert by_class.same_as(wrapped)
    reverse = simulate(inst, make_policy("class-priority", classes="free,paying")).schedule
    assert service_order(inst, reverse) == ["L1", "L2", "L3", "H1", "H2"]


def test_class_priority_wraps_any_policy():
    inst = priority_instance()
    for inner in ("vllm-v1", "kfcfs", "slai", "rad"):
        schedule = simulate(inst, ClassPriority(make_policy(inner))).schedule
        assert service_order(inst, schedule) == ["L1", "H1", "H2", "L2", "L3"], inner
