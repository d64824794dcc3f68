"""Mixed runs that start with the decision's own batch (ChunksAhead): same batches, fewer entries."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.errors import KvschedError
from kvsched.heuristics import list_policies, make_policy, simulate
from kvsched.heuristics.base import chunks_ahead
from kvsched.heuristics.infermax import InferMax
from kvsched.instances.generators import LogNormal, Poisson, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState, Rule, ScheduleError
from kvsched.schedule.ir import Batch, Run
from kvsched.schedule.validate import instance_cost_model, replay
from tests.test_continue_runs import BOOKS, _calls, _get
from tests.test_runs import INSTANCES, stepped_or_same_failure
from tests.test_simulator_equivalence import assert_same_state

AHEAD = [s.name for s in list_policies() if chunks_ahead(make_policy(s.name)) is not None]


def _long_prompts():
    """Prompts of several chunks arriving over time (most decisions are a decodes-and-chunk batch)."""
    lengths = dict(
        prompt=LogNormal.from_mean(400, sigma=0.8, max=1500),
        output=LogNormal.from_mean(50, sigma=1.0, max=300),
    )
    calibrated = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))
    return {
        "long-calibrated": synthetic(
            70, 4, Limits(6000, 1, 256), calibrated, arrival=Poisson(4.0), **lengths
        ),
        "long-paged-running": synthetic(
            70,
            5,
            Limits(4000, 16, 192, max_running=8),
            TimeModel("infermax-linear"),
            arrival=Poisson(30.0),
            **lengths,
        ),
    }


CASES = {**INSTANCES, **_long_prompts()}


def _without_ahead(policy):
    """``policy`` with its ``chunks_ahead`` hidden (the batch, then repeats, as before the offer)."""
    policy.chunks_ahead = None
    return policy


def test_sarathi_and_its_variants_opt_in_and_the_default_is_no():
    assert {"sarathi", "sarathi-ef", "sarathi-pc", "sarathi-pc-ef", "infermax-sec6"} <= set(AHEAD)
    assert chunks_ahead(make_policy("class-priority")) is None  # a wrapper does not inherit it
    assert chunks_ahead(make_policy("mcsf-alg1")) is None
    assert chunks_ahead(InferMax(chunked=False)) is None
    assert chunks_ahead(InferMax(priority="prefill")) is None


def test_a_prompt_of_two_chunks_is_one_run_with_its_last_chunk():
    """A decodes; B arrives with 12 prompt tokens and takes 7 then 5 (C = 8): one decision, one run
    of both chunks, where a run after the first chunk could not hold the last alone."""
    inst = Instance(
        (Request("A", 0.0, 3, 30), Request("B", 5.0, 12, 4)),
        Limits(kv_capacity=1000, max_batch_tokens=8),
        TimeModel("unit"),
    )
    plain = simulate(inst, make_policy("sarathi"), coalesce=False)
    policy = _calls(make_policy("sarathi"))
    fast = simulate(inst, policy)
    assert fast.schedule.same_as(plain.schedule, tol=0.0)
    assert_same_state(replay(inst, fast.schedule).state, plain.trace.state)
    mixed = [e for e in fast.schedule.entries if type(e) is Run and e.chunk is not None]
    assert len(mixed) == 1
    run = mixed[0]
    assert run.start == 5.0 and run.repeat == 2 and run.requests.tolist() == [0]
    assert (run.chunk.request, run.chunk.tokens, run.chunk.last) == (1, 7, 5)
    before = simulate(inst, _calls(_without_ahead(make_policy("sarathi"))))
    assert before.schedule.same_as(plain.schedule, tol=0.0)
    assert len(fast.schedule.entries) < len(before.schedule.entries)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("policy", AHEAD)
def test_runs_ahead_keep_the_batches_and_the_policys_bookkeeping(name, policy):
    inst = CASES[name]
    plain_policy, fast_policy = make_policy(policy), make_policy(policy)
    plain = stepped_or_same_failure(inst, policy, plain_policy)
    if plain is None:
        return
    fast = simulate(inst, fast_policy)
    before = simulate(inst, _without_ahead(make_policy(policy)))
    assert fast.schedule.same_as(plain.schedule, tol=0.0)
    assert before.schedule.same_as(plain.schedule, tol=0.0)
    assert_same_state(fast.trace.state, plain.trace.state)
    assert_same_state(replay(inst, fast.schedule).state, plain.trace.state)
    for attr in BOOKS:
        a, b = _get(fast_policy, attr), _get(plain_policy, attr)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, attr
    # Each run ahead replaced a batch and the run of its repeats (or the batch of the prompt's last chunk).
    assert len(fast.schedule.entries) <= len(before.schedule.entries)
    assert sum(type(e) is Batch for e in fast.schedule.entries) <= sum(
        type(e) is Batch for e in before.schedule.entries
    )


@pytest.mark.parametrize("name", ["long-calibrated", "long-paged-running"])
def test_some_runs_ahead_are_taken(name):
    inst = CASES[name]
    fast = simulate(inst, make_policy("sarathi")).schedule.entries
    before = simulate(inst, _without_ahead(make_policy("sarathi"))).schedule.entries
    # Every batch that a run ahead took in was a decision's batch that the old path stored alone.
    assert sum(type(e) is Batch for e in fast) < 0.9 * sum(type(e) is Batch for e in before)


def _decoding_then_a_long_prompt() -> Instance:
    """A decodes alone until B's 40-token prompt arrives and goes in chunks beside it (C = 8)."""
    return Instance(
        (Request("A", 0.0, 3, 30), Request("B", 5.0, 40, 4)),
        Limits(kv_capacity=1000, max_batch_tokens=8),
        TimeModel("unit"),
    )


def test_an_answer_without_a_plan_is_refused():
    inst = _decoding_then_a_long_prompt()
    policy = make_policy("sarathi")
    policy.chunks_ahead = lambda view, decision, limit: 3  # never plans
    with pytest.raises(KvschedError, match="without planning"):
        simulate(inst, policy)


def test_an_answer_past_the_plan_is_refused():
    inst = _decoding_then_a_long_prompt()
    policy = make_policy("sarathi")
    policy.chunks_ahead = lambda view, decision, limit: limit() + 1
    with pytest.raises(ValueError, match="outside the plan"):
        simulate(inst, policy)


def test_a_made_run_checks_the_arrival_of_its_chunks_request_only():
    """A run made from the clock: its decodes were scheduled before (so arrived), its chunk's request may not
    have arrived yet; a run that starts before the clock (within the tolerance) checks every item."""
    inst = Instance(
        (Request("A", 0.0, 3, 30), Request("B", 50.0, 40, 4)),
        Limits(kv_capacity=1000, max_batch_tokens=8),
        TimeModel("unit"),
    )
    state = EngineState(inst, instance_cost_model(inst))
    state.step(state.make_batch(0.0, [0], [3]))  # A's prompt: A decodes from now on
    early = np.array([0, 1], dtype=np.int64)  # A, then a chunk of B, which arrives at 50
    assert state.plan_run(early, 7)[0] >= 2
    run = state.make_run(state.clock, early, 2, 7)
    violations = state.check_run(run)
    assert violations and {v.rule for v in violations} == {Rule.BEFORE_ARRIVAL}
    with pytest.raises(ScheduleError):
        state.step_run(run)
    decodes = np.array([0], dtype=np.int64)
    assert state.plan_run(decodes)[0] >= 5
    state.step_run(state.make_run(state.clock, decodes, 5))  # A alone: arrived (it was scheduled at 0)
    assert int(state.generated[0]) == 6
