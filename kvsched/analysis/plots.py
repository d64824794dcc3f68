"""Figures: schedule Gantt charts, KV usage, latency vs load, regret vs size, TTFT/TBT CDFs, solver progress.

Every figure is built from data read off a replayed
:class:`~kvsched.schedule.validate.Trace` (so every schedule drawn has been
validated) or off a results database, by a ``*_data``/``*_segments`` function
that tests can check, and drawn with matplotlib's object API
(:class:`~matplotlib.figure.Figure`, no pyplot, no global backend): rendering
goes through Agg whatever the user's backend is.

Colours follow seed 003 Figure 15: black boxes for (p)refill, gray for decode,
red for evicted (KV dropped, waiting to refill), a blue line for KV usage
against the capacity M.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from kvsched.csp.certificate import Scope
from kvsched.csp.result import AnytimePoint, Result
from kvsched.errors import InputError
from kvsched.instances.io import check_not_input, write_output
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.ir import Phase, Schedule, expect_schedule
from kvsched.schedule.metrics import batch_metrics, request_columns
from kvsched.schedule.records import RunRecord
from kvsched.schedule.tokens import generation_events, token_stats
from kvsched.schedule.validate import Trace, expect_trace, replay

FORMATS = (".png", ".svg", ".pdf")
COLORS = {"prefill": "#1a1a1a", "refill": "#1a1a1a", "decode": "#a0a0a0", "evicted": "#d62728"}
KV_COLOR = "#1f77b4"
#: Requests drawn at most in one Gantt chart (the rest are summarised in the title).
MAX_GANTT_REQUESTS = 48
#: Above this many boxes, touching boxes of one request and kind are drawn as one.
MERGE_ABOVE = 1500
#: The most points an empirical CDF is drawn with: the quantiles at evenly spaced fractions, every sample
#: below this (34.5 M token gaps at 100k requests took matplotlib 46 s to draw and 8 s to save; 4,096 of
#: them are within 1/4,096 of the curve, below a pixel of the figure).
ECDF_POINTS = 4096
_PHASE_NAMES = {int(p): p.label for p in Phase}


# ----------------------------------------------------------------------------- data
def gantt_segments(instance: Instance, schedule: Schedule, *, merge: bool = False) -> pd.DataFrame:
    """The boxes of a Gantt chart, one row per box.

    Columns: ``request`` (position), ``id``, ``kind`` (prefill, decode,
    refill or evicted), ``start``, ``end``, ``batch`` (the batch of the item,
    or of the eviction). Every item of every batch is a box over its batch's
    time span; an eviction is a box from the batch that evicts the request to
    the start of its next item (its refill). With ``merge=True``, boxes of one
    request and kind that touch are joined (what the chart draws).
    """
    batches = schedule.batches
    counts = np.fromiter((b.size for b in batches), dtype=np.int64, count=len(batches))
    if counts.sum() == 0:
        return pd.DataFrame(columns=["request", "id", "kind", "start", "end", "batch"])
    req = np.concatenate([b.requests for b in batches])
    phase = np.concatenate([b.phases for b in batches]).astype(np.int64)
    batch = np.repeat(np.arange(len(batches)), counts)
    start = np.repeat([b.start for b in batches], counts)
    end = np.repeat([b.end for b in batches], counts)
    kind = np.array([_PHASE_NAMES[p] for p in phase], dtype=object)

    # Items keyed by (request, batch), sorted: an evicted request's next item is one binary search away.
    stride = len(batches) + 1
    item_key = req * stride + batch
    order = np.argsort(item_key, kind="stable")
    sorted_key = item_key[order]
    ev_rows: list[tuple[int, str, float, float, int]] = []
    for k, b in enumerate(batches):
        for r in b.evicted:
            i = int(np.searchsorted(sorted_key, r * stride + k))
            found = i < sorted_key.size and sorted_key[i] // stride == r
            stop = float(start[order[i]]) if found else schedule.makespan
            ev_rows.append((int(r), "evicted", b.start, stop, k))
    frame = pd.DataFrame({"request": req, "kind": kind, "start": start, "end": end, "batch": batch})
    if ev_rows:
        ev = pd.DataFrame(ev_rows, columns=["request", "kind", "start", "end", "batch"])
        frame = pd.concat([frame, ev], ignore_index=True)
    frame = frame.sort_values(["request", "start", "batch"], kind="stable").reset_index(drop=True)
    if merge:
        frame = _merge_touching(frame)
    ids = [r.id for r in instance.requests]
    frame.insert(1, "id", [ids[r] for r in frame["request"]])
    return frame


def _shown_prefix(schedule: Schedule, trace: Trace, shown: int) -> Schedule:
    """The entries of ``schedule`` that start before the first ``shown`` requests have all completed: every
    box of theirs, and only as many batches as hold them (a Gantt chart of 48 of 100k requests spelled out
    all 1.4 M batches first: 48 s)."""
    if shown >= len(trace.instance):
        return schedule
    last = float(np.max(trace.state.completion[:shown]))
    starts = np.fromiter((e.start for e in schedule.entries), dtype=np.float64, count=len(schedule.entries))
    # A completed request is in no later entry (an entry starting at its completion is the next batch).
    return Schedule(schedule.entries[: int(np.searchsorted(starts, last, side="left"))], schedule.meta)


def _ecdf(ax: Any, values: np.ndarray, label: str, counts: np.ndarray | None = None) -> None:
    """The empirical CDF of ``values`` (each ``counts`` times where given: sorted distinct values, as the
    token statistics keep the gaps) as a step line through at most :data:`ECDF_POINTS` quantiles."""
    x = np.sort(values) if counts is None else values
    below = np.arange(1, x.size + 1) if counts is None else np.cumsum(counts)  # samples at or below x[i]
    n = int(below[-1])
    # The last sample at or below each of ECDF_POINTS evenly spaced ranks (every sample when fewer).
    ranks = np.linspace(1, n, min(n, ECDF_POINTS)).round()
    idx = np.unique(np.searchsorted(below, ranks))
    # From 0 at the smallest value; after each kept sample, the share of samples at or below it.
    ax.step(
        np.concatenate([[x[0]], x[idx]]), np.concatenate([[0.0], below[idx] / n]), where="post", label=label
    )


def _merge_touching(frame: pd.DataFrame) -> pd.DataFrame:
    """Join consecutive boxes of one request and kind where one ends as the next starts."""
    same = (
        (frame["request"].to_numpy()[1:] == frame["request"].to_numpy()[:-1])
        & (frame["kind"].to_numpy()[1:] == frame["kind"].to_numpy()[:-1])
        & np.isclose(frame["start"].to_numpy()[1:], frame["end"].to_numpy()[:-1], rtol=0, atol=1e-9)
    )
    group = np.concatenate([[0], np.cumsum(~same)])
    return (
        frame.groupby(group, sort=False)
        .agg(
            request=("request", "first"),
            kind=("kind", "first"),
            start=("start", "min"),
            end=("end", "max"),
            batch=("batch", "first"),
        )
        .reset_index(drop=True)
    )


def kv_usage(trace: Trace) -> pd.DataFrame:
    """KV tokens held during each batch: columns ``start``, ``end``, ``kv_tokens``."""
    bm = batch_metrics(trace)
    return bm[["start", "end", "kv_tokens"]].reset_index(drop=True)


def _step_xy(kv: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    x = np.column_stack([kv["start"], kv["end"]]).ravel()
    y = np.repeat(kv["kv_tokens"].to_numpy(), 2)
    return x, y


def token_gaps(trace: Trace) -> np.ndarray:
    """Every time between two consecutive tokens of one request (the TBT samples)."""
    pos, times = generation_events(trace)
    same = pos[1:] == pos[:-1]
    return np.diff(times)[same]


def _expect_named(schedules: object) -> None:
    """One :class:`InputError` for what is not a mapping of names to schedules."""
    if not isinstance(schedules, Mapping):
        raise InputError(
            f"schedules: expected a mapping of names to schedules, got {type(schedules).__name__}"
        )


def _is_number(value: object) -> bool:
    """A real number that is not a bool (``True`` is no time or objective)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def _anytime_row(k: int, point: object) -> tuple[Any, Any, Any]:
    """Point ``k`` of a caller's anytime points as a ``(time, incumbent, bound)`` row; else one
    :class:`InputError` naming it.

    The time must be a finite number >= 0 (as ``kvsched plot anytime`` requires of a result file). An
    incumbent or bound may be missing, as ``None`` or NaN (not found yet: that step is not drawn, as
    the solvers report it), but not infinite.
    """
    if isinstance(point, AnytimePoint):
        row: tuple[Any, ...] | None = (point.time, point.incumbent, point.bound)
    elif isinstance(point, Iterable) and not isinstance(point, str | bytes | Mapping):
        row = tuple(point)
    else:
        row = None
    if (
        row is None
        or len(row) != 3
        or not (_is_number(row[0]) and math.isfinite(row[0]) and row[0] >= 0)
        or not all(v is None or (_is_number(v) and not math.isinf(v)) for v in row[1:])
    ):
        raise InputError(
            f"source: point {k}: expected (time, incumbent, bound): a finite time >= 0 and numbers, "
            f"the last two None while unknown; got {repr(point)[:60]}"
        )
    return row[0], row[1], row[2]


