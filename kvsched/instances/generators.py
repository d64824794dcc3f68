"""Seeded instance generators: synthetic workloads, the InferMax grids and mixes, ShareGPT, Azure.

Two layers:

* typed building blocks, in :mod:`kvsched.instances.laws` and re-exported here:
  arrival processes (:class:`SemiOnline`, :class:`Poisson`, :class:`Gamma`) and
  length distributions (:class:`Fixed`, :class:`Uniform`, :class:`LogNormal`,
  :class:`Zipf`), each a frozen dataclass with ``sample(rng, n)``; and the
  generator functions :func:`synthetic`, :func:`infermax_grid` and
  :func:`infermax_mix` (ShareGPT lives in :mod:`kvsched.instances.sharegpt`, the
  Azure traces in :mod:`kvsched.instances.azure`);
* a flat ``key=value`` front end for the command line: :func:`parse_params`
  turns strings into checked values and :func:`generate` builds the instance of
  a registered kind (see :data:`GENERATORS`; :func:`describe` is the help text
  ``kvsched generate KIND --help`` prints).

Every instance records how to rebuild it: ``meta = {"kind", "n", "seed",
"params"}`` where ``params`` holds the flat parameters actually used (defaults
filled in), so ``generate(meta["kind"], n=meta["n"], seed=meta["seed"],
limits=..., time_model=..., **meta["params"])`` gives the same requests.

Generated instances are not checked for feasibility (a synthetic length may
exceed the KV capacity); call :meth:`Instance.check_feasible`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.instances import azure, sharegpt
from kvsched.instances.laws import (
    ArrivalProcess,
    Fixed,
    Gamma,
    LengthDist,
    LogNormal,
    Poisson,
    SemiOnline,
    Uniform,
    Zipf,
    assemble,
    check_n_seed,
    noisy_predictions,
    streams,
)
from kvsched.instances.laws import require as _require
from kvsched.instances.model import DEFAULT_KV_CAPACITY, Instance, Limits, TimeModel, expect_limits

__all__ = [
    "GENERATORS",
    "LARGE",
    "MIX_GROUPS",
    "SMALL",
    "ArrivalProcess",
    "Fixed",
    "Gamma",
    "GeneratorSpec",
    "LengthDist",
    "LogNormal",
    "Poisson",
    "SemiOnline",
    "Uniform",
    "Zipf",
    "assemble",
    "check_n_seed",
    "describe",
    "figure15_limits",
    "generate",
    "infermax_grid",
    "infermax_mix",
    "noisy_predictions",
    "parse_params",
    "streams",
    "synthetic",
]

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
#: Largest integer parameter (instances.io.MAX_TOKENS: every token count must fit int64 sums).
MAX_INT = 2**31 - 1


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
        if typ is int and abs(value) > MAX_INT:
            raise InputError(f"{self.kind}: {key}={raw!r} must be at most {MAX_INT}")
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
        "mean": "mean length instead of the median: the median is fitted so the lengths drawn (rounded, "
        "clipped to [1, max]) have this mean; must be above 1 and below max",
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
    cv = p.get("cv", float, low=0, strict=True, why="arrival=gamma needs cv")
    return p.wrap(lambda: Gamma(rate, cv))


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
        mean = p.get(f"{side}_mean", float, low=0, strict=True)
        # The median is fitted under the clip, so the lengths drawn have this mean (from_mean ignored max).
        return p.wrap(lambda: LogNormal.fit_mean(mean, sigma, top), f"{side}_mean, {side}_sigma, {side}_max")
    median = p.get(f"{side}_median", float, _DEFAULT_MEDIAN[side], low=0, strict=True)
    return p.wrap(lambda: LogNormal(median, sigma, top), f"{side}_median, {side}_sigma, {side}_max")


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
    sg = sharegpt
    out = _read_common(p)
    out["rule"] = p.get("rule", str, sg.DEFAULT_RULE, choices=sg.RULES)
    if out["rule"] == "chars":
        cpt = p.get("chars_per_token", float, sg.DEFAULT_CHARS_PER_TOKEN, low=0, strict=True)
        low, high = sg.CHARS_PER_TOKEN_RANGE
        if not low <= cpt <= high:  # here, to name the kind as every other parameter error does
            raise InputError(f"{p.kind}: chars_per_token={cpt:g} must be from {low:g} to {high:g}")
        out["chars_per_token"] = cpt
    out["max_total"] = p.get("max_total", int, sg.DEFAULT_MAX_TOTAL, low=2)
    out["turns"] = p.get("turns", str, sg.DEFAULT_TURNS, choices=sg.TURNS)
    return out


def _make_grid(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    return infermax_grid(kw.pop("prompt"), kw.pop("output"), n, limits, time_model, seed=seed, **kw)


def _make_mix(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    return infermax_mix(kw.pop("groups"), n, seed, limits, time_model, **kw)


def _make_sharegpt(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
    return sharegpt.sharegpt(n, seed, limits, time_model, **kw)


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
    notes
        What ``kvsched generate KIND --help`` says beyond the parameters (data, estimates).
    """

    kind: str
    summary: str
    keys: dict[str, str]
    read: Callable[[_Params], dict[str, Any]]
    make: Callable[..., Instance]
    notes: str = ""


