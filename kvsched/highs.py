"""One place that creates HiGHS instances, for every layer that solves an LP or a MILP.

HiGHS keeps one thread pool per process, and a run with another thread count
fails ("Not Set") unless the pool is reset first. Every HiGHS instance in
kvsched (the fluid bound of the policies, the exact solvers, the bounds) is made
here so that they agree. It sits at the bottom of the package so that
:mod:`kvsched.heuristics` need not import :mod:`kvsched.csp`.
"""

from __future__ import annotations

import threading

from kvsched.stop import Deadline

_threads: int | None = None  # thread count of HiGHS's process-wide pool, once started


def use_highs_threads(threads: int) -> None:
    """Make HiGHS's process-wide thread pool run ``threads`` threads (reset it if it runs another count)."""
    import highspy

    global _threads
    if _threads != threads:
        settle()  # a run left behind still uses the pool: it must not be reset under it
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


# -- runs that end by a deadline ---------------------------------------------------------------------------

#: Seconds a HiGHS run may go on past its deadline before it is left behind. HiGHS checks its time limit
#: and its interrupt callbacks between presolve passes only (HiGHS issues #2226, #2478): one pass over the
#: batch-indexed model of 6 chunked requests (1.5M nonzeros) took 62 s on a 2-core machine.
OVERRUN_GRACE = 0.25

#: Runs left behind at their deadline, still inside a stretch that checks nothing. Each stops at its next
#: callback (it interrupts itself: its deadline has passed); the next HiGHS run in the process waits for
#: them first (:func:`settle`), since HiGHS runs share one thread pool.
_left_behind: list[threading.Thread] = []


def settle(deadline: Deadline | None = None) -> bool:
    """Wait for the HiGHS runs left behind at their deadlines (see :func:`run_highs`) to stop, until
    ``deadline`` at most; whether none is left."""
    while _left_behind:
        worker = _left_behind[-1]
        worker.join(None if deadline is None or not deadline.bounded else deadline.remaining())
        if worker.is_alive():
            return False
        _left_behind.pop()
    return True


def run_highs(h, deadline: Deadline):  # h: highspy.Highs -> highspy.HighsStatus | None
    """``h.run()``, over by ``deadline`` (plus :data:`OVERRUN_GRACE`) whatever HiGHS is doing.

    HiGHS's own ``time_limit`` should be set as well; this adds what it lacks: the run interrupts itself
    from its simplex, IPM and MIP callbacks once ``deadline`` has passed or the user pressed Ctrl-C, and
    where it is in a stretch that polls neither (presolve), it is left to finish in its thread and the
    caller gets ``None`` at the deadline: no solution and no bound, never a late answer. ``h`` must not be
    used after ``None``. A run left behind earlier is waited for first, until ``deadline`` at most (then
    ``h`` does not run: ``None``), since HiGHS runs share one thread pool.
    """
    stop = threading.Event()

    def check(event) -> None:
        if stop.is_set() or deadline.expired():
            event.interrupt()

    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        callback.subscribe(check)
    if not settle(deadline):  # an earlier run is still in its presolve at this run's deadline: no run
        return None
    done: list = []
    worker = threading.Thread(target=lambda: done.append(h.run()), name="highs", daemon=True)
    worker.start()
    wait = max(0.0, deadline.remaining()) + OVERRUN_GRACE if deadline.bounded else None
    try:
        worker.join(wait)
    except KeyboardInterrupt:  # Ctrl-C: let HiGHS stop at its next callback, keep nothing it was doing
        stop.set()
        _leave(worker)
        raise
    if done:
        return done[0]
    stop.set()
    _left_behind.append(worker)
    return None


def _leave(worker: threading.Thread) -> None:
    """After Ctrl-C: give the run the grace to stop at a callback, else leave it behind."""
    worker.join(OVERRUN_GRACE)
    if worker.is_alive():
        _left_behind.append(worker)
