"""Regret tables from a results database: per instance, then per policy.

Per instance (rows sharing ``instance_key`` and ``objective_name``) the policy
rows form a table of objectives, and :func:`kvsched.analysis.compare.add_regret`
(the same definition ``kvsched compare`` uses) adds the regret columns against
the instance's solver rows and bounds. The reference is one of:

* ``optimum``: the solver's incumbent (the optimum over its ``scope`` when its
  status is ``optimal``; the best schedule found otherwise), as
  ``kvsched compare``'s ``regret_vs_solver``;
* ``bound``: the solver's proven bound over its scope
  (``max_regret_vs_scope_bound``: regret against that scope's optimum can be
  no larger);
* ``certified``: the best bound valid for every legal schedule
  (``max_regret_vs_all_schedules``);
* ``best-policy``: the best policy on the instance (no solver needed).

Each per-instance row carries the ``scope`` its reference ranges over (the
solver's scope, ``all`` for ``certified``, none for ``best-policy``) and the
solver's ``bound_source``; per policy, ``scopes`` lists the scopes met.

Per policy, over the instances it ran on: mean, median and max of the relative
regret (percent of the reference), the mean absolute regret, the *win rate*
(share of the instances it ran on where it is the best policy, ties included), and
*stability*: the standard deviation of its relative regret across instances
(lower is steadier).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvsched.analysis.compare import MAX_REGRET_ALL, MAX_REGRET_SCOPE, REGRET, add_regret
from kvsched.csp.certificate import Scope
from kvsched.errors import InputError

AGAINST = ("optimum", "bound", "certified", "best-policy")
#: Relative tolerance for ties (win rate).
TIE_RTOL = 1e-9
_SOLVED = ("optimal", "feasible")
_COLUMN = {"optimum": REGRET, "bound": MAX_REGRET_SCOPE, "certified": MAX_REGRET_ALL}
#: Relative tolerance of a bound above a schedule's value (floating-point noise, not a contradiction).
BOUND_RTOL = 1e-9


#: The columns the regret functions read (every :func:`kvsched.analysis.store.load_results` frame has them).
_NEEDED = ("kind", "name", "status", "objective", "instance_key", "objective_name", "lower_bound", "bound")


def _expect_results(frame: Any, name: str = "frame") -> pd.DataFrame:
    """``frame`` if it is a results frame, else one :class:`InputError` naming the argument."""
    if not isinstance(frame, pd.DataFrame):
        raise InputError(
            f"{name}: expected a results DataFrame (kvsched.analysis.store.load_results), "
            f"got {type(frame).__name__}"
        )
    missing = [c for c in _NEEDED if c not in frame.columns]
    if missing:
        raise InputError(f"{name}: not a results frame (no column {', '.join(missing)})")
    return frame


def default_against(frame: pd.DataFrame) -> str:
    """``optimum`` when the results hold solver rows that found a schedule, else ``best-policy``."""
    solved = frame[(frame["kind"] == "solver") & frame["status"].isin(_SOLVED)]
    return "optimum" if len(solved) else "best-policy"


def select_objective(frame: pd.DataFrame, objective: str | None = None) -> pd.DataFrame:
    """The rows of ``frame`` measured in one objective.

    With ``objective`` None, ``frame`` itself when it holds at most one objective; several are refused,
    since averaging (say) summed latency with makespan gives a number that measures nothing.
    """
    objectives = [str(o) for o in frame["objective_name"].dropna().unique()]
    if objective:
        chosen = frame[frame["objective_name"] == objective]
        if chosen.empty:
            known = ", ".join(objectives) or "none"
            raise InputError(f"--objective: no rows measured in {objective!r} (objectives: {known})")
        return chosen
    if len(objectives) > 1:
        raise InputError(
            f"the database holds several objectives ({', '.join(objectives)}): choose one with --objective"
        )
    return frame


def _text(values: pd.Series) -> str | None:
    """The distinct non-empty values of ``values``, joined (None if there are none)."""
    seen = [str(v) for v in values.dropna().unique() if str(v)]
    return ", ".join(seen) if seen else None


def _scope_rank(scope: Any) -> int:
    """Order of preference of a solver row's scope: the widest first, an unrecorded one last."""
    try:
        return Scope(scope).rank
    except ValueError:
        return len(Scope)


