"""Self-contained HTML reports: one page with the tables and the figures embedded.

* :func:`instance_report`: solve one instance (time-limited), compare every
  policy (:func:`kvsched.analysis.compare`), and show the comparison table, the
  Gantt charts of the optimum and of the best and worst policies, their KV
  usage, TTFT/TBT distributions and the solver's progress.
* :func:`database_report`: the regret table of a sweep's results, latency vs
  load and regret vs instance size.

The page has no external assets: figures are inline base64 PNG, the style
sheet is inline, and nothing is fetched when it opens.
"""

from __future__ import annotations

import base64
import html
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from kvsched import __version__
from kvsched.analysis import plots
from kvsched.analysis.compare import (
    MAX_REGRET_ALL,
    MAX_REGRET_SCOPE,
    REGRET,
    REGRET_PCT,
    Comparison,
)
from kvsched.csp.certificate import Scope
from kvsched.csp.result import Result, SolveStatus
from kvsched.errors import InputError, expect_path
from kvsched.instances.io import check_not_input
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.metrics import format_number
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline

REPORT_FILE = "index.html"

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; color: #1a1a1a; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
p.meta { color: #666; margin-top: 0; }
table.tbl { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
table.tbl th, table.tbl td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #e5e5e5; text-align: right; }
table.tbl th:first-child, table.tbl td:first-child { text-align: left; }
table.tbl thead th { background: #f4f4f4; }
table.tbl tr.solver td { font-weight: 600; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
.note { color: #555; font-size: 0.9rem; }
div.scroll { overflow-x: auto; }
"""


@dataclass(frozen=True, slots=True)
class _Section:
    title: str
    body: str


def _fmt(value: Any) -> str:
    return format_number(value, 4, missing="–")


def _table(frame: pd.DataFrame, *, index_name: str = "") -> str:
    frame = frame.copy()
    frame.index.name = index_name or frame.index.name
    body = frame.reset_index().to_html(
        classes="tbl", border=0, na_rep="–", float_format=lambda v: f"{v:.4g}", escape=True, index=False
    )
    return f'<div class="scroll">{body}</div>'


def _pairs(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows)
    return f'<table class="tbl">{body}</table>'


def _figure(fig: Figure, caption: str) -> str:
    data = base64.b64encode(plots.png_bytes(fig)).decode("ascii")
    alt = html.escape(caption)
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}"><figcaption>{alt}</figcaption></figure>'
    )


def _page(title: str, subtitle: str, sections: Sequence[_Section]) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{html.escape(subtitle)} · kvsched {__version__} · {stamp}</p>',
    ]
    for s in sections:
        parts.append(f"<section><h2>{html.escape(s.title)}</h2>{s.body}</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def check_report_folder(
    out_dir: str | Path, what: str = "out_dir", inputs: Sequence[str | Path] = ()
) -> Path:
    """The folder a report's page goes in, checked and made before the work: its ``index.html`` refused where
    every writer refuses (the bundled examples, an input's file), the folder not an input (``inputs``), not a
    file, creatable. ``what`` names it in an error (``--out`` on the command line)."""
    from kvsched.instances.io import check_output_folder

    check_not_input(Path(expect_path(out_dir, what)) / REPORT_FILE, what)
    return check_output_folder(out_dir, what, inputs)


def _write(out_dir: str | Path, page: str) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def gantt_heading(role: str, name: str, objective: str, value: Any, unit: str, result: Any = None) -> str:
    """The title of a report's Gantt chart: what the schedule is, and its objective in words and units.

    For the solver's schedule (``result`` given) it says whether optimality is
    proven and over which schedules, e.g. "the exact solution (batch-indexed /
    cpsat), proven optimal over every legal schedule: total latency 36 slots";
    a schedule not proven optimal is called the best found, with its bound.
    """
    measured = f"{objective.replace('-', ' ')} {_fmt(value)} {unit}"
    if result is None:
        return f"{role}, {name}: {measured}"
    how = f"{result.formulation} / {result.solver}"
    if result.status == "optimal":
        return f"{role} ({how}), proven optimal over {result.scope.description}: {measured}"
    bound = _fmt(result.best_bound)
    return f"the best schedule found ({how}, {result.status}, not proven optimal; bound {bound}): {measured}"


# ----------------------------------------------------------------------------- one instance
_COMPARE_COLUMNS = (
    "kind",
    "objective",
    "scope",
    REGRET,
    REGRET_PCT,
    MAX_REGRET_SCOPE,
    MAX_REGRET_ALL,
    "mean_latency",
    "mean_ttft",
    "p99_ttft",
    "max_tbt",
    "tokens_per_s",
    "tokens_per_slot",
    "evictions",
    "batches",
    "runtime_s",
    "error",
)


def instance_report(
    instance: Instance,
    out_dir: str | Path,
    *,
    policies: str | Sequence[str] | None = None,
    objective: str | None = None,
    solver: str | None = "highs",
    formulation: str = "auto",
    options: Any = None,
    solve_options: dict[str, Any] | None = None,
    source: str = "",
    comparison: Comparison | None = None,
    deadline: Deadline | None = None,
) -> Path:
    """Solve ``instance``, compare ``policies`` (all by default) and write the report; returns its path.

    Parameters
    ----------
    instance
        The instance reported on.
    out_dir
        The folder the page (``index.html``) is written in; created if missing. Never kvsched's bundled
        examples folder, nor a folder whose ``index.html`` is an input (an instance file, a database).
    policies
        ``"all"``, ``"a,b"`` or a sequence of policy names, as for
        :func:`~kvsched.analysis.compare.compare` (default: every policy).
    objective
        The objective compared and shown (default ``"total-latency"``). With a ``comparison`` it is the
        comparison's objective: giving another one is an :class:`InputError`, as the page would call
        the comparison's numbers by the wrong name.
    solver, formulation, options, solve_options
        The exact solve's settings (see :func:`~kvsched.analysis.compare.compare`).
    source
        Where the instance was read from, for the page's heading.
    comparison
        A comparison already computed by :func:`~kvsched.analysis.compare.compare`, used as it is
        (nothing is solved or simulated then).
    deadline
        When the whole report must be written (wall clock). The policies and the solve count against
        it and the solve ends early enough to leave time for the figures (at most half the limit is
        kept for them); a figure that cannot be drawn in the time left is left out, and the page
        says so. A report that still ends past the deadline (beyond its grace) says so with a
        :class:`RuntimeWarning`: a first schedule is always made, and that can take longer.

    Returns
    -------
    Path
        The page written.
    """
    from kvsched.analysis.compare import compare, policy_names
    from kvsched.heuristics import POLICIES
    from kvsched.schedule.output_time import solve_deadline

    expect_instance(instance)
    if comparison is not None and not isinstance(comparison, Comparison):
        raise InputError(
            f"comparison: expected a Comparison (kvsched.compare's result), got {type(comparison).__name__}"
        )
    if not isinstance(source, str):
        raise InputError(
            f"source: expected a str (where the instance was read from), got {type(source).__name__}"
        )
    if deadline is not None and not isinstance(deadline, Deadline):
        raise InputError(f"deadline: expected a kvsched.Deadline or None, got {type(deadline).__name__}")
    names = policy_names(policies) if policies is not None else list(POLICIES)
    if comparison is not None:
        if objective is not None and objective != comparison.objective:
            raise InputError(
                f"objective: {objective!r}, but the comparison was made for {comparison.objective!r}; "
                "leave objective out (it is the comparison's) or compare again"
            )
        objective = comparison.objective
    elif objective is None:
        objective = "total-latency"
    # Checked before the work, not after a solve.
    check_report_folder(out_dir)
    deadline = deadline or Deadline.never()
    cmp = comparison or compare(
        instance,
        names,
        objective=objective,
        solver=solver,
        formulation=formulation,
        options=options,
        skip_solver_errors=True,
        solve_options=solve_options,
        keep_traces=True,  # the figures draw the replays the comparison made
        # As `kvsched report`: time is kept from the solve for drawing the figures after it.
        deadline=solve_deadline(deadline, instance, ("figures",)),
    )
    table = cmp.table.sort_values("objective", na_position="last")
    ran = table[(table["kind"] == "policy") & table["objective"].notna()]
    best = str(ran["objective"].idxmin()) if len(ran) else None
    worst = str(ran["objective"].idxmax()) if len(ran) else None
    optimum = next((str(n) for n in table.index if table.loc[n, "kind"] == "solver"), None)
    shown = plots.ordered([n for n in (optimum, best, worst) if n], cmp.schedules)

    lim = instance.limits
    reqs = instance.requests
    unit = plots.unit_label(instance)
    facts = [
        ("requests", len(reqs)),
        ("KV capacity M (tokens)", lim.kv_capacity),
        ("token budget C", lim.max_batch_tokens or "unlimited"),
        ("prefill budget P", lim.max_prefill_tokens or "unlimited"),
        ("block size", lim.block_size),
        ("time model", instance.time_model.name),
        ("prompt lengths I", f"{min(r.prompt for r in reqs)} .. {max(r.prompt for r in reqs)}"),
        ("output lengths O", f"{min(r.output for r in reqs)} .. {max(r.output for r in reqs)}"),
        (f"arrivals ({unit})", f"{min(r.arrival for r in reqs):g} .. {max(r.arrival for r in reqs):g}"),
    ]
    sections = [_Section("Instance", _pairs(facts))]
    res = cmp.result
    if res is not None:
        solved = [
            ("status", str(res.status)),
            (f"{objective} ({unit})", res.objective),
            ("scope of the optimum", res.scope.description),
            ("proven bound", res.best_bound),
            ("bound source", res.bound_source or "-"),
            ("gap", None if res.gap is None else f"{100 * res.gap:.3g} %"),
            ("formulation / solver", f"{res.formulation} / {res.solver}"),
            ("solver time (s)", res.runtime),
            ("bound valid for every schedule", cmp.lower_bound),
        ]
        note = ""
        if res.scope != Scope.ALL:
            note = (
                f'<p class="note">This optimum ranges over {res.scope.description}: '
                "a policy outside that set can beat it (negative regret). The certified column is "
                "against a bound valid for every schedule.</p>"
            )
        sections.append(_Section("Exact solution", _pairs(solved) + note))
    elif cmp.solver_error is not None:
        why = html.escape(cmp.solver_error)
        sections.append(_Section("Exact solution", f'<p class="note">The solver did not run: {why}</p>'))
    cols = [c for c in _COMPARE_COLUMNS if c in table.columns]
    shown_table = table[cols]
    if "error" in shown_table and shown_table["error"].isna().all():
        shown_table = shown_table.drop(columns="error")
    sections.append(
        _Section(
            f"Policies ({objective}, {unit})",
            _table(shown_table, index_name="schedule")
            + f'<p class="note">Best policy: {html.escape(best or "–")}; worst: {html.escape(worst or "–")}. '
            "Every schedule was replayed through the semantic core (validated).</p>" + _regret_legend(cmp),
        )
    )
    # In this order, so that a policy both best and worst (all tied) is called the best.
    labels = {worst: "the worst policy", best: "the best policy", optimum: "the exact solution"}
    figs, left_out = _instance_figures(instance, cmp, table, shown, labels, optimum, unit, deadline)
    if left_out:
        figs.append(
            f'<p class="note">Left out to end by the deadline ({deadline.limit:g} s): '
            f"{html.escape('; '.join(left_out))}.</p>"
        )
    sections.append(_Section("Figures", "\n".join(figs)))
    title = f"kvsched report: {instance.name or source or 'instance'}"
    path = _write(out_dir, _page(title, source or instance.name, sections))
    late = time.monotonic() - deadline.end
    if deadline.bounded and late > deadline.grace():
        # Not silent: the caller set a wall-clock limit and the report overran it (a first schedule is
        # always made, and the page always written).
        warnings.warn(
            f"instance_report: ended {late:.1f} s past its deadline ({deadline.limit:g} s)",
            RuntimeWarning,
            stacklevel=2,
        )
    return path


def _instance_figures(
    instance: Instance,
    cmp: Comparison,
    table: pd.DataFrame,
    shown: dict[str, Any],
    labels: dict[str | None, str],
    optimum: str | None,
    unit: str,
    deadline: Deadline,
) -> tuple[list[str], list[str]]:
    """The figures of :func:`instance_report` that fit before ``deadline``, and the captions of the rest.

    A figure is drawn only if the time left covers its estimate: at first a drawing's (from a trace at
    hand), then the longest a figure here has taken, plus a replay (likewise) for each schedule the
    comparison did not keep the trace of. A late figure would make the whole report late.
    """
    from kvsched.schedule.output_time import output_seconds

    res = cmp.result
    objective = cmp.objective
    figs: list[str] = []
    left_out: list[str] = []
    # The replays the comparison kept (the solver's, the best and the worst policy's) are not made again:
    # a replay of 100,000 requests takes half a minute, drawing from it a few seconds.
    traces: dict[str, Any] = {n: cmp.traces[n] for n in shown if n in cmp.traces}
    clock = _FigureClock(output_seconds(instance, ("drawing",)), output_seconds(instance, ("replay",)))

    def fits(what: str, names: Iterable[str] = ()) -> bool:
        if deadline.remaining() >= clock.need(sum(1 for n in names if n not in traces)):
            return True
        left_out.append(what)
        return False

    def replayed(names: Iterable[str]) -> dict[str, Any]:
        for n in names:
            if n not in traces:
                traces[n] = clock.timed("replay", replay, instance, shown[n])
        return {n: traces[n] for n in names}

    for name, schedule in shown.items():
        solved = res if name == optimum else None
        heading = gantt_heading(labels[name], name, objective, table.loc[name, "objective"], unit, solved)
        if not fits(f"the Gantt chart of {name}", [name]):
            continue
        trace = replayed([name])[name]
        fig = clock.timed("figure", plots.plot_gantt, instance, schedule, title=heading, trace=trace)
        figs.append(
            _figure(
                fig,
                f"Gantt chart of {heading}: (p)refill, decode and evicted boxes per request; "
                "KV usage against M below.",
            )
        )
    if shown:
        if fits("KV usage over time", shown):
            got = replayed(shown)
            fig = clock.timed("figure", plots.plot_kv, instance, shown, traces=got)
            figs.append(_figure(fig, "KV usage over time"))
        if fits("TTFT and time-between-tokens distributions", shown):
            got = replayed(shown)
            fig = clock.timed("figure", plots.plot_cdfs, instance, shown, traces=got)
            figs.append(_figure(fig, "TTFT and time-between-tokens distributions"))
    # The anytime curve has a point per improvement, not per token: its own, smaller estimate.
    if res is not None:
        if deadline.remaining() >= output_seconds(instance, ("curve",)):
            figs.append(_figure(plots.plot_anytime(res), anytime_caption(res)))
        else:
            left_out.append("the solver's progress")
    return figs, left_out


class _FigureClock:
    """What the next figure of a report needs: the longest a figure has taken so far (at first the
    estimate of a drawing) with a margin, plus a replay (likewise) for each schedule whose trace is not at
    hand."""

    #: Figures of one report differ: the next may take this much longer than the longest so far.
    MARGIN = 1.5

    def __init__(self, drawing: float, replay: float) -> None:
        self._longest = {"figure": drawing, "replay": replay}
        self._measured: set[str] = set()

    def need(self, replays: int) -> float:
        return self._longest["figure"] + replays * self._longest["replay"]

    def timed(self, kind: str, work: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        out = work(*args, **kwargs)
        spent = self.MARGIN * (time.monotonic() - started)
        # The first measurement replaces the estimate; later ones only raise it.
        seen = kind in self._measured
        self._longest[kind] = max(self._longest[kind], spent) if seen else spent
        self._measured.add(kind)
        return out


def anytime_caption(result: Result) -> str:
    """The caption of the anytime figure: what it draws, the scope and the bound source."""
    every = result.all_schedules_bound
    text = (
        f"Solver progress ({result.formulation}/{result.solver}, {result.status}): the best schedule found "
        f"and the proven bound over time. Scope: {result.scope.description}; "
        f"bound source: {result.bound_source or 'none'}"
    )
    if every is not None and result.scope != Scope.ALL:
        text += f"; bound over every legal schedule: {_fmt(every.value)} ({every.source})"
    return text + "."


def _regret_legend(cmp: Comparison) -> str:
    """What each regret column is measured against, in words."""
    res = cmp.result
    items = []
    if res is not None:
        proven = res.status == SolveStatus.OPTIMAL
        items.append(
            f"{REGRET}: against the solver's best schedule ({_fmt(res.objective)}, "
            f"{'the proven optimum' if proven else 'not proven optimal'} over {res.scope.description}); "
            f"{REGRET_PCT} in percent of it."
        )
        source = f" from {res.bound_source}" if res.bound_source else ""
        items.append(
            f"{MAX_REGRET_SCOPE}: against the proven bound over that scope ({_fmt(res.best_bound)}{source}); "
            + (
                "equal to the regret, the optimum being proven."
                if proven
                else "the regret against that scope's optimum lies between the two."
            )
        )
    if cmp.lower_bound is not None:
        items.append(
            f"{MAX_REGRET_ALL}: against {_fmt(cmp.lower_bound)}, a bound valid for every legal schedule "
            "(evictions and chunking included): the certified regret, no policy is further from the optimum."
        )
    if not items:
        return ""
    body = "".join(f"<li>{html.escape(t)}</li>" for t in items)
    return f'<ul class="note">{body}</ul>'


# ----------------------------------------------------------------------------- a results database
def database_report(
    db_path: str | Path, out_dir: str | Path, *, against: str | None = None, frame: pd.DataFrame | None = None
) -> Path:
    """Regret table, latency vs load and regret vs size of a results database; returns the report's path.

    ``frame`` is the database's :func:`~kvsched.analysis.store.load_results`, when the caller read it
    already (to refuse a bad database before making the output folder); it is read here otherwise.
    """
    from kvsched.analysis.regret import default_against, describe_reference, regret_table, select_objective
    from kvsched.analysis.store import load_results

    # Refused before the work, as instance_report's (the bundled examples, an input's file).
    check_not_input(Path(expect_path(out_dir, "out_dir")) / REPORT_FILE, "out_dir")
    if frame is None:
        frame = load_results(db_path)
    if frame.empty:
        raise InputError(f"{db_path}: the results database is empty")
    # A table or curve over several objectives would average unlike units (kvsched report --objective).
    frame = select_objective(frame)
    against = against or default_against(frame)
    counts = frame["status"].value_counts()
    facts = [
        ("rows (cells)", len(frame)),
        # (The sweeps that wrote the rows: a cell another sweep shares keeps its writer's name.)
        ("written by sweeps", ", ".join(sorted(frame["sweep"].dropna().unique()))),
        ("instances", frame["instance_key"].nunique()),
        ("policies", frame.loc[frame["kind"] == "policy", "name"].nunique()),
        ("statuses", ", ".join(f"{k} {v}" for k, v in counts.items())),
    ]
    sections = [_Section("Results", _pairs(facts))]
    table = regret_table(frame, against)
    sections.append(
        _Section(
            f"Regret {describe_reference(frame, against)}",
            _table(table)
            + '<p class="note">regret_pct is relative to the reference; scopes are the sets of schedules '
            "the references range over (all: every legal schedule; contiguous: the time-indexed class); "
            "stability is the standard deviation of regret_pct across instances; win_rate the share of "
            "the instances the policy ran on where it is the best policy (ties included); sorted by "
            "failures, then mean regret_pct.</p>",
        )
    )
    figs = []
    # A database whose every row is an error (or with no reference) still gets its tables: the figure
    # that has nothing to draw is named in a note instead of failing the whole report.
    drawn = [(lambda: plots.plot_load(frame), "Mean latency against load, per policy (mean over instances)")]
    if frame["n"].nunique() > 1:
        drawn.append(
            (lambda: plots.plot_regret_vs_size(frame, against=against), "Regret against instance size")
        )
    for draw, caption in drawn:
        try:
            figs.append(_figure(draw(), caption))
        except InputError as exc:
            figs.append(f'<p class="note">{html.escape(caption)}: not drawn ({html.escape(str(exc))}).</p>')
    sections.append(_Section("Figures", "\n".join(figs)))
    return _write(out_dir, _page(f"kvsched report: {Path(db_path).name}", str(db_path), sections))
