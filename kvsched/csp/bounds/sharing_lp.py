"""The processor-sharing LP: a bound on total latency in seconds that charges each batch to every request in it.

Valid for every legal schedule (scope ``all``: chunking, pauses, evictions and refills, idling, budgets) of an
instance under a cost model with a separable lower bound (:mod:`.separable`) and a largest batch time
(:func:`~kvsched.csp.bounds.seconds_lagrangian.max_batch_seconds`). The argument is in ``docs/bounds.md``
(*The processor-sharing LP*); in short:

Total latency is the integral of N(t), the requests arrived and not finished. Cut time into intervals
``W_i = [i D, (i + 1) D)``, ``D >= T_max`` (the longest batch); the batches starting in ``W_i`` lie in
``J_i = [start_i + o_{i-1}, end_i + o_i)``, ``0 <= o_i <= T_max``, and the ``J_i`` tile time. Over ``J_i``:

* **in the batches**: the m_k requests of batch k are all in the system while it runs, and under a separable
  form ``T_k >= F + sum_(items) g``; by Cauchy-Schwarz ``m_k (F + G_k) >= F m_k + (sum sqrt g)^2``, and over
  the R_i batches ``int_{J_i} N >= F U_i + V_i^2 / R_i`` (U: items, V: their summed sqrt g). The convex
  ``V^2 / R`` enters as tangents ``2 s V - s^2 R``, added where the LP's point violates it (cutting planes);
  every tangent is valid, so every round's LP is a relaxation;
* **waiting**: requests that arrived by ``start_i`` and whose last op starts after ``end_i`` are in the system
  for all of ``W_i``, and ``int_{J_i} N = int_{W_i} N + Q_i - Q_{i-1}`` with ``Q_i`` the integral over
  ``[end_i, end_i + o_i)``, at most ``T_max`` times the requests not done by ``end_{i-1}``;
* ``z_i`` (the LP's integral over ``J_i``) is at least both.

What ties them: the machine (per separable form, ``F R_i + `` the items' least own terms ``<= D + o_i -
o_{i-1}``), the token, prefill, KV and running budgets per batch, and the number of requests done by
``end_i``, which is at most the number whose sizes, smallest first, fit in what was processed by then (items,
prompt tokens, generated tokens, own work under each form: a concave piecewise-linear bound on the
cumulative amounts). The work and KV of the ops processed are at least those of the cheapest ops that had
arrived (convex in the op count: tangents).

The bound is a weak-duality value from HiGHS's duals (:func:`~kvsched.csp.bounds.lp_model.dual_bound`), so
neither the solver's tolerances nor a round cut off can make it exceed a schedule.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from kvsched.csp.bounds.lp_model import (
    SAFETY,
    LPBoundResult,
    LPModel,
    exclusive_cumsum,
    from_first_arrival,
    solve_lp,
)
from kvsched.csp.bounds.seconds import Tokens, op_costs
from kvsched.csp.bounds.seconds_lagrangian import batch_bounds, shortest_batch
from kvsched.csp.bounds.separable import Separable
from kvsched.csp.certificate import Bound, Scope
from kvsched.instances.model import Instance
from kvsched.stop import Deadline

#: The bound's source name.
SOURCE = "sharing-lp"
#: Lines of each concave "requests done" bound and tangents of each convex cumulative cost, per interval.
DONE_LINES = 8
COST_TANGENTS = 6
#: The first round's tangents of V^2/R: s from S_LOW to S_HIGH (sqrt seconds), geometric.
S_LOW, S_HIGH, S_COUNT = 1e-3, 30.0, 12
#: The horizon runs this many mean isolated times past the last arrival (nothing past it is charged).
TAIL = 16.0
#: Cutting-plane rounds stop when no interval's V^2/R term is violated by more than this share.
CUT_TOLERANCE = 1e-4


def done_lines(sizes: np.ndarray, count: int) -> list[tuple[float, float]]:
    """Lines above the most requests that fit in a given total size.

    The most requests of ``sizes`` whose sizes sum to at most x (smallest first) is below each line of the
    concave interpolation of (sum of the k smallest, k); a subset of its lines still lies above it.

    Parameters
    ----------
    sizes
        The requests' sizes (zeros count as done at once).
    count
        Lines wanted at most (k spread evenly over 1..the positive sizes).

    Returns
    -------
    list[tuple[float, float]]
        Lines (b, slope) with ``done <= b + slope x`` for every x >= 0.
    """
    pos = np.sort(sizes[sizes > 0]).astype(np.float64)
    zeros = float(sizes.size - pos.size)
    if pos.size == 0:
        return [(zeros, 0.0)]
    prefix = np.concatenate([[0.0], np.cumsum(pos)])
    ks = np.unique(np.linspace(1, pos.size, min(count, pos.size)).round().astype(np.int64))
    return [(zeros + k - 1 - prefix[k - 1] / pos[k - 1], 1.0 / pos[k - 1]) for k in ks]


def cheapest_tangents(counts: np.ndarray, unit: np.ndarray, points: int) -> list[tuple[float, float]]:
    """Lines below the least cumulative cost of x ops, the x cheapest of those that had arrived.

    At x = (ops with at most S tokens) the cheapest sum is exact; beyond, each further op costs at least
    ``unit[S + 1]``, and below, each removed one at most ``unit[S] <= unit[S + 1]``.

    Parameters
    ----------
    counts
        ``counts[S]``: the ops with S known tokens that had arrived.
    unit
        ``unit[S]``: the least cost of one such op, nondecreasing in S.
    points
        Tangent points, at evenly spread shares of the ops.

    Returns
    -------
    list[tuple[float, float]]
        Lines (c0, slope) with ``cumulative cost >= c0 + slope x`` after x ops (empty when no op arrived).
    """
    cum = np.cumsum(counts)
    total = cum[-1]
    if total <= 0:
        return []
    cost = np.cumsum(counts * unit)
    last = unit.size - 1
    out = []
    for share in np.linspace(0.0, 1.0, points + 1)[1:]:
        s = min(int(np.searchsorted(cum, share * total)), last)
        nxt = unit[min(s + 1, last)]
        out.append((float(cost[s] - nxt * cum[s]), float(nxt)))
    return out


@dataclass(frozen=True, slots=True)
class _Data:
    """What the LP reads of an instance: requests by arrival, the forms and their per-op costs."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    items: np.ndarray  # least batches holding j: ceil(I / q) prompt chunks and O - 1 generating ops
    lo: np.ndarray  # S of token 2 (I + 1) and of token O (I + O - 1): j's generating ops
    hi: np.ndarray
    forms: list[Separable]
    fixed: list[float]  # F per form
    token: list[float]  # a prompt token's least own term per form
    op_cost: list[np.ndarray]  # least own term of a generating op with S known tokens, nondecreasing in S
    work: list[np.ndarray]  # a request's least own work per form
    held: np.ndarray  # KV held by a generating op with S known tokens
    tok: Tokens
    t_max: float
    delta: float

    @classmethod
    def of(cls, instance: Instance) -> _Data | None:
        bb = batch_bounds(instance)
        if bb is None:
            return None
        forms, t_max = bb.forms, bb.t_max
        tok = Tokens.of(instance)
        order = np.argsort(tok.arrival, kind="stable")
        a, i, o = tok.arrival[order], tok.prompt[order], tok.output[order]
        chunks = np.maximum(1.0, np.ceil(i / tok.q_cap))
        grid = np.maximum(tok.grid, 1.0)
        # The least own terms as a function of S, made nondecreasing (a running minimum from the right
        # lies below them) so that the cheapest ops are those with the fewest tokens.
        op_cost = [np.minimum.accumulate(op_costs(f, grid)[::-1])[::-1] for f in forms]
        token = [f.per_token + f.prefill_token + f.prefill_sq for f in forms]
        work = [
            tok.over_tokens(exclusive_cumsum(c))[order] + t * i + f.prefill * chunks
            for f, c, t in zip(forms, op_cost, token, strict=True)
        ]
        return cls(
            a, i, o, chunks + o - 1, tok.lo[order], tok.hi[order], forms,
            [f.fixed + min(f.fixed_decode, f.fixed_prefill) for f in forms], token, op_cost, work,
            tok.blocks(tok.grid), tok, float(t_max), max(shortest_batch(f) for f in forms),
        )  # fmt: skip

    def isolated_mean(self) -> float:
        """A request's mean least time alone: its items' fixed parts and own work (the largest form's)."""
        per = [fx * self.items + w for fx, w in zip(self.fixed, self.work, strict=True)]
        return float(np.max(np.mean(per, axis=1)))


