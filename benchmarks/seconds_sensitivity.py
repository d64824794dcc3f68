"""How much a percent of machine time is worth to the seconds bounds (run by hand, not a test; issue 15).

Usage::

    python benchmarks/seconds_sensitivity.py INSTANCE [--result SOLVE.json] [--scales 1,1.01,1.02,1.05]

The seconds-based bounds (work-area, mean busy time; docs/bounds.md) treat the GPU as
one machine that does each request's least work W_j (its own terms plus a share of
the batches' fixed parts, under the best separable form of the cost model). Where the
arrivals nearly saturate that machine, total latency is a queue's: its value moves
much faster than the work. This prints, for the best form, the bounds with every
coefficient of the form multiplied by each scale (what the bound would be if every
schedule provably needed that much more machine time), and the least makespan. With
``--result`` (the ``--json`` of ``kvsched solve``) it also prints the schedule's
makespan over the least one: how much more machine time the incumbent takes than the
bound lets a schedule take. The scaled rows are not bounds (only scale 1 is); they
say how far a relaxation would have to tighten the work to close a given gap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvsched.csp.bounds.seconds import Tokens, seconds_bounds
from kvsched.csp.bounds.separable import separable_forms, tau_max
from kvsched.instances import load_instance
from kvsched.schedule.validate import instance_cost_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", type=Path)
    parser.add_argument("--result", type=Path, help="a `kvsched solve --json` result of the same instance")
    parser.add_argument("--scales", default="1,1.01,1.02,1.03,1.05,1.10")
    args = parser.parse_args(argv)
    inst = load_instance(args.instance)
    forms = separable_forms(instance_cost_model(inst), tau_max(inst))
    if not forms:
        raise SystemExit(f"{args.instance}: its cost model has no separable form (unit time or unsupported)")
    tok = Tokens.of(inst)
    # The form with the best mean-busy-time bound, and its best fixed-cost mixture.
    best, form = max(((seconds_bounds(f, tok), f) for f in forms), key=lambda r: r[0].mbt)
    result = json.loads(args.result.read_text()) if args.result else None
    table = Table(
        "scale", "mean busy time", "work-area", "least makespan", "vs scale 1", title=str(args.instance)
    )
    base = None
    for scale in (float(s) for s in args.scales.split(",")):
        scaled = form.scaled(scale)
        got = seconds_bounds(scaled, tok, mixtures=[best.mixture])
        top = max(got.mbt, got.work_area)
        base = base or top
        row = f"{got.mbt:,.1f}", f"{got.work_area:,.1f}", f"{got.makespan:,.2f}", f"{top / base - 1:+.1%}"
        table.add_row(f"{scale:.2f}", *row)
    console = Console()
    console.print(table)
    console.print(f"form: line {form.line}, mixture {best.mixture}, {len(forms)} forms")
    if result is not None:
        console.print(
            f"incumbent {result['objective']:,.1f}, makespan {result['makespan']:,.2f} = "
            f"{result['makespan'] / best.makespan:.4f} x the least makespan; its bound {result['best_bound']:,.1f}"
            f" ({result['bound_source']}), gap {result['gap']:.2%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
