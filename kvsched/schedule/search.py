"""One search the core and the policies share: how many more steps of a growing demand still fit."""

from __future__ import annotations

from collections.abc import Callable


def last_fitting(grown: Callable[[int], int], free: int, limit: int) -> int:
    """The largest ``k <= limit`` with ``grown(k) <= free``, for ``grown`` non-decreasing with ``grown(0) <= free``.

    The core's :meth:`~kvsched.schedule.core.EngineState.run_limit` (``grown(k)``: the blocks a run's
    decodes add over ``k`` batches) and a reservation-keeping policy's
    :meth:`~kvsched.heuristics.base.SteadyDecodes.repeat_decodes` (the memory its decodes reserve).
    """
    if grown(limit) <= free:
        return limit
    lo, hi = 0, limit  # grown(lo) <= free < grown(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if grown(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo
