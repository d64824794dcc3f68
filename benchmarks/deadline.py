"""Is ``--time-limit`` a wall-clock limit? (run by hand, not a test; issue 14's benchmark)

Usage::

    python benchmarks/deadline.py                                   # every size, 10 s limit
    python benchmarks/deadline.py --sizes 200,1000 --limit 5 --formulations auto,time
    # any instance or trace, with solve's own options (the 100k Azure trace of benchmarks/simulate.py's
    # azure-100k case under the A100 fit, where a 60 s solve once took 113 s)
    python benchmarks/deadline.py --instance azure-100k.csv --formulations auto --limit 60 \
        --solve-args "--kv-capacity 125885 -C 512 --cost-model llama-2-7b_a100-80gb_tp1"
    # kvsched compare (every policy, then the solve) instead: its policies count against the same limit
    python benchmarks/deadline.py --command compare --instance ac10k-a100.json --formulations auto --limit 10

Each row runs ``kvsched solve`` as its own process (parsing, bounds, warm
starts, model building, solving, decoding, validation, writing the result: what
a user waits for) on ShareGPT requests with Poisson arrivals (rate 0.5 per slot,
whole-slot ticks, M = 20,000: issue 14's instances), and prints the limit, the
wall time, their ratio, and what the result claims: status, objective, bound,
bound source and scope. A row passes when the wall time is within
``limit + max(1 s, 5% of limit)`` and the command wrote a result. ``loaded s``
and ``solved s`` say when (seconds since the command started) the instance was
loaded and the solve returned: the rest of the wall time is the output (the
schedule's metrics and the JSON document).

The machine's load changes every wall time: report the ratio with the load
(``os.getloadavg``) printed under the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

SOLVERS = ("highs", "cbc", "cpsat")


def generate(n: int, folder: Path) -> Path:
    path = folder / f"sharegpt-poisson-{n}.json"
    if not path.exists():
        subprocess.run(
            [
                sys.executable, "-m", "kvsched.cli", "generate", "sharegpt", "--n", str(n), "--seed", "0",
                "--param", "arrival=poisson", "--param", "rate=0.5", "--param", "tick=1", "-M", "20000",
                "-o", str(path),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return path


def run(
    instance: Path,
    formulation: str,
    solver: str,
    limit: float,
    folder: Path,
    extra: list[str] | None = None,
    command: str = "solve",
) -> dict:
    out = folder / f"{instance.stem}-{command}-{formulation}-{solver}.result.json"
    args = [sys.executable, "-m", "kvsched.cli", command, str(instance), "--formulation", formulation]
    args += ["--solver", solver, "--time-limit", str(limit), "--json", str(out), *(extra or [])]
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=20 * limit + 120)
    wall = time.monotonic() - start
    doc = json.loads(out.read_text()) if out.exists() else {}
    if command == "compare":  # the solver's row: the comparison's result (null when it had none)
        doc = doc.get("result") or {}
    return {"wall": wall, "rc": proc.returncode, "doc": doc, "error": proc.stderr.strip().splitlines()[-1:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="200,1000,3000,10000,100000")
    parser.add_argument("--limit", type=float, default=10.0)
    parser.add_argument("--formulations", default="auto,time,batch")
    parser.add_argument("--solvers", default=",".join(SOLVERS))
    parser.add_argument("--folder", default=None, help="where instances and results go (default: a temp dir)")
    parser.add_argument(
        "--instance",
        action="append",
        default=[],
        help="an instance or trace file instead of --sizes (repeatable)",
    )
    parser.add_argument(
        "--solve-args", default="", help="more options for kvsched solve, e.g. a trace's limits"
    )
    parser.add_argument(
        "--command", choices=("solve", "compare"), default="solve", help="the command timed (default solve)"
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="kvsched-deadline-"))
    folder.mkdir(parents=True, exist_ok=True)
    console = Console(width=180)
    table = Table(title=f"kvsched {args.command} --time-limit {args.limit:g}: wall time of the whole command")
    for col in ("case", "formulation", "solver", "limit s", "wall s", "wall/limit", "ok", "loaded s", "solved s",
                "status", "objective", "bound", "bound source", "scope", "gap"):  # fmt: skip
        table.add_column(col, justify="right" if col not in ("formulation", "solver", "status") else "left")
    failures = 0
    extra = shlex.split(args.solve_args)
    if args.instance:
        cases = [(Path(p).stem, Path(p)) for p in args.instance]
    else:
        cases = [(str(n), generate(n, folder)) for n in (int(s) for s in args.sizes.split(","))]
    for n, inst in cases:
        for formulation in args.formulations.split(","):
            small = n.isdigit() and int(n) <= 12
            solvers = ["highs"] if formulation == "auto" and not small else args.solvers.split(",")
            for solver in solvers:
                got = run(inst, formulation, solver, args.limit, folder, extra, args.command)
                doc = got["doc"]
                grace = max(1.0, 0.05 * args.limit)
                ok = got["rc"] in (0, 2) and got["wall"] <= args.limit + grace and (doc or got["rc"] == 2)
                failures += not ok
                gap = doc.get("gap")
                at = doc.get("command_seconds", {})  # seconds since start: instance loaded, solve returned
                table.add_row(
                    n,
                    doc.get("formulation", formulation),
                    solver,
                    f"{args.limit:g}",
                    f"{got['wall']:.2f}",
                    f"{got['wall'] / args.limit:.2f}",
                    "yes" if ok else "NO",
                    *(f"{at[k]:.1f}" if k in at else "-" for k in ("loaded", "solved")),
                    doc.get("status", f"exit {got['rc']}: {' '.join(got['error'])[:40]}"),
                    f"{doc['objective']:.6g}" if doc.get("objective") is not None else "-",
                    f"{doc['best_bound']:.6g}" if doc.get("best_bound") is not None else "-",
                    str(doc.get("bound_source") or "-"),
                    str(doc.get("scope") or "-"),
                    "-" if gap is None else f"{100 * gap:.2f}%",
                )
                console.print(f"  done: n={n} {formulation}/{solver} in {got['wall']:.1f} s", highlight=False)
    console.print(table)
    load = os.getloadavg()
    console.print(
        f"load average (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores"
    )
    console.print(f"{failures} row(s) over limit + grace or without a result; results in {folder}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
