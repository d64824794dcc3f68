"""Exact solvers: hindsight-optimal schedules with a proven bound.

``solve(instance, ...)`` returns a :class:`Result` whose schedule has been
replayed through the semantic core, whose bound is proven, and whose ``scope``
says which schedules the optimum ranges over.
"""

from kvsched.csp.backends import BACKENDS, SolverOptions
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.certify import ModelError
from kvsched.csp.driver import FORMULATIONS, solve
from kvsched.csp.result import AnytimePoint, Result, SolveStatus
from kvsched.stop import Deadline

__all__ = [
    "BACKENDS",
    "FORMULATIONS",
    "AnytimePoint",
    "Bound",
    "Deadline",
    "ModelError",
    "Result",
    "Scope",
    "SolveStatus",
    "SolverOptions",
    "solve",
]
