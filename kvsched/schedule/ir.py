"""The schedule IR: an ordered list of batches.

A :class:`Batch` is columnar: parallel integer arrays of request positions,
token counts and phase codes, so that schedules of millions of items stay cheap.
:meth:`Batch.items` gives the readable view. Files refer to requests by id;
in memory they are positions in :attr:`Instance.requests`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


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
    arr.flags.writeable = False
    return arr


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


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """An ordered list of batches plus free-form provenance (policy, solver, ...)."""

    batches: tuple[Batch, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    @property
    def makespan(self) -> float:
        return self.batches[-1].end if self.batches else 0.0

    def same_as(self, other: Schedule, tol: float = 1e-9) -> bool:
        return len(self) == len(other) and all(
            a.same_as(b, tol) for a, b in zip(self.batches, other.batches, strict=True)
        )
