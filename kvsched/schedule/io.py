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
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvsched.costmodel import CostModel
from kvsched.errors import InputError, expect_path
from kvsched.instances.io import (
    MAX_TIME,
    MAX_TOKENS,
    check_instance_fingerprint,
    check_not_input,
    instance_fingerprint,
    read_json,
    validated,
    write_output,
)
from kvsched.instances.model import Instance, Limits, Request, TimeModel, expect_instance
from kvsched.schedule.ir import Batch, Phase, Schedule, bind_instance, expect_schedule, expect_schedule_of
from kvsched.schedule.retime import retime

SCHEMA_VERSION = 1
SCHEDULE_KIND = "kvsched.schedule"

PhaseName = Literal["prefill", "decode", "refill"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Times in a schedule file stay within this (1000 x the largest arrival), so clocks stay finite.
MAX_SCHEDULE_TIME = 1000 * MAX_TIME
#: A token count the validator can judge (it reports < 1 itself); beyond it, no int64 arithmetic is safe.
ItemTokens = Annotated[int, Field(strict=True, ge=-MAX_TOKENS, le=MAX_TOKENS)]
#: The key of a written schedule's ``meta`` naming its instance (:func:`instance_fingerprint`).
FINGERPRINT_KEY = "instance_fingerprint"


class BatchSchema(_Strict):
    # Strict: a number, not text or true/false ("duration": "1" was read as 1.0); ints are numbers.
    start: float = Field(strict=True, ge=-MAX_SCHEDULE_TIME, le=MAX_SCHEDULE_TIME, allow_inf_nan=False)
    duration: float = Field(strict=True, ge=0, le=MAX_SCHEDULE_TIME, allow_inf_nan=False)
    items: list[tuple[str, ItemTokens, PhaseName]]
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
    labels = [Phase(code).label for code in range(len(Phase))]  # an enum lookup per item costs more
    batches = []
    for b in schedule:  # runs spelled out one batch at a time, nothing kept
        batches.append(
            {
                "start": b.start,
                "duration": b.duration,
                "evicted": [ids[k] for k in b.evicted.tolist()],
                "items": [
                    [ids[r], c, labels[p]]
                    for r, c, p in zip(b.requests.tolist(), b.tokens.tolist(), b.phases.tolist(), strict=True)
                ],
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": SCHEDULE_KIND,
        "instance": instance.name,
        "meta": {**schedule.meta, FINGERPRINT_KEY: instance_fingerprint(instance)},
        "batches": batches,
    }


def schedule_from_dict(data: Any, instance: Instance, source: str = "schedule") -> Schedule:
    """Validate a parsed schedule document against ``instance`` and build the IR."""
    if isinstance(data, dict) and data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise InputError(f"{source}: schema_version: {data['schema_version']!r} is not supported")
    doc = validated(ScheduleSchema, data, source)
    check_fingerprint(doc.meta, instance, source)
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
    # The fingerprint describes the file, not the schedule: a re-save recomputes it for its instance.
    return Schedule(tuple(batches), {k: v for k, v in doc.meta.items() if k != FINGERPRINT_KEY})


def check_fingerprint(meta: Any, instance: Instance, source: str) -> None:
    """One clear error when a schedule's recorded instance fingerprint is not ``instance``'s.

    Files written before fingerprints existed (no key) are accepted.
    """
    recorded = meta.get(FINGERPRINT_KEY) if isinstance(meta, dict) else None
    check_instance_fingerprint(recorded, instance, f"{source}: this schedule was written")


def save_schedule(schedule: Schedule, instance: Instance, path: str | Path) -> None:
    """Write ``schedule`` as a kvsched JSON schedule file (its meta names the instance's fingerprint).

    A ``.npz`` path gets the columnar format instead (:mod:`kvsched.schedule.columnar`),
    which keeps coalesced runs; JSON spells every batch out. A missing folder is created, and a
    path that cannot be written is one :class:`InputError` (:func:`~kvsched.instances.io.write_output`).
    """
    expect_schedule(schedule)  # first: swapped arguments name the schedule
    if isinstance(instance, str | os.PathLike) and isinstance(path, Instance):
        raise InputError(
            "instance: expected an Instance, got a path (the instance comes before the path: "
            "save_schedule(schedule, instance, path))"
        )
    expect_instance(instance)
    # Another instance's schedule (read for it) once went out stamped with this instance's fingerprint.
    expect_schedule_of(schedule, instance)
    p = check_not_input(path, "save_schedule")
    if p.suffix.lower() == ".npz":
        from kvsched.schedule.columnar import save_columnar

        # save_columnar builds its columns in memory (no OSError) and then writes them.
        write_output(p, "save_schedule", lambda q: save_columnar(schedule, instance, q))
        return
    text = json.dumps(schedule_to_dict(schedule, instance), separators=(",", ":")) + "\n"
    write_output(p, "save_schedule", lambda q: q.write_text(text, encoding="utf-8"))


def load_schedule(path: str | Path, instance: Instance) -> Schedule:
    """Read a kvsched JSON schedule file (or an InferMax-format JSON, detected by its keys, or a columnar ``.npz``)."""
    if isinstance(path, Instance) and isinstance(instance, str | os.PathLike):
        raise InputError(
            "path: expected a file path, got Instance (the path comes first: load_schedule(path, instance))"
        )
    p = Path(expect_path(path))
    expect_instance(instance)
    # The schedule remembers the instance it was read for (bind_instance): the writers refuse another's.
    return bind_instance(_load(p, instance), instance_fingerprint(instance))


def _load(p: Path, instance: Instance) -> Schedule:
    """:func:`load_schedule`'s reading, by format."""
    if p.suffix.lower() == ".npz":
        from kvsched.schedule.columnar import load_columnar

        return load_columnar(p, instance)
    data = read_json(p)
    if isinstance(data, dict) and not {"batches", "c", "schema_version", "kind"} & data.keys():
        # Else read as a kvsched schedule: "schema_version: required field is missing" for an InferMax
        # file with "C" for "c" said nothing of what the file should have been.
        keys = ", ".join(map(repr, sorted(data)[:8]))
        raise InputError(
            f"{p}: neither a kvsched schedule (no 'batches') nor an InferMax one (no 'c' and 'requests'); "
            f"its keys: {keys or 'none'}"
        )
    if isinstance(data, dict) and "c" in data and "requests" in data and "batches" not in data:
        from kvsched.costmodel import make_cost_model

        cost = make_cost_model(instance.time_model.name, instance.time_model.params)
        return from_infermax(data, instance, cost, source=str(p))
    return schedule_from_dict(data, instance, str(p))


# --------------------------------------------------------------------- InferMax
Index = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKENS)]
IndexKey = Annotated[str, Field(pattern=r"^[0-9]{1,10}$")]


