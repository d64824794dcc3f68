"""Property tests of the validator: legal schedules pass, and every corruption is caught and named.

Random legal schedules come from :func:`tests.strategies.build_legal_schedule`
(both the unit and the InferMax linear cost model). Each corruption test breaks
exactly one rule of a legal schedule and asserts the exact :class:`Rule`, batch
index and request id of the violation. Where a corruption could also break a
budget or the KV capacity as a side effect (extra tokens, an extra item), the
schedule is validated against the *relaxed* instance (unlimited budgets, huge
M), under which the legal schedule stays legal, so the corruption is the only
violation; where it would shift later batches (a longer batch), later batches
are shifted too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import TIME_TOL, EngineState, Rule, ScheduleError
from kvsched.schedule.ir import Batch, Phase, Schedule
from kvsched.schedule.validate import replay, validate
from tests.strategies import (
    SETTINGS,
    BuiltSchedule,
    copy_batch,
    copy_schedule,
    insert_batch,
    instances,
    item_batches,
    legal_schedules,
    relaxed,
    replace_batch,
    state_before,
    with_limits,
)

PROPS = settings(SETTINGS, max_examples=40)
MANY = legal_schedules(instances(min_requests=2))
WITH_DECODES = legal_schedules(instances(min_requests=1, min_output=3))


def found(instance: Instance, schedule: Schedule) -> list[tuple[Rule, int | None, str | None]]:
    """(rule, batch, request) of every violation, in replay order."""
    return [(v.rule, v.batch, v.request) for v in validate(instance, schedule).violations]


def rid(built: BuiltSchedule, pos: int) -> str:
    return built.instance.requests[pos].id


# ------------------------------------------------------------------- legal schedules
@PROPS
@given(legal_schedules())
def test_random_legal_schedules_validate(built: BuiltSchedule) -> None:
    inst, sched = built.instance, built.schedule
    trace = validate(inst, sched)
    assert trace.violations == []
    replay(inst, sched)  # strict replay does not raise either
    state = trace.state
    assert state.all_done
    # A JSON-free round trip through Batch.of copies (plain Python values) is identical and legal.
    again = copy_schedule(sched)
    assert again.same_as(sched)
    assert validate(inst, again).violations == []
    # Accounting: each request processes I + O - 1 tokens plus whatever evictions threw away.
    peak = np.array([r.peak_kv for r in inst.requests])
    np.testing.assert_array_equal(state.processed, peak + built.dropped_kv)
    assert int(state.evictions.sum()) == built.num_evictions
    # Per-batch records respect every limit, and batches do not overlap.
    lim = inst.limits
    for rec, batch in zip(trace.records, sched.batches, strict=True):
        assert rec.kv_blocks <= lim.kv_blocks
        assert rec.kv_tokens <= rec.kv_blocks * lim.block_size
        assert lim.max_batch_tokens is None or rec.num_tokens <= lim.max_batch_tokens
        assert lim.max_prefill_tokens is None or rec.prefill_tokens <= lim.max_prefill_tokens
        assert lim.max_running is None or rec.num_running <= lim.max_running
        assert rec.num_tokens == batch.num_tokens
    for prev, nxt in zip(sched.batches, sched.batches[1:], strict=False):
        assert nxt.start >= prev.end - TIME_TOL
    assert np.all(state.completion >= state.arrival)


# -------------------------------------------------------------- instance-side limits
@PROPS
@given(legal_schedules())
def test_kv_capacity_below_the_peak(built: BuiltSchedule) -> None:
    trace = validate(built.instance, built.schedule)
    bs = built.instance.limits.block_size
    peak_blocks = max(r.kv_blocks for r in trace.records)
    # Limits an instance may have (M >= 1 and at least one block): validate checks the instance too.
    assume(peak_blocks * bs - 1 >= max(1, bs))
    squeezed = with_limits(built.instance, kv_capacity=peak_blocks * bs - 1)
    expected = [(Rule.KV_CAPACITY, r.index, None) for r in trace.records if r.kv_blocks == peak_blocks]
    assert found(squeezed, built.schedule) == expected


@PROPS
@given(legal_schedules())
def test_token_budget_below_the_largest_batch(built: BuiltSchedule) -> None:
    records = validate(built.instance, built.schedule).records
    C = max(r.num_tokens for r in records) - 1
    assume(C >= 1)  # a budget an instance may have
    expected = [(Rule.TOKEN_BUDGET, r.index, None) for r in records if r.num_tokens > C]
    assert found(with_limits(built.instance, max_batch_tokens=C), built.schedule) == expected


@PROPS
@given(legal_schedules())
def test_prefill_budget_below_the_largest_prefill(built: BuiltSchedule) -> None:
    records = validate(built.instance, built.schedule).records
    P = max(r.prefill_tokens for r in records) - 1
    assert P >= 0  # the first batch is a prefill
    assume(P >= 1)  # a budget an instance may have
    expected = [(Rule.PREFILL_BUDGET, r.index, None) for r in records if r.prefill_tokens > P]
    assert found(with_limits(built.instance, max_prefill_tokens=P), built.schedule) == expected


@PROPS
@given(legal_schedules())
def test_max_running_below_the_most_running(built: BuiltSchedule) -> None:
    records = validate(built.instance, built.schedule).records
    cap = max(r.num_running for r in records) - 1
    assume(cap >= 1)  # a cap an instance may have
    expected = [(Rule.MAX_RUNNING, r.index, None) for r in records if r.num_running > cap]
    assert found(with_limits(built.instance, max_running=cap), built.schedule) == expected


# --------------------------------------------------------------------- item phases
@PROPS
@given(legal_schedules())
def test_prefill_relabelled_as_decode(built: BuiltSchedule) -> None:
    first = built.schedule.batches[0]  # nothing has generated yet: every item is a prefill
    assert np.all(first.phases == Phase.PREFILL)
    phases = first.phases.tolist()
    phases[0] = int(Phase.DECODE)
    bad = replace_batch(built.schedule, 0, copy_batch(first, phases=phases))
    assert found(built.instance, bad) == [(Rule.DECODE_BEFORE_PREFILL, 0, rid(built, int(first.requests[0])))]


@PROPS
@given(legal_schedules(), st.data())
def test_decode_inserted_for_a_request_mid_prefill(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    spots = []
    state = EngineState(inst, cm)
    for k, batch in enumerate(sched.batches):
        live = ~state.done & (state.arrival <= batch.start + TIME_TOL)
        for pos in np.flatnonzero(live):
            if pos in batch.requests or pos in batch.evicted:
                continue
            if state.phase_of(np.array([pos]))[0] != Phase.DECODE:
                mid = 0 < state.kv[pos] < state.prompt[pos] + state.generated[pos]
                spots.append((not mid, k, int(pos)))  # mid-prefill spots first
        state.apply(batch)
    assume(spots)
    spots.sort()
    best = [s for s in spots if s[0] == spots[0][0]]
    _, k, pos = data.draw(st.sampled_from(best))
    before = state_before(inst, sched, k, cm)
    b = sched.batches[k]
    new = before.make_batch(b.start, [*b.requests.tolist(), pos], [*b.tokens.tolist(), 1], b.evicted)
    phases = new.phases.tolist()
    phases[-1] = int(Phase.DECODE)
    bad = replace_batch(sched, k, copy_batch(new, phases=phases))
    got = found(relaxed(inst), bad)
    want = (Rule.DECODE_BEFORE_PREFILL, k, rid(built, pos))
    assert got[0] == want
    assert [v for v in got if v[1] == k] == [want]


@PROPS
@given(legal_schedules(), st.data())
def test_phase_mismatch(built: BuiltSchedule, data: st.DataObject) -> None:
    sched = built.schedule
    k = data.draw(st.integers(0, len(sched) - 1))
    b = sched.batches[k]
    j = data.draw(st.integers(0, b.size - 1))
    derived = int(b.phases[j])
    label = data.draw(st.sampled_from([c for c in (Phase.PREFILL, Phase.REFILL, 7, -1) if c != derived]))
    phases = b.phases.tolist()
    phases[j] = int(label)
    bad = replace_batch(sched, k, copy_batch(b, phases=phases))
    assert found(built.instance, bad) == [(Rule.PHASE_MISMATCH, k, rid(built, int(b.requests[j])))]


# ------------------------------------------------------------------ item structure
@PROPS
@given(WITH_DECODES, st.data())
def test_two_decodes_of_one_request_in_a_batch(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    spots = [
        (k, int(r)) for k, b in enumerate(sched) for r, p in zip(b.requests, b.phases, strict=True) if p == 1
    ]
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = sched.batches[k]
    new = state_before(inst, sched, k, cm).make_batch(
        b.start, [*b.requests.tolist(), pos], [*b.tokens.tolist(), 1], b.evicted
    )
    assert new.phases.tolist().count(Phase.DECODE) == b.phases.tolist().count(Phase.DECODE) + 1
    bad = replace_batch(sched, k, new)
    assert found(relaxed(inst), bad) == [(Rule.DUPLICATE_ITEM, k, rid(built, pos))]


@PROPS
@given(legal_schedules(), st.data())
def test_missing_tokens_leave_the_request_incomplete(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    # Drop the completing item of a request; keep the batch if anything is left in it.
    spots = []
    for pos in range(len(inst)):
        k = item_batches(sched, pos)[-1]
        b = sched.batches[k]
        if b.size > 1 or b.evicted.size == 0:
            spots.append((k, pos))
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = sched.batches[k]
    keep = b.requests != pos
    if keep.any():
        new = state_before(inst, sched, k, cm).make_batch(
            b.start, b.requests[keep], b.tokens[keep], b.evicted
        )
        bad = replace_batch(sched, k, new)
    else:
        bad = replace_batch(sched, k, None)
    assert found(relaxed(inst), bad) == [(Rule.INCOMPLETE, None, rid(built, pos))]


@PROPS
@given(legal_schedules())
def test_truncated_schedule_leaves_the_last_requests_incomplete(built: BuiltSchedule) -> None:
    sched = built.schedule
    trace = validate(built.instance, sched)
    last = trace.records[-1]
    cut = Schedule(sched.batches[:-1])
    want = [(Rule.INCOMPLETE, None, rid(built, int(p))) for p in sorted(last.completed.tolist())]
    assert len(want) >= 1
    assert found(built.instance, cut) == want


@PROPS
@given(legal_schedules(), st.data())
def test_extra_tokens(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    pos = data.draw(st.integers(0, len(inst) - 1))
    k = item_batches(sched, pos)[-1]  # its completing item processes everything that is left
    b = sched.batches[k]
    extra = data.draw(st.integers(1, 3))
    tokens = b.tokens.copy()
    tokens[b.requests == pos] += extra
    new = state_before(inst, sched, k, cm).make_batch(b.start, b.requests, tokens, b.evicted)
    bad = replace_batch(sched, k, new)
    assert found(relaxed(inst), bad) == [(Rule.TOO_MANY_TOKENS, k, rid(built, pos))]


@PROPS
@given(legal_schedules(), st.data())
def test_zero_token_item(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    spots = []
    state = EngineState(inst, cm)
    for k, b in enumerate(sched.batches):
        live = ~state.done & (state.arrival <= b.start + TIME_TOL)
        spots += [(k, int(p)) for p in np.flatnonzero(live) if p not in b.requests and p not in b.evicted]
        state.apply(b)
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = sched.batches[k]
    new = state_before(inst, sched, k, cm).make_batch(
        b.start, [*b.requests.tolist(), pos], [*b.tokens.tolist(), 0], b.evicted
    )
    bad = replace_batch(sched, k, new)
    assert found(relaxed(inst), bad) == [(Rule.BAD_TOKENS, k, rid(built, pos))]


@PROPS
@given(legal_schedules(), st.data())
def test_processing_after_completion(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched, cm = built.instance, built.schedule, built.cost_model
    trace = validate(inst, sched)
    spots = [
        (k, int(p)) for rec in trace.records for p in rec.completed for k in range(rec.index + 1, len(sched))
    ]
    if spots and data.draw(st.booleans()):
        k, pos = data.draw(st.sampled_from(spots))
        b = sched.batches[k]
        new = state_before(inst, sched, k, cm).make_batch(
            b.start, [*b.requests.tolist(), pos], [*b.tokens.tolist(), 1], b.evicted
        )
        bad = replace_batch(sched, k, new)
    else:  # a final extra batch for a request that already completed
        pos = data.draw(st.integers(0, len(inst) - 1))
        k = len(sched)
        new = trace.state.make_batch(sched.makespan, [pos], [1])
        bad = Schedule((*sched.batches, new))
    assert found(relaxed(inst), bad) == [(Rule.AFTER_COMPLETION, k, rid(built, pos))]


@PROPS
@given(legal_schedules(), st.data())
def test_unknown_request_position(built: BuiltSchedule, data: st.DataObject) -> None:
    sched, n = built.schedule, len(built.instance)
    k = data.draw(st.integers(0, len(sched) - 1))
    b = sched.batches[k]
    ghost = data.draw(st.sampled_from([n, n + 3, -1]))
    if data.draw(st.booleans()):
        new = copy_batch(
            b,
            requests=[*b.requests.tolist(), ghost],
            tokens=[*b.tokens.tolist(), 1],
            phases=[*b.phases.tolist(), int(Phase.PREFILL)],
        )
    else:
        new = copy_batch(b, evicted=[*b.evicted.tolist(), ghost])
    bad = replace_batch(sched, k, new)
    assert found(built.instance, bad) == [(Rule.UNKNOWN_REQUEST, k, None)]


@PROPS
@given(legal_schedules(), st.data())
def test_empty_batch(built: BuiltSchedule, data: st.DataObject) -> None:
    sched = built.schedule
    k = data.draw(st.integers(0, len(sched)))
    start = sched.batches[k - 1].end if k > 0 else sched.batches[0].start
    empty = Batch.of(start, 0.0, [], [], [])
    assert found(built.instance, insert_batch(sched, k, empty)) == [(Rule.EMPTY_BATCH, k, None)]


# -------------------------------------------------------------------------- timing
@PROPS
@given(legal_schedules(), st.data())
def test_wrong_duration(built: BuiltSchedule, data: st.DataObject) -> None:
    sched = built.schedule
    k = data.draw(st.integers(0, len(sched) - 1))
    b = sched.batches[k]
    how = data.draw(st.sampled_from(["longer", "shorter", "nan"]))
    if how == "longer":
        bad = replace_batch(sched, k, copy_batch(b, duration=2 * b.duration + 0.5))
    elif how == "shorter":
        bad = replace_batch(sched, k, copy_batch(b, duration=b.duration / 2))
    else:
        bad = replace_batch(sched, k, copy_batch(b, duration=math.nan))
    assert found(built.instance, bad) == [(Rule.WRONG_DURATION, k, None)]


@PROPS
@given(legal_schedules(), st.data())
def test_overlap(built: BuiltSchedule, data: st.DataObject) -> None:
    sched = built.schedule
    spots = []
    for k in range(1, len(sched)):
        prev, b = sched.batches[k - 1], sched.batches[k]
        start = prev.end - prev.duration / 2
        arrivals = [built.instance.requests[int(p)].arrival for p in b.requests]
        if prev.duration > 0 and max(arrivals) <= start:
            spots.append((k, start))
    assume(spots)
    k, start = data.draw(st.sampled_from(spots))
    bad = replace_batch(sched, k, copy_batch(sched.batches[k], start=start))
    assert found(built.instance, bad) == [(Rule.OVERLAP, k, None)]


@PROPS
@given(legal_schedules())
def test_batch_moved_before_an_arrival(built: BuiltSchedule) -> None:
    sched, inst = built.schedule, built.instance
    spots = []
    for k, b in enumerate(sched.batches):
        prev_end = sched.batches[k - 1].end if k else 0.0
        late = [int(p) for p in b.requests if inst.requests[int(p)].arrival > prev_end + TIME_TOL]
        if late:
            spots.append((k, prev_end, sorted(late)))
    assume(spots)
    k, prev_end, late = spots[0]
    bad = replace_batch(sched, k, copy_batch(sched.batches[k], start=prev_end))
    order = sched.batches[k].requests.tolist()
    late.sort(key=order.index)
    assert found(inst, bad) == [(Rule.BEFORE_ARRIVAL, k, rid(built, p)) for p in late]


@PROPS
@given(legal_schedules(), st.data())
def test_request_arriving_after_its_first_batch(built: BuiltSchedule, data: st.DataObject) -> None:
    inst, sched = built.instance, built.schedule
    pos = data.draw(st.integers(0, len(inst) - 1))
    k = item_batches(sched, pos)[0]
    b = sched.batches[k]
    late = list(inst.requests)
    late[pos] = replace(late[pos], arrival=b.start + b.duration / 2)
    assert found(replace(inst, requests=tuple(late)), sched) == [(Rule.BEFORE_ARRIVAL, k, rid(built, pos))]


# ------------------------------------------------------------------------ evictions
def _eviction_spots(built: BuiltSchedule) -> dict[str, list[tuple[int, int]]]:
    """Where each kind of bad eviction can be planted: kind -> [(batch, request)]."""
    spots: dict[str, list[tuple[int, int]]] = {"no-kv": [], "done": [], "fresh-item": [], "holding-item": []}
    state = EngineState(built.instance, built.cost_model)
    for k, b in enumerate(built.schedule.batches):
        for pos in range(state.n):
            in_items, in_ev = pos in b.requests, pos in b.evicted
            if state.done[pos]:
                spots["done"].append((k, pos))
            elif in_items and state.kv[pos] == 0:
                spots["fresh-item"].append((k, pos))
            elif in_items:
                spots["holding-item"].append((k, pos))
            elif state.kv[pos] == 0 and not in_ev:
                spots["no-kv"].append((k, pos))
        state.apply(b)
    return spots


@PROPS
@given(MANY, st.data())
def test_evicting_a_request_that_holds_no_kv(built: BuiltSchedule, data: st.DataObject) -> None:
    spots = _eviction_spots(built)["no-kv"]
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = built.schedule.batches[k]
    bad = replace_batch(built.schedule, k, copy_batch(b, evicted=[*b.evicted.tolist(), pos]))
    trace = validate(built.instance, bad)
    assert [(v.rule, v.batch, v.request) for v in trace.violations] == [
        (Rule.BAD_EVICTION, k, rid(built, pos))
    ]
    assert "holds no KV" in trace.violations[0].message


@PROPS
@given(MANY, st.data())
def test_evicting_a_finished_request(built: BuiltSchedule, data: st.DataObject) -> None:
    spots = _eviction_spots(built)["done"]
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = built.schedule.batches[k]
    bad = replace_batch(built.schedule, k, copy_batch(b, evicted=[*b.evicted.tolist(), pos]))
    trace = validate(built.instance, bad)
    assert [(v.rule, v.batch, v.request) for v in trace.violations] == [
        (Rule.BAD_EVICTION, k, rid(built, pos))
    ]
    assert "completed" in trace.violations[0].message


@PROPS
@given(legal_schedules(), st.data())
def test_evict_and_process_in_one_batch(built: BuiltSchedule, data: st.DataObject) -> None:
    spots = _eviction_spots(built)
    kind = "holding-item" if spots["holding-item"] and data.draw(st.booleans()) else "fresh-item"
    k, pos = data.draw(st.sampled_from(spots[kind]))
    b = built.schedule.batches[k]
    bad = replace_batch(built.schedule, k, copy_batch(b, evicted=[*b.evicted.tolist(), pos]))
    trace = validate(built.instance, bad)
    got = [(v.rule, v.batch, v.request) for v in trace.violations]
    want = (Rule.BAD_EVICTION, k, rid(built, pos))
    if kind == "fresh-item":
        # Holds nothing yet: both "holds no KV" and "evicted and processed"; nothing else changes.
        assert got == [want, want]
        assert "holds no KV" in trace.violations[0].message
        assert "same batch" in trace.violations[1].message
    else:
        # Evicting a holder really drops its KV, so later items may break too; the first report is this.
        assert got[0] == want
        assert "same batch" in trace.violations[0].message


@PROPS
@given(legal_schedules(instances(min_requests=2, min_output=3)), st.data())
def test_evicting_twice_before_one_batch(built: BuiltSchedule, data: st.DataObject) -> None:
    spots = [(k, int(p)) for k, b in enumerate(built.schedule) for p in b.evicted]
    assume(spots)
    k, pos = data.draw(st.sampled_from(spots))
    b = built.schedule.batches[k]
    bad = replace_batch(built.schedule, k, copy_batch(b, evicted=[*b.evicted.tolist(), pos]))
    trace = validate(built.instance, bad)
    assert [(v.rule, v.batch, v.request) for v in trace.violations] == [
        (Rule.BAD_EVICTION, k, rid(built, pos))
    ]
    assert "twice" in trace.violations[0].message


# --------------------------------------------------------------- fixed-seed examples
def _tiny() -> Instance:
    reqs = (Request("a", 0.0, 3, 2), Request("b", 1.0, 2, 2))
    return Instance(reqs, Limits(kv_capacity=8), TimeModel("unit"))


def test_fixed_example_every_rule_is_reachable() -> None:
    """One hand-made schedule per rule, so a reader sees each violation's wording."""
    inst = _tiny()
    ok = Schedule(
        (
            Batch.of(0, 1, [0], [3], [Phase.PREFILL]),
            Batch.of(1, 1, [0, 1], [1, 2], [Phase.DECODE, Phase.PREFILL]),
            Batch.of(2, 1, [1], [1], [Phase.DECODE]),
        )
    )
    assert validate(inst, ok).ok
    cases = {
        Rule.EMPTY_BATCH: [Batch.of(0, 1, [], [], [])],
        Rule.BEFORE_ARRIVAL: [Batch.of(0, 1, [1], [2], [Phase.PREFILL])],
        Rule.DECODE_BEFORE_PREFILL: [Batch.of(0, 1, [0], [1], [Phase.DECODE])],
        Rule.PHASE_MISMATCH: [Batch.of(0, 1, [0], [3], [Phase.REFILL])],
        Rule.TOO_MANY_TOKENS: [Batch.of(0, 1, [0], [4], [Phase.PREFILL])],
        Rule.BAD_TOKENS: [Batch.of(0, 1, [0], [0], [Phase.PREFILL])],
        Rule.DUPLICATE_ITEM: [Batch.of(0, 1, [0, 0], [1, 1], [Phase.PREFILL, Phase.PREFILL])],
        Rule.UNKNOWN_REQUEST: [Batch.of(0, 1, [2], [1], [Phase.PREFILL])],
        Rule.WRONG_DURATION: [Batch.of(0, 2, [0], [3], [Phase.PREFILL])],
        Rule.BAD_EVICTION: [Batch.of(0, 1, [0], [3], [Phase.PREFILL], evicted=[1])],
    }
    for rule, batches in cases.items():
        rules = {v.rule for v in validate(inst, Schedule(tuple(batches))).violations}
        assert rule in rules, (rule, rules)
    with pytest.raises(ScheduleError, match="decode-before-prefill"):
        replay(inst, Schedule((Batch.of(0, 1, [0], [1], [Phase.DECODE]),)))


@pytest.mark.parametrize("start", [math.nan, math.inf, -math.inf])
def test_non_finite_start_is_an_overlap(start: float) -> None:
    inst = Instance((Request("a", 0.0, 2, 1),), Limits(kv_capacity=8), TimeModel("unit"))
    trace = validate(inst, Schedule((Batch.of(start, 1.0, [0], [2], [0]),)))
    assert (Rule.OVERLAP, 0) in [(v.rule, v.batch) for v in trace.violations]


def test_batch_of_refuses_fractional_values() -> None:
    with pytest.raises(ValueError, match="must be integers"):
        Batch.of(0, 1, [0.9], [1.7], [0])
