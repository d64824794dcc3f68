"""Schedule files: kvsched's JSON format and InferMax's replay format.

kvsched JSON (``schema_version`` 1)::

    {
      "schema_version": 1,
      "kind": "kvsched.schedule",
      "instance": "tiny",
      "meta": {"policy": "sarathi"},
      "batches": [
        {"start": 0.0, "duration": 1.0, "evicted": [],
         "items": [["r0", 4, "prefill"], ["r1", 1, "decode"]]}
      ]
    }

Items are ``[request id, tokens, phase]``; ``evicted`` lists the requests whose
KV is dropped just before the batch.

InferMax replay format (the ``PrecomputedSchedule`` of the InferMax vLLM fork,
as JSON)::

    {"c": [{"0": 4, "1": 4}, ...],   # per batch: request index -> tokens
     "p": [[0, 1], ...],             # per batch: requests in prefill/refill
     "evicted": [[], [1], ...],      # per batch: requests evicted before it
     "requests": [[I, O], ...]}      # per request index

It carries no times: on import, batches run back to back from t = 0 with
durations from the cost model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvsched.costmodel import CostModel
from kvsched.errors import InputError
from kvsched.instances.io import format_validation_error
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Batch, Phase, Schedule
from kvsched.schedule.retime import retime

SCHEMA_VERSION = 1
SCHEDULE_KIND = "kvsched.schedule"

PhaseName = Literal["prefill", "decode", "refill"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchSchema(_Strict):
    start: float = Field(allow_inf_nan=False)
    duration: float = Field(ge=0, allow_inf_nan=False)
    items: list[tuple[str, int, PhaseName]]
    evicted: list[str] = Field(default_factory=list)


class ScheduleSchema(_Strict):
    schema_version: Literal[1]
    kind: Literal["kvsched.schedule"] = SCHEDULE_KIND
    instance: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)
    batches: list[BatchSchema]


_PHASE_CODE = {p.label: int(p) for p in Phase}


def schedule_to_dict(schedule: Schedule, instance: Instance) -> dict[str, Any]:
    """The JSON document of ``schedule`` (requests named by id)."""
    ids = [r.id for r in instance.requests]
    batches = []
    for b in schedule.batches:
        batches.append(
            {
                "start": b.start,
                "duration": b.duration,
                "evicted": [ids[k] for k in b.evicted.tolist()],
                "items": [
                    [ids[r], c, Phase(p).label]
                    for r, c, p in zip(b.requests.tolist(), b.tokens.tolist(), b.phases.tolist(), strict=True)
                ],
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": SCHEDULE_KIND,
        "instance": instance.name,
        "meta": schedule.meta,
        "batches": batches,
    }


def schedule_from_dict(data: Any, instance: Instance, source: str = "schedule") -> Schedule:
    """Validate a parsed schedule document against ``instance`` and build the IR."""
    if isinstance(data, dict) and data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise InputError(f"{source}: schema_version: {data['schema_version']!r} is not supported")
    try:
        doc = ScheduleSchema.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    index = instance.index_of()

    def pos(rid: str, where: str) -> int:
        try:
            return index[rid]
        except KeyError:
            raise InputError(f"{source}: {where}: unknown request {rid!r}") from None

    batches = []
    for k, b in enumerate(doc.batches):
        reqs = [pos(rid, f"batches.{k}.items.{j}") for j, (rid, _, _) in enumerate(b.items)]
        evicted = [pos(rid, f"batches.{k}.evicted.{j}") for j, rid in enumerate(b.evicted)]
        batches.append(
            Batch.of(
                b.start,
                b.duration,
                reqs,
                [c for _, c, _ in b.items],
                [_PHASE_CODE[p] for _, _, p in b.items],
                evicted,
            )
        )
    return Schedule(tuple(batches), dict(doc.meta))


def save_schedule(schedule: Schedule, instance: Instance, path: str | Path) -> None:
    """Write ``schedule`` as a kvsched JSON schedule file."""
    Path(path).write_text(json.dumps(schedule_to_dict(schedule, instance), separators=(",", ":")) + "\n")


def load_schedule(path: str | Path, instance: Instance) -> Schedule:
    """Read a kvsched JSON schedule file (or an InferMax-format JSON, detected by its keys)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if isinstance(data, dict) and "c" in data and "requests" in data and "batches" not in data:
        from kvsched.costmodel import make_cost_model

        cost = make_cost_model(instance.time_model.name, instance.time_model.params)
        return from_infermax(data, instance, cost, source=str(p))
    return schedule_from_dict(data, instance, str(p))


