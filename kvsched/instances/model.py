"""The instance model: requests, engine limits and the time model.

All classes are frozen dataclasses; files are read and written through
:mod:`kvsched.instances.io`, which validates them with pydantic first.
"""

from __future__ import annotations

import numbers
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter
from typing import Any

from kvsched.errors import InfeasibleInstanceError, InputError

#: Largest token count or limit accepted (2^31 - 1): sums over requests stay far inside int64.
MAX_TOKENS = 2**31 - 1
#: Largest time accepted (arrival, SLO): 1e12 time units, so that horizons and clocks stay finite and exact enough.
MAX_TIME = 1e12


def _is_tokens(value: Any) -> bool:
    return type(value) is int and 0 < value <= MAX_TOKENS


def _is_time(value: Any) -> bool:  # NaN fails every comparison, infinity the upper one
    return type(value) in (float, int) and 0 <= value <= MAX_TIME


def _is_slo(value: Any) -> bool:
    return value is None or (type(value) in (float, int) and 0 < value <= MAX_TIME)


_TOKENS_WORDS = f"an int from 1 to {MAX_TOKENS}"
_SLO_WORDS = f"a number above 0 and at most {MAX_TIME:g} (or None)"
#: Each request field's rule, as the file schema states it (:class:`~kvsched.instances.schema.RequestSchema`),
#: on one plain value (a parsed JSON value, or a Python-built request's field with numpy scalars made plain),
#: and its words for an error. A file's requests are checked in bulk with these (:mod:`kvsched.instances.io`),
#: a Python-built instance's by :meth:`Instance.check_requests`.
REQUEST_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (lambda v: type(v) is str and v != "", "a non-empty string"),
    "arrival": (_is_time, f"a number from 0 to {MAX_TIME:g}"),
    "prompt": (_is_tokens, _TOKENS_WORDS),
    "output": (_is_tokens, _TOKENS_WORDS),
    "predicted_output": (lambda v: v is None or _is_tokens(v), _TOKENS_WORDS + " (or None)"),
    "cls": (lambda v: v is None or type(v) is str, "a string (or None)"),
    "priority": (
        lambda v: type(v) is int and -MAX_TOKENS <= v <= MAX_TOKENS,
        f"an int from {-MAX_TOKENS} to {MAX_TOKENS}",
    ),
    "ttft_slo": (_is_slo, _SLO_WORDS),
    "tbt_slo": (_is_slo, _SLO_WORDS),
}


def _plain(value: Any) -> Any:
    """A numpy integer or float as Python's own, for :data:`REQUEST_RULES` (an instance built in Python may
    hold them; a float stays a float, so a prompt of 4.0 is still refused)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)  # (numpy's str_ too)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request.

    Parameters
    ----------
    id
        Unique name of the request within its instance.
    arrival
        Arrival time, in the time unit of the instance's time model (slots for
        ``unit``, seconds for the calibrated models).
    prompt
        Prompt length I in tokens (>= 1).
    output
        True output length O in tokens (>= 1), counting the final token, which is
        generated but never processed. Known in hindsight only.
    predicted_output
        Optional predicted output length, for policies that use predictions.
    cls
        Optional class name (e.g. ``"paying"``/``"free"``).
    priority
        Optional integer priority (larger is more important).
    ttft_slo, tbt_slo
        Optional service-level objectives on time to first token and on time
        between tokens, in the instance's time unit.
    """

    id: str
    arrival: float
    prompt: int
    output: int
    predicted_output: int | None = None
    cls: str | None = None
    priority: int = 0
    ttft_slo: float | None = None
    tbt_slo: float | None = None

    @property
    def peak_kv(self) -> int:
        """The most KV tokens this request ever holds: I + O - 1 (InferMax accounting)."""
        return self.prompt + self.output - 1


#: Each field of :class:`Request` and how to set it on a new object (its slot's descriptor), in order.
_REQUEST_SETTERS = tuple((f, Request.__dict__[f.name].__set__) for f in fields(Request))


