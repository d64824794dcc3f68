"""The token-indexed model: the batch-indexed class where chunks and evictions need no variables.

Applies when the batch-indexed model's :attr:`~kvsched.csp.batchindexed.BatchIndexed.normal_form`
does and every request arrives at once: unit time, no token budget C and no
prefill budget P (``max_running`` and ``allow_eviction`` are modelled). Then
some optimal schedule of the batch-indexed class (every legal schedule, chunking
and evictions included) is in *normal form*:

* a request processes tokens only in the batches where it generates one, all
  its unprocessed tokens at once (a chunk that produces no token can wait for
  the batch that does: with no budgets and unit time that batch is no longer,
  and the KV held in between only falls);
* with evictions allowed, a request that sits a batch out holds no KV in it
  (evicting it costs nothing: its refill is part of the batch where it next
  generates, which lasts one slot whatever it processes, and that batch holds
  ``I + G`` KV for it either way);
* batches in which nothing generates are dropped (every later batch moves one
  slot earlier).

So a schedule is its token batches: ``z[i,k,j] = 1`` iff request i has generated
k tokens by batch j. The k-th token of request i, generated in batch j, holds
``w = I_i + k - 1`` KV during it in every legal schedule, so with evictions the
KV during batch j is exactly ``sum w (z[i,k,j] - z[i,k,j-1])``; without them a
request also holds ``I + G - 1`` while paused, ``I z[i,1,j] + sum_{k>=2}
z[i,k,j] - (I + O - 1) z[i,O,j-1]`` in all (the last term releases it after its
completion batch). Rows: ``z`` grows with j, one token per batch
(``z[i,k,j] <= z[i,k-1,j-1]``), the KV row and the clique rows of
:meth:`~kvsched.csp.batchindexed.BatchIndexed.clique_sets`, ``max_running``.

Symmetry (keeps an optimum): identical requests (same I and O) keep their k-th
tokens in index order, ``z[a,k,j] >= z[b,k,j]`` for a < b: sorting the k-th token
batches of a group keeps every batch's multiset of token indices, hence its KV
and running count (:meth:`BatchIndexed.normal_times` does it to the warm start).
A *left-shift* rule (a request that waits in a batch it fits in could generate
there instead) also keeps an optimum, but as rows it slowed CP-SAT about twice
on the benchmark draws; :meth:`BatchIndexed.normal_times` applies it to the warm
start only.

Horizon and per-request deadlines come from an objective upper bound UB: any
schedule with objective <= UB has ``C_i <= UB - sum_{k != i} C_k``, and the
other requests alone (drop i and the batches left empty: nobody completes later)
form a schedule of the instance without i, so ``sum_{k != i} C_k`` is at least
the LP bound of that smaller instance (:meth:`TokenIndexed.deadlines`); request
i then has all its tokens by ``UB - LP_i``, the k-th by ``O - k`` batches before.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from kvsched.csp.backends import SolverOptions, lp_relaxation
from kvsched.csp.batchindexed import BatchIndexed, Lin, lin_sum, term
from kvsched.csp.model import INF, LinearModel
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.stop import Deadline, DeadlineReached

#: Slack on an LP bound before it sets a deadline (HiGHS's primal/dual tolerances are ~1e-7).
LP_TOL = 1e-5


def applies(bi: BatchIndexed) -> bool:
    """Whether the token-indexed model is exact for ``bi``'s instance (see the module docstring)."""
    return bi.normal_form and not bi.timed


