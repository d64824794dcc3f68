"""The shared step loop (heuristics.step.Stepper): simulate runs it, coalesced runs are stepped batches."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate, simulate_engines
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.step import Stepper
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Batch, Run
from kvsched.schedule.validate import instance_cost_model


def online(n: int = 30, seed: int = 4) -> Instance:
    return synthetic(
        n,
        seed,
        Limits(kv_capacity=60, block_size=2),
        TimeModel("infermax-linear"),
        prompt=Uniform(1, 20),
        output=Uniform(1, 20),
        arrival=Poisson(20.0),
    )


def _drive(stepper: Stepper) -> None:
    """The loop of Stepper.run spelled with the split moves (decide, then commit)."""
    state, now = stepper.state, 0.0
    while not state.all_done:
        now = max(now, state.clock)
        entry = stepper.decide(now)
        if entry is None:
            upcoming = stepper.view.next_arrival()
            assert upcoming is not None
            now = upcoming
            continue
        stepper.commit(entry)


def _key(entry: Batch | Run) -> tuple[object, ...]:
    if type(entry) is Run:
        return ("run", entry.start, entry.end, entry.repeat, entry.requests.tolist())
    return (
        "batch",
        entry.start,
        entry.end,
        entry.requests.tolist(),
        entry.tokens.tolist(),
        entry.evicted.tolist(),
    )


@pytest.mark.parametrize("policy", ["sarathi", "vllm", "mcsf", "wait", "slai", "rad"])
def test_run_is_simulate_is_the_split_moves_is_stepped(policy: str) -> None:
    inst = online()
    cost = instance_cost_model(inst)
    want = simulate(inst, make_policy(policy), coalesce=False)
    stepper = Stepper(inst, make_policy(policy), cost)
    seen: list[object] = []
    stepper.run(seen.append)
    assert seen == stepper.records
    assert stepper.num_batches == len(want.schedule)
    got = stepper.batches
    assert len(got) == len(want.schedule)
    assert all(a.same_as(b, tol=0.0) for a, b in zip(got, want.schedule.batches, strict=True))
    assert [(r.start, r.end, r.num_tokens) for r in stepper.batch_records] == [
        (r.start, r.end, r.num_tokens) for r in want.trace.records
    ]
    for name in ("completion", "first_token", "evictions"):
        np.testing.assert_array_equal(getattr(stepper.state, name), getattr(want.trace.state, name))
    coalesced = simulate(inst, make_policy(policy))
    assert [_key(e) for e in coalesced.schedule.entries] == [_key(e) for e in stepper.entries]
    split = Stepper(inst, make_policy(policy), cost)
    _drive(split)
    assert [_key(e) for e in split.entries] == [_key(e) for e in stepper.entries]
    if policy in ("sarathi", "vllm"):
        assert any(type(e) is Run for e in stepper.entries)


def test_a_horizon_cuts_a_run_to_the_batches_decided_before_it_and_ended_by_it() -> None:
    inst = Instance(
        (Request("A", 0, 1, 40), Request("B", 0, 1, 40), Request("C", 100, 1, 2)),
        Limits(kv_capacity=200),
        TimeModel("unit"),
    )
    cost = instance_cost_model(inst)
    for horizon, repeats in ((None, 38), (30.0, 28), (30.5, 28), (2.0, 0)):
        stepper = Stepper(inst, make_policy("sarathi"), cost)
        stepper.commit(stepper.decide(0.0))  # both prefills: t = 1
        stepper.commit(stepper.decide(1.0, horizon=1.5))  # (no run fits) both decode: t = 2
        entry = stepper.decide(2.0, horizon=horizon)
        if repeats:
            assert type(entry) is Run and entry.repeat == repeats and entry.start == 2.0
        else:
            assert type(entry) is Batch and entry.start == 2.0
    # Right after the prefills (both finished their prompt), a run continues without a decision.
    for horizon, repeats in ((None, 39), (30.0, 29), (1.5, 0)):
        stepper = Stepper(inst, make_policy("sarathi"), cost)
        stepper.commit(stepper.decide(0.0))
        entry = stepper.decide(1.0, horizon=horizon)
        if repeats:
            assert type(entry) is Run and entry.repeat == repeats and entry.start == 1.0
        else:
            assert type(entry) is Batch and entry.start == 1.0


def test_one_engine_behind_a_balancer_steps_as_simulate() -> None:
    inst = online()
    res = simulate_engines(inst, "sarathi", engines=1, balancer="jlr")
    assert res.consistent == (True,)
    want = simulate(inst, make_policy("sarathi")).schedule
    assert all(a.same_as(b, tol=0.0) for a, b in zip(res.results[0].schedule, want, strict=True))


class _Scripted:
    """A policy that returns fixed decisions, then nothing."""

    name = "scripted"
    uses_true_output = False

    def __init__(self, *decisions: Decision) -> None:
        self.decisions = list(decisions)
        self.params: dict[str, object] = {}

    def reset(self, instance: Instance) -> None:
        pass

    def next_batch(self, view: SchedulerView) -> Decision | None:
        return self.decisions.pop(0) if self.decisions else None


def test_errors_are_the_simulators() -> None:
    inst = online(3)
    cost = instance_cost_model(inst)
    first = int(np.argmin([r.arrival for r in inst.requests]))
    with pytest.raises(KvschedError, match="scheduled nothing to run"):
        Stepper(inst, _Scripted(Decision([], [], [first])), cost).decide(1e9)
    with pytest.raises(KvschedError, match="stalled"):
        Stepper(inst, _Scripted(), cost).run()
    stepper = Stepper(inst, _Scripted(Decision([first], [1])), cost)
    stepper.limit = 0
    with pytest.raises(KvschedError, match="eviction loop"):
        stepper.decide(1e9)