# --------------------------------------------------------------------- InferMax
def to_infermax(schedule: Schedule) -> dict[str, Any]:
    """Export to InferMax's ``{c, p, evicted, requests}`` replay format (without times).

    ``requests`` needs the instance; use :func:`infermax_document` for the full file.
    """
    c, p, evicted = [], [], []
    for b in schedule.batches:
        c.append({str(r): t for r, t in zip(b.requests.tolist(), b.tokens.tolist(), strict=True)})
        p.append(
            [r for r, ph in zip(b.requests.tolist(), b.phases.tolist(), strict=True) if ph != Phase.DECODE]
        )
        evicted.append(b.evicted.tolist())
    return {"c": c, "p": p, "evicted": evicted}


def infermax_document(schedule: Schedule, instance: Instance) -> dict[str, Any]:
    """The full InferMax replay document, ``requests`` included."""
    doc = to_infermax(schedule)
    doc["requests"] = [[r.prompt, r.output] for r in instance.requests]
    return doc


def instance_from_infermax(data: dict[str, Any], limits: Limits, time_model: TimeModel) -> Instance:
    """An offline instance (all arrivals at 0) from an InferMax document's ``requests``."""
    try:
        requests = tuple(
            Request(id=str(k), arrival=0.0, prompt=int(i), output=int(o))
            for k, (i, o) in enumerate(data["requests"])
        )
    except (KeyError, TypeError, ValueError):
        raise InputError("infermax schedule: requests: expected a list of [I, O] pairs") from None
    return Instance(requests, limits, time_model, "infermax-import")


def from_infermax(
    data: Any, instance: Instance, cost_model: CostModel, source: str = "infermax schedule"
) -> Schedule:
    """Import an InferMax replay document: batches back to back, timed by ``cost_model``.

    Phases are derived by the semantic core and the document's ``p`` sets are
    checked against them. Legality is not checked here: validate the result.
    """
    try:
        c_list, p_list, ev_list = data["c"], data.get("p"), data.get("evicted")
        reqs = data["requests"]
    except (KeyError, TypeError, AttributeError):
        raise InputError(f"{source}: expected keys c, p, evicted, requests") from None
    n_batches = len(c_list)
    if len(reqs) != len(instance.requests):
        raise InputError(
            f"{source}: requests: {len(reqs)} requests, but the instance has {len(instance.requests)}"
        )
    for k, ((i, o), r) in enumerate(zip(reqs, instance.requests, strict=True)):
        if (int(i), int(o)) != (r.prompt, r.output):
            raise InputError(
                f"{source}: requests.{k}: [{i}, {o}] differs from the instance's [{r.prompt}, {r.output}]"
            )
    n = len(instance.requests)
    batches, declared = [], []
    for k in range(n_batches):
        items = c_list[k]
        try:
            pairs = list(items.items()) if isinstance(items, dict) else [tuple(x) for x in items]
            req = np.array([int(r) for r, _ in pairs], dtype=np.int64)
            tok = np.array([int(t) for _, t in pairs], dtype=np.int64)
            ev = np.array([int(r) for r in (ev_list[k] if ev_list else [])], dtype=np.int64)
        except (TypeError, ValueError):
            raise InputError(f"{source}: c.{k}: expected request index -> token count") from None
        if req.size and (req.min() < 0 or req.max() >= n):
            raise InputError(f"{source}: c.{k}: request index out of range 0..{n - 1}")
        if ev.size and (ev.min() < 0 or ev.max() >= n):
            raise InputError(f"{source}: evicted.{k}: request index out of range 0..{n - 1}")
        try:
            declared.append({int(r) for r in p_list[k]} if p_list is not None else None)
        except (IndexError, TypeError, ValueError):
            raise InputError(f"{source}: p.{k}: expected a list of request indices") from None
        # Times and phases are placeholders: retime derives both from the state and the cost model.
        batches.append(Batch.of(0.0, 0.0, req, tok, np.full(req.size, Phase.DECODE), ev))
    # Applied unchecked: legality is the validator's verdict, reported in full there.
    schedule = retime(instance, Schedule(tuple(batches), {"source": "infermax"}), cost_model)
    for k, (batch, want) in enumerate(zip(schedule.batches, declared, strict=True)):
        if want is None:
            continue
        derived = {int(r) for r, ph in zip(batch.requests, batch.phases, strict=True) if ph != Phase.DECODE}
        if want != derived:
            raise InputError(
                f"{source}: p.{k}: prefill set {sorted(want)} differs from the derived {sorted(derived)}"
            )
    return schedule
