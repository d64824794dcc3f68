"""``kvsched warmup``: compile every numba kernel once, so that no later command pays for it.

numba caches compiled kernels on disk; the first command that needs one
compiles it (7-30 s), and a command whose ``--time-limit`` cannot afford that
runs the interpreted path or skips the stage instead (:mod:`kvsched.jit`).
This command runs each kernel family once on a tiny instance, which compiles
and caches it with the argument types every solve uses.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kvsched.instances.model import Instance, Limits, Request, TimeModel


def _tiny() -> Instance:
    """Six unit-time requests in a tight KV cache: every kernel's path runs on it in milliseconds."""
    requests = tuple(Request(f"r{k}", float(k), 3 + k, 2 + k) for k in range(6))
    return Instance(requests, Limits(kv_capacity=24), TimeModel("unit"), name="warmup")


def _greedy() -> list[Any]:
    from kvsched.csp.incumbents import _kernel, greedy

    greedy(_tiny())
    return [_kernel.advance_jit]


def _chain() -> list[Any]:
    from kvsched.csp.bounds import chain_lagrangian
    from kvsched.csp.bounds.chain import compiled_kernels

    for objective in ("total-latency", "sum-ttft"):
        chain_lagrangian(_tiny(), objective, max_iterations=2)
    return compiled_kernels("sum-ttft")


#: Each kernel family: (what uses it, a run that compiles it and returns its dispatchers).
FAMILIES: dict[str, tuple[str, Callable[[], list[Any]]]] = {
    "greedy": ("the first schedule of every solve, the incumbents, the local search", _greedy),
    "chain-lagrangian": ("the chain Lagrangian bound (certified pipeline, unit time)", _chain),
}


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
