"""Mixed runs: decodes plus one prompt chunk, repeated, stand exactly for their batches.

A mixed :class:`~kvsched.schedule.ir.Run` is ``k`` batches of the same decodes
and a chunk of ``c`` tokens of the same prefilling request that never finishes
its prompt inside the run. Here: the core applies such a run exactly as the
same batches one by one (state, records, durations, metrics) on random
instances, independently of any policy (runs built from a plain schedule); the
cost models' closed forms equal their per-batch prices bit for bit; the
validator catches corrupted runs; files round-trip; and the Sarathi family
opts in (the simulation-level equivalence is ``tests/test_runs.py``'s, which
runs every opted-in policy with and without coalescing).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvsched.costmodel import REGISTRY, BatchView, make_cost_model
from kvsched.costmodel.base import chunk_run_times
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.heuristics.base import steady_chunks
from kvsched.instances.generators import LogNormal, Poisson, synthetic
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState, Rule, ScheduleError
from kvsched.schedule.io import infermax_document, load_schedule, save_schedule
from kvsched.schedule.ir import Batch, Chunk, Phase, Run, Schedule
from kvsched.schedule.metrics import batch_metrics, request_metrics, run_metrics
from kvsched.schedule.records import RunRecord
from kvsched.schedule.serving import serving_metrics
from kvsched.schedule.validate import instance_cost_model, replay, validate
from tests.test_simulator_equivalence import assert_same_record, assert_same_state

_CALIBRATED = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))


def _instance(seed: int, block: int = 1, time_model: TimeModel = _CALIBRATED, **limits):
    lengths = dict(
        prompt=LogNormal.from_mean(400, sigma=0.8, max=2000),
        output=LogNormal.from_mean(40, sigma=1.0, max=300),
    )
    lim = Limits(limits.pop("kv", 6000), block, limits.pop("C", 128), **limits)
    return synthetic(40, seed, lim, time_model, arrival=Poisson(4.0), **lengths)


INSTANCES = {
    "calibrated": _instance(1),
    "paged": _instance(2, block=16, kv=4000),
    "budgets": _instance(
        3, time_model=TimeModel("infermax-linear"), C=96, max_prefill_tokens=64, max_running=9
    ),
    "unit": _instance(4, time_model=TimeModel("unit"), C=200),
}


def _coalesce(schedule: Schedule, records) -> Schedule:
    """``schedule``'s batches with every stretch of identical mixed batches stored as a mixed run.

    A stretch repeats one batch (same items, no evictions) whose items are decodes then
    one prompt chunk that generated nothing, none completing before the stretch's last.
    """
    batches = schedule.batches
    out: list[Batch | Run] = []
    i = 0

    def mixed(j: int) -> bool:
        b, r = batches[j], records[j]
        return (
            not b.evicted.size
            and b.size >= 1
            and b.phases[-1] != Phase.DECODE
            and r.num_decodes == b.size - 1
            and r.generated.size == r.num_decodes
        )

    while i < len(batches):
        j = i
        if mixed(i):
            while (
                j + 1 < len(batches)
                and mixed(j + 1)
                and not records[j].completed.size
                and np.array_equal(batches[j + 1].requests, batches[i].requests)
                and np.array_equal(batches[j + 1].tokens, batches[i].tokens)
            ):
                j += 1
        last = 0
        if mixed(i) and j + 1 < len(batches) and not records[j].completed.size:
            # The prompt's last chunk: the same items, the chunk's request generating.
            b, t, r = batches[i], batches[j + 1], records[j + 1]
            if (
                not t.evicted.size
                and np.array_equal(t.requests, b.requests)
                and np.array_equal(t.tokens[:-1], b.tokens[:-1])
                and np.array_equal(t.phases, b.phases)
                and t.tokens[-1] <= b.tokens[-1]
                and r.generated.size == b.size
            ):
                last = int(t.tokens[-1])
                j += 1
        if j == i:
            out.append(batches[i])
        else:
            b = batches[i]
            chunk = Chunk(int(b.requests[-1]), int(b.tokens[-1]), int(b.phases[-1]), last)
            durations = [batches[x].duration for x in range(i, j + 1)]
            out.append(Run.of(b.start, durations, b.requests[:-1], chunk))
        i = j + 1
    return Schedule(tuple(out), dict(schedule.meta))


def _plain(name: str, policy: str = "sarathi"):
    return simulate(INSTANCES[name], make_policy(policy), coalesce=False)


@pytest.mark.parametrize("name", sorted(INSTANCES))
@pytest.mark.parametrize("policy", ["sarathi", "sarathi-ef", "infermax-sec6"])
def test_a_mixed_run_does_what_its_batches_do(name, policy):
    inst = INSTANCES[name]
    plain = _plain(name, policy)
    coalesced = _coalesce(plain.schedule, plain.trace.records)
    runs = [e for e in coalesced.entries if type(e) is Run]
    if policy == "sarathi":
        assert runs, "the instance has stretches of mixed batches"
        assert any(e.chunk.last for e in runs), "... and stretches that end with a prompt's last chunk"
    assert coalesced.same_as(plain.schedule, tol=0.0)
    # The core checks and applies each run in one step (no violation, one record per run).
    fast = replay(inst, coalesced)
    assert sum(type(e) is RunRecord for e in fast.entries) == len(runs)
    assert sum(e.tail is not None for e in fast.entries if type(e) is RunRecord) == sum(
        e.chunk.last > 0 for e in runs
    )
    slow = replay(inst, plain.schedule)
    assert_same_state(fast.state, slow.state)
    for a, b in zip(fast.records, slow.records, strict=True):
        assert_same_record(a, b)
    assert run_metrics(fast) == run_metrics(slow)
    assert batch_metrics(fast).equals(batch_metrics(slow))
    assert request_metrics(fast).equals(request_metrics(slow))
    assert serving_metrics(fast) == serving_metrics(slow)


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_the_core_plans_the_batch_durations_bit_for_bit(name):
    """plan_run's durations are what make_batch gives each batch (the simulator's clock)."""
    inst = INSTANCES[name]
    plain = _plain(name)
    cost = instance_cost_model(inst)
    state = EngineState(inst, cost)
    batches = plain.schedule.batches
    checked = tails = 0
    for j, b in enumerate(batches):
        if b.size and b.phases[-1] != Phase.DECODE and not b.evicted.size and j + 1 < len(batches):
            limit, durations = state.plan_run(b.requests, int(b.tokens[-1]))
            if limit:
                run = state.make_run(state.clock, b.requests, limit, int(b.tokens[-1]))
                np.testing.assert_array_equal(run.durations, durations)
                probe = state.__copy__()
                for rb in run.batches():  # the last may be the prompt's last chunk
                    made = probe.make_batch(max(probe.clock, b.start), rb.requests, rb.tokens)
                    assert made.duration == rb.duration
                    probe.step(made)
                    checked += 1
                tails += run.chunk.last > 0
        state.step(b)
    assert checked and tails


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_closed_form_chunk_run_times_equal_the_batch_times_bit_for_bit(model):
    params = dict(resolve_cost_model("llama-2-7b_a100-80gb_tp1")[1]) if model == "calibrated" else {}
    cost = make_cost_model(model, params)
    rng = np.random.default_rng(11)
    for n in (0, 1, 5, 64, 70):
        context = rng.integers(1, 3000, n)
        for c, phase, last in ((1, Phase.PREFILL, 0), (37, Phase.REFILL, 5), (480, Phase.PREFILL, 480)):
            m = int(rng.integers(0, 4000))
            for k, tail in ((30, 0), (30, last), (2, last), (1, 0)):
                fast = chunk_run_times(cost, context, m, c, int(phase), k, tail)
                phases = np.append(np.full(n, Phase.DECODE, dtype=np.int8), np.int8(phase))
                slow = []
                for j in range(k):
                    tokens = np.append(np.ones(n, dtype=np.int64), tail if tail and j == k - 1 else c)
                    kv = np.append(context + j, m + j * c).astype(np.int64)
                    slow.append(cost.batch_time(BatchView(tokens, kv, phases)))
                np.testing.assert_array_equal(fast, np.array(slow))


def _mixed_fixture():
    plain = _plain("calibrated")
    coalesced = _coalesce(plain.schedule, plain.trace.records)
    k = next(
        i
        for i, e in enumerate(coalesced.entries)
        if type(e) is Run and e.chunk is not None and e.repeat > 1 and e.requests.size >= 2
    )
    first = sum(e.repeat if type(e) is Run else 1 for e in coalesced.entries[:k])
    return INSTANCES["calibrated"], coalesced, k, first


def _replace(schedule: Schedule, k: int, entry) -> Schedule:
    entries = list(schedule.entries)
    entries[k] = entry
    return Schedule(tuple(entries), schedule.meta)


def _rules(inst, schedule) -> set[Rule]:
    return {v.rule for v in validate(inst, schedule).violations}


def test_a_run_past_the_prompt_is_caught():
    inst, sched, k, first = _mixed_fixture()
    run = sched.entries[k]
    p = run.chunk.request
    # A chunk that covers more than the prompt has left: a chunk past the prompt in a batch of the run.
    state = replay(inst, Schedule(sched.entries[:k], sched.meta), strict=False).state
    left = int(state.unprocessed(p))
    reps = left // run.chunk.tokens + 2
    long_run = Run.of(run.start, np.resize(run.durations, reps), run.requests, run.chunk)
    found = validate(inst, _replace(sched, k, long_run)).violations
    assert {Rule.TOO_MANY_TOKENS, Rule.PHASE_MISMATCH} & {v.rule for v in found}
    assert min(v.batch for v in found) >= first


def _two_requests(prompt: int = 8, output: int = 2) -> Instance:
    """A decode (prompt 3, output 9) and a prompt to chunk, C = 5 (unit time)."""
    reqs = (Request("d", 0.0, 3, 9), Request("p", 0.0, prompt, output))
    return Instance(reqs, Limits(100, 1, 5), TimeModel("unit"))


def _decoding(inst: Instance) -> EngineState:
    state = EngineState(inst, instance_cost_model(inst))
    state.step(state.make_batch(0.0, [0], [3]))  # d's prompt: d decodes from now on
    return state


def test_a_run_whose_chunk_finishes_the_prompt_says_so():
    state = _decoding(_two_requests())
    # Two chunks of 4 finish p's prompt of 8 in the run's last batch: legal batches, and a run only
    # with its last chunk said (Chunk.last).
    durations = chunk_run_times(state.cost_model, state.kv[[0]], 0, 4, Phase.PREFILL, 2, 4)
    unsaid = Run.of(state.clock, durations, [0], Chunk(1, 4, Phase.PREFILL))
    assert [v.rule for v in state.check_run(unsaid)] == [Rule.BAD_RUN]
    with pytest.raises(ScheduleError, match="last chunk"):
        state.__copy__().step_run(unsaid)
    assert state.run_limit(np.array([0, 1]), 4) == 2  # the planner ends with the last chunk
    said = Run.of(state.clock, durations, [0], Chunk(1, 4, Phase.PREFILL, 4))
    assert state.check_run(said) == []
    # A last chunk that leaves some of the prompt, or a run too short for its last chunk, is caught.
    short = Run.of(state.clock, durations, [0], Chunk(1, 4, Phase.PREFILL, 3))
    assert state.check_run(short)
    with pytest.raises(ValueError):
        Run.of(state.clock, durations[:1], [0], Chunk(1, 4, Phase.PREFILL, 4))


@pytest.mark.parametrize(("prompt", "output"), [(7, 3), (8, 1), (9, 2)])
def test_a_run_with_a_last_chunk_does_what_its_batches_do(prompt, output):
    inst = _two_requests(prompt, output)
    state = _decoding(inst)
    req = np.array([0, 1])
    req.flags.writeable = False
    limit, _ = state.plan_run(req, 4)
    assert limit == -(-prompt // 4)
    run = state.make_run(state.clock, req, limit, 4)
    assert run.chunk.last == prompt - 4 * (limit - 1)
    probe = state.__copy__()
    slow = [probe.step(b) for b in run.batches()]
    record = state.step_run(run)
    assert_same_state(state, probe)
    assert record.tail is not None and record.repeat == limit - 1
    fast = [*record.records(), record.tail]
    for a, b in zip(fast, slow, strict=True):
        assert_same_record(a, b)
    assert state.first_token[1] == run.end
    assert state.done[1] == (output == 1)


def test_a_run_with_too_much_kv_is_caught():
    inst, sched, k, first = _mixed_fixture()
    run = sched.entries[k]
    state = replay(inst, Schedule(sched.entries[:k], sched.meta), strict=False).state
    # Shrink M so that the run's last batch no longer fits (tokens are blocks here).
    need = state.kv_blocks + run.repeat * run.num_tokens
    tight = replace(inst, limits=replace(inst.limits, kv_capacity=need - 1))
    trace = replay(tight, Schedule(sched.entries[: k + 1], sched.meta), strict=False)
    rules = [(v.rule, v.batch) for v in trace.violations if v.rule == Rule.KV_CAPACITY]
    assert (Rule.KV_CAPACITY, first + run.repeat - 1) in rules


def test_a_run_over_the_token_budget_is_caught():
    inst, sched, k, first = _mixed_fixture()
    run = sched.entries[k]
    c = inst.limits.max_batch_tokens - run.requests.size + 1  # one token over C
    big = Run.of(run.start, run.durations, run.requests, Chunk(run.chunk.request, c, run.chunk.phase))
    found = validate(inst, _replace(sched, k, big)).violations
    assert any(v.rule == Rule.TOKEN_BUDGET and v.batch == first for v in found)
    # The wrong durations and the KV (with its bigger chunks) are reported too, located like batches.
    assert all(v.batch is None or v.batch >= first for v in found)


def test_a_run_with_wrong_durations_or_a_decoding_chunk_is_caught():
    inst, sched, k, first = _mixed_fixture()
    run = sched.entries[k]
    slow = Run.of(run.start, run.durations * 1.5, run.requests, run.chunk)
    assert any(
        v.rule == Rule.WRONG_DURATION and v.batch == first
        for v in validate(inst, _replace(sched, k, slow)).violations
    )
    refill = Run.of(
        run.start, run.durations, run.requests, Chunk(run.chunk.request, run.chunk.tokens, Phase.REFILL)
    )
    assert Rule.PHASE_MISMATCH in _rules(inst, _replace(sched, k, refill))
    with pytest.raises(ValueError):
        Run.of(run.start, run.durations, run.requests, Chunk(run.chunk.request, 1, Phase.DECODE))


def test_npz_round_trip_keeps_mixed_runs_and_json_spells_them_out(tmp_path):
    inst, sched, _, _ = _mixed_fixture()
    npz = tmp_path / "s.npz"
    save_schedule(sched, inst, npz)
    back = load_schedule(npz, inst)
    assert len(back.entries) == len(sched.entries)
    for a, b in zip(back.entries, sched.entries, strict=True):
        assert type(a) is type(b)
        if type(a) is Run:
            assert a.chunk == b.chunk
            np.testing.assert_array_equal(a.requests, b.requests)
            np.testing.assert_array_equal(a.durations, b.durations)
    assert back.same_as(sched, tol=0.0)
    js = tmp_path / "s.json"
    save_schedule(sched, inst, js)
    spelled = load_schedule(js, inst)
    assert not spelled.has_runs and spelled.same_as(sched, tol=1e-12)
    replay(inst, back)
    im = tmp_path / "s.infermax.json"
    im.write_text(json.dumps(infermax_document(sched, inst)))  # the InferMax format spells runs out
    imported = load_schedule(im, inst)
    assert not imported.has_runs and len(imported) == len(sched)
    for a, b in zip(imported, sched, strict=True):
        np.testing.assert_array_equal(a.requests, b.requests)
        np.testing.assert_array_equal(a.tokens, b.tokens)


def test_a_run_with_a_chunk_in_the_middle_is_a_clear_error(tmp_path):
    from kvsched.schedule.columnar import schedule_columns, schedule_from_columns

    inst, sched, k, _ = _mixed_fixture()
    cols = schedule_columns(sched, inst)
    items = cols["items"]
    start = int(items[:k].sum())
    run_items = int(items[k])
    assert run_items >= 3
    tok, phase = cols["item_tokens"].copy(), cols["item_phase"].copy()
    # Swap the chunk with the first decode: a non-decode item that is not the run's last.
    tok[start], tok[start + run_items - 1] = tok[start + run_items - 1], tok[start]
    phase[start], phase[start + run_items - 1] = phase[start + run_items - 1], phase[start]
    with pytest.raises(InputError, match="one-token decodes"):
        schedule_from_columns({**cols, "item_tokens": tok, "item_phase": phase}, inst)


def test_simulation_makes_mixed_runs_and_the_sarathi_family_opts_in():
    result = simulate(INSTANCES["calibrated"], make_policy("sarathi"))
    assert any(type(e) is Run and e.chunk is not None for e in result.schedule.entries)
    assert steady_chunks(make_policy("sarathi")) is not None
    assert steady_chunks(make_policy("mcsf-alg1")) is None  # the default is "no"
    plain = simulate(INSTANCES["calibrated"], make_policy("sarathi"), coalesce=False)
    assert result.schedule.same_as(plain.schedule, tol=0.0)
