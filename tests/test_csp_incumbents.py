"""Incumbents: the eviction-aware greedy, best_incumbent and the LNS, each schedule replayed by the core."""

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.csp.incumbents import decide, greedy, kv_area
from kvsched.csp.incumbents.best import best_incumbent, variant_kind
from kvsched.csp.incumbents.knapsack import knapsack
from kvsched.csp.incumbents.lns import improve
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.instances.model import Instance, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.incumbent_instances import budget_instance, make_instance, objective_value, random_instance


# ------------------------------------------------------------------ legality and the two kernels
@pytest.mark.parametrize("seed", range(6))
def test_compiled_and_interpreted_kernels_make_the_same_legal_schedule(seed):
    rng = np.random.default_rng(seed)
    inst = random_instance(rng, int(rng.integers(2, 25)))
    for rule in ("remaining-area", "area", "fcfs"):
        for preempt in (True, False):
            fast = greedy(inst, rule, preempt=preempt)  # replayed strictly inside: legal and complete
            slow = greedy(inst, rule, preempt=preempt, jit=False)
            assert fast.schedule.same_as(slow.schedule)
            assert fast.value == slow.value == objective_value(inst, fast)


def _reference(inst: Instance, keys: np.ndarray, preempt: bool) -> list[tuple[list, list, list]]:
    """The greedy's rule written plainly (unit time, distinct keys): a full sort every batch, no skip lists."""
    lim, n = inst.limits, len(inst)
    prompt = np.array([r.prompt for r in inst.requests])
    output = np.array([r.output for r in inst.requests])
    arrival = np.array([r.arrival for r in inst.requests])
    gen, held, done = np.zeros(n, int), np.zeros(n, int), np.zeros(n, bool)
    refilling = np.zeros(n, bool)  # evicted after generating, refill not done (the core's rule)
    big = 1 << 40
    t = float(arrival.min())
    out = []
    while not done.all():
        live = [r for r in range(n) if not done[r] and arrival[r] <= t + 1e-9]
        if not live:
            t = float(arrival[~done].min())
            continue
        rank = (lambda r: keys[r]) if preempt else (lambda r: (held[r] == 0, keys[r]))
        free, tok_left = lim.kv_blocks, lim.max_batch_tokens or big
        pre_left, run_left = lim.max_prefill_tokens or big, lim.max_running or big
        items, evicted = [], []
        for r in sorted(live, key=rank):
            decode = held[r] > 0 and gen[r] > 0 and not refilling[r]
            tok = min(1, tok_left) if decode else min(prompt[r] + gen[r] - held[r], tok_left, pre_left)
            if tok >= 1 and run_left >= 1 and lim.blocks_for(held[r] + tok) <= free:
                items.append((r, tok))
                free -= lim.blocks_for(held[r] + tok)
                tok_left -= tok
                pre_left -= 0 if decode else tok
                run_left -= 1
            elif held[r] > 0 and run_left >= 1 and lim.blocks_for(held[r]) <= free:
                free -= lim.blocks_for(held[r])
                run_left -= 1
            elif held[r] > 0:
                evicted.append(r)
        held[evicted] = 0
        refilling[evicted] = gen[evicted] > 0
        for r, tok in items:
            held[r] += tok
            if held[r] == prompt[r] + gen[r]:
                gen[r] += 1
                refilling[r] = False
                done[r] = gen[r] == output[r]
                held[r] = 0 if done[r] else held[r]
        out.append((sorted(r for r, _ in items), [tok for _, tok in sorted(items)], sorted(evicted)))
        t += 1.0
    return out


@pytest.mark.parametrize("seed", range(8))
def test_kernel_follows_the_plain_rule(seed):
    rng = np.random.default_rng(100 + seed)
    inst = random_instance(rng, int(rng.integers(20, 160)))
    inst = Instance(inst.requests, inst.limits, TimeModel("unit"))
    keys = rng.permutation(len(inst)).astype(float)  # distinct: no tie rule to agree on
    for preempt in (True, False):
        log = decide(inst, priority=keys, preempt=preempt)
        got = [
            (
                log.requests[log.item_ptr[b] : log.item_ptr[b + 1]].tolist(),
                log.tokens[log.item_ptr[b] : log.item_ptr[b + 1]].tolist(),
                sorted(log.evicted[log.ev_ptr[b] : log.ev_ptr[b + 1]].tolist()),
            )
            for b in range(log.num_batches)
        ]
        assert got == _reference(inst, keys, preempt)


