"""The papers' cost-model formulas against hand-computed values."""

import math

import numpy as np
import pytest

from kvsched.costmodel import (
    REGISTRY,
    CalibratedCost,
    HingeCost,
    InfermaxLinear,
    RadTiling,
    Roofline,
    StaircaseCost,
    make_cost_model,
)
from kvsched.costmodel.base import BatchView
from kvsched.costmodel.presets import get_gpu, get_model
from kvsched.costmodel.rad import rad_params
from kvsched.costmodel.roofline import roofline_params
from kvsched.errors import InputError
from kvsched.schedule.ir import Phase

P, D, R = Phase.PREFILL, Phase.DECODE, Phase.REFILL


def view(tokens, context, phases):
    return BatchView(np.array(tokens), np.array(context), np.array(phases, dtype=np.int8))


# ------------------------------------------------------------------ seed 001
def test_hinge_is_flat_then_linear_in_the_token_load():
    cm = HingeCost(c=2.0, a=0.5, b0=10)
    assert cm.batch_time(view([1, 1, 2], [5, 9, 0], [D, D, P])) == 2.0  # 4 tokens: flat
    assert cm.batch_time(view([10], [0], [P])) == 2.0  # the bend itself
    assert cm.batch_time(view([12, 1, 1], [0, 3, 3], [R, D, D])) == 2.0 + 0.5 * 4  # 14 tokens


def test_staircase_reproduces_the_seed_001_codellama_example():
    # Seed 001 notes: CodeLlama-34B, 1x A100-80GB: c = 11.28 ms, a = 35.47 ms, b0 = 128; t(512) = 153.16 ms.
    cm = StaircaseCost(c=11.28, a=35.47, b0=128)
    assert cm.batch_time(view([512], [0], [P])) == pytest.approx(153.16)
    assert cm.batch_time(view([1], [40], [D])) == pytest.approx(11.28 + 35.47)  # one token = one whole block
    assert cm.batch_time(view([500, 13], [0, 7], [P, P])) == pytest.approx(11.28 + 5 * 35.47)  # 513 tokens
    assert 512 / cm.batch_time(view([512], [0], [P])) == pytest.approx(3.343, abs=5e-4)  # tokens per ms


def test_piecewise_models_reject_bad_parameters():
    with pytest.raises(ValueError, match="b0 must be > 0"):
        StaircaseCost(b0=0)
    with pytest.raises(InputError, match="a must be a finite number >= 0"):
        make_cost_model("hinge", {"a": -1.0})


# ------------------------------------------------------------------ seed 000
def test_rad_tiling_eq_7_by_hand():
    cm = RadTiling(
        layers=2, d=4, d_x=4, d_ff=8, d_out=6, t_row=2, t_col=4, t_red=2, v_row=2, v_col=2,
        gemm_tile_time=1.0, gemv_tile_time=1.0, nonlinear_time=0.5,
    )  # fmt: skip
    # 1/mu_Lin = 3N (dx/tred)(d/trow) + N (d/tred)(dff/trow) + N (dff/tred)(dx/trow) + (dx/tred)(dout/trow)
    assert cm.inv_mu_lin == 3 * 2 * 2 * 2 + 2 * 2 * 4 + 2 * 4 * 2 + 2 * 3 == 62
    # A decode holding m = 4 (i = 5) and a chunk of c = 3 on m = 2 (i = 3, i + c - 1 = 5): tau = 4.
    token_terms = 62 * math.ceil(4 / 4) + 0.5 * 4
    decode = 2 * (math.ceil(4 / 2) * math.ceil(5 / 2) + math.ceil(5 / 2) * math.ceil(4 / 2))  # N * T_DSA(5)
    prefill = 2 * (math.ceil(5 / 2) * math.ceil(3 / 4) * 2 + 2 * math.ceil(3 / 4) * math.ceil(5 / 2))
    assert (token_terms, decode, prefill) == (64, 24, 24)
    assert cm.batch_time(view([1, 3], [4, 2], [D, P])) == 112


def test_rad_staircase_in_the_token_count():
    cm = RadTiling(**rad_params(get_model("llama-2-7b"), get_gpu("a100-80gb")))
    t1 = cm.batch_time(view([1], [0], [P]))
    t256 = cm.batch_time(view([256], [0], [P]))
    t257 = cm.batch_time(view([257], [0], [P]))
    # Linear layers cost the same for 1 and t_col = 256 tokens; one more token starts a second column tile.
    assert t257 - t256 > cm.inv_mu_lin * 0.99
    assert t256 - t1 < cm.inv_mu_lin * 0.2  # only the per-token non-linear ops and attention grow


