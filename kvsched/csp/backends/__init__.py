"""Back ends: solve a :class:`~kvsched.csp.model.LinearModel` with HiGHS, CBC or CP-SAT.

Each back end takes the model, the :class:`SolverOptions` and a
:class:`~kvsched.stop.Deadline`, and returns a :class:`RawSolution` whose bound is
set only where the back end's documented semantics make it a proof (see each
module). Threads are always set explicitly (CI has 2 cores).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvsched.csp.backends.cbc import solve_cbc
from kvsched.csp.backends.cpsat import solve_cpsat
from kvsched.csp.backends.highs import highs_model, lp_relaxation, solve_highs, write_model
from kvsched.csp.backends.options import RawSolution, SolverOptions
from kvsched.csp.model import LinearModel
from kvsched.csp.result import SolveStatus
from kvsched.errors import InputError
from kvsched.stop import Deadline

Backend = Callable[[LinearModel, SolverOptions, Deadline], RawSolution]

BACKENDS: dict[str, Backend] = {
    "highs": solve_highs,
    "cbc": solve_cbc,
    "cpsat": solve_cpsat,
}


def check_solver(solver: str) -> Backend:
    """The back end called ``solver``, or one clear error."""
    try:
        return BACKENDS[solver]
    except KeyError:
        raise InputError(f"--solver: unknown solver {solver!r} (known: {', '.join(BACKENDS)})") from None


def solve_model(
    model: LinearModel, solver: str, options: SolverOptions, deadline: Deadline | None = None
) -> RawSolution:
    """Solve ``model`` with the named back end by ``deadline`` (a model without variables is solved here)."""
    backend = check_solver(solver)
    deadline = deadline or Deadline.after(options.time_limit)
    if model.num_vars == 0:
        # Every window is a single slot: nothing to decide (some back ends refuse empty models).
        x = np.zeros(0)
        if model.violations(x):
            return RawSolution(SolveStatus.INFEASIBLE, None, None, None, 0.0)
        return RawSolution(SolveStatus.OPTIMAL, x, model.obj_offset, model.obj_offset, 0.0)
    return backend(model, options, deadline)


def check_export_path(path: str | Path) -> Path:
    """``path`` as a :class:`Path` if it names a model file (.mps or .lp); else the one :class:`InputError`.

    Checked before the solve (:func:`kvsched.csp.solve`), not when the model is written: a bad name
    must not cost a finished solve its export.
    """
    p = Path(path)
    if p.suffix.lower() not in (".mps", ".lp"):
        raise InputError(f"--export: {p.name}: the file must end in .mps or .lp")
    return p


def export_model(model: LinearModel, path: str | Path) -> None:
    """Write the MILP form (indicators as big-M rows) as .mps or .lp, for Gurobi, CPLEX, ..."""
    write_model(model, str(check_export_path(path)))


__all__ = [
    "BACKENDS",
    "RawSolution",
    "SolverOptions",
    "check_export_path",
    "check_solver",
    "export_model",
    "highs_model",
    "lp_relaxation",
    "solve_model",
]