def _reference(group: pd.DataFrame) -> dict[str, Any]:
    """The solver's references on one instance, all taken from the solver rows of one scope.

    Rows of different scopes (the solver rerun with another formulation) answer different questions:
    the lowest value of one and the highest bound of another need not bracket anything, so the rows of
    the widest scope that found a schedule supply the incumbent, the bound and ``proven`` together.
    Within one scope every row's bound holds for every row's schedule, so the lowest value and the
    highest bound are consistent, and an optimal row's value is that scope's optimum.
    """
    solved = group[(group["kind"] == "solver") & group["status"].isin(_SOLVED)]
    lower = group["lower_bound"].dropna()
    solver = solved
    if len(solved) and "scope" in solved:
        # Rows written before scopes were stored have none: their own scope, ranked after every known one.
        scopes = solved["scope"].astype(object).where(solved["scope"].notna(), None)
        ranks = scopes.map(_scope_rank)
        solver = solved[ranks == ranks.min()]
        if solver["scope"].isna().any() and solver["scope"].notna().any():
            solver = solver[solver["scope"].notna()]
    proven = solver[solver["status"] == "optimal"]
    # A proven optimum is its own bound over its scope (the stored bound may sit below it by rounding).
    bound = pd.concat([solver["bound"].dropna(), proven["objective"].dropna()])
    return {
        "incumbent": float(solver["objective"].min()) if len(solver) else None,
        "proven": bool(len(proven)),
        "bound": float(bound.max()) if len(bound) else None,
        "lower": float(lower.max()) if len(lower) else None,
        "scope": _text(solver["scope"]) if "scope" in solver else None,
        "bound_source": _text(solver["bound_source"]) if "bound_source" in solver else None,
    }


def _origin(group: pd.DataFrame, objective_name: Any) -> float:
    """The time one instance's objective counts from: its first arrival for the makespan (an absolute time;
    :func:`~kvsched.csp.objectives.objective_origin`), read off its rows' metrics as the makespan less the
    serving duration (which runs from the first arrival); 0 for the other objectives, and for rows that
    recorded no duration (written before serving metrics were stored)."""
    if objective_name != "makespan":
        return 0.0
    columns = [
        next((c for c in (name, f"metric_{name}") if c in group), None) for name in ("makespan", "duration")
    ]
    if None in columns:
        return 0.0
    origins = (group[columns[0]].astype(float) - group[columns[1]].astype(float)).dropna()
    return float(origins.median()) if len(origins) else 0.0


