"""``kvsched warmup``: compile every numba kernel once, so that no later command pays for it.

numba caches compiled kernels on disk; the first command that needs one
compiles it (7-30 s), and a command whose ``--time-limit`` cannot afford that
runs the interpreted path or skips the stage instead (:mod:`kvsched.jit`).
This command runs each kernel family once on a tiny instance, which compiles
and caches it with the argument types every solve uses.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvsched.instances.model import Instance, Limits, Request, TimeModel


def _tiny() -> Instance:
    """Six unit-time requests in a tight KV cache: every kernel's path runs on it in milliseconds."""
    requests = tuple(Request(f"r{k}", float(k), 3 + k, 2 + k) for k in range(6))
    return Instance(requests, Limits(kv_capacity=24), TimeModel("unit"), name="warmup")


def _greedy_kernels() -> list[Any]:
    from kvsched.csp.incumbents.greedy import compiled_kernels

    return compiled_kernels()


def _greedy() -> list[Any]:
    from kvsched.csp.incumbents import greedy

    greedy(_tiny())
    return _greedy_kernels()


def _knapsack_kernels() -> list[Any]:
    from kvsched.csp.incumbents.knapsack import compiled_kernels

    return compiled_kernels()


def _knapsack() -> list[Any]:
    from kvsched.csp.incumbents.knapsack import knapsack

    knapsack(_tiny())
    return _knapsack_kernels()


def _chain_kernels() -> list[Any]:
    from kvsched.csp.bounds.chain import compiled_kernels

    return compiled_kernels("total-latency")  # every objective's


def _chain() -> list[Any]:
    from kvsched.csp.bounds import chain_lagrangian

    for objective in ("total-latency", "sum-ttft"):
        chain_lagrangian(_tiny(), objective, max_iterations=2)
    # Without a time limit the tiny instance takes the block phase; a time-limited solve of a small one
    # prices slots alone, seeded by the contiguous chains, whose kernel only this path compiles.
    chain_lagrangian(_tiny(), "total-latency", max_iterations=2, spans=())
    # Two pricings do not reach a bundle step on the block levels: compile its small problem directly.
    from kvsched.csp.bounds._bundle_kernels import simplex_qp_compiled

    simplex_qp_compiled(np.eye(2), np.zeros(2), np.full(2, 0.5), 1.0)
    return _chain_kernels()


def _seconds_kernels() -> list[Any]:
    from kvsched.csp.bounds.seconds_lagrangian import compiled_kernels

    return compiled_kernels()


def _seconds() -> list[Any]:
    from dataclasses import replace

    from kvsched.csp.bounds.chain import warm_incumbent
    from kvsched.csp.bounds.seconds_lagrangian import seconds_lagrangian

    inst = replace(_tiny(), time_model=TimeModel("infermax-linear"))
    seconds_lagrangian(inst, incumbent=warm_incumbent(inst), max_iterations=2)
    return _seconds_kernels()


#: Each kernel family: (its dispatchers, a run on a tiny instance that compiles them all and returns them).
FAMILIES: dict[str, tuple[Callable[[], list[Any]], Callable[[], list[Any]]]] = {
    "greedy": (_greedy_kernels, _greedy),
    "knapsack-greedy": (_knapsack_kernels, _knapsack),
    "chain-lagrangian": (_chain_kernels, _chain),
    "seconds-lagrangian": (_seconds_kernels, _seconds),
}


def cold_families() -> list[str]:
    """The kernel families that are neither compiled in this process nor in numba's cache."""
    from kvsched.jit import is_compiled

    return [name for name, (kernels, _) in FAMILIES.items() if not all(is_compiled(k) for k in kernels())]


def note_cold_kernels(command: str) -> None:
    """One line on stderr when a kernel family is still cold: this command may have run slower code."""
    cold = cold_families()
    if cold:
        print(
            f"kvsched {command}: note: the compiled kernels ({', '.join(cold)}) are not built yet; where "
            f"compiling them did not fit the time limit this command ran slower code or skipped that stage. "
            f"`kvsched warmup` builds them once (about 20 s).",
            file=sys.stderr,
        )


def cmd_warmup(args: argparse.Namespace) -> int:
    from kvsched.jit import is_cached

    for name, (_, run) in FAMILIES.items():
        start = time.perf_counter()
        kernels = run()
        seconds = time.perf_counter() - start
        names = ", ".join(k.py_func.__name__ for k in kernels)
        cached = all(is_cached(k) for k in kernels)
        state = "cached" if cached else "compiled, but numba could not cache it (a read-only install?)"
        print(f"{name}: {seconds:.1f} s, {state} ({names})", flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's command to the ``kvsched`` parser."""
    p = sub.add_parser(
        "warmup",
        help="compile every numba kernel once (the first solve after installing then keeps a short time limit)",
        description="Compile and cache the numba kernels (the greedy's, the chain Lagrangian's): one line per "
        "kernel family with the seconds it took. Without it, the first command that needs a kernel compiles "
        "it where its time limit allows, and takes the slower interpreted path or skips the stage otherwise.",
    )
    p.set_defaults(func=cmd_warmup)
