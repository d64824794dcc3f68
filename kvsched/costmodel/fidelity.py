"""How faithful a fitted model is: k-fold held-out relative errors.

Each row of a profiling table is predicted by a model fitted without it (its
fold), shape selection included, and the relative error |pred - y| / y is
summarised as mean, 95th percentile and max, with the count of rows above 10 %.
Folds are a seeded random partition, so the figures are reproducible.

``neighbour_errors`` (the ``neighbours`` row) is a yardstick, not a model: it predicts each interior row
by interpolating its two neighbours on the token grid. Where even that misses a
row by more than 10 %, the row is an isolated jump (a GEMM kernel switch) that
no function of the token count fitted to the other rows can reproduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def kfold(n_rows: int, k: int, seed: int) -> list[np.ndarray]:
    """A seeded partition of ``range(n_rows)`` into ``min(k, n_rows)`` folds."""
    if n_rows < 2:
        raise ValueError("k-fold needs at least 2 rows")
    k = max(2, min(k, n_rows))
    order = np.random.default_rng(seed).permutation(n_rows)
    return [np.sort(f) for f in np.array_split(order, k)]


def held_out(
    n_rows: int, k: int, seed: int, fit_predict: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """Held-out prediction of every row: ``fit_predict(train, test)`` fits on ``train`` and predicts ``test``."""
    pred = np.empty(n_rows)
    everything = np.arange(n_rows)
    for test in kfold(n_rows, k, seed):
        train = np.setdiff1d(everything, test, assume_unique=True)
        pred[test] = fit_predict(train, test)
    return pred


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Relative-error summary of predictions against observations."""

    n: int
    mean: float
    p95: float
    max: float
    over_10pct: int

    @classmethod
    def of(cls, pred: np.ndarray, y: np.ndarray) -> ErrorStats:
        err = np.abs(np.asarray(pred, float) - np.asarray(y, float)) / np.asarray(y, float)
        if err.size == 0:
            return cls(0, float("nan"), float("nan"), float("nan"), 0)
        return cls(
            int(err.size),
            float(err.mean()),
            float(np.percentile(err, 95)),
            float(err.max()),
            int((err > 0.10).sum()),
        )


def neighbour_errors(n: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative error of predicting each interior row by linear interpolation of its two neighbours."""
    n = np.asarray(n, float)
    y = np.asarray(y, float)
    if n.size < 3:
        return np.zeros(0)
    w = (n[1:-1] - n[:-2]) / (n[2:] - n[:-2])
    pred = y[:-2] + w * (y[2:] - y[:-2])
    return np.abs(pred - y[1:-1]) / y[1:-1]


@dataclass(frozen=True, slots=True)
class FidelityRow:
    """One line of a fidelity table.

    Parameters
    ----------
    rows
        Which measured rows: ``non-attention``, ``decode attn (layer)``,
        ``prefill attn (layer)``, ``whole batch``, or a derivation check such
        as ``prefill attn (layer) tp=8, derived (llama-2-7b on a100-80gb)``, which
        names the model and GPU of the attention table it checks (not the target's).
    form
        The fitted form (token-term form, or the attention form).
    stats
        Held-out relative errors.
    r2
        In-sample R^2 of the term's fit on all rows (nan where not a fit).
    """

    rows: str
    form: str
    stats: ErrorStats
    r2: float = float("nan")

    def as_dict(self) -> dict[str, float | int | str | None]:
        s = self.stats
        return {
            "rows": self.rows,
            "form": self.form,
            "n": s.n,
            "mean_rel_err": _sig(s.mean),
            "p95_rel_err": _sig(s.p95),
            "max_rel_err": _sig(s.max),
            "over_10pct": s.over_10pct,
            "r2": _sig(self.r2),
        }


def _sig(x: float, digits: int = 4) -> float | None:
    # JSON has no NaN: a missing figure is null.
    return float(f"{x:.{digits}g}") if np.isfinite(x) else None
