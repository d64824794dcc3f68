"""Fitting recovers known coefficients from synthetic data exactly; k-fold bookkeeping."""

import numpy as np
import pytest

from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.fidelity import ErrorStats, held_out, kfold, neighbour_errors
from kvsched.costmodel.fitting import (
    default_knots,
    fit_decode,
    fit_prefill,
    fit_token_term,
    identifiable_knots,
    wls,
)

#: Vidur's token grid: 1, 2, 4, then every 8 to 512, then every 32 to 4096.
GRID = np.array(sorted({1, 2, 4, *range(8, 513, 8), *range(544, 4097, 32)}), dtype=float)


def close(fitted: dict, truth: dict, rel: float = 1e-9) -> None:
    for key, value in truth.items():
        assert fitted[key] == pytest.approx(value, rel=rel, abs=1e-15), key


def test_stepped_recovers_known_steps_exactly():
    rng = np.random.default_rng(7)
    knots = identifiable_knots(default_knots(GRID.max()), GRID)
    truth = {
        "a0": 9e-3,
        "a1": 1.2e-5,
        **{f"step{k}": float(v) for k, v in zip(knots, rng.uniform(-1e-3, 5e-3, len(knots)), strict=True)},
    }
    y = CalibratedCost.from_params(**truth).non_attention(GRID)
    assert np.all(y > 0)
    fit = fit_token_term("stepped", GRID, y)
    close(fit.params, truth)
    assert fit.r2 == pytest.approx(1.0)
    # Beyond the grid the steps continue at their mean rate over the last 1024 tokens.
    last = sum(v for k, v in truth.items() if k.startswith("step") and int(k[4:]) > GRID.max() - 1024)
    assert fit.params["hinge4096"] == pytest.approx(last / 1024)


@pytest.mark.parametrize(
    ("form", "truth"),
    [
        ("linear", {"a0": 3e-3, "a1": 6e-5}),
        ("hinge", {"a0": 9e-3, "hinge128": 7e-5}),
        ("staircase", {"a0": 11.28, "tile128": 35.47}),
        ("rad", {"a0": 1e-3, "a1": 2e-6, "tile64": 4e-4}),
    ],
)
def test_token_forms_recover_known_coefficients_and_shape(form, truth):
    y = CalibratedCost.from_params(**truth).non_attention(GRID)
    fit = fit_token_term(form, GRID, y)
    assert set(fit.params) == set(truth)  # the right bend / block / tile is found
    close(fit.params, truth)


def test_attention_fits_recover_known_coefficients():
    rng = np.random.default_rng(1)
    batch = rng.integers(1, 128, 60).astype(float)
    kv = rng.integers(0, 4096, 60).astype(float)
    dec = {"b0": 6e-6, "b1": 8.7e-9, "b2": 1.1e-6}
    t = dec["b0"] + dec["b1"] * batch * kv + dec["b2"] * batch
    close(fit_decode(batch, kv, t).params, dec)
    chunk = rng.integers(1, 4096, 60).astype(float)
    pf = {"p0": 3.6e-5, "p1": 5.3e-11, "p2": 1.1e-8, "p4": 1.2e-10}
    t = pf["p0"] + pf["p1"] * (chunk**2 + 2 * kv * chunk) + pf["p2"] * kv + pf["p4"] * chunk**2
    close(fit_prefill(chunk, kv, t).params, pf)


def test_wls_keeps_constrained_coefficients_non_negative():
    x = np.stack([np.ones(20), np.arange(20.0)], 1)
    y = 5.0 - 0.1 * np.arange(20.0)  # the unconstrained slope is negative
    coef = wls(x, y, nonneg=[True, True])
    assert coef[1] == 0 and coef[0] > 0
    np.testing.assert_allclose(wls(x, y), [5.0, -0.1])


def test_knot_layout_and_identifiability():
    assert default_knots(300) == [32, 64, 96, 128, 160, 192, 224, 256]
    assert default_knots(5000)[-2:] == [3968, 4096]
    assert default_knots(9000)[-6:] == [3840, 3968, 4096, 5120, 6144, 7168, 8192][-6:]
    # No row in (64, 96] (so [tau > 96] = [tau > 64] here) and none above 128: 96, 128, 160 are dropped.
    n = np.array([1.0, 32, 64, 120, 128])
    assert identifiable_knots([32, 64, 96, 128, 160], n) == [32, 64]


def test_kfold_partitions_and_held_out_never_sees_the_row():
    folds = kfold(23, 5, seed=3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(23))
    assert [f.tolist() for f in folds] == [f.tolist() for f in kfold(23, 5, seed=3)]  # seeded
    y = np.arange(10.0) + 1
    seen = []

    def fp(train, test):
        seen.append((set(train), set(test)))
        return y[test]

    held_out(10, 4, 0, fp)
    assert all(not (tr & te) for tr, te in seen)


