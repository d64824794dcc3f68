"""Settings shared by every back end, and what a back end returns."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.csp.result import AnytimePoint, SolveStatus


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """Limits and settings shared by every back end.

    Parameters
    ----------
    time_limit
        Wall-clock seconds for the whole solve (``solve()`` turns it into one
        :class:`~kvsched.stop.Deadline` unless it is handed one).
    threads
        Threads (HiGHS, CBC) or workers (CP-SAT).
    gap
        Relative gap at which to stop (0: prove optimality). A solve stopped at
        a positive gap is reported ``feasible`` with its bound, never ``optimal``.
    seed
        Random seed where the solver takes one.
    log
        Print the solver's own log.
    """

    time_limit: float = 60.0
    threads: int = 2
    gap: float = 0.0
    seed: int = 0
    log: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class RawSolution:
    """What a back end returns, in the model's units.

    Parameters
    ----------
    status
        The back end's own verdict on the *model*: OPTIMAL only when it proved
        optimality at the gap it was given.
    x
        The best solution's values (None without one).
    objective
        The model objective of ``x``.
    bound
        A **proven** lower bound on the model's optimum, or None. Each back end
        reads its dual bound only where its documentation makes it a proof
        (see each module); a bound it cannot vouch for is dropped, never guessed.
    runtime
        Seconds the back end ran.
    anytime
        Incumbent and bound over time, where the back end reports them.
    stopped
        Why it stopped early: ``"deadline"``, ``"interrupted"`` or ``""``.
    """

    status: SolveStatus
    x: np.ndarray | None
    objective: float | None
    bound: float | None
    runtime: float
    anytime: tuple[AnytimePoint, ...] = ()
    stopped: str = ""

    def __post_init__(self) -> None:
        if self.bound is not None and not math.isfinite(self.bound):
            object.__setattr__(self, "bound", None)