class _Builder:
    """The LP of one grid: columns per interval, the rows above, and the in-batch tangents."""

    def __init__(self, data: _Data, step: float, horizon: float) -> None:
        self.d = data
        self.step = step
        self.n_int = max(1, math.ceil(horizon / step))
        self.m = LPModel()

    def build(self, deadline: Deadline) -> bool:
        d, m, step, n_int = self.d, self.m, self.step, self.n_int
        n, nf, tok = d.arrival.size, len(d.forms), d.tok
        starts = np.arange(n_int) * step
        ends = starts + step
        arr_end = np.searchsorted(d.arrival, ends, side="left")
        # Time each request arrived by end_i spends in W_i if it is still there at end_i; one done by then
        # takes away at most D of it.
        prefix_a = np.concatenate([[0.0], np.cumsum(d.arrival)])
        arr_start = np.searchsorted(d.arrival, starts, side="right")
        waited = step * arr_start + (arr_end - arr_start) * ends - (prefix_a[arr_end] - prefix_a[arr_start])
        arr_tail = np.searchsorted(d.arrival, ends + d.t_max, side="left")
        r_max = (step + d.t_max) / d.delta + 1.0
        total_i, total_g = float(d.prompt.sum()), float((d.output - 1).sum())
        kv_cap = tok.capacity
        total_k = kv_cap * r_max * n_int
        total_w = (step + d.t_max) * n_int
        total_v = n * r_max * n_int * math.sqrt(d.t_max)
        # Per interval: R, o, z, Q, done; X, E, G, K (prompt tokens, prompt chunks, generating ops, their KV);
        # per form W (the ops' own work) and V (sum of sqrt g); and the cumulative sums of X, E, G, K, W, V.
        self.R = m.cols(n_int, r_max)
        o = m.cols(n_int, d.t_max)
        self.z = m.cols(n_int, n * (step + d.t_max), cost=1.0)
        q_ = m.cols(n_int, n * d.t_max)
        done = m.cols(n_int, arr_end.astype(np.float64))
        x, e, g = m.cols(n_int, total_i), m.cols(n_int, n * r_max), m.cols(n_int, total_g)
        k_ = m.cols(n_int, total_k)
        w = [m.cols(n_int, total_w) for _ in range(nf)]
        self.V = [m.cols(n_int, total_v) for _ in range(nf)]
        # By end_i only the requests arrived by then have had prompt tokens or generating ops processed.
        arrived_i = np.concatenate([[0.0], np.cumsum(d.prompt)])[arr_end]
        arrived_g = np.concatenate([[0.0], np.cumsum(d.output - 1)])[arr_end]
        cum = {
            "x": (x, m.cols(n_int, arrived_i)), "e": (e, m.cols(n_int, n * r_max * n_int)),
            "g": (g, m.cols(n_int, arrived_g)), "k": (k_, m.cols(n_int, total_k)),
        }  # fmt: skip
        for f in range(nf):
            cum[f"w{f}"] = (w[f], m.cols(n_int, total_w * nf))
            cum[f"v{f}"] = (self.V[f], m.cols(n_int, total_v * n_int))
        self.E, self.G = e, g
        cx, ce, cg, ck = (cum[key][1] for key in "xegk")
        q = tok.q_cap
        c_cap, r_cap = tok.c_cap, tok.r_cap
        counts = np.zeros(tok.grid.size + 1)
        added = 0
        roots = [np.sqrt(c) for c in d.op_cost]
        # Once every request has arrived (most intervals), each interval's lines and tangents are the last ones.
        lines_of: dict[int, list[list[tuple[float, float]]]] = {}
        tangents_of: dict[int, list[list[tuple[float, float]]]] = {}
        for i in range(n_int):
            if i % 32 == 0 and deadline.expired():
                return False
            for per, total in cum.values():  # cumulative = previous + this interval's
                if i:
                    m.row([total[i], total[i - 1], per[i]], [1.0, -1.0, -1.0], 0.0, 0.0)
                else:
                    m.row([total[i], per[i]], [1.0, -1.0], 0.0, 0.0)
            if i:
                m.row([done[i], done[i - 1]], [1.0, -1.0], lo=0.0)
            if math.isfinite(q):
                m.row([x[i], e[i]], [1.0, -q], hi=0.0)
            if c_cap is not None:
                m.row([x[i], g[i], self.R[i]], [1.0, 1.0, -c_cap], hi=0.0)
            if math.isfinite(q):  # a batch's prompt tokens: at most min(C, P)
                m.row([x[i], self.R[i]], [1.0, -q], hi=0.0)
            if r_cap is not None:
                m.row([e[i], g[i], self.R[i]], [1.0, 1.0, -r_cap], hi=0.0)
            m.row([x[i], k_[i], self.R[i]], [1.0, 1.0, -kv_cap], hi=0.0)
            for f in range(nf):  # the machine: the batches starting in W_i fit in J_i
                cols = [self.R[i], x[i], e[i], w[f][i], o[i]] + ([o[i - 1]] if i else [])
                vals = [d.fixed[f], d.token[f], d.forms[f].prefill, 1.0, -1.0] + ([1.0] if i else [])
                m.row(cols, vals, hi=step)
            # Requests done by end_i: sizes smallest first within what was processed.
            k = int(arr_end[i])
            sized = [(d.items[:k], [ce[i], cg[i]], [1.0, 1.0]), (d.prompt[:k], [cx[i]], [1.0])]
            sized.append((d.output[:k] - 1, [cg[i]], [1.0]))
            for f in range(nf):
                sized.append(
                    (d.work[f][:k], [cum[f"w{f}"][1][i], cx[i], ce[i]], [1.0, d.token[f], d.forms[f].prefill])
                )
            if k not in lines_of:  # the same k (the arrived requests) gives the same lines
                lines_of[k] = [done_lines(sizes, DONE_LINES) for sizes, _, _ in sized]
            for (_, cols, coef), lines in zip(sized, lines_of[k], strict=True):
                for b, slope in lines:
                    m.row([done[i], *cols], [1.0, *(-slope * c for c in coef)], hi=b)
            # The generating ops of the requests arrived by end_i, by S: the cheapest ones bound the cost.
            while added < k:
                lo_s, hi_s = int(d.lo[added]), int(d.hi[added])
                if hi_s >= lo_s:
                    counts[lo_s] += 1.0
                    counts[hi_s + 1] -= 1.0
                added += 1
            per_s = np.cumsum(counts)[:-1]
            if per_s.sum() > 0:
                least = int(np.argmax(per_s > 0))
                m.row([k_[i], g[i]], [1.0, -float(d.held[least])], lo=0.0)
                units = [(ck, d.held)]
                for f in range(nf):
                    units += [(cum[f"w{f}"][1], d.op_cost[f]), (cum[f"v{f}"][1], roots[f])]
                    m.row([w[f][i], g[i]], [1.0, -float(d.op_cost[f][least])], lo=0.0)
                    m.row(
                        [self.V[f][i], g[i], x[i]],
                        [1.0, -math.sqrt(d.op_cost[f][least]), -self._chunk_root(f)],
                        lo=0.0,
                    )
                if k not in tangents_of:  # the same k gives the same ops, hence the same tangents
                    tangents_of[k] = [cheapest_tangents(per_s, unit, COST_TANGENTS) for _, unit in units]
                for (total, _), tangents in zip(units, tangents_of[k], strict=True):
                    for c0, slope in tangents:
                        m.row([total[i], cg[i]], [1.0, -slope], lo=c0)
            else:
                for f in range(nf):
                    m.row([self.V[f][i], x[i]], [1.0, -self._chunk_root(f)], lo=0.0)
            # Waiting: z_i >= (time in W_i of the arrived) - D done_i + Q_i - Q_{i-1}; Q_i <= T (arrived - done_{i-1}).
            cols = [self.z[i], done[i], q_[i]] + ([q_[i - 1]] if i else [])
            m.row(cols, [1.0, step, -1.0] + ([1.0] if i else []), lo=float(waited[i]))
            if i:
                m.row([q_[i], done[i - 1]], [1.0, d.t_max], hi=d.t_max * float(arr_tail[i]))
            else:
                m.row([q_[0]], [1.0], hi=d.t_max * float(arr_tail[0]))
        first_cuts = np.geomspace(S_LOW, S_HIGH, S_COUNT)
        for i in range(n_int):
            for f in range(nf):
                for s in first_cuts:
                    self.cut(i, f, float(s))
        return True

    def _chunk_root(self, f: int) -> float:
        """kappa with sqrt(g(chunk of c tokens)) >= kappa c for c <= q: g >= token c, and sqrt(c) >= c / sqrt(q)."""
        q = self.d.tok.q_cap
        return math.sqrt(self.d.token[f] / q) if math.isfinite(q) else 0.0

    def cut(self, i: int, f: int, s: float) -> None:
        """z_i >= F_f (E_i + G_i) + 2 s V_i - s^2 R_i (a tangent of F U + V^2 / R)."""
        m = self.m
        m.row(
            [self.z[i], self.E[i], self.G[i], self.V[f][i], self.R[i]],
            [1.0, -self.d.fixed[f], -self.d.fixed[f], -2.0 * s, s * s],
            lo=0.0,
        )

    def violated(self, point: np.ndarray) -> int:
        """Add a tangent at s = V/R wherever the point violates z >= F U + V^2/R; how many were added."""
        added = 0
        for f in range(len(self.d.forms)):
            r, v = point[self.R], point[self.V[f]]
            u = point[self.E] + point[self.G]
            need = self.d.fixed[f] * u + np.divide(v * v, r, out=np.full(r.size, np.inf), where=r > 1e-12)
            bad = (v > 1e-12) & (need > point[self.z] * (1 + CUT_TOLERANCE) + 1e-9)
            for i in np.flatnonzero(bad):
                self.cut(int(i), f, float(v[i] / max(r[i], 1e-12)))
                added += 1
        return added


