"""Fidelity of the calibrated cost models on every packaged profiling table (run by hand, not a test).

Usage::

    python benchmarks/costmodel_fidelity.py               # the summary table
    python benchmarks/costmodel_fidelity.py --markdown    # the tables of docs/costmodels.md
    python benchmarks/costmodel_fidelity.py --write       # regenerate kvsched/costmodel/coefficients/*.json

Each shipped setting (model, GPU, tensor-parallel degree) is calibrated from
the packaged Vidur tables exactly as ``kvsched calibrate`` does, and its
held-out (10-fold) relative errors are printed for every token-term form.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from kvsched.costmodel.calibrate import (
    DATA_DIR,
    PACKAGED_COMPUTE,
    SHIPPED,
    Calibration,
    calibrate,
    coefficient_name,
)
from kvsched.costmodel.coeffile import COEFFICIENT_DIR, dump_coefficients
from kvsched.costmodel.fidelity import FidelityRow


def run_all() -> list[Calibration]:
    return [calibrate(DATA_DIR / PACKAGED_COMPUTE[(m, g)], tp=tp) for m, g, tp in SHIPPED]


def pct(x: float) -> str:
    return f"{x:.1%}"


def rows_once(cals: list[Calibration]) -> list[tuple[Calibration, FidelityRow]]:
    """Every calibration's fidelity rows, a derivation check only the first time it appears.

    The check (``prefill attn (layer) tp=8, derived (...)``) is on the attention table's own model and
    GPU, the same for every target: printed under each, it would read as seven figures where there is one.
    Its row names the model and GPU checked; the first setting (Llama-2-7B on A100) is that one.
    """
    seen: set[str] = set()
    out = []
    for cal in cals:
        for r in cal.fidelity:
            if ", derived" in r.rows:
                if r.rows in seen:
                    continue
                seen.add(r.rows)
            out.append((cal, r))
    return out


def markdown(cals: list[Calibration]) -> str:
    lines = [
        "| model | GPU | tp | rows | form | n | mean | p95 | max | rows > 10% | R² |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cal, r in rows_once(cals):
        s = r.stats
        r2 = f"{r.r2:.4f}" if r.r2 == r.r2 else ""
        form = f"**{r.form}**" if r.form == cal.form else r.form
        lines.append(
            f"| {cal.model.name} | {cal.gpu.name} | {cal.tp} | {r.rows} | {form} | {s.n} | {pct(s.mean)} "
            f"| {pct(s.p95)} | {pct(s.max)} | {s.over_10pct} | {r2} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--write", action="store_true", help="rewrite the shipped coefficient files")
    args = parser.parse_args()
    t0 = time.perf_counter()
    cals = run_all()
    elapsed = time.perf_counter() - t0
    if args.write:
        for cal in cals:
            path = COEFFICIENT_DIR / coefficient_name(cal.model.name, cal.gpu.name, cal.tp)
            path.write_text(dump_coefficients(cal.document()))
            print(f"wrote {path}", file=sys.stderr)
    if args.markdown:
        print(markdown(cals))
        return 0
    table = Table(title=f"held-out relative error of the calibrated models ({elapsed:.1f} s)")
    for col in ("model", "GPU", "tp", "rows", "form", "n", "mean", "max", ">10%"):
        table.add_column(col, justify="left" if col in ("model", "GPU", "rows", "form") else "right")
    for cal, r in rows_once(cals):
        if r.form in (cal.form, "linear", "infermax+", "neighbours"):
            s = r.stats
            table.add_row(
                cal.model.name, cal.gpu.name, str(cal.tp), r.rows, r.form, str(s.n), pct(s.mean), pct(s.max),
                str(s.over_10pct),
            )  # fmt: skip
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