tiny = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2)), min_size=1, max_size=3
).flatmap(
    lambda reqs: st.tuples(
        st.just(reqs),
        st.integers(max(i + o - 1 for i, o, _ in reqs), 6),
        st.sampled_from([None, 2, 3]),
        st.sampled_from([None, 1, 2]),
    )
)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny, st.sampled_from(sorted(OBJECTIVES)))
def test_greedy_is_never_below_the_brute_force_optimum(case, objective):
    reqs, m, c, p = case
    inst = make_instance(reqs, m, c, p)
    optimum = brute_force(inst, objective)
    for rule in ("remaining-area", "area", "output"):
        for preempt in (True, False):
            assert greedy(inst, rule, preempt=preempt, objective=objective).value >= optimum - 1e-9


# ------------------------------------------------------------------ evictions
def test_preemption_evicts_when_it_helps():
    # A (I 5, O 5) holds 5 of M = 9 at t = 1, when B (I 5, O 1) arrives: B fits only if A goes
    # (pausing A is not enough). Evicting is optimal here; the best eviction-free schedule is worse.
    inst = make_instance([(5, 5, 0), (5, 1, 1)], 9)
    evicting = greedy(inst, "remaining-area", preempt=True)
    waiting = greedy(inst, "remaining-area", preempt=False)
    assert evicting.stats["evictions"] == 1 and waiting.stats["evictions"] == 0
    assert (evicting.value, waiting.value) == (7.0, 10.0)
    assert evicting.value == brute_force(inst, "total-latency") < brute_force(inst, "total-latency", False)


def test_eviction_is_free_under_unit_time_without_budget():
    """The notes' claim, by replay: a refill batch generates a token and holds I + G KV, as a decode would."""
    rng = np.random.default_rng(3)
    reqs = [(int(rng.integers(1, 30)), int(rng.integers(1, 30)), 0.0) for _ in range(40)]
    inst = make_instance(reqs, max(i + o - 1 for i, o, _ in reqs) + 20)
    inc = greedy(inst, "remaining-area")
    assert inc.stats["evictions"] > 0
    trace = replay(inst, inc.schedule)
    prompt = np.array([i for i, _, _ in reqs])
    output = np.array([o for _, o, _ in reqs])
    generated = np.zeros(len(reqs), dtype=np.int64)
    held = np.zeros(len(reqs), dtype=np.int64)
    for batch, record in zip(inc.schedule.batches, trace.records, strict=True):
        held[batch.evicted] = 0
        # Every item generates (no batch is spent on a refill alone) ...
        assert record.generated.size == batch.size
        # ... and holds exactly the op chain's I + G KV during the batch, refill or decode.
        paused = int(held.sum() - held[batch.requests].sum())
        chain = prompt[batch.requests] + generated[batch.requests]
        assert record.kv_tokens == paused + int(chain.sum())
        generated[batch.requests] += 1
        held[batch.requests] = np.where(generated[batch.requests] < output[batch.requests], chain, 0)
    # So each request is in exactly O batches: its op chain, evictions or not.
    assert trace.num_batches == len(inc.schedule)
    assert int(sum(b.size for b in inc.schedule.batches)) == sum(o for _, o, _ in reqs)


def test_budgets_chunk_prefills_and_charge_refills():
    inst = make_instance([(9, 4, 0), (7, 6, 0), (3, 8, 1), (8, 2, 2)], 16, c=5, p=4, r=2)
    inc = greedy(inst, "remaining-area")
    for batch in inc.schedule.batches:
        assert batch.num_tokens <= 5
        assert int(batch.tokens[batch.phases != 1].sum()) <= 4
    assert max(b.tokens.max() for b in inc.schedule.batches) > 1  # prefills went through in chunks


def test_block_size_and_linear_time_with_arrivals():
    rng = np.random.default_rng(7)
    reqs = [(int(rng.integers(1, 40)), int(rng.integers(1, 40)), float(rng.uniform(0, 5))) for _ in range(30)]
    inst = make_instance(reqs, 128, block=16, time_model="infermax-linear")
    inc = greedy(inst)
    assert inc.value == pytest.approx(objective_value(inst, inc))
    assert inc.schedule.makespan > 0


def test_lookahead_admits_less_and_never_leaves_a_batch_empty():
    rng = np.random.default_rng(9)
    reqs = [(int(rng.integers(1, 30)), int(rng.integers(1, 30)), 0.0) for _ in range(40)]
    inst = make_instance(reqs, 120, c=32, p=32, time_model="infermax-linear")
    plain = greedy(inst, "remaining-area")
    careful = greedy(inst, "remaining-area", lookahead=8)
    assert careful.stats["evictions"] < plain.stats["evictions"]
    serial = greedy(inst, "remaining-area", lookahead=10**6)  # admits only into an empty batch
    assert all(b.size >= 1 for b in serial.schedule.batches)
    assert serial.stats["evictions"] == 0


