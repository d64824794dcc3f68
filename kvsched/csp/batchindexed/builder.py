"""Writes the batch-indexed model, one method per constraint family (see the package docstring)."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from kvsched.csp.batchindexed.data import GRID_TOL, Horizon
from kvsched.csp.batchindexed.durations import linear_duration
from kvsched.csp.batchindexed.expr import Lin, lin_sum, term
from kvsched.csp.batchindexed.tokens import add_token_rows
from kvsched.csp.batchindexed.variables import Variables
from kvsched.csp.bounds import lower_bounds
from kvsched.csp.model import INF, LinearModel
from kvsched.errors import InputError
from kvsched.stop import Deadline

if TYPE_CHECKING:
    from kvsched.csp.batchindexed.model import BatchIndexed


class Builder:
    """One build of the model: the rows go into ``self.m``, the variables into ``self.v``.

    It reads the instance data of its formulation (``prompt``, ``output``,
    limits, flags) through attribute access, so that each constraint family
    reads like the model it writes.
    """

    def __init__(
        self,
        data: BatchIndexed,
        horizon: Horizon,
        J: int,
        t_ub: float,
        *,
        symmetry: bool,
        cuts: bool | str,
        strengthen: bool,
        dominance: bool,
        stop: Deadline | None = None,
    ) -> None:
        self.data = data
        # Checked once per request and family: DeadlineReached ends a build that would overrun.
        self.stop = stop or Deadline.never()
        self.h = horizon
        self.J = J
        self.t_ub = t_ub
        self.symmetry = symmetry
        self.cuts = cuts
        self.strengthen = strengthen
        self.dominance = dominance
        self.need_h = data.need_phase or data.objective == "sum-ttft" or bool(cuts)
        self.m = LinearModel(name=f"batch-indexed {data.objective}")

    def __getattr__(self, name: str):
        # Only called for names the builder itself lacks: the formulation's instance data.
        return getattr(self.data, name)

    # ------------------------------------------------------------ the model
    def build(self) -> Variables:
        self.v = self.variables()
        for i in range(self.n):
            self.stop.check()
            for j in range(1, self.J + 1):
                self.processing(i, j)
                self.kv_held(i, j)
                self.eviction(i, j)
                self.phase(i, j)
                self.arrival_rows(i, j)
                self.running(i, j)
        self.stop.check()
        self.batch_rows()
        self.time_rows()
        self.objective_rows()
        self.cut_rows()
        self.symmetry_rows()
        if self.strengthen:
            add_token_rows(self)
        return self.v

    # ---------------------------------------------------------- row helpers
    def row(self, e: Lin, lo: float, hi: float, name: str) -> None:
        items = [(v, c) for v, c in e.t.items() if c != 0]
        if not items:
            if e.k < lo - 1e-9 or e.k > hi + 1e-9:
                raise AssertionError(f"constant row {name} is violated ({e.k} not in [{lo}, {hi}])")
            return
        lo2 = -INF if lo == -INF else lo - e.k
        hi2 = INF if hi == INF else hi - e.k
        self.m.add_row([v for v, _ in items], [c for _, c in items], lo2, hi2, name)

    def ind(self, var: int, value: int, e: Lin, lo: float, hi: float, name: str) -> None:
        m = self.m
        if m.lb[var] == m.ub[var]:  # a fixed indicator: the row always or never applies
            if int(m.lb[var]) == value:
                self.row(e, lo, hi, name)
            return
        items = [(v, c) for v, c in e.t.items() if c != 0]
        if not items:
            if e.k < lo - 1e-9 or e.k > hi + 1e-9:  # the indicator must take the other value
                if value == 1:
                    m.ub[var] = 0.0
                else:
                    m.lb[var] = 1.0
            return
        lo2 = -INF if lo == -INF else lo - e.k
        hi2 = INF if hi == INF else hi - e.k
        m.add_indicator(var, value, [v for v, _ in items], [c for _, c in items], lo2, hi2, name)

    # ------------------------------------------------------------ variables
    def variables(self) -> Variables:
        m, J, n, holes = self.m, self.J, self.n, self.holes
        out, U, cap = self.output, self.peak, self.cap
        var = m.add_var

        def fixed(name: str, value: float) -> int:
            return var(name, value, value)

        def grid() -> list[list[int]]:
            return [[0] * (J + 1) for _ in range(n)]

        G, d, kv, c, g, e, mb = grid(), grid(), grid(), grid(), grid(), grid(), grid()
        H, rho, delta, x = grid(), grid(), grid(), grid()
        alpha: list[list[int] | None] = [None] * n
        eta: list[list[int] | None] = [None] * n
        no_release = "no-release" in holes
        last_done = self.h.last_done if self.h.last_done is not None else np.full(n, J)
        last_first = self.h.last_first
        for i in range(n):
            o, b0 = int(out[i]), int(self.first_batches[i])
            done_from = int(self.min_batches[i])
            G[i][0], d[i][0], kv[i][0] = fixed(f"G[{i},0]", 0), fixed(f"d[{i},0]", 0), fixed(f"m[{i},0]", 0)
            c[i][0], g[i][0] = fixed(f"c[{i},0]", 0), fixed(f"g[{i},0]", 0)
            if self.need_h:
                H[i][0] = fixed(f"H[{i},0]", 0)
            if self.track_refill:
                rho[i][0] = fixed(f"rho[{i},0]", 0)
            for j in range(1, J + 1):
                lo = min(o, max(0, o - (J - j), o - (last_done[i] - j)))  # O - G tokens take O - G batches
                if last_first is not None and j >= last_first[i]:
                    lo = max(lo, 1)
                hi = min(o, max(0, j - b0 + 1))
                if lo > hi:
                    raise InputError(
                        f"horizon of {J} batches is too short for request {self.instance.requests[i].id!r}"
                    )
                G[i][j] = var(f"G[{i},{j}]", lo, hi)
                d[i][j] = var(
                    f"d[{i},{j}]", 1 if j >= min(J, last_done[i]) else 0, 1 if j >= done_from else 0
                )
                kv[i][j] = var(f"m[{i},{j}]", 0, 0 if (j == J and not no_release) else int(U[i]))
                c[i][j] = var(f"c[{i},{j}]", 0, int(cap[i]))
                g[i][j] = var(f"g[{i},{j}]", 0, 1 if j >= b0 else 0)
                if self.allow_eviction and j >= 2:
                    e[i][j] = var(f"e[{i},{j}]", 0, 1)
                    mb[i][j] = var(f"mb[{i},{j}]", 0, int(U[i]))
                else:
                    e[i][j] = -1  # no eviction variable
                    mb[i][j] = kv[i][j - 1]
                if self.need_h:
                    H[i][j] = var(f"H[{i},{j}]", 1 if lo >= 1 else 0, 1 if hi >= 1 else 0)
                if self.need_phase:
                    delta[i][j] = var(f"delta[{i},{j}]", 0, 1 if j >= b0 + 1 else 0)
                    if self.exact_phase:
                        x[i][j] = var(f"x[{i},{j}]", 0, 1)
                if self.track_refill:
                    rho[i][j] = var(f"rho[{i},{j}]", 0, 1 if (j >= 2 and j >= b0 + 1) else 0)
            if self.timed and self.arrival[i] > self.a_min + GRID_TOL:
                alpha[i] = [0] + [var(f"alpha[{i},{j}]", 0, 1) for j in range(1, J + 1)]
            if self.run_cap is not None:
                eta[i] = [0] + [var(f"eta[{i},{j}]", 0, 1) for j in range(1, J + 1)]
        u = [0] + [var(f"u[{j}]", 0, 1) for j in range(1, J + 1)]
        tau: list[int] = [0] * (J + 1)
        end: list[int] = [0] * (J + 1)
        if self.timed:
            for j in range(1, J + 1):
                tau[j] = var(f"tau[{j}]", self.a_min, self.t_ub, integer=self.integral_time)
                end[j] = var(f"E[{j}]", self.a_min, self.t_ub, integer=self.integral_time)
        return Variables(J, G, d, kv, c, g, e, mb, H, rho, delta, x, alpha, eta, u, tau, end)

    # ------------------------------------------------- request dynamics (i, j)
    def _unprocessed(self, i: int, j: int) -> Lin:
        """``a = I + G[j-1] - mb``: the tokens request i has not processed, once evictions applied."""
        v = self.v
        return int(self.prompt[i]) + term(v.G[i][j - 1]) - term(v.mb[i][j])

    def processing(self, i: int, j: int) -> None:
        """Tokens processed and generated: ``c <= a``, ``g`` iff ``c = a``, ``G`` counts, ``d`` completes."""
        v, holes, tag = self.v, self.holes, f"{i},{j}"
        o, cc = int(self.output[i]), int(self.cap[i])
        c, g = term(v.c[i][j]), term(v.g[i][j])
        dp, dc = term(v.d[i][j - 1]), term(v.d[i][j])
        a = self._unprocessed(i, j)
        self.row(c - a, -INF, 0, f"tok[{tag}]")
        if "free-token" not in holes:
            self.ind(v.g[i][j], 1, c - a, 0, INF, f"full[{tag}]")
        if "stalled-token" not in holes:
            self.ind(v.g[i][j], 0, c - a, -INF, -1, f"left[{tag}]")
        self.row(term(v.G[i][j]) - term(v.G[i][j - 1]) - g, 0, 0, f"gen[{tag}]")
        self.row(o * dc - term(v.G[i][j]), -INF, 0, f"done-[{tag}]")
        self.row(term(v.G[i][j]) - dc, -INF, o - 1, f"done+[{tag}]")
        self.row(dc - dp, 0, INF, f"dmono[{tag}]")
        self.row(c + cc * dp, -INF, cc, f"fin-c[{tag}]")
        self.row(g + dp, -INF, 1, f"fin-g[{tag}]")

    def kv_held(self, i: int, j: int) -> None:
        """KV after the batch: held plus appended, released if the request completed."""
        v, tag, uu = self.v, f"{i},{j}", int(self.peak[i])
        after = term(v.m[i][j]) - term(v.mb[i][j]) - term(v.c[i][j])
        if "no-release" in self.holes:
            self.row(after, 0, 0, f"kv[{tag}]")
        else:
            self.ind(v.d[i][j], 0, after, 0, 0, f"kv[{tag}]")
            self.row(term(v.m[i][j]) + uu * term(v.d[i][j]), -INF, uu, f"release[{tag}]")

    def eviction(self, i: int, j: int) -> None:
        """``e => mb = 0, c = 0``; ``e = 0 => mb = m[j-1]``; only holders, only in non-empty batches."""
        v, tag = self.v, f"{i},{j}"
        if v.e[i][j] < 0:
            return
        uu, cc = int(self.peak[i]), int(self.cap[i])
        ev, mbe, mp, c = term(v.e[i][j]), term(v.mb[i][j]), term(v.m[i][j - 1]), term(v.c[i][j])
        self.row(mbe - mp, -INF, 0, f"ev-keep-[{tag}]")
        self.row(mbe - mp + uu * ev, 0, INF, f"ev-keep+[{tag}]")
        self.row(mbe + uu * ev, -INF, uu, f"ev-drop[{tag}]")
        self.row(c + cc * ev, -INF, cc, f"ev-idle[{tag}]")
        self.row(ev - mp, -INF, 0, f"ev-held[{tag}]")
        self.row(ev - term(v.u[j]), -INF, 0, f"ev-batch[{tag}]")

    def phase(self, i: int, j: int) -> None:
        """``H`` (has generated), decode ``delta`` and refill ``rho`` exactly as the core derives them."""
        v, holes, tag = self.v, self.holes, f"{i},{j}"
        o, cc = int(self.output[i]), int(self.cap[i])
        Gc, C_ = term(v.G[i][j]), term(v.c[i][j])
        if self.need_h:
            self.row(term(v.H[i][j]) - Gc, -INF, 0, f"H-[{tag}]")
            self.row(Gc - o * term(v.H[i][j]), -INF, 0, f"H+[{tag}]")
        if not self.need_phase:
            return
        dl, hp = term(v.delta[i][j]), term(v.H[i][j - 1])
        item = term(v.x[i][j]) if self.exact_phase else C_
        self.row(dl - item, -INF, 0, f"dec-item[{tag}]")
        self.row(dl - hp, -INF, 0, f"dec-gen[{tag}]")
        if self.exact_phase:
            xx = term(v.x[i][j])
            self.row(xx - C_, -INF, 0, f"x-[{tag}]")
            self.row(C_ - cc * xx, -INF, 0, f"x+[{tag}]")
        if self.track_refill:
            rr, rp = term(v.rho[i][j]), term(v.rho[i][j - 1])
            ev = term(v.e[i][j]) if v.e[i][j] >= 0 else Lin()
            gp = term(v.g[i][j - 1])
            self.row(dl + rr, -INF, 1, f"dec-refill[{tag}]")
            self.row(rr - ev - hp, -1, INF, f"rho-ev[{tag}]")
            self.row(rr - rp + gp, 0, INF, f"rho-keep[{tag}]")
            self.row(rr - ev - rp, -INF, 0, f"rho-up1[{tag}]")
            self.row(rr - ev + gp, -INF, 1, f"rho-up2[{tag}]")
            self.row(rr - hp, -INF, 0, f"rho-up3[{tag}]")
            if self.exact_phase:
                self.row(dl - term(v.x[i][j]) - hp + rr, -1, INF, f"dec-exact[{tag}]")
            return
        if "phase-label" in holes:
            # The notes' [R] rule: decode iff generated before and one token left.
            self.ind(v.delta[i][j], 1, self._unprocessed(i, j), -INF, 1, f"dec-one[{tag}]")
        if self.exact_phase:
            self.row(dl - term(v.x[i][j]) - hp, -1, INF, f"dec-exact[{tag}]")

    def arrival_rows(self, i: int, j: int) -> None:
        """A request is processed only in batches that start once it has arrived."""
        v, tag = self.v, f"{i},{j}"
        if v.alpha[i] is None:
            return
        al = v.alpha[i][j]
        self.row(term(v.c[i][j]) - int(self.cap[i]) * term(al), -INF, 0, f"arr[{tag}]")
        at = term(v.E[j]) if "arrival-at-end" in self.holes else term(v.tau[j])
        self.ind(al, 1, at, float(self.arrival[i]), INF, f"arrived[{tag}]")
        if j < self.J:
            self.row(term(al) - term(v.alpha[i][j + 1]), -INF, 0, f"arr-mono[{tag}]")

    def running(self, i: int, j: int) -> None:
        """``eta`` marks a request holding or appending KV in batch j (for ``max_running``)."""
        v = self.v
        if v.eta[i] is not None:
            held = term(v.mb[i][j]) + term(v.c[i][j])
            self.row(held - int(self.peak[i]) * term(v.eta[i][j]), -INF, 0, f"running[{i},{j}]")

    # ------------------------------------------------------------- batches
    def batch_rows(self) -> None:
        """Per batch: KV during it, the token and prefill budgets, ``max_running``, empty batches last."""
        v, R, J = self.v, range(self.n), self.J
        v.durations = [Lin()]
        for j in range(1, J + 1):
            u = term(v.u[j])
            toks = lin_sum(term(v.c[i][j]) for i in R)
            held = lin_sum(term(v.mb[i][j]) + term(v.c[i][j]) for i in R)
            self.row(held - self.kv_cap * u, -INF, 0, f"kvcap[{j}]")
            self.row(toks - self.tok_total * u, -INF, 0, f"C[{j}]")
            self.row(toks - u, 0, INF, f"nonempty[{j}]")
            if j < J:
                self.row(term(v.u[j + 1]) - u, -INF, 0, f"u-mono[{j}]")
            if self.run_cap is not None:
                self.row(lin_sum(term(v.eta[i][j]) for i in R), -INF, self.run_cap, f"R[{j}]")
            if self.need_phase and self.pre_cap is not None:
                pre = toks - lin_sum(term(v.delta[i][j]) for i in R)
                self.row(pre, -INF, self.pre_cap, f"P[{j}]")
            v.durations.append(u if self.unit else linear_duration(self, j))

    def time_rows(self) -> None:
        """Start and end of each batch: ``E_j = tau_j + duration``, ``tau_{j+1} >= E_j`` (idling allowed)."""
        if not self.timed:
            return
        v, J, holes = self.v, self.J, self.holes
        for j in range(1, J + 1):
            self.row(term(v.E[j]) - term(v.tau[j]) - v.durations[j], 0, 0, f"end[{j}]")
            if j < J:
                gap_hi = 0 if "no-idle" in holes else INF
                self.row(term(v.tau[j + 1]) - term(v.E[j]), 0, gap_hi, f"order[{j}]")
        if "no-idle" in holes:
            self.row(term(v.tau[1]), self.a_min, self.a_min, "start")

    # ----------------------------------------------------------- objective
    def objective_rows(self) -> None:
        """Total latency, makespan or sum of TTFT, in the cost model's time unit (see the package docstring)."""
        m, v, J, obj = self.m, self.v, self.J, self.objective
        R = range(self.n)
        if not self.timed:
            if obj == "makespan":
                for j in range(1, J + 1):
                    m.obj[v.u[j]] = 1.0
                m.obj_offset = self.a_min
            else:
                flag = v.d if obj == "total-latency" else v.H
                for i in R:
                    for j in range(0, J):
                        m.obj[flag[i][j]] -= 1.0
                m.obj_offset = float(self.n * J)
            return
        if obj == "makespan":
            m.obj[v.E[J]] = 1.0
            return
        flag = v.d if obj == "total-latency" else v.H
        least = self.min_batches if obj == "total-latency" else self.first_batches
        for i in R:
            lo = float(self.arrival[i]) + float(least[i]) * self.t_min
            hi = min(self.t_ub, float(self.h.deadline[i]))
            if self.integral_time:
                lo, hi = math.ceil(lo - 1e-9), math.floor(hi + 1e-9)
            f = m.add_var(f"F[{i}]", min(lo, hi), hi, integer=self.integral_time, obj=1.0)
            v.fin.append(f)
            m.obj_offset -= float(self.arrival[i])
            for j in range(1, J + 1):
                self.ind(flag[i][j - 1], 0, term(f) - term(v.E[j]), 0, INF, f"F[{i},{j}]")

    # ----------------------------------------------------------- valid cuts
    def cut_rows(self) -> None:
        """Optional valid inequalities: token work, KV area, the combinatorial objective bound."""
        v, m, J, cuts = self.v, self.m, self.J, self.cuts
        v.zs = [[] for _ in range(self.n)]
        if not cuts:
            return
        for i in range(self.n):
            ii, o = int(self.prompt[i]), int(self.output[i])
            area = o * ii + o * (o - 1) // 2
            # Work: every one of the I + O - 1 tokens is processed at least once; by the end of
            # batch j all of I + G - 1 have been (G >= 1). KV area: at its k-th generation a
            # request holds I + k - 1 tokens during the batch.
            self.row(lin_sum(term(v.c[i][j]) for j in range(1, J + 1)), int(self.peak[i]), INF, f"work[{i}]")
            held = lin_sum(term(v.mb[i][j]) + term(v.c[i][j]) for j in range(1, J + 1))
            self.row(held, area, INF, f"area[{i}]")
            if cuts != "full":
                continue
            done_tok = Lin()
            ts = sorted({0, o // 4, o // 2, (3 * o) // 4, o - 1})
            prev_z = None
            for j in range(1, J + 1):
                done_tok = done_tok + term(v.c[i][j])
                self.row(done_tok - term(v.G[i][j]) - (ii - 1) * term(v.H[i][j]), 0, INF, f"cum[{i},{j}]")
                # Z = KV area held up to batch j >= area of the tokens generated so far (convex in G).
                z = m.add_var(f"Z[{i},{j}]", 0, J * int(self.peak[i]))
                zprev = term(prev_z) if prev_z is not None else Lin()
                self.row(term(z) - zprev - term(v.mb[i][j]) - term(v.c[i][j]), 0, 0, f"Z[{i},{j}]")
                self.row(term(z) - area * term(v.d[i][j]), 0, INF, f"Zd[{i},{j}]")
                for t in ts:
                    self.row(
                        term(z) - (ii + t) * term(v.G[i][j]), -(t * (t + 1)) / 2, INF, f"ZG[{i},{j},{t}]"
                    )
                prev_z = z
                v.zs[i].append(z)
        if self.unit:
            lb = lower_bounds(self.instance).for_objective(self.objective) / self.scale
            objective_expr = Lin({k: c for k, c in enumerate(m.obj) if c != 0}, m.obj_offset)
            self.row(objective_expr, lb, INF, "objective-bound")

    def symmetry_rows(self) -> None:
        """Identical requests (same I, O and arrival) complete in index order (A4.2 #7)."""
        if not self.symmetry:
            return
        v = self.v
        for group in self.identical_groups():
            for i, k in itertools.pairwise(group):
                for j in range(1, self.J):
                    self.row(term(v.d[i][j]) - term(v.d[k][j]), 0, INF, f"sym[{i},{k},{j}]")
