"""Instance files: JSON (schema-versioned, validated by pydantic) and CSV traces.

JSON layout (``schema_version`` 1)::

    {
      "schema_version": 1,
      "kind": "kvsched.instance",
      "name": "tiny",
      "limits": {"kv_capacity": 64, "block_size": 1, "max_batch_tokens": 32,
                 "max_prefill_tokens": 32, "max_running": null},
      "time_model": {"name": "unit", "params": {}},
      "requests": [{"id": "r0", "arrival": 0.0, "prompt": 8, "output": 4}, ...],
      "meta": {}
    }

Unknown fields are errors. CSV traces use Vidur/Splitwise columns
``arrived_at,num_prefill_tokens,num_decode_tokens`` (extra columns are ignored);
``num_decode_tokens`` is the output length O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel

SCHEMA_VERSION = 1
INSTANCE_KIND = "kvsched.instance"
CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestSchema(_Strict):
    id: str = Field(min_length=1)
    arrival: float = Field(ge=0, allow_inf_nan=False)
    prompt: int = Field(gt=0, description="prompt tokens I")
    output: int = Field(gt=0, description="output tokens O, counting the last (never processed) token")
    predicted_output: int | None = Field(default=None, gt=0)
    cls: str | None = None
    priority: int = 0
    ttft_slo: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    tbt_slo: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class LimitsSchema(_Strict):
    kv_capacity: int = Field(gt=0, description="KV capacity M in tokens")
    block_size: int = Field(default=1, gt=0)
    max_batch_tokens: int | None = Field(default=None, gt=0)
    max_prefill_tokens: int | None = Field(default=None, gt=0)
    max_running: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _blocks_fit(self) -> LimitsSchema:
        if self.block_size > self.kv_capacity:
            raise ValueError(f"block_size {self.block_size} is larger than kv_capacity {self.kv_capacity}")
        return self


class TimeModelSchema(_Strict):
    name: str = "unit"
    params: dict[str, float] = Field(default_factory=dict)


class InstanceSchema(_Strict):
    schema_version: Literal[1]
    kind: Literal["kvsched.instance"] = INSTANCE_KIND
    name: str = ""
    limits: LimitsSchema
    time_model: TimeModelSchema = Field(default_factory=TimeModelSchema)
    requests: list[RequestSchema] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("requests")
    @classmethod
    def _unique_ids(cls, value: list[RequestSchema]) -> list[RequestSchema]:
        seen: set[str] = set()
        for r in value:
            if r.id in seen:
                raise ValueError(f"duplicate request id {r.id!r}")
            seen.add(r.id)
        return value


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line naming the first offending field, e.g. ``f.json: requests.3.prompt: ...``."""
    errors = exc.errors()
    err = errors[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(errors) - 1} more error{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def read_text(path: Path) -> str:
    """The text of ``path``, or one clear :class:`InputError` line when it cannot be read."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _read_json(path: Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None


def instance_from_dict(data: Any, source: str = "instance") -> Instance:
    """Validate a parsed JSON document and build the :class:`Instance`."""
    if isinstance(data, dict) and "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"{source}: schema_version: {data['schema_version']!r} is not supported (this kvsched reads "
            f"{SCHEMA_VERSION})"
        )
    try:
        doc = InstanceSchema.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    requests = tuple(Request(**r.model_dump()) for r in doc.requests)
    instance = Instance(
        requests=requests,
        limits=Limits(**doc.limits.model_dump()),
        time_model=TimeModel(doc.time_model.name, dict(doc.time_model.params)),
        name=doc.name,
        meta=dict(doc.meta),
    )
    _check_time_model(instance, source)
    return instance


def _check_time_model(instance: Instance, source: str) -> None:
    from kvsched.costmodel import make_cost_model

    try:
        make_cost_model(instance.time_model.name, instance.time_model.params)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def instance_to_dict(instance: Instance) -> dict[str, Any]:
    """The JSON document of ``instance`` (optional request fields left out when unset)."""
    reqs = []
    for r in instance.requests:
        d: dict[str, Any] = {"id": r.id, "arrival": r.arrival, "prompt": r.prompt, "output": r.output}
        for key in ("predicted_output", "cls", "ttft_slo", "tbt_slo"):
            value = getattr(r, key)
            if value is not None:
                d[key] = value
        if r.priority:
            d["priority"] = r.priority
        reqs.append(d)
    lim = instance.limits
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": INSTANCE_KIND,
        "name": instance.name,
        "limits": {
            "kv_capacity": lim.kv_capacity,
            "block_size": lim.block_size,
            "max_batch_tokens": lim.max_batch_tokens,
            "max_prefill_tokens": lim.max_prefill_tokens,
            "max_running": lim.max_running,
        },
        "time_model": {"name": instance.time_model.name, "params": dict(instance.time_model.params)},
        "requests": reqs,
        "meta": instance.meta,
    }


def save_instance(instance: Instance, path: str | Path) -> None:
    """Write ``instance`` as a JSON instance file."""
    Path(path).write_text(json.dumps(instance_to_dict(instance), indent=1) + "\n")


def load_instance(
    path: str | Path,
    *,
    limits: Limits | None = None,
    time_model: TimeModel | None = None,
    check_feasible: bool = True,
) -> Instance:
    """Load a JSON instance file or a CSV trace.

    Parameters
    ----------
    path
        ``.json`` instance file, or ``.csv`` trace with Vidur/Splitwise columns.
    limits, time_model
        Required for a CSV trace (which carries no limits); for a JSON file,
        they replace the file's own when given.
    check_feasible
        Reject instances with a request that can never complete (I + O - 1 > M).
    """
    p = Path(path)
    if p.suffix.lower() == ".csv":
        if limits is None:
            raise InputError(
                f"{p}: a CSV trace carries no engine limits; give the KV capacity (--kv-capacity)"
            )
        instance = load_csv_trace(p, limits, time_model or TimeModel())
    else:
        instance = instance_from_dict(_read_json(p), str(p))
        if limits is not None or time_model is not None:
            instance = Instance(
                instance.requests,
                limits or instance.limits,
                time_model or instance.time_model,
                instance.name,
                instance.meta,
            )
    if check_feasible:
        instance.check_feasible()
    return instance


def load_csv_trace(path: str | Path, limits: Limits, time_model: TimeModel, *, name: str = "") -> Instance:
    """Read a Vidur/Splitwise-style CSV trace (``arrived_at`` in seconds).

    A trace without ``arrived_at`` (a lengths-only file) gets every arrival at 0.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a readable CSV file ({str(exc).splitlines()[0]})") from None
    missing = [c for c in CSV_COLUMNS[1:] if c not in df.columns]
    if missing:
        raise InputError(f"{p}: missing column {missing[0]!r} (expected {', '.join(CSV_COLUMNS)})")
    arrivals = df["arrived_at"] if "arrived_at" in df.columns else pd.Series(0.0, index=df.index)
    rows = zip(arrivals, df["num_prefill_tokens"], df["num_decode_tokens"], strict=True)
    requests = []
    for k, (a, i, o) in enumerate(rows):
        line = k + 2  # header is line 1
        for col, value, ok in (
            ("arrived_at", a, _finite(value=a) and float(a) >= 0),
            ("num_prefill_tokens", i, _positive_int(i)),
            ("num_decode_tokens", o, _positive_int(o)),
        ):
            if not ok:
                raise InputError(f"{p}: line {line}: {col}: {value!r} is not a valid value")
        requests.append(Request(id=f"r{k}", arrival=float(a), prompt=int(i), output=int(o)))
    if not requests:
        raise InputError(f"{p}: the trace has no requests")
    return Instance(tuple(requests), limits, time_model, name or p.stem, {"source": str(p)})


def _finite(value: Any) -> bool:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))


def _positive_int(value: Any) -> bool:
    return _finite(value) and float(value) >= 1 and float(value) == int(float(value))


def requests_table(requests: Iterable[Request]) -> pd.DataFrame:
    """Requests as a DataFrame (one row per request)."""
    return pd.DataFrame(
        [
            {
                "id": r.id,
                "arrival": r.arrival,
                "prompt": r.prompt,
                "output": r.output,
                "predicted_output": r.predicted_output,
                "cls": r.cls,
                "priority": r.priority,
            }
            for r in requests
        ]
    )
