"""Coalesced decode runs: the same batches as batch-by-batch simulation, checked by the core.

A policy that opts in (``repeat_decodes``) lets the simulator store a steady
stretch of decode-only batches as one :class:`~kvsched.schedule.ir.Run`. Here
every opted-in policy runs with and without coalescing on instances with
arrivals over time, paged blocks, budgets and evictions, and the two must give
bit-identical batches, records, final states and metrics; the validator must
accept the coalesced schedule on its own; the cost models' closed forms must
equal their per-batch prices; and an illegal run must be reported exactly as
its batches would be.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.costmodel import REGISTRY, BatchView, make_cost_model
from kvsched.costmodel.base import decode_run_times
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.errors import InputError
from kvsched.heuristics import list_policies, make_policy, simulate
from kvsched.heuristics.base import Policy, steady_decodes
from kvsched.instances.generators import LogNormal, Poisson, SemiOnline, synthetic
from kvsched.instances.model import Instance, Limits, TimeModel
from kvsched.schedule.core import EngineState, Rule, ScheduleError
from kvsched.schedule.io import load_schedule, save_schedule
from kvsched.schedule.ir import Run, Schedule
from kvsched.schedule.metrics import batch_metrics, request_metrics, run_metrics
from kvsched.schedule.validate import replay, validate
from tests.test_simulator_equivalence import assert_same_record, assert_same_state

STEADY = [s.name for s in list_policies() if steady_decodes(make_policy(s.name)) is not None]


def _instances():
    calibrated = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))
    lengths = dict(
        prompt=LogNormal.from_mean(150, sigma=0.8, max=500),
        output=LogNormal.from_mean(60, sigma=1.0, max=400),
    )
    return {
        "poisson-calibrated": synthetic(
            60, 1, Limits(2500, 1, 1024), calibrated, arrival=Poisson(6.0), **lengths
        ),
        "paged-budgets": synthetic(
            60,
            2,
            Limits(1800, 16, 256, max_prefill_tokens=128, max_running=12),
            TimeModel("infermax-linear"),
            arrival=Poisson(40.0),
            predict_sigma=0.5,
            **lengths,
        ),
        "tight-unit": synthetic(
            50, 3, Limits(1500, 1, 1024), TimeModel("unit"), arrival=SemiOnline(), **lengths
        ),
    }


INSTANCES = _instances()


def stepped_or_same_failure(inst: Instance, policy: str, stepped_policy: Policy | None = None):
    """``policy`` simulated batch by batch (``stepped_policy``: that instance of it), or None where it cannot
    run ``inst``, after checking that the coalesced simulation fails the same way. The core rejecting a
    batch (ScheduleError) is a bug, never a policy's limit: it propagates."""
    try:
        return simulate(inst, stepped_policy or make_policy(policy), coalesce=False)
    except ScheduleError:
        raise
    except Exception as exc:
        with pytest.raises(type(exc)):
            simulate(inst, make_policy(policy))
        return None


