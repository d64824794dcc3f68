"""A built batch-indexed model, returned by value: the model, its variables, and the maps between
schedules and solution vectors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsched.csp.batchindexed.data import SNAP_TOL
from kvsched.csp.batchindexed.variables import Variables
from kvsched.csp.model import LinearModel
from kvsched.errors import InputError
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Schedule

if TYPE_CHECKING:
    from kvsched.csp.batchindexed.model import BatchIndexed


@dataclass(frozen=True, eq=False)
class BatchModel:
    """What :meth:`BatchIndexed.build` returns.

    Attributes
    ----------
    model
        The linear model (its ``hint`` set when the build had one).
    data
        The formulation it was built from (instance data, flags).
    v
        The variables.
    need_h
        Whether the model has the "has generated" variables ``H``.
    time_bound
        The end of the time horizon (model units).
    """

    model: LinearModel
    data: BatchIndexed
    v: Variables
    need_h: bool
    time_bound: float

    @property
    def horizon_batches(self) -> int:
        return self.v.J

    def __getattr__(self, name: str):
        # Only called for names the model lacks: the formulation's instance data.
        return getattr(self.data, name)

    def vector_of(self, schedule: Schedule, *, check: bool = True) -> np.ndarray:
        """The full assignment of this model that represents ``schedule``.

        ``schedule`` is replayed through the core and every variable
        (auxiliaries included) is set from the replayed state. ``check=False``
        applies batches without checking them (tests: the vector a model would
        give an *illegal* schedule).
        """
        m, V, J = self.model, self.v, self.v.J
        if "no-release" in self.holes:
            raise InputError("no vector for a legal schedule in the no-release model (it keeps finished KV)")
        if len(schedule.batches) > J:
            raise InputError(f"the schedule has {len(schedule.batches)} batches, more than the horizon {J}")
        x = np.array(m.lb, dtype=np.float64)  # fixed variables keep their value
        state = EngineState(self.instance, self.cost)
        n, R = self.n, range(self.n)
        Gp = np.zeros(n, dtype=np.int64)
        zacc = np.zeros(n, dtype=np.int64)
        prev_end = self.a_min
        durs = []
        for j in range(1, J + 1):
            kv_prev = state.kv.copy()
            refill_prev = state.refilling.copy()
            if j <= len(schedule.batches):
                b = schedule.batches[j - 1]
                ev = np.zeros(n, dtype=bool)
                ev[b.evicted] = True
                cvec = np.zeros(n, dtype=np.int64)
                cvec[b.requests] = b.tokens
                start, dur = b.start / self.scale, b.duration / self.scale
                if check:
                    state.step(b)
                else:
                    state.apply(b)
                nonempty = 1
            else:
                ev = np.zeros(n, dtype=bool)
                cvec = np.zeros(n, dtype=np.int64)
                start, dur, nonempty = prev_end, 0.0, 0
            mbv = np.where(ev, 0, kv_prev)
            refilling = np.where(ev, Gp > 0, refill_prev)  # the core's flag once evictions applied
            G = state.generated.copy()
            gv = G - Gp
            H_prev = Gp >= 1
            item = cvec >= 1
            if "phase-label" in self.holes:  # the notes' rule: generated before, one token left
                dec = item & H_prev & (self.prompt + Gp - mbv == 1)
            else:
                dec = item & H_prev & ~refilling
            x[V.u[j]] = nonempty
            for i in R:
                x[V.c[i][j]] = cvec[i]
                x[V.g[i][j]] = gv[i]
                x[V.G[i][j]] = G[i]
                x[V.d[i][j]] = float(state.done[i])
                x[V.m[i][j]] = state.kv[i]
                if V.e[i][j] >= 0:
                    x[V.e[i][j]] = float(ev[i])
                    x[V.mb[i][j]] = mbv[i]
                if self.need_h:
                    x[V.H[i][j]] = float(G[i] >= 1)
                if self.need_phase:
                    x[V.delta[i][j]] = float(dec[i])
                    if self.exact_phase:
                        x[V.x[i][j]] = float(item[i])
                if self.track_refill:
                    x[V.rho[i][j]] = float(refilling[i])
                if V.alpha[i] is not None:
                    x[V.alpha[i][j]] = float(self.arrival[i] <= start + 1e-9)
                if V.eta[i] is not None:
                    x[V.eta[i][j]] = float(mbv[i] + cvec[i] >= 1)
            if self.timed:
                x[V.tau[j]] = start
                x[V.E[j]] = start + dur
            if not self.unit and self.exact_phase:
                self._products_values(x, j, cvec, mbv, dec, item)
            zacc = zacc + mbv + cvec
            for i in R:
                if V.zs[i]:
                    x[V.zs[i][j - 1]] = zacc[i]
            durs.append(dur)
            prev_end = start + dur
            Gp = G
        for var, i, k, j in V.zvars:
            x[var] = float(x[V.G[i][j]] >= k)
        if self.timed and self.objective != "makespan":
            st = state
            when = st.completion if self.objective == "total-latency" else st.first_token
            for i in R:
                x[V.fin[i]] = when[i] / self.scale
        return x

    def _products_values(self, x, j, cvec, mbv, dec, item) -> None:
        prods = self.v.prods.get(j, {})
        if "v" in prods:
            x[prods["v"]] = float(dec.any())
        if "z" in prods:
            x[prods["z"]] = float((item & ~dec).any())
        for i in range(self.n):
            if ("w", i) in prods:
                x[prods[("w", i)]] = mbv[i] * float(dec[i])
            if ("Y", i) in prods:
                x[prods[("Y", i)]] = mbv[i] * float(item[i] and not dec[i])
            if ("bits", i) in prods:
                bits, ells = prods[("bits", i)]
                for b, (bv, ell) in enumerate(zip(bits, ells, strict=True)):
                    on = (int(cvec[i]) >> b) & 1
                    x[bv] = on
                    x[ell] = on * (cvec[i] + 2 * mbv[i])

    # ------------------------------------------------------------------ decode
    def schedule_from(self, sol: np.ndarray) -> Schedule:
        """Decode a solution vector of this model into batches, stepped through the core.

        Starts come from the model's ``tau`` (nudged onto the previous end or an
        item's arrival when within :data:`SNAP_TOL`); under unit time with
        simultaneous arrivals the batches run back to back. Phases and
        durations are the core's. Raises ScheduleError if the core rejects a batch.
        """
        V, J = self.v, self.v.J
        state = EngineState(self.instance, self.cost)
        arrival = np.array([r.arrival for r in self.instance.requests])
        batches = []
        clock = self.a_min * self.scale
        for j in range(1, J + 1):
            cvec = np.array([round(sol[V.c[i][j]]) for i in range(self.n)], dtype=np.int64)
            ev = [i for i in range(self.n) if V.e[i][j] >= 0 and round(sol[V.e[i][j]]) == 1]
            req = np.flatnonzero(cvec >= 1)
            if req.size == 0 and not ev:
                continue
            if self.timed:
                tau = float(sol[V.tau[j]])
                start = (round(tau) if self.integral_time else tau) * self.scale
                tol = SNAP_TOL * max(1.0, abs(start))
                if state.num_batches and state.clock - tol <= start < state.clock:
                    start = state.clock
                if req.size:
                    latest = float(arrival[req].max())
                    if latest - tol <= start < latest:
                        start = latest
            else:
                start = clock
            batch = state.make_batch(start, req, cvec[req], ev)
            state.step(batch)
            batches.append(batch)
            clock = batch.end
        return Schedule(tuple(batches), {"formulation": "batch-indexed"})
