"""The columnar schedule file (``.npz``): large schedules, runs kept as runs.

A simulated trace of 10,000 requests has hundreds of thousands of batches; as
JSON that is tens of megabytes and seconds to write. This format stores the
same schedule as a handful of flat numpy arrays in one ``.npz`` (no pickles),
with a :class:`~kvsched.schedule.ir.Run` stored once with its durations: its
items are its decodes and, in a mixed run, its prompt chunk as the last item
(the only non-decode item a run may have; files without mixed runs read as
before).
:func:`kvsched.schedule.io.save_schedule` and ``load_schedule`` pick it by the
``.npz`` extension.

Arrays (``E`` entries, batches and runs in order):

=================  ======  ============================================================
name               dtype   meaning
=================  ======  ============================================================
``format``         str     ``"kvsched.schedule.columnar/1"``
``meta``           str     the schedule's ``meta`` as JSON
``ids``            str     request ids of the instance, in position order
``kind``           int8    per entry: 0 batch, 1 run
``start``          f8      per entry: start (of a run's first batch)
``duration``       f8      per entry: a batch's duration (NaN for a run)
``items``          i8      per entry: items per batch
``evicted_count``  i8      per entry: evictions before the batch (0 for a run)
``repeat``         i8      per entry: batches (1 for a batch, k for a run)
``item_request``   i8      per item, entries concatenated: request position
``item_tokens``    i8      per item: tokens (1 for a run's decodes)
``item_phase``     i1      per item: phase code (decode for a run's decodes)
``evicted``        i8      evicted request positions, entries concatenated
``run_durations``  f8      the k durations of each run, runs concatenated
``chunk_last``     i8      per entry: a mixed run's last chunk (``Chunk.last``), else 0;
                           optional (files before it have none)
=================  ======  ============================================================
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Batch, Chunk, Phase, Run, Schedule

FORMAT = "kvsched.schedule.columnar/1"
_INT = np.int64


def schedule_columns(schedule: Schedule, instance: Instance) -> dict[str, np.ndarray]:
    """The arrays of the columnar file (see the module docstring)."""
    entries = schedule.entries
    e = len(entries)
    kind = np.zeros(e, dtype=np.int8)
    start = np.empty(e, dtype=np.float64)
    duration = np.full(e, np.nan)
    items = np.empty(e, dtype=_INT)
    ev_count = np.zeros(e, dtype=_INT)
    repeat = np.ones(e, dtype=_INT)
    chunk_last = np.zeros(e, dtype=_INT)
    req_parts: list[np.ndarray] = []
    tok_parts: list[np.ndarray] = []
    phase_parts: list[np.ndarray] = []
    ev_parts: list[np.ndarray] = []
    dur_parts: list[np.ndarray] = []
    for k, entry in enumerate(entries):
        start[k] = entry.start
        if type(entry) is Run:
            kind[k] = 1
            repeat[k] = entry.repeat
            if entry.chunk is None:
                items[k] = entry.requests.size
                req_parts.append(entry.requests)
                tok_parts.append(np.ones(entry.requests.size, dtype=_INT))
                phase_parts.append(np.full(entry.requests.size, Phase.DECODE, dtype=np.int8))
            else:  # the decodes, then the chunk as the last item
                run_req, run_tok, run_phase = entry.items()
                chunk_last[k] = entry.chunk.last
                items[k] = run_req.size
                req_parts.append(run_req)
                tok_parts.append(run_tok)
                phase_parts.append(run_phase)
            dur_parts.append(entry.durations)
        else:
            items[k] = entry.requests.size
            req_parts.append(entry.requests)
            duration[k] = entry.duration
            ev_count[k] = entry.evicted.size
            tok_parts.append(entry.tokens)
            phase_parts.append(entry.phases)
            ev_parts.append(entry.evicted)

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    return {
        "format": np.array(FORMAT),
        "meta": np.array(json.dumps(schedule.meta, default=str)),
        "ids": np.array([r.id for r in instance.requests], dtype=str),
        "kind": kind,
        "start": start,
        "duration": duration,
        "items": items,
        "evicted_count": ev_count,
        "repeat": repeat,
        "item_request": cat(req_parts, _INT),
        "item_tokens": cat(tok_parts, _INT),
        "item_phase": cat(phase_parts, np.int8),
        "evicted": cat(ev_parts, _INT),
        "run_durations": cat(dur_parts, np.float64),
        "chunk_last": chunk_last,
    }


def save_columnar(schedule: Schedule, instance: Instance, path: str | Path) -> None:
    """Write ``schedule`` as a compressed columnar ``.npz`` file."""
    with Path(path).open("wb") as fh:
        np.savez_compressed(fh, **schedule_columns(schedule, instance))


def _read(path: Path) -> dict[str, np.ndarray]:
    if path.is_file() and not zipfile.is_zipfile(path):
        # np.load would take it for a pickle and suggest allow_pickle=True: never for a schedule.
        raise InputError(f"{path}: not a readable .npz schedule (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npz schedule ({exc})") from None


def load_columnar(path: str | Path, instance: Instance) -> Schedule:
    """Read a columnar ``.npz`` schedule written for ``instance`` (one clear error if it is not one)."""
    p = Path(path)
    cols = _read(p)
    return schedule_from_columns(cols, instance, str(p))


def schedule_from_columns(cols: dict[str, Any], instance: Instance, source: str = "schedule") -> Schedule:
    """Build the IR from the columnar arrays, checking their shapes and references (not legality)."""

    def get(name: str, kind: str) -> np.ndarray:
        if name not in cols:
            raise InputError(f"{source}: missing array {name!r} (not a {FORMAT} file)")
        arr = np.asarray(cols[name])
        if arr.dtype.kind not in kind:
            raise InputError(f"{source}: {name}: unexpected dtype {arr.dtype}")
        return arr

    if str(get("format", "U")) != FORMAT:
        raise InputError(f"{source}: format: expected {FORMAT!r}, got {str(cols['format'])!r}")
    try:
        meta = json.loads(str(get("meta", "U")))
    except json.JSONDecodeError:
        raise InputError(f"{source}: meta: not valid JSON") from None
    ids = get("ids", "U").tolist()
    if ids != [r.id for r in instance.requests]:
        raise InputError(f"{source}: ids: the schedule was written for other requests than the instance's")
    kind, start, duration = get("kind", "i"), get("start", "f"), get("duration", "f")
    items, ev_count, repeat = get("items", "i"), get("evicted_count", "i"), get("repeat", "i")
    req, tok, phase = get("item_request", "i"), get("item_tokens", "i"), get("item_phase", "i")
    evicted, run_durations = get("evicted", "i"), get("run_durations", "f")
    e = kind.size
    chunk_last = get("chunk_last", "i") if "chunk_last" in cols else np.zeros(e, dtype=_INT)
    if chunk_last.ndim != 1 or chunk_last.size != e:
        raise InputError(f"{source}: chunk_last does not match the per-entry arrays")
    if not all(a.ndim == 1 and a.size == e for a in (start, duration, items, ev_count, repeat)):
        raise InputError(f"{source}: the per-entry arrays differ in length")
    is_run = kind == 1
    for name, values, bad, rule in (
        ("kind", kind, (kind != 0) & ~is_run, "0 (a batch) or 1 (a run)"),
        ("items", items, items < 0, "0 or more"),
        ("evicted_count", ev_count, ev_count < 0, "0 or more"),
        ("repeat", repeat, repeat < 1, "1 or more"),
    ):
        if bad.any():  # the array and the entry named (one message once named four arrays and no entry)
            k = int(np.argmax(bad))
            raise InputError(f"{source}: {name}[{k}] (entry {k}) is {int(values[k])}; it must be {rule}")
    if np.any(is_run & ((repeat < 1) | (ev_count != 0))) or np.any(~is_run & (repeat != 1)):
        raise InputError(f"{source}: a run has no evictions and a batch repeats once")
    if not (req.size == tok.size == phase.size == int(items.sum())):
        raise InputError(f"{source}: item arrays do not match the per-entry item counts")
    if evicted.size != int(ev_count.sum()) or run_durations.size != int(repeat[is_run].sum()):
        raise InputError(f"{source}: evicted or run_durations do not match the per-entry counts")
    n = len(instance.requests)
    if (req.size and (req.min() < 0 or req.max() >= n)) or (
        evicted.size and (evicted.min() < 0 or evicted.max() >= n)
    ):
        raise InputError(f"{source}: request position out of range 0..{n - 1}")
    if phase.size and (phase.min() < 0 or phase.max() > max(Phase)):
        raise InputError(f"{source}: item_phase: unknown phase code")
    if (
        not np.isfinite(start).all()
        or not np.isfinite(duration[~is_run]).all()
        or np.any(duration[~is_run] < 0)
    ):
        raise InputError(f"{source}: start or duration not a finite time")
    item_end = np.cumsum(items)
    chunked = np.zeros(e, dtype=bool)  # runs whose last item is a prompt chunk (mixed runs)
    if np.any(is_run):
        last = item_end - 1
        chunked = is_run & (items > 0)
        chunked[chunked] = phase[last[chunked]] != Phase.DECODE
        if np.any(tok[last[chunked]] < 1):
            raise InputError(f"{source}: a run's chunk must have at least one token")
        run_items = np.repeat(is_run, items)
        run_items[last[chunked]] = False
        if np.any(chunk_last[~chunked] != 0):
            raise InputError(f"{source}: chunk_last is set on an entry without a chunk")
        if np.any(tok[run_items] != 1) or np.any(phase[run_items] != Phase.DECODE):
            raise InputError(f"{source}: a run's items must be one-token decodes and at most one last chunk")
    for arr in (req, tok, evicted, run_durations):
        arr.flags.writeable = False
    phase = phase.astype(np.int8)
    phase.flags.writeable = False
    item_end = item_end.tolist()
    ev_end = np.cumsum(ev_count).tolist()
    dur_end = np.cumsum(np.where(is_run, repeat, 0)).tolist()
    out: list[Batch | Run] = []
    i0 = e0 = d0 = 0
    for k in range(e):
        i1, e1, d1 = item_end[k], ev_end[k], dur_end[k]
        if chunked[k]:
            chunk = Chunk(int(req[i1 - 1]), int(tok[i1 - 1]), int(phase[i1 - 1]), int(chunk_last[k]))
            try:
                out.append(Run.of(float(start[k]), run_durations[d0:d1], req[i0 : i1 - 1], chunk))
            except ValueError as exc:
                raise InputError(f"{source}: entry {k}: {exc}") from None
        elif is_run[k]:
            out.append(Run.of(float(start[k]), run_durations[d0:d1], req[i0:i1]))
        else:
            out.append(
                Batch(
                    float(start[k]), float(duration[k]), req[i0:i1], tok[i0:i1], phase[i0:i1], evicted[e0:e1]
                )
            )
        i0, e0, d0 = i1, e1, d1
    return Schedule(tuple(out), meta if isinstance(meta, dict) else {})
