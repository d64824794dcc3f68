"""Machine-readable outputs shared by the commands: ``--json`` summaries, ``--trace`` files, ``--slo``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsched.commands.common import atomic_output, time_unit, write_text_atomic
from kvsched.instances.model import Instance

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.schedule.validate import Trace


def add_json_arg(p: argparse.ArgumentParser, what: str = "the summary") -> None:
    p.add_argument(
        "--json",
        metavar="FILE",
        help=f"write {what} as JSON (machine-readable: mean_ttft, p90_ttft, p99_tpot, p50_itl, p99_e2el, "
        "time_unit, ...)",
    )


def add_trace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write a Chrome/Perfetto trace of the schedule (open it in ui.perfetto.dev): one track per "
        "request (prefill chunks, decode stretches, evictions, waiting) and a KV-usage counter",
    )


def add_slo_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slo",
        metavar="ttft=V,tpot=V,e2el=V",
        help="SLOs for every request, for goodput: values in the instance's time unit, or with ms/s for an "
        "instance in seconds (e.g. ttft=200ms,tpot=50ms; default: each request's own SLOs)",
    )


def slo_from_args(args: argparse.Namespace, instance: Instance) -> Any:  # -> SLO | None
    """The ``--slo`` of ``args`` in ``instance``'s time unit (``None`` when not given)."""
    text = getattr(args, "slo", None)
    if text is None:
        return None
    from kvsched.schedule.serving import parse_slo

    return parse_slo(text, time_unit(instance))


def jsonable(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` and numpy scalars as Python ones (strict JSON)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as strict JSON (NaN as null), atomically."""
    import json  # here: a command on a CSV trace reads and writes no JSON (the import is ~6M instructions)

    write_text_atomic(path, json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n")


@dataclass(frozen=True, eq=False)
class TraceMetrics:
    """The metrics of one trace for every output of a command, each computed once and only if asked for.

    The run summary, the serving table, the ``--json`` summary and the
    per-request CSV all start from the trace's batch clock, its token gaps
    (:mod:`kvsched.schedule.tokens`) and one per-request frame: a command
    computes each once here and hands every output the same.
    """

    trace: Trace
    instance: Instance
    slo: Any = None  # SLO | None

    @cached_property
    def clock(self) -> Any:  # -> BatchClock
        """Every batch's end, runs laid out (:class:`~kvsched.schedule.tokens.BatchClock`)."""
        from kvsched.schedule.tokens import BatchClock

        return BatchClock.of(self.trace)

    @cached_property
    def tokens(self) -> Any:  # -> TokenStats
        """:func:`~kvsched.schedule.tokens.token_stats` of the trace (kept with it: the frame reads the same)."""
        from kvsched.schedule.tokens import token_stats

        return token_stats(self.trace, self.clock)

    @cached_property
    def columns(self) -> dict[str, np.ndarray]:
        """:func:`~kvsched.schedule.metrics.request_columns` of the trace: what the summaries read.

        Numpy arrays, no DataFrame: only ``--requests-csv`` needs pandas (:attr:`requests`).
        """
        from kvsched.schedule.metrics import request_columns

        return request_columns(self.trace, self.tokens)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """:func:`~kvsched.schedule.metrics.request_metrics` of the trace, built from :attr:`columns`."""
        from kvsched.schedule.metrics import request_frame

        return request_frame(self.trace, self.columns)

    @cached_property
    def run(self) -> Any:  # -> RunMetrics
        """:func:`~kvsched.schedule.metrics.run_metrics` from the same columns and clock."""
        from kvsched.schedule.metrics import run_metrics

        return run_metrics(self.trace, requests=self.columns, clock=self.clock)

    @cached_property
    def serving(self) -> Any:  # -> ServingMetrics
        """:func:`~kvsched.schedule.serving.serving_metrics` from the same columns and token gaps."""
        from kvsched.schedule.serving import serving_metrics

        return serving_metrics(
            self.trace, self.slo, unit=time_unit(self.instance), requests=[self.columns], stats=[self.tokens]
        )

    def summary(self) -> dict[str, Any]:
        """The whole-run and the serving metrics as one flat dict (the ``--json`` summary)."""
        doc = self.run.to_dict(rates=False)  # the serving metrics carry the rates, named by their unit
        doc.update(self.serving.to_dict())
        return doc


def run_summary(traces: Any, instance: Instance, slo: Any = None) -> dict[str, Any]:
    """The whole-run metrics and the serving metrics of one trace (or several engines') as one flat dict."""
    if not isinstance(traces, list | tuple):
        return TraceMetrics(traces, instance, slo).summary()
    from kvsched.schedule.serving import serving_metrics

    return serving_metrics(traces, slo, unit=time_unit(instance)).to_dict()


def write_trace(
    path: str | Path, instance: Instance, schedule: Any, name: str = "", unit: str | None = None
) -> None:
    """Write the Perfetto trace of ``schedule`` atomically (``unit``: see :func:`chrome_trace`)."""
    from kvsched.schedule.perfetto import write_chrome_trace

    with atomic_output(path) as tmp:
        write_chrome_trace(instance, schedule, tmp, name=name, unit=unit)
