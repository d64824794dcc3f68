"""Where a schedule loses against the chain Lagrangian: each request's reduced cost, a guide for the search.

For memory multipliers ``y >= 0`` let ``p_j(P)`` be the priced cost of a chain ``P`` of request ``j``
(its latency plus ``sum_u w_u y_{t_u}`` over its ops) and ``p_j*`` the cheapest (the chain pricing of
:mod:`kvsched.csp.bounds.chain`). Under unit time without a budget, every legal schedule ``S`` of value
``V(S)`` satisfies

    V(S) - L(y) = sum_j (p_j(S_j) - p_j*) + sum_t y_t (M - load_t(S)),

every term ``>= 0`` (``S_j`` is ``j``'s op chain in ``S``; see ``benchmarks/chain_milp.py``). So the
difference between a schedule and the bound splits into a part per request, its **reduced cost**, and the
memory the schedule leaves unused where the multipliers price it. On Azure code 1k (unit, no budget,
greedy 36,702 against L = 31,890) ten requests hold 2,331 of the 2,870 that the reduced costs sum to: the
long requests the greedy starves. The local search (:func:`kvsched.csp.incumbents.improve`) moves those
first (``guide``).

This is a heuristic's guide, never a bound: under a token budget or a chunk cap the schedule's side leaves
out the prompt batches, the gaps' holds, the refills and the completions' ghosts that ``p_j*`` prices (it
keeps the ops' KV and their one token each), so a reduced cost there is approximate and may be negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvsched.csp.bounds._chain_kernels import op_weights
from kvsched.csp.bounds.chain import LATENCY, ChainData, ChainLagrangian, evaluate, predict_slots
from kvsched.schedule.tokens import generation_events
from kvsched.schedule.validate import Trace
from kvsched.stop import Deadline

#: The most of the time left the guide's one slot pricing may be predicted to take.
PRICING_SHARE = 0.1


@dataclass(frozen=True, slots=True, eq=False)
class ChainGuide:
    """Reduced costs of any schedule's requests at fixed multipliers (``guide(trace)``).

    Parameters
    ----------
    data
        The instance as the chain relaxation sees it.
    y, z
        Memory and token multipliers (``z`` empty without a budget); ``len(y)`` is the dual horizon.
    price
        ``p_j*``: each request's cheapest chain at ``(y, z)``.
    """

    data: ChainData
    y: np.ndarray
    z: np.ndarray
    price: np.ndarray
    #: Each op's KV in blocks, request by request (the instance's, read once for every schedule).
    weights: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        data = self.data
        weights = [
            op_weights(int(i), int(o), data.block) for i, o in zip(data.prompt, data.output, strict=True)
        ]
        object.__setattr__(self, "weights", np.concatenate(weights))

    @classmethod
    def from_lagrangian(
        cls,
        lag: ChainLagrangian,
        deadline: Deadline | None = None,
    ) -> ChainGuide | None:
        """The guide at the Lagrangian's best multipliers, priced once on single slots (on the instance
        as ``lag`` priced it: ``lag.data``).

        None where ``lag`` bounds an objective other than total latency (the split above is total
        latency's), or where that
        pricing is predicted to take more than :data:`PRICING_SHARE` of what is left of ``deadline`` (at 10k
        requests the best point is often a block level's, whose bands on single slots are wide).
        """
        data = lag.data
        if data.objective != LATENCY or not lag.y.size:
            return None
        dear = deadline is not None and deadline.bounded
        if dear and predict_slots(data, lag.y) > PRICING_SHARE * deadline.remaining():  # type: ignore[union-attr]
            return None
        z = lag.z if data.budget is not None else np.zeros(0)
        return cls(data, lag.y, z, evaluate(data, lag.y, z).price)

    def __call__(self, trace: Trace) -> np.ndarray:
        """``p_j(S_j) - p_j*`` for each request of the schedule ``trace`` replays (slots)."""
        data, y, z = self.data, self.y, self.z
        pos, ends = generation_events(trace)  # by request, then time: op u of j is j's u-th event
        if pos.size != int(data.output.sum()):
            raise ValueError("the guide reads complete schedules only")
        # A batch that starts at s lies in slot floor(s) and lasts one slot.
        slots = np.floor(data.slots_of(ends) - 1.0 + 1e-9).astype(np.int64)
        priced = slots < y.size
        cost = np.zeros(len(slots))
        cost[priced] = self.weights[priced] * y[slots[priced]]
        if z.size:
            cost[slots < z.size] += z[slots[slots < z.size]]  # each op's generating token
        last = np.cumsum(data.output) - 1  # each request's last event
        latency = slots[last] + 1.0 - data.arrival
        return latency + np.bincount(pos, weights=cost, minlength=data.n) - self.price
