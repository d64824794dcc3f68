"""The schedule IR: an ordered list of batches and runs.

A :class:`Batch` is columnar: parallel integer arrays of request positions,
token counts and phase codes, so that schedules of millions of items stay cheap.
:meth:`Batch.items` gives the readable view. Files refer to requests by id;
in memory they are positions in :attr:`Instance.requests`.

A :class:`Run` is ``k`` back-to-back batches of the same items, no evictions:
one-token decodes of the same requests and, in a *mixed* run, one
:class:`Chunk` of ``c`` prompt (or refill) tokens of the same request in every
batch, never its last (Sarathi's steady state while a long prompt is chunked).
These stretches between events make up most of a trace; a run is stored once
with its ``k`` durations. :attr:`Schedule.entries`
holds batches and runs; :attr:`Schedule.batches` expands the runs (exactly the
batches they stand for) for code that wants one batch at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from kvsched.errors import InputError


class Phase(IntEnum):
    """What an item does to its request.

    PREFILL processes prompt tokens of a request that has generated nothing yet;
    DECODE processes the last generated token (exactly one token); REFILL
    re-processes prompt and generated tokens after an eviction (recompute).
    """

    PREFILL = 0
    DECODE = 1
    REFILL = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Phase:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown phase {text!r} (expected prefill, decode or refill)") from None


def _frozen(values: Sequence[int] | np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """A read-only 1-D copy of ``values`` as ``dtype``; fractional values are refused."""
    raw = np.asarray(values)
    if raw.dtype.kind == "f" and not np.array_equal(raw, np.round(raw)):
        raise ValueError("request positions, token counts and phase codes must be integers")
    arr = np.array(raw, dtype=dtype).reshape(-1)
    arr.setflags(False)
    return arr


_ndarray = np.ndarray
_I64, _I8 = np.dtype(np.int64), np.dtype(np.int8)  # the usual columns' dtypes, tested by identity first


_EMPTY = _frozen([])  # shared: a read-only empty array cannot be changed through any batch


@dataclass(frozen=True, slots=True)
class Item:
    """One request's share of a batch (readable view of a batch row)."""

    request: int
    tokens: int
    phase: Phase


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """One engine iteration.

    Parameters
    ----------
    start
        Start time.
    duration
        Duration; the validator checks it against the instance's cost model.
    requests
        Positions of the requests processed in this batch.
    tokens
        Tokens processed for each of them.
    phases
        :class:`Phase` code of each item.
    evicted
        Positions of the requests evicted (KV dropped, recompute later) just
        before this batch runs.
    """

    start: float
    duration: float
    requests: np.ndarray
    tokens: np.ndarray
    phases: np.ndarray
    evicted: np.ndarray = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        # A user's Batch(...) (lists, float counts, a str start, mismatched lengths) is checked here,
        # once, not met as an AttributeError or IndexError inside the core; the core's own batches come
        # through _trusted (no __init__, so no check) and Batch.of's are converted already: the fast test.
        r, t, p, e = self.requests, self.tokens, self.phases, self.evicted
        if not (
            type(self.start) is float
            and type(self.duration) is float
            and type(r) is _ndarray
            and type(t) is _ndarray
            and type(p) is _ndarray
            and type(e) is _ndarray
            and r.ndim == 1
            and r.shape == t.shape == p.shape
            and e.ndim == 1
            and (r.dtype is _I64 or r.dtype is _I8 or r.dtype.kind in "iu")
            and (t.dtype is _I64 or t.dtype is _I8 or t.dtype.kind in "iu")
            and (p.dtype is _I64 or p.dtype is _I8 or p.dtype.kind in "iu")
            and (e.dtype is _I64 or e.dtype is _I8 or e.dtype.kind in "iu")
        ):
            _check_batch(self)

    @classmethod
    def of(
        cls,
        start: float,
        duration: float,
        requests: Sequence[int] | np.ndarray,
        tokens: Sequence[int] | np.ndarray,
        phases: Sequence[int] | np.ndarray,
        evicted: Sequence[int] | np.ndarray = (),
    ) -> Batch:
        """Build a batch from any integer sequences (copied into read-only arrays)."""
        req = _frozen(requests)
        tok = _frozen(tokens)
        ph = _frozen(phases, np.int8)
        if not (len(req) == len(tok) == len(ph)):
            raise ValueError("requests, tokens and phases must have the same length")
        ev = _EMPTY if isinstance(evicted, tuple | list) and not evicted else _frozen(evicted)
        return cls(float(start), float(duration), req, tok, ph, ev)

    @classmethod
    def _trusted(
        cls,
        start: float,
        duration: float,
        requests: np.ndarray,
        tokens: np.ndarray,
        phases: np.ndarray,
        evicted: np.ndarray,
    ) -> Batch:
        """``Batch(...)`` for the core's :meth:`~kvsched.schedule.core.EngineState.make_batch`, its
        fields set through their slot descriptors (as :meth:`Run._trusted`): the same batch."""
        batch = _new(cls)
        _set_batch_start(batch, start)
        _set_batch_duration(batch, duration)
        _set_batch_requests(batch, requests)
        _set_batch_tokens(batch, tokens)
        _set_batch_phases(batch, phases)
        _set_batch_evicted(batch, evicted)
        return batch

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def size(self) -> int:
        """Number of items (requests processed)."""
        return int(self.requests.size)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.sum())

    def items(self) -> list[Item]:
        return [
            Item(int(r), int(c), Phase(int(p)))
            for r, c, p in zip(self.requests, self.tokens, self.phases, strict=True)
        ]

    def same_as(self, other: Batch, tol: float = 1e-9) -> bool:
        """Structural equality (times within ``tol``)."""
        return (
            abs(self.start - other.start) <= tol
            and abs(self.duration - other.duration) <= tol
            and np.array_equal(self.requests, other.requests)
            and np.array_equal(self.tokens, other.tokens)
            and np.array_equal(self.phases, other.phases)
            and np.array_equal(self.evicted, other.evicted)
        )


