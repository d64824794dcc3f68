"""The bundle step's small problem, compiled: a convex quadratic over the simplex.

:func:`simplex_qp` is plain Python over numpy arrays; the bundle ascent
(:mod:`kvsched.csp.bounds._bundle`) calls its numba-compiled twin
(:data:`simplex_qp_compiled`), because with up to 40 cuts each call runs hundreds
of tiny iterations whose numpy overhead dwarfs their arithmetic (measured: 38 of
60 s on Azure code 1k, against a fraction of a second compiled). The tests run
both on the same problems.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

#: Accelerated projected-gradient iterations at most, and the change in weights that stops them.
ITERATIONS, TOLERANCE = 300, 1e-10


@nb.njit(cache=True)
def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{lam >= 0, sum lam = 1}`` (sort-based, ``O(k log k)``);
    ``project_simplex.py_func`` is its plain-Python path."""
    u = np.sort(v)[::-1]
    total, shift = 0.0, 0.0
    for i in range(u.size):
        total += u[i]
        # The largest i with u_i > (sum_{j <= i} u_j - 1) / (i + 1) fixes the shift.
        if u[i] * (i + 1) > total - 1.0:
            shift = (total - 1.0) / (i + 1)
    return np.maximum(v - shift, 0.0)


@nb.njit(cache=True)
def _matvec(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``h @ v`` by loops: numba's matrix product calls SciPy's BLAS, which kvsched does not depend on
    (a kernel compiled where SciPy was installed aborted the process where it was not)."""
    out = np.zeros(h.shape[0])
    for i in range(h.shape[0]):
        total = 0.0
        for j in range(h.shape[1]):
            total += h[i, j] * v[j]
        out[i] = total
    return out


def simplex_qp(h: np.ndarray, c: np.ndarray, start: np.ndarray, lipschitz: float) -> np.ndarray:
    """``argmin lam' h lam / 2 + c . lam`` over the simplex, from ``start``, by FISTA with step
    ``1 / lipschitz`` (``h`` positive semidefinite, ``lipschitz`` at least its largest eigenvalue).

    Plain Python (the projection it calls is compiled; its own plain path is tested apart);
    :data:`simplex_qp_compiled` is the same function compiled.
    """
    if lipschitz <= 0.0:
        out = np.zeros_like(c)
        out[np.argmin(c)] = 1.0
        return out
    step = 1.0 / lipschitz
    lam = project_simplex(start)
    mom = lam.copy()
    theta = 1.0
    for _ in range(ITERATIONS):
        nxt = project_simplex(mom - step * (_matvec(h, mom) + c))
        theta_next = (1.0 + math.sqrt(1.0 + 4.0 * theta * theta)) / 2.0
        mom = nxt + ((theta - 1.0) / theta_next) * (nxt - lam)
        moved = np.abs(nxt - lam).max()
        lam, theta = nxt, theta_next
        if moved < TOLERANCE:
            break
    return lam


#: The compiled twin the bundle ascent calls (a module-level function: numba caches it on disk, where a
#: closure over the projection was compiled again in every process, 7-8 s).
simplex_qp_compiled = nb.njit(cache=True)(simplex_qp)