class TokenIndexed:
    """Build, warm-start and decode the token-indexed model of one instance.

    Parameters
    ----------
    bi
        The batch-indexed model of the instance (its data, horizon and normal form).
    """

    def __init__(self, bi: BatchIndexed) -> None:
        if not applies(bi):
            raise ValueError("the token-indexed model needs unit time, no C or P and simultaneous arrivals")
        self.bi = bi

    # --------------------------------------------------------------- deadlines
    def deadlines(self, upper_bound: float, options: SolverOptions, passes: int = 1) -> np.ndarray | None:
        """Per-request completion batches that every schedule with objective <= UB meets (total latency).

        Request i completes by ``UB - L_i``, L_i the LP bound of the instance
        without request i on schedules with objective <= ``UB - O_i`` that meet
        the deadlines found so far (the others' part of such a schedule does:
        nobody completes later without i). Long requests go first (their
        deadlines shrink the others' horizons most); further ``passes`` use them
        all (a second pass changed nothing on the benchmark draws). Requests left when ``options.time_limit`` (for all the LPs together)
        runs out keep the horizon's deadline. None for other objectives or a
        single request.
        """
        bi = self.bi
        if bi.objective != "total-latency" or bi.n < 2:
            return None
        t0 = time.perf_counter()
        reqs = bi.instance.requests
        out = np.full(bi.n, np.iinfo(np.int64).max, dtype=np.int64)
        order = np.argsort(-bi.output, kind="stable")
        for _ in range(passes):
            changed = False
            for i in order:
                left = options.time_limit - (time.perf_counter() - t0)
                if left <= 0:
                    return out
                sub = Instance(reqs[:i] + reqs[i + 1 :], bi.instance.limits, bi.instance.time_model)
                sub_bi = BatchIndexed(sub, bi.objective, allow_eviction=bi.allow_eviction)
                stop = Deadline.after(left)
                try:
                    model = (
                        TokenIndexed(sub_bi)
                        .build(
                            upper_bound - float(bi.output[i]), None, deadlines=np.delete(out, i), stop=stop
                        )
                        .model
                    )
                except DeadlineReached:
                    return out
                lp = lp_relaxation(model, options, stop)
                if lp is not None and math.floor(upper_bound - lp[0] + LP_TOL) < out[i]:
                    out[i] = math.floor(upper_bound - lp[0] + LP_TOL)
                    changed = True
            if not changed:
                break
        return out

    # ------------------------------------------------------------------ build
    def build(
        self,
        upper_bound: float,
        hint: Schedule | None = None,
        *,
        deadlines: np.ndarray | None = None,
        cliques: bool = True,
        symmetry: bool = True,
        stop: Deadline | None = None,
    ) -> TokenModel:
        """The model for schedules with objective <= ``upper_bound`` (model units).

        ``deadlines`` (from :meth:`deadlines`) tighten the horizon's; ``hint``
        (a legal schedule) becomes the warm start, in normal form. ``stop``: the build raises
        :class:`~kvsched.stop.DeadlineReached` once it has passed (checked per request and batch).
        """
        stop = stop or Deadline.never()
        bi = self.bi
        n, R = bi.n, range(bi.n)
        prompt, out, cap = bi.prompt, bi.output, int(bi.kv_cap)
        h = bi.horizon(upper_bound)
        J = h.batches
        last = h.last_done.copy() if h.last_done is not None else np.full(n, J)
        if deadlines is not None:
            last = np.minimum(last, deadlines)
            J = int(min(J, last.max()))
        times = None
        if hint is not None:
            times = bi.normal_times(hint)
            J = max(J, max(max(t) for t in times))
        last = np.minimum(last, J)
        m = LinearModel(name=f"token-indexed {bi.objective}")

        def row(e: Lin, lo: float, hi: float, name: str) -> None:
            items = [(v, c) for v, c in e.t.items() if c != 0]
            if not items:
                if e.k < lo - 1e-9 or e.k > hi + 1e-9:
                    raise AssertionError(f"constant row {name} is violated ({e.k} not in [{lo}, {hi}])")
                return
            m.add_row(
                [v for v, _ in items],
                [c for _, c in items],
                -INF if lo == -INF else lo - e.k,
                INF if hi == INF else hi - e.k,
                name,
            )

        # z[i][k][j] as an expression: 0 before batch k, 1 from the deadline on (k-th token by
        # last_i - (O_i - k): the remaining tokens take one batch each), a variable in between.
        z: list[list[list[Lin]]] = []
        zvars: list[tuple[int, int, int, int]] = []
        dues: dict[tuple[int, int], int] = {}
        uvars: list[int] = []
        for i in R:
            stop.check()
            o = int(out[i])
            zi = [[Lin()] * (J + 1) for _ in range(o + 1)]
            for k in range(1, o + 1):
                due = int(last[i]) - (o - k)
                if due < k:
                    raise ValueError(f"deadline {last[i]} of request {i} leaves no room for {o} tokens")
                dues[(i, k)] = due
                for j in range(k, J + 1):
                    if j >= due:
                        zi[k][j] = Lin(k=1.0)
                    else:
                        var = m.add_var(f"z[{i},{k},{j}]", 0, 1)
                        zvars.append((var, i, k, j))
                        zi[k][j] = term(var)
            z.append(zi)

        def x(i: int, k: int, j: int) -> Lin:  # token k of request i is generated in batch j
            return z[i][k][j] - z[i][k][j - 1]

        gen = [[Lin()] + [Lin() for _ in range(J)] for _ in R]
        run = [[Lin()] + [Lin() for _ in range(J)] for _ in R]
        for i in R:
            stop.check()
            o = int(out[i])
            for j in range(1, J + 1):
                for k in range(1, o + 1):
                    if j >= 2:
                        row(z[i][k][j - 1] - z[i][k][j], -INF, 0, f"mono[{i},{k},{j}]")
                    if k >= 2:
                        row(z[i][k][j] - z[i][k - 1][j - 1], -INF, 0, f"prec[{i},{k},{j}]")
                gen[i][j] = lin_sum(x(i, k, j) * float(prompt[i] + k - 1) for k in range(1, o + 1))
                run[i][j] = lin_sum(x(i, k, j) for k in range(1, o + 1))

        def held(i: int, j: int) -> Lin:
            """KV request i holds during batch j."""
            if bi.allow_eviction:
                return gen[i][j]
            o = int(out[i])
            after = z[i][1][j] * float(prompt[i]) + lin_sum(z[i][k][j] for k in range(2, o + 1))
            return after - z[i][o][j - 1] * float(bi.peak[i])

        sets = bi.clique_sets() if cliques else []
        for j in range(1, J + 1):
            stop.check()
            load = lin_sum(held(i, j) for i in R)
            row(load, -INF, cap, f"kv[{j}]")
            for q, members in enumerate(sets):
                e = lin_sum(x(i, k, j) for i, k0 in members.items() for k in range(k0, int(out[i]) + 1))
                row(e, -INF, 1, f"clique[{q},{j}]")
            if bi.run_cap is not None:
                if bi.allow_eviction:
                    holders = lin_sum(run[i][j] for i in R)
                else:
                    holders = lin_sum(z[i][1][j] - z[i][int(out[i])][j - 1] for i in R)
                row(holders, -INF, bi.run_cap, f"R[{j}]")
        if symmetry:
            for group in bi.identical_groups():
                for a, b in itertools.pairwise(group):
                    for k in range(1, int(out[a]) + 1):
                        for j in range(k, J + 1):
                            row(z[a][k][j] - z[b][k][j], 0, INF, f"sym[{a},{b},{k},{j}]")

        # Objective (unit time, batches back to back from the common arrival).
        if bi.objective == "makespan":
            for j in range(1, J + 1):
                u = m.add_var(f"u[{j}]", 0, 1, obj=1.0)
                uvars.append(u)
                for i in R:
                    row(term(u) + z[i][int(out[i])][j - 1], 1, INF, f"u[{i},{j}]")
            m.obj_offset = bi.a_min
        else:
            first = bi.objective == "sum-ttft"
            obj = Lin()
            for i in R:
                k = 1 if first else int(out[i])
                obj = obj + lin_sum(1.0 - z[i][k][j] for j in range(0, J))
            for v, c in obj.t.items():
                m.obj[v] += c
            m.obj_offset = obj.k
        built = TokenModel(m, bi, J, tuple(zvars), dues, tuple(uvars))
        if times is not None:
            m.hint = built.vector_of_times(times)
        return built


