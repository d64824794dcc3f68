"""Cost models: the formulas against hand-computed values."""

import numpy as np
import pytest

from kvsched.costmodel import BatchView, InfermaxLinear, UnitCost, make_cost_model
from kvsched.errors import InputError
from kvsched.schedule.ir import Phase

P, D, R = Phase.PREFILL, Phase.DECODE, Phase.REFILL


def view(tokens, context, phases):
    return BatchView(np.array(tokens), np.array(context), np.array(phases, dtype=np.int8))


def test_unit_is_one_slot_whatever_the_batch():
    assert UnitCost().batch_time(view([4096], [0], [P])) == 1.0
    assert UnitCost(slot=0.5).batch_time(view([1, 1], [10, 20], [D, D])) == 0.5


def test_infermax_linear_decode_only_batch():
    cm = InfermaxLinear(a0=1, a1=2, b0=3, b1=5, p0=7, p1=11, p2=13, p3=17)
    # two decodes reading 10 and 20 KV: a0 + a1*2 + b0 + b1*30
    assert cm.batch_time(view([1, 1], [10, 20], [D, D])) == 1 + 2 * 2 + 3 + 5 * 30


def test_infermax_linear_hybrid_batch_adds_both_attention_terms():
    cm = InfermaxLinear(a0=1, a1=2, b0=3, b1=5, p0=7, p1=11, p2=13, p3=17)
    # decode on 10 KV; a prefill chunk c=4 on m=6; a refill c=3 from m=0
    t = cm.batch_time(view([1, 4, 3], [10, 6, 0], [D, P, R]))
    non_attn = 1 + 2 * 8
    decode = 3 + 5 * 10
    prefill = 7 + 11 * ((16 + 2 * 6 * 4) + 9) + 13 * 6 + 17 * 2
    assert t == non_attn + decode + prefill


def test_chunking_leaves_quadratic_term_unchanged():
    # sum(c^2 + 2mc) telescopes to I^2 (seed 003 A2 identity): chunks only add biases.
    cm = InfermaxLinear(a0=0, a1=0, b0=0, b1=0, p0=0, p1=1, p2=0, p3=0)
    whole = cm.batch_time(view([12], [0], [P]))
    chunks = sum(cm.batch_time(view([c], [m], [P])) for c, m in ((5, 0), (4, 5), (3, 9)))
    assert whole == chunks == 144


def test_registry_builds_models_and_rejects_bad_names_and_params():
    assert isinstance(make_cost_model("unit"), UnitCost)
    assert make_cost_model("infermax-linear", {"a0": 0.5}).a0 == 0.5
    with pytest.raises(InputError, match="unknown cost model 'nope'"):
        make_cost_model("nope")
    with pytest.raises(InputError, match=r"time_model\.params"):
        make_cost_model("infermax-linear", {"zz": 1.0})
    with pytest.raises(InputError, match="a1 must be >= 0"):
        make_cost_model("infermax-linear", {"a1": -1.0})


def test_make_cost_model_takes_a_shipped_coefficient_set_by_name_as_cost_model_does():
    from kvsched.costmodel.coeffile import resolve_cost_model

    stem = "llama-2-7b_a100-80gb_tp1"
    name, params = resolve_cost_model(stem)  # what --cost-model makes of it
    batch = view([1, 1, 300], [500, 900, 0], [D, D, P])
    # Was "unknown cost model 'llama-2-7b_a100-80gb_tp1'".
    assert make_cost_model(stem).batch_time(batch) == make_cost_model(name, params).batch_time(batch)
    assert make_cost_model(stem, {"a0": 1.0}).batch_time(batch) > make_cost_model(stem).batch_time(batch)
    with pytest.raises(
        InputError, match=rf"unknown cost model 'nope' \(known: .*; or a shipped coefficient set: .*{stem}"
    ):
        make_cost_model("nope")


def test_a_coefficient_file_names_a_registered_model_not_a_shipped_set(tmp_path):
    from kvsched.costmodel.coeffile import KIND, load_coefficients

    path = tmp_path / "c.json"
    path.write_text(
        f'{{"schema_version": 1, "kind": "{KIND}", "name": "llama-2-7b_a100-80gb_tp1", "params": {{}}}}'
    )
    with pytest.raises(InputError, match=r"c\.json: name: unknown cost model 'llama-2-7b_a100-80gb_tp1'"):
        load_coefficients(path)
