"""Admission control for the greedy: a cap on the requests holding KV, searched per instance.

Under a seconds-based cost model every request in a batch waits through all of it, and a batch's
decode attention grows with the KV its requests hold. A greedy that admits whatever the memory
takes keeps many requests in the system at once, all advancing one token per long batch; a cap on
the requests holding KV (the greedy's ``running_cap``) lets fewer share each batch, so the admitted
ones finish sooner, at the price of more batches (each pays the fixed part) and so less throughput.
Which side wins depends on the instance: on the A100 Azure conversation rows of
docs/regret_scale.md a cap of 64 takes 3% off the 1k row's greedy and every cap tried loses on the
10k row, whose queue is long enough for the throughput to dominate. So the cap is not a constant:
:func:`running_cap_search` walks a geometric grid down from the uncapped schedule's peak and keeps
whatever the replayed objective says is best (the uncapped schedule included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvsched.csp.incumbents.base import Incumbent
from kvsched.schedule.validate import Trace

#: Ratio of consecutive caps on the grid (four per halving).
RATIO = 2.0**-0.25
#: No cap below this many requests (a batch of fewer pays its fixed part for too little).
LOWEST = 4


def peak_running(trace: Trace) -> int:
    """The most requests holding KV during any batch of a replayed schedule (what a cap must undercut)."""
    peak = 0
    for entry in trace.entries:
        peak = max(peak, int(entry.num_running))
        tail = getattr(entry, "tail", None)
        if tail is not None:
            peak = max(peak, int(tail.num_running))
    return peak


def cap_grid(peak: int, ratio: float = RATIO, lowest: int = LOWEST) -> Iterator[int]:
    """Caps below ``peak``, largest first: ``round(peak * ratio**k)`` for k = 1, 2, ..., distinct, >= ``lowest``."""
    last = peak
    k = 1
    while True:
        cap = round(peak * ratio**k)
        k += 1
        if cap >= last:
            cap = last - 1
        if cap < lowest:
            return
        last = cap
        yield cap


def running_cap_search(
    start: Incumbent,
    peak: int,
    run: Callable[[int], Incumbent],
    fits: Callable[[], bool],
    tried: dict[str, float] | None = None,
) -> Incumbent:
    """The best of ``start`` (uncapped) and ``run(cap)`` down :func:`cap_grid` of ``peak``.

    The walk goes down while each cap beats the best so far and stops at the first that does not
    (or when ``fits()`` says no further run fits the time left); then the geometric midpoints on either
    side of the best cap are tried once. ``run(cap)`` makes a complete schedule with that cap (its
    value the objective of that schedule); every value is recorded in ``tried`` by the incumbent's name.
    """
    best, best_cap = start, 0
    seen: set[int] = set()

    def attempt(cap: int) -> bool:
        nonlocal best, best_cap
        seen.add(cap)
        cand = run(cap)
        if tried is not None:
            tried[cand.name] = cand.value
        if cand.value < best.value:
            best, best_cap = cand, cap
            return True
        return False

    for cap in cap_grid(peak):
        if not fits() or not attempt(cap):
            break
    if best_cap:
        for cap in (round(best_cap / RATIO**0.5), round(best_cap * RATIO**0.5)):
            if LOWEST <= cap < peak and cap not in seen and fits():
                attempt(cap)
    return best
