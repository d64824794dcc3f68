"""The data of the batch-indexed model: limits, lengths, time scale, horizon (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel import InfermaxLinear, UnitCost
from kvsched.csp.objectives import objective_function
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import instance_cost_model, replay

#: Tolerance when snapping decoded batch starts onto the previous end or an arrival.
SNAP_TOL = 1e-6
GRID_TOL = 1e-9

#: Heuristic policies tried for the warm start (the best legal one is used).
WARM_POLICIES = (
    "vllm",
    "vllm-ef",
    "vllm-hy",
    "sarathi",
    "sarathi-ef",
    "sarathi-pc",
    "sarathi-pc-ef",
    "rank-o",
    "rank-i",
)

#: The holes of seed 003's CSP (notes A4.2) that ``holes=`` can re-open, for tests.
HOLES = {
    "no-release": "A4.2 #1: a finished request keeps its KV unless 'evicted' (no release on completion)",
    "free-token": "A4.2 #2: g = 1 does not require c = S - m (a token without processing)",
    "stalled-token": "A4.2 #2: g = 0 does not require c <= S - m - 1 (S - m may reach 0)",
    "phase-label": "A4.2 #4: decode = 'generated and one token left', no refill state",
    "no-idle": "A4.2 #6: a batch starts when the previous one ends (no idling)",
    "arrival-at-end": "A4.2 #6: a request may run in a batch that ends, not starts, after its arrival",
}

_PHASE_COEFS = ("b0", "b1", "p0", "p1", "p2", "p3")


@dataclass(frozen=True, slots=True, eq=False)
class Horizon:
    """How far a model over schedules no worse than an upper bound must reach (model units).

    Attributes
    ----------
    batches
        The number of batches J.
    end
        A time by which every batch ends.
    deadline
        Per request, the latest completion (or first token, for sum-TTFT).
    last_done
        Per request, the batch by which it is done (None for sum-TTFT).
    last_first
        Per request, the batch by which it has its first token (sum-TTFT only).
    """

    batches: int
    end: float
    deadline: np.ndarray
    last_done: np.ndarray | None
    last_first: np.ndarray | None


class BatchData:
    """The data of one instance that the batch-indexed model is built from, derived once.

    Parameters
    ----------
    instance
        ``block_size`` 1; the ``unit`` or ``infermax-linear`` cost model.
    objective
        ``total-latency``, ``makespan`` or ``sum-ttft``.
    allow_eviction
        Whether schedules may evict (``False``: the eviction-free class).
    holes
        Names from :data:`HOLES` to re-open (tests only: the model is then wrong).
    """

    OBJECTIVES = ("total-latency", "makespan", "sum-ttft")

    def __init__(
        self,
        instance: Instance,
        objective: str = "total-latency",
        *,
        allow_eviction: bool = True,
        holes: Iterable[str] = (),
    ) -> None:
        if objective not in self.OBJECTIVES:
            raise InputError(
                f"--objective: the batch-indexed formulation supports {', '.join(self.OBJECTIVES)}"
            )
        self.holes = frozenset(holes)
        unknown = self.holes - set(HOLES)
        if unknown:
            raise InputError(f"unknown hole(s) {sorted(unknown)} (known: {', '.join(HOLES)})")
        cost = instance_cost_model(instance)
        if isinstance(cost, UnitCost):
            self.unit, self.scale, self.coef = True, float(cost.slot), None
        elif isinstance(cost, InfermaxLinear):
            # Model time in the power of ten nearest below a batch's fixed part (a0 + a1), not seconds: the
            # back ends' tolerances are absolute (HiGHS: 1e-6 on rows and gaps), and on a makespan of 43 ms
            # in seconds HiGHS's proven bound came out 5.4e-7 s (1.25e-5 of it) above the brute-force
            # optimum. A power of ten keeps decimal data decimal (CP-SAT's exact integer scaling).
            coef = cost.coefficients()
            base = coef["a0"] + coef["a1"]
            self.scale = 10.0 ** math.floor(math.log10(base)) if base > 0 else 1.0
            self.unit, self.coef = False, {k: v / self.scale for k, v in coef.items()}
        else:
            raise InputError(
                "the batch-indexed formulation needs the unit or infermax-linear cost model "
                f"(batch time linear in the schedule), not {cost.name!r}"
            )
        lim = instance.limits
        if lim.block_size != 1:
            raise InputError(
                f"the batch-indexed formulation models KV per token: block_size must be 1, not "
                f"{lim.block_size} (paged rounding is not modelled)"
            )
        if len(instance) == 0:
            raise InputError("the instance has no requests")
        instance.check_feasible()
        if lim.max_running is not None and lim.max_running < 1:
            raise InputError("max_running must be at least 1")
        for cap, what in (
            (lim.max_batch_tokens, "token budget C"),
            (lim.max_prefill_tokens, "prefill budget P"),
        ):
            if cap is not None and cap < 1:
                raise InputError(f"the {what} must be at least 1 token")
        self.instance = instance
        self.cost = cost
        self.objective = objective
        self.allow_eviction = allow_eviction
        self.measure = objective_function(objective)
        reqs = instance.requests
        self.n = len(reqs)
        self.prompt = np.array([r.prompt for r in reqs], dtype=np.int64)
        self.output = np.array([r.output for r in reqs], dtype=np.int64)
        self.peak = self.prompt + self.output - 1
        self.arrival = np.array([r.arrival for r in reqs], dtype=np.float64) / self.scale
        self.a_min = float(self.arrival.min())
        self.offline = bool(np.all(np.abs(self.arrival - self.a_min) <= GRID_TOL))
        self.integral_time = self.unit and bool(
            np.all(np.abs(self.arrival - np.round(self.arrival)) <= GRID_TOL)
        )
        if self.integral_time:
            self.arrival = np.round(self.arrival)
            self.a_min = float(self.arrival.min())
        self.kv_cap = lim.kv_capacity
        self.tok_cap = lim.max_batch_tokens
        self.pre_cap = lim.max_prefill_tokens
        self.run_cap = lim.max_running
        inf = 10**18
        chunk = min(self.tok_cap or inf, self.pre_cap or inf)
        self.cap = np.minimum(self.peak, min(self.tok_cap or inf, max(1, self.pre_cap or inf)))
        # Batches a request needs alone: ceil(I / chunk) to its first token, O - 1 more to complete.
        self.first_batches = -(-self.prompt // min(chunk, int(self.prompt.max())))
        self.min_batches = self.first_batches + self.output - 1
        self.tok_total = int(min(self.tok_cap or inf, int(self.cap.sum())))
        phase_cost = not self.unit and any(self.coef[k] > 0 for k in _PHASE_COEFS)
        p_binds = self.pre_cap is not None and self.pre_cap < self.tok_total
        self.need_phase = phase_cost or p_binds
        self.exact_phase = phase_cost
        self.track_refill = self.need_phase and allow_eviction and "phase-label" not in self.holes
        self.timed = not (self.unit and self.offline) or bool(self.holes & {"no-idle", "arrival-at-end"})
        self.t_min = self._min_batch_time()
        # Dominance (see "Strengthening" in the module docstring): under unit time without token or
        # prefill budgets, chunks that produce no token and KV held by paused requests never help.
        self.normal_form = self.unit and self.tok_cap is None and self.pre_cap is None and not self.holes
        self.left_shift = self.normal_form and allow_eviction and not self.timed and self.run_cap is None

    # ------------------------------------------------------------- durations
    def _min_batch_time(self) -> float:
        """The shortest a non-empty batch can last (model units)."""
        if self.unit:
            return 1.0
        k = self.coef
        t = k["a0"] + k["a1"]
        if any(k[c] > 0 for c in _PHASE_COEFS):
            decode = k["b0"] + k["b1"] * float(self.prompt.min())
            prefill = k["p0"] + k["p1"] + k["p3"]
            t += min(decode, prefill)
        if t <= 0:
            raise InputError(
                "the batch-indexed formulation needs a positive minimum batch time (a0 + a1 > 0) to bound "
                "its horizon"
            )
        return t

    def _max_batch_time(self) -> float:
        if self.unit:
            return 1.0
        k = self.coef
        tok = float(self.tok_total)
        kv = float(self.kv_cap)
        return (
            k["a0"]
            + k["a1"] * tok
            + k["b0"]
            + k["b1"] * kv
            + k["p0"]
            + k["p1"] * (tok * tok + 2 * kv * tok)
            + k["p2"] * kv
            + k["p3"] * self.n
        )

    # ------------------------------------------------------------- objective
    def value(self, schedule: Schedule) -> float:
        """Objective of a legal ``schedule`` (replayed through the core), in model units."""
        return self.measure(replay(self.instance, schedule)) / self.scale

    # ---------------------------------------------------------------- horizon
    def _sorted_completion_bound(self) -> np.ndarray:
        """A vector L with sorted completion times >= L componentwise, for every legal schedule.

        Isolated service (a_i + batches alone x t_min) and KV area: the k smallest areas need at
        least ceil(area / M) batches of at least t_min each (seed 004's area argument; see
        :mod:`kvsched.csp.bounds`).
        """
        alone = np.sort(self.arrival + self.min_batches * self.t_min)
        o, p = self.output.astype(np.float64), self.prompt.astype(np.float64)
        area = o * p + o * (o - 1) / 2
        by_area = self.a_min + np.ceil(np.cumsum(np.sort(area)) / self.kv_cap - 1e-9) * self.t_min
        return np.maximum(alone, by_area)

    def horizon(self, upper_bound: float) -> Horizon:
        """Batches J, a time bound and per-request deadlines such that some optimal schedule fits,
        given an objective upper bound (model units). See the package docstring."""
        a, t_min, n = self.arrival, self.t_min, self.n
        ub = float(upper_bound)
        tol = 1e-9
        last_done = last_first = None
        if self.objective == "makespan":
            deadline = np.full(n, ub)
            end = ub
            batches = math.floor((ub - self.a_min) / t_min + tol)
        else:
            ttft = self.objective == "sum-ttft"
            least = a + (self.first_batches if ttft else self.min_batches) * t_min  # earliest events
            others = least.sum() - least  # sum over k != i of the others' earliest events
            if not ttft and n > 1:
                others = np.maximum(others, float(np.sort(self._sorted_completion_bound())[: n - 1].sum()))
            # sum_i (event_i - a_i) <= UB, so event_i <= UB + sum_k a_k - sum_{k != i} event_k.
            deadline = ub + a.sum() - others
            end = float(deadline.max())
            batches = math.floor((end - self.a_min) / t_min + tol)
            if not ttft:
                # The batches lie in the union of the [a_i, F_i], of total length <= UB.
                batches = min(batches, math.floor(ub / t_min + tol))
        last = np.floor((deadline - self.a_min) / t_min + tol).astype(np.int64)
        if self.objective == "sum-ttft":
            last_first = last
            tail = int(self.peak.sum())
            batches += tail
            end += tail * self._max_batch_time()
        else:
            last_done = last
        return Horizon(max(1, batches), end, deadline, last_done, last_first)