#: Solve time of one round grows about as intervals^1.5 (IPM); measured 5.5 s for 226 intervals with the six
#: forms of the A100 fit on the loaded 2-core machine: the first grid is sized for three rounds in the budget.
CALIBRATION = (226, 5.5, 6)
ROUNDS_PLANNED = 3
#: Intervals of the coarse grid a bounded solve times one round on first (planned_intervals' scale).
PROBE_INTERVALS = 64
#: Rounds stop when STALL_ROUNDS in a row raise the best value by less than STALL_SHARE.
STALL_ROUNDS, STALL_SHARE = 3, 1e-3
MIN_INTERVALS, MAX_INTERVALS = 32, 600
#: The automatic grid's D is at least MIN_STEP_T_MAX longest batches, unless that leaves fewer than
#: MIN_STEP_INTERVALS intervals: HiGHS's interior point slows sharply on many intervals with D near T_max
#: (tiny.json, A100 fit: one round 4.0 s at 128 intervals, D = 2.5 T_max; 15.6 s at 280, 1.15 T_max; 24 s at 324,
#: T_max, where the 1k-request calibration planned three rounds in 26 s) for no gain (0.34132 at 4 T_max, 81
#: intervals, in 5.6 s; 0.34082 at T_max after 20 s). figure15.json's 56 intervals at D = T_max take 0.5 s a round
#: and give 2% more than 14 at 4 T_max; the 1k A100 row plans D of about 5 T_max, which this leaves alone.
MIN_STEP_T_MAX, MIN_STEP_INTERVALS = 4.0, 64


