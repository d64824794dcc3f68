"""Least-squares fits of the linear and piecewise-linear forms.

Every form is linear in its coefficients once its discrete shape (a hinge
point, a tile size, a set of knots) is fixed, so each fit is a weighted least
squares solve (``numpy.linalg.lstsq``). Rows are weighted by 1 / y: the fit
minimises the sum of squared *relative* errors, the quantity the fidelity
targets are stated in, so that 9 ms batches count as much as 300 ms ones.
Coefficients that must be >= 0 are kept so by a greedy active set: while one
is negative, the most negative is fixed at 0 and the rest refitted.

Token-term forms (``tau`` = tokens in the batch):

* ``linear``    a0 + a1 tau                                   (seed 003, InferMax)
* ``hinge``     a0 + h * max(0, tau - b0)                     (seed 001, Eq. 2.3)
* ``staircase`` a0 + u * ceil(tau / b0)                       (seed 001 v3)
* ``rad``       a0 + a1 tau + u * ceil(tau / t_col)           (seed 000, Eq. 4 + 7)
* ``stepped``   a0 + a1 tau + sum_k step_k [tau > k]          (the calibrated default)

The discrete shape is chosen on the rows being fitted (so a held-out row never
influences it). ``stepped`` puts knots on tile boundaries: every 32 tokens up
to 256, every 64 up to 1024, every 128 up to 4096 and every 1024 beyond; a
knot is kept only when rows fall on both sides of it and between it and the
previous knot, so every step is identifiable. Beyond the last row, a hinge
continues the steps at their mean rate over the last 1024 measured tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np

from kvsched.costmodel.features import BatchFeatures
from kvsched.errors import InputError

TOKEN_FORMS = ("linear", "hinge", "staircase", "rad", "stepped")
STAIRCASE_BLOCKS = (16, 32, 64, 128, 256, 512)
RAD_TILES = (64, 128, 256)
HINGE_CANDIDATES = 128
EXTRAPOLATION_WINDOW = 1024
#: (step, up to) pairs of the default knot layout.
KNOT_LAYOUT = ((32, 256), (64, 1024), (128, 4096), (1024, 1 << 20))


class FitError(InputError):
    """A table whose least-squares fit is not finite (its numbers are too large or small for float64).

    The message has no file name: the caller that read the table prefixes it.
    """


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted term: named coefficients and its in-sample R^2 (on the unweighted y)."""

    params: dict[str, float]
    r2: float


