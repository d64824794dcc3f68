"""Coefficient files: a fitted cost model as JSON, and how ``--cost-model`` finds one.

A coefficient file is::

    {"schema_version": 1, "kind": "kvsched.cost-coefficients",
     "name": "calibrated", "params": {"a0": 0.009, ...}, "meta": {...}}

``name`` and ``params`` are exactly an instance's ``time_model``, so an
instance built from a file carries the coefficients itself and never refers
back to the file. ``meta`` records the model, GPU, where each term comes
from, and the fidelity figures. The files shipped with kvsched live in
``kvsched/costmodel/coefficients/`` and can be named by their stem
(``--cost-model llama-2-7b_a100-80gb_tp1``; in Python
``make_cost_model("llama-2-7b_a100-80gb_tp1")``, both through :func:`shipped_cost_model`).

A coefficient the calibrated model does not name counts as 0, so a file that lost one (cut short, or a
line deleted by hand) would still load, with other numbers. Files kvsched writes therefore list every
scalar coefficient, zeros included, and record how many entries ``params`` holds in
``meta.param_count``; loading such a file refuses one whose ``params`` differ from that. Files written
before (without ``param_count``) load as they always did: a coefficient absent from them is 0. The zeros
are dropped again on loading, so an instance's ``time_model`` is the same whichever way a file was
written. A shipped file's ``meta.model``, ``meta.gpu`` and ``meta.tp`` must agree with its name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.errors import InputError

if TYPE_CHECKING:
    from kvsched.costmodel.calibrated import CalibratedCost

KIND = "kvsched.cost-coefficients"
COEFFICIENT_DIR = Path(__file__).parent / "coefficients"
#: ``meta`` key: the number of entries in ``params`` (see the module docstring).
PARAM_COUNT = "param_count"
#: A coefficient file's stem: ``MODEL_GPU_tpN`` (preset names hold no underscore).
_STEM = re.compile(r"^([^_]+)_([^_]+)_tp([0-9]+)$")


@dataclass(frozen=True, slots=True)
class CoefficientFile:
    """A coefficient file's contents."""

    name: str
    params: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)


def parse_coefficients(doc: Any, source: str) -> CoefficientFile:
    """Validate a coefficient document (already parsed JSON) and build its model once to check it."""
    from kvsched.costmodel import REGISTRY, make_cost_model

    if not isinstance(doc, dict):
        raise InputError(f"{source}: a coefficient file is a JSON object")
    if doc.get("kind") != KIND:
        raise InputError(f"{source}: kind: expected {KIND!r}, got {doc.get('kind')!r}")
    if doc.get("schema_version") != 1:
        raise InputError(f"{source}: schema_version: expected 1, got {doc.get('schema_version')!r}")
    unknown = set(doc) - {"schema_version", "kind", "name", "params", "meta"}
    if unknown:
        raise InputError(f"{source}: unknown field {sorted(unknown)[0]!r}")
    if "params" not in doc:  # without it, every coefficient would default to 0: zero-time batches
        raise InputError(f"{source}: params: required field is missing")
    name, params = doc.get("name"), doc["params"]
    if not isinstance(name, str):
        raise InputError(f"{source}: name: expected a cost-model name")
    if not isinstance(params, dict):
        raise InputError(f"{source}: params: expected an object of numbers")
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InputError(f"{source}: params.{key}: {value!r} is not a finite number")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise InputError(f"{source}: meta: expected an object")
    values = {k: float(v) for k, v in params.items()}
    if name not in REGISTRY:
        # A registered model only: make_cost_model would also take a shipped set's name, and a file that
        # named one would refer back to another file (or to itself).
        raise InputError(
            f"{source}: name: unknown cost model {name!r} (known: {', '.join(sorted(REGISTRY))})"
        )
    try:
        make_cost_model(name, values)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    # After the model check, so that a misspelt key is named as such rather than miscounted.
    _check_complete(name, values, meta, source)
    return CoefficientFile(name, _instance_params(name, values), meta)


def coefficient_params(cost: CalibratedCost) -> tuple[dict[str, float], dict[str, int]]:
    """A calibrated model's ``params`` as a file lists them (every scalar, zeros included) and the
    ``meta`` entry that lets loading check them (:data:`PARAM_COUNT`)."""
    params = cost.params(zeros=True)
    return params, {PARAM_COUNT: len(params)}