# ------------------------------------------------------------------ priorities, deadline
def test_external_priority_reproduces_a_static_rule():
    inst = random_instance(np.random.default_rng(11), 20)
    prompt = np.array([r.prompt for r in inst.requests])
    output = np.array([r.output for r in inst.requests])
    by_rule = greedy(inst, "area")
    by_keys = greedy(inst, priority=kv_area(prompt, output))
    assert by_rule.schedule.same_as(by_keys.schedule)
    with pytest.raises(InputError):
        greedy(inst, priority=np.zeros(3))
    with pytest.raises(InputError):
        greedy(inst, "nonsense")


def test_an_expired_deadline_still_gives_a_complete_legal_schedule():
    inst = random_instance(np.random.default_rng(5), 30)
    expired = Deadline(time.monotonic() - 1.0, 1.0)
    for jit in (True, False):
        log = decide(inst, deadline=expired, jit=jit)
        assert log.num_batches > 0
        inc = greedy(inst, deadline=expired, jit=jit)
        assert inc.value == objective_value(inst, inc)
    best = best_incumbent(inst, deadline=expired)
    assert list(best.stats["tried"]) == [best.name]  # only the first variant ran
    assert best.stats["skipped"]


# ------------------------------------------------------------------ best_incumbent and LNS
def test_best_incumbent_is_the_best_validated_candidate():
    inst = random_instance(np.random.default_rng(2), 25)
    best = best_incumbent(inst, policies=("mcsf", "sarathi"))
    tried = best.stats["tried"]
    assert best.value == min(tried.values()) == tried[best.name]
    assert any(name.startswith("policy:") for name in tried)
    assert best.value == pytest.approx(objective_value(inst, best))


def test_lns_never_worsens_and_keeps_its_deadline():
    rng = np.random.default_rng(4)
    reqs = [(int(rng.integers(1, 20)), int(rng.integers(1, 20)), 0.0) for _ in range(25)]
    inst = make_instance(reqs, max(i + o - 1 for i, o, _ in reqs) + 40)
    start = greedy(inst, "fcfs", preempt=False)
    t0 = time.monotonic()
    better = improve(inst, start, Deadline.after(1.0), window=6)
    assert time.monotonic() - t0 < 1.0 + 0.5
    assert better.value <= start.value
    assert better.value == objective_value(inst, better)
    assert better.stats["evaluations"] > 0


# ------------------------------------------------------------------ token budgets: refill weight, chunks
@pytest.mark.parametrize("seed", range(6))
def test_budget_options_run_the_same_in_both_kernels_and_replay(seed):
    rng = np.random.default_rng(200 + seed)
    inst = budget_instance(rng, int(rng.integers(5, 40)), "unit" if seed % 3 else "infermax-linear")
    for preempt in (True, False):
        for weight, chunk, fit in ((4.0, 0, False), (0.0, 8, False), (0.0, 0, True), (64.0, 5, True)):
            kw = {"preempt": preempt, "refill_weight": weight, "min_chunk": chunk, "fit_chunk": fit}
            fast = greedy(inst, "remaining-area", **kw)  # replayed strictly inside: legal and complete
            slow = greedy(inst, "remaining-area", jit=False, **kw)
            assert fast.schedule.same_as(slow.schedule)
            assert fast.value == slow.value == objective_value(inst, fast)
            other = greedy(inst, "remaining-output", **kw)
            assert other.value == objective_value(inst, other)


def test_options_off_change_nothing():
    inst = budget_instance(np.random.default_rng(7), 30)
    plain = greedy(inst, "remaining-area")
    off = greedy(inst, "remaining-area", refill_weight=0.0, min_chunk=0, fit_chunk=False)
    assert plain.schedule.same_as(off.schedule) and plain.name == off.name


def test_min_chunk_starts_no_prompt_on_a_sliver_of_budget():
    rng = np.random.default_rng(12)
    inst = budget_instance(rng, 40)
    c = inst.limits.max_batch_tokens
    chunk = min(8, c)
    prompt = np.array([r.prompt for r in inst.requests])
    log = decide(inst, "remaining-area", min_chunk=chunk)
    first = (log.context == 0) & (log.phases == 0)  # a request's first prefill chunk
    assert first.any()
    assert (log.tokens[first] >= np.minimum(prompt[log.requests[first]], chunk)).all()
    # Larger than the budget it is clamped to it: every request still starts.
    assert greedy(inst, "remaining-area", min_chunk=10 * c).value == objective_value(
        inst, greedy(inst, "remaining-area", min_chunk=10 * c)
    )


