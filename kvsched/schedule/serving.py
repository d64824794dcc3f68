"""Serving metrics named as vLLM's benchmark script names them: TTFT, TPOT, ITL, E2EL and goodput.

Everything is read off what :mod:`kvsched.schedule.metrics` computes from a
replayed :class:`~kvsched.schedule.validate.Trace` (the per-request columns)
and the token gaps :mod:`kvsched.schedule.tokens` reads off its records;
nothing here re-simulates a batch.

* **TTFT**: arrival to the emission of the first token (per request);
* **TPOT**: ``(E2EL - TTFT) / (O - 1)``, the mean time per output token after
  the first (per request with O > 1);
* **ITL**: every gap between two consecutive tokens of one request (all gaps of
  all requests pooled, as vLLM's ``itls``);
* **E2EL**: arrival to the emission of the last token (per request).

Each comes with mean, median, standard deviation and the 50th, 90th and 99th
percentiles (linear interpolation, as ``numpy.percentile``, which vLLM uses);
the 99.9th only from 1,000 samples on (below that it is ``None``: the sample
cannot tell it apart from the maximum). Statistics are over completed
requests. Times are in the instance's time unit; throughputs and goodput under
vLLM's names (``output_throughput``, ``request_goodput``, ...) are per second
and given only when that unit is seconds: the ``*_per_time_unit`` fields carry
the same figures in any unit.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from kvsched.errors import InputError
from kvsched.schedule.core import TIME_TOL
from kvsched.schedule.metrics import (
    expect_requests,
    expect_token_stats,
    expect_unit,
    request_arrays,
    request_metrics,
    time_unit,
)
from kvsched.schedule.tokens import (
    TokenStats,
    first_arrival,
    interpolate,
    linear_quantiles,
    pooled_counts,
    quantile_positions,
    token_stats,
)
from kvsched.schedule.validate import Trace, expect_trace

if TYPE_CHECKING:
    import pandas as pd

#: The distributions measured, by vLLM's short name.
SERVING_METRICS = ("ttft", "tpot", "itl", "e2el")
#: Samples from which the 99.9th percentile is reported.
P999_MIN_SAMPLES = 1000
#: The percentiles of a :class:`Distribution` (median, 90th, 99th, 99.9th).
_QUANTILES = (0.5, 0.9, 0.99, 0.999)
_SLO_KEYS = ("ttft", "tpot", "e2el")
_UNIT_SCALE = {"ms": 1e-3, "s": 1.0}
#: The per-request columns read here, the only ones pooled across traces (not a frame's every column).
_POOLED = ("complete", "prompt", "generated", "output", "ttft", "tpot", "latency", "slo_met")


# ----------------------------------------------------------------------------- SLOs
@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objectives applied to every request, in the instance's time unit.

    A request is *good* when it completed and meets every objective given: TTFT,
    TPOT (a one-token output meets it: it has no time per output token, as in
    vLLM where its TPOT is 0) and end-to-end latency. Values on the objective
    meet it (within the core's time tolerance).
    """

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    def __post_init__(self) -> None:
        for key in _SLO_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not (math.isfinite(value) and value > 0)
            ):
                raise InputError(f"slo: {key}: must be a positive finite number, got {value!r}")
        if self.ttft is None and self.tpot is None and self.e2el is None:
            raise InputError("slo: give at least one of ttft, tpot, e2el")

    def to_dict(self) -> dict[str, float | None]:
        return {f"slo_{k}": getattr(self, k) for k in _SLO_KEYS}

    def describe(self) -> str:
        """The objectives given, as a table's caption or row names them: ``ttft <= 0.2, tpot <= 0.05``."""
        return ", ".join(f"{k} <= {getattr(self, k):g}" for k in _SLO_KEYS if getattr(self, k) is not None)