# ------------------------------------------------------------------ roofline
def test_roofline_by_hand_on_a_tiny_model():
    cm = Roofline(
        layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, ffn=2, vocab=2, gated_mlp=0,
        dtype_bytes=1, peak_flops=1, mem_bw=1, link_bw=1,
    )  # fmt: skip
    # One decode holding m = 3. GEMMs (flops vs values): QKV 24 vs 20, O 8 vs 8, up 8 vs 8, down 8 vs 8;
    # element-wise 10*2 + 3*2 = 26 values; attention: 4 (m+1) x 1 x 2 = 32 flops vs 2*4*2 + 2*2 = 20 values;
    # LM head on one token: 8 flops vs 8 values.
    assert cm.batch_time(view([1], [3], [D])) == 24 + 8 + 8 + 8 + 26 + 32 + 8


def test_roofline_presets_scale_with_the_hardware():
    llama = get_model("llama-2-7b")
    a100 = Roofline(**roofline_params(llama, get_gpu("a100-80gb")))
    h100 = Roofline(**roofline_params(llama, get_gpu("h100-80gb")))
    prefill = view([4096], [0], [P])
    # Compute-bound: the FLOP ratio; a 7B model's big prefill is ~2 x 6.5e9 x 4096 FLOPs.
    assert a100.batch_time(prefill) / h100.batch_time(prefill) == pytest.approx(989 / 312, rel=0.05)
    assert a100.batch_time(prefill) == pytest.approx(2 * 6.5e9 * 4096 / 312e12, rel=0.15)
    decode = view([1] * 8, [1000] * 8, [D] * 8)
    # Memory-bound: the bandwidth ratio (weights dominate the bytes).
    assert a100.batch_time(decode) / h100.batch_time(decode) == pytest.approx(3.35 / 2.039, rel=0.05)
    tp2 = Roofline(**roofline_params(get_model("llama-2-70b"), get_gpu("a100-80gb"), tp=2))
    assert tp2.allreduce_time(1000) > 0


# ------------------------------------------------------------------ calibrated
FULL = CalibratedCost.from_params(
    a0=1, a1=0.1, step8=2, step16=-1, hinge20=0.5, tile4=0.25,
    b0=3, b1=0.01, b2=0.2, p0=5, p1=0.001, p2=0.02, p3=0.3, p4=0.002,
)  # fmt: skip


def test_calibrated_by_hand():
    # A decode holding 100 KV and a chunk of 10 on 5: tau = 11 (> 8, not > 16, below the hinge at 20).
    non_attention = 1 + 0.1 * 11 + 2 + 0.25 * math.ceil(11 / 4)
    decode = 3 + 0.01 * 100 + 0.2
    prefill = 5 + 0.001 * (100 + 2 * 5 * 10) + 0.02 * 5 + 0.3 + 0.002 * 100
    assert FULL.batch_time(view([1, 10], [100, 5], [D, P])) == pytest.approx(non_attention + decode + prefill)


def test_calibrated_token_term_steps_strictly_above_the_knot_and_bends_at_hinges():
    tau = np.array([8, 9, 16, 17, 20, 22])
    base = 1 + 0.1 * tau + 0.25 * np.ceil(tau / 4)
    steps = np.array([0, 2, 2, 1, 1, 1])
    hinge = 0.5 * np.maximum(0, tau - 20)
    np.testing.assert_allclose(FULL.non_attention(tau), base + steps + hinge)


def test_calibrated_without_extensions_is_infermax_linear():
    coef = {"a0": 1, "a1": 2, "b0": 3, "b1": 5, "p0": 7, "p1": 11, "p2": 13, "p3": 17}
    ours, theirs = CalibratedCost(**coef), InfermaxLinear(**coef)
    assert ours.is_linear and not FULL.is_linear
    for v in (view([1, 4, 3], [10, 6, 0], [D, P, R]), view([1, 1], [10, 20], [D, D]), view([12], [0], [P])):
        assert ours.batch_time(v) == theirs.batch_time(v)


def test_calibrated_flat_parameters_round_trip_and_errors():
    assert CalibratedCost.from_params(**FULL.params()) == FULL
    assert make_cost_model("calibrated", FULL.params()).batch_time(view([3], [0], [P])) == FULL.batch_time(
        view([3], [0], [P])
    )
    with pytest.raises(InputError, match="unexpected parameter 'zz'"):
        make_cost_model("calibrated", {"zz": 1.0})
    with pytest.raises(InputError, match="a1 must be >= 0"):
        make_cost_model("calibrated", {"a1": -1.0})
    with pytest.raises(InputError, match="hinge8 must be >= 0"):
        make_cost_model("calibrated", {"hinge8": -1.0})
    with pytest.raises(InputError, match="token term is negative"):
        make_cost_model("calibrated", {"a0": 1.0, "step8": -2.0})


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_model_builds_with_defaults_and_times_a_batch(name):
    cm = make_cost_model(name)
    assert cm.name == name
    t = cm.batch_time(view([1, 16], [100, 0], [D, P]))
    assert t >= 0 and math.isfinite(t)