class Stepped:
    """``inner`` without its run offers: a policy that did not opt in (stepped batch by batch)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name, self.uses_true_output, self.params = inner.name, inner.uses_true_output, inner.params

    def reset(self, instance: Instance) -> None:
        self.inner.reset(instance)

    def next_batch(self, view):
        return self.inner.next_batch(view)


def test_the_infermax_family_and_seed_004_opt_in():
    assert {"sarathi", "vllm", "sarathi-ef", "rank-i", "infermax-sec6"} <= set(STEADY)
    assert {"mcsf-alg1", "mcsf", "alpha-greedy", "alpha-beta"} <= set(STEADY)
    assert steady_decodes(Stepped(make_policy("mcsf"))) is None  # the default is "no"


@pytest.mark.parametrize("name", sorted(INSTANCES))
@pytest.mark.parametrize("policy", STEADY)
def test_coalesced_runs_give_the_same_batches_records_and_state(name, policy):
    inst = INSTANCES[name]
    plain = stepped_or_same_failure(inst, policy)
    if plain is None:
        return
    fast = simulate(inst, make_policy(policy))
    assert fast.schedule.same_as(plain.schedule, tol=0.0)
    assert len(fast.schedule) == len(plain.schedule)
    evicted = sum(r.num_evicted for r in plain.trace.records)
    assert fast.schedule.num_evictions == plain.schedule.num_evictions == evicted  # runs need no spelling out
    assert fast.schedule.meta == plain.schedule.meta
    for a, b in zip(fast.trace.records, plain.trace.records, strict=True):
        assert_same_record(a, b)
    assert_same_state(fast.trace.state, plain.trace.state)
    # Metrics straight from the runs equal those of the batches.
    assert run_metrics(fast.trace) == run_metrics(plain.trace)
    assert batch_metrics(fast.trace).equals(batch_metrics(plain.trace))
    assert request_metrics(fast.trace).equals(request_metrics(plain.trace))
    # The validator accepts the coalesced schedule on its own and rebuilds the same state.
    again = replay(inst, fast.schedule)
    assert_same_state(again.state, plain.trace.state)
    assert again.num_batches == len(plain.schedule)


def test_runs_actually_coalesce():
    result = simulate(INSTANCES["poisson-calibrated"], make_policy("sarathi"))
    runs = [e for e in result.schedule.entries if type(e) is Run]
    assert runs and len(result.schedule.entries) < len(result.schedule) / 2


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_closed_form_run_times_equal_the_batch_times_bit_for_bit(model):
    params = dict(resolve_cost_model("llama-2-7b_a100-80gb_tp1")[1]) if model == "calibrated" else {}
    cost = make_cost_model(model, params)
    rng = np.random.default_rng(7)
    for n in (1, 5, 64):
        context = rng.integers(1, 3000, n)
        fast = decode_run_times(cost, context, 40)
        ones, phases = np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int8)
        slow = [cost.batch_time(BatchView(ones, context + j, phases)) for j in range(40)]
        np.testing.assert_array_equal(fast, np.array(slow))


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_run_times_up_to_a_time_are_the_run_times_cut_bit_for_bit(model):
    """decode_run_until: the batches of decode_run_times that start before a time, and the last one's
    end (the running sum from the start), or None where the model leaves the cut to the caller."""
    from kvsched.costmodel.base import decode_run_until
    from kvsched.costmodel.small import SMALL
    from kvsched.schedule.core import TIME_TOL

    params = dict(resolve_cost_model("llama-2-7b_a100-80gb_tp1")[1]) if model == "calibrated" else {}
    cost = make_cost_model(model, params)
    rng = np.random.default_rng(11)
    answered = 0
    for n in (1, 7, 80):
        context = rng.integers(1, 3000, n)
        for k in (1, 5, SMALL, SMALL + 1, 300):
            durations = decode_run_times(cost, context, k)
            start = float(rng.uniform(0, 100))
            ends = np.add.accumulate(np.concatenate(([start], durations)))[1:]
            starts = ends - durations  # (not the sums themselves: only to pick untils)
            for until in (start, start + TIME_TOL, *rng.choice(starts, 3).tolist(), float(ends[-1]) + 1.0):
                got = decode_run_until(cost, context, k, start, until, TIME_TOL)
                keep = 0
                t = start
                for d in durations.tolist():  # the stepper's cut, spelled out
                    if t + TIME_TOL >= until:
                        break
                    t += d
                    keep += 1
                if got is None:
                    assert (k > SMALL and keep >= SMALL) or not hasattr(cost, "decode_run_until")
                    continue
                answered += 1
                np.testing.assert_array_equal(got[0], durations[:keep])
                assert got[1] == (float(ends[keep - 1]) if keep else start)
    assert answered or not hasattr(cost, "decode_run_until")


def _run_fixture():
    inst = INSTANCES["tight-unit"]
    result = simulate(inst, make_policy("sarathi"))
    k = next(i for i, e in enumerate(result.schedule.entries) if type(e) is Run)
    return inst, result.schedule, k


def _replace(schedule: Schedule, k: int, entry) -> Schedule:
    entries = list(schedule.entries)
    entries[k] = entry
    return Schedule(tuple(entries), schedule.meta)


def test_a_run_with_wrong_durations_is_located_like_its_batches():
    inst, sched, k = _run_fixture()
    run = sched.entries[k]
    durations = np.array(run.durations)
    durations[-1] += 0.5
    bad = _replace(sched, k, Run.of(run.start, durations, run.requests))
    first = sum(e.repeat if type(e) is Run else 1 for e in sched.entries[:k])
    found = [v for v in validate(inst, bad).violations if v.rule == Rule.WRONG_DURATION]
    assert [v.batch for v in found] == [first + run.repeat - 1]


def test_a_run_past_a_completion_is_rejected():
    inst, sched, k = _run_fixture()
    run = sched.entries[k]
    state = EngineState(inst, make_cost_model("unit"))
    for entry in sched.entries[:k]:
        if type(entry) is Run:
            state.step_run(entry)
        else:
            state.step(entry)
    too_long = state.run_limit(run.requests) + 1
    with pytest.raises(ScheduleError) as err:
        state.step_run(Run.of(run.start, np.ones(too_long), run.requests))
    assert {v.rule for v in err.value.violations} & {Rule.AFTER_COMPLETION, Rule.KV_CAPACITY}


def test_npz_round_trip_keeps_runs_and_json_spells_them_out(tmp_path):
    inst, sched, _ = _run_fixture()
    save_schedule(sched, inst, tmp_path / "s.npz")
    back = load_schedule(tmp_path / "s.npz", inst)
    assert len(back.entries) == len(sched.entries) and back.same_as(sched, tol=0.0)
    save_schedule(sched, inst, tmp_path / "s.json")
    spelled = load_schedule(tmp_path / "s.json", inst)
    assert not spelled.has_runs and spelled.same_as(sched, tol=0.0)


def test_a_bad_npz_is_one_clear_error(tmp_path):
    inst, sched, _ = _run_fixture()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable"):
        load_schedule(tmp_path / "junk.npz", inst)
    other = INSTANCES["paged-budgets"]
    save_schedule(sched, inst, tmp_path / "s.npz")
    with pytest.raises(InputError, match="other requests"):
        load_schedule(tmp_path / "s.npz", other)


def test_simulate_command_writes_npz_that_validate_and_convert_read(tmp_path, capsys):
    from kvsched.cli import main
    from kvsched.instances.io import save_instance

    inst = INSTANCES["tight-unit"]
    save_instance(inst, tmp_path / "inst.json")
    out = tmp_path / "sched.npz"
    assert (
        main(["simulate", str(tmp_path / "inst.json"), "-p", "sarathi", "-o", str(out), "--no-progress"]) == 0
    )
    one_pass = capsys.readouterr().out
    assert (
        main(["simulate", str(tmp_path / "inst.json"), "-p", "sarathi", "--validate", "--no-progress"]) == 0
    )
    replayed = capsys.readouterr().out
    # The summary of the one-pass run equals the independent replay's (the runtime line aside).
    assert one_pass.split("simulated")[0] == replayed.split("simulated")[0]
    # The batch count printed (the core's) is the schedule's, a run of k counting k.
    batches = len(load_schedule(out, inst))
    assert batches > len(load_schedule(out, inst).entries)
    for text in (one_pass, replayed):
        assert f"simulated {batches} batches in " in text
    assert load_schedule(out, inst).has_runs
    assert main(["validate", str(tmp_path / "inst.json"), str(out)]) == 0
    assert "valid:" in capsys.readouterr().out
    doc = tmp_path / "infermax.json"
    assert main(["convert", str(tmp_path / "inst.json"), str(out), "--to", "infermax", "-o", str(doc)]) == 0
    expanded = load_schedule(doc, inst)
    assert not expanded.has_runs and len(expanded) == len(load_schedule(out, inst))


def test_make_run_needs_a_plan_of_this_state():
    inst, sched, k = _run_fixture()
    state = EngineState(inst, make_cost_model("unit"))
    run = sched.entries[k]
    with pytest.raises(ValueError, match="plan_run"):
        state.make_run(0.0, run.requests, 1)


def test_class_priority_coalesces_through_its_inner_policy():
    from dataclasses import replace

    from kvsched.instances.model import Instance

    base = INSTANCES["tight-unit"]
    requests = tuple(replace(r, priority=k % 3) for k, r in enumerate(base.requests))
    inst = Instance(requests, base.limits, base.time_model, "classes")
    policy = make_policy("class-priority", inner="vllm")
    fast = simulate(inst, policy)
    plain = simulate(inst, make_policy("class-priority", inner="vllm"), coalesce=False)
    assert fast.schedule.has_runs and fast.schedule.same_as(plain.schedule, tol=0.0)
    assert_same_state(fast.trace.state, plain.trace.state)
    # An inner policy that does not opt in is stepped batch by batch.
    from kvsched.heuristics.priority import ClassPriority

    assert not simulate(inst, ClassPriority(Stepped(make_policy("mcsf")))).schedule.has_runs
    # MC-SF opted in: through the gated view too.
    fast = simulate(inst, make_policy("class-priority", inner="mcsf"))
    plain = simulate(inst, make_policy("class-priority", inner="mcsf"), coalesce=False)
    assert fast.schedule.has_runs and fast.schedule.same_as(plain.schedule, tol=0.0)


@pytest.mark.parametrize(
    ("policy", "params", "attrs"),
    [
        ("slai", {}, ("offsets_used", "mean_batch_time", "_busy", "_num_batches")),
        ("slai-fixed", {}, ("offsets_used", "mean_batch_time")),
        ("rad", {}, ("cycle_starts", "_batches")),
        ("wait-adaptive", {"window": 10, "min_arrivals": 3, "tolerance": 0.05}, ("threshold_history_",)),
        ("nested-wait-adaptive", {"window": 10, "min_arrivals": 3}, ("threshold_history_", "_batches")),
        ("wait", {}, ("evictions", "_batches")),
    ],
)
def test_a_policy_keeps_its_bookkeeping_through_runs(policy, params, attrs):
    """What a policy records per batch (offsets, observed batch times, cycles, thresholds) is as if stepped."""
    for inst in INSTANCES.values():
        plain, fast = make_policy(policy, **params), make_policy(policy, **params)
        simulate(inst, plain, coalesce=False)
        result = simulate(inst, fast)
        for attr in attrs:
            assert getattr(fast, attr) == getattr(plain, attr), attr
    assert any(type(e) is Run for e in result.schedule.entries)


@pytest.mark.parametrize("name", ["poisson-calibrated", "tight-unit"])
def test_a_plan_up_to_a_time_is_a_prefix_of_the_plan_and_knows_its_ends(name):
    """plan_run(until=t) keeps the full plan's batches that start before t (within TIME_TOL) from
    the clock, and a run made from its plan ends where the run's own durations, added one by one, do."""
    from kvsched.costmodel.small import SMALL
    from kvsched.schedule.core import TIME_TOL
    from kvsched.schedule.ir import batch_starts
    from kvsched.schedule.validate import instance_cost_model

    inst = INSTANCES[name]
    schedule = simulate(inst, make_policy("sarathi")).schedule
    cost = instance_cost_model(inst)
    state = EngineState(inst, cost)
    probed = long = 0
    for entry in schedule.entries:
        if type(entry) is Run and entry.chunk is None and entry.start == state.clock:
            req = np.array(entry.requests)
            req.setflags(write=False)
            full = state.__copy__()
            durations = full.plan_run(req)[1].copy()
            long += durations.size > SMALL  # (cut on numpy arrays, not lists)
            starts = batch_starts(state.clock, durations)
            # Before the first batch, inside the run, exactly at a start, and past its last.
            for until in (state.clock, *starts[1:3].tolist(), starts[-1] + TIME_TOL / 2, starts[-1] + 1e9):
                probe = state.__copy__()
                k, cut = probe.plan_run(req, 0, until)
                assert k == int(np.count_nonzero(starts + TIME_TOL < until))
                np.testing.assert_array_equal(cut, durations[:k])
                for j in {1, k} if k else ():
                    run = probe.make_run(probe.clock, req, j)
                    assert run.end == Run.of(run.start, durations[:j], req).end
                    np.testing.assert_array_equal(run.durations, durations[:j])
                probed += 1
        if type(entry) is Run:
            state.step_run(entry)
        else:
            state.step(entry)
    assert state.all_done and probed > 20 and (long or name == "tight-unit"), (probed, long)
