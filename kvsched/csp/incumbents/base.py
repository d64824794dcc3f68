"""What every incumbent producer returns (a validated schedule and its objective value), and when eviction is free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.objectives import OBJECTIVES
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import Trace, replay


@dataclass(frozen=True, slots=True, eq=False)
class Incumbent:
    """A complete schedule that the semantic core replayed without a violation.

    Parameters
    ----------
    name
        Who made it (``greedy:remaining-area``, ``policy:sarathi``, ``lns(...)``).
    schedule
        The schedule.
    value
        Its objective value, measured on the replay (never on the producer's own numbers).
    objective
        The objective's name (see :data:`kvsched.csp.objectives.OBJECTIVES`).
    stats
        Timings in seconds and counts (batches, evictions), for benchmarks.
    """

    name: str
    schedule: Schedule
    value: float
    objective: str
    stats: Mapping[str, Any] = field(default_factory=dict)
    #: The semantic core's replay of ``schedule``, where the producer kept it (so nobody replays it again).
    trace: Trace | None = field(default=None, repr=False)


def eviction_is_free(instance: Instance, cost_model: CostModel) -> bool:
    """Whether a refill costs nothing: unit time and no token or prefill budget (notes 005 Sec. 2).

    The refill then re-appends I + G tokens in one batch that also generates, exactly like a decode
    (``tests/test_csp_incumbents.py`` checks it by replay).
    """
    return isinstance(cost_model, UnitCost) and not has_budget(instance)


def has_budget(instance: Instance) -> bool:
    """Whether ``instance`` has a token or a prefill budget."""
    return instance.limits.max_batch_tokens is not None or instance.limits.max_prefill_tokens is not None


def confirmed(instance: Instance, cand: Incumbent, cost_model: CostModel) -> Incumbent:
    """``cand`` replayed through the core, valued on the replay (a candidate made without one)."""
    if cand.trace is not None:
        return cand
    trace = replay(instance, cand.schedule, cost_model)
    value = OBJECTIVES[cand.objective](trace)
    return Incumbent(cand.name, cand.schedule, value, cand.objective, cand.stats, trace)
