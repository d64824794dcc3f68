"""The one retiming function against the three loops it replaced (kept here verbatim as references)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from kvsched.costmodel import CostModel, make_cost_model
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState, ScheduleError
from kvsched.schedule.io import from_infermax, infermax_document
from kvsched.schedule.ir import Batch, Phase, Schedule
from kvsched.schedule.retime import retime
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline, DeadlineReached

LINEAR = TimeModel("infermax-linear")


# ------------------------------------------------------------------ the old loops
def old_measure_retime(instance: Instance, schedule: Schedule, durations: np.ndarray) -> Schedule:
    """``kvsched.executor.measure.retime`` before the merge."""
    d = np.asarray(durations, dtype=np.float64)
    if d.size != len(schedule):
        raise ValueError(f"{d.size} durations for {len(schedule)} batches")
    arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64)
    out = []
    clock = 0.0
    for b, dur in zip(schedule.batches, d, strict=True):
        start = max(clock, float(arrival[b.requests].max()))
        out.append(Batch.of(start, float(dur), b.requests, b.tokens, b.phases, b.evicted))
        clock = start + float(dur)
    return Schedule(tuple(out), dict(schedule.meta))


def old_batchindexed_retimed(instance: Instance, schedule: Schedule, cost: CostModel) -> Schedule:
    """``BatchIndexed.retimed`` before the merge (checked steps)."""
    state = EngineState(instance, cost)
    arr = np.array([r.arrival for r in instance.requests])
    out = []
    for b in schedule.batches:
        start = max(state.clock, float(arr[b.requests].max()) if b.requests.size else state.clock)
        nb = state.make_batch(start, b.requests, b.tokens, b.evicted)
        state.step(nb)
        out.append(nb)
    return Schedule(tuple(out), dict(schedule.meta))


def old_infermax_loop(instance: Instance, schedule: Schedule, cost: CostModel) -> Schedule:
    """The batch loop of ``from_infermax`` before the merge (unchecked applies)."""
    state = EngineState(instance, cost)
    batches = []
    for b in schedule.batches:
        req, tok, ev = b.requests, b.tokens, b.evicted
        start = max(state.clock, float(state.arrival[req].max()) if req.size else state.clock)
        batch = state.make_batch(start, req, tok, ev)
        state.apply(batch)
        batches.append(batch)
    return Schedule(tuple(batches), dict(schedule.meta))


# ------------------------------------------------------------------ cases
@cache
def instances() -> dict[str, Instance]:
    return {
        # Arrivals over time, small KV in blocks: gaps, evictions and refills.
        "arrivals": synthetic(
            20,
            5,
            Limits(kv_capacity=40, block_size=2),
            LINEAR,
            arrival=Poisson(0.02),
            prompt=Uniform(1, 12),
            output=Uniform(1, 14),
        ),
        # Chunked prefill under a prefill budget.
        "chunked": synthetic(
            16,
            3,
            Limits(kv_capacity=48, block_size=4, max_prefill_tokens=8),
            LINEAR,
            prompt=Uniform(5, 20),
            output=Uniform(1, 16),
        ),
    }


CASES = [("arrivals", "sarathi"), ("arrivals", "vllm"), ("arrivals", "mcsf"), ("chunked", "sarathi")]


@cache
def schedule_of(kind: str, policy: str) -> Schedule:
    return simulate(instances()[kind], make_policy(policy)).schedule


def bit_equal(a: Schedule, b: Schedule) -> bool:
    return (
        len(a) == len(b)
        and a.meta == b.meta
        and all(x.same_as(y, tol=0.0) for x, y in zip(a, b, strict=True))
    )


def test_cases_have_gaps_and_evictions() -> None:
    scheds = [schedule_of(k, p) for k, p in CASES]
    assert any(b.evicted.size for s in scheds for b in s.batches)
    arrivals = instances()["arrivals"]
    assert any(
        b.start > a.end + 1e-9
        for s in (schedule_of("arrivals", p) for p in ("sarathi", "vllm"))
        for a, b in zip(s.batches, s.batches[1:], strict=False)
    )
    assert max(r.arrival for r in arrivals.requests) > 0


@pytest.mark.parametrize(("kind", "policy"), CASES)
def test_durations_match_the_executor_loop(kind: str, policy: str) -> None:
    instance, schedule = instances()[kind], schedule_of(kind, policy)
    d = np.random.default_rng(7).uniform(0.01, 3.0, len(schedule))
    new = retime(instance, schedule, d)
    assert bit_equal(new, old_measure_retime(instance, schedule, d))
    assert bit_equal(retime(instance, schedule, list(d), check=True), new)
    assert replay(instance, new, check_durations=False).ok


@pytest.mark.parametrize(("kind", "policy"), CASES)
@pytest.mark.parametrize("model", ["own", "unit"])
def test_cost_model_matches_the_solver_and_import_loops(kind: str, policy: str, model: str) -> None:
    instance, schedule = instances()[kind], schedule_of(kind, policy)
    cost = instance_cost_model(instance) if model == "own" else make_cost_model("unit")
    checked = retime(instance, schedule, cost, check=True)
    assert bit_equal(checked, old_batchindexed_retimed(instance, schedule, cost))
    assert bit_equal(retime(instance, schedule, cost), old_infermax_loop(instance, schedule, cost))
    assert bit_equal(retime(instance, schedule, cost), checked)
    if model == "own":  # simulate starts every batch as early as it may, so retiming changes nothing
        assert bit_equal(checked, schedule)


def test_cost_model_derives_phases_and_the_start_rule() -> None:
    instance, schedule = instances()["arrivals"], schedule_of("arrivals", "vllm")
    # Wrong phases and times in: the core derives the right ones.
    scrambled = Schedule(
        tuple(
            Batch.of(99.0, 0.0, b.requests, b.tokens, np.full(b.size, Phase.DECODE), b.evicted)
            for b in schedule.batches
        ),
        {"x": 1},
    )
    out = retime(instance, scrambled, instance_cost_model(instance))
    assert bit_equal(out, Schedule(schedule.batches, {"x": 1}))
    arrival = np.array([r.arrival for r in instance.requests])
    prev_end = 0.0
    for b in out.batches:
        assert b.start == max(prev_end, float(arrival[b.requests].max()))
        prev_end = b.end


def test_empty_batch_starts_at_the_previous_end_and_bad_counts_raise() -> None:
    instance = instances()["arrivals"]
    schedule = schedule_of("arrivals", "sarathi")
    empty = Batch.of(0.0, 0.0, [], [], [])
    padded = Schedule((schedule.batches[0], empty, *schedule.batches[1:]), {})
    out = retime(instance, padded, np.ones(len(padded)))
    assert out.batches[1].start == out.batches[0].end
    with pytest.raises(InputError, match=r"^timing: \d+ durations for \d+ batches$"):
        retime(instance, schedule, np.ones(len(schedule) + 1))


def test_check_raises_on_an_illegal_schedule() -> None:
    instance, schedule = instances()["chunked"], schedule_of("chunked", "sarathi")
    b = schedule.batches[0]
    bad = Batch.of(b.start, b.duration, b.requests, b.tokens + 100, b.phases, b.evicted)  # over the prompts
    illegal = Schedule((bad, *schedule.batches[1:]), {})
    cost = instance_cost_model(instance)
    with pytest.raises(ScheduleError):
        retime(instance, illegal, cost, check=True)
    with pytest.raises(ScheduleError):
        retime(instance, illegal, np.ones(len(illegal)), check=True)
    assert len(retime(instance, illegal, cost)) == len(illegal)  # unchecked: the validator's job


def test_infermax_import_is_the_retimed_schedule() -> None:
    instance, schedule = instances()["arrivals"], schedule_of("arrivals", "vllm")
    cost = instance_cost_model(instance)
    got = from_infermax(infermax_document(schedule, instance), instance, cost)
    assert bit_equal(got, Schedule(schedule.batches, {"source": "infermax"}))


def test_retime_stops_at_its_deadline_and_takes_runs_lazily():
    # Long prompts in chunks: a coalesced schedule of a few runs stands for thousands of batches.
    inst = Instance(
        tuple(Request(f"r{k}", 0.0, 2**16, 3) for k in range(2)),
        Limits(2**18, max_batch_tokens=64),
        TimeModel("unit"),
    )
    sched = simulate(inst, make_policy("sarathi")).schedule
    assert len(sched.entries) < 20 < len(sched)
    with pytest.raises(DeadlineReached):
        retime(inst, sched, instance_cost_model(inst), deadline=Deadline.after(1e-9))
    out = retime(inst, sched, instance_cost_model(inst), deadline=Deadline.after(600))
    assert len(out) == len(sched)
    replay(inst, out)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
def test_durations_that_no_batch_can_have_are_one_error(bad: float) -> None:
    inst = Instance((Request("a", 0.0, 2, 3),), Limits(kv_capacity=8), TimeModel("unit"))
    sched = simulate(inst, make_policy("vllm")).schedule
    durations = [1.0] * len(sched)
    durations[1] = bad
    with pytest.raises(InputError, match="batch 1's duration"):
        retime(inst, sched, durations)


def test_a_schedule_read_for_another_instance_is_not_retimed(tmp_path) -> None:
    from kvsched.schedule.io import load_schedule, save_schedule

    one = Instance((Request("a", 0.0, 2, 3),), Limits(kv_capacity=8), TimeModel("unit"))
    other = Instance((Request("a", 5.0, 2, 3),), Limits(kv_capacity=8), TimeModel("unit"))
    save_schedule(simulate(one, make_policy("vllm")).schedule, one, tmp_path / "s.json")
    read = load_schedule(tmp_path / "s.json", one)
    with pytest.raises(InputError, match=r"^schedule: it was read for another instance"):
        retime(other, read, [1.0] * len(read))
    # Retimed on its own instance it stays that instance's: saving it for the other is refused too.
    again = retime(one, read, [2.0] * len(read))
    with pytest.raises(InputError, match="read for another instance"):
        save_schedule(again, other, tmp_path / "t.json")


def test_a_bad_duration_is_shown_as_a_number() -> None:
    inst = Instance((Request("a", 0.0, 2, 3),), Limits(kv_capacity=8), TimeModel("unit"))
    sched = simulate(inst, make_policy("vllm")).schedule
    with pytest.raises(InputError, match=r"batch 0's duration is nan;"):  # not np.float64(nan)
        retime(inst, sched, np.full(len(sched), np.nan))
