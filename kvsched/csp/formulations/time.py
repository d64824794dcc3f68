"""The time-indexed formulation behind the driver (:mod:`kvsched.csp.timeindexed` is the model)."""

from __future__ import annotations

import numpy as np

from kvsched.csp.backends import SolverOptions
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.formulations.base import Built, Declined
from kvsched.csp.lagrangian import horizon_windows, lagrangian
from kvsched.csp.timeindexed import MAX_SLOTS, TimeIndexed
from kvsched.instances.model import Instance
from kvsched.schedule.core import ScheduleError
from kvsched.schedule.ir import Schedule
from kvsched.stop import Deadline

#: Share of what is left that the list schedules may use.
LIST_SHARE = 0.3
#: Share of what is left that the local search may use.
LOCAL_SEARCH_SHARE = 0.15
#: Above this relative gap between the incumbent and the Lagrangian bound the MILP rarely closes it
#: within the limit, so the local search gets a longer leash (20 moves per request without
#: improvement instead of 400). ShareGPT / 10 at KV 20%: 0.4-0.9% better schedules; at 30-40% the
#: gaps are below 2% up to n = 75 and the longer search found nothing.
LONG_SEARCH_GAP = 0.02
#: Nonzeros of the model that each second left pays for. Building runs at about 50,000 nonzeros a
#: second and the LP needs the rest; 200 ShareGPT requests / 10 make 0.5 M. A larger model is not
#: built (200 full-length ShareGPT requests would make about 10^8).
NONZEROS_PER_SECOND = 20_000
#: Models up to this size are built whenever at least MIN_BUILD_SECONDS are left.
MIN_NONZEROS = 500_000
MIN_BUILD_SECONDS = 2.0


class TimeFormulation:
    """Schedules serving each request without a break, on unit-time slots (:data:`Scope.CONTIGUOUS`)."""

    name = "time-indexed"
    scope = Scope.CONTIGUOUS
    time_indexed_warm_start = False

    def __init__(self, instance: Instance, objective: str, *, seed: int = 0) -> None:
        self.ti = TimeIndexed(instance, objective)  # InputError where the class does not apply
        self.instance = instance
        self.objective = objective
        self.scale = self.ti.slot
        self.seed = seed

    # ------------------------------------------------------------ schedules
    def starts(self, schedule: Schedule) -> np.ndarray | None:
        """Start slots of ``schedule`` if it lies in the class, else None."""
        ti = self.ti
        starts = np.full(len(ti.prompt), -1, dtype=np.int64)
        for b in schedule.batches:
            fresh = b.requests[starts[b.requests] < 0]
            starts[fresh] = round(b.start / ti.slot)
        if (starts < 0).any():
            return None
        try:
            rebuilt = ti.schedule_of(starts)
        except ScheduleError:  # those starts are illegal without the schedule's chunks, pauses or evictions
            return None
        return starts if rebuilt.same_as(schedule, tol=1e-9) else None

    def in_class(self, schedule: Schedule) -> bool:
        return self.starts(schedule) is not None

    def value(self, schedule: Schedule) -> float:
        starts = self.starts(schedule)
        if starts is None:
            raise ValueError("the schedule is not in the time-indexed class")
        return self.ti.value(starts) * self.scale

    def hopeless(self, deadline: Deadline) -> str:
        ti = self.ti
        if ti.list_horizon > MAX_SLOTS:
            return f"the list schedule would lay out {ti.list_horizon:,} slots (more than {MAX_SLOTS:,})"
        # Every request's window holds at least one start, and each start writes one row entry per slot
        # of its run: a model below this size does not exist.
        least = int(ti.output.sum())
        if least > max(MIN_NONZEROS, NONZEROS_PER_SECOND * deadline.remaining()):
            return f"at least {least:,} nonzeros, too many to build and solve in the {deadline.remaining():.3g} s left"
        return ""

    def incumbents(self, deadline: Deadline, options: SolverOptions) -> list[tuple[Schedule, str]]:
        starts = self.ti.heuristic_starts(deadline.share(LIST_SHARE))
        if starts is None or deadline.expired():
            return []
        return [(self.ti.schedule_of(starts), "list schedule")]

    # ---------------------------------------------------------------- model
    def build(
        self, hint: Schedule, deadline: Deadline, options: SolverOptions, strengthen: bool
    ) -> Built | Declined:
        ti, slot = self.ti, self.scale
        starts = self.starts(hint)
        assert starts is not None, "the driver hands the formulation a hint of its class"
        upper = ti.value(starts)
        size = ti.nonzeros(horizon_windows(ti, starts) if strengthen else ti.windows(upper))
        budget = max(MIN_NONZEROS, NONZEROS_PER_SECOND * deadline.remaining())
        if size > budget or deadline.remaining() < MIN_BUILD_SECONDS:
            better = ti.improve(starts, seed=self.seed, deadline=deadline.share(LOCAL_SEARCH_SHARE))
            return Declined(
                f"about {size:,} nonzeros, too many to build and solve in the {deadline.remaining():.3g} s left",
                stats={"nonzeros_estimate": size},
                incumbent=ti.schedule_of(better) if ti.value(better) < upper else None,
            )
        lag = windows = None
        bounds: list[Bound] = []
        hint_source = ""
        if strengthen:
            lag = lagrangian(ti, starts, options, deadline.share(0.3))
            if lag is not None:
                # A Lagrangian relaxation of the class's own model: a bound on the class's optimum.
                bounds.append(Bound(lag.bound * slot, "lagrangian (LP duals)", Scope.CONTIGUOUS))
            if lag is None or lag.bound < upper:  # a bound that meets the incumbent needs no search
                wide = lag is None or upper - lag.bound > LONG_SEARCH_GAP * upper
                better = ti.improve(
                    starts,
                    stall=max(400, 20 * len(ti.prompt)) if wide else 400,
                    seed=self.seed,
                    deadline=deadline.share(LOCAL_SEARCH_SHARE),
                )
                if ti.value(better) < upper:
                    starts, upper, hint_source = better, ti.value(better), "local search"
            if lag is not None:
                windows = lag.windows(ti, upper, starts)
        if deadline.expired():
            return Declined("the deadline passed before the model was built", tuple(bounds))
        built = ti.build(upper, starts, windows=windows)
        stats = {
            "variables": built.model.num_vars,
            "rows": len(built.model.rows),
            "nonzeros": built.model.num_nonzeros,
            "horizon": max(w.last for w in built.windows) + int(ti.output.max()),
            "mean_window": float(np.mean([w.last - w.first for w in built.windows])),
            "lagrangian_bound": None if lag is None else lag.bound * slot,
        }
        if hint_source:
            stats["improved_by"] = hint_source

        return Built(
            built.model,
            decode=lambda x: ti.schedule_of(built.starts_from(x)),
            encode=None,  # the decoded starts determine the schedule: the objectives are compared
            bounds=tuple(bounds),
            stats=stats,
        )
