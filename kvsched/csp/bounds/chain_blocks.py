"""The chain Lagrangian with block-constant multipliers: the same bound, priced ``B`` times faster.

Any multipliers ``y, z >= 0`` give a valid chain-Lagrangian bound
(:mod:`kvsched.csp.bounds.chain`), in particular multipliers constant on blocks
of ``B`` consecutive slots. At such multipliers the exact chain price is a
programme over blocks with a sliding-window minimum
(:mod:`kvsched.csp.bounds._block_kernels`), ``O(states)`` per block instead of
``O(states x B)``: many more iterations fit in the same time. The ascent (a
proximal bundle, :mod:`kvsched.csp.bounds._bundle`) runs on coarse blocks first
and then on finer ones (a block's multiplier is copied to its halves, so the
value carries over), down to single slots; the best value of every level is a
bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsched.csp.bounds._ascent import Ascent
from kvsched.csp.bounds._bundle import Bundle
from kvsched.stop import Deadline

if TYPE_CHECKING:
    from kvsched.csp.bounds.chain import ChainData

#: The coarsest level has about this many blocks over the dual horizon.
COARSE_BLOCKS = 32
#: Each level's blocks are this many times shorter than the previous level's.
REFINE = 4
#: A level ends the ladder when the next one could not price this many times in the time left.
FEW_PRICINGS = 8
#: The finest block length: below it the slot-level kernel prices faster (measured break-even near 4).
FINEST = 8
#: Share of the time left that a level other than the last may take.
LEVEL_SHARE = 0.5
#: A level other than the last ends once its step factor has been halved below this (it has stalled; the
#: subgradient's rule: the bundle ends a level on its model's promise, see :mod:`kvsched.csp.bounds._bundle`).
LEVEL_MIN_FACTOR = 1 / 16
#: The block levels' dual methods: the proximal bundle (default; measured better on the Azure conversation
#: rows, ``docs/bounds.md``) and the projected subgradient it replaced (``benchmarks/dual_methods.py``).
METHODS = ("bundle", "subgradient")


@dataclass(frozen=True, slots=True, eq=False)
class BlockAscent:
    """The best value (slots) over the levels, its slot multipliers, and the pricings spent."""

    value: float
    y: np.ndarray
    z: np.ndarray
    iterations: int
    factor: float  # the step factor the last level reached
    cost: float  # seconds of the last pricing
    chains: np.ndarray | None  # the last pricing's chains (flat slots)


def block_spans(horizon: int) -> tuple[int, ...]:
    """The default ladder: a power of two near ``horizon / COARSE_BLOCKS`` (at least 2), then shorter by
    ``REFINE`` while at least ``FINEST`` (short horizons get one level of 2-slot blocks: cheap either way)."""
    span = 1 << max(1, math.floor(math.log2(max(1.0, horizon / COARSE_BLOCKS))))
    out = [span]
    while span // REFINE >= FINEST:
        span //= REFINE
        out.append(span)
    return tuple(out)


def _block_kernels():
    """The block pricing kernel, imported on first use (numba's import is slow)."""
    from kvsched.csp.bounds import _block_kernels

    return _block_kernels


def _chain_kernels():
    """The slot kernels (their chain loads), imported on first use; chain.py imports this module, so
    its own accessor cannot be imported here."""
    from kvsched.csp.bounds import _chain_kernels

    return _chain_kernels


def evaluate_blocks(
    data: ChainData,
    span: int,
    y: np.ndarray,
    z: np.ndarray | None = None,
    *,
    prev: np.ndarray | None = None,
):
    """``L(y, z)`` at block-constant multipliers (``y[b]`` on slots ``[b span, (b + 1) span)``).

    Returns the value (slots), the chains (flat slots), the prompt slots and the
    memory and token loads summed per block.
    """
    y = np.ascontiguousarray(y, dtype=np.float64)
    z = np.zeros(0) if z is None or data.budget is None else np.ascontiguousarray(z, dtype=np.float64)
    use_prev = prev is not None
    prev = prev if prev is not None else np.zeros(1, dtype=np.int64)
    price, chains, pslot, pre = _block_kernels().price_blocks(
        data.release, data.earliest, data.output, data.prompt, data.arrival, data.offset, data.block, span,
        y, z, data.objective, prev, use_prev, data.chunk, data.pre_offset, data.growth,
    )  # fmt: skip
    # The block programme leaves gaps between ops free (a weaker relaxation than the slot pricing's: still
    # a bound), so its loads have none; the completions' ghosts it prices as the slot programme does.
    load, tokens = _chain_kernels().chain_loads(
        data.output, data.prompt, data.offset, data.block, chains, pslot, y.size * span, z.size > 0, data.chunk,
        data.pre_offset, pre, np.zeros(0, dtype=np.int8), False, data.growth,
    )  # fmt: skip
    value = float(price.sum() - data.capacity * span * y.sum())
    if z.size:
        value -= float(data.budget) * span * float(z.sum())
        tokens = tokens.reshape(-1, span).sum(axis=1)
    return value, chains, pslot, load.reshape(-1, span).sum(axis=1), tokens


def block_pricer(data: ChainData, span: int, prev: np.ndarray | None = None):
    """Block pricing for the block levels' ascent (either method); last call's chains narrow the bands."""
    last: list[np.ndarray | None] = [prev]

    def price(y: np.ndarray, z: np.ndarray, reset: bool):
        value, chains, _, load, tokens = evaluate_blocks(data, span, y, z, prev=last[0])
        last[0] = chains
        return value, load, tokens

    price.last = last  # type: ignore[attr-defined]
    return price


@dataclass(frozen=True, slots=True, eq=False)
class RayStart:
    """The best scaled warm start: its value (slots), slot multipliers (``z = 0``), the pricings spent
    and the seconds the last one took."""

    value: float
    y: np.ndarray
    iterations: int
    cost: float = 0.0


def ray_search(
    data: ChainData,
    shapes: tuple[np.ndarray, ...],
    span: int,
    deadline: Deadline,
    *,
    on_value=None,
    rounds: int = 12,
) -> RayStart:
    """The best of ``alpha x shape`` over each shape's ray, priced at blocks of ``span`` slots.

    ``L`` is concave, so ``alpha -> L(alpha y)`` is unimodal: from ``alpha = 1`` the
    search doubles (or halves) while the value rises, then tries the geometric
    midpoints on either side of the best. Every value is a bound (``on_value``
    sees each). The deadline is checked before each pricing, against the last
    one's time. Returns the first shape unscaled when nothing was priced.
    """
    horizon = -(-shapes[0].size // span) * span
    best = RayStart(-math.inf, shapes[0], 0)
    cost, used = 0.0, 0
    cache: dict[tuple[int, float], float] = {}

    def value(k: int, alpha: float) -> float:
        nonlocal cost, used, best
        if (k, alpha) in cache:
            return cache[(k, alpha)]
        if deadline.expired() or deadline.remaining() < 1.2 * cost:
            return -math.inf
        padded = np.zeros(horizon)
        padded[: shapes[k].size] = alpha * shapes[k]
        tic = time.perf_counter()
        v = evaluate_blocks(data, span, padded.reshape(-1, span).mean(axis=1), None)[0]  # z = 0
        cost, used = time.perf_counter() - tic, used + 1
        cache[(k, alpha)] = v
        if on_value is not None:
            on_value(v)
        if v > best.value:
            best = RayStart(v, np.repeat(padded.reshape(-1, span).mean(axis=1), span), used)
        return v

    for k in range(len(shapes)):
        if not np.any(shapes[k] > 0):
            continue
        alpha, here = 1.0, value(k, 1.0)
        for factor in (2.0, 0.5):
            steps = 0
            while steps < rounds and value(k, alpha * factor) > here:
                alpha *= factor
                here = value(k, alpha)
                steps += 1
            if steps:
                break
        for factor in (2**0.5, 2**-0.5):
            value(k, alpha * factor)
    return RayStart(best.value, best.y, used, cost)


@dataclass(frozen=True, slots=True, eq=False)
class FinerStart:
    """A warm start priced on finer blocks: the ladder level it was priced at, its value (slots) and
    its slot multipliers."""

    level: int
    value: float
    y: np.ndarray


def finer_start(
    data: ChainData,
    shape: np.ndarray,
    spans: tuple[int, ...],
    deadline: Deadline,
    cost: float,
    *,
    on_value=None,
) -> FinerStart | None:
    """``shape`` priced on the finer levels of ``spans`` (coarse to fine), while each fits ``deadline``.

    A shape with structure inside the coarsest blocks loses it when averaged over them: the
    mean-busy-time prices on Azure conversations 10k are worth 1.97e7 on blocks of 4,096 slots and
    2.59e7 on blocks of 1,024. ``cost`` is the seconds of a pricing on ``spans[0]``; a finer level's is
    predicted from it by the ratio of block lengths (at most inversely proportional). The descent stops at
    the first level worth less than the one before (each costs about four times more: ShareGPT 10k spent
    12 s of a 30 s Lagrangian on levels that gave nothing). Returns the best level priced (from 1), or None
    when none fits.
    """
    horizon = -(-shape.size // spans[0]) * spans[0]
    padded = np.zeros(horizon)
    padded[: shape.size] = shape
    best: FinerStart | None = None
    for level in range(1, len(spans)):
        cost *= spans[level - 1] / spans[level]
        if deadline.expired() or deadline.remaining() < 1.2 * cost:
            break
        means = padded.reshape(-1, spans[level]).mean(axis=1)
        tic = time.perf_counter()
        value = evaluate_blocks(data, spans[level], means, None)[0]
        cost = time.perf_counter() - tic
        if on_value is not None:
            on_value(value)
        if best is not None and value <= best.value:
            break
        best = FinerStart(level, value, np.repeat(means, spans[level]))
    return best


def block_ascent(
    data: ChainData,
    y: np.ndarray,
    z: np.ndarray,
    upper: float,
    deadline: Deadline,
    *,
    spans: tuple[int, ...],
    iterations: int = 5000,
    on_improve=None,
    floor: float = -math.inf,
    first_cost=lambda y, z: 0.0,
    until: Deadline | None = None,
    log=None,
    value: float = -math.inf,
    first: np.ndarray | None = None,
    predict=None,
    method: str = "bundle",
) -> BlockAscent:
    """Bundle ascent on block-constant multipliers, coarse to fine.

    ``y`` and ``z`` are slot multipliers (the warm start); each level averages
    them over its blocks, ascends (at most ``LEVEL_SHARE`` of the time left, and
    until it stalls, but for the last level) and hands its best point, slot by
    slot, to the next level. ``spans`` must each divide the previous one. At most
    ``iterations`` pricings in all; the deadline is checked before each, and a
    pricing is not started when its predicted time exceeds what is left:
    ``first_cost(y, z)`` (slot multipliers) for the first, the last one's time for
    the next, and a level's first at the previous level's last time scaled by the
    ratio of block lengths (the block programme's work is at most inversely
    proportional to the block length). ``until`` (default ``deadline``) is the
    caller's own deadline: where the next level, or after the last the slot pricing,
    could not price ``FEW_PRICINGS`` times before it, the level goes on to it. ``value`` is what ``y``
    is known to be worth (a level's point replaces it only where better); ``first`` (default ``y``)
    is where the first level starts instead. ``predict(y, span)`` (slot multipliers), where given,
    estimates a block pricing's cost, so that the bundle shortens steps whose pricing would be dear.
    ``method`` is one of :data:`METHODS`.
    """
    # Every level's blocks tile the same padded horizon, so a coarse point is exactly a fine one: the
    # value carries over from level to level.
    horizon = -(-y.size // spans[0]) * spans[0]
    y = np.concatenate([y, np.zeros(horizon - y.size)])
    z = np.concatenate([z, np.zeros(horizon - z.size)]) if z.size else z
    best, best_y, best_z, used = value, y, z, 0
    prev = None
    # A finer subgradient level starts at the step its coarser one had reached (the value carries over);
    # the bundle keeps it, and it is handed on to the slot phase's subgradient.
    factor = 1.0
    cost = first_cost(y, z)  # predicted seconds of the level's first pricing
    for level, span in enumerate(spans):
        last = level == len(spans) - 1
        blocks = horizon // span
        origin = best_y if level or first is None else np.concatenate([first, np.zeros(horizon - first.size)])
        yb = origin.reshape(blocks, span).mean(axis=1)
        zb = best_z.reshape(blocks, span).mean(axis=1) if z.size else z
        pricer = block_pricer(data, span, prev)
        if level:  # the previous level's last pricing, scaled
            cost *= spans[level - 1] / span
        common = dict(
            on_improve=on_improve, floor=max(best, floor), span=span, factor=factor,
            first_cost=lambda y, z, cost=cost: cost,
        )  # fmt: skip
        ascent: Bundle | Ascent
        if method == "bundle":
            shorten = None if predict is None else lambda y, z, span=span: predict(np.repeat(y, span), span)
            ascent = Bundle(data, upper, pricer, last=last, predict=shorten, **common)
        else:
            # A level that is not the last stops once its step factor has halved four times.
            min_factor = 1e-3 if last else factor * LEVEL_MIN_FACTOR
            ascent = Ascent(data, upper, pricer, min_factor=min_factor, **common)
        tic = time.perf_counter()
        ascent.run(yb, zb, deadline if last else deadline.share(LEVEL_SHARE), iterations - used)
        outer = until or deadline
        if outer.bounded and not outer.expired():
            # A finer level (after the last, the slot pricing) that cannot price a few times in the time
            # left would only stall: stay on this one, to the end of ``until``.
            done = ascent.iterations
            ahead = (ascent.last_cost if done else cost) * span / (1 if last else spans[level + 1])
            if ahead * FEW_PRICINGS > outer.remaining():
                ascent.as_last()
                ascent.run(ascent.best_y, ascent.best_z, outer, iterations - used - done)
                last = True
        used += ascent.iterations
        prev = pricer.last[0]
        factor = ascent.factor
        cost = ascent.last_cost if ascent.iterations else cost
        if log is not None:
            log(span, ascent.iterations, ascent.best, time.perf_counter() - tic)
        if ascent.best > best:
            best = ascent.best
            best_y = np.repeat(ascent.best_y, span)
            best_z = np.repeat(ascent.best_z, span) if z.size else z
        if last or deadline.expired() or used >= iterations:
            break
    return BlockAscent(best, best_y, best_z, used, factor, cost, prev)