def planned_intervals(seconds: float, forms: int, scale: float | None = None) -> int:
    """Intervals for which about ROUNDS_PLANNED rounds fit in ``seconds`` (the deadline is the guard): a round
    costs ``scale`` seconds times intervals^1.5 where a round was timed on this machine, else as
    :data:`CALIBRATION` says."""
    if not math.isfinite(seconds):
        return CALIBRATION[0]
    if scale is None:
        per_round = CALIBRATION[1] * forms / CALIBRATION[2]
        n = CALIBRATION[0] * (max(seconds, 1e-3) / (ROUNDS_PLANNED * per_round)) ** (2 / 3)
    else:
        n = (max(seconds, 1e-3) / (ROUNDS_PLANNED * scale)) ** (2 / 3)
    return int(min(MAX_INTERVALS, max(MIN_INTERVALS, n)))


def stalled(history: list[tuple[float, float]]) -> bool:
    """Whether the cutting-plane rounds have stopped paying: the sharing LP's stopping rule.

    Past that point the interior point's inexact duals move the value up and down by about as much as a
    tangent adds (A100 1k, D = 1 s: within 0.2% of the final value after 7 of 19 rounds).

    Parameters
    ----------
    history
        (seconds, the LP's value) after each round, in order.

    Returns
    -------
    bool
        True when the last STALL_ROUNDS rounds raised the best value by less than STALL_SHARE.
    """
    if len(history) <= STALL_ROUNDS:
        return False
    before = max(v for _, v in history[:-STALL_ROUNDS])
    return max(v for _, v in history[-STALL_ROUNDS:]) < before * (1.0 + STALL_SHARE)


