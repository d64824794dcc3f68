"""The InferMax policy family on a battery of small instances, and each flag.

The other families (engines and K-FCFS, MC-SF, WAIT) have their own test files
on the same battery; here every registered policy only has to run the benign
semi-online instance.
"""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import numpy as np
import pytest

from kvsched.errors import InputError, KvschedError
from kvsched.heuristics import POLICIES, InferMax, list_policies, make_policy, simulate
from kvsched.heuristics.infermax import DEFAULT_TOKEN_BUDGET
from kvsched.instances.generators import Gamma, Poisson, Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Phase, Schedule
from kvsched.schedule.validate import replay

P, D, R = Phase.PREFILL, Phase.DECODE, Phase.REFILL
UNIT = TimeModel("unit")
LINEAR = TimeModel("infermax-linear")
INFERMAX = {name: spec for name, spec in POLICIES.items() if spec.factory is InferMax}
CHUNKED = sorted(name for name, spec in INFERMAX.items() if spec.defaults.get("chunked", True))
WHOLE = sorted(set(INFERMAX) - set(CHUNKED))


def battery_instance(kind: str) -> Instance:
    """Small instances covering arrivals, memory pressure, paging, budgets and both cost models.

    Prompts + outputs stay below P wherever whole-prompt policies run on them, so
    every refill fits one batch.
    """
    lengths = {"prompt": Uniform(1, 10), "output": Uniform(1, 10)}
    if kind == "semi-online":
        return synthetic(12, 1, Limits(kv_capacity=64), UNIT, **lengths)
    if kind == "staggered":  # Poisson arrivals with idle gaps, whole time slots, some evictions
        return synthetic(14, 4, Limits(kv_capacity=24), UNIT, arrival=Poisson(0.5), tick=1.0, **lengths)
    if kind == "tight":  # M barely above the longest request: evictions
        return synthetic(12, 3, Limits(kv_capacity=20), UNIT, **lengths)
    if kind == "blocks":  # paged KV, block size 4, bursty arrivals, the linear cost model
        return synthetic(
            12, 4, Limits(kv_capacity=24, block_size=4), LINEAR, arrival=Gamma(rate=200.0, cv=3.0), **lengths
        )
    if kind == "budgets":  # C, P and max_running all set
        lim = Limits(kv_capacity=40, max_batch_tokens=24, max_prefill_tokens=20, max_running=4)
        return synthetic(12, 5, lim, LINEAR, **lengths)
    if kind == "crowded":  # many concurrent decodes: evictions in the middle of the decode group
        return synthetic(40, 7, Limits(kv_capacity=48), UNIT, prompt=Uniform(1, 12), output=Uniform(1, 24))
    if kind == "small-p":  # long prompts, P = 8: only chunked prefill can run them
        lim = Limits(kv_capacity=48, max_prefill_tokens=8)
        return synthetic(10, 6, lim, UNIT, prompt=Uniform(5, 30), output=Uniform(1, 12))
    raise ValueError(kind)


KINDS = ["semi-online", "staggered", "tight", "blocks", "budgets", "crowded"]


@cache
def run(name: str, kind: str) -> tuple[Instance, Schedule, np.ndarray]:
    inst = battery_instance(kind)
    result = simulate(inst, make_policy(name))
    return inst, result.schedule, result.trace.state.evictions.copy()


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_registered_policy_runs_the_semi_online_instance(name):
    inst, schedule, _ = run(name, "semi-online")
    assert replay(inst, schedule, strict=True).state.all_done
    assert schedule.meta["policy"] == name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(INFERMAX))
def test_every_policy_completes_and_its_schedule_replays(name, kind):
    inst, schedule, _ = run(name, kind)
    trace = replay(inst, schedule, strict=True)  # from the Schedule alone
    assert trace.state.all_done
    assert schedule.meta["policy"] == name