def _read_azure(p: _Params) -> dict[str, Any]:
    return {
        "start": p.get("start", float, 0.0, low=0),
        "duration": p.get("duration", float, None, low=0, strict=True),
        "sample": p.get("sample", str, azure.DEFAULT_SAMPLE, choices=azure.SAMPLES),
        "rate_scale": p.get("rate_scale", float, 1.0, low=0, strict=True),
        "units_per_second": p.get("units_per_second", float, 1.0, low=0, strict=True),
        "predict_sigma": p.get("predict_sigma", float, None, low=0),
        "tick": p.get("tick", float, None, low=0, strict=True),
    }


def _azure_maker(service: str) -> Callable[..., Instance]:
    def make(n: int, seed: int, limits: Limits, time_model: TimeModel, **kw: Any) -> Instance:
        return azure.azure_trace(service, n, seed, limits, time_model, **kw)

    return make


_AZURE_KEYS = {
    "start": "window start, seconds from the trace's start (default 0)",
    "duration": "window length in seconds (default: to the trace's end)",
    "sample": "first (the window's first n requests, default: real burstiness) or random (n of the window, "
    "seeded)",
    "rate_scale": "arrival-rate multiplier: inter-arrival times divided by it (default 1)",
    "units_per_second": "instance time units per trace second (default 1: seconds; for unit time, slots per s)",
    "tick": _ARRIVAL_KEYS["tick"],
    "predict_sigma": _ARRIVAL_KEYS["predict_sigma"],
}
_AZURE_NOTES = (
    "Real production requests with their arrival times (seconds) and token counts counted by the service's "
    "tokenizer (Azure LLM inference trace 2023, as shipped by Splitwise/Vidur; see "
    "kvsched/instances/data/azure/README.md). Arrivals are shifted to start at 0. Requests whose peak KV "
    "I + O - 1 does not fit M are skipped."
)
_SHAREGPT_NOTES = (
    "Lengths are estimated from the text, without a tokenizer: rule=chars counts ceil(characters / "
    "chars_per_token) (4 characters per token, close to the Llama tokenizer's lengths on ShareGPT: mean "
    "I/O about 174/345 against the vLLM paper's 161/338); rule=words counts whitespace-separated words "
    "(seed 004's rule, about 0.6x). Pairs whose peak KV does not fit M are dropped. See "
    "kvsched.instances.sharegpt."
)

