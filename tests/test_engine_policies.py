"""The engine policies (vLLM v1, Orca, FasterTransformer) and seed 001's K-FCFS family.

Every schedule they produce is replayed through the validator: on the battery
of ``tests/test_policies.py``, with each memory and budget knob, and on random
instances. Then each policy's defining rules are checked on small cases.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given

from kvsched.costmodel import UnitCost
from kvsched.errors import InputError, KvschedError
from kvsched.heuristics import POLICIES, HindsightError, make_policy, simulate
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.kfcfs import KFCFS
from kvsched.instances.generators import Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Phase, Schedule
from kvsched.schedule.validate import replay
from tests.strategies import SETTINGS, instances
from tests.test_policies import KINDS, battery_instance

P, D, R = Phase.PREFILL, Phase.DECODE, Phase.REFILL
UNIT = TimeModel("unit")
NEW = ["vllm-v1", "orca", "fastertransformer", "kfcfs", "kfcfs-sp", "kfcfs-sr"]
#: Every policy once more with each knob that changes how it uses memory or budgets.
VARIANTS = [
    ("vllm-v1", {"max_num_seqs": 3, "long_prefill_threshold": 2}),
    ("vllm-v1", {"token_budget": 6}),
    ("orca", {"max_seq_len": None}),
    ("orca", {"max_seq_len": 4}),  # below most peaks: reservations grow and preempt
    ("orca", {"chunk_prefill": False, "max_seq_len": 6, "max_batch_size": 3}),
    ("fastertransformer", {"max_seq_len": None}),
    ("fastertransformer", {"max_seq_len": 4, "max_batch_size": 2}),
    ("kfcfs", {"k_prefill": 1, "k_decode": 2}),
    ("kfcfs-sp", {"k_decode": 1}),
    ("kfcfs-sr", {"lengths": "predicted"}),
]
#: Policies that run whole prompts and refills only.
WHOLE = {"fastertransformer"}


def with_predictions(inst: Instance) -> Instance:
    """``inst`` with a deterministic, wrong-ish prediction on every request."""
    reqs = tuple(
        Request(r.id, r.arrival, r.prompt, r.output, predicted_output=1 + (3 * k) % 7)
        for k, r in enumerate(inst.requests)
    )
    return Instance(reqs, inst.limits, inst.time_model, inst.name)


@cache
def run(name: str, kind: str, params: tuple[tuple[str, object], ...] = ()) -> tuple[Instance, Schedule]:
    inst = with_predictions(battery_instance(kind))
    return inst, simulate(inst, make_policy(name, **dict(params))).schedule


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NEW)
def test_every_new_policy_passes_the_validator_on_the_battery(name, kind):
    inst, schedule = run(name, kind)
    trace = replay(inst, schedule, strict=True)
    assert trace.state.all_done
    assert schedule.meta["policy"] == name


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda x: str(x))
def test_every_knob_passes_the_validator_on_the_battery(name, params):
    evictions = 0
    for kind in KINDS:
        inst, schedule = run(name, kind, tuple(sorted(params.items())))
        trace = replay(inst, schedule, strict=True)
        assert trace.state.all_done
        evictions += int(trace.state.evictions.sum())
    assert evictions > 0  # each variant meets memory pressure somewhere in the battery


def test_orca_and_fastertransformer_reserve_so_much_that_they_never_preempt_on_the_battery():
    # Their default reservation (4096 tokens, capped at M) is the whole cache of these instances:
    # one request at a time, never a preemption.
    for name in ("orca", "fastertransformer"):
        for kind in KINDS:
            _, schedule = run(name, kind)
            assert not any(b.evicted.size for b in schedule)
            assert max(b.size for b in schedule) == 1


@pytest.mark.parametrize("name", sorted(set(NEW) - WHOLE))
def test_chunking_policies_run_prompts_longer_than_p(name):
    inst = battery_instance("small-p")
    schedule = simulate(inst, make_policy(name)).schedule
    trace = replay(inst, schedule, strict=True)
    assert max(rec.prefill_tokens for rec in trace.records) <= 8


@pytest.mark.parametrize(("name", "params"), [("fastertransformer", {}), ("orca", {"chunk_prefill": False})])
def test_whole_prompt_policies_say_why_they_cannot_run_long_prompts(name, params):
    with pytest.raises(
        KvschedError, match=r"processes whole prompts .* more than the budget \(C = 4096, P = 8\)"
    ):
        simulate(battery_instance("small-p"), make_policy(name, **params))


@SETTINGS
@given(inst=instances(max_requests=7, max_prompt=14, max_output=8))
def test_random_instances_replay(inst):
    predicted = with_predictions(inst)
    for name, params in [*((n, {}) for n in NEW), *VARIANTS]:
        policy = make_policy(name, **params)
        try:
            schedule = simulate(predicted, policy).schedule
        except KvschedError as exc:
            # Whole-prompt policies cannot run a prompt or refill above the budgets; nothing else may fail.
            budget = min(inst.limits.max_batch_tokens or 4096, inst.limits.max_prefill_tokens or 4096)
            assert "processes whole prompts" in str(exc), exc
            assert max(r.prompt + r.output - 1 for r in inst.requests) > budget
            continue
        replay(predicted, schedule, strict=True)


# ------------------------------------------------------------------ registry


def test_registry_declares_hindsight_honestly():
    for name in NEW:
        spec = POLICIES[name]
        assert spec.description and spec.source.startswith("seed 001")
    hindsight = {name for name in NEW if make_policy(name).uses_true_output}
    assert hindsight == {"kfcfs-sr"}
    assert not make_policy("kfcfs-sr", lengths="predicted").uses_true_output
    assert not make_policy("kfcfs-sp", lengths="true").uses_true_output  # shortest prompt reads no O


def test_a_policy_that_reads_true_lengths_without_declaring_it_is_stopped():
    class Sneaky(KFCFS):
        uses_true_output = False  # lies

        def __init__(self) -> None:
            super().__init__("sneaky", order="shortest-remaining")
            self.uses_true_output = False

    inst = battery_instance("semi-online")
    with pytest.raises(HindsightError):
        simulate(inst, Sneaky())


def test_predicted_lengths_need_predictions():
    with pytest.raises(KvschedError, match="carry no predicted_output"):
        simulate(battery_instance("semi-online"), make_policy("kfcfs-sr", lengths="predicted"))


def test_make_policy_rejects_bad_parameters():
    with pytest.raises(InputError, match="max_num_seqs must be a positive integer"):
        make_policy("vllm-v1", max_num_seqs=0)
    with pytest.raises(InputError, match="unknown parameter chunked"):
        make_policy("orca", chunked=True)
    with pytest.raises(InputError, match="order must be one of"):
        make_policy("kfcfs", order="lifo")
    with pytest.raises(InputError, match="lengths must be one of"):
        make_policy("kfcfs-sr", lengths="oracle")
    with pytest.raises(InputError, match="chunk_prefill must be true or false"):
        make_policy("orca", chunk_prefill="yes")


def test_params_and_budgets_are_recorded():
    inst = Instance((Request("a", 0.0, 1, 1),), Limits(kv_capacity=10, max_batch_tokens=64, max_running=5))
    result = simulate(inst, make_policy("vllm-v1", max_num_seqs=8))
    params = result.schedule.meta["params"]
    assert params["max_num_seqs"] == 8
    assert params["effective"] == {"C": 64, "P": 64, "max_running": 5}


# ------------------------------------------------------------------ behaviour


def items(inst: Instance, schedule: Schedule) -> list[tuple[list[tuple[str, int, Phase]], list[str]]]:
    ids = [r.id for r in inst.requests]
    return [
        ([(ids[i.request], i.tokens, i.phase) for i in b.items()], [ids[e] for e in b.evicted.tolist()])
        for b in schedule
    ]


def test_vllm_v1_preempts_the_newest_and_admits_nothing_in_a_step_that_preempted():
    # Three prompts fill M = 9; from then on every decode needs a slot.
    inst = Instance(tuple(Request(f"r{k}", 0.0, 3, 4) for k in range(3)), Limits(kv_capacity=9), UNIT)
    got = items(inst, simulate(inst, make_policy("vllm-v1")).schedule)
    assert got[:5] == [
        ([("r0", 3, P), ("r1", 3, P), ("r2", 3, P)], []),
        ([("r0", 1, D), ("r1", 1, D)], ["r2"]),  # the newest goes so that r0 can decode
        ([("r0", 1, D)], ["r1"]),  # nobody newer is left outside the batch: r1 preempts itself
        ([("r0", 1, D)], []),  # no preemption, but r1's refill (5 tokens) does not fit: it waits
        ([("r1", 5, R), ("r2", 4, R)], []),  # r1 was re-queued in front of r2
    ]


def test_vllm_v1_runs_running_requests_first_and_chunks_waiting_prompts_into_the_rest():
    reqs = (Request("old", 0.0, 10, 3), Request("new", 1.0, 10, 2))
    inst = Instance(reqs, Limits(kv_capacity=100, max_batch_tokens=6), UNIT)
    got = items(inst, simulate(inst, make_policy("vllm-v1")).schedule)
    assert got[:4] == [
        ([("old", 6, P)], []),
        ([("old", 4, P), ("new", 2, P)], []),  # the running prompt continues first
        ([("old", 1, D), ("new", 5, P)], []),
        ([("old", 1, D), ("new", 3, P)], []),
    ]


def test_vllm_v1_long_prefill_threshold_and_max_num_seqs():
    reqs = tuple(Request(f"r{k}", 0.0, 5, 2) for k in range(4))
    inst = Instance(reqs, Limits(kv_capacity=100), UNIT)
    schedule = simulate(inst, make_policy("vllm-v1", long_prefill_threshold=2, max_num_seqs=2)).schedule
    trace = replay(inst, schedule)
    assert max(rec.num_running for rec in trace.records) == 2
    assert {i.tokens for b in schedule for i in b.items() if i.phase != D} == {1, 2}
    assert items(inst, schedule)[0] == ([("r0", 2, P), ("r1", 2, P)], [])


def test_orca_reservations_bound_how_many_requests_run():
    reqs = tuple(Request(f"r{k}", 0.0, 2, 3) for k in range(3))
    inst = Instance(reqs, Limits(kv_capacity=20), UNIT)
    capped = items(inst, simulate(inst, make_policy("orca", max_seq_len=8)).schedule)
    assert capped[0] == ([("r0", 2, P), ("r1", 2, P)], [])  # 2 x 8 reserved; r2 needs 8 more of 4 free
    assert capped[3] == ([("r2", 2, P)], [])  # admitted once r0 and r1 have finished
    free = items(inst, simulate(inst, make_policy("orca", max_seq_len=None)).schedule)
    assert free[0] == ([("r0", 2, P), ("r1", 2, P), ("r2", 2, P)], [])


def test_orca_runs_prompts_before_decodes_and_splits_the_one_at_the_budget():
    reqs = (Request("a", 0.0, 2, 4), Request("b", 0.0, 2, 4), Request("c", 1.0, 7, 2))
    inst = Instance(reqs, Limits(kv_capacity=10**5, max_batch_tokens=5), UNIT)
    got = items(inst, simulate(inst, make_policy("orca")).schedule)
    assert got[:3] == [
        ([("a", 2, P), ("b", 2, P)], []),
        ([("c", 5, P)], []),  # c's prompt takes the whole budget: a and b wait
        ([("c", 2, P), ("a", 1, D), ("b", 1, D)], []),
    ]
    # Whole prompts only (the real Orca): c's 7 tokens never fit a budget of 5 ...
    with pytest.raises(KvschedError, match="processes whole prompts"):
        simulate(inst, make_policy("orca", chunk_prefill=False))
    # ... and with a budget of 8 they go first and one decode fills the batch.
    roomy = Instance(reqs, Limits(kv_capacity=10**5, max_batch_tokens=8), UNIT)
    whole = items(roomy, simulate(roomy, make_policy("orca", chunk_prefill=False)).schedule)
    assert whole[1] == ([("c", 7, P), ("a", 1, D)], [])


def test_fastertransformer_starts_a_cohort_only_when_nothing_decodes():
    reqs = (
        Request("a", 0.0, 2, 2),
        Request("b", 0.0, 2, 4),
        Request("c", 0.5, 1, 2),
        Request("d", 0.5, 1, 2),
    )
    inst = Instance(reqs, Limits(kv_capacity=10**5), UNIT)
    got = items(inst, simulate(inst, make_policy("fastertransformer")).schedule)
    assert got == [
        ([("a", 2, P), ("b", 2, P)], []),
        ([("a", 1, D), ("b", 1, D)], []),
        ([("b", 1, D)], []),
        ([("b", 1, D)], []),
        ([("c", 1, P), ("d", 1, P)], []),
        ([("c", 1, D), ("d", 1, D)], []),
    ]
    capped = items(inst, simulate(inst, make_policy("fastertransformer", max_batch_size=1)).schedule)
    assert capped[0] == ([("a", 2, P)], [])


def ranked() -> Instance:
    reqs = (
        Request("a", 0.0, 6, 1, predicted_output=1),  # 6 tokens to process
        Request("b", 0.0, 2, 8, predicted_output=2),  # 9 (3 predicted)
        Request("c", 0.0, 4, 1, predicted_output=10),  # 4 (13 predicted)
    )
    return Instance(reqs, Limits(kv_capacity=100, max_batch_tokens=4), UNIT)


@pytest.mark.parametrize(
    ("name", "params", "first"),
    [
        ("kfcfs", {}, [("a", 4, P)]),  # arrival order; the prompt meeting the budget is split
        ("kfcfs-sp", {}, [("b", 2, P), ("c", 2, P)]),  # shortest prompts
        ("kfcfs-sr", {}, [("c", 4, P)]),  # fewest tokens left, by the true O
        ("kfcfs-sr", {"lengths": "predicted"}, [("b", 2, P), ("a", 2, P)]),  # ... by the predictions
        ("kfcfs-sp", {"k_prefill": 1}, [("a", 4, P)]),  # only the oldest prompt is eligible
    ],
)
def test_kfcfs_orders(name, params, first):
    inst = ranked()
    assert items(inst, simulate(inst, make_policy(name, **params)).schedule)[0] == (first, [])


def test_kfcfs_k_decode_caps_the_decodes_per_batch():
    inst = synthetic(6, 0, Limits(kv_capacity=200), UNIT, prompt=Uniform(1, 3), output=Uniform(4, 8))
    schedule = simulate(inst, make_policy("kfcfs", k_decode=2)).schedule
    assert max(int((b.phases == D).sum()) for b in schedule) == 2
    replay(inst, schedule, strict=True)


def test_kfcfs_preempts_lower_ranked_requests_only():
    # M = 8 holds two prompts of 4; the shorter-output request ranks first under shortest-remaining
    # and, when it needs a slot, the other is preempted, never itself.
    reqs = (Request("long", 0.0, 4, 5), Request("short", 0.0, 4, 3))
    inst = Instance(reqs, Limits(kv_capacity=8), UNIT)
    got = items(inst, simulate(inst, make_policy("kfcfs-sr")).schedule)
    assert got[:2] == [
        ([("short", 4, P), ("long", 4, P)], []),
        ([("short", 1, D)], ["long"]),
    ]


def test_kfcfs_falls_back_to_the_top_request_alone():
    # k_prefill = 1 makes the old, long prompt y the only eligible request, but x (shorter, so ranked
    # above y and never its victim) holds the KV y needs. Rather than idle, y runs alone and x's KV
    # is dropped.
    reqs = (Request("y", 0.0, 6, 1), Request("x", 1.0, 2, 2))
    inst = Instance(reqs, Limits(kv_capacity=6), UNIT)
    state = EngineState(inst, UnitCost())
    state.apply(state.make_batch(1.0, [1], [1]))  # x has processed half its prompt
    policy = make_policy("kfcfs-sp", k_prefill=1)
    policy.reset(inst)
    view = SchedulerView(state)
    view._advance(state.clock)
    assert policy.next_batch(view) == Decision([0], [6], [1])
