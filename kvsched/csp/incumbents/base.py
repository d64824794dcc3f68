"""What every incumbent producer returns: a validated schedule and its objective value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import Trace


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
