"""Projected subgradient ascent for the Lagrangian bounds.

Polyak steps towards a target at most ``TARGET_SHARE`` above the best value,
directions averaged as in the volume algorithm (Barahona and Anbil 2000), rows
scaled by their right-hand sides, the step halved and the iterate sent back to
the best point after ``patience`` iterations without improvement.

:class:`Subgradient` moves any number of multiplier arrays (*groups*), each
with its own row scale; a group may instead move by fixed-size sign steps
(:class:`Signed`: a parameter of the relaxation rather than a multiplier, such
as the seconds Lagrangian's share mixture). The pricing is a callable, so the
same ascent drives the chain Lagrangian's slot pricing, its block-constant one
(:mod:`kvsched.csp.bounds.chain_blocks`, through :class:`Ascent`) and the
seconds Lagrangian (:mod:`kvsched.csp.bounds.seconds_lagrangian`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvsched.stop import Deadline

#: The Polyak target lies at most this share above the best bound so far.
TARGET_SHARE = 0.05
#: Iterations without improvement before the step factor is halved (and the iterate reset).
PATIENCE = 15
#: Weight of the new subgradient in the averaged direction (volume algorithm); the rest is the old one.
SMOOTHING = 0.4

#: ``price(x, reset) -> (value, grads)``: the Lagrangian at the groups ``x`` and, per group, its
#: subgradient divided by the rows' right-hand sides (a :class:`Signed` group: the direction whose sign
#: it moves by). ``reset`` is true after a reset to the best point.
Pricer = Callable[[tuple[np.ndarray, ...], bool], tuple[float, tuple[np.ndarray, ...]]]


@dataclass(frozen=True, slots=True)
class Signed:
    """A group moved by steps of ``rate`` times the step factor in the sign of its direction, kept in
    ``[low, high]``; it stays out of the Polyak step's norm."""

    rate: float
    low: float
    high: float


class Subgradient:
    """Projected subgradient ascent with Polyak steps, volume-style averaging and resets to the best point.

    Parameters
    ----------
    upper
        A schedule's value: the Polyak target never exceeds it.
    price
        The pricing (:data:`Pricer`).
    scales
        Per group, the rows' right-hand side (scalar or array) its step is divided by; ignored for
        :class:`Signed` groups.
    on_improve
        Called with each value better than every earlier one.
    floor
        The best value known from elsewhere (a target never below it).
    first_cost
        Predicted seconds of the first pricing at the groups; a pricing that does not fit the time left
        is not started (later ones are predicted from the last one's time).
    patience, min_factor, factor
        Stalled iterations before the step factor is halved; the factor below which the ascent stops;
        its start (handed on from a coarser ascent).
    signed
        Groups moved by sign steps, by index.
    """

    def __init__(
        self,
        upper: float,
        price: Pricer,
        scales: tuple,
        *,
        on_improve: Callable[[float], None] | None = None,
        floor: float = -math.inf,
        first_cost: Callable[[tuple[np.ndarray, ...]], float] = lambda x: 0.0,
        patience: int = PATIENCE,
        min_factor: float = 1e-3,
        factor: float = 1.0,
        signed: Mapping[int, Signed] | None = None,
    ):
        self.upper, self.price, self.scales, self.on_improve = upper, price, scales, on_improve
        self.signed = dict(signed or {})
        self.best: float = -math.inf
        self.best_x: tuple[np.ndarray, ...] = ()
        self.floor = floor
        self.iterations = 0
        self.last_cost = 0.0  # seconds the last pricing took
        self.first_cost = first_cost
        self.patience = patience
        self.min_factor = min_factor
        self.factor = factor  # the Polyak step's factor: halved on stalls, handed on to a finer ascent

    def run(self, x: tuple[np.ndarray, ...], deadline: Deadline, max_iterations: int) -> None:
        """Ascend from ``x`` until ``deadline``, ``max_iterations`` pricings or a zero subgradient."""
        self.best_x = tuple(g.copy() for g in x)
        factor, streak, reset = self.factor, 0, True
        direction: list[np.ndarray] | None = None
        last_cost = self.last_cost  # a second run goes on from the first
        for _ in range(max_iterations):
            # A pricing cannot be interrupted: do not start one the deadline cannot fit.
            predicted = 1.2 * last_cost if self.iterations else self.first_cost(x)
            if deadline.expired() or deadline.remaining() < predicted:
                break
            tic = time.perf_counter()
            value, grads = self.price(x, reset)
            last_cost = time.perf_counter() - tic
            self.last_cost = last_cost
            self.iterations += 1
            reset = False
            if value > self.best:
                gained = value - self.best
                self.best, self.best_x = value, tuple(g.copy() for g in x)
                if self.on_improve is not None:
                    self.on_improve(value)
                streak = 0 if gained > 1e-6 * max(1.0, abs(value)) else streak + 1
            else:
                streak += 1
            if streak >= self.patience:
                factor *= 0.5
                self.factor = factor
                streak, reset = 0, True
                x = tuple(g.copy() for g in self.best_x)
                direction = None
                if factor < self.min_factor:
                    break
                continue
            # Volume-style direction: the new subgradient averaged with the old direction. Steps are
            # taken in the multipliers of the rows divided by their right-hand sides, so that rows of
            # different sizes move at comparable rates.
            if direction is None:
                direction = list(grads)
            else:
                direction = [
                    (1 - SMOOTHING) * d + SMOOTHING * g for d, g in zip(direction, grads, strict=True)
                ]
            # Components at 0 pushed further down do not move: leave them out of the norm.
            moves = [
                None if k in self.signed else np.where((g > 0) | (d > 0), d, 0.0)
                for k, (g, d) in enumerate(zip(x, direction, strict=True))
            ]
            norm = 0.0
            for move in moves:
                if move is not None:
                    norm += float(move @ move) if move.ndim == 1 else float((move * move).sum())
            if norm <= 0.0:
                break  # a zero subgradient: the multipliers are optimal
            # Polyak towards the incumbent's value, but no further than TARGET_SHARE above the best
            # value: a poor incumbent would otherwise make every step overshoot.
            best = max(self.best, self.floor)
            target = min(self.upper, best + TARGET_SHARE * max(1.0, abs(best)))
            target = max(target, best + 1e-4 * max(1.0, abs(best)))
            step = factor * (target - value) / norm
            x = tuple(
                g if move is None or not g.size else np.maximum(0.0, g + step * move / self.scales[k])
                for k, (g, move) in enumerate(zip(x, moves, strict=True))
            )
            for k, sign in self.signed.items():
                x = (
                    *x[:k],
                    np.clip(x[k] + sign.rate * factor * np.sign(grads[k]), sign.low, sign.high),
                    *x[k + 1 :],
                )


