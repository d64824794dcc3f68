"""Building blocks of the seeded generators: random streams, arrival processes, length laws.

Arrival processes (:class:`SemiOnline`, :class:`Poisson`, :class:`Gamma`) and
length distributions (:class:`Fixed`, :class:`Uniform`, :class:`LogNormal`,
:class:`Zipf`) are frozen dataclasses with ``sample(rng, n)``; :func:`assemble`
turns sampled columns into an :class:`~kvsched.instances.model.Instance`. Every
generator (:mod:`kvsched.instances.generators`, :mod:`kvsched.instances.sharegpt`,
:mod:`kvsched.instances.azure`) builds on this module, which imports none of them.

Randomness: one :class:`numpy.random.SeedSequence` per seed, split into
independent streams for arrivals, prompt lengths, output lengths, predictions and
the shuffle. Changing the arrival process therefore leaves the lengths as they
were (common random numbers across experiments).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.model import MAX_TOKENS, Instance, Limits, Request, TimeModel

#: The most requests a generator makes (its columns stay far below any memory limit).
MAX_REQUESTS = 10_000_000

# --------------------------------------------------------------------------- randomness

_STREAMS = ("arrival", "prompt", "output", "predict", "order")


def streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent random generators, one per purpose, all derived from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children, strict=True)}


# --------------------------------------------------------------------------- arrivals


@dataclass(frozen=True, slots=True)
class SemiOnline:
    """Every request arrives at time 0 (the offline / semi-online setting)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n)

    def to_params(self) -> dict[str, Any]:
        return {"arrival": "semi-online"}


@dataclass(frozen=True, slots=True)
class Poisson:
    """Poisson arrivals: exponential inter-arrival times with mean ``1 / rate``.

    The first request arrives at 0, so the trace starts when the instance does.
    """

    rate: float

    def __post_init__(self) -> None:
        require(self.rate > 0 and math.isfinite(self.rate), f"rate must be > 0, got {self.rate}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _from_gaps(rng.exponential(1.0 / self.rate, size=max(n - 1, 0)))

    def to_params(self) -> dict[str, Any]:
        return {"arrival": "poisson", "rate": self.rate}


@dataclass(frozen=True, slots=True)
class Gamma:
    """Bursty arrivals: gamma inter-arrival times with mean ``1 / rate`` and coefficient of variation ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` is burstier (shape ``1 / cv**2``), the usual
    knob in serving benchmarks. ``cv`` must lie in ``[CV_MIN, CV_MAX]``.
    """

    rate: float
    cv: float

    #: Outside [CV_MIN, CV_MAX] the gamma law is not sampled faithfully: cv**2 underflows to 0 below about
    #: 1e-154 (ZeroDivisionError) and overflows above 1e154; already at cv = 1000 almost every gap
    #: underflows to 0 and a million gaps miss the mean by a factor of 6. At cv = 100 the mean and cv hold.
    CV_MIN = 1e-6
    CV_MAX = 100.0

    def __post_init__(self) -> None:
        require(self.rate > 0 and math.isfinite(self.rate), f"rate must be > 0, got {self.rate}")
        require(
            self.CV_MIN <= self.cv <= self.CV_MAX,
            f"cv must be from {self.CV_MIN:g} to {self.CV_MAX:g} (where gamma gaps keep their mean and cv), "
            f"got {self.cv}",
        )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        gaps = rng.gamma(shape, 1.0 / (self.rate * shape), size=max(n - 1, 0))
        return _from_gaps(gaps)

    def to_params(self) -> dict[str, Any]:
        return {"arrival": "gamma", "rate": self.rate, "cv": self.cv}


ArrivalProcess = SemiOnline | Poisson | Gamma


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(gaps)])


