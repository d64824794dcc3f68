"""A schedule as a Chrome/Perfetto trace: open the JSON in ui.perfetto.dev (or chrome://tracing).

The document follows the Trace Event Format's JSON object form
(``{"traceEvents": [...], "displayTimeUnit": ..., "otherData": {...}}``):

* process 1, **engine**: a ``batches`` track with one slice per batch (a
  coalesced decode run is one slice, its batch count in the arguments) and a
  ``KV tokens`` counter: the KV held during each batch and after it (once
  completed requests release theirs), read off the semantic core as it applies
  the schedule, with the capacity M beside it;
* process 2, **requests**: one track (thread) per request, named by its id,
  with its ``prefill`` and ``refill`` chunks (one slice per chunk), its
  ``decode`` stretches (consecutive decode batches joined), ``evicted`` spans
  (KV dropped, from the eviction to the refill, with an instant ``eviction``
  marker) and ``waiting`` spans (arrived but in no batch: ``queued`` before its
  first batch, ``paused`` while holding KV between batches).

Timestamps are microseconds. An instance timed in seconds maps 1 s to
1,000,000 us; one timed in slots (the unit model) maps one slot to 1,000 us, so
that the viewer's "ms" reads as slots (``otherData`` says so).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.io import check_not_input, write_output
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.core import TIME_TOL, EngineState
from kvsched.schedule.ir import Phase, Run, Schedule, expect_schedule, expect_schedule_of
from kvsched.schedule.serving import time_unit

ENGINE_PID = 1
REQUESTS_PID = 2
#: Microseconds per time unit in the trace, by unit label.
US_PER_UNIT = {"s": 1e6, "slot": 1e3}
_PHASE_NAMES = {int(p): p.label for p in Phase}
_DECODE = int(Phase.DECODE)


def _meta(pid: int, tid: int | None, kind: str, name: str, sort: int | None = None) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"ph": "M", "pid": pid}
    if tid is not None:
        base["tid"] = tid
    out = [{**base, "name": kind, "args": {"name": name}}]
    if sort is not None:
        key = "thread_sort_index" if tid is not None else "process_sort_index"
        out.append({**base, "name": key, "args": {"sort_index": sort}})
    return out


def _item_rows(schedule: Schedule) -> tuple[np.ndarray, ...]:
    """Columns (request, phase, tokens, start, end) of every item; a run's items are one row each."""
    req, phase, tok, start, end = [], [], [], [], []
    for e in schedule.entries:
        n = e.requests.size
        if not n and (type(e) is not Run or e.chunk is None):
            continue
        req.append(e.requests)
        start.append(np.full(n, e.start))
        end.append(np.full(n, e.end))
        if type(e) is Run:
            phase.append(np.full(n, _DECODE, dtype=np.int64))
            tok.append(np.full(n, e.repeat, dtype=np.int64))
            if e.chunk is not None:  # the chunk's request: one row of its k chunks
                req.append(np.array([e.chunk.request], dtype=np.int64))
                start.append(np.full(1, e.start))
                end.append(np.full(1, e.end))
                phase.append(np.full(1, e.chunk.phase, dtype=np.int64))
                last = e.chunk.last or e.chunk.tokens
                tok.append(np.full(1, e.chunk.tokens * (e.repeat - 1) + last, dtype=np.int64))
        else:
            phase.append(e.phases.astype(np.int64))
            tok.append(e.tokens)
    if not req:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0), np.zeros(0)
    cols = (np.concatenate(req), np.concatenate(phase), np.concatenate(tok))
    return (*cols, np.concatenate(start), np.concatenate(end))


def _segments(schedule: Schedule) -> tuple[np.ndarray, ...]:
    """Items sorted by request and time, consecutive touching decodes of one request joined."""
    req, phase, tok, start, end = _item_rows(schedule)
    order = np.lexsort((start, req))
    req, phase, tok, start, end = req[order], phase[order], tok[order], start[order], end[order]
    if req.size:
        joins = (
            (req[1:] == req[:-1])
            & (phase[1:] == _DECODE)
            & (phase[:-1] == _DECODE)
            & (np.abs(start[1:] - end[:-1]) <= TIME_TOL)
        )
        heads = np.flatnonzero(np.concatenate(([True], ~joins)))
        tails = np.concatenate((heads[1:], [req.size])) - 1
        tok = np.add.reduceat(tok, heads)
        req, phase, start, end = req[heads], phase[heads], start[heads], end[tails]
    return req, phase, tok, start, end


def _request_events(instance: Instance, schedule: Schedule, us: float) -> list[dict[str, Any]]:
    req, phase, tok, start, end = _segments(schedule)
    evictions: dict[int, list[float]] = {}
    for b in schedule.entries:
        if type(b) is not Run:
            for r in b.evicted.tolist():
                evictions.setdefault(int(r), []).append(b.start)
    arrival = [r.arrival for r in instance.requests]
    events: list[dict[str, Any]] = []

    def span(r: int, name: str, t0: float, t1: float, args: dict[str, Any]) -> None:
        if t1 - t0 > TIME_TOL:
            events.append(
                {
                    "name": name,
                    "cat": name,
                    "ph": "X",
                    "pid": REQUESTS_PID,
                    "tid": r + 1,
                    "ts": t0 * us,
                    "dur": (t1 - t0) * us,
                    "args": args,
                }
            )

    bounds = np.searchsorted(req, np.arange(len(instance) + 1))
    for r in range(len(instance)):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        evicted = sorted(evictions.get(r, ()))
        prev_end = arrival[r]
        for k in range(lo, hi):
            s = float(start[k])
            # Evictions since the previous segment: waiting until the first, evicted from it on.
            ev_here = [t for t in evicted if prev_end - TIME_TOL <= t <= s + TIME_TOL]
            wait_end = ev_here[0] if ev_here else s
            reason = "queued" if k == lo else "paused"
            span(r, "waiting", prev_end, wait_end, {"reason": reason})
            for t in ev_here:
                events.append(
                    {
                        "name": "eviction",
                        "cat": "evicted",
                        "ph": "i",
                        "s": "t",
                        "pid": REQUESTS_PID,
                        "tid": r + 1,
                        "ts": t * us,
                    }
                )
            if ev_here:
                span(r, "evicted", ev_here[0], s, {"evictions": len(ev_here)})
            name = _PHASE_NAMES[int(phase[k])]
            span(r, name, s, float(end[k]), {"tokens": int(tok[k])})
            prev_end = float(end[k])
    return events