def test_the_battery_idles_evicts_pages_and_hits_every_budget():
    idles = {kind: 0 for kind in KINDS}
    for kind in KINDS:
        inst, schedule, evictions = run("sarathi", kind)
        idles[kind] = sum(b.start > a.end + 1e-12 for a, b in pairwise(schedule.batches))
        assert evictions.sum() > 0, kind
    assert idles["staggered"] > 0 and idles["blocks"] > 0
    inst, schedule, _ = run("sarathi", "budgets")
    trace = replay(inst, schedule)
    assert max(rec.num_tokens for rec in trace.records) == 20  # P (the token budget) binds
    assert max(rec.num_running for rec in trace.records) == 4  # max_running binds
    inst, schedule, _ = run("vllm", "blocks")
    trace = replay(inst, schedule)
    assert max(rec.kv_blocks for rec in trace.records) == 6  # all 24 / 4 blocks in use at some point


@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_policies_run_prompts_longer_than_p(name):
    inst = battery_instance("small-p")
    result = simulate(inst, make_policy(name))
    trace = replay(inst, result.schedule, strict=True)
    assert max(rec.prefill_tokens for rec in trace.records) <= 8
    assert any(rec.num_items > 1 for rec in trace.records)


@pytest.mark.parametrize("name", WHOLE)
def test_whole_prompt_policies_say_why_they_cannot_run_long_prompts(name):
    with pytest.raises(
        KvschedError, match=r"processes whole prompts .* more than the budget \(C = 4096, P = 8\)"
    ):
        simulate(battery_instance("small-p"), make_policy(name))


@pytest.mark.parametrize("name", [n for n in INFERMAX if n.endswith("-ef")])
def test_eviction_free_variants_never_evict(name):
    for kind in KINDS:
        assert run(name, kind)[2].sum() == 0
    # ... while their base policy does on the tight instance.
    assert run(name.removesuffix("-ef"), "tight")[2].sum() > 0


@pytest.mark.parametrize("name", list(INFERMAX))
def test_bulk_decode_admission_is_the_per_candidate_loop(name):
    class LoopOnly(InferMax):
        def _consider_decodes(self, build, lo, hi):
            for rank in range(lo, hi):
                self._consider_running(build, rank)

    spec = POLICIES[name]
    for kind in ("tight", "blocks", "budgets", "crowded"):
        inst = battery_instance(kind)
        fast = simulate(inst, make_policy(name)).schedule
        slow = simulate(inst, LoopOnly(name=name, **spec.defaults)).schedule
        assert fast.same_as(slow)


# ------------------------------------------------------------------ registry


def test_registry_holds_table1_its_ef_twins_ranks_and_sec6():
    names = [spec.name for spec in list_policies() if spec.factory is InferMax]
    table1 = ["vllm", "vllm-hy", "sarathi", "sarathi-pc", "sarathi-nocp", "sarathi-nohy"]
    assert names == [x for row in table1 for x in (row, f"{row}-ef")] + [
        "rank-org",
        "rank-i",
        "rank-o",
        "infermax-sec6",
    ]
    for name in names:
        assert POLICIES[name].description and POLICIES[name].source.startswith("seed 003")
    hindsight = {name for name in names if make_policy(name).uses_true_output}
    assert hindsight == {f"{row}-ef" for row in table1} | {"rank-o"}


def test_every_family_is_registered_with_its_paper():
    sources = {spec.name: spec.source for spec in list_policies()}
    for name, paper in (
        ("vllm-v1", "seed 001"),
        ("orca", "seed 001"),
        ("fastertransformer", "seed 001"),
        ("kfcfs", "seed 001"),
        ("mcsf", "seed 004"),
        ("alpha-greedy", "seed 004"),
        ("wait", "seed 002"),
        ("nested-wait", "seed 002"),
    ):
        assert sources[name].startswith(paper), name
    assert all(spec.description for spec in list_policies())


