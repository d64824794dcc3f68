"""Seed 003 Sec. 5.1 / Figure 15: can evictions be optimal? (run by hand, not a test).

Usage::

    python benchmarks/reproduce_figure15.py [--time-limit 60] [--prompts 1,2,4,...,1024]

B = 4 requests of prompt I and output O = 4, all at t = 0, M = max(2I, I + O - 1)
(two prefills fit, only one request can keep its KV to its last token), total
latency under InferMax's linear cost model (``infermax-linear``, its default
coefficients for Llama-2-7B on an A100). For each I the batch-indexed model is
solved twice, with and without evictions, next to vLLM (evicts) and vLLM-EF.

The paper: for I <= 32 the optimum evicts, up to 17% below the eviction-free
schedules; for I >= 64 it avoids evictions, up to 40% below evicting ones;
vLLM is close to the optimum for small I and vLLM-EF for large I.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from kvsched.csp import SolverOptions, solve
from kvsched.csp.objectives import objective_function
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import figure15_limits, infermax_grid
from kvsched.instances.model import TimeModel
from kvsched.schedule.validate import replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--solver", default="highs", help="highs, cbc or cpsat (times scaled to integers exactly)"
    )
    parser.add_argument("--prompts", default="1,2,4,8,16,32,64,128,256,512,1024")
    args = parser.parse_args(argv)
    options = SolverOptions(time_limit=args.time_limit, threads=args.threads)
    latency = objective_function("total-latency")
    table = Table(title="Figure 15: total latency (s), B = O = 4, M = max(2I, I+O-1), infermax-linear")
    for col in (
        "I",
        "opt evict",
        "evictions",
        "opt no-evict",
        "evict gain",
        "vllm",
        "vllm-ef",
        "vllm over best",
        "status (evict / no-evict)",
        "s",
    ):
        table.add_column(col, justify="right")
    for prompt in (int(p) for p in args.prompts.split(",")):
        inst = infermax_grid(prompt, 4, 4, figure15_limits(prompt, 4), TimeModel("infermax-linear"))
        t0 = time.perf_counter()
        evict, no_evict = (
            solve(inst, formulation="batch", solver=args.solver, options=options, allow_eviction=allow)
            for allow in (True, False)
        )
        vllm, vllm_ef = (
            latency(replay(inst, simulate(inst, make_policy(name)).schedule)) for name in ("vllm", "vllm-ef")
        )
        best = min(evict.objective, no_evict.objective)
        table.add_row(
            str(prompt),
            f"{evict.objective:.4f}",
            str(evict.stats["evictions"]),
            f"{no_evict.objective:.4f}",
            f"{100 * (1 - evict.objective / no_evict.objective):.1f}%",
            f"{vllm:.4f}",
            f"{vllm_ef:.4f}",
            f"{100 * (vllm / best - 1):.1f}%",
            f"{evict.status} ({100 * (evict.gap or 0):.1f}%) / {no_evict.status} ({100 * (no_evict.gap or 0):.1f}%)",
            f"{time.perf_counter() - t0:.0f}",
        )
        Console().print(f"I = {prompt} done", highlight=False)
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