class Rows(Protocol):
    """What the chain ascent needs of the instance: the memory and token rows' right-hand sides."""

    capacity: int
    budget: int | None


def row_subgradients(
    data: Rows, span: float, load: np.ndarray, tokens: np.ndarray, with_tokens: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The chain Lagrangian's subgradient in the memory and token multipliers, each row divided by its
    right-hand side (``span`` slots of ``M``, of ``C``): what both chain ascents step along. The token
    part is empty without token rows."""
    g_y = load / data.capacity - span
    g_z = tokens / float(data.budget) - span if with_tokens and data.budget is not None else np.zeros(0)
    return g_y, g_z


class BestPoint:
    """The best point's memory and token multipliers, for the chain ascents whose ``best_x`` is ``(y, z)``."""

    best_x: tuple[np.ndarray, ...]

    @property
    def best_y(self) -> np.ndarray:
        return self.best_x[0]

    @property
    def best_z(self) -> np.ndarray:
        return self.best_x[1]


class Ascent(Subgradient, BestPoint):
    """The chain Lagrangians' ascent over memory multipliers ``y`` and token multipliers ``z``.

    ``price(y, z, reset) -> (value, load, tokens)``: the blocks (KV) and tokens the chains put in each
    multiplier's slots; each multiplier stands for ``span`` slots (block-constant multipliers: their loads
    are block sums).
    """

    def __init__(
        self,
        data: Rows,
        upper: float,
        price,
        on_improve=None,
        floor: float = -math.inf,
        first_cost=lambda y, z: 0.0,
        span: int = 1,
        min_factor: float = 1e-3,
        factor: float = 1.0,
    ):
        slots = float(span)
        budget = float(data.budget) if data.budget is not None else 1.0

        def grads(x: tuple[np.ndarray, ...], reset: bool) -> tuple[float, tuple[np.ndarray, ...]]:
            value, load, tokens = price(x[0], x[1], reset)
            return value, row_subgradients(data, slots, load, tokens, x[1].size > 0)

        super().__init__(
            upper, grads, (data.capacity, budget), on_improve=on_improve, floor=floor,
            first_cost=lambda x: first_cost(x[0], x[1]), min_factor=min_factor, factor=factor,
        )  # fmt: skip

    def as_last(self) -> None:
        """Ascend from now on as the last level does: until the step factor falls below ``1e-3``."""
        self.min_factor = 1e-3

    def run(self, y: np.ndarray, z: np.ndarray, deadline: Deadline, max_iterations: int) -> None:  # type: ignore[override]
        super().run((y, z), deadline, max_iterations)