def anytime_points(source: Result | Iterable[Any]) -> pd.DataFrame:
    """A solver's progress as columns ``time``, ``incumbent``, ``bound``.

    Parameters
    ----------
    source
        A :class:`~kvsched.csp.Result` (its final objective and bound close the curve at its
        runtime), or points: :class:`~kvsched.csp.AnytimePoint` or ``(time, incumbent, bound)``
        triples of numbers (an unknown incumbent or bound ``None`` or NaN).

    Returns
    -------
    pandas.DataFrame
        One float row per point, sorted by time (a missing value NaN).
    """
    if isinstance(source, Result):
        rows = [(p.time, p.incumbent, p.bound) for p in source.anytime]
        if source.objective is not None:
            rows.append((source.runtime, source.objective, source.best_bound))
    elif isinstance(source, Iterable) and not isinstance(source, str | bytes):
        rows = [_anytime_row(k, p) for k, p in enumerate(source)]
    else:
        raise InputError(
            "source: expected a solve's Result or its anytime points ((time, incumbent, bound) triples), "
            f"got {type(source).__name__}"
        )
    frame = pd.DataFrame(rows, columns=["time", "incumbent", "bound"], dtype=float)
    return frame.sort_values("time", kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------- figures
def _expect_title(title: object) -> None:
    """One :class:`InputError` for a ``title`` that is not text (``None`` or ``""``: the default title)."""
    if title is not None and not isinstance(title, str):
        raise InputError(f"title: expected a str (or None for the default title), got {type(title).__name__}")


def _legend_patches(kinds: Iterable[str]) -> list[Patch]:
    labels = {"prefill": "(p)refill", "refill": "(p)refill", "decode": "decode", "evicted": "evicted"}
    seen: dict[str, Patch] = {}
    for k in kinds:
        seen.setdefault(labels[k], Patch(color=COLORS[k], label=labels[k]))
    return list(seen.values())


def plot_gantt(
    instance: Instance,
    schedule: Schedule,
    *,
    title: str = "",
    max_requests: int = MAX_GANTT_REQUESTS,
    trace: Trace | None = None,
) -> Figure:
    """Gantt chart of ``schedule``: one row per request, and KV usage against M below.

    The schedule is replayed (validated) first, unless its replay is given as
    ``trace``. At most ``max_requests`` requests (the first by position) are
    drawn; the KV line covers them all.
    """
    expect_instance(instance)
    expect_schedule(schedule)
    # An int >= 1: a bool is not a count, and no rows (0) left an empty chart and a matplotlib warning.
    if not (isinstance(max_requests, Integral) and not isinstance(max_requests, bool) and max_requests >= 1):
        raise InputError(f"max_requests: expected an int >= 1, got {max_requests!r}")
    _expect_title(title)
    if trace is None:
        trace = replay(instance, schedule)
    else:
        check_replay_of(schedule, expect_trace(trace, instance=instance))
    shown = min(len(instance), int(max_requests))
    seg = gantt_segments(instance, _shown_prefix(schedule, trace, shown))
    if len(seg) > MERGE_ABOVE:  # one box per batch (as seed 003 Fig. 15) while that stays legible
        seg = _merge_touching(seg)
    seg = seg[seg["request"] < shown]
    fig = Figure(figsize=(10, 2.2 + 0.28 * shown), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[max(2.0, 0.28 * shown), 1.6])
    for (r, kind), g in seg.groupby(["request", "kind"], sort=False):
        top.broken_barh(
            list(zip(g["start"], g["end"] - g["start"], strict=True)),
            (r - 0.4, 0.8),
            facecolors=COLORS[kind],
            edgecolor="white" if kind != "evicted" else COLORS[kind],
            linewidth=0.5,
        )
    top.set_yticks(range(shown), [r.id for r in instance.requests[:shown]], fontsize=8 if shown > 16 else 9)
    top.set_ylim(shown - 0.5, -0.5)
    top.set_ylabel("request")
    top.legend(
        handles=_legend_patches(seg["kind"].unique()),
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        ncols=3,
        frameon=False,
    )
    more = f" (first {shown} of {len(instance)} requests)" if shown < len(instance) else ""
    top.set_title((title or "schedule") + more, loc="left")
    kv = kv_usage(trace)
    x, y = _step_xy(kv)
    bottom.plot(x, y, color=KV_COLOR, linewidth=1.5, label="KV usage")
    bottom.axhline(instance.limits.kv_capacity, color="black", linestyle="--", linewidth=1, label="M")
    bottom.set_ylim(0, instance.limits.kv_capacity * 1.1)
    bottom.set_ylabel("KV tokens")
    bottom.set_xlabel(f"time ({unit_label(instance)})")
    bottom.legend(loc="lower right", fontsize=8)
    return fig


#: Above this many labelled lines a legend goes below the axes, in columns, not over them.
LEGEND_INSIDE = 10


def _legend(fig: Figure, ax: Axes, loc: str = "lower right") -> None:
    """``ax``'s legend: inside at ``loc`` for a few lines; for many (every policy) below the figure's
    axes in columns, so that it never squeezes them (36 names inside left no room for the plot)."""
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) <= LEGEND_INSIDE:
        ax.legend(fontsize=8, loc=loc)
        return
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=min(6, -(-len(labels) // 3)))


def _replays(
    instance: Instance, schedules: Mapping[str, Schedule], traces: Mapping[str, Trace] | None
) -> dict[str, Trace]:
    """Each schedule's replay: the one given in ``traces``, else replayed (validated) here."""
    if traces is not None and not isinstance(traces, Mapping):
        raise InputError(
            f"traces: expected a mapping of the schedules' names to their traces, got {type(traces).__name__}"
        )
    given = traces or {}
    # A trace under a name no schedule has is a typo (or a stale key): its curve would silently go missing.
    unknown = [str(k) for k in given if k not in schedules]
    if unknown:
        raise InputError(
            f"traces: {', '.join(map(repr, unknown))} name no schedule (the schedules are "
            f"{', '.join(map(repr, map(str, schedules)))})"
        )
    out = {}
    for name, schedule in schedules.items():
        if given.get(name) is None:
            out[name] = replay(instance, schedule)
            continue
        label = f"traces[{name!r}]"
        out[name] = check_replay_of(schedule, expect_trace(given[name], label, instance), label)
    return out


def check_replay_of(schedule: Schedule, trace: Trace, name: str = "trace") -> Trace:
    """``trace`` if it can be the replay of ``schedule``, else one :class:`InputError` naming ``name``.

    A replay of another schedule of the same instance would draw that schedule's data under this one's
    name. The check is cheap (no replay): the same number of batches, and the same start for each of the
    schedule's entries (a run's record starts where its run does; the record of a run's last chunk, its
    ``tail``, has no entry of its own).

    Parameters
    ----------
    schedule
        The schedule drawn.
    trace
        Its replay, as given by the caller.
    name
        The argument's name, for the message.

    Returns
    -------
    Trace
        ``trace`` itself.
    """
    why = ""
    if trace.num_batches != len(schedule):
        why = f"it has {trace.num_batches} batches, the schedule {len(schedule)}"
    else:
        starts = []
        tail = None
        for e in trace.entries:
            if e is tail:  # the tail's batch belongs to the run recorded just before it
                continue
            if type(e) is RunRecord:
                starts.append(e.run.start)
                tail = e.tail
            else:
                starts.append(e.start)
        # A run replayed batch by batch (a non-strict replay of an illegal run) has more entries: its
        # batch count agreed above, and only the entry starts cannot be compared one to one.
        if len(starts) == len(schedule.entries):
            mine = np.fromiter((e.start for e in schedule.entries), float, len(schedule.entries))
            if not np.allclose(np.asarray(starts, float), mine, rtol=1e-9, atol=1e-9):
                why = "its batches start at other times than the schedule's"
    if why:
        raise InputError(f"{name}: not the replay of the schedule drawn ({why}); pass that schedule's trace")
    return trace


def plot_kv(
    instance: Instance,
    schedules: Mapping[str, Schedule],
    *,
    title: str = "",
    traces: Mapping[str, Trace] | None = None,
) -> Figure:
    """KV usage over time of several schedules (each replayed, unless its replay is in ``traces``), against M."""
    expect_instance(instance)
    _expect_named(schedules)
    _expect_title(title)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax = fig.subplots()
    for name, trace in _replays(instance, schedules, traces).items():
        x, y = _step_xy(kv_usage(trace))
        ax.plot(x, y, linewidth=1.3, label=name)
    ax.axhline(instance.limits.kv_capacity, color="black", linestyle="--", linewidth=1, label="M")
    ax.set_ylim(0, instance.limits.kv_capacity * 1.1)
    ax.set_xlabel(f"time ({unit_label(instance)})")
    ax.set_ylabel("KV tokens held")
    ax.set_title(title or "KV usage")
    _legend(fig, ax)
    return fig


def plot_cdfs(
    instance: Instance,
    schedules: Mapping[str, Schedule],
    *,
    title: str = "",
    traces: Mapping[str, Trace] | None = None,
) -> Figure:
    """Empirical CDFs of TTFT (per request) and TBT (every gap between two tokens of a completed request,
    the ITL samples) of several schedules (each replayed, unless its replay is in ``traces``)."""
    expect_instance(instance)
    _expect_named(schedules)
    _expect_title(title)
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for name, trace in _replays(instance, schedules, traces).items():
        # The token statistics the serving metrics share: the gaps as sorted distinct values and counts
        # (every gap spelled out and sorted took 18 s of a 100k-request report's figures).
        stats = token_stats(trace)
        ttft = request_columns(trace, stats)["ttft"]
        ttft = ttft[~np.isnan(ttft)]
        if ttft.size:
            _ecdf(left, ttft, name)
        if stats.itl_counts.size:
            _ecdf(right, stats.itl_values, name, stats.itl_counts)
    unit = unit_label(instance)
    left.set_xlabel(f"TTFT ({unit})")
    right.set_xlabel(f"time between tokens ({unit})")
    for ax in (left, right):
        ax.set_ylabel("fraction")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    _legend(fig, left)
    fig.suptitle(title or "TTFT and TBT distributions")
    return fig


def plot_anytime(source: Result | Iterable[Any], *, title: str = "") -> Figure:
    """The solver's incumbent (best schedule found) and proven bound over time.

    With a :class:`~kvsched.csp.Result`, the legend names the scope the bound
    ranges over and its source, and a narrower scope than every schedule adds
    the bound valid for every legal schedule as a dashed line.
    """
    _expect_title(title)
    pts = anytime_points(source)
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    result = source if isinstance(source, Result) else None
    if pts.empty:
        ax.text(0.5, 0.5, "the solver reported no progress", ha="center", va="center", transform=ax.transAxes)
    else:
        inc = pts.dropna(subset=["incumbent"])
        bnd = pts.dropna(subset=["bound"])
        bound_label = "bound"
        if result is not None:
            bound_label = f"bound over {result.scope} schedules"
            if result.bound_source:
                bound_label += f" (final: {result.bound_source})"
        ax.step(
            inc["time"], inc["incumbent"], where="post", color="#d62728", marker=".", label="best schedule"
        )
        ax.step(bnd["time"], bnd["bound"], where="post", color=KV_COLOR, marker=".", label=bound_label)
        every = None if result is None else result.all_schedules_bound
        if every is not None and result is not None and result.scope != Scope.ALL:
            ax.axhline(
                every.value,
                color="#2ca02c",
                linestyle="--",
                linewidth=1,
                label=f"bound over every schedule ({every.source})",
            )
        ax.legend(fontsize=8)
    ax.set_xlabel("solver time (s)")
    ax.set_ylabel("objective")
    default = "solver progress"
    if result is not None:
        default += f": {result.status}, scope {result.scope}"
    ax.set_title(title or default)
    ax.grid(alpha=0.3)
    return fig


_OK = ("ok", "optimal", "feasible")


def load_curve_data(frame: pd.DataFrame, x: str | None = None, metric: str = "mean_latency") -> pd.DataFrame:
    """Mean of ``metric`` per runner and value of ``x`` (over seeds and every other axis).

    Returns columns ``name``, ``kind``, the x column, ``mean``, ``count``.
    ``x`` defaults to ``rate`` when it varies, else ``n``.
    """
    from kvsched.analysis.regret import select_objective

    # One objective: a mean over several would mix their units (kvsched plot load --objective picks one).
    ok = select_objective(frame)
    ok = ok[ok["status"].isin(_OK)]
    if ok.empty:
        raise InputError("no finished rows to plot")
    x = x or next((c for c in ("rate", "n", "kv_capacity") if c in ok and ok[c].nunique() > 1), "n")
    # name and kind are the lines' keys: as x they would be grouped on twice, and they are text anyway.
    numeric = sorted(
        c
        for c in ok.columns
        if c not in ("name", "kind")
        and pd.api.types.is_numeric_dtype(ok[c])
        and not pd.api.types.is_bool_dtype(ok[c])
    )
    for col, what in ((x, "--x"), (metric, "--metric")):
        if col not in ok.columns:
            raise InputError(
                f"{what}: no column {col!r} in the results (numeric columns: {', '.join(numeric)})"
            )
        if col not in numeric:
            raise InputError(f"{what}: column {col!r} is not numeric (numeric columns: {', '.join(numeric)})")
    data = ok.dropna(subset=[x, metric])
    out = data.groupby(["name", "kind", x], sort=True)[metric].agg(["mean", "count"]).reset_index()
    return out


def plot_load(
    frame: pd.DataFrame, *, x: str | None = None, metric: str = "mean_latency", title: str = ""
) -> Figure:
    """Latency (or any metric) against load, one line per policy (like seed 004 Figure 5)."""
    data = load_curve_data(frame, x, metric)
    xcol = data.columns[2]
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for (name, kind), g in data.groupby(["name", "kind"], sort=False):
        style = {"color": "black", "linestyle": "--"} if kind == "solver" else {}
        ax.plot(g[xcol], g["mean"], marker="o", markersize=4, label=name, **style)
    ax.set_xlabel(xcol)
    ax.set_ylabel(f"{metric} (mean over instances)")
    ax.set_title(title or f"{metric} vs {xcol}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def regret_size_data(frame: pd.DataFrame, against: str | None = None, size: str = "n") -> pd.DataFrame:
    """Mean and max relative regret per policy and instance size: columns name, size, mean, max, count."""
    from kvsched.analysis.regret import instance_regret, select_objective

    per = instance_regret(select_objective(frame), against).dropna(subset=["regret_pct"])
    if per.empty:
        raise InputError("no regret to plot (no instance has a reference value)")
    out = per.groupby(["name", size], sort=True)["regret_pct"].agg(["mean", "max", "count"]).reset_index()
    return out


def plot_regret_vs_size(frame: pd.DataFrame, *, against: str | None = None, title: str = "") -> Figure:
    """Mean relative regret of each policy against the number of requests."""
    from kvsched.analysis.regret import default_against, describe_reference

    against = against or default_against(frame)
    data = regret_size_data(frame, against)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, g in data.groupby("name", sort=False):
        ax.plot(g["n"], g["mean"], marker="o", markersize=4, label=name)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("requests per instance (n)")
    ax.set_ylabel("mean regret (%)")
    ax.set_title(title or f"regret {describe_reference(frame, against)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ----------------------------------------------------------------------------- output
def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG, SVG or PDF (by the suffix of ``path``); returns the path.

    A missing folder is created, and a path that cannot be written is one :class:`InputError`
    (:func:`~kvsched.instances.io.write_output`).
    """
    if not isinstance(fig, Figure):
        raise InputError(f"fig: expected a matplotlib Figure (kvsched.plot_*), got {type(fig).__name__}")
    path = check_not_input(path, "save_figure")
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"path: {path}: use a .png, .svg or .pdf file name")  # the API's argument, not --out
    return write_output(path, "save_figure", lambda p: fig.savefig(p, dpi=120))


def png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    """``fig`` as PNG bytes (for embedding)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def unit_label(instance: Instance) -> str:
    return "slots" if instance.time_model.name == "unit" else "s"


def ordered(names: Sequence[str], schedules: Mapping[str, Schedule]) -> dict[str, Schedule]:
    """The schedules of ``names`` (in that order, duplicates dropped)."""
    return {n: schedules[n] for n in dict.fromkeys(names) if n in schedules}
