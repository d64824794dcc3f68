"""What the one solve driver needs from a formulation.

A formulation turns an instance into a :class:`~kvsched.csp.model.LinearModel`
over a set of schedules (its :class:`~kvsched.csp.certificate.Scope`), and maps
schedules to solution vectors and back. Everything it builds is returned as a
value (:class:`Built`), never left on the formulation object, so encoding and
decoding depend only on the model they belong to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvsched.csp.backends import SolverOptions
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.model import LinearModel
from kvsched.schedule.ir import Schedule
from kvsched.stop import Deadline


@dataclass(frozen=True, slots=True, eq=False)
class Built:
    """A built model and what goes with it.

    Parameters
    ----------
    model
        The linear model, with its warm start ``model.hint`` set.
    decode
        Solution vector -> schedule (in the formulation's class).
    encode
        Schedule -> solution vector, to check that the model accepts and values
        the decoded schedule as the core does (None where the decoded vector
        determines the schedule, and comparing objectives suffices).
    bounds
        Bounds found while building (e.g. an LP or Lagrangian bound), in
        instance units, each with its scope.
    stats
        Model size and facts for the user (windows, horizon, ...).
    """

    model: LinearModel
    decode: Callable[[np.ndarray], Schedule]
    encode: Callable[[Schedule], np.ndarray] | None
    bounds: tuple[Bound, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class Declined:
    """A model that was not built, and why (too large for the time left, deadline reached, ...)."""

    reason: str
    bounds: tuple[Bound, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)
    #: A better schedule of the class found on the way (e.g. by local search), if any.
    incumbent: Schedule | None = None


class Formulation(Protocol):
    """An exact model of one class of schedules of one instance.

    Attributes
    ----------
    name
        ``"time-indexed"``, ``"batch-indexed"``, ...
    scope
        The set of schedules the model ranges over.
    scale
        Model objective units -> instance units.
    time_indexed_warm_start
        Whether the driver should offer the time-indexed model's schedule as a warm start.
    """

    name: str
    scope: Scope
    scale: float
    time_indexed_warm_start: bool

    def value(self, schedule: Schedule) -> float:
        """The objective of a schedule of the class, in instance units."""
        ...

    def in_class(self, schedule: Schedule) -> bool:
        """Whether ``schedule`` is in the formulation's class (so it can warm-start the model)."""
        ...

    def hopeless(self, deadline: Deadline) -> str:
        """Why no model of this instance could be built and solved by ``deadline`` ("" if one might)."""
        ...

    def incumbents(self, deadline: Deadline, options: SolverOptions) -> list[tuple[Schedule, str]]:
        """The formulation's own schedules of its class (list schedules, local search, ...)."""
        ...

    def build(
        self, hint: Schedule, deadline: Deadline, options: SolverOptions, strengthen: bool
    ) -> Built | Declined:
        """The model for schedules no worse than ``hint`` (its warm start), or why it was not built."""
        ...
