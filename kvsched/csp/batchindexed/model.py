"""The batch-indexed formulation: data, schedules of its class, and :meth:`BatchIndexed.build`."""

from __future__ import annotations

import math

from kvsched.csp.batchindexed.builder import Builder
from kvsched.csp.batchindexed.codec import BatchModel
from kvsched.csp.batchindexed.schedules import ScheduleForms
from kvsched.csp.batchindexed.tokens import clique_sets
from kvsched.schedule.ir import Schedule
from kvsched.stop import Deadline


class BatchIndexed(ScheduleForms):
    """Build, warm-start and decode the batch-indexed model of one instance.

    Its parameters are those of :class:`~kvsched.csp.batchindexed.data.BatchData`, whose constructor it
    inherits. Every :meth:`build` returns a :class:`BatchModel` by value: encoding and decoding go through
    it, never through state left on this object.
    """

    def clique_sets(self) -> list[dict[int, int]]:
        """See :func:`kvsched.csp.batchindexed.tokens.clique_sets`."""
        return clique_sets(self)

    def build(
        self,
        upper_bound: float,
        hint: Schedule | None = None,
        *,
        horizon: int | None = None,
        symmetry: bool = True,
        cuts: bool | str = False,
        strengthen: bool = True,
        dominance: bool = True,
        stop: Deadline | None = None,
    ) -> BatchModel:
        """The model for schedules with objective <= ``upper_bound`` (model units).

        ``hint`` (a legal schedule of the class) becomes the full warm-start
        vector. ``horizon`` overrides the number of batches J (tests only: a J
        below the derived one may cut off every optimum). ``strengthen`` adds the
        token-indexed rows (valid for every legal schedule); ``dominance`` the
        normal-form rows where they apply (they keep an optimum, not every
        schedule: the hint is normalised to satisfy them). ``stop``: the build raises
        :class:`~kvsched.stop.DeadlineReached` once it has passed.
        """
        h = self.horizon(upper_bound)
        J, t_ub = h.batches, h.end
        dominance = dominance and self.normal_form
        if hint is not None:
            hint = self.retimed(hint)
            if dominance:
                hint = self.normalised(hint)
            hint = self.canonical(hint)
            J = max(J, len(hint.batches))
            t_ub = max(t_ub, hint.makespan / self.scale)
        if horizon is not None:
            J = int(horizon)
        if self.integral_time:
            t_ub = math.floor(t_ub + 1e-9)
        builder = Builder(
            self,
            h,
            J,
            t_ub,
            symmetry=symmetry,
            cuts=cuts,
            strengthen=strengthen and not self.holes,  # a re-opened hole must stay open
            dominance=dominance,
            stop=stop,
        )
        variables = builder.build()
        built = BatchModel(builder.m, self, variables, builder.need_h, t_ub)
        if hint is not None:
            builder.m.hint = built.vector_of(hint)
        return built