def new_requests(
    ids: Sequence[str], arrivals: Sequence[float], prompts: Sequence[int], outputs: Sequence[int]
) -> list[Request]:
    """``[Request(i, a, p, o) for i, a, p, o in zip(...)]`` (the other fields at their defaults), unchecked.

    A trace's requests at once, a field at a time through the slots' descriptors, as the frozen
    dataclass's ``__init__`` sets them one object at a time through ``object.__setattr__``: the
    same objects in half the instructions (10,000 of them: 151M against 69M). The four columns
    have the same length.
    """
    requests = list(map(object.__new__, repeat(Request, len(ids))))
    given = (ids, arrivals, prompts, outputs)
    for k, (spec, set_field) in enumerate(_REQUEST_SETTERS):
        values = given[k] if k < len(given) else repeat(spec.default, len(requests))
        deque(map(set_field, requests, values), maxlen=0)
    return requests


#: KV capacity M where none is given (``kvsched generate``, :func:`~kvsched.instances.generators.generate`):
#: InferMax's default, seed 003 Sec. 4.1.
DEFAULT_KV_CAPACITY = 100_000
#: Instances found feasible (requests checked too), kept by identity: the greedies check their instance on
#: every run and a local search runs them thousands of times (1 ms a check at 1,000 requests, 10 ms at
#: 10,000). An instance, its limits and its requests are frozen, so the answer cannot change; holding the
#: instances keeps an id from being reused.
_FEASIBLE: deque[Instance] = deque(maxlen=4)
#: The same for :meth:`Instance.check_requests` alone, which every entry point taking an instance runs
#: (:func:`expect_instance`): a replay or a writer as well as a simulation or a solve.
_REQUESTS_OK: deque[Instance] = deque(maxlen=4)