def _check_bounds(group: pd.DataFrame, ikey: Any, objective_name: Any, source: str) -> None:
    """Refuse a bound above the value of a validated schedule it covers (one instance and objective).

    Such a bound is impossible (the database was edited or damaged) and every regret against it
    would be false, e.g. negative "against a bound valid for every schedule". A bound over every
    legal schedule (``lower_bound``, or a solver's ``bound`` of scope ``all``) covers every policy
    and solver schedule. A solver's bound over a narrower scope covers only the solver schedules
    of that scope: a policy may evict or chunk and so beat the contiguous optimum, which is no
    contradiction. A row of unrecorded scope is held to its own schedule only.
    """
    solved = group[(group["kind"] == "solver") & group["status"].isin(_SOLVED)]
    ran = group[(group["kind"] == "policy") & (group["status"] == "ok")]
    scope = solved["scope"] if "scope" in solved else pd.Series(None, index=solved.index, dtype=object)
    # (bound, its column, the row holding it, the schedules it covers) for every stored bound.
    checks: list[tuple[float, str, Any, pd.DataFrame]] = []
    everything = pd.concat([solved, ran])
    for idx, value in group["lower_bound"].dropna().items():
        checks.append((float(value), "lower_bound", group.at[idx, "key"], everything))
    for idx, value in solved["bound"].dropna().items():
        if scope[idx] == "all":
            covers = everything
        elif pd.notna(scope[idx]):
            covers = solved[scope == scope[idx]]
        else:
            covers = solved.loc[[idx]]
        checks.append((float(value), "bound", solved.at[idx, "key"], covers))
    for bound, column, key, covers in checks:
        values = covers["objective"].astype(float)
        values = values[np.isfinite(values)]
        if values.empty:
            continue
        lowest = values.idxmin()
        value = float(values[lowest])
        if bound > value and not math.isclose(bound, value, rel_tol=BOUND_RTOL):
            raise InputError(
                f"{source}: instance {ikey} ({objective_name}): {column} {bound:.10g} of row {key} is above "
                f"the objective {value:.10g} of row {covers.at[lowest, 'key']} ({covers.at[lowest, 'name']}, "
                "a validated schedule it covers): impossible, so no regret against it would be true "
                "(a damaged or hand-edited database?)"
            )


def instance_regret(frame: pd.DataFrame, against: str | None = None) -> pd.DataFrame:
    """One row per (instance, policy): objective, reference, regret, regret_pct, win.

    ``frame`` is :func:`kvsched.analysis.store.load_results`'s. Policies that
    could not run an instance have NaN objective and regret, ``status = 'error'``.
    ``scope`` is the set of schedules the reference ranges over, and the three
    named regret columns of :func:`~kvsched.analysis.compare.add_regret` are
    kept where the instance has a solver row (the interval when not proven).

    Raises :class:`InputError` naming the database (``frame.attrs["source"]``),
    the instance and both rows when a stored bound lies above a validated
    schedule it covers (see :func:`_check_bounds`).
    """
    frame = _expect_results(frame)
    against = against or default_against(frame)
    if against not in AGAINST:
        raise InputError(f"--against: unknown reference {against!r} (known: {', '.join(AGAINST)})")
    source = str(frame.attrs.get("source", "results"))
    parts = []
    for (ikey, objective_name), group in frame.groupby(["instance_key", "objective_name"], sort=False):
        policies = group[group["kind"] == "policy"]
        if policies.empty:
            continue
        _check_bounds(group, ikey, objective_name, source)
        ref = _reference(group)
        table = policies.set_index("name")[["objective", "status", "n", "kv_capacity", "seed"]].copy()
        table["objective"] = table["objective"].astype(float)
        best = table["objective"].min()
        # The named columns, against the solver's references (as kvsched compare), wherever they exist.
        origin = _origin(group, objective_name)
        add_regret(table, ref["incumbent"], ref["bound"], ref["lower"], origin=origin)
        if against == "best-policy":
            reference = None if math.isnan(best) else float(best)
            table["regret"] = table["objective"] - best
        else:
            reference = {"optimum": ref["incumbent"], "bound": ref["bound"], "certified": ref["lower"]}[
                against
            ]
            column = _COLUMN[against]
            table["regret"] = table[column] if column in table.columns else np.nan
        table["reference"] = np.nan if reference is None else reference
        table["scope"] = {"best-policy": None, "certified": "all"}.get(against, ref["scope"])
        table["bound_source"] = ref["bound_source"]
        with np.errstate(divide="ignore", invalid="ignore"):
            span = table["reference"] - origin
            table["regret_pct"] = np.where(span > 0, 100.0 * table["regret"] / span, np.nan)
        tol = TIE_RTOL * max(1.0, abs(best)) if not math.isnan(best) else 0.0
        table["win"] = table["objective"] <= best + tol
        table["proven"] = ref["proven"]
        table["instance_key"] = ikey
        table["objective_name"] = objective_name
        parts.append(table[[c for c in _INSTANCE_COLUMNS if c in table.columns]].reset_index())
    if not parts:
        return pd.DataFrame(columns=["name", *_INSTANCE_COLUMNS])
    return pd.concat(parts, ignore_index=True)


