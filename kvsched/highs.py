"""One place that creates and runs HiGHS instances, for every layer that solves an LP or a MILP.

HiGHS keeps one thread pool per process, and a run with another thread count
fails ("Not Set") unless the pool is reset first. Every HiGHS instance in
kvsched (the fluid bound of the policies, the exact solvers, the bounds) is made
here so that they agree. It sits at the bottom of the package so that
:mod:`kvsched.heuristics` need not import :mod:`kvsched.csp`.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading

from kvsched.stop import Deadline, wait_timeout

_threads: int | None = None  # thread count of HiGHS's process-wide pool, once started


def use_highs_threads(threads: int) -> None:
    """Make HiGHS's process-wide thread pool run ``threads`` threads (reset it if it runs another count)."""
    import highspy

    global _threads
    if _threads != threads:
        settle()  # a run left behind still uses the pool: it must not be reset under it
        # Reset on first use too: a HiGHS run elsewhere may have started the pool. On the thread that runs
        # HiGHS (run_highs): the pool belongs to it, and a reset from another thread left it "Not Set".
        _the_worker().call(lambda: highspy.Highs.resetGlobalScheduler(True))
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


class _Worker:
    """One daemon thread that runs every HiGHS run, one at a time.

    One thread, not one per run: HiGHS sets up per calling thread (a fresh thread a run cost about 10 ms,
    2.5 s over the 247 LPs of one processor-sharing bound), and its runs share one pool anyway. A daemon, so
    that a run left behind in presolve never holds up the end of the process.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = threading.Event()
        self.idle.set()
        threading.Thread(target=self._serve, name="highs", daemon=True).start()

    def _serve(self) -> None:
        while True:
            run, out, done = self.jobs.get()
            try:
                out.append(run())
            except BaseException as exc:  # handed to the caller, which raises it
                out.append(exc)
            finally:
                done.set()
                self.idle.set()

    def submit(self, run) -> tuple[list, threading.Event]:
        """Queue ``run``: its outcome lands in the list once the event is set (see :func:`_outcome`)."""
        out: list = []
        done = threading.Event()
        self.idle.clear()
        self.jobs.put((run, out, done))
        return out, done

    def call(self, run):
        """``run()`` on this thread, waited for."""
        out, done = self.submit(run)
        done.wait()
        return _outcome(out)


def _outcome(out: list):
    """What a finished job returned, or the exception it raised, raised here."""
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


_worker: _Worker | None = None


def _forget_worker() -> None:
    global _worker
    _worker = None


# A forked child has the parent's worker object but not its thread: it starts its own.
os.register_at_fork(after_in_child=_forget_worker)


def _the_worker() -> _Worker:
    global _worker
    if _worker is None:
        _worker = _Worker()
    return _worker


def settle(deadline: Deadline | None = None) -> bool:
    """Wait for a HiGHS run left behind at its deadline (see :func:`run_highs`) to stop, until ``deadline``
    at most; whether none is left."""
    if _worker is None:
        return True
    return _worker.idle.wait(wait_timeout(deadline.remaining()) if deadline is not None else None)


def busy() -> bool:
    """Whether a HiGHS run is in flight: one left behind at its deadline (:func:`run_highs`)."""
    return _worker is not None and not _worker.idle.is_set()


_wait_at_exit = True


def leave_behind_at_exit() -> None:
    """Let the process end without waiting for a run left behind (a command that ends with ``os._exit``)."""
    global _wait_at_exit
    _wait_at_exit = False


@atexit.register
def _settle_at_exit() -> None:
    # A run left behind must not be running when the interpreter shuts down: its thread, back from C++ into
    # a finalising interpreter, aborts the process ("terminate called without an active exception", exit
    # status 134; seen once in six 10 s solves of the A100 1k row, the processor-sharing LP left behind).
    # Its deadline has passed, so it stops at HiGHS's next check of its time limit or interrupt.
    if _wait_at_exit:
        settle()


def run_highs(h, deadline: Deadline, *, interrupts: bool = True):  # h: highspy.Highs -> HighsStatus | None
    """``h.run()``, over by ``deadline`` (plus :data:`OVERRUN_GRACE`) whatever HiGHS is doing.

    HiGHS's own ``time_limit`` should be set as well; this adds what it lacks. With ``interrupts`` the run
    interrupts itself from its simplex, IPM and MIP callbacks once ``deadline`` has passed or the user pressed
    Ctrl-C (a callback into Python each iteration: 15 ms a run over the small LPs of the processor-sharing
    bound, which rely on the time limit instead). Where HiGHS is in a stretch that polls neither (presolve),
    the run is left to finish in its thread and the caller gets ``None`` at the deadline: no solution and no
    bound, never a late answer; ``h`` must not be used after ``None``. A run left behind earlier is waited for
    first, until ``deadline`` at most (then ``h`` does not run: ``None``), since HiGHS runs share one pool.
    """
    stop = threading.Event()
    if interrupts:

        def check(event) -> None:
            if stop.is_set() or deadline.expired():
                event.interrupt()

        for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
            callback.subscribe(check)
    if not settle(deadline):  # an earlier run is still in its presolve at this run's deadline: no run
        return None
    out, done = _the_worker().submit(h.run)
    wait = wait_timeout(deadline.remaining() + OVERRUN_GRACE)
    try:
        finished = done.wait(wait)
    except KeyboardInterrupt:  # Ctrl-C: let HiGHS stop at its next callback, keep nothing it was doing
        stop.set()
        done.wait(OVERRUN_GRACE)
        raise
    if not finished:
        stop.set()
        return None
    return _outcome(out)