def wls(
    x: np.ndarray,
    y: np.ndarray,
    *,
    nonneg: Sequence[bool] | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted least squares with optional >= 0 constraints (greedy active set).

    Parameters
    ----------
    x
        Design matrix, one row per observation.
    y
        Observations.
    nonneg
        Per column, whether its coefficient must be >= 0 (default: none).
    weights
        Per-row weight on the residual; default 1 / y (squared relative errors).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if weights is None and not (y > 0).all():
        raise FitError(
            "the table cannot be fitted: a row's time is not positive (rows are weighted by 1 / time, "
            "for relative errors)"
        )
    # Overflow is detected below and reported as one FitError, not as numpy warnings on stderr.
    with np.errstate(all="ignore"):
        w = 1.0 / y if weights is None else np.asarray(weights, dtype=np.float64)
        xw, yw = x * w[:, None], y * w
    if not (np.isfinite(xw).all() and np.isfinite(yw).all()):
        raise FitError(
            "the table cannot be fitted: its weighted rows are not finite (numbers too large or small)"
        )
    cons = np.zeros(x.shape[1], dtype=bool) if nonneg is None else np.asarray(nonneg, dtype=bool)
    active = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    while True:
        coef[:] = 0.0
        if active.any():
            try:
                with np.errstate(all="ignore"):
                    coef[active] = np.linalg.lstsq(xw[:, active], yw, rcond=None)[0]
                    residual = xw @ coef - yw
            except np.linalg.LinAlgError as exc:
                raise FitError(f"the table cannot be fitted: least squares failed ({exc})") from None
            if not (np.isfinite(coef).all() and np.isfinite(residual).all()):
                raise FitError(
                    "the table cannot be fitted: least squares gives non-finite coefficients or residuals "
                    "(numbers too large or small for float64)"
                )
        neg = cons & active & (coef < 0)
        if not neg.any():
            return coef
        active[np.flatnonzero(neg)[np.argmin(coef[neg])]] = False


def r_squared(y: np.ndarray, pred: np.ndarray) -> float:
    """1 - SS_res / SS_tot (1.0 for a perfect fit of constant data).

    Raises
    ------
    FitError
        When the sums of squares overflow: no R^2 is reported then rather than a wrong one.
    """
    with np.errstate(all="ignore"):
        ss_res = float(np.sum((y - pred) ** 2))
        ss_tot = float(np.sum((y - y.mean()) ** 2))
    if not (np.isfinite(ss_res) and np.isfinite(ss_tot)):
        raise FitError("the table cannot be fitted: its sums of squares overflow float64 (times too large)")
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _quiet(fit: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a fit with numpy's floating-point warnings off.

    Its designs, predictions and error sums may overflow on absurd tables; :func:`wls` and
    :func:`r_squared` check what comes out and raise one :class:`FitError`, so the raw warnings
    would only repeat that on stderr.
    """

    @functools.wraps(fit)
    def quiet(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with np.errstate(all="ignore"):
            return fit(*args, **kwargs)

    return quiet


def _need_rows(n: np.ndarray, k: int, what: str) -> None:
    # A FitError, so that the caller that read the table names it (calibrate._naming).
    if n.size < k:
        raise FitError(f"{what} needs at least {k} rows, got {n.size}")


# ------------------------------------------------------------ token term
def default_knots(max_tokens: float) -> list[int]:
    """The stepped form's knot layout below ``max_tokens``."""
    knots: list[int] = []
    lo = 0
    for step, hi in KNOT_LAYOUT:
        k = (lo // step + 1) * step
        while k <= hi and k < max_tokens:
            knots.append(k)
            k += step
        lo = hi
    return knots


def identifiable_knots(knots: Sequence[int], n: np.ndarray) -> list[int]:
    """The knots whose step can be told apart on rows ``n``.

    [tau > k] differs from the previous knot's column only if a row falls in
    (k_prev, k], and from the constant only if a row lies above k.
    """
    kept: list[int] = []
    prev = -np.inf
    top = float(np.max(n))
    for k in sorted(knots):
        if k < top and np.any((n > prev) & (n <= k)):
            kept.append(int(k))
            prev = k
    return kept


def token_design(
    form: str, n: np.ndarray, shape: float | Sequence[int] | None
) -> tuple[np.ndarray, list[str], list[bool]]:
    """Design matrix, coefficient names and >= 0 flags of a token-term form with a fixed shape."""
    one = np.ones_like(n)
    if form == "linear":
        return np.stack([one, n], 1), ["a0", "a1"], [True, True]
    if form == "hinge":
        b0 = float(shape)  # type: ignore[arg-type]
        return np.stack([one, np.maximum(0.0, n - b0)], 1), ["a0", f"hinge{int(b0)}"], [True, True]
    if form == "staircase":
        t = int(shape)  # type: ignore[arg-type]
        return np.stack([one, np.ceil(n / t)], 1), ["a0", f"tile{t}"], [True, True]
    if form == "rad":
        t = int(shape)  # type: ignore[arg-type]
        return np.stack([one, n, np.ceil(n / t)], 1), ["a0", "a1", f"tile{t}"], [True, True, True]
    if form == "stepped":
        knots = list(shape or [])  # type: ignore[arg-type]
        cols = [one, n, *((n > k).astype(np.float64) for k in knots)]
        names = ["a0", "a1", *(f"step{k}" for k in knots)]
        return np.stack(cols, 1), names, [True, True, *([False] * len(knots))]
    raise InputError(f"--form: unknown form {form!r} (known: {', '.join(TOKEN_FORMS)})")


def _shapes(form: str, n: np.ndarray, knots: Sequence[int] | None) -> list:  # type: ignore[type-arg]
    if form == "linear":
        return [None]
    if form == "hinge":
        # Any row's token count may be the bend (the last two leave no slope to fit);
        # at most HINGE_CANDIDATES of them, evenly spread, to bound the cost.
        cand = np.unique(n)[:-2]
        if cand.size > HINGE_CANDIDATES:
            cand = cand[np.linspace(0, cand.size - 1, HINGE_CANDIDATES).round().astype(int)]
        return [float(v) for v in cand] or [0.0]
    if form == "staircase":
        return list(STAIRCASE_BLOCKS)
    if form == "rad":
        return list(RAD_TILES)
    return [identifiable_knots(default_knots(float(np.max(n))) if knots is None else knots, n)]


@_quiet
def fit_token_term(form: str, n: np.ndarray, y: np.ndarray, *, knots: Sequence[int] | None = None) -> Fit:
    """Fit a token-term form to token counts ``n`` and times ``y`` (seconds).

    The shape (hinge point, block, tile, knots) with the least weighted squared
    error on these rows wins; ``knots`` overrides the stepped layout.
    """
    n = np.asarray(n, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    _need_rows(n, 3, f"the {form} token term")
    best: tuple[float, np.ndarray, list[str], np.ndarray] | None = None
    for shape in _shapes(form, n, knots):
        x, names, nonneg = token_design(form, n, shape)
        coef = wls(x, y, nonneg=nonneg)
        pred = x @ coef
        sse = float(np.sum(((pred - y) / y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, coef, names, pred)
    assert best is not None
    _, coef, names, pred = best
    params = dict(zip(names, (float(c) for c in coef), strict=True))
    if form == "stepped":
        params.update(_extrapolation(params, float(np.max(n))))
    return Fit(params, r_squared(y, pred))


def _extrapolation(params: dict[str, float], top: float) -> dict[str, float]:
    """A hinge at the last row that continues the steps at their mean rate over the last 1024 tokens.

    Without it the model would add only a1 per token beyond the measured range,
    while inside it the steps carry much of the growth.
    """
    lo = top - EXTRAPOLATION_WINDOW
    rise = sum(v for k, v in params.items() if k.startswith("step") and int(k[4:]) > lo)
    rate = max(0.0, rise / EXTRAPOLATION_WINDOW)
    return {f"hinge{int(top)}": rate} if rate > 0 else {}


# ------------------------------------------------------------ attention terms
def decode_design(batch: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """Columns for b0 + b1 * sum(m) + b2 * #decodes, for rows of ``batch`` decodes each holding ``kv``."""
    return np.stack([np.ones_like(batch), batch * kv, batch], 1)


def prefill_design(chunk: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """Columns for p0 + p1 (c^2 + 2mc) + p2 m + p4 c^2, for rows of one chunk each."""
    return np.stack([np.ones_like(chunk), chunk * chunk + 2.0 * kv * chunk, kv, chunk * chunk], 1)


DECODE_NAMES = ("b0", "b1", "b2")
#: p3 (per prefill request) is not fitted: with one chunk per row it is the same column as p0.
PREFILL_NAMES = ("p0", "p1", "p2", "p4")


@_quiet
def fit_decode(batch: np.ndarray, kv: np.ndarray, t: np.ndarray, weights: np.ndarray | None = None) -> Fit:
    """Fit decode attention (per layer) to rows of ``batch`` decodes each holding ``kv`` KV.

    ``weights`` as in :func:`wls` (default: relative to the attention time).
    """
    batch, kv, t = (np.asarray(a, dtype=np.float64) for a in (batch, kv, t))
    _need_rows(batch, 3, "decode attention")
    x = decode_design(batch, kv)
    coef = wls(x, t, nonneg=[True] * 3, weights=weights)
    return Fit(dict(zip(DECODE_NAMES, map(float, coef), strict=True)), r_squared(t, x @ coef))


@_quiet
def fit_prefill(chunk: np.ndarray, kv: np.ndarray, t: np.ndarray, weights: np.ndarray | None = None) -> Fit:
    """Fit prefill attention (per layer) to rows of one ``chunk`` over ``kv`` KV (``weights`` as in :func:`wls`)."""
    chunk, kv, t = (np.asarray(a, dtype=np.float64) for a in (chunk, kv, t))
    _need_rows(chunk, 4, "prefill attention")
    x = prefill_design(chunk, kv)
    coef = wls(x, t, nonneg=[True] * 4, weights=weights)
    return Fit(dict(zip(PREFILL_NAMES, map(float, coef), strict=True)), r_squared(t, x @ coef))


def predict_decode(params: dict[str, float], batch: np.ndarray, kv: np.ndarray) -> np.ndarray:
    return decode_design(np.asarray(batch, float), np.asarray(kv, float)) @ np.array(
        [params.get(k, 0.0) for k in DECODE_NAMES]
    )


def predict_prefill(params: dict[str, float], chunk: np.ndarray, kv: np.ndarray) -> np.ndarray:
    return prefill_design(np.asarray(chunk, float), np.asarray(kv, float)) @ np.array(
        [params.get(k, 0.0) for k in PREFILL_NAMES]
    )


# ------------------------------------------------------------ whole batches
BATCH_NAMES = ("b0", "b1", "b2", "p0", "p1", "p2", "p3", "p4")


@_quiet
def p3_pinned(features: Sequence[BatchFeatures]) -> bool:
    """Whether :func:`fit_batches` pins p3 (per prefill) to 0: no batch has two prefills, so its column is
    p0's (per batch with a prefill) and the two cannot be told apart."""
    return all(f.n_prefill <= 1 for f in features)


def fit_batches(
    features: Sequence[BatchFeatures],
    t: np.ndarray,
    *,
    form: str = "stepped",
    knots: Sequence[int] | None = None,
) -> Fit:
    """Fit every coefficient of the calibrated model jointly to whole-batch times.

    For measured batches (the GPU executor's): ``features[i]`` are batch i's
    sums and ``t[i]`` its time. The token term takes ``form`` (``linear`` or
    ``stepped``); the attention terms are InferMax's plus b2 and p4, all >= 0.
    When no batch has two prefills, p3 (per prefill) is the same column as p0
    (per batch with prefill) and is pinned to 0, as the Vidur path pins it;
    least squares would otherwise split their weight evenly, and a batch with two
    prefills would be charged 1.5 times the measured bias.
    """
    if form not in ("linear", "stepped"):
        raise InputError(f"--form: whole-batch fits take linear or stepped, not {form!r}")
    t = np.asarray(t, dtype=np.float64)
    tau = np.array([f.tokens for f in features], dtype=np.float64)
    _need_rows(tau, 12, "a whole-batch fit")
    shape = (
        identifiable_knots(default_knots(float(tau.max())) if knots is None else knots, tau)
        if form == "stepped"
        else None
    )
    att = np.array(
        [
            [
                float(f.n_decode > 0), f.decode_kv, f.n_decode,
                float(f.n_prefill > 0), f.prefill_quad, f.prefill_kv, f.n_prefill, f.prefill_sq,
            ]
            for f in features
        ]
    )  # fmt: skip
    if p3_pinned(features):
        att[:, 6] = 0.0  # a zero column's minimum-norm coefficient is 0: p3 pinned (see the docstring)
    while True:
        x_tok, names, nonneg = token_design(form, tau, shape)
        x = np.hstack([x_tok, att])
        coef = wls(x, t, nonneg=[*nonneg, *([True] * len(BATCH_NAMES))])
        # Steps may be negative, but the token term they build may not (no batch takes negative
        # time); where it dips below 0, the most negative step before the dip goes and the fit is
        # redone. Without steps, a0 + a1 n >= 0 holds, so this ends.
        drop = _negative_step(shape, coef[: len(names)]) if form == "stepped" else None
        if drop is None:
            break
        shape = [k for k in shape if k != drop]  # type: ignore[union-attr]
    params = dict(zip([*names, *BATCH_NAMES], map(float, coef), strict=True))
    return Fit(params, r_squared(t, x @ coef))


def _negative_step(knots: Sequence[int] | None, coef: np.ndarray) -> int | None:
    """The knot to drop when the stepped token term a0 + a1 n + sum steps is negative for some n >= 1."""
    knots = list(knots or [])
    a0, a1, steps = coef[0], coef[1], coef[2:]
    # The term is linear between knots: probing 1 and just past each knot covers every piece.
    probes = np.array([1.0, *(k + 1.0 for k in knots)])
    value = a0 + a1 * probes + np.concatenate([[0.0], np.cumsum(steps)])
    bad = np.flatnonzero(value < 0)
    if bad.size == 0 or not knots:
        return None
    first = max(int(bad[0]), 1)  # steps up to and including knot first - 1 act at that probe
    return knots[int(np.argmin(steps[:first]))]
