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
    knob in serving benchmarks.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        require(self.rate > 0 and math.isfinite(self.rate), f"rate must be > 0, got {self.rate}")
        require(self.cv > 0 and math.isfinite(self.cv), f"cv must be > 0, got {self.cv}")

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
    :meth:`from_mean` to give the (unclipped) mean instead of the median.
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

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _lognormal_lengths(self.median, self.sigma * rng.standard_normal(n), self.max)

    def to_params(self, side: str) -> dict[str, Any]:
        return {
            side: "lognormal",
            f"{side}_median": self.median,
            f"{side}_sigma": self.sigma,
            f"{side}_max": self.max,
        }


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
