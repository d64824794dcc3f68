"""A lower bound on a batch's time that is separable over its items.

For every supported cost model and every batch B of at most ``tau_max`` tokens::

    T(B) >= fixed + [B has a decode] fixed_decode + [B has a prefill or refill] fixed_prefill
            + sum over items of g(item),

    g(decode reading m KV)           = per_token + decode + decode_kv m
    g(chunk of c tokens on m KV)     = (per_token + prefill_token) c + prefill
                                       + prefill_quad (c^2 + 2mc) + prefill_kv m + prefill_sq c^2

with every coefficient >= 0, so dropping items from the right-hand side keeps it
a lower bound. A :class:`Separable` is one such inequality; :func:`separable_forms`
gives a few per cost model (they differ in how the batch's token term is split
between ``fixed`` and ``per_token``), each valid on its own.

The token term (the part of T that depends on the batch's token load tau only)
is bounded by a line ``n0 + n1 tau`` under it on ``1 <= tau <= tau_max``: a
supporting line of its *largest convex minorant* (the lower convex hull of its
values at the integer loads). Stepped, hinged or tiled token terms are linear
between known knots, so the hull of their values at the knots (both sides) and
the ends is their convex minorant. Negative steps (the shipped A100 stepped set
has some: a GEMM kernel switch makes a larger batch faster) need no special
case: the hull lies under the function whatever the signs, so the bounds stay
valid for any fit, monotone or not. ``minorant_gap`` reports what convexifying
cost: the largest relative distance between the token term and its hull.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from kvsched.costmodel import (
    CalibratedCost,
    CostModel,
    HingeCost,
    InfermaxLinear,
    RadTiling,
    Roofline,
    StaircaseCost,
    UnitCost,
)
from kvsched.instances.model import Instance

#: Coefficients are shrunk by this relative amount so that float rounding in the model's own sums
#: can never put a bound above a schedule.
SAFETY = 1e-9
#: At most this many supporting lines of the convex minorant are tried (spread over the hull).
MAX_LINES = 6


@dataclass(frozen=True, slots=True)
class Separable:
    """One separable lower bound on the batch time (see the module docstring). Coefficients >= 0."""

    fixed: float = 0.0
    fixed_decode: float = 0.0
    fixed_prefill: float = 0.0
    per_token: float = 0.0
    decode: float = 0.0
    decode_kv: float = 0.0
    prefill: float = 0.0
    prefill_token: float = 0.0
    prefill_quad: float = 0.0
    prefill_kv: float = 0.0
    prefill_sq: float = 0.0
    #: Largest relative gap between the model's token term and the convex minorant it was bounded by.
    minorant_gap: float = 0.0
    #: The token-load line used: ``fixed`` includes ``line[0]``, ``per_token`` includes ``line[1]``.
    line: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        for name in _COEFFS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"separable bound: {name} must be finite and >= 0, got {value}")

    def scaled(self, factor: float) -> Separable:
        """This form with every coefficient times ``factor`` (the batch time it bounds, times ``factor``)."""
        return replace(self, **{k: getattr(self, k) * factor for k in _COEFFS})

    def shrunk(self) -> Separable:
        """This form a hair under itself (:data:`SAFETY`), so that float rounding never lifts a bound."""
        return self.scaled(1.0 - SAFETY)

    def lower(self, tokens: np.ndarray, context: np.ndarray, decode: np.ndarray) -> float:
        """The right-hand side for one batch (items' tokens, KV before, decode flags): for tests."""
        c = tokens.astype(np.float64)
        m = context.astype(np.float64)
        pre = ~decode
        t = self.fixed + self.per_token * float(c.sum())
        if decode.any():
            t += (
                self.fixed_decode
                + self.decode * float(decode.sum())
                + self.decode_kv * float(m[decode].sum())
            )
        if pre.any():
            cp, mp = c[pre], m[pre]
            t += (
                self.fixed_prefill
                + self.prefill * float(pre.sum())
                + self.prefill_token * float(cp.sum())
                + self.prefill_quad * float((cp * cp + 2 * mp * cp).sum())
                + self.prefill_kv * float(mp.sum())
                + self.prefill_sq * float((cp * cp).sum())
            )
        return t


_COEFFS = (
    "fixed",
    "fixed_decode",
    "fixed_prefill",
    "per_token",
    "decode",
    "decode_kv",
    "prefill",
    "prefill_token",
    "prefill_quad",
    "prefill_kv",
    "prefill_sq",
)


# ------------------------------------------------------------------ the token term and its minorant
def lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the lower convex hull of the points (x sorted ascending, distinct)."""
    hull: list[int] = []
    for k in range(x.size):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            # j is above the chord from i to k: drop it (cross product, exact enough for floats here).
            if (y[j] - y[i]) * (x[k] - x[i]) >= (y[k] - y[i]) * (x[j] - x[i]):
                hull.pop()
            else:
                break
        hull.append(k)
    return np.array(hull, dtype=np.int64)


def minorant_lines(loads: np.ndarray, values: np.ndarray) -> tuple[list[tuple[float, float]], float]:
    """Lines ``(n0, n1)`` with n0, n1 >= 0 under the token term at every integer load, and the hull's gap.

    ``loads`` must include every knot of the term (both sides) and both ends, so that the term is
    linear between consecutive loads; the lower hull of these points is then its convex minorant.
    Returned: a few supporting lines (the flat line at the minimum, the line through the origin, and
    hull edges of slope >= 0 and intercept >= 0), and ``max (value - hull) / value``.
    """
    order = np.argsort(loads, kind="stable")
    x, y = loads[order].astype(np.float64), values[order].astype(np.float64)
    keep = np.concatenate([[True], np.diff(x) > 0])
    x, y = x[keep], y[keep]
    h = lower_hull(x, y)
    hull_at = np.interp(x, x[h], y[h])
    gap = float(np.max(np.where(y > 0, (y - hull_at) / np.where(y > 0, y, 1.0), 0.0)))
    lines = [(float(y.min()), 0.0)]
    through_origin = float(np.min(y / x))
    if through_origin > 0:
        lines.append((0.0, through_origin))
    edges = []
    for i, j in itertools.pairwise(h):
        slope = (y[j] - y[i]) / (x[j] - x[i])
        intercept = y[i] - slope * x[i]
        if slope > 0 and intercept >= 0:
            edges.append((float(intercept), float(slope)))
    if len(edges) > MAX_LINES - 2:
        pick = np.unique(np.linspace(0, len(edges) - 1, MAX_LINES - 2).round().astype(int))
        edges = [edges[k] for k in pick]
    return lines + edges, max(gap, 0.0)


def _knot_loads(knots: list[float], tau_max: int) -> np.ndarray:
    pts = [1.0, float(tau_max)]
    for k in knots:
        f = math.floor(k)
        pts += [f, f + 1.0, math.ceil(k)]
    arr = np.array(pts)
    return np.unique(arr[(arr >= 1) & (arr <= tau_max)])


def _token_term(cost: CostModel, tau_max: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Loads (knots and ends) and the token term's values there, for the models whose term is piecewise linear."""
    if isinstance(cost, HingeCost):
        x = _knot_loads([cost.b0], tau_max)
        return x, cost.c + cost.a * np.maximum(0.0, x - cost.b0)
    if isinstance(cost, StaircaseCost):
        x = _knot_loads(list(np.arange(1, tau_max / cost.b0 + 1) * cost.b0), tau_max)
        return x, cost.c + cost.a * np.ceil(x / cost.b0)
    if isinstance(cost, CalibratedCost):
        knots = [k for k, _ in cost.steps] + [k for k, _ in cost.hinges]
        for size, _ in cost.tiles:
            knots += list(np.arange(1, tau_max / size + 1) * size)
        x = _knot_loads(knots, tau_max)
        return x, cost.non_attention(x)
    if isinstance(cost, RadTiling):
        x = _knot_loads(list(np.arange(1, tau_max / cost.t_col + 1) * cost.t_col), tau_max)
        return x, cost.overhead + cost.inv_mu_lin * np.ceil(x / cost.t_col) + cost.nonlinear_time * x
    return None


# ------------------------------------------------------------------ per cost model
def tau_max(instance: Instance) -> int:
    """Most tokens a batch of ``instance`` can process (the loads :func:`separable_forms` must cover).

    Each processed token appends a KV token, so at most M (whole blocks), and at most C.
    """
    lim = instance.limits
    cap = lim.kv_blocks * lim.block_size
    return int(min(cap, lim.max_batch_tokens or cap))


def separable_forms(cost: CostModel, tau_max: int) -> list[Separable]:
    """Separable lower bounds on ``cost``'s batch time for batches of at most ``tau_max`` tokens.

    Empty for a cost model this module does not know (no seconds-based bound is claimed then).
    """
    tau_max = max(1, int(tau_max))
    if isinstance(cost, UnitCost):
        return [Separable(fixed=cost.slot)]
    if isinstance(cost, InfermaxLinear):
        return [
            Separable(
                fixed=cost.a0,
                fixed_decode=cost.b0,
                fixed_prefill=cost.p0,
                per_token=cost.a1,
                decode_kv=cost.b1,
                prefill=cost.p3,
                prefill_quad=cost.p1,
                prefill_kv=cost.p2,
                line=(cost.a0, cost.a1),
            ).shrunk()
        ]
    if isinstance(cost, Roofline):
        return [f.shrunk() for f in _roofline_forms(cost, tau_max)]
    term = _token_term(cost, tau_max)
    if term is None:
        return []
    lines, gap = minorant_lines(*term)
    if isinstance(cost, CalibratedCost):
        base = Separable(
            fixed_decode=cost.b0,
            fixed_prefill=cost.p0,
            decode=cost.b2,
            decode_kv=cost.b1,
            prefill=cost.p3,
            prefill_quad=cost.p1,
            prefill_kv=cost.p2,
            prefill_sq=cost.p4,
        )
    elif isinstance(cost, RadTiling):
        base = _rad_attention(cost)
    else:  # hinge, staircase: the token load is all there is
        base = Separable()
    forms = [
        replace(
            base, fixed=base.fixed + n0, per_token=base.per_token + n1, minorant_gap=gap, line=(n0, n1)
        ).shrunk()
        for n0, n1 in lines
    ]
    if isinstance(cost, CalibratedCost):
        # It reads the token term at its knots, not through the hull: it gives up nothing to it.
        forms.append(_per_type_form(base, *term).shrunk())
    return forms


def _per_type_form(base: Separable, loads: np.ndarray, values: np.ndarray) -> Separable:
    """``base`` with its phase fixed parts and the token term charged per token, by the token's phase.

    A decode-only batch of tau tokens pays ``fixed_decode + N(tau)``, so each of its tokens can be
    charged ``phi_d = min over tau of (fixed_decode + N(tau)) / tau``; likewise ``phi_p`` with
    ``fixed_prefill`` for a prefill-only batch. A mixed batch pays both fixed parts, more than
    ``max(fixed_decode, fixed_prefill) + N(tau) >= tau max(phi_d, phi_p)``, so the charges hold for
    every batch. Against the hull lines this charges a phase's fixed part at the token term's most
    efficient load instead of spreading it over a full budget: under a stepped fit whose cheapest
    load per token is below C (384 tokens of the A100 Llama-2-7B set at C = 512), each token pays
    more. N is linear between consecutive ``loads``, so (F + N) / tau is monotone there and its
    minimum over integer loads is at one of them.
    """
    phi_d = float(np.min((base.fixed_decode + values) / loads))
    phi_p = float(np.min((base.fixed_prefill + values) / loads))
    low = min(phi_d, phi_p)
    return replace(
        base,
        fixed_decode=0.0,
        fixed_prefill=0.0,
        per_token=base.per_token + low,
        decode=base.decode + phi_d - low,
        prefill_token=base.prefill_token + phi_p - low,
        line=(0.0, low),
    )


def _rad_attention(cost: RadTiling) -> Separable:
    # Eq. 5: T_DSA(i) >= v (ceil(d/v_col) i / v_row + i / v_col ceil(d/v_row)), i = m + 1 (ceil(x) >= x).
    v = cost.gemv_tile_time * (
        math.ceil(cost.d / cost.v_col) / cost.v_row + math.ceil(cost.d / cost.v_row) / cost.v_col
    )
    # Eq. 6: ceil(span/t_row) ceil(c/t_col) ... >= span c / (t_row t_col) ..., span = m + c, and
    # c (m + c) = c^2 + mc >= (c^2 + 2mc) / 2.
    g = cost.gemm_tile_time * (
        math.ceil(cost.d / cost.t_red) / (cost.t_row * cost.t_col)
        + math.ceil(cost.d / cost.t_row) / (cost.t_col * cost.t_red)
    )
    return Separable(decode=cost.layers * v, decode_kv=cost.layers * v, prefill_quad=cost.layers * g / 2)


def _roofline_forms(cost: Roofline, tau_max: int) -> list[Separable]:
    """Roofline: every kernel is max(compute, memory) >= either one, so each term has linear minorants.

    The token term ``overhead + layers (GEMMs + element-wise + all-reduce)(tau)`` is a sum of maxima of
    affine functions of tau, hence convex: the secant through two consecutive integer loads lies under it
    at every integer load. Attention and the LM head are bounded item by item (decode attention by its
    memory traffic, prefill attention by its FLOPs, the head by its memory traffic).
    """
    tp, bw = cost.tp, cost.mem_bw * cost.bw_eff
    flops = cost.peak_flops * cost.flops_eff
    b = cost.dtype_bytes
    kv_row = 2.0 * cost.kv_heads * cost.head_dim / tp  # K and V values per KV token read
    q_row = 2.0 * cost.heads * cost.head_dim / tp
    decode_kv = cost.layers * kv_row * b / bw  # per KV token read (the decode reads m + 1)
    decode = decode_kv + cost.layers * q_row * b / bw
    # Prefill attention FLOPs: 4 heads head_dim per pair, pairs = (c^2 + 2mc) / 2 + c / 2.
    pair = cost.layers * 4.0 * cost.heads * cost.head_dim / tp / flops
    head_fixed = cost.hidden * cost.vocab / tp * b / bw
    head_item = (cost.hidden + cost.vocab / tp) * b / bw

    def token_term(tau: float) -> float:
        return cost.overhead + cost.layers * (cost.linear_time(tau) + cost.allreduce_time(tau))

    base = Separable(
        fixed=head_fixed,
        decode=decode + head_item,
        decode_kv=decode_kv,
        prefill=head_item,
        prefill_token=pair / 2,
        prefill_quad=pair / 2,
    )
    grid = np.unique(np.geomspace(1, max(tau_max - 1, 1), 8).round().astype(int))
    forms = []
    for tau in grid.tolist():
        lo, hi = token_term(tau), token_term(tau + 1)
        slope = max(hi - lo, 0.0)
        n0 = lo - slope * tau
        if n0 < 0:
            continue
        forms.append(replace(base, fixed=base.fixed + n0, per_token=slope, line=(n0, slope)))
    return forms or [replace(base, fixed=base.fixed + token_term(1), line=(token_term(1), 0.0))]