def sharing_lp_bound(
    instance: Instance,
    deadline: Deadline | None = None,
    *,
    step: float | None = None,
    tail: float | None = None,
    rounds: int = 50,
    threads: int = 2,
) -> LPBoundResult:
    """The processor-sharing LP's bound on total latency (see the module docstring).

    ``step`` (the interval length D, at least the longest batch) defaults to what three rounds of the deadline
    allow, and at least MIN_STEP_T_MAX longest batches unless that leaves fewer than MIN_STEP_INTERVALS
    intervals; ``tail`` (seconds past the last arrival that the intervals cover) to TAIL mean isolated times.
    Cutting-plane rounds run while the deadline allows and the LP's point violates a tangent; the bound is the
    best round's (each round's LP is a relaxation). ``bound`` is None for an unsupported model, an empty
    instance or when no round gave duals by the deadline.
    """
    deadline = deadline or Deadline.never()
    started = time.monotonic()
    data = _Data.of(from_first_arrival(instance))
    if data is None:
        return LPBoundResult(None, 0.0, 0, 0, 0.0, "not supported")
    span = float(data.arrival.max()) + (TAIL * data.isolated_mean() if tail is None else tail)
    floor = min(MIN_STEP_T_MAX * data.t_max, span / MIN_STEP_INTERVALS)
    best, status, history, done = -math.inf, "not solved", [], 0
    scale = None
    if step is None and deadline.bounded:
        # Time one round on a coarse grid first, on this machine: the calibration's per-round cost was 3 times
        # too low on a slower one, where the A100 1k row's grid (D = 0.81 s) finished one round of its 23 s
        # (5,028-5,314 by where the time limit cut it) and D = 1.3 s two (5,347). The round's value counts.
        probe = _Builder(data, max(span / PROBE_INTERVALS, floor, data.t_max), span)
        if probe.build(deadline):
            t0 = time.monotonic()
            value, status, _ = solve_lp(probe.m, deadline, threads)
            if value is not None and math.isfinite(value):
                best = value
                history.append((time.monotonic() - started, value))
                scale = max(time.monotonic() - t0, 1e-3) / probe.n_int**1.5
    if step is None:
        intervals = planned_intervals(deadline.remaining(), len(data.forms), scale)
        step = max(span / intervals, floor)
    step = max(float(step), data.t_max)  # the waiting rows need D >= T_max
    built = _Builder(data, step, span)
    if not built.build(deadline):
        return LPBoundResult(
            None, step, built.n_int, 0, time.monotonic() - started, "deadline while building"
        )
    while done < rounds:
        done += 1
        value, status, point = solve_lp(built.m, deadline, threads)
        if value is not None and math.isfinite(value):
            best = max(best, value)
            history.append((time.monotonic() - started, value))
        if point is None or deadline.expired() or built.violated(point) == 0 or stalled(history):
            break
    seconds = time.monotonic() - started
    if not math.isfinite(best):
        return LPBoundResult(None, step, built.n_int, done, seconds, status)
    bound = Bound(max(0.0, best * (1.0 - SAFETY)), SOURCE, Scope.ALL)
    return LPBoundResult(bound, step, built.n_int, done, seconds, status, tuple(history))
