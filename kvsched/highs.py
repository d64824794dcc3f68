"""One place that creates HiGHS instances, for every layer that solves an LP or a MILP.

HiGHS keeps one thread pool per process, and a run with another thread count
fails ("Not Set") unless the pool is reset first. Every HiGHS instance in
kvsched (the fluid bound of the policies, the exact solvers, the bounds) is made
here so that they agree. It sits at the bottom of the package so that
:mod:`kvsched.heuristics` need not import :mod:`kvsched.csp`.
"""

from __future__ import annotations

_threads: int | None = None  # thread count of HiGHS's process-wide pool, once started


def use_highs_threads(threads: int) -> None:
    """Make HiGHS's process-wide thread pool run ``threads`` threads (reset it if it runs another count)."""
    import highspy

    global _threads
    if _threads != threads:
        # Reset on first use too: a HiGHS run elsewhere may have started the pool.
        highspy.Highs.resetGlobalScheduler(True)
    _threads = threads


def new_highs(threads: int):  # -> highspy.Highs
    """A silent HiGHS instance on ``threads`` threads, safe beside every other HiGHS run in the process."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)  # before anything else, or HiGHS prints its banner
    h.setOptionValue("threads", threads)
    use_highs_threads(threads)
    return h
