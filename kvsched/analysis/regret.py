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
(share of instances where it is the best policy, ties included), and
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


def default_against(frame: pd.DataFrame) -> str:
    """``optimum`` when the results hold solver rows that found a schedule, else ``best-policy``."""
    solved = frame[(frame["kind"] == "solver") & frame["status"].isin(_SOLVED)]
    return "optimum" if len(solved) else "best-policy"


def _text(values: pd.Series) -> str | None:
    """The distinct non-empty values of ``values``, joined (None if there are none)."""
    seen = [str(v) for v in values.dropna().unique() if str(v)]
    return ", ".join(seen) if seen else None


def _reference(group: pd.DataFrame) -> dict[str, Any]:
    solver = group[(group["kind"] == "solver") & group["status"].isin(_SOLVED)]
    lower = group["lower_bound"].dropna()
    proven = solver[solver["status"] == "optimal"]
    # A proven optimum is its own bound over its scope (the stored bound may sit below it by rounding).
    bound = pd.concat([solver["bound"].dropna(), proven["objective"].dropna()])
    return {
        "incumbent": float(solver["objective"].min()) if len(solver) else None,
        "proven": bool(len(proven)),
        "bound": float(bound.max()) if len(bound) else None,
        "lower": float(lower.max()) if len(lower) else None,
        # Rows written before scopes were stored have none: unknown, not assumed.
        "scope": _text(solver["scope"]) if "scope" in solver else None,
        "bound_source": _text(solver["bound_source"]) if "bound_source" in solver else None,
    }


def instance_regret(frame: pd.DataFrame, against: str | None = None) -> pd.DataFrame:
    """One row per (instance, policy): objective, reference, regret, regret_pct, win.

    ``frame`` is :func:`kvsched.analysis.store.load_results`'s. Policies that
    could not run an instance have NaN objective and regret, ``status = 'error'``.
    ``scope`` is the set of schedules the reference ranges over, and the three
    named regret columns of :func:`~kvsched.analysis.compare.add_regret` are
    kept where the instance has a solver row (the interval when not proven).
    """
    against = against or default_against(frame)
    if against not in AGAINST:
        raise InputError(f"--against: unknown reference {against!r} (known: {', '.join(AGAINST)})")
    parts = []
    for (ikey, objective_name), group in frame.groupby(["instance_key", "objective_name"], sort=False):
        policies = group[group["kind"] == "policy"]
        if policies.empty:
            continue
        ref = _reference(group)
        table = policies.set_index("name")[["objective", "status", "n", "kv_capacity", "seed"]].copy()
        table["objective"] = table["objective"].astype(float)
        best = table["objective"].min()
        # The named columns, against the solver's references (as kvsched compare), wherever they exist.
        add_regret(table, ref["incumbent"], ref["bound"], ref["lower"])
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
            table["regret_pct"] = np.where(
                table["reference"] > 0, 100.0 * table["regret"] / table["reference"], np.nan
            )
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
    ``max_regret_pct``, ``stability`` (std of regret_pct), ``win_rate``.
    Sorted by mean relative regret, best first.
    """
    per = instance_regret(frame, against)
    if per.empty:
        raise InputError("no policy results to aggregate (did the sweep run any policy?)")
    rows = []
    for name, g in per.groupby("name", sort=False):
        ok = g[np.isfinite(g["regret"].astype(float))]
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
                "win_rate": float(g["win"].mean()),
            }
        )
    table = pd.DataFrame(rows).set_index("policy")
    return table.sort_values(["mean_regret_pct", "mean_regret"], na_position="last")


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
    if against == "optimum":
        text += f" (proven on {int(instances['proven'].sum())} of {len(instances)} instances)"
    else:
        text += f" ({len(instances)} instances)"
    return text


def _describe_scopes(scopes: str | None) -> str:
    if scopes is None:
        return "an unrecorded scope"
    try:
        return " / ".join(Scope(s).description for s in scopes.split(", "))
    except ValueError:
        return scopes