def test_refill_weight_evicts_the_cheap_refill_first():
    # M = 14, C = P = 4. A (I 8, O 4) and B (I 2, O 6) both hold KV when C (I 3, O 1) arrives at 3 with
    # a smaller key than either. Plain remaining area evicts A (the larger key), whose refill of 9+
    # tokens takes 3 batches of budget; with a refill weight A ranks first and B (one chunk) goes instead.
    inst = make_instance([(8, 4, 0), (2, 6, 0), (3, 1, 3)], 14, c=4, p=4)
    assert decide(inst, "remaining-area").evicted.tolist() == [0]
    assert decide(inst, "remaining-area", refill_weight=4.0).evicted.tolist() == [1]
    assert greedy(inst, "remaining-area", refill_weight=4.0).value == objective_value(
        inst, greedy(inst, "remaining-area", refill_weight=4.0)
    )


def test_unit_time_with_a_budget_gets_the_budget_variants():
    budget = make_instance([(5, 3, 0), (4, 2, 1)], 12, c=4, p=4)
    free = make_instance([(5, 3, 0), (4, 2, 1)], 12)
    linear = make_instance([(5, 3, 0), (4, 2, 1)], 12, c=4, p=4, time_model="infermax-linear")
    kinds = [variant_kind(i, instance_cost_model(i)) for i in (budget, free, linear)]
    assert kinds == ["budget", "free", "costly"]
    best = best_incumbent(budget, policies=())
    assert len(best.stats["tried"]) > 1
    assert best.value == min(best.stats["tried"].values())


def test_unit_scales_reproduce_the_rule_and_scales_move_requests():
    inst = budget_instance(np.random.default_rng(21), 30)
    n = len(inst)
    for rule in ("remaining-area", "remaining-output", "area"):
        plain = greedy(inst, rule, refill_weight=2.0)
        ones = greedy(inst, rule, refill_weight=2.0, scale=np.ones(n))
        assert plain.schedule.same_as(ones.schedule)
    # A tiny scale puts a request first in every batch it is live in.
    output = np.array([r.output for r in inst.requests])
    late = int(np.argmax(output))
    scale = np.ones(n)
    scale[late] = 1e-9
    moved = greedy(inst, "remaining-area", scale=scale)
    assert moved.value == objective_value(inst, moved)
    assert moved.trace.state.completion[late] <= greedy(inst, "remaining-area").trace.state.completion[late]
    with pytest.raises(InputError):
        greedy(inst, scale=-np.ones(n))


def test_lns_searches_key_scales_of_a_dynamic_greedy():
    inst = budget_instance(np.random.default_rng(22), 40)
    start = greedy(inst, "remaining-area", preempt=False, refill_weight=4.0, min_chunk=4, fit_chunk=True)
    t0 = time.monotonic()
    better = improve(inst, start, Deadline.after(1.5), window=6)
    assert time.monotonic() - t0 < 1.5 + 0.5
    assert better.value <= start.value
    assert better.value == objective_value(inst, better)
    assert better.stats["evaluations"] > 0


def test_lns_without_a_deadline_searches_key_scales_and_ends():
    """No deadline: the scaled search's half of the time is unbounded too (it once built a Deadline from
    an infinite remainder and refused it as a bad --time-limit), and the passes still end."""
    inst = budget_instance(np.random.default_rng(23), 12)
    start = greedy(inst, "remaining-area", preempt=False, refill_weight=4.0, min_chunk=4, fit_chunk=True)
    better = improve(inst, start, window=4, max_passes=1)
    assert better.value <= start.value
    assert better.value == objective_value(inst, better)
    assert better.stats["evaluations"] > 0


