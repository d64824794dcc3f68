"""Metamorphic checks of what a solve claims (run by hand, not a test).

Usage::

    python benchmarks/metamorphic.py --cases 60 --seed 1 --time-limit 2

Every tiny instance (n = 1..3, I and O <= 4, small M, an optional budget, blocks of 1 or 2, whole-slot or
fractional arrivals; unit time with slots of 1 or 2 s, or ``infermax-linear``; one of the three objectives) is
solved (``auto``) as drawn and in two transformed copies that change no optimum:

* ``shift``: every arrival 1e6 s later (2e6 under 2 s slots, a whole number of slots): latencies and TTFTs do
  not move, the makespan moves by the shift;
* ``perm``: the requests in another order.

Each result must agree with ``tests/brute.py``'s optimum with evictions (Dijkstra over engine states, judged
by the semantic core) moved the same way: the objective at or above it, the bound at or below it, and
``optimal`` only at it (relative 1e-7). A solve that raises counts as a failure. Prints every failure and a
last line ``cases N, failures F``; exits 1 on any failure. At 2026-11-29 this found two trust bugs (docs/bounds.md,
*Soundness campaign*): the mean-busy-time bounds differenced squares of absolute times (a ModelError, the
bound 2.5 times the optimum at arrivals near 1e6 s), and ``optimal`` was judged relative to the makespan's
absolute value (2,000,012 "optimal" where 2,000,011 exists).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kvsched as kv
from kvsched import Instance, Limits, Request, TimeModel
from tests.brute import brute_force

MODELS = ("unit", "infermax-linear", "unit2")
OBJECTIVES = ("total-latency", "makespan", "sum-ttft")


def draw(rng: np.random.Generator, k: int) -> tuple[Instance, str, float]:
    """One tiny instance, its objective and the shift that keeps its slots whole."""
    n = int(rng.integers(1, 4))
    model = MODELS[int(rng.integers(len(MODELS)))]
    reqs = []
    for i in range(n):
        whole = rng.random() < 0.7
        a = float(rng.integers(0, 3)) if whole else round(float(rng.uniform(0, 3)), 3)
        reqs.append(Request(f"r{i}", a, int(rng.integers(1, 5)), int(rng.integers(1, 5))))
    peak = max(r.prompt + r.output - 1 for r in reqs)
    kv_cap = int(rng.integers(peak, peak + 6))
    budget = int(rng.integers(1, 6)) if rng.random() < 0.4 else None
    block = 2 if rng.random() < 0.2 else 1
    kv_cap = -(-kv_cap // block) * block
    limits = Limits(kv_capacity=kv_cap, max_batch_tokens=budget, max_prefill_tokens=budget, block_size=block)
    time_model = TimeModel("unit", {"slot": 2.0}) if model == "unit2" else TimeModel(model)
    objective = OBJECTIVES[int(rng.integers(len(OBJECTIVES)))]
    shift = 2e6 if model == "unit2" else 1e6
    return Instance(tuple(reqs), limits, time_model, name=f"m{k}"), objective, shift


def check(result: kv.Result, optimum: float) -> list[str]:
    """What ``result`` claims that the optimum denies."""
    tol = 1e-7 * max(1.0, abs(optimum))
    bad = []
    if result.objective is not None and result.objective < optimum - tol:
        bad.append(f"objective {result.objective!r} below the optimum {optimum!r}")
    if result.best_bound is not None and result.best_bound > optimum + tol:
        bad.append(f"bound {result.best_bound!r} above the optimum {optimum!r}")
    if result.status == kv.SolveStatus.OPTIMAL and abs(result.objective - optimum) > tol:
        bad.append(f"'optimal' at {result.objective!r}, the optimum is {optimum!r}")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=2.0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    failures = 0
    for k in range(args.cases):
        base, objective, shift = draw(rng, k)
        order = rng.permutation(len(base.requests))
        copies = {
            "base": (base, 0.0),
            "shift": (
                replace(base, requests=tuple(replace(r, arrival=r.arrival + shift) for r in base.requests)),
                shift if objective == "makespan" else 0.0,
            ),
            "perm": (replace(base, requests=tuple(base.requests[i] for i in order)), 0.0),
        }
        started = time.perf_counter()
        optimum = brute_force(base, objective, allow_eviction=True)
        brute = time.perf_counter() - started
        for name, (inst, moved) in copies.items():
            try:
                result = kv.solve(
                    inst, objective=objective, options=kv.SolverOptions(time_limit=args.time_limit)
                )
                bad = check(result, optimum + moved)
            except Exception as exc:  # a solve that raises is a failure too, whatever it raised
                bad = [f"{type(exc).__name__}: {exc}"]
            if bad:
                failures += 1
                reqs = [(r.arrival, r.prompt, r.output) for r in inst.requests]
                print(
                    f"case {k} {name}: {objective}, {inst.time_model}, {inst.limits}, requests {reqs}: {bad}",
                    flush=True,
                )
        # One line a case, flushed: a run cut short (one brute force took 6.7 GB and most of an hour) still
        # says how far it got.
        print(f"case {k}: {objective}, optimum {optimum:.6g} (brute force {brute:.1f} s)", flush=True)
    print(f"cases {args.cases}, failures {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
