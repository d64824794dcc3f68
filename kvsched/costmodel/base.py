"""The cost-model protocol: the time a batch takes, given what it processes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import numpy as np

from kvsched.errors import InputError

#: Phase.DECODE; kept literal so cost models do not import the schedule package.
DECODE = 1


@dataclass(frozen=True, slots=True, eq=False)
class BatchView:
    """What a cost model sees of a batch.

    Parameters
    ----------
    tokens
        Tokens processed per item (c).
    context
        KV tokens each item's request holds before the batch (m, after the
        batch's evictions). A decode reads ``context`` KV tokens; a prefill or
        refill chunk of c tokens on top of m attends to m + 1 ... m + c.
    phases
        :class:`kvsched.schedule.ir.Phase` code per item.
    """

    tokens: np.ndarray
    context: np.ndarray
    phases: np.ndarray


@runtime_checkable
class CostModel(Protocol):
    """Anything that turns a batch into a duration (in the instance's time unit)."""

    name: str

    def batch_time(self, view: BatchView) -> float:
        """Duration of the batch described by ``view``."""
        ...


def time_of_counts(model: CostModel) -> Callable[..., float]:
    """``model``'s batch time from arrays and counts a caller has already made.

    The returned function takes ``(tokens, context, phases, is_decode, num_decodes,
    num_tokens)``: int64 ``tokens`` and ``context``, the phase codes, the decode mask,
    its count and the sum of ``tokens`` (the core has all of them when it builds a
    batch). A model may define ``time_of_counts`` with that signature; it must return
    exactly (bit for bit) what ``batch_time`` gives for the same batch. Otherwise the
    view is built for ``batch_time``.
    """
    fast = getattr(model, "time_of_counts", None)
    if fast is not None:
        return cast(Callable[..., float], fast)
    return _ViaBatchTime(model)


@dataclass(frozen=True, slots=True, eq=False)
class _ViaBatchTime:
    """:func:`time_of_counts` of a model without its own: the view, for ``batch_time`` (picklable)."""

    model: CostModel

    def __call__(self, tokens: np.ndarray, context: np.ndarray, phases: np.ndarray, *counts: int) -> float:
        return self.model.batch_time(BatchView(tokens, context, phases))


def decode_run_times(model: CostModel, context: np.ndarray, k: int) -> np.ndarray:
    """Durations of ``k`` back-to-back decode-only batches of the same requests (a coalesced run).

    Batch ``j`` (0-based) decodes one token for each request, which holds
    ``context + j`` KV tokens before it. A model may define
    ``decode_run_times(context, k)`` with a closed form; it must return exactly
    (bit for bit) what ``batch_time`` gives for each batch, so that coalescing
    never changes a schedule. Otherwise each batch is priced on its own.
    """
    fast = getattr(model, "decode_run_times", None)
    if fast is not None:
        return fast(context, k)
    ctx = np.asarray(context, dtype=np.int64)
    ones = np.ones(ctx.size, dtype=np.int64)
    phases = np.full(ctx.size, DECODE, dtype=np.int8)
    return np.array([model.batch_time(BatchView(ones, ctx + j, phases)) for j in range(k)], dtype=np.float64)


def decode_run_until(
    model: CostModel, context: np.ndarray, k: int, start: float, until: float, tol: float
) -> tuple[np.ndarray, float] | None:
    """:func:`decode_run_times` of the batches (at most ``k``) that start before ``until`` from ``start``.

    Batch ``j`` starts at ``start`` plus the durations before it, added one by one; it
    is kept while that start plus ``tol`` is below ``until``. Returns the kept batches'
    durations (a fresh array) and the last one's end (``start`` if none is kept), bit for
    bit what :func:`decode_run_times` and that running sum give, or ``None`` when the model
    has no such method (``decode_run_until(context, k, start, until, tol)``) or leaves
    it to the caller (a cut past the few batches it prices on Python floats). A
    model defines it to price only the batches a simulator can take before the next
    arrival, not every batch up to the run's first completion.
    """
    fast = getattr(model, "decode_run_until", None)
    return None if fast is None else fast(context, k, start, until, tol)


def chunk_run_times(
    model: CostModel,
    context: np.ndarray,
    chunk_context: int,
    chunk_tokens: int,
    chunk_phase: int,
    k: int,
    last: int = 0,
) -> np.ndarray:
    """Durations of ``k`` back-to-back mixed batches (a coalesced run with a prompt chunk).

    Batch ``j`` (0-based) decodes one token for each request of ``context`` (which
    holds ``context + j`` KV tokens before it) and then processes ``chunk_tokens``
    tokens of one prefill or refill (code ``chunk_phase``) that holds
    ``chunk_context + j * chunk_tokens`` KV tokens before it: the items in that
    order, as :meth:`~kvsched.schedule.ir.Run.items` lays them out. With ``last``
    > 0 the last batch's chunk has ``last`` tokens instead. A model may define
    ``chunk_run_times(context, chunk_context, chunk_tokens, k, last)`` with a
    closed form (or a loop on Python floats); it must return exactly (bit for bit)
    what ``batch_time`` gives for each batch. Otherwise each batch is priced on its own.
    """
    fast = getattr(model, "chunk_run_times", None)
    if fast is not None:
        return fast(context, chunk_context, chunk_tokens, k, last)
    ctx = np.asarray(context, dtype=np.int64)
    n = int(ctx.size)
    tokens = np.ones(n + 1, dtype=np.int64)
    tokens[n] = chunk_tokens
    phases = np.full(n + 1, DECODE, dtype=np.int8)
    phases[n] = chunk_phase
    out = np.empty(k, dtype=np.float64)
    for j in range(k):
        kv = np.append(ctx + j, chunk_context + j * chunk_tokens)
        if last and j == k - 1:
            tokens = tokens.copy()
            tokens[n] = last
        out[j] = model.batch_time(BatchView(tokens, kv, phases))
    return out


def expect_cost_model(value: object, name: str = "cost_model") -> CostModel:
    """``value`` if it is a cost model (anything with ``batch_time``, duck-typed as the core reads it), else
    one :class:`~kvsched.errors.InputError` naming ``name`` (not an AttributeError from deep inside)."""
    if isinstance(value, str):
        raise InputError(
            f"{name}: expected a cost model, got the name {value!r}: use kvsched.make_cost_model"
        )
    if not hasattr(value, "batch_time"):
        raise InputError(
            f"{name}: expected a cost model (kvsched.make_cost_model), got {type(value).__name__}"
        )
    return cast(CostModel, value)
