"""The time-indexed formulation (seed 004, Appendix B.1, made linear and compact).

Schedule class: unit-time slots; each request is prefilled whole in the slot it
starts in and then decodes in every following slot until it completes (no
chunking, no pause, no eviction) -- the MC-SF paper's model. A request with
prompt I and output O started at slot p holds I + u KV tokens in slot p + u
(u = 0 .. O-1) and completes at the end of slot p + O - 1.

Formulation
-----------
The paper's program multiplies the start time by a running indicator. Here each
request gets *step* variables ``S[i,t] = 1`` iff it has started by slot ``t``
(monotone in t), so its start is ``p_i = l_i - sum_t S[i,t]`` over its window
``[e_i, l_i]``. Everything a slot holds is linear in S:

* running: ``S[t] - S[t-O]``;
* prefill tokens: ``I (S[t] - S[t-1])``;
* KV: ``I S[t] - (I+O-1) S[t-O] + sum_{u=1}^{O-1} S[t-u]``. The last sum is
  ``Z[t-1] - Z[t-O]`` with the running total ``Z[t] = Z[t-1] + S[t]``, so a
  memory row has O(1) terms per request instead of O (paged KV with block size
  b > 1 uses the O/b block steps directly).

This is an exact linear rewrite of the start-variable model (same LP bound),
with about ``n * T * 8`` non-zeros instead of ``sum_i |W_i| * O_i``. With the
tight windows below, the plain step rows (O terms) solve faster than the
running sums, so they are the default.

Windows come from an upper bound UB on the objective (the best of several list
schedules, improved by a local search over list orders, also used as the warm
start): for total latency, a request's latency is at most UB minus every other
request's least possible latency. :mod:`kvsched.csp.lagrangian` then narrows
them with the reduced costs of the LP relaxation.

Where tight memory makes it hard (ShareGPT / 10, all at t = 0, KV at 30% of
the summed peaks, n = 100): the LP bound is 3817.5, the best schedule known
3836 (10 min of HiGHS; its bound reached 3823). The optimum starts 79
requests at slot 0 and delays 21; the LP spreads about 13 of them over
several starts and has many alternative optima. Per-slot GUB cover cuts
(``sum_{i in C} running-with-age->=u_i <= |C|-1``) are violated at ~25 slots
per round yet 30 rounds move the bound by 0.02; CP-SAT on the same model gets
the LP bound at best. Fixing the slot-0 starts of the best schedule lifts the
LP to 3824 and HiGHS then proves that restriction in 36 s, but branching on
the slot-0 starts alone leaves hundreds of leaves between 3825 and 3836.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel import UnitCost
from kvsched.csp.model import INF, LinearModel
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline, DeadlineReached

GRID_TOL = 1e-9
#: Most slots the list schedule lays out densely. Past it (an arrival far in the future, or a huge
#: total output) the time-indexed heuristics decline and the driver falls back to the event-driven
#: incumbents, which need no slot for an idle stretch.
MAX_SLOTS = 5_000_000
#: Start slots :meth:`TimeIndexed.list_schedule` tests at once.
FIT_BLOCK = 32


@dataclass(frozen=True, slots=True)
class Window:
    """Slots a request may start in: ``first`` (arrival) to ``last`` (from the bound)."""

    first: int
    last: int


@dataclass(frozen=True, slots=True, eq=False)
class TimeIndexedModel:
    """A built time-indexed model and what decoding it needs (returned by :meth:`TimeIndexed.build`).

    Attributes
    ----------
    model
        The linear model.
    windows
        Each request's start window.
    s_var
        ``s_var[i][t]``: the variable "request i has started by slot t".
    resource_rows
        ``(row, resource, slot)`` of each capacity row (for the LP duals).
    """

    model: LinearModel
    windows: tuple[Window, ...]
    s_var: tuple[dict[int, int], ...]
    resource_rows: tuple[tuple[int, str, int], ...]

    def starts_from(self, x: np.ndarray) -> np.ndarray:
        """Start slots from a solution vector of this model."""
        return np.array(
            [w.last - round(sum(x[v] for v in self.s_var[i].values())) for i, w in enumerate(self.windows)],
            dtype=np.int64,
        )


class TimeIndexed:
    """Build, warm-start and decode the time-indexed model of one instance.

    Parameters
    ----------
    instance
        Must use the ``unit`` time model, arrivals on the slot grid, and prompts
        that fit the token and prefill budgets in one batch.
    objective
        ``total-latency``, ``makespan`` or ``sum-ttft``.
    cumulative
        Write memory rows with the running sums Z (O(1) terms per request and
        slot) rather than one step variable per token of growth (O terms).
        Same LP bound; the running-sum rows are smaller but their LP is much
        slower to solve (equality chains: 4.3 s against 0.4 s on 30 ShareGPT
        requests), so the step rows are the default and both are kept for
        experiments. Block sizes > 1 always use the block steps.
    """

    OBJECTIVES = ("total-latency", "makespan", "sum-ttft")

    def __init__(
        self, instance: Instance, objective: str = "total-latency", *, cumulative: bool = False
    ) -> None:
        if objective not in self.OBJECTIVES:
            raise InputError(
                f"--objective: the time-indexed formulation supports {', '.join(self.OBJECTIVES)}"
            )
        cost = instance_cost_model(instance)
        if not isinstance(cost, UnitCost):
            raise InputError(
                f"the time-indexed formulation needs the unit time model, not {cost.name!r}"
                " (use --formulation batch)"
            )
        self.instance = instance
        self.objective = objective
        self.slot = cost.slot
        lim = instance.limits
        reqs = instance.requests
        self.prompt = np.array([r.prompt for r in reqs], dtype=np.int64)
        self.output = np.array([r.output for r in reqs], dtype=np.int64)
        arrival = np.array([r.arrival for r in reqs]) / self.slot
        self.arrival = np.round(arrival)
        off = np.flatnonzero(np.abs(arrival - self.arrival) > GRID_TOL)
        if off.size:
            r = reqs[int(off[0])]
            raise InputError(
                f"request {r.id!r}: arrival {r.arrival:g} is not on the slot grid; the time-indexed "
                "formulation needs whole-slot arrivals (generate with --param tick=1)"
            )
        self.earliest = self.arrival.astype(np.int64)
        for cap, what in (
            (lim.max_batch_tokens, "token budget C"),
            (lim.max_prefill_tokens, "prefill budget P"),
        ):
            if cap is not None and (self.prompt > cap).any():
                k = int(np.argmax(self.prompt > cap))
                raise InputError(
                    f"request {reqs[k].id!r}: prompt of {int(self.prompt[k])} tokens exceeds the {what} "
                    f"({cap}); it needs chunked prefill (use --formulation batch)"
                )
        self.block = lim.block_size
        self.kv_cap = lim.kv_blocks
        self.tok_cap = lim.max_batch_tokens
        self.pre_cap = lim.max_prefill_tokens
        self.run_cap = lim.max_running
        self.cumulative = cumulative
        self._profiles: dict[str, list[np.ndarray]] | None = None

    # ---------------------------------------------------------------- profiles
    def capacities(self) -> dict[str, int]:
        """The per-slot resources that bind, by row name: KV blocks, tokens, prefill tokens, running."""
        caps = {"kv": self.kv_cap, "tok": self.tok_cap, "pre": self.pre_cap, "run": self.run_cap}
        return {res: cap for res, cap in caps.items() if cap is not None}

    def profile(self, i: int, resource: str) -> np.ndarray:
        """What request ``i`` uses of ``resource`` in each slot of its run (slot 0 is its prefill)."""
        o = int(self.output[i])
        if resource == "kv":
            held = self.prompt[i] + np.arange(o)
            return -(-held // self.block)
        prof = np.ones(o, dtype=np.int64) if resource in ("tok", "run") else np.zeros(o, dtype=np.int64)
        if resource in ("tok", "pre"):
            prof[0] = self.prompt[i]
        return prof

    def start_cost(self, i: int, starts: np.ndarray) -> np.ndarray:
        """Request ``i``'s share of a separable objective if it starts at each of ``starts`` (slots)."""
        if self.objective == "makespan":
            raise ValueError("the makespan is not a sum over requests")
        extra = self.output[i] if self.objective == "total-latency" else 1
        return starts + float(extra) - self.arrival[i]

    # -------------------------------------------------------------- objective
    def value(self, starts: np.ndarray) -> float:
        """Objective of start slots ``starts``, in slots."""
        if self.objective == "total-latency":
            return float(np.sum(starts + self.output - self.arrival))
        if self.objective == "sum-ttft":
            return float(np.sum(starts + 1 - self.arrival))
        return float(np.max(starts + self.output))

    # ------------------------------------------------------------ list schedule
    @property
    def list_horizon(self) -> int:
        """Slots the list schedule lays out: past the last completion everything is free."""
        return int(self.earliest.max() + self.output.sum() + 2) + FIT_BLOCK + int(self.output.max())

    def list_schedule(self, order: np.ndarray, deadline: Deadline | None = None) -> np.ndarray:
        """Start each request, in ``order``, at its earliest slot that fits everything placed so far.

        Raises :class:`~kvsched.stop.DeadlineReached` if ``deadline`` passes first.
        """
        n = len(order)
        horizon = self.list_horizon
        if horizon > MAX_SLOTS:
            raise InputError(
                f"the time-indexed list schedule would lay out {horizon:,} slots (more than {MAX_SLOTS:,}: "
                "an arrival far in the future or a very long total output)"
            )
        loads = {res: np.zeros(horizon, dtype=np.int64) for res in self.capacities()}
        if self._profiles is None:  # the local search schedules thousands of orders
            self._profiles = {
                res: [self.profile(i, res) for i in range(len(self.prompt))] for res in loads if res != "pre"
            }
        profiles = self._profiles
        starts = np.full(n, -1, dtype=np.int64)
        for done, i in enumerate(order):
            if deadline is not None and done % 64 == 63:
                deadline.check()
            o = int(self.output[i])
            k = self._first_fit(i, int(self.earliest[i]), loads, profiles)
            for res, load in loads.items():
                if res == "pre":
                    load[k] += self.prompt[i]
                else:
                    load[k : k + o] += profiles[res][i]
            starts[i] = k
        return starts

    def _first_fit(
        self, i: int, k: int, loads: dict[str, np.ndarray], profiles: dict[str, list[np.ndarray]]
    ) -> int:
        """The first slot >= ``k`` where request ``i`` fits beside ``loads``.

        Most requests fit at once, so ``k`` is tried alone first; after that a
        block of :data:`FIT_BLOCK` slots is tested at a time.
        """
        o = int(self.output[i])
        caps = self.capacities()
        if all(
            (load[k] + self.prompt[i] <= caps[res])
            if res == "pre"
            else bool(np.all(load[k : k + o] + profiles[res][i] <= caps[res]))
            for res, load in loads.items()
        ):
            return k
        k += 1
        while True:
            fits = np.ones(FIT_BLOCK, dtype=bool)
            for res, load in loads.items():
                if res == "pre":
                    fits &= load[k : k + FIT_BLOCK] + self.prompt[i] <= caps[res]
                    continue
                # Row j: the load over the run of a start at k + j.
                runs = np.lib.stride_tricks.sliding_window_view(load[k : k + FIT_BLOCK + o - 1], o)
                fits &= (runs + profiles[res][i] <= caps[res]).all(axis=1)
            if fits.any():
                return k + int(np.argmax(fits))
            k += FIT_BLOCK

    def heuristic_starts(self, deadline: Deadline | None = None) -> np.ndarray | None:
        """The best of a few list schedules (FCFS, shortest output first, shortest peak first).

        With a ``deadline``, the best of those finished by then (None if none was).
        """
        n = len(self.prompt)
        peak = self.prompt + self.output
        keys = [
            (self.arrival, np.arange(n)),
            (self.output, self.arrival),
            (peak, self.arrival),
            (self.arrival, self.output),
        ]
        best = None
        for primary, secondary in keys:
            try:
                starts = self.list_schedule(np.lexsort((secondary, primary)), deadline)
            except DeadlineReached:
                break
            if best is None or self.value(starts) < self.value(best):
                best = starts
        return best

    def improve(
        self,
        starts: np.ndarray,
        *,
        moves: int = 50000,
        stall: int = 400,
        seconds: float = 10.0,
        seed: int = 0,
        deadline: Deadline | None = None,
    ) -> np.ndarray:
        """A better start vector by local search over list orders (swaps and moves, first fit).

        A cheaper incumbent narrows every window and gives the MILP a better
        start. The search stops after ``moves`` moves, ``stall`` moves without
        a strict improvement, after ``seconds`` or at ``deadline`` (checked
        inside each list schedule too); the first two keep it reproducible, the
        others cap it on large instances.
        """
        rng = np.random.default_rng(seed)
        n = len(starts)
        best, best_value = starts, self.value(starts)
        order = np.argsort(starts, kind="stable")
        stop = Deadline.after(seconds)
        if deadline is not None and deadline.end < stop.end:
            stop = deadline
        try:
            current = self.value(self.list_schedule(order, stop))
        except DeadlineReached:
            return best
        since = 0
        for _ in range(moves if n > 1 else 0):
            if since >= stall or stop.expired():
                break
            since += 1
            i, j = rng.integers(0, n, 2)
            trial = order.copy()
            if rng.random() < 0.5:
                trial[i], trial[j] = trial[j], trial[i]
            else:
                trial = np.insert(np.delete(trial, i), j, order[i])
            try:
                cand = self.list_schedule(trial, stop)
            except DeadlineReached:
                break
            value = self.value(cand)
            if value <= current:  # accept ties: they let the search walk across plateaus
                order, current = trial, value
                if value < best_value:
                    best, best_value, since = cand, value, 0
        return best

    # ------------------------------------------------------------------ windows
    def windows(self, upper_bound: float) -> list[Window]:
        """Start windows such that every schedule with objective <= ``upper_bound`` fits."""
        e, o, a = self.earliest, self.output, self.arrival
        if self.objective == "makespan":
            last = np.floor(upper_bound - o + GRID_TOL)
        else:
            least = e + (o if self.objective == "total-latency" else 1) - a
            slack = upper_bound - (least.sum() - least)
            last = np.floor(slack + a - (o if self.objective == "total-latency" else 1) + GRID_TOL)
        return [Window(int(f), max(int(f), int(lst))) for f, lst in zip(e, last, strict=True)]

    def nonzeros(self, windows: Sequence[Window]) -> int:
        """About how many nonzeros :meth:`build` writes over ``windows``, without building anything.

        Each start variable enters the rows of its first and last slot and, with
        step rows, one row per change of its profile (every slot for KV in
        blocks of one token): long outputs make the model grow as n x window x O.
        """
        total = 0
        for i, w in enumerate(windows):
            per_start = 0
            for res in self.capacities():
                steps = (
                    2 if self.cumulative and res == "kv" else np.count_nonzero(np.diff(self.profile(i, res)))
                )
                per_start += 2 + int(steps)
            total += (w.last - w.first + 1) * per_start
        return total

    # -------------------------------------------------------------------- build
    def build(
        self,
        upper_bound: float,
        hint: np.ndarray | None = None,
        *,
        windows: list[Window] | None = None,
        symmetry: bool = True,
    ) -> TimeIndexedModel:
        """The model over start windows, warm-started from ``hint`` starts.

        ``windows`` default to :meth:`windows` of ``upper_bound`` (slots); a
        caller may pass narrower ones that still hold every schedule it wants
        to keep (see :mod:`kvsched.csp.lagrangian`).
        """
        wins = self.windows(upper_bound) if windows is None else windows
        resource_rows: list[tuple[int, str, int]] = []  # (row, resource, slot) of each capacity row
        m = LinearModel(name=f"time-indexed {self.objective}")
        n = len(wins)
        s_var: list[dict[int, int]] = [{} for _ in range(n)]
        z_var: list[dict[int, int]] = [{} for _ in range(n)]
        cumulative = self.block == 1 and self.cumulative
        for i, w in enumerate(wins):
            for t in range(w.first, w.last):
                s_var[i][t] = m.add_var(f"S[{i},{t}]", 0, 1)
            for t in range(w.first, w.last - 1):
                m.add_row([s_var[i][t], s_var[i][t + 1]], [1, -1], -INF, 0, f"mono[{i},{t}]")
            if cumulative and w.last > w.first:
                prev = None
                for t in range(w.first, w.last):
                    z = m.add_var(f"Z[{i},{t}]", 0, t - w.first + 1)
                    z_var[i][t] = z
                    idx, coef = [z, s_var[i][t]], [1.0, -1.0]
                    if prev is not None:
                        idx.append(prev)
                        coef.append(-1.0)
                    m.add_row(idx, coef, 0, 0, f"cum[{i},{t}]")
                    prev = z

        def s_expr(i: int, t: int, scale: float, acc: dict[int, float]) -> float:
            w = wins[i]
            if t < w.first:
                return 0.0
            if t >= w.last:
                return scale
            acc[s_var[i][t]] += scale
            return 0.0

        def z_expr(i: int, t: int, scale: float, acc: dict[int, float]) -> float:
            # Z[t] = number of slots k <= t with S[k] = 1.
            w = wins[i]
            if t < w.first:
                return 0.0
            if t < w.last:
                acc[z_var[i][t]] += scale
                return 0.0
            const = float(t - w.last + 1)
            if w.last > w.first:
                acc[z_var[i][w.last - 1]] += scale
            return scale * const

        t_lo = min(w.first for w in wins)
        t_hi = max(w.last + int(self.output[i]) for i, w in enumerate(wins))
        for t in range(t_lo, t_hi):
            kv: dict[int, float] = defaultdict(float)
            tok: dict[int, float] = defaultdict(float)
            pre: dict[int, float] = defaultdict(float)
            run: dict[int, float] = defaultdict(float)
            c_kv = c_tok = c_pre = c_run = 0.0
            for i, w in enumerate(wins):
                o, prompt = int(self.output[i]), int(self.prompt[i])
                if not (w.first <= t < w.last + o):
                    continue
                if cumulative:
                    c_kv += s_expr(i, t, prompt, kv) + s_expr(i, t - o, -(prompt + o - 1), kv)
                    c_kv += z_expr(i, t - 1, 1.0, kv) + z_expr(i, t - o, -1.0, kv)
                else:
                    prof = self.profile(i, "kv")
                    c_kv += s_expr(i, t, float(prof[0]), kv) + s_expr(i, t - o, -float(prof[-1]), kv)
                    for u in np.flatnonzero(np.diff(prof)) + 1:
                        c_kv += s_expr(i, t - int(u), 1.0, kv)
                if self.run_cap is not None:
                    c_run += s_expr(i, t, 1.0, run) + s_expr(i, t - o, -1.0, run)
                if self.tok_cap is not None:
                    c_tok += s_expr(i, t, prompt, tok) + s_expr(i, t - 1, -(prompt - 1), tok)
                    c_tok += s_expr(i, t - o, -1.0, tok)
                if self.pre_cap is not None:
                    c_pre += s_expr(i, t, prompt, pre) + s_expr(i, t - 1, -prompt, pre)
            for acc, const, cap, name in (
                (kv, c_kv, self.kv_cap, "kv"),
                (tok, c_tok, self.tok_cap, "tok"),
                (pre, c_pre, self.pre_cap, "pre"),
                (run, c_run, self.run_cap, "run"),
            ):
                if cap is None:
                    continue
                items = [(v, c) for v, c in acc.items() if c != 0]
                if not items:
                    if const > cap + GRID_TOL:
                        raise AssertionError(f"slot {t}: constant {name} load {const} exceeds {cap}")
                    continue
                idx, coef = zip(*items, strict=True)
                resource_rows.append((len(m.rows), name, t))
                m.add_row(list(idx), list(coef), -INF, cap - const, f"{name}[{t}]")

        # Objective, in slots. p_i = last_i - sum_t S[i,t].
        if self.objective == "makespan":
            cmax = m.add_var("Cmax", 0, math.floor(upper_bound + GRID_TOL), obj=1.0)
            for i, w in enumerate(wins):
                idx = [cmax, *s_var[i].values()]
                m.add_row(idx, [1.0] * len(idx), w.last + int(self.output[i]), INF, f"cmax[{i}]")
        else:
            extra = self.output if self.objective == "total-latency" else np.ones_like(self.output)
            for i, w in enumerate(wins):
                for v in s_var[i].values():
                    m.obj[v] = -1.0
                m.obj_offset += w.last + float(extra[i]) - float(self.arrival[i])

        if symmetry:
            self._add_symmetry(m, wins, s_var)
        if hint is not None:
            m.hint = self._hint_vector(m, hint, wins, s_var, z_var)
        return TimeIndexedModel(m, tuple(wins), tuple(s_var), tuple(resource_rows))

    def _identical_groups(self) -> list[list[int]]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in range(len(self.prompt)):
            groups[(int(self.prompt[i]), int(self.output[i]), float(self.arrival[i]))].append(i)
        return [g for g in groups.values() if len(g) > 1]

    def _add_symmetry(self, m: LinearModel, wins: list[Window], s_var: list[dict[int, int]]) -> None:
        # Identical requests are interchangeable: the lower index starts no later.
        for group in self._identical_groups():
            for i, j in itertools.pairwise(group):
                for t in range(wins[i].first, wins[i].last):
                    if t in s_var[j]:
                        m.add_row([s_var[j][t], s_var[i][t]], [1.0, -1.0], -INF, 0, f"sym[{i},{j},{t}]")

    def canonical(self, starts: np.ndarray) -> np.ndarray:
        """``starts`` with identical requests' starts sorted (the symmetry rows' representative)."""
        out = starts.copy()
        for group in self._identical_groups():
            out[group] = np.sort(out[group])
        return out

    def _hint_vector(
        self,
        m: LinearModel,
        starts: np.ndarray,
        wins: list[Window],
        s_var: list[dict[int, int]],
        z_var: list[dict[int, int]],
    ) -> np.ndarray:
        starts = self.canonical(starts)
        x = np.zeros(m.num_vars)
        for i, w in enumerate(wins):
            if not (w.first <= starts[i] <= w.last):
                raise AssertionError(f"hint start {starts[i]} of request {i} is outside its window {w}")
            for t, v in s_var[i].items():
                x[v] = float(t >= starts[i])
            for t, v in z_var[i].items():
                x[v] = float(max(0, t - starts[i] + 1))
        if self.objective == "makespan":
            x[m.names.index("Cmax")] = float(np.max(starts + self.output))
        return x

    # ------------------------------------------------------------------ decode
    def schedule_of(self, starts: np.ndarray) -> Schedule:
        """The schedule that starts each request at its slot, stepped through the semantic core."""
        state = EngineState(self.instance, UnitCost(self.slot))
        ends = starts + self.output
        batches = []
        for t in np.unique(np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])):
            active = np.flatnonzero((starts <= t) & (t < ends))
            tokens = np.where(starts[active] == t, self.prompt[active], 1)
            batch = state.make_batch(float(t) * self.slot, active, tokens)
            state.step(batch)
            batches.append(batch)
        return Schedule(tuple(batches), {"formulation": "time-indexed"})
