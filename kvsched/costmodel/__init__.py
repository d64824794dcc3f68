"""Batch-time models: what turns a batch into time.

Use :func:`make_cost_model` to build the model an instance names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsched.costmodel.base import BatchView, CostModel
from kvsched.costmodel.infermax import InfermaxLinear
from kvsched.costmodel.unit import UnitCost
from kvsched.errors import InputError

#: Cost models by the name an instance file's ``time_model.name`` uses.
REGISTRY: dict[str, Callable[..., CostModel]] = {
    "unit": UnitCost,
    "infermax-linear": InfermaxLinear,
}


def make_cost_model(name: str, params: dict[str, Any] | None = None) -> CostModel:
    """Build a registered cost model, with one clear error for a bad name or parameter."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise InputError(f"time_model.name: unknown cost model {name!r} (known: {known})") from None
    try:
        return factory(**(params or {}))
    except TypeError as exc:
        raise InputError(f"time_model.params: {exc}") from None
    except ValueError as exc:
        raise InputError(f"time_model.params: {exc}") from None


__all__ = ["REGISTRY", "BatchView", "CostModel", "InfermaxLinear", "UnitCost", "make_cost_model"]