def _engine_events(instance: Instance, schedule: Schedule, us: float) -> list[dict[str, Any]]:
    """Batch slices and the KV counter, the KV read off the core as it applies the schedule."""
    state = EngineState(instance, None)
    capacity = instance.limits.kv_capacity
    events: list[dict[str, Any]] = []

    def kv(t: float, held: int) -> None:
        events.append(
            {
                "name": "KV tokens",
                "ph": "C",
                "pid": ENGINE_PID,
                "ts": t * us,
                "args": {"held": held, "capacity": capacity},
            }
        )

    kv(0.0, 0)
    for k, e in enumerate(schedule.entries):
        if type(e) is Run:
            rec = state.apply_run(e)
            n, per_batch = e.size, e.num_tokens
            tokens = per_batch * e.repeat
            for j, s in enumerate(e.starts().tolist()):
                if rec.tail is not None and j == e.repeat - 1:  # the prompt's last chunk
                    kv(s, rec.tail.kv_tokens)
                    tokens += rec.tail.num_tokens - per_batch
                else:
                    kv(s, rec.kv_tokens + (j + 1) * per_batch)
            name = f"decode x{e.repeat}" if e.chunk is None else f"decode + chunk x{e.repeat}"
            args: dict[str, Any] = {"batches": e.repeat, "requests": n, "tokens": tokens}
        else:
            rec = state.apply(e)
            kv(e.start, rec.kv_tokens)
            name = "batch"
            args = {
                "items": rec.num_items,
                "tokens": rec.num_tokens,
                "prefill_tokens": rec.prefill_tokens,
                "decodes": rec.num_decodes,
                "evicted": rec.num_evicted,
                "kv_tokens": rec.kv_tokens,
            }
        kv(e.end, state.kv_tokens)
        events.append(
            {
                "name": name,
                "cat": "batch",
                "ph": "X",
                "pid": ENGINE_PID,
                "tid": 1,
                "ts": e.start * us,
                "dur": (e.end - e.start) * us,
                "args": {"entry": k, **args},
            }
        )
    return events


def chrome_trace(
    instance: Instance, schedule: Schedule, *, name: str = "", unit: str | None = None
) -> dict[str, Any]:
    """The Chrome/Perfetto trace document of ``schedule`` on ``instance`` (see the module docstring).

    ``schedule`` should be legal (validated): the KV counter is what the core
    holds as it applies the batches unchecked. ``unit`` (``"s"`` or ``"slot"``)
    overrides the instance's time unit, e.g. for a schedule retimed with
    measured seconds.
    """
    expect_instance(instance)
    expect_schedule_of(schedule, instance)  # (another instance's schedule read for it: refused)
    unit = unit or time_unit(instance)
    if unit not in US_PER_UNIT:
        raise InputError(f"unit must be one of {', '.join(US_PER_UNIT)}, not {unit!r}")
    us = US_PER_UNIT[unit]
    title = name or instance.name or "schedule"
    events: list[dict[str, Any]] = [
        *_meta(ENGINE_PID, None, "process_name", f"engine: {title}", 0),
        *_meta(ENGINE_PID, 1, "thread_name", "batches", 0),
        *_meta(REQUESTS_PID, None, "process_name", "requests", 1),
    ]
    for k, r in enumerate(instance.requests):
        events.extend(_meta(REQUESTS_PID, k + 1, "thread_name", str(r.id), k))
    events.extend(_engine_events(instance, schedule, us))
    events.extend(_request_events(instance, schedule, us))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "kvsched",
            "instance": instance.name,
            "schedule": json.loads(json.dumps(schedule.meta, default=str)),
            "time_unit": unit,
            "trace_us_per_time_unit": us,
            "kv_capacity": instance.limits.kv_capacity,
        },
    }


def write_chrome_trace(
    instance: Instance, schedule: Schedule, path: str | Path, *, name: str = "", unit: str | None = None
) -> Path:
    """Write :func:`chrome_trace` to ``path`` (compact JSON); returns the path.

    A missing folder is created, and a path that cannot be written is one :class:`InputError`
    (:func:`~kvsched.instances.io.write_output`).
    """
    # The arguments in their order: a wrong instance or schedule is named before the path.
    expect_instance(instance)
    expect_schedule(schedule)
    p = check_not_input(path, "write_chrome_trace")
    text = json.dumps(chrome_trace(instance, schedule, name=name, unit=unit), separators=(",", ":")) + "\n"
    return write_output(p, "write_chrome_trace", lambda q: q.write_text(text, encoding="utf-8"))


__all__ = ["ENGINE_PID", "REQUESTS_PID", "US_PER_UNIT", "chrome_trace", "write_chrome_trace"]
