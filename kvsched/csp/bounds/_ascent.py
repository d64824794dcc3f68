"""Projected subgradient ascent for the chain Lagrangians (:mod:`kvsched.csp.bounds.chain`).

Polyak steps towards a target at most ``TARGET_SHARE`` above the best value,
directions averaged as in the volume algorithm (Barahona and Anbil 2000), rows
scaled by their right-hand sides, the step halved and the iterate sent back to
the best point after ``PATIENCE`` iterations without improvement. The pricing is
a callable, so the same ascent drives the slot-level chain pricing and the
block-constant one (:mod:`kvsched.csp.bounds.chain_blocks`), whose multipliers
each stand for ``span`` slots.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import numpy as np

from kvsched.stop import Deadline

#: The Polyak target lies at most this share above the best bound so far.
TARGET_SHARE = 0.05
#: Iterations without improvement before the step factor is halved (and the iterate reset).
PATIENCE = 15
#: Weight of the new subgradient in the averaged direction (volume algorithm); the rest is the old one.
SMOOTHING = 0.4


class Rows(Protocol):
    """What the ascent needs of the instance: the memory and token rows' right-hand sides."""

    capacity: int
    budget: int | None


class Ascent:
    """Projected subgradient ascent with Polyak steps, volume-style averaging and resets to the best point."""

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
        self.data, self.upper, self.price, self.on_improve = data, upper, price, on_improve
        # Slots per multiplier (block-constant multipliers: their loads are block sums).
        self.span = float(span)
        self.best, self.best_y, self.best_z = -math.inf, None, None
        self.floor = floor  # the best value known from elsewhere (a target never below it)
        self.iterations = 0
        self.last_cost = 0.0  # seconds the last pricing took
        self.first_cost = first_cost  # predicted seconds of the first pricing at y
        self.min_factor = min_factor  # stop once the step factor has been halved below this
        self.factor = factor  # the Polyak step's factor: halved on stalls, handed on to a finer ascent

    def run(self, y: np.ndarray, z: np.ndarray, deadline: Deadline, max_iterations: int) -> None:
        data = self.data
        self.best_y, self.best_z = y.copy(), z.copy()
        factor, streak, reset = self.factor, 0, True
        dir_y = dir_z = None
        last_cost = self.last_cost  # a second run goes on from the first
        for _ in range(max_iterations):
            # A pricing cannot be interrupted: do not start one the deadline cannot fit.
            predicted = 1.2 * last_cost if self.iterations else self.first_cost(y, z)
            if deadline.expired() or deadline.remaining() < predicted:
                break
            tic = time.perf_counter()
            value, load, tokens = self.price(y, z, reset)
            last_cost = time.perf_counter() - tic
            self.last_cost = last_cost
            self.iterations += 1
            reset = False
            if value > self.best:
                gained = value - self.best
                self.best, self.best_y, self.best_z = value, y.copy(), z.copy()
                if self.on_improve is not None:
                    self.on_improve(value)
                streak = 0 if gained > 1e-6 * max(1.0, abs(value)) else streak + 1
            else:
                streak += 1
            if streak >= PATIENCE:
                factor *= 0.5
                self.factor = factor
                streak, reset = 0, True
                y, z = self.best_y.copy(), self.best_z.copy()
                dir_y = dir_z = None
                if factor < self.min_factor:
                    break
                continue
            # Volume-style direction: the new subgradient averaged with the old direction. Steps are
            # taken in the multipliers of the rows divided by their right-hand sides (M y and C z),
            # so that memory and token rows move at comparable rates.
            g_y = load / data.capacity - self.span
            g_z = tokens / float(data.budget) - self.span if z.size else z
            dir_y = g_y if dir_y is None else (1 - SMOOTHING) * dir_y + SMOOTHING * g_y
            dir_z = g_z if dir_z is None else (1 - SMOOTHING) * dir_z + SMOOTHING * g_z
            # Components at 0 pushed further down do not move: leave them out of the norm.
            move_y = np.where((y > 0) | (dir_y > 0), dir_y, 0.0)
            move_z = np.where((z > 0) | (dir_z > 0), dir_z, 0.0)
            norm = float(move_y @ move_y + move_z @ move_z)
            if norm <= 0.0:
                break  # a zero subgradient: y is optimal
            # Polyak towards the incumbent's value, but no further than TARGET_SHARE above the best
            # value: a poor incumbent would otherwise make every step overshoot.
            best = max(self.best, self.floor)
            target = min(self.upper, best + TARGET_SHARE * max(1.0, abs(best)))
            target = max(target, best + 1e-4 * max(1.0, abs(best)))
            step = factor * (target - value) / norm
            y = np.maximum(0.0, y + step * move_y / data.capacity)
            if z.size:
                z = np.maximum(0.0, z + step * move_z / float(data.budget))
