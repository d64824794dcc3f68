"""The batch-indexed formulation behind the driver, and its token-indexed special case.

The models are :mod:`kvsched.csp.batchindexed` (every legal schedule with block
size 1 under the unit or infermax-linear cost model) and
:mod:`kvsched.csp.tokenindexed` (the same class where every request arrives at
once under unit time without budgets; chosen automatically).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kvsched.csp import tokenindexed as token_indexed
from kvsched.csp.backends import SolverOptions, lp_relaxation
from kvsched.csp.batchindexed import BatchIndexed
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.formulations.base import Built, Declined
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.stop import Deadline, DeadlineReached

#: Share of what is left for the token-indexed model's deadline LPs (one per request).
DEADLINE_SHARE = 0.2
#: Variables of the batch-indexed model that each second left pays for. Building runs at about
#: 5,000 variables a second in Python (25,299 variables and 49,206 rows for 20 ShareGPT requests
#: took 5.9 s), and the solver needs at least as long again.
VARIABLES_PER_SECOND = 2_500
#: Below this many seconds left, no model is built.
MIN_BUILD_SECONDS = 1.0
#: Variables per request and batch, about (c, g, G, d, e, mb, m, alpha, phase and token rows).
VARIABLES_PER_CELL = 12


class BatchFormulation:
    """Every legal schedule (:data:`Scope.ALL`), or every one without eviction (:data:`Scope.NO_EVICTION`)."""

    name = "batch-indexed"

    def __init__(
        self, instance: Instance, objective: str, *, allow_eviction: bool = True, solver: str = "highs"
    ) -> None:
        self.bi = BatchIndexed(instance, objective, allow_eviction=allow_eviction)  # InputError if n/a
        self.instance = instance
        self.objective = objective
        self.scope = Scope.ALL if allow_eviction else Scope.NO_EVICTION
        self.scale = self.bi.scale
        self.solver = solver
        # Under unit time the time-indexed optimum is a strong warm start (see the driver).
        self.time_indexed_warm_start = self.bi.unit

    def in_class(self, schedule: Schedule) -> bool:
        return self.bi.in_class(schedule)

    def value(self, schedule: Schedule) -> float:
        return self.bi.value(schedule) * self.scale

    def least_variables(self) -> int:
        """A lower bound on the model's size: every schedule needs the KV area's batches (area / M)."""
        bi = self.bi
        area = float(np.sum(bi.output * bi.prompt + bi.output * (bi.output - 1) / 2))
        batches = max(int(bi.min_batches.max()), math.ceil(area / bi.kv_cap))
        return VARIABLES_PER_CELL * bi.n * batches

    def hopeless(self, deadline: Deadline) -> str:
        least = self.least_variables()
        if least > VARIABLES_PER_SECOND * deadline.remaining():
            return f"at least {least:,} variables, too many to build and solve in the {deadline.remaining():.3g} s left"
        return ""

    def incumbents(self, deadline: Deadline, options: SolverOptions) -> list[tuple[Schedule, str]]:
        # A warm start of more batches than a model could be built over in the time left is skipped.
        return self.bi.warm_starts(
            deadline, batch_rate=VARIABLES_PER_SECOND / (VARIABLES_PER_CELL * self.bi.n)
        )

    def estimate(self, upper: float) -> int:
        """About how many variables the model over schedules no worse than ``upper`` has: the cells, and the
        token rows' one per (request, token, batch) that its bounds leave open, at most (those dominate
        where outputs are long: 38,000 of 42,000 for 6 chunked requests of 241 tokens over 157 batches)."""
        batches = self.bi.horizon(upper / self.scale).batches
        tokens = 0 if self.bi.holes else int(self.bi.output.sum())  # (the token rows stay out with holes)
        return (VARIABLES_PER_CELL * self.bi.n + tokens) * batches

    def build(
        self, hint: Schedule, deadline: Deadline, options: SolverOptions, strengthen: bool
    ) -> Built | Declined:
        bi = self.bi
        upper = bi.value(hint)
        size = self.estimate(upper * self.scale)
        budget = VARIABLES_PER_SECOND * deadline.remaining()
        if size > budget or deadline.remaining() < MIN_BUILD_SECONDS:
            return Declined(
                f"about {size:,} variables, too many to build and solve in the {deadline.remaining():.3g} s left",
                stats={"variables_estimate": size},
            )
        bounds: list[Bound] = []
        deadlines = None
        # The build stops where it would leave the back end less than MIN_BUILD_SECONDS.
        stop = deadline.before(MIN_BUILD_SECONDS)
        try:
            if token_indexed.applies(bi):
                form = token_indexed.TokenIndexed(bi)
                share = replace(options, time_limit=max(0.01, DEADLINE_SHARE * deadline.remaining()))
                deadlines = form.deadlines(upper, share)
                # The clique rows lift the LP bound (and the deadlines above) but slowed CP-SAT's search
                # about twice on the benchmark draws: the LP bound is taken with them, CP-SAT gets none.
                built = form.build(upper, hint, deadlines=deadlines, stop=stop)
                lp = lp_relaxation(built.model, options, deadline.share(DEADLINE_SHARE))
                if lp is not None:
                    value = (
                        math.ceil(lp[0] - token_indexed.LP_TOL) if built.model.integral_objective else lp[0]
                    )
                    # The LP of an exact model of the class: a bound on the class's optimum.
                    bounds.append(Bound(value * self.scale, "lp relaxation", self.scope))
                if self.solver == "cpsat":
                    built = form.build(upper, hint, deadlines=deadlines, cliques=False, stop=stop)
                name = "token-indexed"
            else:
                built = bi.build(upper, hint, stop=stop)
                name = "batch-indexed"
        except DeadlineReached:
            return Declined(
                f"about {size:,} variables estimated; building them took the time left",
                bounds=tuple(bounds),
                stats={"variables_estimate": size},
            )
        model = built.model
        stats = {
            "model": name,
            "variables": model.num_vars,
            "rows": len(model.rows),
            "indicators": len(model.indicators),
            "nonzeros": model.num_nonzeros,
            "horizon": built.horizon_batches,
            "lp_deadlines": 0 if deadlines is None else int((deadlines < np.iinfo(np.int64).max).sum()),
        }
        return Built(
            model, decode=built.schedule_from, encode=built.vector_of, bounds=tuple(bounds), stats=stats
        )
