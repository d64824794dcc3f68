"""Proximal bundle ascent for the chain Lagrangians' block-constant multipliers.

The chain Lagrangian ``L(y, z)`` is concave and every pricing returns its value
and a subgradient, so each pricing gives a *cut*: ``L(x) <= f_i + g_i . (x -
x_i)`` for every ``x``. The subgradient method of :mod:`kvsched.csp.bounds._ascent`
uses only the latest cut (smoothed); a bundle method keeps many and steps to the
maximum of their minimum (the *model*), kept near the best point so far (the
*centre*) by a proximal term:

    x+ = argmax_{x >= 0}  min_i (f_i + g_i . (x - x_i))  -  |x - centre|^2 / (2 t).

If ``L(x+)`` gains at least ``SERIOUS`` of what the model predicted, the centre
moves there (a *serious* step, and ``t`` grows where the model was good);
otherwise the new cut alone is kept (a *null* step) and ``t`` shrinks. Every
pricing is a valid bound whatever point it is at, so the choice of points, and
the accuracy of the small problem below, change how fast the bound rises, never
whether it is one (Lemarechal, Nemirovskii and Nesterov 1995; Frangioni 2002 for
bundles in Lagrangian relaxation).

**The step problem.** Its dual is over convex weights ``lam`` of the cuts:
minimise ``lam . e + psi(G lam)``, ``e_i >= 0`` each cut's linearisation error at
the centre and ``psi(g) = sum_c max_{d_c >= -centre_c} (g_c d_c - d_c^2 / (2 t))``
(the bound ``x >= 0`` is what makes ``psi`` piecewise quadratic); the step is
``d = max(-centre, t G lam)``. With the set ``S`` of clamped components fixed,
``psi`` is a quadratic in ``lam`` whose matrix is the cuts' Gram matrix without
``S``'s rows (kept up to date as cuts come and go, so the small problem costs
``O(k^2)`` and not ``O(k x slots)``). It is solved over the simplex by
accelerated projected gradient (:mod:`kvsched.csp.bounds._bundle_kernels`),
``S`` re-read from the step, a few rounds.

Variables are the multipliers times the rows' right-hand sides (``y M``, ``z C``),
the subgradient's scaling, so that memory and token rows move at comparable rates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from kvsched.csp.bounds._ascent import BestPoint, Rows, row_subgradients
from kvsched.stop import Deadline

#: A step is serious (the centre moves) where it gains at least this share of the model's prediction.
SERIOUS = 0.1
#: ... and ``t`` doubles where it gains at least this share (the model was good that far).
GOOD = 0.5
#: ``t`` after a null step that lost value, and after one that gained too little, as shares.
SHRINK_LOST, SHRINK_NULL = 0.5, 0.9
#: Cuts kept; beyond it the unused ones go and the step's aggregate stands for them.
MAX_CUTS = 40
#: The first step's length, as a share of the centre's norm (measured on Azure conversations 1k with the
#: budget: 1% and 3% alike, 10% overshoots; a Polyak-sized first step, 5% above the value, is about as good).
FIRST_STEP = 0.01
#: Rounds of re-reading the clamped set.
CLAMP_ROUNDS = 6
#: A trial point whose pricing is predicted to cost more than this many times the centre's gets a shorter
#: step (``t`` halved, at most ``SHORTER`` times): a pricing's bands widen with the multipliers, and one far
#: point took 8 s of a 60 s run where the centre's took 0.2 s (Azure conversations 1k, C = 2048).
COST_GROWTH, SHORTER = 2.0, 8
#: A level stops where the model promises less than this share of the value, or where this many pricings
#: in a row gained less than it (the last level: ``LAST_TOLERANCE``; the slot pricing comes after it).
LEVEL_TOLERANCE, LAST_TOLERANCE, STALL = 1e-4, 1e-5, 25


def _kernels():
    """The compiled step problem, imported on first use (numba's import is slow)."""
    from kvsched.csp.bounds import _bundle_kernels

    return _bundle_kernels


class Cuts:
    """The bundle: cut gradients as columns, their intercepts ``f_i - g_i . x_i`` and Gram matrix."""

    def __init__(self, size: int, capacity: int = MAX_CUTS):
        self.g = np.zeros((size, capacity))
        self.a = np.zeros(capacity)
        self.gram = np.zeros((capacity, capacity))
        self.k = 0

    @property
    def capacity(self) -> int:
        """Cuts it can hold."""
        return self.a.size

    def add(self, g: np.ndarray, intercept: float) -> None:
        """Add the cut ``g . x + intercept`` (room must have been made)."""
        k = self.k
        self.g[:, k] = g
        self.a[k] = intercept
        row = self.g[:, : k + 1].T @ g
        self.gram[k, : k + 1] = row
        self.gram[: k + 1, k] = row
        self.k = k + 1

    def compress(self, lam: np.ndarray, room: int) -> None:
        """Keep the newest cuts ``lam`` uses, at most ``room - 1``, and their aggregate under ``lam``:
        the model keeps the step it gave (the aggregate is the cut it was made on)."""
        k = self.k
        agg_g, agg_a = self.g[:, :k] @ lam, float(self.a[:k] @ lam)
        agg_gram = self.gram[:k, :k] @ lam
        keep = [i for i in range(k) if lam[i] > 1e-12][-(room - 1) :]
        m = len(keep)
        self.g[:, :m] = self.g[:, keep]
        self.a[:m] = self.a[keep]
        self.gram[:m, :m] = self.gram[np.ix_(keep, keep)]
        self.g[:, m] = agg_g
        self.a[m] = agg_a
        self.gram[m, :m] = self.gram[:m, m] = agg_gram[keep]
        self.gram[m, m] = float(lam @ agg_gram)
        self.k = m + 1

    def step(self, centre: np.ndarray, value: float, t: float, start: np.ndarray):
        """The proximal step from ``centre`` (worth ``value``): the cut weights, the step ``d`` and the
        model's predicted gain at ``centre + d``."""
        k = self.k
        g, gram = self.g[:, :k], self.gram[:k, :k]
        errors = np.maximum(0.0, self.a[:k] + centre @ g - value)
        lam = start
        move = t * (g @ lam)
        clamped = centre + move < 0.0
        for _ in range(CLAMP_ROUNDS):
            # psi on the free components is t |G_F lam|^2 / 2; on a clamped one (d = -centre) it is
            # linear in lam: -centre_c (G lam)_c, plus a constant.
            # The Gram matrix of the free rows, from the smaller side.
            if 2 * int(clamped.sum()) > clamped.size:
                free = g[~clamped]
                h = t * (free.T @ free)
            else:
                gs = g[clamped]
                h = t * (gram - gs.T @ gs)
            top = float(np.linalg.eigvalsh(h)[-1])
            # C-contiguous float64 arrays: the signature `kvsched warmup` compiled (another layout would
            # compile again, seconds inside a pricing's time).
            c = np.ascontiguousarray(errors - centre[clamped] @ g[clamped], dtype=np.float64)
            lam = _kernels().simplex_qp_compiled(
                np.ascontiguousarray(h, dtype=np.float64), c, np.ascontiguousarray(lam, dtype=np.float64), top
            )
            move = t * (g @ lam)
            now = centre + move < 0.0
            if np.array_equal(now, clamped):
                break
            clamped = now
        d = np.maximum(-centre, move)
        return lam, d, float(np.min(errors + d @ g))


class Bundle(BestPoint):
    """Proximal bundle ascent over memory multipliers ``y`` and token multipliers ``z``; the interface of
    :class:`kvsched.csp.bounds._ascent.Ascent` (``price(y, z, reset) -> (value, load, tokens)``, each
    multiplier standing for ``span`` slots).

    ``last`` is false on a level that is not the last: it stops once the model promises less than
    ``LEVEL_TOLERANCE`` of the value (the last level: ``LAST_TOLERANCE``). ``factor`` is handed on
    unchanged (the subgradient ascent after the block levels starts from it). ``predict(y, z)``, where given,
    estimates a pricing's cost (any unit: only its ratio to the centre's is used), so that a step
    whose pricing would be dear is shortened before it is priced.
    """

    def __init__(
        self,
        data: Rows,
        upper: float,
        price: Callable,
        on_improve: Callable[[float], None] | None = None,
        floor: float = -math.inf,
        first_cost: Callable[[np.ndarray, np.ndarray], float] = lambda y, z: 0.0,
        span: int = 1,
        last: bool = True,
        factor: float = 1.0,
        predict: Callable[[np.ndarray, np.ndarray], float] | None = None,
    ):
        self.data = data
        self.capacity = float(data.capacity)
        self.budget = float(data.budget) if data.budget is not None else 1.0
        self.upper, self.price, self.on_improve, self.floor = upper, price, on_improve, floor
        self.first_cost, self.span = first_cost, float(span)
        self.last, self.factor = last, factor
        self.predict = predict
        self.best, self.best_x = -math.inf, (np.zeros(0), np.zeros(0))
        self.iterations, self.last_cost = 0, 0.0
        self.nulls = 0  # null steps taken (the log's figures)
        self._state: tuple[Cuts, np.ndarray, float, float] | None = None  # cuts, centre, its value, t

    def as_last(self) -> None:
        """Ascend from now on as the last level does (to its finer tolerance)."""
        self.last = True

    def _split(self, x: np.ndarray, ny: int) -> tuple[np.ndarray, np.ndarray]:
        """The multipliers ``(y, z)`` of the scaled point ``x``."""
        return x[:ny] / self.capacity, x[ny:] / self.budget

    def _evaluate(self, x: np.ndarray, ny: int) -> tuple[float, np.ndarray]:
        """Price at the scaled point ``x``: the value and the scaled subgradient."""
        y, z = self._split(x, ny)
        tic = time.perf_counter()
        value, load, tokens = self.price(y, z, False)
        self.last_cost = time.perf_counter() - tic
        self.iterations += 1
        grad = np.concatenate(row_subgradients(self.data, self.span, load, tokens, z.size > 0))
        if value > self.best:
            self.best, self.best_x = value, (y.copy(), z.copy())
            if self.on_improve is not None:
                self.on_improve(value)
        return value, grad

    def run(self, y: np.ndarray, z: np.ndarray, deadline: Deadline, max_iterations: int) -> None:
        """Ascend from ``(y, z)`` (or, called again, from the bundle so far) until ``deadline``,
        ``max_iterations`` pricings or a model that promises nothing more."""
        ny = y.size
        tolerance = LAST_TOLERANCE if self.last else LEVEL_TOLERANCE
        if self._state is None:
            if not self.best_x[0].size:
                self.best_x = (y.copy(), z.copy())
            if max_iterations <= 0 or deadline.expired() or deadline.remaining() < self.first_cost(y, z):
                return
            centre = np.concatenate([y * self.capacity, z * self.budget])
            value, grad = self._evaluate(centre, ny)
            norm = float(np.linalg.norm(grad))
            if norm == 0.0:
                return  # a zero subgradient: optimal
            size = float(np.linalg.norm(centre))
            # From y = 0, Polyak's step towards 5% above the value.
            t = FIRST_STEP * size / norm if size > 0.0 else 0.05 * max(1.0, abs(value)) / norm**2
            cuts = Cuts(centre.size, MAX_CUTS)
            cuts.add(grad, value - float(grad @ centre))
            self._state = (cuts, centre, value, t)
        cuts, centre, value, t = self._state
        lam = np.full(cuts.k, 1.0 / cuts.k)
        done, stalled, mark = 0, 0, self.best
        # The centre's pricing: its predicted cost (on first need) and its seconds.
        centre_cost: float | None = None
        centre_seconds = self.last_cost
        while done < max_iterations and stalled < STALL:
            if deadline.expired() or deadline.remaining() < 1.2 * self.last_cost:
                break
            start = np.zeros(cuts.k)
            start[: lam.size] = lam[: cuts.k]
            if start.sum() <= 0.0:
                start = np.full(cuts.k, 1.0 / cuts.k)
            lam, d, gain = cuts.step(centre, value, t, start)
            expected = self.last_cost
            if self.predict is not None:
                if centre_cost is None:
                    centre_cost = self.predict(*self._split(centre, ny))
                for _ in range(SHORTER):
                    ratio = self.predict(*self._split(centre + d, ny)) / max(centre_cost, 1e-12)
                    if ratio <= COST_GROWTH:
                        break
                    t *= 0.5
                    lam, d, gain = cuts.step(centre, value, t, lam)
                expected = max(ratio, 1.0) * centre_seconds
            if gain <= tolerance * max(1.0, abs(value)):
                break  # the model promises nothing more: (near) optimal at this level
            if deadline.remaining() < 1.2 * expected:
                break
            point = centre + d
            new, grad = self._evaluate(point, ny)
            done += 1
            if self.best > mark + tolerance * max(1.0, abs(mark)):
                stalled, mark = 0, self.best
            else:
                stalled += 1
            if new >= value + SERIOUS * gain:
                if new >= value + GOOD * gain:
                    t *= 2.0
                centre, value, centre_cost, centre_seconds = point, new, None, self.last_cost
            else:
                self.nulls += 1
                t *= SHRINK_LOST if new < value else SHRINK_NULL
            if cuts.k >= cuts.capacity:
                cuts.compress(lam, cuts.capacity - 1)
                lam = np.zeros(cuts.k)
                lam[-1] = 1.0  # the aggregate
            cuts.add(grad, new - float(grad @ point))
        self._state = (cuts, centre, value, t)