@dataclass(frozen=True, slots=True, eq=False)
class TokenModel:
    """What :meth:`TokenIndexed.build` returns: the model and the maps to and from schedules.

    Attributes
    ----------
    model
        The linear model.
    bi
        The batch-indexed data it was built from.
    horizon_batches
        The number of batches J.
    zvars
        ``(var, i, k, j)``: request i has generated k tokens by batch j.
    dues
        ``(i, k) -> j``: the batch by which token k of request i is generated.
    uvars
        The makespan's "batch j is used" variables.
    """

    model: LinearModel
    bi: BatchIndexed
    horizon_batches: int
    zvars: tuple[tuple[int, int, int, int], ...]
    dues: dict[tuple[int, int], int]
    uvars: tuple[int, ...]

    def vector_of_times(self, times: list[list[int]]) -> np.ndarray:
        """The assignment in which request i generates its k-th token in batch ``times[i][k-1]``."""
        m = self.model
        x = np.array(m.lb, dtype=np.float64)
        for var, i, k, j in self.zvars:
            x[var] = float(times[i][k - 1] <= j)
        end = max(max(t) for t in times)
        for j, var in enumerate(self.uvars, start=1):
            x[var] = float(j <= end)
        return x

    def vector_of(self, schedule: Schedule) -> np.ndarray:
        """The assignment of this model that represents ``schedule`` (in normal form)."""
        return self.vector_of_times(self.bi.token_batches(schedule))

    def token_times(self, sol: np.ndarray) -> list[list[int]]:
        """The batch of each token in a solution vector of this model."""
        times = [[due for (ii, _), due in sorted(self.dues.items()) if ii == i] for i in range(self.bi.n)]
        for var, i, k, j in self.zvars:
            if round(sol[var]) == 1 and j < times[i][k - 1]:
                times[i][k - 1] = j
        return times

    def schedule_from(self, sol: np.ndarray) -> Schedule:
        """Decode a solution vector into the normal-form schedule, stepped through the core."""
        return self.bi.schedule_of_tokens(self.token_times(sol), {"formulation": "token-indexed"})