_ONE = np.ones(1, dtype=np.int64)
_DECODE_CODE = np.full(1, Phase.DECODE, dtype=np.int8)


def batch_starts(start: float, durations: np.ndarray) -> np.ndarray:
    """Start of each of consecutive batches from ``start`` (at least one duration).

    The engine clock adds durations one by one, so the times are the running sum in
    that order, bit-exact with batch-by-batch execution.
    """
    return np.add.accumulate(np.concatenate(([float(start)], durations[:-1])))


class Chunk(NamedTuple):
    """The prompt chunk of a mixed :class:`Run`: ``tokens`` tokens of ``request`` in every batch.

    ``phase`` is :attr:`Phase.PREFILL` or :attr:`Phase.REFILL` (the request's phase
    before the run, kept through it). With ``last`` > 0 the run's last batch
    processes ``last`` tokens instead (1 to ``tokens``), exactly the rest of the
    prompt or refill: the request generates a token at the end of the run (its
    first, for a prefill). With ``last`` 0 no chunk of the run finishes it.
    """

    request: int
    tokens: int
    phase: int
    last: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """``k`` back-to-back batches of the same items, no evictions (a coalesced run).

    Batch ``j`` starts when batch ``j - 1`` ends (``start`` plus the durations
    before it, added one by one as an engine clock would) and decodes one token
    for each of ``requests``; in a mixed run it then processes ``chunk.tokens``
    tokens of ``chunk.request`` (the batch's last item), which must not finish
    that request's prompt or refill in any of the ``k`` batches. None is evicted.
    Build with :meth:`of`.

    Parameters
    ----------
    start
        Start of the first batch.
    durations
        Duration of each of the ``k`` batches (read-only float array).
    requests
        Positions of the requests decoded in every batch (read-only; may be
        empty in a mixed run).
    end
        End of the last batch (derived by :meth:`of`).
    chunk
        The prompt chunk of every batch, or ``None`` (a decode-only run).
    """

    start: float
    durations: np.ndarray
    requests: np.ndarray
    end: float
    chunk: Chunk | None = None

    def __post_init__(self) -> None:
        # A user's Run(...) is checked here (Run.of's and _trusted's arguments pass the fast test or skip it).
        d, r = self.durations, self.requests
        if not (
            type(self.start) is float
            and type(self.end) is float
            and type(d) is np.ndarray
            and d.dtype == np.float64
            and d.ndim == 1
            and d.size
            and type(r) is np.ndarray
            and r.dtype.kind in "iu"
            and r.ndim == 1
            and (self.chunk is None or type(self.chunk) is Chunk)
        ):
            _check_run(self)

    @classmethod
    def of(
        cls,
        start: float,
        durations: Sequence[float] | np.ndarray,
        requests: Sequence[int] | np.ndarray,
        chunk: Chunk | tuple[int, int, int] | None = None,
    ) -> Run:
        if _is_frozen(durations, np.float64) and durations.base is None:  # type: ignore[union-attr]
            dur = durations  # read-only and owning its data: nobody can change it, so no copy
        else:
            dur = np.array(durations, dtype=np.float64).reshape(-1)
        if dur.size == 0:
            raise ValueError("a run has at least one batch")
        dur.setflags(False)
        req = requests if _is_frozen_int(requests) else _frozen(requests)
        if chunk is not None:
            chunk = Chunk(*map(int, chunk))
            if chunk.tokens < 1 or chunk.phase == Phase.DECODE:
                raise ValueError("a run's chunk is one or more prompt or refill tokens")
            if chunk.last and not (1 <= chunk.last <= chunk.tokens and dur.size >= 2):
                raise ValueError("a run's last chunk has 1 to `tokens` tokens, after at least one full chunk")
        return cls(float(start), dur, req, _end(float(start), dur), chunk)

    @classmethod
    def _trusted(
        cls,
        start: float,
        durations: np.ndarray,
        requests: np.ndarray,
        chunk: Chunk | None,
        end: float | None = None,
    ) -> Run:
        """:meth:`of` for the core's :meth:`~kvsched.schedule.core.EngineState.make_run`, which built every
        argument already as :meth:`of` would (read-only owned durations, read-only positions, a checked
        chunk, and ``end`` when given, the durations added one by one from ``start``): the same run
        without the checks."""
        # Set through the fields' slot descriptors, as the frozen dataclass's __init__ does through
        # object.__setattr__ (the same object, half the cost: one run per simulated entry).
        run = _new(cls)
        _set_start(run, start)
        _set_durations(run, durations)
        _set_requests(run, requests)
        _set_end(run, _end(start, durations) if end is None else end)
        _set_chunk(run, chunk)
        return run

    @property
    def repeat(self) -> int:
        """k: the number of batches."""
        return int(self.durations.size)

    @property
    def size(self) -> int:
        """Items per batch (the decodes, and the chunk if any)."""
        return int(self.requests.size) + (self.chunk is not None)

    @property
    def num_tokens(self) -> int:
        """Tokens per batch (but the last, with a last chunk)."""
        chunk = self.chunk
        return int(self.requests.size) + (chunk.tokens if chunk is not None else 0)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def starts(self) -> np.ndarray:
        """Start of each batch (exactly the clock of batch-by-batch execution)."""
        return batch_starts(self.start, self.durations)

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Requests, tokens and phase codes of every batch of the run (read-only arrays)."""
        n = self.requests.size
        chunk = self.chunk
        if chunk is None:
            tokens = np.broadcast_to(_ONE, (n,)) if n else _EMPTY
            return self.requests, tokens, np.broadcast_to(_DECODE_CODE, (n,))
        req = _frozen([*self.requests.tolist(), chunk.request])
        tok = _frozen([1] * n + [chunk.tokens])
        phases = _frozen([int(Phase.DECODE)] * n + [chunk.phase], np.int8)
        return req, tok, phases

    def last_tokens(self) -> np.ndarray:
        """Tokens of each item in the run's last batch (the items' tokens, but a last chunk's)."""
        chunk = self.chunk
        if chunk is None or not chunk.last:
            return self.items()[1]
        return _frozen([1] * self.requests.size + [chunk.last])

    def head(self) -> Run:
        """The run of its first ``k - 1`` batches, whose chunks do not finish the prompt (a run with a last chunk)."""
        chunk = self.chunk
        if chunk is None or not chunk.last:
            raise ValueError("only a run with a last chunk has a head")
        durations = self.durations[:-1].copy()
        durations.setflags(False)
        # Every field was built or checked as :meth:`of` would (this run's): no checks again.
        return Run._trusted(
            self.start, durations, self.requests, Chunk(chunk.request, chunk.tokens, chunk.phase)
        )

    def batches(self) -> Iterator[Batch]:
        """The ``k`` batches this run stands for."""
        req, tok, phases = self.items()
        k = self.durations.size
        last = self.chunk is not None and self.chunk.last
        for j, (s, d) in enumerate(zip(self.starts().tolist(), self.durations.tolist(), strict=True)):
            # Every field built or checked as Batch.of would: the unchecked path (one per batch spelled out).
            yield Batch._trusted(
                s, d, req, self.last_tokens() if last and j == k - 1 else tok, phases, _EMPTY
            )