def test_lns_kicks_the_best_scales_once_the_windows_end_and_never_worsens():
    """Where the windows end before the deadline, an iterated local search kicks the best scales: it starts
    from the windows' result (same seed), so it ends no worse, and it ends on its own without a deadline."""
    inst = budget_instance(np.random.default_rng(24), 30)
    start = greedy(inst, "remaining-area", preempt=False, refill_weight=4.0, min_chunk=4, fit_chunk=True)
    windows = improve(inst, start, window=4, max_passes=1, kick_patience=0)
    kicked = improve(inst, start, window=4, max_passes=1, kick_patience=5)
    assert windows.stats["kicks"] == 0 and kicked.stats["kicks"] >= 5
    assert kicked.value <= windows.value <= start.value
    assert kicked.value == objective_value(inst, kicked)
    assert kicked.stats["evaluations"] > windows.stats["evaluations"]
    # Endless patience: the deadline ends the kicks, on time. (3 s: the windows and static orders before the
    # kicks, about 160 candidates, took the whole of a 1 s limit in a loaded full test run.)
    t0 = time.monotonic()
    timed = improve(inst, start, Deadline.after(3.0), window=4, max_passes=1, kick_patience=10**9)
    assert time.monotonic() - t0 < 3.0 + 0.5
    assert timed.value <= start.value and timed.stats["kicks"] > 0
    assert timed.stats["out_of_time"]
    # Two requests: a kick's stretch is the whole order (it once drew a stretch longer than the order).
    pair = budget_instance(np.random.default_rng(0), 2)
    start = greedy(pair, "remaining-area", preempt=False, refill_weight=4.0, min_chunk=4, fit_chunk=True)
    assert improve(pair, start, window=4, max_passes=1).value <= start.value


def _loaded_instance(rng: np.random.Generator, n: int) -> Instance:
    """Unit time, no budget (eviction is free), arrivals over time into a KV cache a few requests fill."""
    reqs = [
        (int(rng.integers(5, 40)), int(rng.integers(2, 20)), float(rng.integers(0, 3 * n))) for _ in range(n)
    ]
    return make_instance(reqs, 2 * max(i + o - 1 for i, o, _ in reqs))


def test_lns_searches_key_scales_of_the_knapsack_greedy():
    inst = _loaded_instance(np.random.default_rng(32), 40)
    start = knapsack(inst)
    better = improve(inst, start, window=6, max_passes=1)
    assert better.value <= start.value
    assert better.value == objective_value(inst, better)
    assert better.stats["evaluations"] > 0
    # The scaled candidates are the knapsack greedy's own (its meta), not the priority greedy's.
    assert better is start or better.schedule.meta["policy"].startswith("lns(knapsack")


@pytest.mark.parametrize("seed", range(8))
def test_the_greedys_own_value_is_the_replays(seed):
    """The local search values candidates on the greedy's log (no replay) and replays those it keeps:
    the two values agree, budgets, blocks, arrivals, linear time and every objective."""
    rng = np.random.default_rng(seed)
    inst = random_instance(rng, int(rng.integers(2, 30)))
    for objective in sorted(OBJECTIVES):
        for kwargs in (
            {},
            {"preempt": False, "fill": True},
            {"lookahead": 8, "min_chunk": 4, "fit_chunk": True},
        ):
            replayed = greedy(inst, "remaining-area", objective=objective, **kwargs)
            own = greedy(inst, "remaining-area", objective=objective, replay_schedule=False, **kwargs)
            assert own.trace is None and own.schedule.same_as(replayed.schedule)
            assert own.value == replayed.value


def test_best_incumbent_tries_the_knapsack_greedy_under_a_token_budget():
    rng = np.random.default_rng(31)
    budget = best_incumbent(budget_instance(rng, 20))
    assert "knapsack:remaining-area" in budget.stats["tried"]
    assert budget.value == min(budget.stats["tried"].values())
    free = best_incumbent(_loaded_instance(rng, 30))
    assert not any(name.startswith("knapsack") for name in free.stats["tried"])


@pytest.mark.parametrize("seed", range(3))
def test_best_incumbent_replays_the_best_of_its_log_valued_variants(seed):
    """Variants after the first are valued on their own logs; the one returned is the core's replay."""
    rng = np.random.default_rng(40 + seed)
    for inst in (_loaded_instance(rng, 30), budget_instance(rng, 20), random_instance(rng, 20)):
        best = best_incumbent(inst, policies=())
        assert best.trace is not None and best.value == objective_value(inst, best)
        assert best.value == min(best.stats["tried"].values())


def test_lns_guided_search_moves_the_blamed_requests_and_never_worsens():
    """A guide's scores pick which requests' key scales move first; every kept move is replayed."""
    inst = _loaded_instance(np.random.default_rng(33), 40)
    start = greedy(inst, "remaining-area", fill=True)
    seen = []

    def guide(trace):
        seen.append(trace)
        # Blame the requests that finish last (a guide needs only a score per request).
        return trace.state.completion - np.array([r.arrival for r in inst.requests])

    better = improve(inst, start, Deadline.after(3.0), window=6, guide=guide)
    assert seen and all(t is not None for t in seen)
    assert better.value <= start.value
    assert better.value == objective_value(inst, better)
    assert better.stats["evaluations"] > 0