_INSTANCE_COLUMNS = (
    "instance_key",
    "objective_name",
    "n",
    "kv_capacity",
    "seed",
    "status",
    "objective",
    "reference",
    "scope",
    "regret",
    "regret_pct",
    REGRET,
    MAX_REGRET_SCOPE,
    MAX_REGRET_ALL,
    "bound_source",
    "win",
    "proven",
)


def regret_table(frame: pd.DataFrame, against: str | None = None) -> pd.DataFrame:
    """Per policy (index ``policy``): regret statistics over every instance it faced.

    Columns: ``scopes`` (the sets of schedules the references range over),
    ``instances`` (with a finite regret), ``failed`` (could not run),
    ``mean_regret``, ``mean_regret_pct``, ``median_regret_pct``,
    ``max_regret_pct``, ``stability`` (std of regret_pct), ``win_rate`` (share of the
    instances the policy ran on where it is the best policy, ties counting for each; NaN
    if it ran on none). Sorted by ``failed``, then mean relative regret, best first.
    """
    per = instance_regret(frame, against)
    if per.empty:
        raise InputError("no policy results to aggregate (did the sweep run any policy?)")
    rows = []
    for name, g in per.groupby("name", sort=False):
        ok = g[np.isfinite(g["regret"].astype(float))]
        # Wins are counted over the instances the policy ran on: where it failed, or where every
        # policy failed, there is no result of its to compare (its failures are in "failed").
        ran = g[np.isfinite(g["objective"].astype(float))]
        pct = ok["regret_pct"].astype(float).dropna()
        rows.append(
            {
                "policy": name,
                "scopes": _text(g["scope"]) or "-",
                "instances": len(ok),
                "failed": int((g["status"] == "error").sum()),
                "mean_regret": float(ok["regret"].mean()) if len(ok) else np.nan,
                "mean_regret_pct": float(pct.mean()) if len(pct) else np.nan,
                "median_regret_pct": float(pct.median()) if len(pct) else np.nan,
                "max_regret_pct": float(pct.max()) if len(pct) else np.nan,
                "stability": float(pct.std(ddof=0)) if len(pct) else np.nan,
                "win_rate": float(ran["win"].mean()) if len(ran) else np.nan,
            }
        )
    table = pd.DataFrame(rows).set_index("policy")
    # Fewest failures first: a policy that failed on most instances must not rank first on the few
    # it ran (its regret there says nothing about the others). Stable, so ties keep the input order.
    return table.sort_values(["failed", "mean_regret_pct", "mean_regret"], na_position="last", kind="stable")


def describe_reference(frame: pd.DataFrame, against: str) -> str:
    """A short title for the reference, e.g. ``vs optimum (proven on 23 of 24 instances)``."""
    per = instance_regret(frame, against)
    instances = per.drop_duplicates("instance_key")
    text = {
        "optimum": "vs the solver's optimum",
        "bound": "vs the solver's proven bound",
        "certified": "vs a bound valid for every schedule",
        "best-policy": "vs the best policy on each instance",
    }[against]
    if against in ("optimum", "bound"):
        scopes = _text(instances["scope"]) if len(instances) else None
        text += f" over {_describe_scopes(scopes)}"
    # Instances where every run failed (an infeasible one) have no reference: counted apart, not as measured.
    known = int(instances["reference"].notna().sum()) if len(instances) else 0
    without = f"; {len(instances) - known} without a reference" if known < len(instances) else ""
    if against == "optimum":
        text += f" (proven on {int(instances['proven'].sum())} of {known} instances{without})"
    else:
        text += f" ({known} instances{without})"
    return text


def _describe_scopes(scopes: str | None) -> str:
    if scopes is None:
        return "an unrecorded scope"
    try:
        return " / ".join(Scope(s).description for s in scopes.split(", "))
    except ValueError:
        return scopes