_new = object.__new__
_set_start, _set_durations, _set_requests, _set_end, _set_chunk = (
    Run.__dict__[f.name].__set__ for f in fields(Run)
)
(
    _set_batch_start,
    _set_batch_duration,
    _set_batch_requests,
    _set_batch_tokens,
    _set_batch_phases,
    _set_batch_evicted,
) = (Batch.__dict__[f.name].__set__ for f in fields(Batch))


def _number(value: object, what: str) -> float:
    """A time field of a user's batch or run as a float, else an :class:`InputError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InputError(f"{what}: expected a number (seconds), got {type(value).__name__}: {value!r}")
    return float(value)


def _integers(values: object, what: str, dtype: type = np.int64) -> np.ndarray:
    """A column of a user's batch or run as a read-only 1-D integer array, else an :class:`InputError`
    naming it (a fractional count would be truncated silently by the core)."""
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError):
        raise InputError(
            f"{what}: expected a sequence of whole numbers, got {type(values).__name__}"
        ) from None
    if raw.ndim != 1:
        raise InputError(f"{what}: expected a 1-D sequence of whole numbers, got shape {raw.shape}")
    if raw.size == 0:
        return _EMPTY if dtype is np.int64 else _frozen([], dtype)
    if raw.dtype.kind not in "iuf":
        raise InputError(f"{what}: expected whole numbers, got {raw.dtype} values such as {raw[0].item()!r}")
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            raise InputError(f"{what}: {raw[bad][0].item()!r} is not a whole number")
    return _frozen(raw, dtype)


def _check_batch(batch: Batch) -> None:
    """Convert a user's batch's fields in place (``Batch.of``'s conversions) or raise an InputError."""
    start = _number(batch.start, "Batch.start")
    duration = _number(batch.duration, "Batch.duration")
    req = _integers(batch.requests, "Batch.requests")
    tok = _integers(batch.tokens, "Batch.tokens")
    ph = _integers(batch.phases, "Batch.phases", np.int8)
    ev = _integers(batch.evicted, "Batch.evicted")
    if not (req.size == tok.size == ph.size):
        raise InputError(
            f"Batch: requests, tokens and phases must have the same length, got {req.size}, {tok.size} "
            f"and {ph.size}"
        )
    _set_batch_start(batch, start)
    _set_batch_duration(batch, duration)
    _set_batch_requests(batch, req)
    _set_batch_tokens(batch, tok)
    _set_batch_phases(batch, ph)
    _set_batch_evicted(batch, ev)


def _check_run(run: Run) -> None:
    """Convert a user's run's fields in place (as :meth:`Run.of` would) or raise an InputError."""
    start = _number(run.start, "Run.start")
    end = _number(run.end, "Run.end")
    try:
        dur = np.array(run.durations, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InputError(f"Run.durations: expected numbers, got {type(run.durations).__name__}") from None
    if dur.size == 0:
        raise InputError("Run.durations: a run has at least one batch")
    dur.setflags(write=False)
    req = _integers(run.requests, "Run.requests")
    chunk = run.chunk
    if chunk is not None:
        try:
            chunk = Chunk(*_integers(chunk, "Run.chunk").tolist())
        except TypeError:
            raise InputError(f"Run.chunk: expected (request, tokens, phase[, last]), got {chunk!r}") from None
    _set_start(run, start)
    _set_durations(run, dur)
    _set_requests(run, req)
    _set_end(run, end)
    _set_chunk(run, chunk)


def _end(start: float, durations: np.ndarray) -> float:
    """``start`` plus ``durations`` added one by one, as the engine clock adds them (bit-exact)."""
    if durations.size > 64:
        return float(np.add.accumulate(np.concatenate(([start], durations)))[-1])
    end = start  # a few additions in Python cost less than two numpy calls (same order, same floats)
    for d in durations.tolist():
        end += d
    return end


def _is_frozen(values: object, dtype: type) -> bool:
    return (
        isinstance(values, np.ndarray)
        and values.dtype == dtype
        and values.ndim == 1
        and not values.flags.writeable
    )


def _is_frozen_int(values: object) -> bool:
    return isinstance(values, np.ndarray) and values.dtype == np.int64 and not values.flags.writeable


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """An ordered list of batches and runs plus free-form provenance (policy, solver, ...).

    Parameters
    ----------
    entries
        :class:`Batch` and :class:`Run` objects in time order.
    meta
        Provenance.
    """

    entries: tuple[Batch | Run, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    _expanded: tuple[Batch, ...] | None = field(default=None, init=False, repr=False, compare=False)
    #: The fingerprint of the instance it was read for (:func:`bind_instance`); None when unknown. Not
    #: in ``meta``: that is the user's provenance, and a round trip through a file keeps it as it was.
    _instance: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # One pass in C over the entries' types (a few ms per million): a user's list or a stray entry is
        # an InputError here, not an AttributeError inside the core.
        entries = self.entries
        if type(entries) is not tuple:
            if isinstance(entries, str | bytes | Batch | Run) or not isinstance(entries, Sequence):
                raise InputError(
                    f"Schedule.entries: expected a sequence of Batch and Run objects, got {type(entries).__name__}"
                )
            entries = tuple(entries)
            object.__setattr__(self, "entries", entries)
        if not set(map(type, entries)) <= _ENTRY_TYPES:
            k, bad = next((k, e) for k, e in enumerate(entries) if type(e) not in _ENTRY_TYPES)
            raise InputError(f"Schedule.entries[{k}]: expected a Batch or a Run, got {type(bad).__name__}")
        if not isinstance(self.meta, dict):
            raise InputError(f"Schedule.meta: expected a dict, got {type(self.meta).__name__}")

    def __repr__(self) -> str:
        # Short and cheap (one pass over the entries): the generated repr spelled out every batch's arrays.
        runs = sum(type(e) is Run for e in self.entries)
        keys = ", ".join(map(str, self.meta))
        return (
            f"<Schedule: {len(self):,} batches in {len(self.entries):,} entries ({runs:,} runs), "
            f"makespan {self.makespan:.6g}, meta keys [{keys}]>"
        )

    @property
    def has_runs(self) -> bool:
        return any(type(e) is Run for e in self.entries)

    @property
    def batches(self) -> tuple[Batch, ...]:
        """Every batch, runs expanded (built once on first use; no copy when there is no run)."""
        if self._expanded is None:
            if not self.has_runs:
                object.__setattr__(self, "_expanded", self.entries)
            else:
                out: list[Batch] = []
                for e in self.entries:
                    if type(e) is Run:
                        out.extend(e.batches())
                    else:
                        out.append(e)
                object.__setattr__(self, "_expanded", tuple(out))
        assert self._expanded is not None
        return self._expanded

    def __len__(self) -> int:
        """Number of batches (a run of k counts k)."""
        return sum(e.repeat if type(e) is Run else 1 for e in self.entries)

    @property
    def num_evictions(self) -> int:
        """Evictions over the whole schedule (counted without spelling the runs out: a run never evicts)."""
        return int(sum(e.evicted.size for e in self.entries if type(e) is Batch))

    def __iter__(self) -> Iterator[Batch]:
        """The batches one by one, runs expanded lazily (nothing kept)."""
        for e in self.entries:
            if type(e) is Run:
                yield from e.batches()
            else:
                yield e

    @property
    def makespan(self) -> float:
        return self.entries[-1].end if self.entries else 0.0

    def same_as(self, other: Schedule, tol: float = 1e-9) -> bool:
        return len(self) == len(other) and all(a.same_as(b, tol) for a, b in zip(self, other, strict=True))


_ENTRY_TYPES = frozenset((Batch, Run))


def expect_schedule(value: object, name: str = "schedule") -> Schedule:
    """``value`` if it is a :class:`Schedule`, else one :class:`~kvsched.errors.InputError` naming
    ``name`` (what the API's replaying entry points raise for a wrong argument, not an AttributeError
    from deep inside)."""
    if not isinstance(value, Schedule):
        hint = ""
        if isinstance(getattr(value, "schedule", None), Schedule):
            hint = " (pass its .schedule)"
        raise InputError(f"{name}: expected a kvsched Schedule, got {type(value).__name__}{hint}")
    return value


def expect_schedule_for(value: object, num_requests: int, name: str = "schedule") -> Schedule:
    """:func:`expect_schedule`, and every request position it names (items, a run's chunk, evictions) below
    ``num_requests``, else one :class:`~kvsched.errors.InputError`: a schedule of another instance, which the
    writers that do not replay (``save_schedule``, ``chrome_trace``, ``retime``) met as an IndexError."""
    schedule = expect_schedule(value, name)
    top = -1
    for e in schedule.entries:
        if e.requests.size:
            top = max(top, int(e.requests.max()))
        evicted = getattr(e, "evicted", None)
        if evicted is not None and evicted.size:
            top = max(top, int(evicted.max()))
        chunk = getattr(e, "chunk", None)
        if chunk is not None:
            top = max(top, int(chunk.request))
    if top >= num_requests:
        raise InputError(
            f"{name}: it refers to request position {top}, but the instance has {num_requests} request"
            f"{'s' * (num_requests != 1)} (a schedule of another instance?)"
        )
    return schedule


def bind_instance(schedule: Schedule, fingerprint: str | None) -> Schedule:
    """Record on ``schedule`` the fingerprint of the instance it belongs to (``load_schedule`` does, and
    ``retime`` passes it on); returns ``schedule``.

    Two instances of the same size with requests ``r0 .. r9`` share every request position, so only the
    fingerprint tells one's schedule from the other's once the file's meta is read; kept here, the
    writers that do not replay (``save_schedule``, ``chrome_trace``, ``retime``) refuse the mix-up, as
    loading the file does.
    """
    object.__setattr__(schedule, "_instance", fingerprint)
    return schedule


def expect_schedule_of(value: object, instance: Any, name: str = "schedule") -> Schedule:
    """:func:`expect_schedule_for` ``instance``'s request count, and, where the schedule knows the instance
    it was read for (:func:`bind_instance`), that instance's fingerprint; else one
    :class:`~kvsched.errors.InputError` naming ``name``. The fingerprint is computed only for such a
    schedule (a hash of the requests: about 50 ms per 100,000, far below what the callers then do)."""
    schedule = expect_schedule_for(value, len(instance.requests), name)
    if schedule._instance is not None:
        from kvsched.instances.io import check_instance_fingerprint  # (a layer below; pydantic, so on use)

        check_instance_fingerprint(schedule._instance, instance, f"{name}: it was read")
    return schedule
