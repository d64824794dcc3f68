"""The batch-rate LP: an interval-indexed fluid relaxation in seconds, solved with HiGHS (total latency).

Valid for every legal schedule (scope ``all``: chunking, pauses, evictions and refills, idling,
budgets) of an instance under a cost model with a separable lower bound (:mod:`.separable`) and a
largest batch time (:func:`~kvsched.csp.bounds.seconds_lagrangian.max_batch_seconds`). The argument is
in ``docs/bounds.md`` (*The batch-rate LP*); in short:

Cut time into intervals ``W_i = [i D, (i + 1) D)``. For a legal schedule let ``R_i`` be the batches
(with an item) starting in ``W_i``, ``e_{j,i}`` the batches starting in ``W_i`` with a chunk of j's
prompt (before its first token), ``x_{j,i}`` the prompt tokens in them and ``d_{j,i}`` the batches that
generate one of j's tokens 2..O (a decode, or the last chunk of a refill). Then

* ``e_{j,i} + d_{j,i} <= R_i`` (j has at most one item in a batch): **the batch rate**;
* ``x_{j,i} <= q e_{j,i}``, ``sum_i x_{j,i} = I_j``, ``sum_i e_{j,i} >= ceil(I_j / q)``,
  ``sum_i d_{j,i} = O_j - 1``; decodes done by the end of W_i are at most the prompt's share done by then;
* the machine: ``F R_i + sum_j (work of those items) <= D + o_i - o_{i-1}``, ``0 <= o_i <= T_max``
  (``o_i``: how far the last batch started before the end of W_i runs past it; the batches starting in
  W_i lie in ``[start + o_{i-1}, end + o_i]``), with ``F = fixed + min(fixed_decode, fixed_prefill)``
  and each item's least own term ``g``: one row per separable form of :func:`machine_forms` (each
  holds for every batch);
* token, prefill and running budgets: ``sum (x + d) <= C R_i``, ``sum x <= P R_i``, ``sum (e + d) <= r R_i``;
* in j's arrival interval at most ``(end - a_j) / delta + 1`` of its batches start (each lasts >= delta).

Objective (the mean-busy-time form): the generating batches of j's tokens u = 2..O start at
``t_2 < ... < t_O``, and ``C_j >= t_u + sum_{v >= u} b_v`` (each later one is a separate batch of at
least ``b_v = F + g``, the most any of the forms charges it); averaging over u,
``C_j - a_j >= mean_u (t_u - a_j) + sum_v (v - 1) b_v / (O - 1)``, and ``t_u >= max(start of its
interval, a_j)``. Requests with O = 1 take their isolated prompt time.
Batches later than ``window`` after a_j are put in one overflow column at that time, with no capacity
(a relaxation), which keeps the LP to the intervals near each arrival.

The value reported is not HiGHS's objective but a Lagrangian bound computed from its row duals,
``sum_r min(pi_r lo_r, pi_r hi_r) + sum_c min(d_c lo_c, d_c hi_c)`` with ``d = c - A^T pi``, which
is a valid lower bound on the LP (hence on every schedule) for any ``pi`` whatever HiGHS's
tolerances or status; every column has a finite box for this.
"""

from __future__ import annotations

import math
import time

import numpy as np

from kvsched.csp.bounds.lp_model import SAFETY, LPBoundResult, LPModel, from_first_arrival, solve_lp
from kvsched.csp.bounds.seconds import Tokens, op_costs, prompt_isolated
from kvsched.csp.bounds.seconds_lagrangian import batch_bounds, shortest_batch
from kvsched.csp.bounds.separable import Separable
from kvsched.csp.certificate import Bound, Scope
from kvsched.instances.model import Instance
from kvsched.stop import Deadline

