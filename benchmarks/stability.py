"""Seed 001 Theorem 1 and Sec. 3: queue growth per policy and load (run by hand, not a test).

Usage::

    python benchmarks/stability.py                        # 2,000 requests, 4 seeds, the default loads
    python benchmarks/stability.py -n 6000 --rho 0.85 0.9 # longer horizon near vLLM's own limit
    python benchmarks/stability.py --c 0.020 --a 0.00025 --b0 64   # the notes' T-hinge constants

The scenario is ``tests/test_stability.py``'s: the hinge batch time
t(beta) = c + a max(0, beta - b0) with token budget b = 512, 8-token prompts,
O uniform in 2..200, Poisson arrivals at load rho = lambda (m_p + m_d) t_b / b,
unlimited memory. For each policy and load it prints, over the seeds:

* growth: mean requests in system seen by the last quarter of arrivals over
  that of the second quarter (about 1 when the queue is stable);
* queue: the last quarter's mean requests in system;
* served: tokens per second over the second half of the arrival window, as a
  share of the capacity b / t_b.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Fixed, Poisson, Uniform, synthetic
from kvsched.instances.model import Limits, TimeModel

B = 512
PROMPT, OUTPUT = 8, (2, 200)
POLICIES = {
    "sarathi": {},
    "orca": {},
    "kfcfs": {},
    "vllm-v1": {"max_num_seqs": 10**6},
    "vllm-v1 (256 seqs)": {},
    "vllm": {},
    "fastertransformer": {},
}


def one_run(name: str, rho: float, n: int, seed: int, hinge: dict[str, float]) -> tuple[float, float, float]:
    t_b = hinge["c"] + hinge["a"] * max(0.0, B - hinge["b0"])
    capacity = B / t_b
    tokens = PROMPT + (OUTPUT[0] + OUTPUT[1]) / 2 - 1
    inst = synthetic(
        n,
        seed,
        Limits(kv_capacity=10**9, max_batch_tokens=B),
        TimeModel("hinge", hinge),
        arrival=Poisson(rho * capacity / tokens),
        prompt=Fixed(PROMPT),
        output=Uniform(*OUTPUT),
    )
    result = simulate(inst, make_policy(name.split(" ")[0], **POLICIES[name]))
    state = result.trace.state
    arrival = np.sort(state.arrival)
    q = np.searchsorted(arrival, arrival, side="right") - np.searchsorted(
        np.sort(state.completion), arrival, side="right"
    )
    k = q.size // 4
    end = arrival[-1]
    late = [b for b in result.schedule if end / 2 <= b.start and b.end <= end]
    served = sum(int(b.tokens.sum()) for b in late) / (late[-1].end - late[0].start) / capacity
    return float(q[3 * k :].mean() / q[k : 2 * k].mean()), float(q[3 * k :].mean()), served


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=2000, help="requests per run (default 2000)")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9, 1.2])
    parser.add_argument("--c", type=float, default=0.030, help="hinge: time of any batch up to b0 (s)")
    parser.add_argument("--a", type=float, default=0.0002, help="hinge: time per token above b0 (s)")
    parser.add_argument("--b0", type=float, default=128.0, help="hinge: knee (tokens)")
    parser.add_argument("-p", "--policy", action="append", choices=list(POLICIES), help="repeatable")
    args = parser.parse_args(argv)
    hinge = {"c": args.c, "a": args.a, "b0": args.b0}
    t_b = args.c + args.a * max(0.0, B - args.b0)
    console = Console(width=160)
    console.print(
        f"hinge c={args.c:g} s, a={args.a:g} s/token, b0={args.b0:g}; b={B}, t_b={t_b:.4g} s, capacity {B / t_b:,.0f} tokens/s"
    )
    table = Table("rho", "policy", "growth (min..max)", "queue (mean)", "served / capacity (mean)")
    for rho in args.rho:
        for name in args.policy or list(POLICIES):
            runs = np.array([one_run(name, rho, args.n, seed, hinge) for seed in range(args.seeds)])
            table.add_row(
                f"{rho:g}",
                name,
                f"{runs[:, 0].min():.2f}..{runs[:, 0].max():.2f}",
                f"{runs[:, 1].mean():,.0f}",
                f"{runs[:, 2].mean():.3f}",
            )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
