"""Token caps at the cliffs of a stepped token term, and the greedy that keeps its batches under them."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.csp.incumbents import decide, greedy
from kvsched.csp.incumbents.best import CAPPED_VARIANTS, VARIANTS, best_incumbent, variants_for
from kvsched.csp.incumbents.knots import token_caps
from kvsched.csp.incumbents.lns import improve
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

A100 = "llama-2-7b_a100-80gb_tp1"


def _model(name: str = A100) -> TimeModel:
    return TimeModel(*resolve_cost_model(name)) if name == A100 else TimeModel(name)


def _instance(rng: np.random.Generator, n: int, c: int | None, model: TimeModel, m: int = 6000) -> Instance:
    """``n`` requests (prompts up to 900 tokens, outputs up to 40) arriving over a few seconds."""
    reqs = tuple(
        Request(f"r{k}", float(rng.uniform(0, 2)), int(rng.integers(1, 900)), int(rng.integers(1, 40)))
        for k in range(n)
    )
    return Instance(reqs, Limits(kv_capacity=m, max_batch_tokens=c, max_prefill_tokens=c), model)


def _batch_tokens(log) -> np.ndarray:
    return np.add.reduceat(log.tokens, log.item_ptr[:-1]) if log.num_batches else np.zeros(0)


def test_the_shipped_a100_set_has_cliffs_at_384_and_256_under_512():
    inst = _instance(np.random.default_rng(0), 3, 512, _model())
    cost = instance_cost_model(inst)
    assert token_caps(cost, inst.limits) == (384, 256)
    # Each cap sits just before a step of at least a tenth of the token term there.
    tau = np.array([384.0, 385.0, 256.0, 257.0])
    n = cost.non_attention(tau)
    assert n[1] - n[0] >= 0.1 * n[0] and n[3] - n[2] >= 0.1 * n[2]
    assert token_caps(cost, inst.limits, most=1) == (384,)


@pytest.mark.parametrize(
    ("model", "budget"), [("infermax-linear", 512), ("unit", 512), (A100, None), (A100, 100)]
)
def test_no_caps_without_a_stepped_token_term_or_a_budget(model, budget):
    # Linear and unit models have no cliff, and without a budget no batch is filled up to one. Under a
    # budget of 100 the A100 set has one cliff in [25, 100): 64 tokens (its step is 15% of N(64)).
    inst = _instance(np.random.default_rng(1), 3, budget, _model(model))
    caps = token_caps(instance_cost_model(inst), inst.limits)
    assert caps == ((64,) if (model, budget) == (A100, 100) else ())


@pytest.mark.parametrize("seed", range(3))
def test_a_capped_greedy_keeps_its_batches_under_the_cap_and_is_legal(seed):
    rng = np.random.default_rng(300 + seed)
    inst = _instance(rng, int(rng.integers(20, 60)), 512, _model())
    for cap in (384, 256):
        for preempt, lookahead in ((False, 16), (True, 64)):
            log = decide(inst, "remaining-area", preempt=preempt, lookahead=lookahead, token_cap=cap)
            assert _batch_tokens(log).max() <= cap
            inc = greedy(inst, "remaining-area", preempt=preempt, lookahead=lookahead, token_cap=cap)
            slow = greedy(
                inst, "remaining-area", preempt=preempt, lookahead=lookahead, token_cap=cap, jit=False
            )
            assert inc.schedule.same_as(slow.schedule)  # both kernels, replayed strictly inside
            assert inc.name.endswith(f"/token-cap={cap}") and inc.schedule.meta["params"]["token_cap"] == cap
            completion = replay(inst, inc.schedule).state.completion
            assert inc.value == pytest.approx(
                float(np.sum(completion)) - sum(r.arrival for r in inst.requests)
            )


def test_a_cap_at_or_above_the_budget_changes_no_batch():
    inst = _instance(np.random.default_rng(9), 30, 512, _model())
    plain = greedy(inst, "remaining-area", preempt=False, lookahead=16)
    for cap in (512, 4096):
        capped = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=cap)
        assert capped.schedule.same_as(plain.schedule)


def test_a_cap_without_a_budget_bounds_every_batch():
    inst = _instance(np.random.default_rng(4), 25, None, _model())
    log = decide(inst, "remaining-area", preempt=False, token_cap=384)
    assert _batch_tokens(log).max() <= 384
    greedy(inst, "remaining-area", preempt=False, token_cap=384)  # legal: replayed inside


def test_stepped_models_run_the_most_efficient_caps_variants_first():
    stepped = _instance(np.random.default_rng(2), 10, 512, _model())
    linear = _instance(np.random.default_rng(2), 10, 512, _model("infermax-linear"))
    variants = variants_for(stepped, instance_cost_model(stepped))
    k = len(CAPPED_VARIANTS)
    # The most token-efficient cap's variants first, the plain ones, then the next cap's.
    assert [v.token_cap for v in variants[:k]] == [384] * k
    assert variants[k : k + len(VARIANTS["costly"])] == VARIANTS["costly"]
    assert [v.token_cap for v in variants[k + len(VARIANTS["costly"]) :]] == [256] * k
    assert variants_for(linear, instance_cost_model(linear)) == VARIANTS["costly"]
    best = best_incumbent(stepped, policies=(), deadline=Deadline.after(30))
    assert best.value == min(best.stats["tried"].values())
    assert any("/token-cap=" in name for name in best.stats["tried"])


def test_the_local_search_keeps_the_cap():
    inst = _instance(np.random.default_rng(5), 40, 512, _model())
    start = greedy(inst, "remaining-area", preempt=False, lookahead=16, token_cap=256)
    better = improve(inst, start, Deadline.after(2.0), window=6)
    assert better.value <= start.value
    assert replay(inst, better.schedule).ok
    assert better.schedule.meta["params"]["token_cap"] == 256
    assert max(b.num_tokens for b in better.schedule.batches) <= 256
