"""The prompt-weighted capped greedy variant: its key scales, and best_incumbent runs it first under cliffs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.csp.incumbents import greedy
from kvsched.csp.incumbents.base import confirmed
from kvsched.csp.incumbents.best import CAPPED_VARIANTS, best_incumbent, run_variant, variants_for
from kvsched.csp.incumbents.knots import PROMPT_WEIGHTED, prompt_scale
from kvsched.csp.incumbents.lns import rerunner
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

A100 = "llama-2-7b_a100-80gb_tp1"


def _instance(rng: np.random.Generator, n: int, model: TimeModel, m: int = 6000) -> Instance:
    """``n`` requests (prompts up to 900 tokens, outputs up to 40) arriving over a few seconds, C = P = 512."""
    reqs = tuple(
        Request(f"r{k}", float(rng.uniform(0, 2)), int(rng.integers(1, 900)), int(rng.integers(1, 40)))
        for k in range(n)
    )
    return Instance(reqs, Limits(kv_capacity=m, max_batch_tokens=512, max_prefill_tokens=512), model)


def test_the_scale_adds_the_prompt_at_the_token_terms_price_per_kv_token():
    inst = _instance(np.random.default_rng(0), 5, TimeModel(*resolve_cost_model(A100)))
    cost = instance_cost_model(inst)
    scale = prompt_scale(inst, cost, 384)
    assert scale is not None
    weight = float(cost.non_attention(384.0)) / 384 / cost.b1
    assert 200 < weight < 250  # a prompt token at the cap costs ~226 KV tokens of decode attention
    for r, s in zip(inst.requests, scale, strict=True):
        area = r.output * r.prompt + r.output * (r.output - 1) / 2
        assert s * area == pytest.approx(area + weight * r.prompt)
    # Models without a token term (linear, unit) or without a cap get no scale.
    for name in ("infermax-linear", "unit"):
        other = _instance(np.random.default_rng(0), 5, TimeModel(name))
        assert prompt_scale(other, instance_cost_model(other), 384) is None
    assert prompt_scale(inst, cost, 0) is None


def test_best_incumbent_runs_the_prompt_weighted_variant_first_under_cliffs():
    inst = _instance(np.random.default_rng(7), 40, TimeModel(*resolve_cost_model(A100)))
    cost = instance_cost_model(inst)
    first = variants_for(inst, cost)[0]
    assert first == replace(CAPPED_VARIANTS[0], token_cap=384) and first.prompt_weighted
    best = best_incumbent(inst, policies=(), deadline=Deadline.after(30))
    name = "greedy:remaining-area/no-preempt/lookahead=16/token-cap=384/prompt-weighted"
    assert name in best.stats["tried"]
    same = greedy(
        inst,
        "remaining-area",
        preempt=False,
        lookahead=16,
        token_cap=384,
        scale=prompt_scale(inst, cost, 384),
    )
    assert best.stats["tried"][name] == pytest.approx(same.value)
    assert best.value == min(best.stats["tried"].values())
    assert replay(inst, best.schedule).ok


def test_the_local_search_re_makes_a_prompt_weighted_incumbent_with_its_weights():
    """The params say the key was weighted, and the search's scales multiply the weights: at scale 1 the
    re-made schedule is the incumbent's."""
    inst = _instance(np.random.default_rng(7), 40, TimeModel(*resolve_cost_model(A100)))
    cost = instance_cost_model(inst)
    weighted = next(v for v in variants_for(inst, cost) if v.prompt_weighted)
    inc = run_variant(inst, weighted, cost)
    assert inc.schedule.meta["params"][PROMPT_WEIGHTED] is True
    again = confirmed(inst, rerunner(inst, inc, cost)(np.ones(len(inst)), Deadline.never(), "again"), cost)
    assert again.value == pytest.approx(inc.value)
