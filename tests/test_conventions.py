"""The MC-SF (seed 004) request convention mapped onto ours, checked round by round in the core."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.costmodel import UnitCost
from kvsched.errors import InfeasibleInstanceError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.conventions import (
    CONVENTIONS,
    active_rounds,
    completion_time,
    from_mcsf,
    mcsf_instance,
    mcsf_memory_profile,
    to_mcsf,
)
from kvsched.schedule.core import EngineState, Rule
from kvsched.schedule.ir import Phase
from kvsched.schedule.validate import validate
from tests.strategies import SETTINGS, schedule_from_starts

SIZES = [(1, 1), (1, 4), (2, 1), (3, 2), (5, 5), (8, 3), (12, 7)]


def test_mapping_values() -> None:
    assert from_mcsf(5, 3) == (5, 4)
    assert from_mcsf(5, 3, "eq1") == (5, 4)
    assert from_mcsf(5, 3, "ip") == (5, 3)
    assert to_mcsf(5, 4) == (5, 3)
    assert to_mcsf(5, 3, "ip") == (5, 3)
    assert mcsf_memory_profile(4, 3, "eq1") == (4, 5, 6, 7)  # o + 1 rounds, peak s + o
    assert mcsf_memory_profile(4, 3, "ip") == (4, 5, 6)  # o rounds, peak s + o - 1


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_mapping_round_trips(convention: str) -> None:
    for s in range(1, 6):
        for o in range(1, 8):
            prompt, output = from_mcsf(s, o, convention)
            assert to_mcsf(prompt, output, convention) == (s, o)
            peak = max(mcsf_memory_profile(s, o, convention))
            assert peak == prompt + output - 1  # the paper's peak is our peak KV (I + O - 1)
            assert len(mcsf_memory_profile(s, o, convention)) == output == active_rounds(o, convention)


def test_mapping_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="convention"):
        from_mcsf(1, 1, "paper")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        from_mcsf(0, 1)
    with pytest.raises(ValueError):
        from_mcsf(1, 0, "ip")
    assert from_mcsf(3, 0, "eq1") == (3, 1)  # a prompt-only request: one round
    with pytest.raises(ValueError):
        to_mcsf(1, 0)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize(("s", "o"), SIZES)
def test_single_request_memory_matches_the_paper_round_by_round(convention: str, s: int, o: int) -> None:
    profile = mcsf_memory_profile(s, o, convention)
    inst = mcsf_instance(s, [o], kv_capacity=max(profile), convention=convention)
    (req,) = inst.requests
    assert (req.prompt, req.output) == from_mcsf(s, o, convention)
    state = EngineState(inst, UnitCost())
    kv, phases = [], []
    t = 0
    # The paper's rounds: the whole prompt in the first, then one output token per round.
    while not state.all_done:
        tokens = s if t == 0 else 1
        rec = state.step(state.make_batch(float(t), [0], [tokens]))
        kv.append(rec.kv_tokens)
        phases.append(Phase.PREFILL if rec.num_decodes == 0 else Phase.DECODE)
        t += 1
    assert tuple(kv) == profile
    assert len(kv) == active_rounds(o, convention)
    assert phases == [Phase.PREFILL] + [Phase.DECODE] * (len(kv) - 1)
    assert state.completion[0] == completion_time(0, o, convention)
    # The peak fits exactly in M = the paper's peak; one less does not (where one less is still a capacity:
    # an instance of M = 0 is refused as every entry point refuses it).
    if max(profile) == 1:
        return
    tight = Instance(inst.requests, Limits(kv_capacity=max(profile) - 1), TimeModel("unit"))
    trace = validate(tight, schedule_from_starts(inst, [0]))
    assert [(v.rule, v.batch) for v in trace.violations] == [(Rule.KV_CAPACITY, len(profile) - 1)]


def test_section_2_3_pair_fits_concurrently() -> None:
    """Seed 004 Sec. 2.3: two prompts growing to t1, t2 with t1 + t2 > M still run together.

    s = 2, M = 10, P1 grows to t1 = 5 = M / 2 (o1 = 3) and P2 to t2 = 9 (o2 = 7): a
    fixed-size view (t1 + t2 = 14 > 10) forbids running them together, but the
    memory is 2t1 = 10 <= M when both reach t1, and P1 then finishes and frees
    its memory before P2 grows past t1.
    """
    s, M, (t1, t2) = 2, 10, (5, 9)
    o1, o2 = t1 - s, t2 - s
    assert t1 + t2 > M and s <= t1 <= M / 2
    inst = mcsf_instance(s, [o1, o2], kv_capacity=M, convention="eq1")
    sched = schedule_from_starts(inst, [0, 0])
    trace = validate(inst, sched)
    assert trace.ok, trace.violations
    # Eq. (1) memory per round: sum over started i of (s + t - p_i) while o_i >= t - p_i.
    eq1 = [sum(s + t for o in (o1, o2) if o >= t) for t in range(o2 + 1)]
    assert eq1 == [4, 6, 8, 10, 6, 7, 8, 9]
    assert [r.kv_tokens for r in trace.records] == eq1
    assert max(eq1) <= M
    # Both started in round 0: completion times p + o + 1 under Eq. (1).
    assert trace.state.completion.tolist() == [o1 + 1, o2 + 1]


def test_mcsf_instance_fields() -> None:
    inst = mcsf_instance([3, 4], [2, 5], kv_capacity=12, arrivals=[0, 2], convention="ip", ids=["a", "b"])
    assert [(r.id, r.arrival, r.prompt, r.output, r.predicted_output) for r in inst.requests] == [
        ("a", 0.0, 3, 2, 2),
        ("b", 2.0, 4, 5, 5),
    ]
    lim = inst.limits
    assert (
        lim.kv_capacity,
        lim.block_size,
        lim.max_batch_tokens,
        lim.max_prefill_tokens,
        lim.max_running,
    ) == (
        12,
        1,
        None,
        None,
        None,
    )
    assert inst.time_model.name == "unit"
    assert inst.meta["convention"] == "ip"
    semi = mcsf_instance(2, [1, 1, 3], kv_capacity=6)
    assert all(r.arrival == 0 for r in semi.requests)
    assert [r.output for r in semi.requests] == [2, 2, 4]
    # Peaks: s + o under Eq. (1), s + o - 1 under the IP.
    with pytest.raises(InfeasibleInstanceError):
        mcsf_instance(2, [5], kv_capacity=6, convention="eq1")
    assert mcsf_instance(2, [5], kv_capacity=6, convention="ip").requests[0].peak_kv == 6
    with pytest.raises(ValueError):
        mcsf_instance([1, 2, 3], [1, 1], kv_capacity=9)


def _paper_memory(s: list[int], o: list[int], starts: list[int], t: int, convention: str) -> int:
    """Memory in round t as the paper writes it (Eq. (1), or App. B.1 constraint 3)."""
    window = (lambda d, oi: 0 <= d <= oi) if convention == "eq1" else (lambda d, oi: 0 <= d < oi)
    return sum(si + t - p for si, oi, p in zip(s, o, starts, strict=True) if window(t - p, oi))


@settings(SETTINGS, max_examples=60)
@given(
    st.sampled_from(CONVENTIONS),
    st.lists(st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=5),
    st.integers(0, 12),
)
def test_core_capacity_check_is_the_papers_memory_constraint(
    convention: str, reqs: list[tuple[int, int, int]], slack: int
) -> None:
    """For any start rounds, our KV per batch is the paper's memory per round, and the
    validator flags KV_CAPACITY exactly in the rounds where the paper's constraint fails."""
    s = [r[0] for r in reqs]
    o = [r[1] for r in reqs]
    starts = [r[2] for r in reqs]
    peak = max(mcsf_memory_profile(si, oi, convention)[-1] for si, oi in zip(s, o, strict=True))
    M = peak + slack
    inst = mcsf_instance(s, o, kv_capacity=M, convention=convention)
    sched = schedule_from_starts(inst, starts)
    trace = validate(inst, sched)
    rounds = [int(b.start) for b in sched.batches]
    memory = [_paper_memory(s, o, starts, t, convention) for t in rounds]
    assert [r.kv_tokens for r in trace.records] == memory
    # Every round in which some request is active has a batch.
    last = max(p + active_rounds(oi, convention) for p, oi in zip(starts, o, strict=True))
    busy = [t for t in range(last) if _paper_memory(s, o, starts, t, convention) > 0]
    assert rounds == busy
    want = [(Rule.KV_CAPACITY, k) for k, m in enumerate(memory) if m > M]
    assert [(v.rule, v.batch) for v in trace.violations] == want
    completions = [completion_time(p, oi, convention) for p, oi in zip(starts, o, strict=True)]
    np.testing.assert_array_equal(trace.state.completion, completions)


def test_jaillet_request_is_an_infermax_request() -> None:
    """A request of the paper under either convention is an ordinary instance of ours."""
    inst = Instance(
        (Request("x", 0.0, *from_mcsf(3, 2, "eq1")), Request("y", 0.0, *from_mcsf(3, 2, "ip"))),
        Limits(kv_capacity=9),
        TimeModel("unit"),
    )
    trace = validate(inst, schedule_from_starts(inst, [0, 0]))
    assert trace.ok
    # x: 3 rounds (3, 4, 5); y: 2 rounds (3, 4); together 6, 8, 5.
    assert [r.kv_tokens for r in trace.records] == [6, 8, 5]