def parse_slo(text: str, unit: str, flag: str = "--slo") -> SLO:
    """``ttft=V,tpot=V,e2el=V`` as an :class:`SLO` in the time unit ``unit``.

    A value is a number in the instance's unit, or, for an instance in seconds,
    a number with ``ms`` or ``s`` (``ttft=200ms``, as vLLM's ``--goodput`` takes
    milliseconds).
    """
    if not isinstance(text, str):
        raise InputError(f"{flag}: expected text such as 'ttft=200ms,tpot=50ms', got {type(text).__name__}")
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key, raw = key.strip().lower(), raw.strip().lower()
        if not sep or key not in _SLO_KEYS:
            raise InputError(f"{flag}: expected ttft=V, tpot=V or e2el=V, got {part!r}")
        if key in values:
            raise InputError(f"{flag}: {key} given twice")
        m = re.fullmatch(r"([0-9.eE+-]+)\s*(ms|s)?", raw)
        try:
            number = float(m.group(1)) if m else float("nan")
        except ValueError:
            number = float("nan")
        if not (math.isfinite(number) and number > 0):
            raise InputError(f"{flag}: {key}: {raw!r} is not a positive number")
        suffix = m.group(2) if m else None
        if suffix is not None:
            if unit != "s":
                raise InputError(
                    f"{flag}: {key}: {raw!r} has a unit, but this instance's time is in {unit}s; "
                    "give a plain number"
                )
            number *= _UNIT_SCALE[suffix]
        values[key] = number
    if not values:
        raise InputError(f"{flag}: give at least one of ttft=V, tpot=V, e2el=V")
    return SLO(**values)


