"""Seed 003 (InferMax) Sec. 4.4 and 4.5 trends, simulated under a Llama-2-7B / A100 cost model.

Workloads are InferMax's homogeneous grid: B = 1024 identical requests (I, O)
at t = 0, C = 4096. The cost model is the shipped coefficient file
``llama-2-7b_a100-80gb_tp1`` as it is: InferMax's terms (Sec. 3.2) fitted to
the packaged Vidur profiles, plus a stepped token term and a per-decode
attention term. The file's linear surrogate (InferMax's own form) gives the
same directions except one, which the stepped term decides (SARATHI_{P=C} at
O = B = 1024, see ``docs/reproductions.md``); ``benchmarks/seed003_trends.py``
prints every cell for both models, over all prompt sizes.

The tests run one prompt size per claim, at the paper's full scale (a smaller
O and M changes the SARATHI_{P=C} direction, so the scale is kept).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from kvsched.costmodel.coeffile import load_coefficients, shipped
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import infermax_grid
from kvsched.instances.model import Limits, TimeModel
from kvsched.schedule.metrics import RunMetrics, batch_metrics, run_metrics

B = 1024


def llama2_7b_a100() -> TimeModel:
    cf = load_coefficients(shipped()["llama-2-7b_a100-80gb_tp1"])
    return TimeModel(cf.name, dict(cf.params))


@cache
def measure(name: str, prompt: int, output: int, kv: int) -> tuple[RunMetrics, float]:
    """Run metrics and the median number of requests running in decode batches."""
    inst = infermax_grid(prompt, output, B, Limits(kv_capacity=kv, max_batch_tokens=4096), llama2_7b_a100())
    trace = simulate(inst, make_policy(name)).trace
    bm = batch_metrics(trace)
    return run_metrics(trace), float(np.median(bm[bm["num_decodes"] > 0]["num_running"]))


def tps(name: str, prompt: int, output: int, kv: int) -> float:
    return measure(name, prompt, output, kv)[0].tokens_per_s


# ------------------------------------------------------------------ Sec. 4.4: O = B = 1024, M = 100K


@pytest.mark.parametrize(("name", "paper_gain"), [("vllm", 0.17), ("sarathi-pc", 0.138)])
def test_eviction_free_variants_reach_more_tokens_per_second(name, paper_gain):
    # Paper: up to +17 % (vLLM) and +13.8 % (SARATHI_{P=C}). Here at I = 1: +8.4 % and +5.1 %.
    gain = tps(f"{name}-ef", 1, 1024, 100_000) / tps(name, 1, 1024, 100_000) - 1
    assert 0.02 < gain < paper_gain


def test_eviction_free_runs_about_m_over_i_plus_o_requests():
    # Paper: the EF running size is about M / (I + O), ~98 for small I. EF reserves I + O - 1 each.
    _, running = measure("vllm-ef", 1, 1024, 100_000)
    assert running == pytest.approx(100_000 / (1 + 1024), rel=0.02)


def test_eviction_free_trades_ttft_for_tpot():
    # Paper: EF TTFT up to 1000x higher (vLLM) and 1.7x (SARATHI); TPOT up to 13x and 7.4x lower.
    # Here at I = 1: 2000x and 1.9x; 7.0x and 3.8x.
    for name, ttft, tpot in (("vllm", 1000, 5), ("sarathi", 1.5, 3)):
        base, ef = measure(name, 1, 1024, 100_000)[0], measure(f"{name}-ef", 1, 1024, 100_000)[0]
        assert ef.mean_ttft > ttft * base.mean_ttft
        assert base.mean_tpot > tpot * ef.mean_tpot


def test_sarathi_p512_gains_nothing_from_eviction_freedom_here():
    # Paper: +9.6 %. Not reproduced: SARATHI with P = 512 recomputes far less than vLLM, and the
    # evicting run decodes ~1.8x more requests per batch (KV use ~0.9 M against EF's ~0.55 M, since
    # EF reserves every peak up front), which is worth more than the recompute under this cost
    # model. See docs/reproductions.md.
    base, ef = measure("sarathi", 1, 1024, 100_000)[0], measure("sarathi-ef", 1, 1024, 100_000)[0]
    assert ef.tokens_per_s < base.tokens_per_s
    assert base.recomputed_tokens < measure("vllm", 1, 1024, 100_000)[0].recomputed_tokens
    assert base.mean_kv_util > 0.85 and ef.mean_kv_util < 0.6


# ------------------------------------------------------------------ Sec. 4.5: O = 32, B = 1024, small M


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_evictions_raise_throughput_when_memory_is_tiny(name):
    # Paper: up to 1.9x (vLLM) and 2x (SARATHI) at M = 100. Here at I = 1: 1.69x and 1.85x. EF runs
    # at most M / (I + O - 1) = 3 requests at a time; the evicting runs start many more and batch
    # their decodes, and recomputing such short contexts is cheap.
    assert tps(name, 1, 32, 100) > 1.5 * tps(f"{name}-ef", 1, 32, 100)


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_evictions_still_help_at_m_1k(name):
    # Paper: up to 1.3x (vLLM) and 1.1x (SARATHI) at M = 1K. Here at I = 1: 1.05x and 1.46x; vLLM's
    # gain is smaller and turns into a loss at I = 16 (0.96x), see docs/reproductions.md.
    assert tps(name, 1, 32, 1000) > tps(f"{name}-ef", 1, 32, 1000)
