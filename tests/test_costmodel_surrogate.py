"""Linear surrogates: exact for models of the surrogate's form, with an honest error otherwise."""

import pytest

from kvsched.costmodel import (
    CalibratedCost,
    HingeCost,
    InfermaxLinear,
    RadTiling,
    Roofline,
    StaircaseCost,
    UnitCost,
)
from kvsched.costmodel.coeffile import COEFFICIENT_DIR, load_coefficients
from kvsched.costmodel.surrogate import linear_surrogate, probe_batches
from kvsched.errors import InputError


def test_probe_batches_respect_the_budget():
    batches = probe_batches(max_tokens=512, max_context=1024)
    assert batches and all(int(v.tokens.sum()) <= 512 for v in batches)
    assert all(int(v.context.max()) <= 1024 for v in batches)


@pytest.mark.parametrize(
    "model",
    [
        UnitCost(slot=2.0),
        InfermaxLinear(),
        InfermaxLinear(a0=1, a1=0.1, b0=0.5, b1=0.01, p0=0.7, p1=0.001, p2=0.02, p3=0.3),
    ],
)
def test_models_of_infermax_form_are_reproduced(model):
    sur = linear_surrogate(model)
    assert isinstance(sur.model, InfermaxLinear)
    assert sur.stats.max < 1e-9


def test_linear_form_reproduces_linear_calibrated_models():
    model = CalibratedCost(
        a0=1e-3, a1=1e-5, b0=1e-4, b1=1e-7, b2=1e-5, p0=1e-4, p1=1e-9, p2=1e-7, p3=1e-4, p4=1e-9
    )
    assert linear_surrogate(model, form="linear").stats.max < 1e-9
    assert linear_surrogate(model, form="infermax").stats.max > 1e-3  # InferMax's form has no b2, p4


@pytest.mark.parametrize(
    "model",
    [HingeCost(c=0.01, a=1e-4, b0=256), StaircaseCost(c=0.01, a=0.03, b0=128), RadTiling(), Roofline()],
)
def test_nonlinear_models_get_a_surrogate_and_its_error(model):
    sur = linear_surrogate(model)
    assert 0 < sur.stats.mean < sur.stats.max < 5.0  # reported, not hidden: a hinge is far from linear
    assert sur.stats.n == len(probe_batches())


def test_shipped_files_record_their_surrogate():
    cf = load_coefficients(COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json")
    rec = cf.meta["linear_surrogate"]
    sur = linear_surrogate(CalibratedCost.from_params(**cf.params))
    assert rec["name"] == "infermax-linear"
    assert rec["max_rel_err"] == pytest.approx(sur.stats.max, rel=1e-4)
    assert InfermaxLinear(**rec["params"]).a1 > 0


def test_unknown_surrogate_form():
    with pytest.raises(InputError, match="unknown 'cubic'"):
        linear_surrogate(UnitCost(), form="cubic")