# --------------------------------------------------------------------------- lengths


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every request has the same length."""

    value: int

    def __post_init__(self) -> None:
        require(self.value >= 1, f"length must be >= 1, got {self.value}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def to_params(self, side: str) -> dict[str, Any]:
        return {side: "fixed", f"{side}_value": self.value}


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integer lengths uniform on ``[lo, hi]`` (both included)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        require(1 <= self.lo <= self.hi, f"need 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)

    def to_params(self, side: str) -> dict[str, Any]:
        return {side: "uniform", f"{side}_lo": self.lo, f"{side}_hi": self.hi}


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Lognormal lengths ``round(median * exp(sigma * Z))``, clipped to ``[1, max]``.

    Heavy right tails like real prompt and output lengths. Use
    :meth:`from_mean` to give the (unclipped) mean instead of the median, or
    :meth:`fit_mean` for the mean of the lengths actually drawn (rounded and clipped).
    """

    median: float
    sigma: float = 1.0
    max: int = 4096

    def __post_init__(self) -> None:
        require(self.median > 0 and math.isfinite(self.median), f"median must be > 0, got {self.median}")
        require(self.sigma >= 0 and math.isfinite(self.sigma), f"sigma must be >= 0, got {self.sigma}")
        require(self.max >= 1, f"max must be >= 1, got {self.max}")

    @classmethod
    def from_mean(cls, mean: float, sigma: float = 1.0, max: int = 4096) -> LogNormal:
        """The lognormal with the given mean: median = mean * exp(-sigma^2 / 2)."""
        require(mean > 0 and math.isfinite(mean), f"mean must be > 0, got {mean}")
        return cls(mean * math.exp(-(sigma**2) / 2), sigma, max)

    @classmethod
    def fit_mean(cls, mean: float, sigma: float = 1.0, max: int = 4096) -> LogNormal:
        """The lognormal whose lengths (rounded, clipped to ``[1, max]``) have mean ``mean``.

        :meth:`from_mean` ignores the clip: asking for a mean of 3000 with ``max = 4096`` gave lengths of
        mean 2121. Here the median is solved for under the clip (the mean grows with the median). With
        ``sigma = 0`` every length is ``round(mean)``. Raises :class:`InputError` unless
        ``1 < mean < max`` (``1 <= mean <= max`` for ``sigma = 0``): no median reaches other means.
        """
        require(mean > 0 and math.isfinite(mean), f"mean must be > 0, got {mean}")
        require(sigma >= 0 and math.isfinite(sigma), f"sigma must be >= 0, got {sigma}")
        require(max >= 1, f"max must be >= 1, got {max}")
        if sigma == 0:
            require(1 <= mean <= max, f"mean must be from 1 to max={max} with sigma=0, got {mean:g}")
            return cls(mean, 0.0, max)
        # Lengths are clipped to [1, max], so with sigma > 0 their mean lies strictly between 1 and max.
        require(
            1 < mean < max,
            f"mean must be above 1 and below max={max} (lengths are clipped to it), got {mean:g}",
        )
        # Solve in log(median): a wide law (sigma = 40) needs a median like exp(-70), past exp's range in
        # the unclipped formula. Start at the unclipped answer and bracket outwards from there.
        lo = hi = float(np.clip(math.log(mean) - sigma**2 / 2, -700.0, 700.0))  # `max` is the clip here
        step = 1.0 + sigma
        unreachable = f"no median gives mean {mean:g} with sigma={sigma:g} and max={max}"
        while _clipped_mean(lo, sigma, max) > mean:
            lo -= step
            require(lo > -700, unreachable)
        while _clipped_mean(hi, sigma, max) < mean:
            hi += step
            require(hi < 700, unreachable)
        for _ in range(60):  # bisection: 60 halvings leave far less than 1e-9 of the bracket
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _clipped_mean(mid, sigma, max) < mean else (lo, mid)
        return cls(math.exp((lo + hi) / 2), sigma, max)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _lognormal_lengths(self.median, self.sigma * rng.standard_normal(n), self.max)

    def to_params(self, side: str) -> dict[str, Any]:
        return {
            side: "lognormal",
            f"{side}_median": self.median,
            f"{side}_sigma": self.sigma,
            f"{side}_max": self.max,
        }


_ERFC = np.frompyfunc(math.erfc, 1, 1)
#: Below this length the clipped mean sums the rounding exactly; above it a unit's rounding no longer matters.
_EXACT_UP_TO = 2048


def _clipped_mean(log_median: float, sigma: float, top: int) -> float:
    """Mean of ``clip(round(exp(log_median + sigma * Z)), 1, top)`` for ``sigma > 0``.

    The length V is an integer in ``[1, top]``, so ``E[V] = 1 + sum_{k=1}^{top-1} P(V > k)`` with
    ``P(V > k) = P(X >= k + 0.5)``. That sum is exact up to :data:`_EXACT_UP_TO`; past it each term is its
    unit interval's integral (midpoint rule), taken on a log grid where the integrand is smooth.
    """

    def tail(x: np.ndarray) -> np.ndarray:  # P(X > x)
        z = (np.log(x) - log_median) / (sigma * math.sqrt(2.0))
        return 0.5 * _ERFC(z).astype(np.float64)

    k = np.arange(1, min(top - 1, _EXACT_UP_TO) + 1, dtype=np.float64)
    total = 1.0 + float(tail(k + 0.5).sum())
    if top - 1 > _EXACT_UP_TO:
        t = np.linspace(math.log(_EXACT_UP_TO + 1), math.log(top), 4001)
        f = tail(np.exp(t)) * np.exp(t)
        total += float(np.sum((f[1:] + f[:-1]) / 2) * (t[1] - t[0]))
    return total