#: The bound's source name.
SOURCE = "batch-rate-lp"
#: Up to this many rows HiGHS's dual simplex solves the LP, beyond it the interior point. Measured on congested
#: instances of 12-200 requests at 2,000-12,000 cells (one thread, loaded 2-core machine): simplex 1.2-4.2 times
#: faster in all 10 models up to 22,000 rows, mixed above (0.58-3.8 times at 40,000-63,000 rows), and 1.7-6 times
#: slower on the A100 1k row (11,000-21,000 cells); its dual value was at or above the interior point's in all
#: 20 (it is exact at a vertex, the interior point's within its tolerance).
SIMPLEX_MAX_ROWS = 25_000


def _build(
    instance: Instance, lines: list[Separable], step: float, window: float, t_max: float, deadline: Deadline
):
    """The LP's rows and columns, its objective constant and its request-interval count; None when the
    deadline passes while building (at 10^4-10^5 request-intervals the build takes seconds).

    Every form of ``lines`` gives each interval a machine row; a batch lasts at least the most any of
    them charges it, so the least batch times (the tails, delta) are their maxima."""
    lim = instance.limits
    tok = Tokens.of(instance)
    a, prompt, out = tok.arrival, tok.prompt, tok.output
    q = tok.q_cap
    c_cap = tok.c_cap
    p_cap = None if lim.max_prefill_tokens is None else float(lim.max_prefill_tokens)
    r_cap = tok.r_cap
    fixed = [f.fixed + min(f.fixed_decode, f.fixed_prefill) for f in lines]
    delta = max(shortest_batch(f) for f in lines)
    chunk_item = [f.prefill for f in lines]
    tok_item = [f.per_token + f.prefill_token + f.prefill_sq for f in lines]
    kp = np.maximum(1.0, np.ceil(prompt / q))
    nd = out - 1
    op_cost = [op_costs(f, prompt + 1) for f in lines]  # the cheapest generating op of j (costs grow with S)
    iso_prompt = np.max([prompt_isolated(f, tok) for f in lines], axis=0)
    nint = max(1, math.ceil((float(a.max()) + window) / step))
    starts = np.arange(nint) * step
    m = LPModel()
    r_max = (step + t_max) / delta + 1.0
    R = m.cols(nint, r_max)
    o = m.cols(nint, t_max)
    # The machine rows' entries: interval, column, then a coefficient per form of ``lines``.
    mach: list[list[np.ndarray]] = [[] for _ in range(2 + len(lines))]
    toks: list[list[np.ndarray]] = [[] for _ in range(2)]  # tokens (x and d)
    pref: list[list[np.ndarray]] = [[] for _ in range(2)]  # prefill tokens (x)
    runs: list[list[np.ndarray]] = [[] for _ in range(2)]  # items (e and d)
    const = 0.0
    cells = 0
    for j in range(a.size):
        if j % 256 == 0 and deadline.expired():
            return None
        i0 = int(a[j] // step)
        i1 = min(nint, max(i0 + 1, math.ceil((a[j] + window) / step)))
        k = i1 - i0
        cells += k
        ii = np.arange(i0, i1)
        t = np.maximum(starts[i0:i1], a[j]) - a[j]
        if nd[j] > 0:
            w = 1.0 / nd[j]
            over_t = float(starts[i1 - 1] + step - a[j]) if i1 == nint else window
            s = prompt[j] + np.arange(2, out[j] + 1) - 1  # S of tokens 2..O
            b = np.max([fx + op_costs(f, s) for fx, f in zip(fixed, lines, strict=True)], axis=0)
            const += float((np.arange(1, b.size + 1) * b).sum()) * w
        else:
            w, over_t = 0.0, 0.0
            const += float(iso_prompt[j])
        e = m.cols(k, prompt[j])
        d = m.cols(k, nd[j], cost=w * t)
        x = m.cols(k, prompt[j])
        e_ov, d_ov, x_ov = m.cols(1, prompt[j]), m.cols(1, nd[j], cost=w * over_t), m.cols(1, prompt[j])
        # Per interval s: the batch rate, then (a finite q) the chunk size; one numpy call per pattern.
        rate = np.column_stack([e, d, R[ii]])
        if math.isfinite(q):
            m.rows(rate, [1.0, 1.0, -1.0], hi=0.0, stride=2)
            m.rows(np.column_stack([x, e]), [1.0, -q], hi=0.0, stride=2, offset=1)
            m.skip_rows(2 * k)
        else:
            m.rows(rate, [1.0, 1.0, -1.0], hi=0.0)
        if math.isfinite(q):
            m.row([x_ov[0], e_ov[0]], [1.0, -q], hi=0.0)
        m.row([e[0], d[0]], [1.0, 1.0], hi=(starts[i0] + step - a[j]) / delta + 1.0)
        m.row(np.concatenate([x, x_ov]), 1.0, lo=prompt[j], hi=prompt[j])
        m.row(np.concatenate([e, e_ov]), 1.0, lo=kp[j])
        if nd[j] > 0:
            m.row(np.concatenate([d, d_ov]), 1.0, lo=nd[j], hi=nd[j])
            # decodes by the end of interval s / (O - 1) <= prompt tokens by then / I (cumulative columns)
            cd, cx = m.cols(k, nd[j]), m.cols(k, prompt[j])
            # Per interval s: cd_s = cd_{s-1} + d_s, cx_s = cx_{s-1} + x_s (no previous at s = 0), then the ratio.
            first = np.ones((k, 3), dtype=bool)
            first[0, 1] = False
            for offset, (cum, per) in enumerate(((cd, d), (cx, x))):
                prev = np.concatenate([cum[:1], cum[:-1]])
                cols = np.column_stack([cum, prev, per])
                m.rows(cols, [1.0, -1.0, -1.0], lo=0.0, hi=0.0, keep=first, stride=3, offset=offset)
            m.rows(np.column_stack([cd, cx]), [1.0 / nd[j], -1.0 / prompt[j]], hi=0.0, stride=3, offset=2)
            m.skip_rows(3 * k)
        else:
            m.row(d, 1.0, hi=0.0)
        for col, coefs in ((e, chunk_item), (d, [float(c[j]) for c in op_cost]), (x, tok_item)):
            mach[0].append(ii)
            mach[1].append(col)
            for line, coef in enumerate(coefs):
                mach[2 + line].append(np.full(k, coef))
        toks[0] += [ii, ii]
        toks[1] += [x, d]
        pref[0].append(ii)
        pref[1].append(x)
        runs[0] += [ii, ii]
        runs[1] += [e, d]
    _interval_rows(m, nint, mach, fixed, R, o, step)
    for cap, parts in ((c_cap, toks), (p_cap, pref), (r_cap, runs)):
        if cap is not None and math.isfinite(cap):
            _budget_rows(m, nint, parts, R, cap)
    return m, const, cells


def _grouped(interval: np.ndarray, cols: np.ndarray, vals: np.ndarray, nint: int):
    order = np.argsort(interval, kind="stable")
    bounds = np.searchsorted(interval[order], np.arange(nint + 1))
    return order, bounds, cols[order], vals[order]


def _interval_rows(m: LPModel, nint: int, mach, fixed: list[float], R, o, step: float) -> None:
    iv, cols0 = np.concatenate(mach[0]), np.concatenate(mach[1])
    for line, fx in enumerate(fixed):
        _, bnd, cols, vals = _grouped(iv, cols0, np.concatenate(mach[2 + line]), nint)
        for i in range(nint):
            cc, vv = cols[bnd[i] : bnd[i + 1]], vals[bnd[i] : bnd[i + 1]]
            head_c = [R[i], o[i]] + ([o[i - 1]] if i else [])
            head_v = [fx, -1.0] + ([1.0] if i else [])
            m.row(np.concatenate([head_c, cc]), np.concatenate([head_v, vv]), hi=step)


def _budget_rows(m: LPModel, nint: int, parts, R, cap: float) -> None:
    iv, cols = np.concatenate(parts[0]), np.concatenate(parts[1])
    _, bnd, cols, _ = _grouped(iv, cols, np.ones(cols.size), nint)
    for i in range(nint):
        cc = cols[bnd[i] : bnd[i + 1]]
        if cc.size:
            m.row(np.concatenate([[R[i]], cc]), np.concatenate([[-cap], np.ones(cc.size)]), hi=0.0)


def _mean_isolated(instance: Instance, f: Separable) -> float:
    tok = Tokens.of(instance)
    per_op = f.fixed + min(f.fixed_decode, f.fixed_prefill) + op_costs(f, tok.prompt + 1)
    return float(np.mean(prompt_isolated(f, tok) + per_op * (tok.output - 1)))


def pick_form(forms: list[Separable], tau_max: int) -> Separable:
    """The form that charges the most to a half-full batch, fixed part first (the batch rate is what
    this LP adds; every form gives a valid bound, this one is a heuristic choice)."""
    return max(
        forms, key=lambda f: f.fixed + min(f.fixed_decode, f.fixed_prefill) + f.per_token * tau_max / 2
    )


def machine_forms(forms: list[Separable], tau_max: int) -> list[Separable]:
    """The forms whose machine rows the LP takes: :func:`pick_form`'s, and the one with the largest fixed part.

    Each form's row holds for every schedule, so several only tighten the LP. Under a stepped fit the
    form charging most to a half-full batch is a hull edge with a small fixed part (6.7 ms on
    ``llama-2-7b_a100-80gb_tp1``), which lets short decode batches run more often than the flat line at
    the fit's smallest batch time (9.5 ms) allows: the two rows together gave 3,501 against 3,156 for
    the first alone on the A100 row (D = 3.04 s; every form, six rows, 3,505).
    """
    first = pick_form(forms, tau_max)
    flat = max(forms, key=lambda f: (f.fixed + min(f.fixed_decode, f.fixed_prefill), -f.per_token))
    return [first] if flat is first else [first, flat]


def fluid_lp_bound(
    instance: Instance,
    deadline: Deadline | None = None,
    *,
    step: float | None = None,
    window: float | None = None,
    cells: int = 10_000,
    coarsest: float = math.inf,
    threads: int = 2,
) -> LPBoundResult:
    """The batch-rate LP's bound on total latency (see the module docstring).

    ``step`` (the interval length D) and ``window`` (how long after its arrival a request's batches are
    placed in intervals) default to a grid of about ``cells`` request-intervals with the window 16 times
    a request's mean isolated time. ``bound`` is None when the model is not supported, the instance is
    empty, the grid is coarser than ``coarsest`` times the window, or HiGHS returned no duals by the
    deadline.
    """
    deadline = deadline or Deadline.never()
    started = time.monotonic()
    instance = from_first_arrival(instance)
    bb = batch_bounds(instance)
    if bb is None:
        return LPBoundResult(None, 0.0, 0, 0, 0.0, "not supported")
    n, t_max = len(instance.requests), bb.t_max
    lines = machine_forms(bb.forms, bb.tau_max)
    f = lines[0]  # pick_form's: it sizes the window
    span = max(r.arrival for r in instance.requests)
    if window is None:
        window = 16.0 * _mean_isolated(instance, f)
    if step is None:
        step = max(window * n / cells, (span + window) / cells, 1e-9)
    if step > coarsest * window:  # an interval as long as a good part of the window proves next to nothing
        return LPBoundResult(None, step, 0, 0, time.monotonic() - started, "grid too coarse", window=window)
    built = _build(instance, lines, float(step), float(window), float(t_max), deadline)
    if built is None:
        return LPBoundResult(
            None, step, 0, 0, time.monotonic() - started, "deadline while building", window=window
        )
    m, const, n_cells = built
    value, status, _ = solve_lp(m, deadline, threads, simplex=m.nrow <= SIMPLEX_MAX_ROWS)
    seconds = time.monotonic() - started
    if value is None or not math.isfinite(value):
        return LPBoundResult(None, step, n_cells, 1, seconds, status, window=window, rows=m.nrow)
    value += const
    bound = Bound(max(0.0, value * (1.0 - SAFETY)), SOURCE, Scope.ALL)
    return LPBoundResult(bound, step, n_cells, 1, seconds, status, ((seconds, value),), window, m.nrow)


#: The anytime loop's grids: the first one sized to take about FIRST_SHARE of the time left, from one
#: measured point (21,000 request-intervals of the A100 1k row solved in 20 s by HiGHS's interior point on a
#: loaded 2-core machine) and a solve time growing about as cells^1.5; then GROWTH times finer while
#: ROUND_MARGIN times the last round's time is left, up to MAX_CELLS. The first grid is no finer than an
#: interval of FIRST_FINEST of the window: sized by time alone, 8 requests got 9,000 request-intervals (5-8 s
#: of HiGHS under load, cut off by a 14 s share half the time) where 512 solve in 0.1 s and finer rounds
#: follow while time is left.
#: A second round needs ROUND_MARGIN x the first's time left, so it only runs where the calibration
#: overestimates the machine's time by about 2x or more; the first round is therefore given most of the
#: share (0.7, not 0.5: 3,885 against 3,712 on the A100 1k row in 60 s) with a 30% margin for a slower
#: solve, since a round cut off by the deadline gives nothing. The window is not the lever: at a fixed
#: number of cells, windows of 20-30 s (10-16 x the isolated time) give within 1% of each other there.
CALIBRATION = (21_000, 20.0)
FIRST_SHARE = 0.7
MIN_CELLS = 2_000
MAX_CELLS = 80_000
GROWTH = 1.5
FIRST_FINEST = 1.0 / 64
#: Not run when the first grid's interval is longer than this share of the window (at 10k requests in a
#: pipeline minute: its bound would be a small fraction of mean busy time's).
COARSEST = 1.0 / 4
ROUND_MARGIN = 2.5
#: A round whose LP grows past SIMPLEX_MAX_ROWS (the interior point after a simplex round) needs this many times
#: more time left again: on 8-12 requests such a round took 3.0-5.2 times the last one (pipe8's 2.4 s -> 7.1 s),
#: against about 1.9 times between simplex rounds, and started on ROUND_MARGIN alone it was cut off by the
#: deadline (no duals: nothing gained, and the 20 s pipeline solve of 8 requests took 14 s instead of 8).
SWITCH_MARGIN = 2.5


def first_cells(seconds: float) -> int:
    """A grid size expected to solve in about ``seconds`` (the calibration above; the deadline is the guard)."""
    if not math.isfinite(seconds):
        return CALIBRATION[0]
    cells = CALIBRATION[0] * (max(seconds, 1e-3) / CALIBRATION[1]) ** (1 / 1.5)
    return int(min(MAX_CELLS, max(MIN_CELLS, cells)))


def fluid_lp_anytime(instance: Instance, deadline: Deadline, *, threads: int = 2) -> list[LPBoundResult]:
    """Finer and finer grids while the deadline allows (each round's bound is valid on its own).

    Returns every round's result; the best bound is the largest among them. A round cut off by HiGHS's
    time limit at the deadline has no duals and no bound.
    """
    out: list[LPBoundResult] = []
    cells = min(float(first_cells(deadline.remaining() * FIRST_SHARE)), len(instance.requests) / FIRST_FINEST)
    while True:
        got = fluid_lp_bound(instance, deadline, cells=int(cells), coarsest=COARSEST, threads=threads)
        out.append(got)
        if got.bound is None or cells * GROWTH > MAX_CELLS:
            return out
        switch = got.rows <= SIMPLEX_MAX_ROWS < got.rows * GROWTH
        if deadline.remaining() < ROUND_MARGIN * (SWITCH_MARGIN if switch else 1.0) * got.seconds:
            return out
        cells *= GROWTH