@dataclass(frozen=True, slots=True)
class Limits:
    """Engine limits.

    Parameters
    ----------
    kv_capacity
        KV cache capacity M, in tokens.
    block_size
        Paged-KV block size in tokens; a request's KV is rounded up to whole
        blocks. 1 means no paging.
    max_batch_tokens
        Token budget C: tokens processed per batch. ``None`` means unlimited.
    max_prefill_tokens
        Prefill budget P: prefill and refill tokens per batch. ``None`` means
        unlimited.
    max_running
        Maximum number of requests holding KV during a batch (vLLM's
        ``max_num_seqs``). ``None`` means unlimited.
    """

    kv_capacity: int
    block_size: int = 1
    max_batch_tokens: int | None = None
    max_prefill_tokens: int | None = None
    max_running: int | None = None

    @property
    def kv_blocks(self) -> int:
        """Number of whole KV blocks that fit in ``kv_capacity``."""
        return self.kv_capacity // self.block_size

    def check(self) -> None:
        """Raise :class:`~kvsched.errors.InputError` naming the first impossible field (what a file's
        schema refuses: a capacity, block size or budget that is not an int from 1 to
        :data:`MAX_TOKENS`, blocks larger than the capacity)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name not in ("kv_capacity", "block_size"):
                continue  # an unlimited budget
            # An int (numpy's too), as the file schema asks: a float 8.0 later sizes arrays and fails there.
            if not _is_tokens(_plain(value)):
                none = "" if f.name in ("kv_capacity", "block_size") else " (or None: unlimited)"
                raise InputError(
                    f"limits.{f.name}: must be an int from 1 to {MAX_TOKENS}{none}, got {value!r}"
                )
        if self.block_size > self.kv_capacity:
            raise InputError(
                f"limits.block_size: {self.block_size} is larger than kv_capacity {self.kv_capacity}"
            )

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` KV tokens."""
        return -(-tokens // self.block_size)


@dataclass(frozen=True, slots=True)
class TimeModel:
    """A named cost model and its parameters (see :mod:`kvsched.costmodel`).

    ``TimeModel("unit")`` is the MC-SF paper's model: every batch lasts one slot.
    """

    name: str = "unit"
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Instance:
    """A scheduling problem: requests plus engine limits plus a time model.

    Requests keep the order they were given in; schedules refer to them by
    ``id`` in files and by position in memory.
    """

    requests: tuple[Request, ...]
    limits: Limits
    time_model: TimeModel = field(default_factory=TimeModel)
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def __repr__(self) -> str:
        # The generated repr spelled every request out: 435,000 characters at 3,000 requests in a REPL.
        lim = self.limits
        budgets = ", ".join(
            f"{key}={value}"
            for key, value in (
                ("C", lim.max_batch_tokens),
                ("P", lim.max_prefill_tokens),
                ("R", lim.max_running),
            )
            if value is not None
        )
        return (
            f"<Instance {self.name!r}: {len(self.requests):,} requests, M={lim.kv_capacity:,}"
            f"{', ' + budgets if budgets else ''}, time model {self.time_model.name!r}>"
        )

    def index_of(self) -> dict[str, int]:
        """Map from request id to position."""
        return {r.id: k for k, r in enumerate(self.requests)}

    def check_requests(self) -> None:
        """Raise :class:`~kvsched.errors.InputError` naming the first request with an impossible field.

        A file is checked by its schema when it is read; an instance built in Python is checked
        here (every entry point calls :meth:`check_feasible`) against the same rules,
        :data:`REQUEST_RULES`: int prompt and output lengths from 1 to :data:`MAX_TOKENS`, an arrival
        from 0 to :data:`MAX_TIME`, optional fields of the schema's types and ranges, and ids that are
        unique. One pass per field first (about 0.2 s at 100,000 requests; strict on ``int`` and
        ``float``, so numpy scalars take the loop below, which reads them as Python's own and names the
        first fault). The limits are checked first (:meth:`Limits.check`).
        """
        if any(known is self for known in _REQUESTS_OK):
            return
        expect_limits(self.limits)
        if not isinstance(self.name, str):
            raise InputError(f"name: expected a str, got {type(self.name).__name__}")
        if not isinstance(self.meta, dict):
            raise InputError(f"meta: expected a dict (of JSON values), got {type(self.meta).__name__}")
        reqs = self.requests
        if not isinstance(reqs, tuple | list):
            raise InputError(f"requests: expected a tuple of kvsched.Request, got {type(reqs).__name__}")
        if not reqs:  # as a file's schema says: every command and bound needs something to schedule
            raise InputError("requests: an instance needs at least one request")
        expect_time_model(self.time_model)
        # The common case in one pass, the rules written out for the fields a request usually sets and the
        # others at their defaults (which every rule takes): the greedies check their instance on every run,
        # and calling each field's rule took 4 times as long (2.1 ms against 0.5 ms at 1k requests). Anything
        # else takes the rules themselves, below.
        for k, r in enumerate(reqs):
            if not isinstance(r, Request):
                raise InputError(f"requests[{k}]: expected a kvsched.Request, got {type(r).__name__}")
        if all(
            type(r.prompt) is int and type(r.output) is int and 1 <= r.prompt <= MAX_TOKENS
            and 1 <= r.output <= MAX_TOKENS
            and type(r.arrival) in (float, int) and 0 <= r.arrival <= MAX_TIME  # NaN fails both comparisons
            and type(r.id) is str and r.id != ""
            and r.predicted_output is r.cls is r.ttft_slo is r.tbt_slo is None  # (all four None)
            and type(r.priority) is int and r.priority == 0
            for r in reqs
        ) and len({r.id for r in reqs}) == len(reqs):  # fmt: skip
            self._requests_ok()
            return
        if all(
            all(map(rule, map(attrgetter(name), reqs))) for name, (rule, _) in REQUEST_RULES.items()
        ) and len({r.id for r in reqs}) == len(reqs):
            self._requests_ok()
            return
        seen: set[str] = set()
        for k, r in enumerate(reqs):
            for name, (rule, words) in REQUEST_RULES.items():
                # A float 4.0 as a prompt later sizes arrays and fails there; past MAX_TOKENS a sum overflows
                # int64 or a simulation runs for billions of batches.
                value = getattr(r, name)
                if not rule(_plain(value)):
                    raise InputError(f"request {r.id!r} (#{k}): {name} must be {words}, got {value!r}")
            if r.id in seen:
                raise InputError(
                    f"request {r.id!r} (#{k}): its id is used by an earlier request; ids must be unique"
                )
            seen.add(r.id)

    def _requests_ok(self) -> None:
        if type(self.requests) is tuple:  # a list could change after the check
            _REQUESTS_OK.append(self)

    def __hash__(self) -> int:
        # The generated hash would hash ``meta`` and the time model's parameters, dicts: unhashable. Equal
        # instances have equal requests, limits and names, so these fields alone keep hash and == consistent.
        return hash((self.name, self.limits, self.time_model.name, tuple(self.requests)))

    def check_feasible(self, *, requests: bool = True, name: Callable[[int], str] | None = None) -> None:
        """Raise :class:`InfeasibleInstanceError` if some request can never run.

        A request is impossible when its peak KV (I + O - 1, rounded up to
        blocks) exceeds M, or when it could never be processed because the
        budgets forbid even a one-token step. With ``requests`` (the default),
        :meth:`check_requests` runs first; a caller that just read the instance
        from a file (checked by its schema or the CSV loader) may skip it.
        ``name`` words the error's reference to the request at a position (by
        default ``request 'ID'``; a CSV trace's loader names its file line).
        """
        if any(known is self for known in _FEASIBLE):
            return
        if requests:
            self.check_requests()
        self._check_peaks(name)
        if requests and type(self.requests) is tuple:  # a list could change after the check
            _FEASIBLE.append(self)

    def _check_peaks(self, name: Callable[[int], str] | None = None) -> None:
        """Raise :class:`InfeasibleInstanceError` naming the first request whose peak KV exceeds M, and
        how many do in all (a trace cut for a smaller M has many: fixing them one error at a time is slow)."""
        lim = self.limits
        # A peak fits in whole blocks exactly when it is at most the blocks' tokens: one pass over
        # the sums first (100,000 requests in a few ms), the loop below only to name the first misfit.
        fits = lim.kv_blocks * lim.block_size
        if max((r.prompt + r.output for r in self.requests), default=0) - 1 <= fits:
            return
        misfits = [k for k, r in enumerate(self.requests) if r.peak_kv > fits]
        k = misfits[0]
        r = self.requests[k]
        need = lim.blocks_for(r.peak_kv) * lim.block_size
        more = len(misfits) - 1
        raise InfeasibleInstanceError(
            (name(k) if name is not None else f"request {r.id!r}")
            + f": needs {r.peak_kv} KV tokens (I + O - 1 = {r.prompt} + {r.output} - 1"
            + (f", {need} in blocks of {lim.block_size}" if need != r.peak_kv else "")
            + f") but the KV capacity M is {lim.kv_capacity}; it can never complete"
            + (
                f" ({len(misfits)} of the {len(self.requests)} requests cannot fit M; this is the first)"
                if more
                else ""
            )
        )


def expect_limits(value: object, name: str = "limits") -> Limits:
    """``value`` if it is a :class:`Limits` whose fields pass :meth:`Limits.check`, else one
    :class:`~kvsched.errors.InputError` naming ``name``."""
    if not isinstance(value, Limits):
        raise InputError(f"{name}: expected kvsched.Limits(...), got {type(value).__name__}")
    value.check()
    return value


def expect_time_model(value: object, name: str = "time_model") -> TimeModel:
    """``value`` if it is a :class:`TimeModel`, else one :class:`~kvsched.errors.InputError` naming ``name``
    (whether its name and parameters make a cost model is :func:`kvsched.instances.io.check_time_model`'s)."""
    if not isinstance(value, TimeModel):
        raise InputError(f"{name}: expected kvsched.TimeModel(...), got {type(value).__name__}")
    return value


def expect_instance(value: object) -> Instance:
    """``value`` if it is an :class:`Instance` whose fields pass :meth:`Instance.check_requests`, else the one
    :class:`~kvsched.errors.InputError` the API entry points raise for it. Every entry point taking an
    instance calls it (``simulate``, ``solve``, ``compare``, ``validate``, ``replay``, ``retime``, the writers and
    the plots): an instance built in Python with a NaN arrival or two requests of one id validated a schedule
    and reported NaN latencies before. Remembered per instance (it is frozen), so a second call is free."""
    if not isinstance(value, Instance):
        raise InputError(
            f"instance: expected an Instance (kvsched.load_instance), got {type(value).__name__}"
        )
    value.check_requests()
    return value
