"""The simulator's fast paths do exactly what the plain code does.

The core keeps the phase of every request incrementally, applies batches the
quick path accepted through a leaner :meth:`EngineState._advance_legal`, and
tests membership with a scratch array; the view counts arrivals with
:mod:`bisect`; InferMax keeps its running set as an array. Each is checked here
against the straightforward formulation it replaces.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.costmodel import BatchView, InfermaxLinear
from kvsched.heuristics import SchedulerView, make_policy, simulate
from kvsched.instances.generators import LogNormal, Poisson, synthetic
from kvsched.instances.model import Limits, TimeModel
from kvsched.schedule.core import TIME_TOL, BatchRecord, EngineState
from kvsched.schedule.ir import Phase
from kvsched.schedule.validate import replay
from tests.strategies import SETTINGS, legal_schedules

STATE_ARRAYS = (
    "generated",
    "kv",
    "refilling",
    "done",
    "evictions",
    "processed",
    "first_scheduled",
    "first_token",
    "completion",
)
COUNTERS = ("clock", "kv_tokens", "kv_blocks", "num_holding", "num_done", "num_batches")


def derived_phases(state: EngineState) -> np.ndarray:
    """The phase rule spelled out: prefill before any output, refill after an eviction, else decode."""
    return np.where(
        state.generated == 0, Phase.PREFILL, np.where(state.refilling, Phase.REFILL, Phase.DECODE)
    ).astype(np.int8)


def assert_same_record(a: BatchRecord, b: BatchRecord) -> None:
    """Two batch records agree: their counts, KV figures and generated and completed requests."""
    for field in ("index", "start", "end", "num_items", "num_tokens", "prefill_tokens", "num_decodes"):
        assert getattr(a, field) == getattr(b, field), field
    for field in ("kv_tokens", "kv_blocks", "num_running", "num_evicted"):
        assert getattr(a, field) == getattr(b, field), field
    np.testing.assert_array_equal(a.generated, b.generated)
    np.testing.assert_array_equal(a.completed, b.completed)


def assert_same_state(a: EngineState, b: EngineState) -> None:
    for name in STATE_ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in COUNTERS:
        assert getattr(a, name) == getattr(b, name), name


@SETTINGS
@given(legal_schedules())
def test_step_and_apply_leave_the_same_state_and_records(built):
    """step() (quick check, then the lean apply) and apply() (the tolerant path) agree batch by batch."""
    fast = EngineState(built.instance, built.cost_model)
    plain = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        made = fast.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted)
        assert made.same_as(batch)
        got, want = fast.step(made), plain.apply(batch)
        assert_same_record(got, want)
        assert_same_state(fast, plain)
        np.testing.assert_array_equal(fast.phase_of(np.arange(fast.n)), derived_phases(fast))


@SETTINGS
@given(legal_schedules(), st.integers(0, 2**31))
def test_phases_stay_derived_under_illegal_batches(built, seed):
    """apply() on mangled batches (what a validator replays) keeps the phase array in step."""
    rng = np.random.default_rng(seed)
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        tok = batch.tokens + rng.integers(-1, 3, size=batch.tokens.size)
        ev = rng.choice(state.n, size=int(rng.integers(0, 3)))
        mangled = type(batch).of(batch.start, batch.duration, batch.requests, tok, batch.phases, ev)
        state.apply(mangled)
        np.testing.assert_array_equal(state.phase_of(np.arange(state.n)), derived_phases(state))


def test_member_is_isin():
    inst = synthetic(
        30, 0, Limits(10_000), prompt=LogNormal.from_mean(20, sigma=0.5), output=LogNormal.from_mean(5)
    )
    state = EngineState(inst)
    rng = np.random.default_rng(1)
    for _ in range(200):
        values = rng.integers(-3, 33, size=int(rng.integers(0, 12)))
        pool = rng.integers(-3, 33, size=int(rng.integers(0, 12)))
        np.testing.assert_array_equal(state._member(values, pool), np.isin(values, pool))
        assert not state._mark.any()


def test_make_batch_copies_and_freezes_its_inputs():
    inst = synthetic(3, 0, Limits(1000), prompt=LogNormal.from_mean(5), output=LogNormal.from_mean(3))
    state = EngineState(inst, InfermaxLinear())
    req, tok = np.array([0, 1]), np.array([1, 1])
    batch = state.make_batch(0.0, req, tok)
    req[0], tok[0] = 2, 3
    assert batch.requests.tolist() == [0, 1] and batch.tokens.tolist() == [1, 1]
    for arr in (batch.requests, batch.tokens, batch.phases, batch.evicted):
        assert not arr.flags.writeable
    with pytest.raises(ValueError, match="same length"):
        state.make_batch(0.0, [0, 1], [1])


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(1, 4096), st.integers(0, 100_000), st.sampled_from([0, 1, 2])),
        min_size=0,
        max_size=40,
    )
)
def test_infermax_linear_matches_its_formula(items):
    """Bit for bit the reconstruction of seed 003's terms (shared/notes/003_004.md A2)."""
    model = InfermaxLinear(p2=1.3e-6)
    c = np.array([x[0] for x in items], dtype=np.int64)
    m = np.array([x[1] for x in items], dtype=np.int64)
    ph = np.array([x[2] for x in items], dtype=np.int8)
    dec, pre = ph == Phase.DECODE, ph != Phase.DECODE
    want = model.a0 + model.a1 * float(c.sum())
    if dec.any():
        want += model.b0 + model.b1 * float(m[dec].sum())
    if pre.any():
        cp, mp = c[pre].astype(np.float64), m[pre].astype(np.float64)
        want += (
            model.p0
            + model.p1 * float((cp * cp + 2.0 * mp * cp).sum())
            + model.p2 * float(mp.sum())
            + model.p3 * float(pre.sum())
        )
    assert model.batch_time(BatchView(c, m, ph)) == want


