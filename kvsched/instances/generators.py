"""Seeded instance generators: synthetic workloads, the InferMax grids and mixes, ShareGPT.

Two layers:

* typed building blocks: arrival processes (:class:`SemiOnline`, :class:`Poisson`,
  :class:`Gamma`) and length distributions (:class:`Fixed`, :class:`Uniform`,
  :class:`LogNormal`, :class:`Zipf`), each a frozen dataclass with
  ``sample(rng, n)``, and the generator functions :func:`synthetic`,
  :func:`infermax_grid` and :func:`infermax_mix` (ShareGPT lives in
  :mod:`kvsched.instances.sharegpt`);
* a flat ``key=value`` front end for the command line: :func:`parse_params`
  turns strings into checked values and :func:`generate` builds the instance of
  a registered kind (see :data:`GENERATORS`).

Every instance records how to rebuild it: ``meta = {"kind", "n", "seed",
"params"}`` where ``params`` holds the flat parameters actually used (defaults
filled in), so ``generate(meta["kind"], n=meta["n"], seed=meta["seed"],
limits=..., time_model=..., **meta["params"])`` gives the same requests.

Randomness: one :class:`numpy.random.SeedSequence` per seed, split into
independent streams for arrivals, prompt lengths, output lengths, predictions and
the shuffle. Changing the arrival process therefore leaves the lengths as they
were (common random numbers across experiments).

Generated instances are not checked for feasibility (a synthetic length may
exceed the KV capacity); call :meth:`Instance.check_feasible`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel

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
        _require(self.rate > 0 and math.isfinite(self.rate), f"rate must be > 0, got {self.rate}")

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
        _require(self.rate > 0 and math.isfinite(self.rate), f"rate must be > 0, got {self.rate}")
        _require(self.cv > 0 and math.isfinite(self.cv), f"cv must be > 0, got {self.cv}")

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
        _require(self.value >= 1, f"length must be >= 1, got {self.value}")

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
        _require(1 <= self.lo <= self.hi, f"need 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

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
        _require(self.median > 0 and math.isfinite(self.median), f"median must be > 0, got {self.median}")
        _require(self.sigma >= 0 and math.isfinite(self.sigma), f"sigma must be >= 0, got {self.sigma}")
        _require(self.max >= 1, f"max must be >= 1, got {self.max}")

    @classmethod
    def from_mean(cls, mean: float, sigma: float = 1.0, max: int = 4096) -> LogNormal:
        """The lognormal with the given mean: median = mean * exp(-sigma^2 / 2)."""
        _require(mean > 0 and math.isfinite(mean), f"mean must be > 0, got {mean}")
        return cls(mean * math.exp(-(sigma**2) / 2), sigma, max)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(x, 1, self.max).astype(np.int64)

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
        _require(self.a > 1 and math.isfinite(self.a), f"Zipf exponent a must be > 1, got {self.a}")
        _require(self.max >= 1, f"max must be >= 1, got {self.max}")

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
    _require(sigma >= 0 and math.isfinite(sigma), f"predict_sigma must be >= 0, got {sigma}")
    noisy = np.rint(outputs * np.exp(sigma * rng.standard_normal(len(outputs))))
    return np.maximum(noisy, 1).astype(np.int64)


def _require(ok: bool, message: str) -> None:
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
        _require(tick > 0 and math.isfinite(tick), f"tick must be > 0, got {tick}")
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
    _require(isinstance(n, int | np.integer) and n >= 1, f"n must be an integer >= 1, got {n!r}")
    _require(isinstance(seed, int | np.integer) and seed >= 0, f"seed must be an integer >= 0, got {seed!r}")


# --------------------------------------------------------------------------- generators


def synthetic(
    n: int,
    seed: int,
    limits: Limits,
    time_model: TimeModel | None = None,
    *,
    arrival: ArrivalProcess | None = None,
    prompt: LengthDist,
    output: LengthDist,
    predict_sigma: float | None = None,
    tick: float | None = None,
) -> Instance:
    """``n`` requests with independent prompt and output lengths and the given arrivals.

    Parameters
    ----------
    n, seed
        Number of requests and random seed.
    limits, time_model
        Copied into the instance (``time_model`` defaults to ``unit``).
    arrival
        Arrival process (default :class:`SemiOnline`); rates are per time unit
        of ``time_model``.
    prompt, output
        Length distributions of I and O.
    predict_sigma
        When given, each request gets a noisy predicted output length (see
        :func:`noisy_predictions`).
    tick
        When given, arrivals are rounded up to multiples of it.
    """
    check_n_seed(n, seed)
    arrival = arrival or SemiOnline()
    rng = streams(seed)
    params = {**arrival.to_params(), **prompt.to_params("prompt"), **output.to_params("output")}
    return assemble(
        kind="synthetic",
        n=n,
        seed=seed,
        limits=limits,
        time_model=time_model or TimeModel(),
        arrivals=arrival.sample(rng["arrival"], n),
        prompts=prompt.sample(rng["prompt"], n),
        outputs=output.sample(rng["output"], n),
        params=params,
        predict_sigma=predict_sigma,
        tick=tick,
        rng=rng,
    )


def infermax_grid(
    prompt: int,
    output: int,
    n: int,
    limits: Limits,
    time_model: TimeModel | None = None,
    *,
    seed: int = 0,
    arrival: ArrivalProcess | None = None,
    predict_sigma: float | None = None,
    tick: float | None = None,
) -> Instance:
    """InferMax's homogeneous workload (seed 003, Sec. 4): ``n`` = B identical requests (I, O).

    All arrive at 0 unless another ``arrival`` process is given; ``seed`` only
    matters for such arrivals and for predictions.
    """
    check_n_seed(n, seed)
    fixed_i, fixed_o = Fixed(prompt), Fixed(output)
    arrival = arrival or SemiOnline()
    rng = streams(seed)
    return assemble(
        kind="infermax-grid",
        n=n,
        seed=seed,
        limits=limits,
        time_model=time_model or TimeModel(),
        arrivals=arrival.sample(rng["arrival"], n),
        prompts=fixed_i.sample(rng["prompt"], n),
        outputs=fixed_o.sample(rng["output"], n),
        params={**arrival.to_params(), "prompt": prompt, "output": output},
        predict_sigma=predict_sigma,
        tick=tick,
        rng=rng,
    )


def figure15_limits(prompt: int, output: int = 4, max_batch_tokens: int = 4096) -> Limits:
    """Limits of InferMax Fig. 15: M = max(2I, I + O - 1), C = 4096 (Llama-2-7B), no P.

    M lets two prefills start (2I) while only one request can keep its KV to its
    last token (I + O - 1 <= M < 2(I + O - 1)).
    """
    return Limits(kv_capacity=max(2 * prompt, prompt + output - 1), max_batch_tokens=max_batch_tokens)


#: InferMax Sec. 4.6 length sets: S (small) and L (large).
SMALL: tuple[int, int] = (8, 16)
LARGE: tuple[int, int] = (512, 1024)
#: The four Sec. 4.6 groups: name -> (set of I, set of O).
MIX_GROUPS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "SISO": (SMALL, SMALL),
    "SILO": (SMALL, LARGE),
    "LISO": (LARGE, SMALL),
    "LILO": (LARGE, LARGE),
}


def infermax_mix(
    groups: Sequence[str],
    n: int,
    seed: int,
    limits: Limits,
    time_model: TimeModel | None = None,
    *,
    arrival: ArrivalProcess | None = None,
    predict_sigma: float | None = None,
    tick: float | None = None,
) -> Instance:
    """InferMax Sec. 4.6 workload: a 50/50 mix of two of SISO/SILO/LISO/LILO, shuffled.

    The paper leaves the within-group law, the ratio and the RNG unstated
    (``shared/notes/003_004.md``); here I and O are each uniform over the
    2-element set of their group, the first group gets ``ceil(n / 2)`` requests
    and the second the rest, and the order is shuffled.
    """
    check_n_seed(n, seed)
    names = _mix_groups(groups)
    arrival = arrival or SemiOnline()
    rng = streams(seed)
    sizes = ((n + 1) // 2, n // 2)
    i_sets = np.repeat([MIX_GROUPS[g][0] for g in names], sizes, axis=0)
    o_sets = np.repeat([MIX_GROUPS[g][1] for g in names], sizes, axis=0)
    rows = np.arange(n)
    prompts = i_sets[rows, rng["prompt"].integers(0, 2, size=n)]
    outputs = o_sets[rows, rng["output"].integers(0, 2, size=n)]
    perm = rng["order"].permutation(n)
    return assemble(
        kind="infermax-mix",
        n=n,
        seed=seed,
        limits=limits,
        time_model=time_model or TimeModel(),
        arrivals=arrival.sample(rng["arrival"], n),
        prompts=prompts[perm],
        outputs=outputs[perm],
        params={**arrival.to_params(), "groups": "+".join(names)},
        predict_sigma=predict_sigma,
        tick=tick,
        rng=rng,
    )


def _mix_groups(groups: Sequence[str] | str) -> tuple[str, str]:
    names = groups.split("+") if isinstance(groups, str) else list(groups)
    names = [g.strip().upper() for g in names]
    known = "+".join(MIX_GROUPS)
    _require(
        len(names) == 2 and all(g in MIX_GROUPS for g in names) and names[0] != names[1],
        f"groups must be two different groups out of {known} joined by '+', got {groups!r}",
    )
    return names[0], names[1]


# --------------------------------------------------------------------------- flat parameters

_REQUIRED = object()


class _Params:
    """Reads flat parameters (strings from a command line, or Python values), checking each.

    Every read moves the key from ``raw`` to ``given`` (converted); :meth:`finish`
    then rejects what is left, so a misspelt or irrelevant key is an error
    rather than silently ignored.
    """

    def __init__(self, kind: str, raw: Mapping[str, Any]) -> None:
        self.kind = kind
        self.raw = dict(raw)
        self.given: dict[str, Any] = {}

    def has(self, key: str) -> bool:
        return key in self.raw

    def get(
        self,
        key: str,
        typ: type,
        default: Any = _REQUIRED,
        *,
        low: float | None = None,
        strict: bool = False,
        choices: Sequence[str] | None = None,
        why: str = "",
    ) -> Any:
        if key not in self.raw:
            if default is _REQUIRED:
                raise InputError(f"{self.kind}: missing parameter {key}=...{f' ({why})' if why else ''}")
            return default
        raw = self.raw.pop(key)
        value = _convert(raw, typ)
        if value is None:
            noun = {int: "an integer", float: "a finite number", str: "a non-empty string"}[typ]
            raise InputError(f"{self.kind}: {key}={raw!r} is not {noun}")
        if choices is not None and value not in choices:
            raise InputError(f"{self.kind}: {key}={value!r} is not one of {', '.join(choices)}")
        if low is not None and (value < low or (strict and value == low)):
            raise InputError(f"{self.kind}: {key}={value!r} must be {'>' if strict else '>='} {low:g}")
        self.given[key] = value
        return value

    def wrap(self, build: Callable[[], Any], keys: str = "") -> Any:
        """Build a dataclass, naming the kind (and the flat keys) when its own check fails."""
        try:
            return build()
        except InputError as exc:
            raise InputError(f"{self.kind}: {f'{keys}: ' if keys else ''}{exc}") from None

    def finish(self, spec: GeneratorSpec) -> None:
        for key, value in self.raw.items():
            if key in spec.keys:
                raise InputError(
                    f"{self.kind}: {key}={value!r} does not apply to the parameters given "
                    f"[{key}: {spec.keys[key]}]"
                )
            known = ", ".join(spec.keys)
            raise InputError(f"{self.kind}: unknown parameter {key!r} (known: {known})")


def _convert(raw: Any, typ: type) -> Any:
    """``raw`` as ``typ``, or None. Strings are parsed; bools are never numbers."""
    if isinstance(raw, bool):
        return None
    if typ is str:
        return raw.strip() if isinstance(raw, str) and raw.strip() else None
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            return None
    if not isinstance(raw, int | float | np.integer | np.floating) or not math.isfinite(raw):
        return None
    if typ is int:
        return int(raw) if float(raw).is_integer() else None
    return float(raw)


_ARRIVAL_KEYS = {
    "arrival": "arrival process: semi-online (all at 0, default), poisson or gamma",
    "rate": "arrivals per time unit (with arrival=poisson or gamma)",
    "cv": "coefficient of variation of inter-arrival times (with arrival=gamma; 1 = Poisson)",
    "tick": "round arrivals up to multiples of this (e.g. 1 for whole slots)",
    "predict_sigma": "add noisy predicted outputs O*exp(sigma*Z); 0 = exact",
}
_LENGTH_DISTS: dict[str, dict[str, str]] = {
    "fixed": {"value": "the length"},
    "uniform": {"lo": "smallest length", "hi": "largest length"},
    "lognormal": {
        "median": "median length (default 256 for prompt, 128 for output)",
        "mean": "mean length instead of the median",
        "sigma": "log-scale standard deviation (default 1)",
        "max": "clip lengths to at most this (default 4096)",
    },
    "zipf": {"a": "exponent (> 1)", "max": "clip lengths to at most this (default 4096)"},
}
_DEFAULT_MEDIAN = {"prompt": 256.0, "output": 128.0}


def _length_keys(side: str) -> dict[str, str]:
    keys = {side: f"{side} length distribution: {', '.join(_LENGTH_DISTS)} (default lognormal)"}
    for fields in _LENGTH_DISTS.values():
        for name, text in fields.items():
            users = " or ".join(d for d, f in _LENGTH_DISTS.items() if name in f)
            keys.setdefault(f"{side}_{name}", f"{text}; with {side}={users}")
    return keys


def _read_arrival(p: _Params) -> ArrivalProcess:
    kind = p.get("arrival", str, "semi-online", choices=("semi-online", "poisson", "gamma"))
    if kind == "semi-online":
        return SemiOnline()
    rate = p.get("rate", float, low=0, strict=True, why=f"arrival={kind} needs a rate")
    if kind == "poisson":
        return Poisson(rate)
    return Gamma(rate, p.get("cv", float, low=0, strict=True, why="arrival=gamma needs cv"))


def _read_common(p: _Params) -> dict[str, Any]:
    return {
        "arrival": _read_arrival(p),
        "predict_sigma": p.get("predict_sigma", float, None, low=0),
        "tick": p.get("tick", float, None, low=0, strict=True),
    }


def _read_length(p: _Params, side: str) -> LengthDist:
    dist = p.get(side, str, "lognormal", choices=tuple(_LENGTH_DISTS))
    if dist == "fixed":
        return Fixed(p.get(f"{side}_value", int, low=1, why=f"{side}=fixed needs it"))
    if dist == "uniform":
        lo = p.get(f"{side}_lo", int, low=1, why=f"{side}=uniform needs it")
        hi = p.get(f"{side}_hi", int, low=1, why=f"{side}=uniform needs it")
        return p.wrap(lambda: Uniform(lo, hi), f"{side}_lo, {side}_hi")
    if dist == "zipf":
        a = p.get(f"{side}_a", float, low=1, strict=True, why=f"{side}=zipf needs it")
        return Zipf(a, p.get(f"{side}_max", int, 4096, low=1))
    sigma = p.get(f"{side}_sigma", float, 1.0, low=0)
    top = p.get(f"{side}_max", int, 4096, low=1)
    if p.has(f"{side}_mean"):
        if p.has(f"{side}_median"):
            raise InputError(f"{p.kind}: give {side}_median or {side}_mean, not both")
        return LogNormal.from_mean(p.get(f"{side}_mean", float, low=0, strict=True), sigma, top)
    return LogNormal(p.get(f"{side}_median", float, _DEFAULT_MEDIAN[side], low=0, strict=True), sigma, top)


def _read_synthetic(p: _Params) -> dict[str, Any]:
    return {**_read_common(p), "prompt": _read_length(p, "prompt"), "output": _read_length(p, "output")}


def _read_grid(p: _Params) -> dict[str, Any]:
    return {
        **_read_common(p),
        "prompt": p.get("prompt", int, low=1, why="the prompt length I"),
        "output": p.get("output", int, low=1, why="the output length O"),
    }


def _read_mix(p: _Params) -> dict[str, Any]:
    raw = p.get("groups", str, why="e.g. groups=LILO+SISO")
    return {**_read_common(p), "groups": p.wrap(lambda: _mix_groups(raw))}


def _read_sharegpt(p: _Params) -> dict[str, Any]:
    # Imported here: the ShareGPT module imports this one for the arrival classes.
    from kvsched.instances import sharegpt as sg

    out = _read_common(p)
    out["rule"] = p.get("rule", str, sg.DEFAULT_RULE, choices=sg.RULES)
    if out["rule"] == "chars":
        out["chars_per_token"] = p.get(
            "chars_per_token", float, sg.DEFAULT_CHARS_PER_TOKEN, low=0, strict=True
        )
    out["max_total"] = p.get("max_total", int, sg.DEFAULT_MAX_TOTAL, low=2)
    out["turns"] = p.get("turns", str, sg.DEFAULT_TURNS, choices=sg.TURNS)
    return out


def _make_grid(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    return infermax_grid(kw.pop("prompt"), kw.pop("output"), n, limits, time_model, seed=seed, **kw)


def _make_mix(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    return infermax_mix(kw.pop("groups"), n, seed, limits, time_model, **kw)


def _make_sharegpt(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    from kvsched.instances.sharegpt import sharegpt

    return sharegpt(n, seed, limits, time_model, **kw)


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    """A registered generator.

    Attributes
    ----------
    kind
        Its name.
    summary
        One line for help texts.
    keys
        Flat parameter name -> one line of help.
    read
        Checks flat parameters and returns the keyword arguments of ``make``.
    make
        ``make(n, seed, limits, time_model, **kwargs) -> Instance``.
    """

    kind: str
    summary: str
    keys: dict[str, str]
    read: Callable[[_Params], dict[str, Any]]
    make: Callable[..., Instance]


_SHAREGPT_KEYS = {
    "rule": "tokens from text: chars (ceil(chars / chars_per_token), default) or words (MC-SF)",
    "chars_per_token": "characters per token with rule=chars (default 4)",
    "max_total": "drop pairs with I + O above this (default 4096, a vLLM-benchmark-style context cut)",
    "turns": "first (first human turn and its reply, default) or all (every human/gpt pair)",
}

#: Generators by the kind name :func:`generate` and the CLI use.
GENERATORS: dict[str, GeneratorSpec] = {
    "synthetic": GeneratorSpec(
        "synthetic",
        "independent prompt/output length laws and an arrival process",
        {**_ARRIVAL_KEYS, **_length_keys("prompt"), **_length_keys("output")},
        _read_synthetic,
        synthetic,
    ),
    "infermax-grid": GeneratorSpec(
        "infermax-grid",
        "InferMax Sec. 4: n identical requests (prompt, output), all at t = 0",
        {"prompt": "prompt length I", "output": "output length O", **_ARRIVAL_KEYS},
        _read_grid,
        _make_grid,
    ),
    "infermax-mix": GeneratorSpec(
        "infermax-mix",
        "InferMax Sec. 4.6: 50/50 shuffled mix of two of SISO/SILO/LISO/LILO (S={8,16}, L={512,1024})",
        {"groups": "two groups joined by '+', e.g. LILO+SISO", **_ARRIVAL_KEYS},
        _read_mix,
        _make_mix,
    ),
    "sharegpt": GeneratorSpec(
        "sharegpt",
        "real (prompt, output) pairs from the ShareGPT dataset, sampled without replacement",
        {**_SHAREGPT_KEYS, **_ARRIVAL_KEYS},
        _read_sharegpt,
        _make_sharegpt,
    ),
}


def _spec(kind: str) -> GeneratorSpec:
    try:
        return GENERATORS[kind]
    except KeyError:
        raise InputError(f"unknown generator {kind!r} (known: {', '.join(GENERATORS)})") from None


def _read(kind: str, params: Mapping[str, Any]) -> tuple[GeneratorSpec, _Params, dict[str, Any]]:
    spec = _spec(kind)
    p = _Params(kind, params)
    kwargs = spec.read(p)
    p.finish(spec)
    return spec, p, kwargs


def parse_params(kind: str, pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["key=value", ...]`` into checked, typed parameters for :func:`generate`.

    Numbers are converted, choices and signs checked, and the set of keys
    validated as a whole: a key that is unknown, repeated, missing where
    required, or that does not apply to the chosen arrival process or length
    law is an error. Raises :class:`InputError` naming the offending key and
    value.
    """
    raw: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"{kind}: parameter {pair!r} is not key=value")
        if key in raw:
            raise InputError(f"{kind}: parameter {key!r} is given twice")
        raw[key] = value
    _, p, _ = _read(kind, raw)
    return p.given


def generate(
    kind: str, *, n: int, seed: int, limits: Limits, time_model: TimeModel, **params: Any
) -> Instance:
    """Build an instance of a registered generator from flat parameters.

    Parameters
    ----------
    kind
        A key of :data:`GENERATORS`: ``synthetic``, ``infermax-grid``,
        ``infermax-mix`` or ``sharegpt``.
    n, seed
        Number of requests and random seed.
    limits, time_model
        Copied into the instance.
    **params
        Flat parameters, typed or as strings (see ``GENERATORS[kind].keys``).

    Returns
    -------
    Instance
        Requests ``r0, r1, ...`` in arrival order; ``meta`` records kind, n,
        seed and the parameters used, defaults included.
    """
    spec, _, kwargs = _read(kind, params)
    return spec.make(n, seed, limits, time_model, **kwargs)
