"""Seed 001 Sec. 4.1: K engines behind a load balancer, dispatched online, each engine validated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsched.cli import main
from kvsched.errors import InputError
from kvsched.heuristics import multiengine, simulate_engines
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.io import save_instance
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Run, Schedule
from kvsched.schedule.validate import replay

UNIT = TimeModel("unit")
LINEAR = TimeModel("infermax-linear")


def online(n: int = 40, seed: int = 2) -> Instance:
    return synthetic(
        n,
        seed,
        Limits(kv_capacity=120),
        LINEAR,
        prompt=Uniform(1, 40),
        output=Uniform(1, 30),
        arrival=Poisson(40.0),
    )


def test_random_dispatch_is_the_seeded_uniform_draw_and_every_engine_validates():
    inst = online()
    result = simulate_engines(inst, "sarathi", engines=3, balancer="random", seed=7)
    order = np.argsort([r.arrival for r in inst.requests], kind="stable")
    draws = np.random.default_rng(7).integers(3, size=len(inst))
    assert np.array_equal(result.dispatch[order], draws)
    for sub, res, trace in zip(result.engines, result.results, result.traces, strict=True):
        assert res is not None and trace is not None
        assert replay(sub, res.schedule, strict=True).state.all_done
        assert {r.id for r in sub.requests} == {
            inst.requests[k].id for k in np.flatnonzero(result.dispatch == int(sub.meta["engine"]))
        }
    frame = result.request_metrics()
    assert list(frame.index) == [r.id for r in inst.requests]
    assert np.array_equal(frame["engine"].to_numpy(), result.dispatch)
    summary = result.summary()
    assert summary["num_completed"] == len(inst) and sum(summary["requests_per_engine"]) == len(inst)
    assert summary["makespan"] == max(t.state.clock for t in result.traces if t is not None)


def test_join_least_requests_hand_case():
    """A (O = 10) and B (O = 1) at 0, C and D at 3 (unit batches).

    A goes to engine 0 (tie: lowest index), B to the idle engine 1. At t = 3 B has
    completed (t = 1) but A has not: C goes to engine 1; then both engines hold one
    unfinished request and D goes to engine 0.
    """
    reqs = (Request("A", 0, 1, 10), Request("B", 0, 1, 1), Request("C", 3, 1, 2), Request("D", 3, 1, 1))
    inst = Instance(reqs, Limits(kv_capacity=100), UNIT)
    assert simulate_engines(inst, "sarathi", engines=2, balancer="jlr").dispatch.tolist() == [0, 1, 1, 0]


def test_join_least_outstanding_tokens_counts_what_the_engine_knows():
    """A has a 20-token prompt to prefill, B and C decode 30 tokens (C = 2 tokens per batch).

    JLR sends C to engine 0 (one request each); JLOT (known tokens) sends it to engine 1,
    where only B's 1-token prompt is outstanding against A's 20; with the true output
    lengths B's 30 tokens outweigh A's 21 and C goes to engine 0 again.
    """
    reqs = (Request("A", 0, 20, 2), Request("B", 0, 1, 30), Request("C", 0, 1, 30))
    inst = Instance(reqs, Limits(kv_capacity=100, max_batch_tokens=2), UNIT)
    assert simulate_engines(inst, "sarathi", engines=2, balancer="jlr").dispatch.tolist() == [0, 1, 0]
    assert simulate_engines(inst, "sarathi", engines=2, balancer="jlot").dispatch.tolist() == [0, 1, 1]
    true = simulate_engines(inst, "sarathi", engines=2, balancer="jlot", lengths="true")
    assert true.dispatch.tolist() == [0, 1, 0]


@pytest.mark.parametrize("policy", ["sarathi", "vllm-v1", "slai", "rad"])
def test_jlr_choices_are_the_least_loaded_engine_in_the_reported_runs(policy):
    """Recomputed from the final runs alone: each arrival joined an engine with the fewest unfinished requests."""
    inst = online(60, 3)
    result = simulate_engines(inst, policy, engines=3, balancer="jlr")
    assert all(result.consistent)
    completion = np.full(len(inst), np.nan)
    for sub, trace in zip(result.engines, result.traces, strict=True):
        assert trace is not None
        index = inst.index_of()
        for k, r in enumerate(sub.requests):
            completion[index[r.id]] = trace.state.completion[k]
    arrival = np.array([r.arrival for r in inst.requests])
    sent: list[list[int]] = [[], [], []]
    for j in np.argsort(arrival, kind="stable").tolist():
        loads = [sum(completion[i] > arrival[j] + 1e-9 for i in s) for s in sent]
        assert result.dispatch[j] == int(np.argmin(loads))
        sent[result.dispatch[j]].append(j)
    assert len(set(result.dispatch.tolist())) == 3


def test_bad_balancer_input_is_one_clear_error():
    inst = online(5)
    with pytest.raises(InputError, match=r"engines must be a whole number in 1\.\.10,000, got 0"):
        simulate_engines(inst, "sarathi", engines=0)
    # 10^8 engines built their states for minutes before the first request was dispatched.
    with pytest.raises(InputError, match="got 100000000"):
        simulate_engines(inst, "sarathi", engines=10**8)
    with pytest.raises(InputError, match="balancer must be one of random, jlr, jlot"):
        simulate_engines(inst, "sarathi", engines=2, balancer="power-of-two")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="lengths=predicted: some requests carry no predicted_output"):
        simulate_engines(inst, "sarathi", engines=2, balancer="jlot", lengths="predicted")
    with pytest.raises(InputError, match=r"seed \(--balancer-seed\) must be a whole number >= 0, got -1"):
        simulate_engines(
            inst, "sarathi", engines=2, balancer="random", seed=-1
        )  # was numpy's ValueError: exit 3


def test_cli_simulate_on_several_engines(tmp_path, capsys):
    inst = online(20)
    path = tmp_path / "inst.json"
    save_instance(inst, path)
    out = tmp_path / "sched.json"
    csv = tmp_path / "req.csv"
    args = ["simulate", str(path), "-p", "slai", "--engines", "2", "--balancer", "jlot", "-o", str(out)]
    assert main([*args, "--requests-csv", str(csv)]) == 0
    text = capsys.readouterr().out
    assert "slai on 2 engines (jlot)" in text and "every engine's schedule validated" in text
    written = sorted(p.name for p in tmp_path.glob("sched.engine*.json"))
    assert written == ["sched.engine0.json", "sched.engine1.json"]
    assert json.loads((tmp_path / written[0]).read_text())["batches"]
    assert csv.read_text().splitlines()[0].startswith("id,engine,")


@pytest.mark.parametrize(
    ("policy", "engines", "balancer"),
    [("sarathi", 2, "jlr"), ("vllm", 3, "jlot"), ("slai", 2, "jlot"), ("wait", 4, "jlr"), ("rad", 3, "jlr")],
)
def test_coalesced_lock_step_dispatches_as_stepped(policy, engines, balancer, monkeypatch):
    """Runs in the lock-step run are cut at the next dispatch: the balancer sees the same states."""
    live = []
    init = multiengine._LiveEngine.__init__

    def spy(self, *args):
        init(self, *args)
        live.append(self)

    monkeypatch.setattr(multiengine._LiveEngine, "__init__", spy)
    inst = online(60, seed=5)
    got = simulate_engines(inst, policy, engines=engines, balancer=balancer)
    runs = sum(type(e) is Run for eng in live for e in eng.stepper.entries)
    want = simulate_engines(inst, policy, engines=engines, balancer=balancer, coalesce=False)
    assert got.dispatch.tolist() == want.dispatch.tolist()
    assert got.consistent == want.consistent
    for k in range(engines):
        a, b = Schedule(tuple(live[k].entries)).batches, Schedule(tuple(live[engines + k].entries)).batches
        assert len(a) == len(b) and all(x.same_as(y, tol=0.0) for x, y in zip(a, b, strict=True))
    for a, b in zip(got.results, want.results, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert all(
                x.same_as(y, tol=0.0) for x, y in zip(a.schedule.batches, b.schedule.batches, strict=True)
            )
            assert len(a.schedule) == len(b.schedule)
    if policy in ("sarathi", "vllm"):
        assert runs  # the lock-step run coalesced