_SHAREGPT_KEYS = {
    "rule": "tokens from text: chars (ceil(chars / chars_per_token), default) or words (MC-SF)",
    "chars_per_token": "characters per token with rule=chars (default 4; 0.01 to 1000)",
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
        "real (prompt, output) pairs from the ShareGPT dataset, sampled without replacement (with "
        "replacement past the eligible pairs, which the command notes)",
        {**_SHAREGPT_KEYS, **_ARRIVAL_KEYS},
        _read_sharegpt,
        _make_sharegpt,
        _SHAREGPT_NOTES,
    ),
    **{
        f"azure-{service}": GeneratorSpec(
            f"azure-{service}",
            f"a window of the Azure LLM inference trace of a {label} service (real arrivals and lengths)",
            dict(_AZURE_KEYS),
            _read_azure,
            _azure_maker(service),
            _AZURE_NOTES,
        )
        for service, label in (("conv", "conversation"), ("code", "coding"))
    },
}


def describe(kind: str) -> str:
    """The parameters of generator ``kind``, one per line with its meaning and default, and its notes."""
    spec = _spec(kind)
    width = max(len(k) for k in spec.keys) + 2
    lines = [f"{kind}: {spec.summary}", "", "parameters (--param KEY=VALUE):"]
    lines += [f"  {key.ljust(width)}{text}" for key, text in spec.keys.items()]
    if spec.notes:
        lines += ["", textwrap.fill(spec.notes, 100)]
    return "\n".join(lines)


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
    kind: str,
    *,
    n: int,
    seed: int = 0,
    limits: Limits | None = None,
    time_model: TimeModel | str | None = None,
    **params: Any,
) -> Instance:
    """Build an instance of a registered generator from flat parameters.

    Parameters
    ----------
    kind
        A key of :data:`GENERATORS`: ``synthetic``, ``infermax-grid``,
        ``infermax-mix`` or ``sharegpt``.
    n, seed
        Number of requests and random seed (default 0, as ``kvsched generate``).
    limits, time_model
        Copied into the instance; by default, as ``kvsched generate``: M =
        :data:`~kvsched.instances.model.DEFAULT_KV_CAPACITY` and no other limit, unit time. A time
        model may also be given by its cost model's name (``"infermax-linear"``).
    **params
        Flat parameters, typed or as strings (see ``GENERATORS[kind].keys``).

    Returns
    -------
    Instance
        Requests ``r0, r1, ...`` in arrival order; ``meta`` records kind, n,
        seed and the parameters used, defaults included.
    """
    limits = Limits(kv_capacity=DEFAULT_KV_CAPACITY) if limits is None else limits
    time_model = TimeModel() if time_model is None else time_model
    if isinstance(time_model, str):  # a cost model's name, as on the command line
        time_model = TimeModel(time_model)
    expect_limits(limits, f"{kind}: limits")
    spec, _, kwargs = _read(kind, params)
    # An unknown cost-model parameter fails here, not when the written file is next read.
    from kvsched.instances.io import check_time_model  # here: the CLI's parser imports this module

    check_time_model(time_model, f"{kind}: time_model")
    instance = spec.make(n, seed, limits, time_model, **kwargs)
    _check_made(kind, instance, kwargs)
    return instance


def _check_made(kind: str, instance: Instance, kwargs: Mapping[str, Any]) -> None:
    """Hold a generated instance to the rules a file is held to, naming the parameters behind a fault: a rate
    of 1e-300 or a tick of 1e20 gave arrivals past MAX_TIME, blamed on request 'r1' at its first use."""
    try:
        instance.check_requests()
    except InputError as exc:
        keys = ("arrival", "tick", "rate_scale", "units_per_second")
        timing = {k: kwargs[k] for k in keys if kwargs.get(k) is not None}
        said = ", ".join(f"{k}={v!r}" for k, v in timing.items())
        why = f" (arrivals come from {said})" if timing and "arrival" in str(exc) else ""
        raise InputError(f"{kind}: the generated instance breaks a request rule{why}: {exc}") from None
