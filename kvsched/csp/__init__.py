"""Exact solvers: hindsight-optimal schedules with a proven bound.

``solve(instance, ...)`` returns a :class:`Result` whose schedule has been
replayed through the semantic core.
"""

from kvsched.csp.backends import BACKENDS, SolverOptions
from kvsched.csp.result import AnytimePoint, Result, SolveStatus
from kvsched.csp.solve import solve

__all__ = ["BACKENDS", "AnytimePoint", "Result", "SolveStatus", "SolverOptions", "solve"]
