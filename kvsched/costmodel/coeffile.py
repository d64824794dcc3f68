"""Coefficient files: a fitted cost model as JSON, and how ``--cost-model`` finds one.

A coefficient file is::

    {"schema_version": 1, "kind": "kvsched.cost-coefficients",
     "name": "calibrated", "params": {"a0": 0.009, ...}, "meta": {...}}

``name`` and ``params`` are exactly an instance's ``time_model``, so an
instance built from a file carries the coefficients itself and never refers
back to the file. ``meta`` records the model, GPU, where each term comes
from, and the fidelity figures. The files shipped with kvsched live in
``kvsched/costmodel/coefficients/`` and can be named by their stem
(``--cost-model llama-2-7b_a100-80gb_tp1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsched.errors import InputError

KIND = "kvsched.cost-coefficients"
COEFFICIENT_DIR = Path(__file__).parent / "coefficients"


@dataclass(frozen=True, slots=True)
class CoefficientFile:
    """A coefficient file's contents."""

    name: str
    params: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)


def parse_coefficients(doc: Any, source: str) -> CoefficientFile:
    """Validate a coefficient document (already parsed JSON) and build its model once to check it."""
    from kvsched.costmodel import make_cost_model

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
    out = CoefficientFile(name, {k: float(v) for k, v in params.items()}, meta)
    try:
        make_cost_model(out.name, out.params)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    return out


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
    return parse_coefficients(doc, str(p))


def dump_coefficients(doc: dict[str, Any]) -> str:
    """A coefficient document as the text files hold (stable key order, one trailing newline)."""
    import json

    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def shipped() -> dict[str, Path]:
    """The coefficient files shipped with kvsched, by stem."""
    return {p.stem: p for p in sorted(COEFFICIENT_DIR.glob("*.json"))}


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
    files = shipped()
    if spec in files:
        cf = load_coefficients(files[spec])
        return cf.name, dict(cf.params)
    known = ", ".join(sorted(REGISTRY))
    raise InputError(
        f"--cost-model: {spec!r} is not a cost model ({known}), a coefficient file, "
        f"or a shipped coefficient set ({', '.join(files) or 'none'})"
    )