def test_table1_flags():
    flags = {
        name: tuple(POLICIES[name].defaults[k] for k in ("priority", "hybrid", "chunked", "prefill_budget"))
        for name in ("vllm", "sarathi", "sarathi-pc", "sarathi-nocp", "vllm-hy", "sarathi-nohy")
    }
    assert flags == {
        "vllm": ("prefill", False, False, None),
        "sarathi": ("decode", True, True, 512),
        "sarathi-pc": ("decode", True, True, None),
        "sarathi-nocp": ("decode", True, False, None),
        "vllm-hy": ("prefill", True, False, None),
        "sarathi-nohy": ("decode", False, False, None),
    }


def test_make_policy_rejects_bad_input():
    with pytest.raises(InputError, match="unknown policy 'lightllm'"):
        make_policy("lightllm")
    # A typo is told the closest registered names; a name far from all of them is not.
    with pytest.raises(InputError, match=r"^policy: unknown policy 'sarati'; did you mean 'sarathi'"):
        make_policy("sarati")
    with pytest.raises(InputError, match=r"'qqqqqq' \(kvsched policies lists them\)$"):
        make_policy("qqqqqq")
    with pytest.raises(InputError, match="unknown parameter chunk_size"):
        make_policy("sarathi", chunk_size=256)
    with pytest.raises(InputError, match="reinsert must be one of"):
        make_policy("vllm", reinsert="middle")
    with pytest.raises(InputError, match="prefill_budget must be a positive integer"):
        make_policy("sarathi", prefill_budget=0)
    assert make_policy("sarathi", prefill_budget=256).params["prefill_budget"] == 256


# ------------------------------------------------------------------ budgets


def budgets_after_reset(name: str, limits: Limits, **params) -> dict:
    policy = make_policy(name, **params)
    policy.reset(Instance((Request("a", 0.0, 1, 1),), limits))
    return dict(policy.params["effective"])


def test_budgets_come_from_the_instance_and_can_only_get_stricter():
    free = Limits(kv_capacity=100)
    assert budgets_after_reset("vllm", free) == {"C": DEFAULT_TOKEN_BUDGET, "P": 4096, "max_running": None}
    assert budgets_after_reset("sarathi", free) == {"C": 4096, "P": 512, "max_running": None}
    set_ = Limits(kv_capacity=100, max_batch_tokens=2048, max_prefill_tokens=1024, max_running=8)
    assert budgets_after_reset("vllm", set_) == {"C": 2048, "P": 1024, "max_running": 8}
    assert budgets_after_reset("sarathi-pc", set_) == {"C": 2048, "P": 1024, "max_running": 8}
    assert budgets_after_reset("sarathi", set_) == {"C": 2048, "P": 512, "max_running": 8}
    # A parameter can be stricter than the instance, never looser.
    stricter = dict(token_budget=100, prefill_budget=50, max_running=2)
    assert budgets_after_reset("vllm", set_, **stricter) == {"C": 100, "P": 50, "max_running": 2}
    looser = dict(token_budget=10**6, prefill_budget=10**6, max_running=100)
    assert budgets_after_reset("vllm", set_, **looser) == {"C": 2048, "P": 1024, "max_running": 8}


def test_sarathi_chunks_a_long_prompt_by_its_token_budget():
    inst = Instance((Request("long", 0.0, 20, 2),), Limits(kv_capacity=32), UNIT)
    result = simulate(inst, make_policy("sarathi", prefill_budget=8))
    assert [(b.tokens.tolist(), b.phases.tolist()) for b in result.schedule] == [
        ([8], [P]),
        ([8], [P]),
        ([4], [P]),
        ([1], [D]),
    ]


def test_a_stricter_max_running_is_obeyed():
    inst = synthetic(8, 0, Limits(kv_capacity=200), UNIT, prompt=Uniform(1, 6), output=Uniform(2, 6))
    result = simulate(inst, make_policy("sarathi", max_running=2))
    assert max(rec.num_running for rec in result.trace.records) == 2


