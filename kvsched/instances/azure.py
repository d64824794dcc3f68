"""Real-trace instances from the Azure LLM-inference traces (Splitwise, ISCA 2024).

The data
--------
Two production traces ship with kvsched (``kvsched/instances/data/azure/``, see
its README for the source and licence): about an hour of requests to an Azure
conversation service (``conv``, 19,366 requests, mean I = 1155, mean O = 211)
and to a coding service (``code``, 8,819 requests, mean I = 2048, mean O = 28),
each with its real arrival time in seconds and real token counts (no estimate:
the lengths were counted by the service's tokenizer).

From trace to instance
----------------------
A **window** ``[start, start + duration)`` of the trace (seconds from its start;
default: all of it) is cut; requests whose peak KV I + O - 1 does not fit the
instance's KV capacity M are skipped (so every instance is feasible;
``meta["skipped_oversize"]`` counts those passed over: up to the last request
taken with ``sample="first"``, in the whole window with ``sample="random"``). From the rest, ``sample="first"`` (default) takes the
first ``n`` in arrival order, which keeps the trace's real burstiness, and
``sample="random"`` takes ``n`` of the window uniformly without replacement
(seeded), a thinned trace with the same shape over the whole window.

Arrivals are shifted so the first request arrives at 0, divided by
``rate_scale`` (2 = the same requests twice as fast: arrival rate x 2), and
multiplied by ``units_per_second`` (time units of the instance's time model per
trace second: 1 for the models that count seconds; for ``unit`` time, the number
of slots per second, e.g. 1 / 0.02 for 20 ms batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.laws import assemble, check_n_seed, require, streams
from kvsched.instances.model import Instance, Limits, TimeModel

#: The shipped traces: service name -> file under ``kvsched/instances/data/azure``.
TRACES = {"conv": "splitwise_conv.csv.gz", "code": "splitwise_code.csv.gz"}
SAMPLES = ("first", "random")
DEFAULT_SAMPLE = "first"


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """One service's trace: arrival times (s, sorted) and token counts, one entry per request."""

    service: str
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def span(self) -> float:
        """Seconds from the first arrival to the last."""
        return float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0


@cache
def load_trace(service: str) -> Trace:
    """The shipped trace of ``service`` (``conv`` or ``code``), read once per process."""
    try:
        name = TRACES[service]
    except KeyError:
        raise InputError(f"unknown Azure service {service!r} (known: {', '.join(TRACES)})") from None
    import pandas as pd  # here: importing the generators (the command line) never pays for pandas

    with resources.files("kvsched.instances").joinpath("data", "azure", name).open("rb") as fh:
        df = pd.read_csv(fh, compression="gzip")
    order = np.argsort(df["arrived_at"].to_numpy(), kind="stable")
    return Trace(
        service,
        df["arrived_at"].to_numpy(dtype=np.float64)[order],
        df["num_prefill_tokens"].to_numpy(dtype=np.int64)[order],
        df["num_decode_tokens"].to_numpy(dtype=np.int64)[order],
    )


def azure_trace(
    service: str,
    n: int,
    seed: int,
    limits: Limits,
    time_model: TimeModel | None = None,
    *,
    start: float = 0.0,
    duration: float | None = None,
    sample: str = DEFAULT_SAMPLE,
    rate_scale: float = 1.0,
    units_per_second: float = 1.0,
    predict_sigma: float | None = None,
    tick: float | None = None,
) -> Instance:
    """``n`` requests of an Azure trace window, with their real arrivals and lengths.

    Parameters
    ----------
    service
        ``conv`` (conversation) or ``code`` (coding).
    n, seed
        Number of requests, and the seed of ``sample="random"`` and of predictions.
    limits, time_model
        Copied into the instance; requests that cannot fit ``limits.kv_capacity`` are skipped.
    start, duration
        The window, in seconds from the trace's start (default: the whole trace).
    sample
        ``first``: the window's first ``n`` requests; ``random``: ``n`` of them uniformly.
    rate_scale
        Arrival-rate multiplier (inter-arrival times are divided by it).
    units_per_second
        Instance time units per trace second.
    predict_sigma, tick
        As for :func:`kvsched.instances.generators.synthetic`.
    """
    check_n_seed(n, seed)
    require(sample in SAMPLES, f"sample must be one of {', '.join(SAMPLES)}, got {sample!r}")
    for key, value in (("rate_scale", rate_scale), ("units_per_second", units_per_second)):
        require(math.isfinite(value) and value > 0, f"{key} must be > 0, got {value}")
    require(math.isfinite(start) and start >= 0, f"start must be >= 0, got {start}")
    if duration is not None:
        require(math.isfinite(duration) and duration > 0, f"duration must be > 0, got {duration}")
    trace = load_trace(service)
    t0 = float(trace.arrival[0])
    end = math.inf if duration is None else start + duration
    rel = trace.arrival - t0
    in_window = (rel >= start) & (rel < end)
    fits = trace.prompt + trace.output - 1 <= _fit_capacity(limits)
    usable = np.flatnonzero(in_window & fits)
    if usable.size < n:
        window = f"[{start:g}, {end:g}) s" if duration is not None else f"from {start:g} s"
        raise InputError(
            f"azure-{service}: the window {window} holds {usable.size} requests that fit M = "
            f"{limits.kv_capacity}, fewer than n = {n} (the trace spans {trace.span:.0f} s; widen the "
            "window or lower n)"
        )
    rng = streams(seed)
    # "first" keeps the window's real burstiness; "random" thins it evenly (seeded).
    chosen = usable[:n] if sample == "first" else np.sort(rng["order"].choice(usable, size=n, replace=False))
    arrivals = (trace.arrival[chosen] - trace.arrival[chosen[0]]) / rate_scale * units_per_second
    # The requests passed over for not fitting: with "first", those before the last one taken (the whole
    # window's count said 2900 where 10 were skipped); with "random", all the window's, none could be drawn.
    oversize = in_window & ~fits
    if sample == "first":
        oversize[chosen[-1] + 1 :] = False
    params: dict[str, object] = {"start": float(start)}
    if duration is not None:
        params["duration"] = float(duration)
    params.update(sample=sample, rate_scale=float(rate_scale), units_per_second=float(units_per_second))
    extra = {
        "source": f"Azure LLM inference trace 2023 ({service}), via Splitwise/Vidur",
        "skipped_oversize": int(np.count_nonzero(oversize)),
        "trace_seconds": [float(rel[chosen[0]]), float(rel[chosen[-1]])],
    }
    return assemble(
        kind=f"azure-{service}",
        n=n,
        seed=seed,
        limits=limits,
        time_model=time_model or TimeModel(),
        arrivals=arrivals,
        prompts=trace.prompt[chosen],
        outputs=trace.output[chosen],
        params=params,
        predict_sigma=predict_sigma,
        tick=tick,
        rng=rng,
        extra_meta=extra,
    )


def _fit_capacity(limits: Limits) -> int:
    """The largest peak KV (in tokens) a request may have: M rounded down to whole blocks."""
    return limits.kv_blocks * limits.block_size