# ----------------------------------------------------------------------------- distributions
@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of one metric's samples (NaN statistics when there are none)."""

    n: int
    mean: float
    median: float
    std: float
    p50: float
    p90: float
    p99: float
    p999: float | None  # only from P999_MIN_SAMPLES samples on

    @classmethod
    def of(cls, values: np.ndarray | pd.Series) -> Distribution:
        arr = np.asarray(values, dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        if not arr.size:
            return cls._empty()
        q = linear_quantiles(np.sort(arr), _QUANTILES)  # numpy's linear method (QUANTILE_METHOD)
        with np.errstate(invalid="ignore"):  # an infinite sample: its std is NaN, said without a warning
            return cls._make(int(arr.size), float(arr.mean()), float(arr.std()), q)

    @classmethod
    def of_counts(cls, values: np.ndarray, counts: np.ndarray) -> Distribution:
        """The distribution of a multiset given as sorted distinct ``values`` and their ``counts``.

        The percentiles are ``np.quantile``'s (linear method) of the multiset
        spelled out, to the bit; the mean and the standard deviation are sums
        over the distinct values weighted by their counts (the spelled-out
        sums in another order: equal up to rounding).
        """
        keep = ~np.isnan(values) & (counts > 0)
        values, counts = values[keep], counts[keep].astype(np.int64)
        n = int(counts.sum())
        if not n:
            return cls._empty()
        mean = float((values * counts).sum() / n)
        with np.errstate(invalid="ignore"):  # inf - inf where a value is infinite: NaN, as np.std gives
            std = float(np.sqrt(((values - mean) ** 2 * counts).sum() / n))
        return cls._make(n, mean, std, _counted_quantiles(values, counts, n, np.array(_QUANTILES)))

    @classmethod
    def _empty(cls) -> Distribution:
        nan = float("nan")
        return cls(0, nan, nan, nan, nan, nan, nan, None)

    @classmethod
    def _make(cls, n: int, mean: float, std: float, q: np.ndarray) -> Distribution:
        return cls(
            n=n,
            mean=mean,
            median=float(q[0]),
            std=std,
            p50=float(q[0]),
            p90=float(q[1]),
            p99=float(q[2]),
            p999=float(q[3]) if n >= P999_MIN_SAMPLES else None,
        )

    def items(self, name: str) -> dict[str, float | int | None]:
        """``mean_<name>``, ``median_<name>``, ..., ``p99.9_<name>`` (vLLM's key names, without ``_ms``)."""
        return {
            f"n_{name}": self.n,
            f"mean_{name}": self.mean,
            f"median_{name}": self.median,
            f"std_{name}": self.std,
            f"p50_{name}": self.p50,
            f"p90_{name}": self.p90,
            f"p99_{name}": self.p99,
            f"p99.9_{name}": self.p999,
        }


def _counted_quantiles(values: np.ndarray, counts: np.ndarray, n: int, q: np.ndarray) -> np.ndarray:
    """``np.quantile(spelled_out, q, method="linear")`` for the multiset ``values`` x ``counts`` (n items)."""
    below, above, t = quantile_positions(n, q)
    ends = np.cumsum(counts)  # item j is values[i] for the first i with ends[i] > j
    a = values[np.searchsorted(ends, below, side="right")]
    b = values[np.searchsorted(ends, above, side="right")]
    return interpolate(a, b, t)


# ----------------------------------------------------------------------------- metrics
@dataclass(frozen=True, slots=True)
class ServingMetrics:
    """vLLM-style serving metrics of one run (or of several engines' runs pooled).

    ``duration`` runs from the first request's arrival to the end of the last
    batch, as vLLM's benchmark duration runs from the first request sent (a
    trace whose arrivals start at 50 s is not charged the idle time before
    them; :class:`~kvsched.schedule.metrics.RunMetrics`' makespan is). The
    ``*_per_time_unit`` rates are over it; ``request_throughput``,
    ``output_throughput``, ``total_token_throughput`` and ``request_goodput``
    are the same rates when the time unit is seconds and ``None`` otherwise.
    ``good_requests`` counts completed requests meeting the SLOs: those of
    ``slo`` when given (for every request), else each request's own
    (``ttft_slo``, ``tbt_slo`` judged on its p99 gap, as
    :func:`~kvsched.schedule.metrics.request_metrics`; a request without one is
    good once complete); ``None`` when there are no SLOs at all. ``violations`` counts the traces'
    violations: a trace replayed with ``strict=False`` may be of an illegal schedule, whose figures are
    those of what was replayed (incomplete requests left out), not of anything an engine could run.
    """

    time_unit: str
    num_requests: int
    completed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    slo: SLO | None
    good_requests: int | None
    violations: int = 0

    @property
    def in_seconds(self) -> bool:
        return self.time_unit == "s"

    def _rate(self, count: float | None) -> float | None:
        if count is None:
            return None
        return count / self.duration if self.duration > 0 else float("nan")

    @property
    def goodput_fraction(self) -> float | None:
        """Good requests over all requests (``None`` without SLOs)."""
        if self.good_requests is None or not self.num_requests:
            return None
        return self.good_requests / self.num_requests

    def to_dict(self) -> dict[str, Any]:
        """A flat dict: ``time_unit``, counts, ``mean_ttft`` ... ``p99.9_e2el``, throughputs, goodput."""
        out: dict[str, Any] = {
            "time_unit": self.time_unit,
            "num_requests": self.num_requests,
            "completed": self.completed,
            "duration": self.duration,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
        }
        for name in SERVING_METRICS:
            out.update(getattr(self, name).items(name))
        per_unit = {
            "requests_per_time_unit": self._rate(self.completed),
            "output_tokens_per_time_unit": self._rate(self.total_output_tokens),
            "total_tokens_per_time_unit": self._rate(self.total_input_tokens + self.total_output_tokens),
            "goodput_per_time_unit": self._rate(self.good_requests),
        }
        out.update(per_unit)
        sec = self.in_seconds
        out["request_throughput"] = per_unit["requests_per_time_unit"] if sec else None
        out["output_throughput"] = per_unit["output_tokens_per_time_unit"] if sec else None
        out["total_token_throughput"] = per_unit["total_tokens_per_time_unit"] if sec else None
        out["request_goodput"] = per_unit["goodput_per_time_unit"] if sec else None
        out["good_requests"] = self.good_requests
        out["goodput_fraction"] = self.goodput_fraction
        out["violations"] = self.violations
        out.update(self.slo.to_dict() if self.slo else dict.fromkeys(f"slo_{k}" for k in _SLO_KEYS))
        return out


def expect_slo(value: object, name: str = "slo") -> SLO | None:
    """``value`` if it is an :class:`SLO` or ``None``, else one :class:`~kvsched.errors.InputError`."""
    if value is None or isinstance(value, SLO):
        return value
    hint = f" (kvsched.parse_slo({value!r}, unit) reads that form)" if isinstance(value, str) else ""
    raise InputError(
        f"{name}: expected kvsched.SLO(ttft=..., tpot=..., e2el=...), got {type(value).__name__}{hint}"
    )


def _as_traces(traces: Trace | Iterable[Trace | None]) -> list[Trace]:
    if isinstance(traces, Trace):
        return [traces]
    if not isinstance(traces, Iterable):
        expect_trace(traces, "traces")  # raises, with a hint for a run's result
    out = [expect_trace(t, "traces[]") for t in traces if t is not None]
    if not out:
        raise InputError("serving metrics: no trace to measure")
    units = {time_unit(t.instance) for t in out}
    if len(units) > 1:
        # Seconds and slots pooled would give a mean of neither unit.
        raise InputError(
            f"traces: times in different units ({', '.join(sorted(units))}) cannot be pooled; "
            "measure each apart"
        )
    return out


def _per_trace(value: object, found: list[Trace], name: str) -> list[Any]:
    """``value`` as a list of one item per measured trace, or one :class:`InputError` naming ``name``."""
    if not isinstance(value, (list, tuple)):
        raise InputError(
            f"{name}: expected a list with one entry per trace measured, got {type(value).__name__}"
        )
    if len(value) != len(found):
        raise InputError(
            f"{name}: {len(value)} entry(ies) for {len(found)} trace(s) measured "
            "(one per trace, None traces skipped)"
        )
    return list(value)


def _good(req: Mapping[str, np.ndarray], slo: SLO | None) -> np.ndarray | None:
    done = req["complete"].astype(bool)
    if slo is None:
        flags = req["slo_met"]
        known = ~np.isnan(flags)
        if not known.any():
            return None
        # Requests without their own SLO count as good once complete.
        return done & (~known | (flags == 1.0))
    good = done.copy()
    with np.errstate(invalid="ignore"):
        if slo.ttft is not None:
            good &= req["ttft"] <= slo.ttft + TIME_TOL
        if slo.tpot is not None:
            good &= (req["output"] == 1) | (req["tpot"] <= slo.tpot + TIME_TOL)
        if slo.e2el is not None:
            good &= req["latency"] <= slo.e2el + TIME_TOL
    return good


def good_flags(requests: pd.DataFrame | Mapping[str, np.ndarray], slo: SLO) -> np.ndarray:
    """Whether each request counts toward goodput under ``slo``: complete, and meeting every objective
    it gives (a bool array in request order; the requests :attr:`ServingMetrics.good_requests` counts).

    ``requests`` is :func:`~kvsched.schedule.metrics.request_metrics` (or ``request_columns``) of a
    trace, or several engines' frames joined. The per-request output of ``kvsched simulate --slo``
    carries these flags: its ``slo_met`` columns are about each request's own SLOs, another test.
    """
    if not isinstance(slo, SLO):
        expect_slo(slo)  # raises, with a hint for an SLO given as text
        raise InputError("slo: expected kvsched.SLO(ttft=..., tpot=..., e2el=...), got None")
    good = _good(request_arrays(requests), slo)
    assert good is not None  # (with an SLO, every request is judged)
    return good


def serving_metrics(
    traces: Trace | Sequence[Trace | None],
    slo: SLO | None = None,
    *,
    unit: str | None = None,
    requests: Sequence[pd.DataFrame | Mapping[str, np.ndarray]] | None = None,
    stats: Sequence[TokenStats] | None = None,
) -> ServingMetrics:
    """The serving metrics of one trace, or of several (engines of one run) pooled.

    Parameters
    ----------
    traces
        A replayed trace, or several (``None`` entries, engines that ran nothing, are skipped).
    slo
        Objectives for every request (goodput); by default each request's own SLOs.
    unit
        The time unit's label: by default (and only) :func:`time_unit` of the traces' instances, which
        must share one (an InputError otherwise, as for a ``unit`` that is not theirs).
    requests
        :func:`~kvsched.schedule.metrics.request_columns` (or ``request_metrics``) of
        each trace where the caller has them already: a list, one per trace measured.
    stats
        :func:`~kvsched.schedule.tokens.token_stats` of each trace where the caller has them already:
        a list, one per trace measured.
    """
    found = _as_traces(traces)
    expect_slo(slo)
    label = expect_unit(unit, found[0])  # the traces share one unit (_as_traces checked)
    if stats is None:
        tokens = [token_stats(t) for t in found]  # request_metrics reads them too
    else:
        tokens = [
            expect_token_stats(s, t, "stats[]")
            for s, t in zip(_per_trace(stats, found, "stats"), found, strict=True)
        ]
    if requests is None:
        parts = [request_arrays(request_metrics(t)) for t in found]
    else:
        given = _per_trace(requests, found, "requests")
        parts = [expect_requests(r, t, "requests[]") for r, t in zip(given, found, strict=True)]
    req = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in _POOLED}
    done = req["complete"].astype(bool)
    good = _good(req, slo)
    return ServingMetrics(
        time_unit=label,
        num_requests=int(done.size),
        completed=int(done.sum()),
        duration=max(float(t.state.clock) for t in found) - first_arrival(found),
        total_input_tokens=int(req["prompt"][done].sum()),
        total_output_tokens=int(req["generated"][done].sum()),
        ttft=Distribution.of(req["ttft"]),
        tpot=Distribution.of(req["tpot"]),
        itl=Distribution.of_counts(*pooled_counts([(s.itl_values, s.itl_counts) for s in tokens])),
        e2el=Distribution.of(req["latency"]),
        slo=slo,
        good_requests=None if good is None else int(good.sum()),
        violations=sum(len(t.violations) for t in found),
    )