# ------------------------------------------------------------------ group order and hybrid batching


def decoding_plus_arrivals() -> Instance:
    """A, B, C arrive first; D and E arrive while they decode (seed 001 Sec. 2.7 style)."""
    reqs = (
        Request("A", 0.0, 2, 3),
        Request("B", 0.0, 2, 5),
        Request("C", 0.0, 2, 4),
        Request("D", 1.5, 3, 2),
        Request("E", 1.5, 3, 2),
    )
    return Instance(reqs, Limits(kv_capacity=100), UNIT)


def compositions(schedule: Schedule) -> list[list[tuple[str, int, Phase]]]:
    names = "ABCDE"
    return [[(names[i.request], i.tokens, i.phase) for i in b.items()] for b in schedule]


def test_vllm_runs_waiting_prefills_alone():
    vllm = compositions(simulate(decoding_plus_arrivals(), make_policy("vllm")).schedule)
    assert vllm == [
        [("A", 2, P), ("B", 2, P), ("C", 2, P)],
        [("A", 1, D), ("B", 1, D), ("C", 1, D)],
        [("D", 3, P), ("E", 3, P)],  # prefill priority, no hybrid batches: the decodes wait
        [("A", 1, D), ("B", 1, D), ("C", 1, D), ("D", 1, D), ("E", 1, D)],
        [("B", 1, D), ("C", 1, D)],
        [("B", 1, D)],
    ]


def test_sarathi_gives_decodes_first_and_the_rest_of_p_to_prompt_chunks():
    sarathi = compositions(
        simulate(decoding_plus_arrivals(), make_policy("sarathi", prefill_budget=4)).schedule
    )
    assert sarathi == [
        [("A", 2, P), ("B", 2, P)],
        [("A", 1, D), ("B", 1, D), ("C", 2, P)],
        [("A", 1, D), ("B", 1, D), ("C", 1, D), ("D", 1, P)],  # P counts the decodes too
        [("B", 1, D), ("C", 1, D), ("D", 2, P)],
        [("B", 1, D), ("C", 1, D), ("D", 1, D), ("E", 1, P)],
        [("E", 2, P)],
        [("E", 1, D)],
    ]


def test_sarathi_nohy_runs_no_prefill_while_anything_decodes():
    nohy = compositions(simulate(decoding_plus_arrivals(), make_policy("sarathi-nohy")).schedule)
    assert nohy == [
        [("A", 2, P), ("B", 2, P), ("C", 2, P)],
        [("A", 1, D), ("B", 1, D), ("C", 1, D)],
        [("A", 1, D), ("B", 1, D), ("C", 1, D)],
        [("B", 1, D), ("C", 1, D)],
        [("B", 1, D)],
        [("D", 3, P), ("E", 3, P)],
        [("D", 1, D), ("E", 1, D)],
    ]


# ------------------------------------------------------------------ ranking (Sec. 4.6)


def ranked_instance() -> Instance:
    reqs = (
        Request("a", 0.0, 6, 1),
        Request("b", 0.0, 2, 3),
        Request("c", 0.0, 4, 2),
    )
    # P = 6 lets one prompt at a time start.
    return Instance(reqs, Limits(kv_capacity=100, max_prefill_tokens=6), UNIT)


@pytest.mark.parametrize(
    ("name", "first"),
    [("rank-org", "a"), ("rank-i", "b"), ("rank-o", "a")],
)
def test_rank_policies_start_the_top_ranked_request(name, first):
    inst = ranked_instance()
    schedule = simulate(inst, make_policy(name)).schedule
    first_item = schedule.batches[0].items()[0]
    assert inst.requests[first_item.request].id == first