class InfermaxSchema(BaseModel):
    """InferMax's replay document; other keys are ignored (the fork writes its own)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    c: list[dict[IndexKey, ItemTokens] | list[tuple[Index, ItemTokens]]]
    p: list[list[Index]] | None = None
    evicted: list[list[Index]] | None = None
    # Positivity is checked in _pairs, after the count: a bound here fired first on [I, O, 0]
    # ("requests.0.2: Input should be greater than 0"), naming a third number as if it belonged.
    requests: list[tuple[Annotated[int, Field(strict=True, le=MAX_TOKENS)], ...]]

    @field_validator("requests")
    @classmethod
    def _pairs(cls, value: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        for k, pair in enumerate(value):
            if len(pair) != 2:
                raise ValueError(f"request {k}: expected [I, O], got {len(pair)} numbers")
            if min(pair) <= 0:
                raise ValueError(f"request {k}: I and O must be > 0, got {list(pair)}")
        return value


def to_infermax(schedule: Schedule) -> dict[str, Any]:
    """Export to InferMax's ``{c, p, evicted, requests}`` replay format (without times).

    ``requests`` needs the instance; use :func:`infermax_document` for the full file.
    """
    c, p, evicted = [], [], []
    for b in schedule:  # runs spelled out (the InferMax format has no runs)
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
        pairs = InfermaxSchema.model_validate({"c": [], **data}).requests
    except (ValidationError, TypeError):
        raise InputError("infermax schedule: requests: expected a list of [I, O] pairs") from None
    requests = tuple(Request(id=str(k), arrival=0.0, prompt=i, output=o) for k, (i, o) in enumerate(pairs))
    return Instance(requests, limits, time_model, "infermax-import")


def from_infermax(
    data: Any, instance: Instance, cost_model: CostModel, source: str = "infermax schedule"
) -> Schedule:
    """Import an InferMax replay document: batches back to back, timed by ``cost_model``.

    Phases are derived by the semantic core and the document's ``p`` sets are
    checked against them. Legality is not checked here: validate the result.
    """
    doc = validated(InfermaxSchema, data, source)
    n_batches = len(doc.c)
    for key, lst in (("p", doc.p), ("evicted", doc.evicted)):
        if lst is not None and len(lst) != n_batches:
            raise InputError(f"{source}: {key}: {len(lst)} entries for {n_batches} batches (c)")
    if len(doc.requests) != len(instance.requests):
        raise InputError(
            f"{source}: requests: {len(doc.requests)} requests, but the instance has {len(instance.requests)}"
        )
    for k, ((i, o), r) in enumerate(zip(doc.requests, instance.requests, strict=True)):
        if (i, o) != (r.prompt, r.output):
            raise InputError(
                f"{source}: requests.{k}: [{i}, {o}] differs from the instance's [{r.prompt}, {r.output}]"
            )
    n = len(instance.requests)
    batches, declared = [], []
    for k in range(n_batches):
        items = doc.c[k]
        pairs = [(int(r), t) for r, t in items.items()] if isinstance(items, dict) else list(items)
        req = np.array([r for r, _ in pairs], dtype=np.int64)
        tok = np.array([t for _, t in pairs], dtype=np.int64)
        ev = np.array(doc.evicted[k] if doc.evicted is not None else [], dtype=np.int64)
        if req.size and req.max() >= n:
            raise InputError(f"{source}: c.{k}: request index out of range 0..{n - 1}")
        if ev.size and ev.max() >= n:
            raise InputError(f"{source}: evicted.{k}: request index out of range 0..{n - 1}")
        declared.append(set(doc.p[k]) if doc.p is not None else None)
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
