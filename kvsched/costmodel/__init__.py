"""Batch-time models: what turns a batch into time.

Use :func:`make_cost_model` to build the model an instance names, or a coefficient set shipped with
kvsched by its name (``make_cost_model("llama-2-7b_a100-80gb_tp1")``). Models:

========================  ====================================================  =================
name                      batch time                                            source
========================  ====================================================  =================
``unit``                  one slot                                              seed 004
``infermax-linear``       InferMax's linear terms                               seed 003 Sec. 3.2
``hinge``                 c + a max(0, tokens - b0)                             seed 001 Eq. 2.3
``staircase``             c + a ceil(tokens / b0)                               seed 001 v3
``rad``                   tiling model with ceilings over tiles                 seed 000 Eq. 4-7
``roofline``              max(FLOPs/peak, bytes/bandwidth) per kernel           model + GPU specs
``calibrated``            InferMax's terms + piecewise-linear token term        fitted (calibrate)
========================  ====================================================  =================

Coefficient files (:mod:`kvsched.costmodel.coeffile`) hold a name and flat
parameters; :mod:`kvsched.costmodel.surrogate` gives any model's linear
surrogate and its error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvsched.costmodel.base import BatchView, CostModel
from kvsched.errors import InputError
from kvsched.lazy import lazy_names

#: Public name -> the module that defines it, imported on first use: a command loads the one
#: cost model its instance names, not all seven (about 10 ms of imports a command).
_WHERE = {
    "CalibratedCost": "kvsched.costmodel.calibrated",
    "calibrated": "kvsched.costmodel.calibrated",
    "InfermaxLinear": "kvsched.costmodel.infermax",
    "HingeCost": "kvsched.costmodel.piecewise",
    "StaircaseCost": "kvsched.costmodel.piecewise",
    "RadTiling": "kvsched.costmodel.rad",
    "Roofline": "kvsched.costmodel.roofline",
    "UnitCost": "kvsched.costmodel.unit",
}

#: Registry name -> the public name of its factory (in :data:`_WHERE`).
_FACTORIES = {
    "unit": "UnitCost",
    "infermax-linear": "InfermaxLinear",
    "hinge": "HingeCost",
    "staircase": "StaircaseCost",
    "rad": "RadTiling",
    "roofline": "Roofline",
    "calibrated": "calibrated",
}


__getattr__, __dir__ = lazy_names("kvsched.costmodel", _WHERE, globals())


class _Registry(Mapping[str, Callable[..., CostModel]]):
    """The registered names, in order; a factory's module is imported when it is looked up."""

    def __getitem__(self, name: str) -> Callable[..., CostModel]:
        return __getattr__(_FACTORIES[name])  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(_FACTORIES)

    def __len__(self) -> int:
        return len(_FACTORIES)

    def __contains__(self, name: object) -> bool:
        return name in _FACTORIES

    def __repr__(self) -> str:
        return f"REGISTRY({', '.join(_FACTORIES)})"


#: Cost models by the name an instance file's ``time_model.name`` uses (read-only).
REGISTRY: Mapping[str, Callable[..., CostModel]] = _Registry()


def make_cost_model(name: str, params: dict[str, Any] | None = None) -> CostModel:
    """Build a registered cost model, or a shipped coefficient set by name, with one clear error for a
    bad name or parameter.

    Parameters
    ----------
    name
        A registered name (:data:`REGISTRY`: ``unit``, ``calibrated``, ...), or the stem of a coefficient
        file shipped with kvsched (``llama-2-7b_a100-80gb_tp1``), as ``--cost-model`` takes it.
    params
        The model's parameters; for a shipped set, they replace single coefficients of the file's.
    """
    if name not in REGISTRY:
        from kvsched.costmodel.coeffile import shipped, shipped_cost_model

        found = shipped_cost_model(name) if isinstance(name, str) else None
        if found is None:
            known = ", ".join(sorted(REGISTRY))
            sets = ", ".join(shipped()) or "none"
            raise InputError(
                f"time_model.name: unknown cost model {name!r} (known: {known}; or a shipped coefficient "
                f"set: {sets})"
            )
        # The set's own model (``calibrated``) with its coefficients: one path with ``--cost-model``.
        name, coefficients = found
        params = {**coefficients, **(params or {})}
    factory = REGISTRY[name]
    known = _parameters(factory)
    unknown = sorted(set(params or {}) - known) if known is not None else []
    if unknown:
        raise InputError(
            f"time_model.params: unknown parameter {unknown[0]!r} of cost model {name!r} "
            f"(known: {', '.join(sorted(known or ())) or 'none'})"
        )
    try:
        return factory(**(params or {}))
    except TypeError as exc:
        raise InputError(f"time_model.params: {exc}") from None
    except ValueError as exc:
        raise InputError(f"time_model.params: {exc}") from None


def _parameters(factory: Callable[..., CostModel]) -> set[str] | None:
    """The keyword parameters ``factory`` takes (``None``: any, e.g. ``**params``)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    # ``name`` is each model's label, not a coefficient.
    return {p.name for p in sig.parameters.values() if p.kind in kinds and p.name != "name"}


__all__ = [
    "REGISTRY",
    "BatchView",
    "CalibratedCost",
    "CostModel",
    "HingeCost",
    "InfermaxLinear",
    "RadTiling",
    "Roofline",
    "StaircaseCost",
    "UnitCost",
    "make_cost_model",
]
