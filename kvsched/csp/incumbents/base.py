"""What every incumbent producer returns (a validated schedule and its objective value), and when eviction is free."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.objectives import OBJECTIVES
from kvsched.instances.model import Instance
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Run, Schedule
from kvsched.schedule.validate import Trace, replay

#: Entries the price of a replay is measured on (:func:`replay_seconds`), at most a quarter of the schedule's.
REPLAY_PROBE_ENTRIES = 4096
#: The margin on that price: on 100k ShareGPT requests (memory load 1) the first 1,024 / 4,096 / 16,384 of
#: the filling greedy's 431,797 entries priced its whole replay (32.1 s) at 31.0 / 32.6 / 33.3 s.
REPLAY_MARGIN = 1.25


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


@dataclass(frozen=True, slots=True, eq=False)
class Unbuilt:
    """A producer's finished run valued on its own log, its schedule not built yet.

    The local search discards most of its candidates on that value alone, and building a schedule from a
    greedy's log took as long as deciding it (1k Azure code requests: 7 ms deciding, 14 ms building): a
    candidate is built only where a search ends with it (:func:`confirmed`).

    Parameters
    ----------
    name, value, objective, stats
        As :class:`Incumbent`'s (``value`` read off the log, equal to the replay's: tested).
    build
        Builds the schedule: the :class:`Incumbent`, valued on its log, not replayed.
    """

    name: str
    value: float
    objective: str
    stats: Mapping[str, Any]
    build: Callable[[], Incumbent] = field(repr=False)

    @property
    def trace(self) -> None:
        """No replay yet (as an :class:`Incumbent` valued on its log): :func:`confirmed` makes one."""
        return None


def eviction_is_free(instance: Instance, cost_model: CostModel) -> bool:
    """Whether a refill costs nothing: unit time and no token or prefill budget (notes 005 Sec. 2).

    The refill then re-appends I + G tokens in one batch that also generates, exactly like a decode
    (``tests/test_csp_incumbents.py`` checks it by replay).
    """
    return isinstance(cost_model, UnitCost) and not has_budget(instance)


def has_budget(instance: Instance) -> bool:
    """Whether ``instance`` has a token or a prefill budget."""
    return instance.limits.max_batch_tokens is not None or instance.limits.max_prefill_tokens is not None


def confirmed(instance: Instance, cand: Incumbent | Unbuilt, cost_model: CostModel) -> Incumbent:
    """``cand`` replayed through the core, valued on the replay (a candidate made without one; built first
    where it was not)."""
    if isinstance(cand, Unbuilt):
        cand = cand.build()
    if cand.trace is not None:
        return cand
    trace = replay(instance, cand.schedule, cost_model)
    value = OBJECTIVES[cand.objective](trace)
    return Incumbent(cand.name, cand.schedule, value, cand.objective, cand.stats, trace)


def entries_seconds(instance: Instance, entries: Sequence[Batch | Run], cost_model: CostModel) -> float:
    """Seconds the core takes to replay ``entries`` from the instance's start (requests left unfinished),
    timed from the first entry to the last: neither the state's set-up nor the end's check of the
    unfinished requests counts, so that what is measured scales with the entries."""
    spent = [0.0]

    def timed(state: EngineState) -> Iterator[Batch | Run]:
        started = time.perf_counter()
        yield from entries
        spent[0] = time.perf_counter() - started

    replay(instance, Schedule(()), cost_model, strict=False, then=timed)
    return spent[0]


def replay_seconds(instance: Instance, schedule: Schedule, cost_model: CostModel) -> float:
    """A high estimate of the seconds the core's replay of ``schedule`` takes: its first entries' replay
    (:func:`entries_seconds`, :data:`REPLAY_PROBE_ENTRIES` at most) scaled by the entries, times
    :data:`REPLAY_MARGIN`.

    Measured rather than derived from the producer's own time: on 100k ShareGPT requests the replay took
    2.9 times the filling greedy's deciding and building on one machine and 1.7 times on another, and a
    deadline priced at twice that was overrun by 36 s."""
    entries = schedule.entries
    if not entries:
        return 0.0
    k = min(REPLAY_PROBE_ENTRIES, max(1, len(entries) // 4))
    return REPLAY_MARGIN * entries_seconds(instance, entries[:k], cost_model) * len(entries) / k