def test_view_counts_arrivals_like_searchsorted():
    inst = synthetic(
        200,
        3,
        Limits(10_000),
        arrival=Poisson(5.0),
        prompt=LogNormal.from_mean(20),
        output=LogNormal.from_mean(5),
    )
    state = EngineState(inst)
    view = SchedulerView(state)
    ordered = np.sort(state.arrival)
    for now in np.concatenate([ordered, ordered - TIME_TOL / 2, ordered + 2 * TIME_TOL, [-1.0, 1e9]]):
        view._advance(float(now))
        assert view.num_arrived == int(np.searchsorted(ordered, now + TIME_TOL, side="right"))


@pytest.mark.parametrize("name", ["sarathi", "vllm", "rank-i", "infermax-sec6", "sarathi-ef"])
def test_infermax_runs_replay_and_keep_reservations_consistent(name):
    """A run with many evictions replays, and the policy's books balance at the end.

    (The policy is not called after the last batch, so requests that completed in it are still
    on its books.)
    """
    inst = synthetic(
        120,
        5,
        Limits(1500, 4, 512),
        TimeModel("infermax-linear"),
        arrival=Poisson(200.0),
        prompt=LogNormal.from_mean(80, sigma=0.8, max=400),
        output=LogNormal.from_mean(40, sigma=1.0, max=300),
    )
    policy = make_policy(name)
    result = simulate(inst, policy)
    replay(inst, result.schedule, strict=True)
    assert (result.trace.state.evictions.sum() == 0) == name.endswith("-ef")
    running = policy._running.tolist()
    assert result.trace.state.done[running].all()
    assert set(np.flatnonzero(policy._alloc).tolist()) == set(running)
    assert policy._reserved == int((-(-policy._alloc // inst.limits.block_size)).sum())


@SETTINGS
@given(legal_schedules())
def test_a_copied_state_steps_on_its_own(built):
    """copy.copy(state) branches: stepping the copy leaves the original (phases included) as it was."""
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        before = copy.copy(state)
        twin = copy.copy(state)
        twin.step(twin.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted))
        assert_same_state(state, before)
        np.testing.assert_array_equal(state.phase_of(np.arange(state.n)), before.phase_of(np.arange(state.n)))
        state.apply(batch)
        assert_same_state(state, twin)
        np.testing.assert_array_equal(state.phase_of(np.arange(state.n)), twin.phase_of(np.arange(state.n)))


def test_step_and_apply_agree_on_large_batches_with_chunks_after_the_decodes():
    """_advance_legal applies the few prompt and refill chunks after a batch's decodes on their lists.

    Sarathi puts every decode first; with a small M it evicts, so some chunks are refills, and at
    this scale batches hold more than SMALL decodes. Stepping them (the tail path) and applying
    them through the tolerant path leave the same state and records, batch by batch.
    """
    from kvsched.costmodel import make_cost_model
    from kvsched.costmodel.small import SMALL

    inst = synthetic(
        400,
        5,
        Limits(kv_capacity=12_000, max_batch_tokens=600),
        TimeModel("unit"),
        prompt=LogNormal.from_mean(60, sigma=1.0, max=500),
        output=LogNormal.from_mean(80, sigma=1.0, max=400),
    )
    batches = simulate(inst, make_policy("sarathi"), coalesce=False).schedule.batches
    fast, plain = EngineState(inst, make_cost_model("unit")), EngineState(inst, make_cost_model("unit"))
    seen = {"tail": 0, "refill": 0, "first": 0, "mixed": 0}
    for batch in batches:
        decodes = int(np.count_nonzero(batch.phases == Phase.DECODE))
        chunks = batch.phases[decodes:]
        if decodes > SMALL and chunks.size and not np.count_nonzero(chunks == Phase.DECODE):
            seen["tail"] += 1
            seen["refill"] += int(np.count_nonzero(chunks == Phase.REFILL))
            seen["first"] += int(np.count_nonzero(fast.kv[batch.requests[decodes:]] == 0))
        elif decodes and decodes < batch.requests.size:
            seen["mixed"] += 1
        made = fast.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted)
        got, want = fast.step(made), plain.apply(batch)
        for field in ("index", "num_items", "num_tokens", "prefill_tokens", "num_decodes", "kv_tokens"):
            assert getattr(got, field) == getattr(want, field), field
        np.testing.assert_array_equal(got.generated, want.generated)
        np.testing.assert_array_equal(got.completed, want.completed)
        assert_same_state(fast, plain)
        np.testing.assert_array_equal(fast._left, plain._left)
        np.testing.assert_array_equal(fast.phase_of(np.arange(fast.n)), derived_phases(fast))
    assert fast.all_done and min(seen.values()) > 0, seen
