"""The chain Lagrangian's block levels: proximal bundle against projected subgradient (run by hand, not a test).

Usage::

    python benchmarks/dual_methods.py --folder DIR                       # the 1k and 10k rows, 60 s
    python benchmarks/dual_methods.py --folder DIR --cases azure-conv-1k-rho1-c2048 --time 30 --repeat 2

``DIR`` holds the instances of ``benchmarks/regret_scale.py`` (``python benchmarks/regret_scale.py --cases
NAME --folder DIR`` writes them). For each case, :func:`kvsched.csp.bounds.chain_lagrangian` runs alone (no
incumbent search, no other bound) for ``--time`` seconds with each block method, **both at once** in two
processes, so that each sees the same machine load; ``--repeat`` repeats the pair. One row per run: the bound
(total latency, slots), the pricings, the seconds and the 1-minute load average at its end. Every value is a
valid bound whatever the method; the method decides how high it gets in the time.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CASES = (
    "azure-conv-1k-rho1",
    "azure-conv-1k-rho1-c2048",
    "sharegpt-1k-rho1-c2048",
    "azure-code-1k-rho1-c2048",
    "azure-conv-10k-rho1-c2048",
    "sharegpt-10k-rho1",
    "azure-code-10k-rho1-c2048",
)


def run(path: str, method: str, seconds: float) -> tuple[float, int, float, float]:
    """One chain Lagrangian: its bound, pricings, seconds and the load average at its end."""
    from kvsched.csp.bounds import chain_lagrangian
    from kvsched.csp.bounds.chain import warm_incumbent
    from kvsched.instances import load_instance
    from kvsched.stop import Deadline

    instance = load_instance(path)
    trace = warm_incumbent(instance)
    result = chain_lagrangian(
        instance, incumbent=trace, deadline=Deadline.after(seconds), block_method=method
    )
    return result.bound.value, result.iterations, result.seconds, os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="the instances (NAME.json)")
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--time", type=float, default=60.0, help="seconds per run (default 60)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    from kvsched.csp.bounds.chain_blocks import METHODS

    print("| case | method | bound | pricings | seconds | load |")
    print("|---|---|---|---|---|---|")
    for case in args.cases:
        path = args.folder / f"{case}.json"
        if not path.exists():
            print(f"dual_methods: {path} is missing (benchmarks/regret_scale.py --cases {case} "
                  f"--folder {args.folder} writes it)", file=sys.stderr)  # fmt: skip
            continue
        for _ in range(args.repeat):
            with ProcessPoolExecutor(len(METHODS)) as pool:
                futures = {m: pool.submit(run, str(path), m, args.time) for m in METHODS}
                for method, future in futures.items():
                    bound, pricings, seconds, load = future.result()
                    print(f"| {case} | {method} | {bound:.6g} | {pricings} | {seconds:.1f} | {load:.1f} |",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
