"""The shared step loop (heuristics.step.Stepper): the same batches as simulate, the same errors."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate, simulate_engines
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.step import Stepper
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.model import Instance, Limits, TimeModel
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


@pytest.mark.parametrize("policy", ["sarathi", "vllm", "mcsf", "wait"])
def test_run_is_simulate(policy: str) -> None:
    inst = online()
    want = simulate(inst, make_policy(policy))
    stepper = Stepper(inst, make_policy(policy), instance_cost_model(inst))
    seen = []
    stepper.run(seen.append)
    got = stepper.batches
    assert len(got) == len(want.schedule)
    assert all(a.same_as(b, tol=0.0) for a, b in zip(got, want.schedule.batches, strict=True))
    assert [(r.start, r.end, r.num_tokens) for r in stepper.records] == [
        (r.start, r.end, r.num_tokens) for r in want.trace.records
    ]
    assert seen == stepper.records
    for name in ("completion", "first_token", "evictions"):
        np.testing.assert_array_equal(getattr(stepper.state, name), getattr(want.trace.state, name))


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
