"""The proximal bundle ascent: its small problem solved exactly, its steps proximal, its ascent converging."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvsched.csp.bounds import _bundle_kernels
from kvsched.csp.bounds._bundle import Bundle, Cuts
from kvsched.stop import Deadline


def _psd(rng: np.random.Generator, k: int, rank: int) -> np.ndarray:
    a = rng.normal(size=(k, rank))
    return a @ a.T


def _kkt_gap(h: np.ndarray, c: np.ndarray, lam: np.ndarray) -> float:
    """How far ``lam`` is from optimal over the simplex: the gradient's spread over the support plus
    how much any coordinate's gradient undercuts the support's (both 0 at the optimum)."""
    grad = h @ lam + c
    support = lam > 1e-9
    return float(grad[support].max() - grad.min())


@pytest.mark.parametrize("seed", range(6))
def test_projection_is_the_nearest_point_of_the_simplex(seed):
    rng = np.random.default_rng(seed)
    for k in (1, 2, 5, 17):
        v = rng.normal(scale=3.0, size=k)
        p = _bundle_kernels.project_simplex.py_func(v)  # the plain path, and the compiled one agrees
        assert np.allclose(p, _bundle_kernels.project_simplex(v), atol=1e-14)
        assert p.min() >= 0.0 and math.isclose(p.sum(), 1.0, rel_tol=1e-12)
        # Nearest: no point of the simplex (vertices, random mixtures) is closer.
        others = np.vstack([np.eye(k), rng.dirichlet(np.ones(k), 200)])
        assert np.all(np.linalg.norm(others - v, axis=1) >= np.linalg.norm(p - v) - 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_simplex_qp_is_optimal_and_the_compiled_path_agrees(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 30))
    h = _psd(rng, k, int(rng.integers(1, k + 1)))
    c = rng.normal(size=k)
    start = np.full(k, 1.0 / k)
    top = float(np.linalg.eigvalsh(h)[-1])
    plain = _bundle_kernels.simplex_qp(h, c, start, top)
    compiled = _bundle_kernels.simplex_qp_compiled(h, c, start, top)
    assert np.allclose(plain, compiled, atol=1e-12)
    assert plain.min() >= 0.0 and math.isclose(plain.sum(), 1.0, rel_tol=1e-9)
    assert _kkt_gap(h, c, plain) < 1e-4 * max(1.0, float(np.abs(c).max()))


def test_simplex_qp_with_no_curvature_takes_the_cheapest_vertex():
    c = np.array([0.3, -1.0, 0.2])
    lam = _bundle_kernels.simplex_qp(np.zeros((3, 3)), c, np.full(3, 1 / 3), 0.0)
    assert lam.tolist() == [0.0, 1.0, 0.0]


def _proximal(cuts_g, cuts_a, centre, t, d):
    """The step problem's objective at ``centre + d``: the model minus the proximal term."""
    x = centre + d
    return float(np.min(cuts_a + x @ cuts_g)) - float(d @ d) / (2 * t)


@pytest.mark.parametrize("seed", range(6))
def test_the_step_maximises_the_proximal_model_over_nonnegative_points(seed):
    rng = np.random.default_rng(seed)
    size, k = 12, 5
    centre = np.maximum(0.0, rng.normal(size=size))  # some components at 0: the bound x >= 0 bites
    cuts = Cuts(size)
    for _ in range(k):
        g = rng.normal(size=size)
        point = np.maximum(0.0, centre + rng.normal(size=size))
        cuts.add(g, float(rng.normal()) - float(g @ point))
    g, a = cuts.g[:, :k], cuts.a[:k]
    value = float(np.min(a + centre @ g)) - 0.5  # a centre worth less than every cut there
    t = 0.7
    _, d, gain = cuts.step(centre, value, t, np.full(k, 1.0 / k))
    assert np.all(centre + d >= -1e-12)
    assert math.isclose(gain, float(np.min(a + (centre + d) @ g)) - value, rel_tol=1e-9, abs_tol=1e-9)
    best = _proximal(g, a, centre, t, d)
    for _ in range(2000):  # no feasible point nearby does better
        other = np.maximum(-centre, d + rng.normal(scale=0.3, size=size) * (rng.random(size) < 0.5))
        assert _proximal(g, a, centre, t, other) <= best + 1e-6


def test_compressing_keeps_the_gram_matrix_and_the_step():
    rng = np.random.default_rng(3)
    size = 9
    cuts = Cuts(size, capacity=6)
    for _ in range(6):
        cuts.add(rng.normal(size=size), float(rng.normal()))
    lam = np.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    aggregate = cuts.g[:, :6] @ lam
    cuts.compress(lam, room=3)
    assert cuts.k == 3
    assert np.allclose(cuts.g[:, 2], aggregate)
    g = cuts.g[:, : cuts.k]
    assert np.allclose(cuts.gram[: cuts.k, : cuts.k], g.T @ g)


@dataclasses.dataclass(frozen=True)
class _Rows:
    capacity: int
    budget: int | None


@pytest.mark.parametrize("budget", [None, 7])
def test_the_ascent_reaches_the_maximum_of_a_concave_function(budget):
    """``L(y, z) = 10 - sum |M y - p| - sum |C z - q|`` (in the bundle's scaled variables ``M y``,
    ``C z``), whose maximum 10 lies at ``(p, q) >= 0`` with some components at 0."""
    rows = _Rows(capacity=50, budget=budget)
    rng = np.random.default_rng(0)
    p = np.maximum(0.0, rng.normal(size=8))
    q = np.maximum(0.0, rng.normal(size=8)) if budget else np.zeros(0)

    def price(y, z, reset):
        u, w = y * rows.capacity, z * (budget or 1)
        value = 10.0 - np.abs(u - p).sum() - np.abs(w - q).sum()
        # The subgradient in the scaled variables is load / M - span, so load = M (g + span).
        load = rows.capacity * (-np.sign(u - p) + 1.0)
        tokens = (budget or 1) * (-np.sign(w - q) + 1.0) if budget else np.zeros(0)
        return value, load, tokens

    ascent = Bundle(rows, 100.0, price)
    y0 = np.full(8, 0.05)
    z0 = np.full(8, 0.05) if budget else np.zeros(0)
    ascent.run(y0, z0, Deadline.never(), 400)
    start = 10.0 - np.abs(y0 * 50 - p).sum() - (np.abs(z0 * 7 - q).sum() if budget else 0.0)
    assert ascent.best > start
    assert ascent.best > 10.0 - 1e-3
    assert np.all(ascent.best_y >= 0.0) and np.all(ascent.best_z >= 0.0)
    # A second run goes on from the bundle (the block ladder's last level does this) and never loses.
    before = ascent.best
    ascent.run(ascent.best_y, ascent.best_z, Deadline.never(), 10)
    assert ascent.best >= before
