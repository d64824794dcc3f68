"""WAIT's and Nested WAIT's thresholds: Eq. (1)'s coefficients, the fluid sizing, Theorem 2's buffer.

See :mod:`kvsched.heuristics.wait` (section *Thresholds*) for the rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsched.costmodel import make_cost_model
from kvsched.costmodel.base import BatchView
from kvsched.errors import InputError
from kvsched.heuristics.checks import check_choice
from kvsched.heuristics.fluid import eq1_coefficients, fluid_equilibrium, kv_mass
from kvsched.instances.model import Limits, TimeModel

#: The most requests a stage's threshold may count. Beyond it a margin, eps, d0 or d1 far too large made it
#: (1e308 gave inf, cast to int64 garbage, and the run "stalled" without naming a parameter).
MAX_THRESHOLD = 2.0**53


def _counts(raw: np.ndarray) -> np.ndarray:
    """Thresholds ``raw`` (already rounded) as int64 counts of at least 1, or one clear error."""
    raw = np.asarray(raw, dtype=float)
    if not np.all(np.isfinite(raw)) or np.any(raw > MAX_THRESHOLD):
        raise InputError(
            "WAIT thresholds: a stage would admit more than 2**53 requests (or infinitely many): margin, "
            "eps, d0 or d1 is far too large"
        )
    return np.maximum(1, raw).astype(np.int64)


ThresholdMode = Literal["fluid", "paper", "code"]
TypeKey = Literal["io", "cls"]
Design = Literal["outputs", "predicted", "given"]


def eq1_of(time_model: TimeModel) -> tuple[float, float]:
    """Eq. (1)'s (d0, d1) for a time model: exact when it is of that form, else a two-point probe.

    The probe times a batch of 64 decodes with no context and one with 1024 KV
    tokens each: ``d1`` is the slope per KV token, ``d0`` the rest.
    """
    try:
        return eq1_coefficients(time_model)
    except InputError:
        pass
    model = make_cost_model(time_model.name, dict(time_model.params))
    n = 64
    phases = np.full(n, 1, dtype=np.int64)  # Phase.DECODE
    ones = np.ones(n, dtype=np.int64)
    t0 = model.batch_time(BatchView(ones, np.zeros(n, dtype=np.int64), phases))
    t1 = model.batch_time(BatchView(ones, np.full(n, 1024, dtype=np.int64), phases))
    d1 = max((t1 - t0) / (n * 1024), 0.0)
    d0 = max(t0 - d1 * n, 1e-12)
    return float(d0), float(d1)


@dataclass(frozen=True, slots=True)
class _Budget:
    """Per-batch limits a full stage-aligned batch must respect (tokens of memory mass)."""

    memory: float
    tokens: float
    running: float

    @classmethod
    def of(cls, limits: Limits) -> _Budget:
        inf = float("inf")
        tok = [c for c in (limits.max_batch_tokens, limits.max_prefill_tokens) if c is not None]
        return cls(
            float(limits.kv_blocks * limits.block_size),
            float(min(tok)) if tok else inf,
            float(limits.max_running) if limits.max_running is not None else inf,
        )


def wait_thresholds(
    prompt: Sequence[int],
    output: Sequence[int],
    rates: Sequence[float],
    d0: float,
    d1: float,
    limits: Limits,
    *,
    mode: ThresholdMode = "fluid",
    margin: float = 0.0,
    batch_size: int | None = None,
    overload: bool = False,
    strict: bool = True,
) -> np.ndarray:
    """WAIT's per-stage thresholds ``n_j`` (see the module docstring).

    ``overload=True`` (a burst: every request at once) skips the equilibrium;
    ``rates`` are then only relative weights (e.g. the counts per type).

    Raises
    ------
    InputError
        When even one request per stage of every type does not fit the limits
        (fluid mode; with ``strict=False`` all ones are returned instead), or
        ``B`` is missing (paper/code modes).
    """
    check_choice("thresholds", mode, ThresholdMode)
    I = np.asarray(prompt, dtype=np.int64)  # noqa: E741 -- the README's symbol
    O = np.asarray(output, dtype=np.int64)  # noqa: E741
    lam = np.asarray(rates, dtype=float)
    if mode != "fluid":
        B = batch_size if batch_size is not None else limits.max_running
        if B is None:
            raise InputError(f"thresholds={mode!r} needs batch_size or the instance's max_running")
        share = lam / lam.sum()
        raw = B * share / O if mode == "paper" else B * lam / float(lam @ O)
        return _counts(np.floor(raw + 1e-9))
    budget = _Budget.of(limits)
    mass = kv_mass(I, O, limits.block_size).astype(float)
    tokens = (I + O - 1).astype(float)

    def fits(n: np.ndarray) -> bool:
        return bool(n @ mass <= budget.memory and n @ tokens <= budget.tokens and n @ O <= budget.running)

    if not overload:
        eq = fluid_equilibrium(lam, I, O, d0, d1)
        if eq.stable:
            n = _counts(np.ceil(eq.per_stage * (1.0 + margin) - 1e-9))
            if fits(n):
                return n
    # Overload (or M* > M): the largest c with floor(c * lambda) fitting every limit.
    lam = lam / lam.max()
    c_hi = min(budget.memory / (lam @ mass), budget.tokens / (lam @ tokens), budget.running / (lam @ O))
    n = _counts(np.floor(c_hi * lam + 1e-9))
    # The max(1, .) floor can overshoot: shrink the largest stage load among thresholds above 1 (a
    # type's threshold never drops to 0, which would leave its requests waiting for ever).
    while not fits(n) and n.max() > 1:
        n[np.argmax(np.where(n > 1, n * mass, -1.0))] -= 1
    if not fits(n) and strict:
        raise InputError(
            f"WAIT: one request per stage of every type needs {int(n @ mass)} KV tokens, "
            f"{int(n @ tokens)} tokens and {int(n @ O)} running requests a batch, over the limits "
            f"(M = {budget.memory:g}, C = {budget.tokens:g}, max_running = {budget.running:g})"
        )
    return n


def boundary_theta(n_prev: float, n_k: float, p: float) -> float:
    """Lemma 8 / Eq. (20): the root ``theta > 0`` of ``e^{-theta n_k} (1 - p + p e^theta)^{n_prev} = 1``.

    ``inf`` when the boundary queue cannot build up (``n_k >= n_prev`` or ``p = 0``);
    ``0`` when the drift ``n_k - n_prev p`` is not negative (no buffer suffices).
    """
    if p <= 0 or n_k >= n_prev:
        return math.inf
    if n_k - n_prev * p <= 0:
        return 0.0

    def g(th: float) -> float:
        return -th * n_k + n_prev * math.log1p(p * math.expm1(th))

    lo, hi = 0.0, 1.0
    while g(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True, slots=True)
class NestedDesign:
    """Nested WAIT's segments and thresholds.

    Parameters
    ----------
    ends
        ``O_1 < ... < O_m``: segment k holds stages ``ends[k-1] .. ends[k] - 1``.
    rates
        Per-type arrival rates (type k ends at ``ends[k]``).
    thresholds
        ``n_k`` per segment.
    memory
        ``M^pi = sum_k n_k sum_{s in seg k} blocks(I + s)`` (exact; tokens).
    buffer
        Theorem 2's extra memory (14): ``sum_{k>=2} (I + O_{k-1} - 1)(n_k + ln(m B / delta) / theta_k)``
        (``inf`` when a boundary drift is not negative).
    """

    ends: np.ndarray
    rates: np.ndarray
    thresholds: np.ndarray
    memory: float
    buffer: float


def nested_design(
    ends: Sequence[int],
    rates: Sequence[float],
    prompt: int,
    d0: float,
    d1: float,
    limits: Limits,
    *,
    mode: ThresholdMode = "fluid",
    margin: float = 0.0,
    eps: float = 0.05,
    batch_size: int | None = None,
    buffer: bool = True,
    delta: float = 0.1,
    horizon: int = 10_000,
    overload: bool = False,
    strict: bool = True,
) -> NestedDesign:
    """Nested WAIT's thresholds for types ending at ``ends`` with common prompt ``prompt``.

    Fluid mode takes ``n_k = ceil(c Lambda_k (1 + eps)^{k-1})`` with ``c`` the
    equilibrium ``Delta T* (1 + margin)`` if the batch plus (with ``buffer``) the
    safety buffer of Eq. (14) (overflow probability ``delta`` over ``horizon``
    batches) fits the limits, else the largest ``c`` that fits; if no ``c`` fits
    with the buffer, the buffer is dropped; if one request a stage does not fit
    either, ``strict`` raises, else all thresholds are 1 (the policy's LIFO
    safety net then evicts as needed). Paper/code modes: ``n_k`` from §6
    (``proportional to Lambda_k``) with ``B`` (see :func:`wait_thresholds`).
    """
    check_choice("thresholds", mode, ThresholdMode)
    e = np.asarray(ends, dtype=np.int64)
    lam = np.asarray(rates, dtype=float)
    if e.size == 0 or (np.diff(e) <= 0).any() or e[0] < 1 or lam.shape != e.shape:
        raise InputError("nested WAIT: ends must be increasing positive lengths, one rate each")
    starts = np.concatenate([[0], e[:-1]])
    b = limits.block_size
    seg_mass = np.array(
        [b * float((-(-(prompt + np.arange(s, t)) // b)).sum()) for s, t in zip(starts, e, strict=True)],
        dtype=float,
    )
    seg_tokens = np.array([prompt + (t - s) - 1 for s, t in zip(starts, e, strict=True)], dtype=float)
    seg_len = (e - starts).astype(float)
    boundary_kv = np.array([b * -(-(prompt + s - 1) // b) for s in starts], dtype=float)
    tail = np.cumsum(lam[::-1])[::-1]  # Lambda_k
    budget = _Budget.of(limits)
    m = e.size

    def buf(n: np.ndarray) -> float:
        total = 0.0
        for k in range(1, m):
            th = boundary_theta(n[k - 1], n[k], tail[k] / tail[k - 1])
            if th == 0.0:
                return math.inf
            total += boundary_kv[k] * (n[k] + (math.log(m * horizon / delta) / th if th < math.inf else 0.0))
        return total

    def fits(n: np.ndarray, with_buffer: bool) -> bool:
        mem = float(n @ seg_mass) + (buf(n) if with_buffer else 0.0)
        return bool(
            mem <= budget.memory and n @ seg_tokens <= budget.tokens and n @ seg_len <= budget.running
        )

    def design(n: np.ndarray) -> NestedDesign:
        return NestedDesign(e, lam, n, float(n @ seg_mass), buf(n))

    if mode != "fluid":
        B = batch_size if batch_size is not None else limits.max_running
        if B is None:
            raise InputError(f"thresholds={mode!r} needs batch_size or the instance's max_running")
        n = _counts(np.floor(B * tail / float(tail @ seg_len) + 1e-9))
        return design(n)
    with np.errstate(over="ignore"):  # an eps far too large: _counts names it
        shape = tail * (1.0 + eps) ** np.arange(m)

    def n_of(c: float) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return _counts(np.ceil(c * shape - 1e-9))

    if not overload:
        per_type_prompt = np.full(m, prompt)
        eq = fluid_equilibrium(lam, per_type_prompt, e, d0, d1)
        if eq.stable:
            c = eq.iteration_time * (1.0 + margin)
            for with_buffer in (True, False) if buffer else (False,):
                if fits(n_of(c), with_buffer):
                    return design(n_of(c))
    # Overload (or too big): bisection on the largest threshold c * max(shape).
    for with_buffer in (True, False) if buffer else (False,):
        if not fits(n_of(0.0), with_buffer):
            continue
        lo, hi = 0.0, budget.memory / float(seg_mass.min()) + 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if fits(n_of(mid / shape.max()), with_buffer):
                lo = mid
            else:
                hi = mid
        return design(n_of(lo / shape.max()))
    if not strict:
        return design(np.ones(m, dtype=np.int64))
    raise InputError(
        f"nested WAIT: one request per stage of every segment needs {int(seg_mass.sum())} KV tokens "
        f"and {int(seg_len.sum())} running requests a batch, over the limits"
    )