@dataclass(frozen=True, slots=True)
class Zipf:
    """Zipf lengths: P(k) proportional to k^(-a) for k >= 1 (a > 1), clipped to ``max``."""

    a: float
    max: int = 4096

    def __post_init__(self) -> None:
        require(self.a > 1 and math.isfinite(self.a), f"Zipf exponent a must be > 1, got {self.a}")
        require(self.max >= 1, f"max must be >= 1, got {self.max}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(rng.zipf(self.a, size=n), self.max).astype(np.int64)

    def to_params(self, side: str) -> dict[str, Any]:
        return {side: "zipf", f"{side}_a": self.a, f"{side}_max": self.max}


LengthDist = Fixed | Uniform | LogNormal | Zipf


def noisy_predictions(rng: np.random.Generator, outputs: np.ndarray, sigma: float) -> np.ndarray:
    """Predicted output lengths ``max(1, round(O * exp(sigma * Z)))``.

    Multiplicative lognormal noise with median 1: a prediction is as likely to
    be too long as too short by the same factor. ``sigma = 0`` is an exact oracle.
    """
    require(sigma >= 0 and math.isfinite(sigma), f"predict_sigma must be >= 0, got {sigma}")
    noise = sigma * rng.standard_normal(len(outputs))
    return _lognormal_lengths(outputs, noise, MAX_TOKENS)


def _lognormal_lengths(median: Any, noise: np.ndarray, top: int) -> np.ndarray:
    """``round(median * exp(noise))`` as token counts in ``[1, top]``.

    The noise is capped before ``exp`` where the length would pass ``top`` anyway: with a large sigma ``exp``
    overflows to inf, and inf cast to int64 is its minimum. Below the cap the arithmetic is the plain
    formula's, so seeded instances keep their lengths.
    """
    capped = np.minimum(noise, np.log(top / median) + 1.0)
    return np.clip(np.rint(median * np.exp(capped)), 1, top).astype(np.int64)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


# --------------------------------------------------------------------------- assembling


def assemble(
    *,
    kind: str,
    n: int,
    seed: int,
    limits: Limits,
    time_model: TimeModel,
    arrivals: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    params: dict[str, Any],
    predict_sigma: float | None = None,
    tick: float | None = None,
    rng: dict[str, np.random.Generator] | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> Instance:
    """Turn sampled columns into an :class:`Instance` (shared by every generator).

    Arrivals are snapped up to multiples of ``tick`` when it is given (e.g. 1
    for whole slots); requests are then ordered by arrival (stably, so
    simultaneous arrivals keep their sampled order) and named ``r0, r1, ...``.
    ``params`` is recorded in ``meta`` as given, plus ``predict_sigma`` and
    ``tick`` when set.
    """
    rng = rng if rng is not None else streams(seed)
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if tick is not None:
        require(tick > 0 and math.isfinite(tick), f"tick must be > 0, got {tick}")
        arrivals = np.ceil(arrivals / tick) * tick
        # 14 * 0.1 is 1.4000000000000001 in binary: a tick written with few decimals gives arrivals
        # written with as few (each still the nearest float to a whole multiple of the tick).
        places = _decimal_places(tick)
        if places is not None:
            arrivals = np.round(arrivals, places)
    predicted = None
    if predict_sigma is not None:
        predicted = noisy_predictions(rng["predict"], np.asarray(outputs), predict_sigma)
    order = np.argsort(arrivals, kind="stable")
    requests = tuple(
        Request(
            id=f"r{k}",
            arrival=float(arrivals[j]),
            prompt=int(prompts[j]),
            output=int(outputs[j]),
            predicted_output=None if predicted is None else int(predicted[j]),
        )
        for k, j in enumerate(order)
    )
    recorded = dict(params)
    if predict_sigma is not None:
        recorded["predict_sigma"] = float(predict_sigma)
    if tick is not None:
        recorded["tick"] = float(tick)
    meta: dict[str, Any] = {"kind": kind, "n": int(n), "seed": int(seed), "params": recorded}
    meta.update(extra_meta or {})
    return Instance(requests, limits, time_model, f"{kind}-n{n}-seed{seed}", meta)


def _decimal_places(tick: float) -> int | None:
    """Digits after the point in ``tick``'s shortest decimal form (0.25 -> 2), or None if it has many."""
    text = repr(float(tick))
    if "e" in text or "." not in text:
        return None
    places = len(text.split(".")[1].rstrip("0"))
    return places if places <= 9 else None


def check_n_seed(n: int, seed: int) -> None:
    """Raise :class:`InputError` unless ``n >= 1`` and ``seed >= 0`` are integers."""
    require(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and 1 <= n <= MAX_REQUESTS,
        f"n must be an integer in 1..{MAX_REQUESTS:,}, got {n!r}",
    )
    require(
        isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0,
        f"seed must be an integer >= 0, got {seed!r}",
    )
