"""Metrics of replayed schedules, checked against hand-computed values."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.metrics import (
    RunMetrics,
    batch_metrics,
    print_summary,
    request_columns,
    request_metrics,
    run_metrics,
    summary_table,
)
from kvsched.schedule.tokens import token_stats
from kvsched.schedule.validate import Trace, instance_cost_model, replay, validate

#: (start, requests, tokens, evicted) of one batch, by request position.
Plan = Sequence[tuple[float, Sequence[int], Sequence[int], Sequence[int]]]

#: Cost model whose batches last as many time units as they process tokens.
TOKEN_TIME = TimeModel(
    "infermax-linear",
    {"a0": 0.0, "a1": 1.0, "b0": 0.0, "b1": 0.0, "p0": 0.0, "p1": 0.0, "p2": 0.0, "p3": 0.0},
)


def build_schedule(instance: Instance, plan: Plan) -> Schedule:
    """Step the plan through the core (which checks every batch) into a schedule."""
    state = EngineState(instance, instance_cost_model(instance))
    batches: list[Batch] = []
    for start, reqs, toks, evicted in plan:
        batch = state.make_batch(start, reqs, toks, evicted)
        state.step(batch)
        batches.append(batch)
    return Schedule(tuple(batches))


def run(instance: Instance, plan: Plan, *, strict: bool = True) -> Trace:
    return replay(instance, build_schedule(instance, plan), strict=strict)


# ----------------------------------------------------------- hand-built case
# Unit time, M = 10, no paging. Positions: A=0, B=1, C=2, D=3.
#   A: prompt 3 in two chunks (2 + 1), then two decodes.
#   B: prefilled, decodes once, is evicted (3 KV dropped, 2 tokens generated),
#      refills its S = 4 tokens in two chunks, the second generating its last token.
#   D: arrives at 0 but first runs at 2 (queueing delay 2).
#   C: arrives at 6 and waits for 7, after the engine idled from 5.
HAND = Instance(
    requests=(
        Request("A", 0.0, prompt=3, output=3, ttft_slo=2.0, tbt_slo=1.0),
        Request("B", 0.0, prompt=2, output=3, tbt_slo=2.5, cls="free"),
        Request("C", 6.0, prompt=1, output=1, ttft_slo=2.0, tbt_slo=0.1),
        Request("D", 0.0, prompt=1, output=2),
    ),
    limits=Limits(kv_capacity=10),
    time_model=TimeModel("unit"),
)
A, B, C, D = range(4)
HAND_PLAN: Plan = [
    (0, [A, B], [2, 2], []),  # B generates at 1
    (1, [A, B], [1, 1], []),  # A and B generate at 2
    (2, [A, D], [1, 1], [B]),  # B evicted; A and D generate at 3
    (3, [A, B, D], [1, 2, 1], []),  # A, D generate (and complete) at 4; B refills 2 of 4
    (4, [B], [2], []),  # B generates its 3rd token at 5
    (7, [C], [1], []),  # C generates at 8
]
# Token emission times: A 2, 3, 4; B 1, 2, 5; C 8; D 3, 4.


@pytest.fixture(scope="module")
def hand() -> Trace:
    return run(HAND, HAND_PLAN)


def test_request_times(hand: Trace) -> None:
    rm = request_metrics(hand)
    assert list(rm.index) == ["A", "B", "C", "D"]
    assert rm["first_scheduled"].tolist() == [0.0, 0.0, 7.0, 2.0]
    assert rm["queueing_delay"].tolist() == [0.0, 0.0, 1.0, 2.0]
    assert rm["ttft"].tolist() == [2.0, 1.0, 2.0, 3.0]
    assert rm["completion"].tolist() == [4.0, 5.0, 8.0, 4.0]
    assert rm["latency"].tolist() == [4.0, 5.0, 2.0, 4.0]
    assert rm["generated"].tolist() == [3, 3, 1, 2]
    assert rm["complete"].all()
    assert rm.loc["B", "cls"] == "free"
    assert pd.isna(rm.loc["A", "cls"])


def test_request_tbt(hand: Trace) -> None:
    rm = request_metrics(hand)
    # TBT lists: A [1, 1]; B [1, 3]; C none; D [1].
    assert rm.loc["A", ["tbt_max", "tbt_p50", "tbt_p99", "tpot"]].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert rm.loc["B", "tbt_max"] == 3.0
    assert rm.loc["B", "tbt_p50"] == 2.0
    assert rm.loc["B", "tbt_p99"] == pytest.approx(1 + 0.99 * 2)  # 2.98
    assert rm.loc["B", "tpot"] == 2.0  # (5 - 1) / 2
    assert rm.loc["D", ["tbt_max", "tbt_p50", "tbt_p99", "tpot"]].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert rm.loc["C", ["tbt_max", "tbt_p50", "tbt_p99", "tpot"]].isna().all()


def test_request_work(hand: Trace) -> None:
    rm = request_metrics(hand)
    assert rm["evictions"].tolist() == [0, 1, 0, 0]
    # B processed 2 + 1 + 2 + 2 = 7 tokens against I + O - 1 = 4: the 3 dropped KV.
    assert rm["processed"].tolist() == [5, 7, 1, 2]
    assert rm["recomputed_tokens"].tolist() == [0, 3, 0, 0]


def test_request_slos(hand: Trace) -> None:
    rm = request_metrics(hand)
    # A: TTFT 2 <= 2 and p99 TBT 1 <= 1 (both on the boundary).
    # B: p99 TBT 2.98 > 2.5 misses, though its median 2 would meet it; no TTFT SLO.
    # C: TTFT 2 <= 2; a single token meets any TBT SLO. D: no SLO at all.
    assert rm["ttft_slo_met"].tolist() == [True, pd.NA, True, pd.NA]
    assert rm["tbt_slo_met"].tolist() == [True, False, True, pd.NA]
    assert rm["slo_met"].tolist() == [True, False, True, pd.NA]
    assert str(rm["slo_met"].dtype) == "boolean"


def test_batch_metrics(hand: Trace) -> None:
    bm = batch_metrics(hand)
    assert list(bm.index) == [0, 1, 2, 3, 4, 5]
    assert bm["start"].tolist() == [0, 1, 2, 3, 4, 7]
    assert bm["end"].tolist() == [1, 2, 3, 4, 5, 8]
    assert bm["duration"].tolist() == [1.0] * 6
    assert bm["num_items"].tolist() == [2, 2, 2, 3, 1, 1]
    assert bm["num_tokens"].tolist() == [4, 2, 2, 4, 2, 1]
    assert bm["prefill_tokens"].tolist() == [4, 1, 1, 2, 2, 1]
    assert bm["num_decodes"].tolist() == [0, 1, 1, 2, 0, 0]
    assert bm["kv_tokens"].tolist() == [4, 6, 5, 9, 4, 1]
    assert bm["kv_util"].tolist() == pytest.approx([0.4, 0.6, 0.5, 0.9, 0.4, 0.1])
    assert bm["num_running"].tolist() == [2, 2, 2, 3, 1, 1]
    assert bm["num_evicted"].tolist() == [0, 0, 1, 0, 0, 0]
    assert bm["num_generated"].tolist() == [1, 2, 2, 2, 1, 1]


def test_run_metrics(hand: Trace) -> None:
    m = run_metrics(hand)
    assert isinstance(m, RunMetrics)
    assert (m.num_requests, m.num_completed, m.num_batches) == (4, 4, 6)
    assert m.makespan == 8.0
    # Latencies [4, 5, 2, 4]: sorted [2, 4, 4, 5].
    assert m.total_latency == 15.0
    assert m.mean_latency == 3.75
    assert m.p50_latency == 4.0
    assert m.p99_latency == pytest.approx(4 + 0.97)
    # TTFTs [2, 1, 2, 3]: sorted [1, 2, 2, 3].
    assert m.mean_ttft == 2.0
    assert m.p50_ttft == 2.0
    assert m.p99_ttft == pytest.approx(2 + 0.97)
    assert m.mean_tpot == pytest.approx(4 / 3)  # A 1, B 2, D 1
    assert m.max_tbt == 3.0
    assert m.generated_tokens == 9
    assert m.tokens_per_s == 9 / 8
    assert m.requests_per_s == 4 / 8
    assert m.processed_tokens == 15
    assert m.recomputed_tokens == 3
    assert m.evictions == 1
    assert m.mean_kv_util == pytest.approx(2.9 / 6)
    assert m.peak_kv_util == pytest.approx(0.9)
    assert m.mean_batch_size == pytest.approx(11 / 6)
    assert m.slo_attainment == pytest.approx(2 / 3)
    d = m.to_dict()
    assert d["makespan"] == 8.0 and d["slo_attainment"] == pytest.approx(2 / 3)
    assert set(d) == set(RunMetrics.__dataclass_fields__)


# ------------------------------------------- uneven durations, paged KV
# Batches last as many time units as they process tokens; blocks of 2 tokens, M = 8.
PAGED = Instance(
    requests=(
        Request("X", 0.0, prompt=3, output=2),
        Request("Y", 0.0, prompt=1, output=1),
        Request("Z", 10.0, prompt=2, output=1),
    ),
    limits=Limits(kv_capacity=8, block_size=2),
    time_model=TOKEN_TIME,
)
PAGED_PLAN: Plan = [
    (0, [0, 1], [3, 1], []),  # lasts 4: X holds 2 blocks, Y 1 -> 6 of 8 tokens
    (4, [0], [1], []),  # lasts 1: X holds 4 tokens = 2 blocks
    (10, [2], [2], []),  # lasts 2 after an idle gap: Z holds 1 block
]


def test_paged_kv_util_is_time_weighted() -> None:
    trace = run(PAGED, PAGED_PLAN)
    bm = batch_metrics(trace)
    assert bm["duration"].tolist() == [4.0, 1.0, 2.0]
    assert bm["kv_tokens"].tolist() == [4, 4, 2]
    assert bm["kv_util"].tolist() == pytest.approx([0.75, 0.5, 0.25])
    m = run_metrics(trace)
    # Weighted by the 7 busy time units; the idle gap 5..10 does not count.
    assert m.mean_kv_util == pytest.approx((0.75 * 4 + 0.5 * 1 + 0.25 * 2) / 7)
    assert m.peak_kv_util == pytest.approx(0.75)
    assert m.makespan == 12.0
    assert m.tokens_per_s == pytest.approx(4 / 12)
    assert m.slo_attainment is None
    rm = request_metrics(trace)
    assert rm["ttft"].tolist() == [4.0, 4.0, 2.0]
    assert rm["latency"].tolist() == [5.0, 4.0, 2.0]
    assert rm.loc["X", "tbt_max"] == 1.0 and rm.loc["X", "tpot"] == 1.0
    assert rm["slo_met"].isna().all()


# ------------------------------------------------------ incomplete trace
def test_incomplete_requests_get_nan_times() -> None:
    schedule = build_schedule(HAND, HAND_PLAN[:3])  # stops before A finishes
    trace = replay(HAND, schedule, strict=False)
    assert not trace.ok
    rm = request_metrics(trace)
    assert rm["complete"].tolist() == [False, False, False, False]
    assert rm["generated"].tolist() == [2, 2, 0, 1]
    for col in ("ttft", "completion", "latency", "tbt_max", "tbt_p50", "tbt_p99", "tpot"):
        assert rm[col].isna().all(), col
    assert rm["queueing_delay"].tolist()[:2] == [0.0, 0.0]
    assert math.isnan(rm.loc["C", "first_scheduled"])
    # B had 3 tokens dropped by its eviction and holds none now.
    assert rm["recomputed_tokens"].tolist() == [0, 3, 0, 0]
    assert rm["slo_met"].tolist() == [False, False, False, pd.NA]
    m = run_metrics(trace)
    assert m.num_completed == 0 and math.isnan(m.mean_latency) and m.requests_per_s == 0.0
    assert m.slo_attainment == 0.0
    table = summary_table(trace)
    assert "violation" in str(table.caption)


# ------------------------------------------------------- random greedy run
def random_instance(n: int, seed: int) -> Instance:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.004, n))
    prompts = rng.integers(1, 41, n)
    outputs = rng.integers(1, 31, n)
    requests = tuple(
        Request(
            f"r{k}",
            float(arrivals[k]),
            int(prompts[k]),
            int(outputs[k]),
            ttft_slo=0.2 if k % 3 == 0 else None,
            tbt_slo=0.02 if k % 4 == 0 else None,
        )
        for k in range(n)
    )
    return Instance(requests, Limits(kv_capacity=256, max_batch_tokens=32), TimeModel("infermax-linear"))


def greedy_trace(instance: Instance, seed: int) -> Trace:
    """FCFS with whole-request KV reservation, chunked prefill and random evictions."""
    rng = np.random.default_rng(seed)
    state = EngineState(instance, instance_cost_model(instance))
    lim = instance.limits
    peak = state.prompt + state.output - 1
    waiting = deque(int(k) for k in np.argsort(state.arrival, kind="stable"))
    running: list[int] = []
    batches: list[Batch] = []
    t = 0.0
    while not state.all_done:
        running = [r for r in running if not state.done[r]]
        if not running and state.arrival[waiting[0]] > t:
            t = float(state.arrival[waiting[0]])  # idle until the next arrival
        # Reserving each request's peak keeps KV within M without preemption.
        while (
            waiting
            and state.arrival[waiting[0]] <= t
            and peak[running].sum() + peak[waiting[0]] <= lim.kv_capacity
        ):
            running.append(waiting.popleft())
        evicted: list[int] = []
        holding = [r for r in running if state.kv[r] > 0]
        if len(running) > 1 and holding and rng.random() < 0.1:
            victim = holding[-1]
            evicted.append(victim)
            running.remove(victim)
            waiting.appendleft(victim)
        reqs, toks = [], []
        budget = lim.max_batch_tokens
        for r in running:
            c = min(int(state.unprocessed(r)), budget)
            if c > 0:
                reqs.append(r)
                toks.append(c)
                budget -= c
        batch = state.make_batch(t, reqs, toks, evicted)
        state.step(batch)
        batches.append(batch)
        t = batch.start + batch.duration
    return replay(instance, Schedule(tuple(batches)))


@pytest.fixture(scope="module")
def greedy() -> Trace:
    return greedy_trace(random_instance(200, seed=7), seed=11)


def test_greedy_run_is_consistent(greedy: Trace) -> None:
    inst = greedy.instance
    rm = request_metrics(greedy)
    bm = batch_metrics(greedy)
    m = run_metrics(greedy)
    assert greedy.ok and len(rm) == 200
    assert (rm["generated"] == rm["output"]).all()
    assert bm["num_generated"].sum() == rm["output"].sum() == m.generated_tokens
    assert (rm["first_scheduled"] >= rm["arrival"]).all()
    assert (rm["queueing_delay"] >= 0).all()
    assert (rm["ttft"] > 0).all()
    assert (rm["latency"] >= rm["ttft"]).all()
    multi = rm["output"] > 1
    assert rm.loc[multi, "latency"].to_numpy() == pytest.approx(
        (rm["ttft"] + rm["tpot"] * (rm["output"] - 1))[multi].to_numpy()
    )
    assert rm.loc[~multi, "tpot"].isna().all()
    assert (rm.loc[multi, "tbt_p50"] <= rm.loc[multi, "tbt_p99"]).all()
    assert (rm.loc[multi, "tbt_p99"] <= rm.loc[multi, "tbt_max"]).all()
    assert (rm.loc[multi, "tpot"] <= rm.loc[multi, "tbt_max"] + 1e-12).all()
    # Work: every processed token is either needed once (I + O - 1) or redone.
    peak = rm["prompt"] + rm["output"] - 1
    assert (rm["processed"] == peak + rm["recomputed_tokens"]).all()
    assert m.processed_tokens == bm["num_tokens"].sum() == rm["processed"].sum()
    assert m.evictions == rm["evictions"].sum() == bm["num_evicted"].sum() > 0
    assert ((rm["recomputed_tokens"] > 0) == (rm["evictions"] > 0)).all()
    assert m.recomputed_tokens == rm["recomputed_tokens"].sum() > 0
    assert (bm["prefill_tokens"] < bm["num_tokens"]).any()  # prefill chunks share batches with decodes
    assert m.makespan == bm["end"].iloc[-1]
    # Rates run from the first arrival (vLLM's benchmark clock), not from time 0.
    span = m.makespan - rm["arrival"].min()
    assert m.tokens_per_s == pytest.approx(m.generated_tokens / span)
    assert m.requests_per_s == pytest.approx(200 / span)
    assert 0 < m.mean_kv_util <= m.peak_kv_util <= 1
    assert (bm["kv_tokens"] <= inst.limits.kv_capacity).all()
    has_slo = rm["slo_met"].notna()
    assert m.slo_attainment == pytest.approx(rm.loc[has_slo, "slo_met"].astype(bool).mean())


def test_greedy_tbt_matches_per_request_reference(greedy: Trace) -> None:
    """The vectorised TBT statistics equal a plain per-request loop over the records."""
    times: dict[int, list[float]] = {}
    for rec in greedy.records:
        for pos in rec.generated:
            times.setdefault(int(pos), []).append(rec.end)
    rm = request_metrics(greedy)
    for pos, req in enumerate(greedy.instance.requests):
        t = np.array(times[pos])
        assert rm.loc[req.id, "ttft"] == pytest.approx(t[0] - req.arrival)
        assert rm.loc[req.id, "completion"] == t[-1]
        gaps = np.diff(t)
        if gaps.size:
            got = rm.loc[req.id, ["tbt_max", "tbt_p50", "tbt_p99"]].to_numpy(dtype=float)
            want = [gaps.max(), np.percentile(gaps, 50), np.percentile(gaps, 99)]
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_summary_renders(greedy: Trace) -> None:
    console = Console(record=True, width=100)
    print_summary(greedy, console, title="greedy", unit="s")
    text = console.export_text()
    for word in ("greedy", "workload", "latency", "throughput", "memory", "SLO", "tokens / s", "200 / 200"):
        assert word in text, word
    assert summary_table(run(PAGED, PAGED_PLAN)).columns[2].header == "value"
    paged = Console(record=True, width=100)
    print_summary(run(PAGED, PAGED_PLAN), paged)  # a cost model in seconds: labelled so by default
    text = paged.export_text()
    assert "no request has one" in text and "makespan (s)" in text and "tokens / s" in text
    assert "attainment (requests' own SLOs)" in text  # not --slo's goodput, printed beside it


def test_summary_labels_the_trace_own_unit(hand: Trace, greedy: Trace) -> None:
    # HAND is in unit time: its times are slots, never seconds, whatever the caller's default.
    slots = Console(record=True, width=100)
    print_summary(hand, slots)
    text = slots.export_text()
    assert "makespan (slot)" in text and "tokens / slot" in text and "(s)" not in text
    print_summary(hand, Console(record=True), unit="slot")  # its own label, said again: taken
    for trace, unit in ((hand, "s"), (greedy, "slot"), (hand, "furlongs"), (hand, 5)):
        with pytest.raises(InputError, match=r"^unit: "):
            print_summary(trace, Console(record=True), unit=unit)
        with pytest.raises(InputError, match=r"^unit: "):
            summary_table(trace, unit=unit)


def test_summary_and_run_metrics_check_their_arguments(hand: Trace, greedy: Trace) -> None:
    with pytest.raises(InputError, match=r"^console: .*got int"):
        print_summary(hand, console=5)
    with pytest.raises(InputError, match=r"^metrics: "):
        summary_table(hand, metrics=5)
    with pytest.raises(InputError, match=r"^requests: .*got int"):
        run_metrics(hand, requests=5)
    with pytest.raises(InputError, match=r"^clock: "):
        run_metrics(hand, clock=5)
    with pytest.raises(InputError, match=r"^requests: .*another trace"):
        run_metrics(hand, requests=request_metrics(greedy))
    with pytest.raises(InputError, match=r"^requests: no column"):
        run_metrics(hand, requests={"arrival": np.zeros(4)})
    with pytest.raises(InputError, match=r"^stats: .*got int"):
        request_metrics(hand, stats=5)
    with pytest.raises(InputError, match=r"^stats: .*another trace"):
        request_metrics(hand, stats=token_stats(greedy))
    # The trace's own columns, as a frame, a plain dict or request_columns: the same figures.
    expected = run_metrics(hand)
    assert run_metrics(hand, requests=request_metrics(hand)) == expected
    assert run_metrics(hand, requests=dict(request_columns(hand))) == expected
    assert run_metrics(hand, requests=request_columns(hand)) == expected


def test_requests_of_another_schedule_of_the_instance_refused(hand: Trace) -> None:
    # Same requests (arrivals, prompts, outputs), another schedule: C served later.
    later = run(HAND, [*HAND_PLAN[:-1], (9, [C], [1], [])])
    with pytest.raises(InputError, match=r"^requests: .*another schedule"):
        run_metrics(hand, requests=request_columns(later))


def test_metrics_of_a_trace_that_generated_nothing() -> None:
    # A replay in which no token was generated (an empty schedule, one partial prefill): defined
    # figures, NaN where a time does not exist, as for any unfinished request.
    inst = Instance((Request("a", 0, 2, 2), Request("b", 0, 2, 2)), Limits(100))
    partial = Batch(0, 1, np.array([0]), np.array([1]), np.array([0]))
    for schedule in (Schedule(()), Schedule((partial,))):
        trace = validate(inst, schedule)
        assert trace.violations
        rm = request_metrics(trace)
        assert rm["generated"].tolist() == [0, 0] and not rm["complete"].any()
        assert rm[["ttft", "latency", "tbt_max", "tbt_p50", "tbt_p99", "tpot"]].isna().all().all()
        m = run_metrics(trace)
        assert m.num_completed == 0 and m.generated_tokens == 0 and math.isnan(m.mean_ttft)


def test_summary_shows_an_slo_given_for_every_request_beside_the_requests_own(greedy: Trace) -> None:
    from kvsched.schedule.serving import SLO, good_flags, serving_metrics

    slo = SLO(ttft=2.0)  # 127 of the 200 requests meet it
    serving = serving_metrics(greedy, slo)
    console = Console(record=True, width=140)
    print_summary(greedy, console, serving=serving)
    text = console.export_text()
    # The row read "no SLOs" while the goodput line below counted the given SLO.
    good = int(good_flags(request_metrics(greedy), slo).sum())
    assert good == serving.good_requests
    share = f"{100 * good / serving.num_requests:.1f} %"
    assert 0 < good < serving.num_requests
    assert "attainment (ttft <= 2)" in text and f"{share} ({good:,} of {serving.num_requests:,})" in text
    assert "attainment (requests' own SLOs)" in text
    plain = Console(record=True, width=140)
    print_summary(greedy, plain, serving=serving_metrics(greedy))  # no SLO for every request: no such row
    assert "ttft <=" not in plain.export_text()