def test_rank_i_orders_every_admission_by_prompt():
    inst = ranked_instance()
    schedule = simulate(inst, make_policy("rank-i", chunked=False)).schedule
    starts = {}
    for k, b in enumerate(schedule):
        for i in b.items():
            starts.setdefault(inst.requests[i.request].id, k)
    assert sorted(starts, key=starts.get) == ["b", "c", "a"]


# ------------------------------------------------------------------ eviction rules


def test_lowest_priority_victim_is_the_latest_arrival():
    # Three prompts fill M; the first decode needs a slot: the last arrival goes.
    reqs = tuple(Request(f"r{k}", 0.0, 3, 3) for k in range(3))
    inst = Instance(reqs, Limits(kv_capacity=9), UNIT)
    schedule = simulate(inst, make_policy("sarathi")).schedule
    first_eviction = next(b for b in schedule if b.evicted.size)
    assert first_eviction.evicted.tolist() == [2]


def test_sec6_keeps_long_requests_and_evicts_the_shortest():
    # r0 holds a long context, r1 and r2 short ones; memory is full when they decode.
    reqs = (
        Request("short", 0.0, 2, 6),
        Request("long", 0.0, 9, 3),
        Request("mid", 0.0, 4, 4),
    )
    inst = Instance(reqs, Limits(kv_capacity=16), UNIT)
    schedule = simulate(inst, make_policy("infermax-sec6")).schedule
    evicted = [int(r) for b in schedule for r in b.evicted]
    assert evicted and evicted[0] == 0  # the request holding the least KV
    decode_batches = [b for b in schedule if (b.phases == D).all() and b.size > 1]
    kv_order = decode_batches[0].requests.tolist()
    assert kv_order[0] == 1  # longest context decodes first
    sarathi = simulate(inst, make_policy("sarathi")).schedule
    assert next(int(r) for b in sarathi for r in b.evicted) == 2  # latest arrival


def test_sec6_histogram_estimate():
    policy = make_policy("infermax-sec6", warmup=3, quantile=0.9)
    policy.reset(Instance((Request("a", 0.0, 1, 1),), Limits(kv_capacity=10)))
    assert policy._output_estimate() is None
    for length in (5, 1, 9, 3):
        policy._observe(length)
    assert policy._output_estimate() == 9  # ceil(0.9 * 4) = 4th smallest of 1, 3, 5, 9
    for length in range(1, 21):
        policy._observe(length)
    assert policy._output_estimate() == 18


def test_sec6_reserves_the_estimated_peak_after_warm_up():
    # Identical requests (Fig. 15, I = 4): once one has completed, Ô = O and
    # admission reserves I + O - 1, so no later request is evicted.
    reqs = tuple(Request(f"r{k}", 0.0, 4, 4) for k in range(6))
    inst = Instance(reqs, Limits(kv_capacity=8), UNIT)
    warm = simulate(inst, make_policy("infermax-sec6", warmup=1))
    cold = simulate(inst, make_policy("infermax-sec6", warmup=100))
    assert warm.trace.state.evictions.sum() < cold.trace.state.evictions.sum()
    first_done = int(np.nanargmin(warm.trace.state.completion))
    later = warm.trace.state.first_scheduled > warm.trace.state.completion[first_done]
    assert warm.trace.state.evictions[later].sum() == 0


def test_a_waiting_request_that_does_not_fit_stops_admission_unless_probing():
    reqs = (Request("a", 0.0, 6, 3), Request("big", 0.0, 6, 1), Request("small", 0.0, 2, 1))
    inst = Instance(reqs, Limits(kv_capacity=10), UNIT)
    stop = simulate(inst, make_policy("sarathi")).schedule
    probe = simulate(inst, make_policy("sarathi", on_waiting_mfail="probe")).schedule
    assert stop.batches[0].requests.tolist() == [0]  # "big" does not fit: admission stops
    assert probe.batches[0].requests.tolist() == [0, 2]  # "small" is probed past it
    for schedule in (stop, probe):
        replay(inst, schedule, strict=True)