def test_error_stats_and_neighbour_yardstick():
    s = ErrorStats.of(np.array([1.05, 2.0, 2.4]), np.array([1.0, 2.0, 3.0]))
    assert (s.n, s.over_10pct) == (3, 1)
    assert s.max == pytest.approx(0.2) and s.mean == pytest.approx(0.25 / 3)
    e = neighbour_errors(np.array([0.0, 1, 2, 4]), np.array([1.0, 3, 3, 5]))
    np.testing.assert_allclose(e, [abs(2 - 3) / 3, abs(3 + (5 - 3) / 3 - 3) / 3])


def test_whole_batch_fit_recovers_every_coefficient():
    from kvsched.costmodel.base import BatchView
    from kvsched.costmodel.features import BatchFeatures
    from kvsched.costmodel.fitting import fit_batches

    truth = {
        "a0": 9e-3, "a1": 1.2e-5, "step64": 1.5e-3, "step128": 5e-3,
        "b0": 4e-4, "b1": 2.7e-7, "b2": 3e-5, "p0": 1.2e-3, "p1": 1.6e-9, "p2": 3.5e-7, "p3": 2e-4, "p4": 3.9e-9,
    }  # fmt: skip
    cost = CalibratedCost.from_params(**truth)
    rng = np.random.default_rng(5)
    feats, times = [], []
    for _ in range(300):
        n_dec, n_pf = int(rng.integers(0, 40)), int(rng.integers(0, 3))
        if n_dec + n_pf == 0:
            continue
        c = [1] * n_dec + rng.integers(1, 100, n_pf).tolist()
        m = rng.integers(0, 3000, n_dec + n_pf).tolist()
        ph = [1] * n_dec + [0] * n_pf
        v = BatchView(np.array(c), np.array(m), np.array(ph, dtype=np.int8))
        feats.append(BatchFeatures.of(v))
        times.append(cost.batch_time(v))
    fit = fit_batches(feats, np.array(times), knots=[64, 128])
    close(fit.params, truth, rel=1e-7)


@pytest.mark.parametrize("name", ["vllm", "opt_d10", "sarathi"])
def test_stepped_fit_of_real_replay_tables_keeps_the_token_term_nonnegative(name):
    """The H100 replay tables gave steps whose sum went below 0 (a traceback in calibrate)."""
    from pathlib import Path

    from kvsched.costmodel.fitting import fit_batches
    from kvsched.executor.measure import read_replay

    table = read_replay(Path(__file__).parent.parent / "benchmarks/data/executor_h100" / f"{name}.csv")
    fit = fit_batches(table.features, table.measured, form="stepped")
    cost = CalibratedCost.from_params(**fit.params)  # raises if the token term dips below 0
    steps = sorted((int(k[4:]), v) for k, v in fit.params.items() if k.startswith("step"))
    for n in [1, *(k + 1 for k, _ in steps)]:
        assert cost.non_attention(np.array([float(n)]))[0] >= 0


# ------------------------------------------------------------ non-finite fits (bug B5)
def _no_warnings(call, *args, **kwargs):
    """``call(*args, **kwargs)`` with every warning an error: no raw numpy warning may reach stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call(*args, **kwargs)


def test_wls_refuses_non_finite_rows_and_solutions_in_one_error():
    from kvsched.costmodel.fitting import FitError

    x = np.stack([np.ones(5), np.array([1.0, 2.0, 3.0, 4.0, 1e308])], 1)
    with pytest.raises(FitError, match="cannot be fitted: its weighted rows are not finite"):
        _no_warnings(wls, x, np.full(5, 1e-10))
    with pytest.raises(FitError, match="cannot be fitted: a row's time is not positive"):
        _no_warnings(wls, x[:, :1], np.array([1.0, 0.0, 1.0, 1.0, 1.0]))
    # Finite rows whose solution overflows: 1e-300 x c = 1e300 needs c = 1e600.
    with pytest.raises(FitError, match="non-finite coefficients or residuals"):
        _no_warnings(wls, np.full((4, 1), 1e-300), np.full(4, 1e300), weights=np.ones(4))


def test_r_squared_refuses_overflowing_sums_rather_than_report_a_wrong_figure():
    from kvsched.costmodel.fitting import FitError, r_squared

    y = np.array([1e300, -1e300, 1e300])
    with pytest.raises(FitError, match="sums of squares overflow"):
        _no_warnings(r_squared, y, np.zeros(3))


def test_fits_of_absurd_rows_are_one_fit_error_without_numpy_warnings():
    from kvsched.costmodel.features import BatchFeatures
    from kvsched.costmodel.fitting import FitError, fit_batches

    batch = np.array([1.0, 2.0, 4.0, 8.0])
    with pytest.raises(FitError):
        _no_warnings(fit_decode, batch, np.full(4, 1e308), np.full(4, 1e-3))
    with pytest.raises(FitError):
        _no_warnings(fit_token_term, "stepped", GRID, np.full(GRID.size, 1e-320))
    feats = [BatchFeatures(float(i + 1), 1.0, 1e308, 0.0, 0.0, 0.0, 0.0, 0.0) for i in range(12)]
    with pytest.raises(FitError, match="cannot be fitted"):
        _no_warnings(fit_batches, feats, np.linspace(1e-3, 2e-3, 12), form="linear")
