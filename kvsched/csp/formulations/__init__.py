"""The exact formulations the solve driver runs (:class:`Formulation`), by ``--formulation`` name."""

from __future__ import annotations

from kvsched.csp.formulations.base import Built, Declined, Formulation
from kvsched.csp.formulations.batch import BatchFormulation
from kvsched.csp.formulations.time import TimeFormulation
from kvsched.errors import InputError
from kvsched.instances.model import Instance

#: ``--formulation`` names.
FORMULATIONS = ("time", "batch")


def make_formulation(
    name: str,
    instance: Instance,
    objective: str,
    *,
    allow_eviction: bool = True,
    solver: str = "highs",
    seed: int = 0,
) -> Formulation:
    """The formulation called ``name`` for ``instance`` (one clear error where it does not apply)."""
    if name == "time":
        return TimeFormulation(instance, objective, seed=seed)
    if name == "batch":
        return BatchFormulation(instance, objective, allow_eviction=allow_eviction, solver=solver)
    raise InputError(f"--formulation: unknown formulation {name!r} (known: {', '.join(FORMULATIONS)})")


__all__ = [
    "FORMULATIONS",
    "BatchFormulation",
    "Built",
    "Declined",
    "Formulation",
    "TimeFormulation",
    "make_formulation",
]
