"""What a bound claims: its value, where it comes from, and which schedules it ranges over.

A lower bound is only as good as its argument. Every bound kvsched reports is a
:class:`Bound` that names its ``source`` (a back end's proven dual bound, or a
relaxation documented in docs/bounds.md as valid for every schedule of its
``scope``) and its :class:`Scope`, the set of schedules over which it bounds the
optimum. A bound over a larger set is also a bound over every smaller one
(the minimum over a superset is no larger), never the other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kvsched.schedule.ir import Batch, Schedule


class Scope(StrEnum):
    """A set of schedules of an instance, from the largest to the smallest.

    ALL: every legal schedule (chunking, pauses, evictions, idling).
    NO_EVICTION: every legal schedule that never evicts.
    CONTIGUOUS: schedules that serve each request without a break: its whole
    prompt in one batch, then one decode per batch until it completes (the
    time-indexed model's class).
    """

    ALL = "all"
    NO_EVICTION = "no-eviction"
    CONTIGUOUS = "contiguous"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def contains(self, other: Scope) -> bool:
        """Whether every schedule of ``other`` is in this set."""
        return self.rank <= other.rank

    @property
    def description(self) -> str:
        return _DESCRIPTION[self]


_RANK = {Scope.ALL: 0, Scope.NO_EVICTION: 1, Scope.CONTIGUOUS: 2}
_DESCRIPTION = {
    Scope.ALL: "every legal schedule",
    Scope.NO_EVICTION: "every schedule without eviction",
    Scope.CONTIGUOUS: "schedules serving each request without a break (no chunking, pause or eviction)",
}


@dataclass(frozen=True, slots=True)
class Bound:
    """A proven lower bound on the optimum over ``scope``.

    Parameters
    ----------
    value
        The bound, in the objective's unit (the instance's time unit).
    source
        Where it comes from: ``"highs"``, ``"cpsat"`` (a back end's proven dual
        bound) or the name of a relaxation (``"isolated"``, ``"kv-area"``,
        ``"mean-busy-time"``, ``"lagrangian"``, ...).
    scope
        The set of schedules it ranges over.
    """

    value: float
    source: str
    scope: Scope = Scope.ALL

    def __post_init__(self) -> None:
        if not isinstance(self.value, (int, float)) or math.isnan(self.value):
            raise ValueError(f"bound from {self.source}: {self.value!r} is not a number")

    def holds_for(self, scope: Scope) -> bool:
        """Whether this bound is a bound on the optimum over ``scope``."""
        return self.scope.contains(scope)


def best_bound(bounds: list[Bound] | tuple[Bound, ...], scope: Scope) -> Bound | None:
    """The largest of ``bounds`` that holds over ``scope`` (None if none does)."""
    valid = [b for b in bounds if b.holds_for(scope) and math.isfinite(b.value)]
    return max(valid, key=lambda b: b.value, default=None)


def narrower(a: Scope, b: Scope) -> Scope:
    """The smaller of two nested scopes (a schedule in both is in the smaller one)."""
    return a if a.rank >= b.rank else b


def scope_of(schedule: Schedule) -> Scope:
    """The narrowest of ALL and NO_EVICTION that contains ``schedule``.

    (Membership of CONTIGUOUS is known by construction where it matters: the
    time-indexed model's own schedules.)
    """
    # A run never evicts (kvsched.schedule.ir.Run), so only the single batches are read: spelling the runs
    # out took 67 s for a schedule of 20,000 requests run one at a time (6.7 million batches).
    evicts = any(type(e) is Batch and e.evicted.size for e in schedule.entries)
    return Scope.ALL if evicts else Scope.NO_EVICTION