def _check_complete(name: str, params: dict[str, float], meta: dict[str, Any], source: str) -> None:
    """One :class:`InputError` when a file that records :data:`PARAM_COUNT` has lost a coefficient."""
    if PARAM_COUNT not in meta:
        return  # written before the count existed: a coefficient absent from it is 0, as it always was
    count = meta[PARAM_COUNT]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"{source}: meta.{PARAM_COUNT}: {count!r} is not a positive whole number")
    if name == "calibrated":
        from kvsched.costmodel.calibrated import SCALARS

        missing = [key for key in SCALARS if key not in params]
        if missing:
            raise InputError(
                f"{source}: params.{missing[0]}: missing, but a file with meta.{PARAM_COUNT} lists every "
                "coefficient, zeros included: the file was cut short or edited"
            )
    if len(params) != count:
        raise InputError(
            f"{source}: params: {len(params)} coefficients, but meta.{PARAM_COUNT} is {count}: the file "
            "was cut short or edited"
        )


def _instance_params(name: str, params: dict[str, float]) -> dict[str, float]:
    """``params`` as an instance stores them: a calibrated model's zero scalars left out, as
    :meth:`CalibratedCost.params` leaves them (the model reads an absent scalar as 0 either way)."""
    if name != "calibrated":
        return params  # another model's absent parameter need not mean 0
    from kvsched.costmodel.calibrated import SCALARS

    return {k: v for k, v in params.items() if not (k in SCALARS and v == 0.0)}


def _check_claims(cf: CoefficientFile, source: str, stem: str) -> None:
    """One :class:`InputError` when ``meta`` names another model, GPU or tp than the file name ``stem``.

    Only for shipped files, whose name is what ``--cost-model`` asks for: a user's file may be named
    anything, and nothing else says what it is loaded for.
    """
    match = _STEM.match(stem)
    if match is None:
        return
    for key, want in zip(("model", "gpu", "tp"), (match[1], match[2], int(match[3])), strict=True):
        if key in cf.meta and cf.meta[key] != want:
            raise InputError(
                f"{source}: meta.{key}: {cf.meta[key]!r}, but the file is the one for {key} {want!r}"
            )


def load_coefficients(path: str | Path) -> CoefficientFile:
    """Read and validate a coefficient file."""
    import json  # here: a command on a CSV trace reads and writes no JSON (the import is ~6M instructions)

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: coefficient file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not JSON ({exc})") from None
    cf = parse_coefficients(doc, str(p))
    if p.resolve().parent == COEFFICIENT_DIR.resolve():
        _check_claims(cf, str(p), p.stem)
    return cf


def dump_coefficients(doc: dict[str, Any]) -> str:
    """A coefficient document as the text files hold (stable key order, one trailing newline)."""
    import json

    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def shipped() -> dict[str, Path]:
    """The coefficient files shipped with kvsched, by stem."""
    return {p.stem: p for p in sorted(COEFFICIENT_DIR.glob("*.json"))}


def shipped_cost_model(stem: str) -> tuple[str, dict[str, float]] | None:
    """``(name, params)`` of the shipped coefficient set ``stem`` (``llama-2-7b_a100-80gb_tp1``), or
    ``None`` when no shipped file has that stem: the one lookup of a shipped set by name, for the command
    line's ``--cost-model`` (:func:`resolve_cost_model`) and for Python's ``make_cost_model``."""
    files = shipped()
    if stem not in files:
        return None
    cf = load_coefficients(files[stem])
    return cf.name, dict(cf.params)


def resolve_cost_model(spec: str) -> tuple[str, dict[str, float]]:
    """``(name, params)`` for what ``--cost-model`` names.

    In order: a registered cost-model name (no parameters); a coefficient file
    path; the stem of a shipped coefficient file.
    """
    from kvsched.costmodel import REGISTRY

    if spec in REGISTRY:
        return spec, {}
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        cf = load_coefficients(path)
        return cf.name, dict(cf.params)
    found = shipped_cost_model(spec)
    if found is not None:
        return found
    known = ", ".join(sorted(REGISTRY))
    raise InputError(
        f"--cost-model: {spec!r} is not a cost model ({known}), a coefficient file, "
        f"or a shipped coefficient set ({', '.join(shipped()) or 'none'})"
    )