# ----------------------------------------------------------------------------- display
def _cell(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "-" if math.isnan(value) else f"{value:.4g}"


def serving_table(m: ServingMetrics, title: str = "Serving metrics") -> Table:
    """TTFT, TPOT, ITL and E2EL with mean, median, p90, p99, p99.9; throughput and goodput below."""
    unit = m.time_unit
    table = Table(title=f"{title} ({unit})")
    for col in ("metric", "n", "mean", "median", "p90", "p99", "p99.9"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name in SERVING_METRICS:
        d: Distribution = getattr(m, name)
        table.add_row(name.upper(), f"{d.n:,}", *(_cell(v) for v in (d.mean, d.median, d.p90, d.p99, d.p999)))
    rates = m.to_dict()
    per = "s" if m.in_seconds else unit
    notes = [
        f"output tokens / {per}: {_cell(rates['output_tokens_per_time_unit'])}",
        f"requests / {per}: {_cell(rates['requests_per_time_unit'])}",
    ]
    if m.good_requests is not None:
        which = m.slo.describe() if m.slo else "each request's own SLOs"
        notes.append(
            f"goodput ({which}): {m.good_requests:,} of {m.num_requests:,} requests, "
            f"{_cell(rates['goodput_per_time_unit'])} / {per}"
        )
    if m.violations:
        notes.insert(0, f"ILLEGAL schedule: {m.violations:,} violation(s), incomplete requests left out")
    table.caption = "; ".join(notes)
    return table


__all__ = [
    "P999_MIN_SAMPLES",
    "SERVING_METRICS",
    "SLO",
    "Distribution",
    "ServingMetrics",
    "good_flags",
    "parse_slo",
    "serving_metrics",
    "serving_table",
    "time_unit",
]
