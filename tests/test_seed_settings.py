"""Hand-built legal schedules for each seed paper's setting.

Each setting is built twice: by stepping :class:`EngineState` with explicit
batches (phases and durations derived by the core), and as hand-written
:meth:`Batch.of` literals checked with :func:`validate`; the two must agree.

* Chunked prefill with a Sarathi-style budget (seeds 001/003): a long prompt is
  split into chunks of at most P while other requests decode in the same hybrid
  batches.
* Eviction and refill (seed 003 Figure 1, and the vLLM pattern of Figure 15 at
  I = 4, O = 4, M = 8; digest ``shared/notes/003_004.md`` A6).
* Unit time (seed 004): semi-online instances with equal prompts, with the total
  end-to-end latency computed by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from kvsched.costmodel import CostModel, InfermaxLinear, UnitCost
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.conventions import completion_time, mcsf_instance
from kvsched.schedule.core import BatchRecord, EngineState, Rule
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.validate import validate
from tests.strategies import schedule_from_starts

P_, D_, R_ = 0, 1, 2  # phase codes, short for the literals below

#: One planned batch: (request positions, tokens, evicted positions).
Plan = Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]


def step_plan(instance: Instance, plan: Plan, cost_model: CostModel) -> tuple[Schedule, list[BatchRecord]]:
    """Step ``plan`` through the core back to back from time 0 (every batch must be legal)."""
    state = EngineState(instance, cost_model)
    batches, records = [], []
    for req, tok, ev in plan:
        batch = state.make_batch(state.clock, req, tok, ev)
        records.append(state.step(batch))
        batches.append(batch)
    assert state.all_done
    return Schedule(tuple(batches)), records


def literal(rows: Sequence[tuple]) -> Schedule:
    """Unit-time literals: (start, requests, tokens, phases[, evicted]) per batch."""
    return Schedule(tuple(Batch.of(r[0], 1.0, *r[1:]) for r in rows))


# ------------------------------------------------------------- chunked prefill (001/003)
def chunked_instance(time_model: str = "unit") -> Instance:
    reqs = (
        Request("long", 0.0, prompt=10, output=2),
        Request("d1", 0.0, prompt=2, output=4),
        Request("d2", 0.0, prompt=2, output=4),
    )
    limits = Limits(kv_capacity=20, max_batch_tokens=6, max_prefill_tokens=4)
    return Instance(reqs, limits, TimeModel(time_model), name="sarathi-chunked")


CHUNKED_PLAN: Plan = [
    ([1, 2], [2, 2], []),  # B0: prefill the two short prompts
    ([1, 2, 0], [1, 1, 4], []),  # B1: hybrid: two decodes + first chunk of the long prompt (P = 4)
    ([1, 2, 0], [1, 1, 4], []),  # B2: two decodes + second chunk
    ([1, 2, 0], [1, 1, 2], []),  # B3: two decodes (both complete) + last chunk: first token of "long"
    ([0], [1], []),  # B4: the long request's decode completes it
]


@pytest.mark.parametrize("time_model", ["unit", "infermax-linear"])
def test_chunked_prefill_with_hybrid_batches(time_model: str) -> None:
    inst = chunked_instance(time_model)
    cm = UnitCost() if time_model == "unit" else InfermaxLinear()
    sched, records = step_plan(inst, CHUNKED_PLAN, cm)
    assert [b.phases.tolist() for b in sched] == [
        [P_, P_],
        [D_, D_, P_],
        [D_, D_, P_],
        [D_, D_, P_],
        [D_],
    ]
    # KV held during each batch: appends included, completed requests released afterwards.
    assert [r.kv_tokens for r in records] == [4, 3 + 3 + 4, 4 + 4 + 8, 5 + 5 + 10, 11]
    assert max(r.kv_tokens for r in records) == inst.limits.kv_capacity
    assert [r.prefill_tokens for r in records] == [4, 4, 4, 2, 0]
    assert [r.num_decodes for r in records] == [0, 2, 2, 2, 1]
    assert all(r.num_tokens <= 6 for r in records)
    assert [r.completed.tolist() for r in records] == [[], [], [], [1, 2], [0]]
    trace = validate(inst, sched)
    assert trace.ok
    assert trace.state.first_token[0] == records[3].end  # the last chunk generates the first token
    # The unchunked prompt breaks both budgets.
    state = EngineState(inst, cm)
    state.step(state.make_batch(0.0, [1, 2], [2, 2]))
    rules = {v.rule for v in state.check(state.make_batch(state.clock, [1, 2, 0], [1, 1, 10]))}
    assert rules == {Rule.PREFILL_BUDGET, Rule.TOKEN_BUDGET}


def test_chunked_prefill_literals() -> None:
    inst = chunked_instance()
    hand = literal(
        [
            (0, [1, 2], [2, 2], [P_, P_]),
            (1, [1, 2, 0], [1, 1, 4], [D_, D_, P_]),
            (2, [1, 2, 0], [1, 1, 4], [D_, D_, P_]),
            (3, [1, 2, 0], [1, 1, 2], [D_, D_, P_]),
            (4, [0], [1], [D_]),
        ]
    )
    assert validate(inst, hand).ok
    assert hand.same_as(step_plan(inst, CHUNKED_PLAN, UnitCost())[0])
    # Starting the long prompt with the short ones (8 prefill tokens) breaks P and C; labelling
    # its chunk as a refill is caught too.
    wrong = literal([(0, [1, 2, 0], [2, 2, 4], [P_, P_, R_])])
    got = [(v.rule, v.batch, v.request) for v in validate(inst, wrong).violations]
    assert got[:3] == [
        (Rule.PHASE_MISMATCH, 0, "long"),
        (Rule.TOKEN_BUDGET, 0, None),
        (Rule.PREFILL_BUDGET, 0, None),
    ]


# ---------------------------------------------------------- eviction + refill (003 Fig. 1)
def figure1_instance() -> Instance:
    """Seed 003 Figure 1, reconstructed: KV cache size 8; R3 is evicted in B2 because
    R1..R3 would otherwise hold 4 + 2 + 3 > 8 after B2, and R3 is refilled in B3.

    The caption pins only these numbers; the reconstruction [R]: R1 has a 3-token
    prompt (3 KV after B1, 4 after its decode in B2, where it generates its last
    token), R3 a 2-token prompt prefilled in B1 (its decode in B2 would make 3),
    and R2 arrives for B2 with a 2-token prompt (2 KV after B2).
    """
    reqs = (
        Request("R1", 0.0, prompt=3, output=2),
        Request("R2", 1.0, prompt=2, output=3),
        Request("R3", 0.0, prompt=2, output=3),
    )
    return Instance(reqs, Limits(kv_capacity=8), TimeModel("unit"), name="infermax-figure-1")


FIGURE1_PLAN: Plan = [
    ([0, 2], [3, 2], []),  # B1: prefill R1 and R3
    ([0, 1], [1, 2], [2]),  # B2: evict R3; decode R1 (completes), prefill R2
    ([1, 2], [1, 3], []),  # B3: decode R2, refill R3 (S = 2 + 1 = 3 tokens)
    ([1, 2], [1, 1], []),  # B4: decode both; both complete
]


def test_figure1_eviction_and_refill() -> None:
    inst = figure1_instance()
    sched, records = step_plan(inst, FIGURE1_PLAN, UnitCost())
    assert [b.phases.tolist() for b in sched] == [[P_, P_], [D_, P_], [D_, R_], [D_, D_]]
    assert [b.evicted.tolist() for b in sched] == [[], [2], [], []]
    assert [r.kv_tokens for r in records] == [5, 4 + 2, 3 + 3, 4 + 4]
    assert [r.completed.tolist() for r in records] == [[], [0], [], [1, 2]]
    trace = validate(inst, sched)
    assert trace.ok
    st = trace.state
    assert st.evictions.tolist() == [0, 0, 1]
    # R3 processes I + O - 1 = 4 tokens plus the 2 it lost: 2 (prefill) + 3 (refill) + 1 (decode).
    assert st.processed.tolist() == [4, 4, 6]
    # Without the eviction, B2 would hold R1..R3 = 4 + 2 + 3 = 9 > 8.
    state = EngineState(inst, UnitCost())
    state.step(state.make_batch(0.0, [0, 2], [3, 2]))
    bad = state.check(state.make_batch(1.0, [0, 1, 2], [1, 2, 1]))
    assert [(v.rule, v.batch) for v in bad] == [(Rule.KV_CAPACITY, 1)]
    assert "9 KV tokens" in bad[0].message


def test_figure1_literals() -> None:
    inst = figure1_instance()
    hand = literal(
        [
            (0, [0, 2], [3, 2], [P_, P_]),
            (1, [0, 1], [1, 2], [D_, P_], [2]),
            (2, [1, 2], [1, 3], [D_, R_]),
            (3, [1, 2], [1, 1], [D_, D_]),
        ]
    )
    assert validate(inst, hand).ok
    assert hand.same_as(step_plan(inst, FIGURE1_PLAN, UnitCost())[0])
    # Labelling R3's refill as a decode, or as a prefill, is caught.
    head = [(0, [0, 2], [3, 2], [P_, P_]), (1, [0, 1], [1, 2], [D_, P_], [2])]
    as_decode = literal([*head, (2, [2], [1], [D_])])
    as_prefill = literal([*head, (2, [2], [3], [P_])])
    first = [validate(inst, s).violations[0] for s in (as_decode, as_prefill)]
    assert [(v.rule, v.batch, v.request) for v in first] == [
        (Rule.DECODE_BEFORE_PREFILL, 2, "R3"),
        (Rule.PHASE_MISMATCH, 2, "R3"),
    ]


# ------------------------------------------------------ Figure 15 vLLM pattern (003 A6)
FIG15_I, FIG15_O = 4, 4


def figure15_instance(time_model: str = "unit") -> Instance:
    """O = B = 4, I = 4, M = max(2I, I + O - 1) = 8: two prefills fit, only one request
    can keep its KV to its last token (I + O - 1 <= M < 2(I + O - 1))."""
    prompt, output = FIG15_I, FIG15_O
    M = max(2 * prompt, prompt + output - 1)
    assert prompt + output - 1 <= M < 2 * (prompt + output - 1)
    reqs = tuple(Request(f"r{k}", 0.0, prompt, output) for k in range(4))
    return Instance(reqs, Limits(kv_capacity=M, max_batch_tokens=4096), TimeModel(time_model), name="fig15")


def _pair(a: int, b: int) -> Plan:
    n_in = FIG15_I
    return [
        ([a, b], [n_in, n_in], []),  # prefill both (2I = M)
        ([a], [1], [b]),  # evict b; decode a
        ([a], [1], []),
        ([a], [1], []),  # a generates its 4th token and completes
        ([b], [n_in + 1], []),  # refill b: S = I + 1
        ([b], [1], []),
        ([b], [1], []),  # b completes
    ]


FIG15_PLAN: Plan = _pair(0, 1) + _pair(2, 3)


def test_figure15_vllm_pattern() -> None:
    inst = figure15_instance()
    n_in = FIG15_I
    sched, records = step_plan(inst, FIG15_PLAN, UnitCost())
    trace = validate(inst, sched)
    assert trace.ok
    assert len(sched) == 14
    assert int(trace.state.evictions.sum()) == 2
    assert sum(r.num_tokens for r in records) == 6 * n_in + 12 == 36
    assert int(trace.state.processed.sum()) == 36
    per_pair = [2 * n_in, n_in + 1, n_in + 2, n_in + 3, n_in + 1, n_in + 2, n_in + 3]
    assert [r.kv_tokens for r in records] == per_pair * 2
    assert max(r.kv_tokens for r in records) == inst.limits.kv_capacity
    assert [r.prefill_tokens > 0 for r in records] == [True, False, False, False, True, False, False] * 2
    # Without the eviction, the second batch would need 2(I + 1) = 10 > 8.
    state = EngineState(inst, UnitCost())
    state.step(state.make_batch(0.0, [0, 1], [n_in, n_in]))
    assert [v.rule for v in state.check(state.make_batch(1.0, [0, 1], [1, 1]))] == [Rule.KV_CAPACITY]


def test_figure15_literals() -> None:
    inst = figure15_instance()
    rows = []
    t = 0
    for a, b in ((0, 1), (2, 3)):
        rows += [
            (t, [a, b], [4, 4], [P_, P_]),
            (t + 1, [a], [1], [D_], [b]),
            (t + 2, [a], [1], [D_]),
            (t + 3, [a], [1], [D_]),
            (t + 4, [b], [5], [R_]),
            (t + 5, [b], [1], [D_]),
            (t + 6, [b], [1], [D_]),
        ]
        t += 7
    hand = literal(rows)
    trace = validate(inst, hand)
    assert trace.ok
    assert trace.state.completion.tolist() == [4.0, 7.0, 11.0, 14.0]
    assert hand.same_as(step_plan(inst, FIG15_PLAN, UnitCost())[0])


def test_figure15_eviction_free_schedule_and_crossover() -> None:
    """vLLM-EF runs one request at a time: 16 batches and 4I + 12 tokens. Under the
    InferMax linear model the two schedules differ by exactly the digest's crossover
    expression (A6): T_evict - T_EF = -2(a0 + b0) + 2I a1 - 2I b1 + 2 p1 (I + 1)^2 + 2 p3."""
    n_in = FIG15_I
    inst = figure15_instance()
    ef = schedule_from_starts(inst, [0, 4, 8, 12])
    trace = validate(inst, ef)
    assert trace.ok
    assert len(ef) == 16
    assert int(trace.state.processed.sum()) == 4 * n_in + 12 == 28
    assert int(trace.state.evictions.sum()) == 0
    cm = InfermaxLinear(a0=1.0, a1=0.1, b0=0.5, b1=0.01, p0=0.7, p1=0.001, p2=0.02, p3=0.3)
    ef_plan = [([k], [n_in if j == 0 else 1], []) for k in range(4) for j in range(4)]
    timed = figure15_instance("infermax-linear")
    evict_sched, _ = step_plan(timed, FIG15_PLAN, cm)
    ef_sched, _ = step_plan(timed, ef_plan, cm)
    assert validate(timed, evict_sched, cm).ok and validate(timed, ef_sched, cm).ok
    delta = evict_sched.makespan - ef_sched.makespan
    expected = (
        -2 * (cm.a0 + cm.b0) + 2 * n_in * cm.a1 - 2 * n_in * cm.b1 + 2 * cm.p1 * (n_in + 1) ** 2 + 2 * cm.p3
    )
    assert delta == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------- unit time (seed 004 MC-SF)
def _tel(instance: Instance, schedule: Schedule) -> float:
    trace = validate(instance, schedule)
    assert trace.ok, trace.violations
    st = trace.state
    return float(np.sum(st.completion - st.arrival))


def test_semi_online_equal_prompts_eq1() -> None:
    """s = 1, M = 4, o = (1, 1, 2, 3) under Eq. (1) (our O = o + 1), all arriving at t = 0.

    Starts (0, 1, 1, 3) [digest B3]: memory per round 1, 4, 4, 4, 2, 3, 4; completions (end
    of the last round, o + 1 rounds each) 2, 3, 4, 7, so the total latency is 16 (the paper's
    sum of p + o is 12 = 16 - n). Algorithm 1's starts (0, 0, 2, 4) give 2, 2, 5, 8 = 17.
    """
    inst = mcsf_instance(1, [1, 1, 2, 3], kv_capacity=4, convention="eq1")
    assert [r.output for r in inst.requests] == [2, 2, 3, 4]
    best = schedule_from_starts(inst, [0, 1, 1, 3])
    assert [r.kv_tokens for r in validate(inst, best).records] == [1, 4, 4, 4, 2, 3, 4]
    assert _tel(inst, best) == 2 + 3 + 4 + 7 == 16
    assert _tel(inst, best) == sum(p + o for p, o in zip([0, 1, 1, 3], [1, 1, 2, 3], strict=True)) + 4
    alg1 = schedule_from_starts(inst, [0, 0, 2, 4])
    assert [r.kv_tokens for r in validate(inst, alg1).records] == [2, 4, 1, 2, 4, 2, 3, 4]
    assert _tel(inst, alg1) == 2 + 2 + 5 + 8 == 17
    # Hand-written literals of the better schedule.
    hand = literal(
        [
            (0, [0], [1], [P_]),
            (1, [0, 1, 2], [1, 1, 1], [D_, P_, P_]),
            (2, [1, 2], [1, 1], [D_, D_]),
            (3, [2, 3], [1, 1], [D_, P_]),
            (4, [3], [1], [D_]),
            (5, [3], [1], [D_]),
            (6, [3], [1], [D_]),
        ]
    )
    assert hand.same_as(best)
    assert _tel(inst, hand) == 16
    # Starting the longest request one round earlier overflows M in rounds 2 (2 + 2 + 1) and 3 (3 + 2).
    early = schedule_from_starts(inst, [0, 1, 1, 2])
    assert [(v.rule, v.batch) for v in validate(inst, early).violations] == [
        (Rule.KV_CAPACITY, 2),
        (Rule.KV_CAPACITY, 3),
    ]


def test_semi_online_equal_prompts_ip() -> None:
    """s = 1, M = 6, o = (2, 3, 3, 4, 5) under the IP convention (our O = o): completion =
    p + o exactly, so the total latency is the IP objective: 23 at starts (0, 0, 3, 0, 3),
    25 at Algorithm 1's starts (0, 0, 0, 3, 5) [digest B3]."""
    o = [2, 3, 3, 4, 5]
    inst = mcsf_instance(1, o, kv_capacity=6, convention="ip")
    best_starts, alg1_starts = [0, 0, 3, 0, 3], [0, 0, 0, 3, 5]
    best = schedule_from_starts(inst, best_starts)
    alg1 = schedule_from_starts(inst, alg1_starts)
    assert [r.kv_tokens for r in validate(inst, best).records] == [3, 6, 6, 6, 4, 6, 4, 5]
    assert [r.kv_tokens for r in validate(inst, alg1).records] == [3, 6, 6, 1, 2, 4, 6, 3, 4, 5]
    assert _tel(inst, best) == 2 + 3 + 6 + 4 + 8 == 23
    assert _tel(inst, alg1) == 2 + 3 + 3 + 7 + 10 == 25
    for starts, sched in ((best_starts, best), (alg1_starts, alg1)):
        done = validate(inst, sched).state.completion.tolist()
        assert done == [completion_time(p, oi, "ip") for p, oi in zip(starts, o, strict=True)]


def test_semi_online_arrivals_respected() -> None:
    """The same rounds with a request arriving late: starting it before it arrives is caught."""
    inst = mcsf_instance(2, [1, 2], kv_capacity=8, arrivals=[0, 2])
    assert _tel(inst, schedule_from_starts(inst, [0, 2])) == (2 - 0) + (5 - 2)
    bad = schedule_from_starts(inst, [0, 1])
    assert [(v.rule, v.batch, v.request) for v in validate(inst, bad).violations] == [
        (Rule.BEFORE_ARRIVAL, 1, "r1")
    ]
