"""Linear surrogates: every cost model as a model linear in the batch sums, with its error.

The exact solvers need a batch time that is linear in their decision variables.
InferMax's form is (seed 003, Sec. 3.2): a0 + a1 tau + [decode](b0 + b1 sum m)
+ [prefill](p0 + p1 sum(c^2 + 2mc) + p2 sum m + p3 #prefills), where the
bracketed indicators and sums are linear in per-batch assignments and
sum(c^2 + 2mc) telescopes to I^2 over a prompt's chunks. ``linear_surrogate``
fits that form (or the ``linear`` form, which adds b2 #decodes and p4 sum c^2)
to any cost model by relative least squares on a fixed grid of probe batches,
and reports how far the surrogate is from the full model on those batches.

The probe grid spans token loads 1 .. ``max_tokens`` and contexts up to
``max_context``: decode-only batches, single and double prefill chunks, mixed
batches, and a sweep of the token load in steps of 32 (so that staircases in
the token term are seen). A model that already has the surrogate's form is
reproduced to rounding error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import BatchView, CostModel
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.features import DECODE, BatchFeatures
from kvsched.costmodel.fidelity import ErrorStats
from kvsched.costmodel.fitting import wls
from kvsched.costmodel.infermax import InfermaxLinear
from kvsched.errors import InputError

SURROGATE_FORMS = ("infermax", "linear")
_PREFILL = 0


@dataclass(frozen=True, slots=True)
class Surrogate:
    """A linear surrogate and its relative error against the full model on the probe batches."""

    model: InfermaxLinear | CalibratedCost
    form: str
    stats: ErrorStats


def _view(items: list[tuple[int, int, int]]) -> BatchView:
    arr = np.array(items, dtype=np.int64)
    return BatchView(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int8))


def probe_batches(max_tokens: int = 4096, max_context: int = 4096) -> list[BatchView]:
    """The fixed grid of batches surrogates are fitted and measured on."""
    out: list[BatchView] = []
    contexts = sorted({m for m in (16, 256, 1024, 2048, 4096) if m <= max_context} | {max_context})
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if b <= max_tokens:
            out += [_view([(1, m, DECODE)] * b) for m in contexts]
    for c in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096):
        if c <= max_tokens:
            out += [_view([(c, m, _PREFILL)]) for m in (0, 512, 2048) if m <= max_context]
    for c1, c2, m2 in ((256, 512, 0), (1024, 1024, 1024), (64, 64, 512)):
        if c1 + c2 <= max_tokens:
            out.append(_view([(c1, 0, _PREFILL), (c2, min(m2, max_context), _PREFILL)]))
    for c in (128, 512, 2048):
        for b in (8, 64):
            if c + b <= max_tokens:
                out.append(_view([(c, 0, _PREFILL)] + [(1, min(1024, max_context), DECODE)] * b))
    for tau in range(64, max_tokens + 1, 32):
        # A load sweep: 32 decodes and one chunk, so the token term is probed every 32 tokens.
        out.append(_view([(tau - 32, 0, _PREFILL)] + [(1, min(512, max_context), DECODE)] * 32))
    return out


def _columns(f: BatchFeatures, form: str) -> list[float]:
    has_d = 1.0 if f.n_decode else 0.0
    has_p = 1.0 if f.n_prefill else 0.0
    cols = [1.0, f.tokens, has_d, f.decode_kv, has_p, f.prefill_quad, f.prefill_kv, f.n_prefill]
    if form == "linear":
        cols += [f.n_decode, f.prefill_sq]
    return cols


_NAMES = ("a0", "a1", "b0", "b1", "p0", "p1", "p2", "p3")


def linear_surrogate(
    model: CostModel, *, form: str = "infermax", max_tokens: int = 4096, max_context: int = 4096
) -> Surrogate:
    """Fit a linear surrogate of ``model`` and measure it on the probe batches.

    Parameters
    ----------
    model
        Any cost model.
    form
        ``infermax`` (an :class:`InfermaxLinear`) or ``linear`` (a linear
        :class:`CalibratedCost`, with b2 and p4 as well).
    max_tokens, max_context
        Range of the probe batches (the token budget C and the longest context).
    """
    if form not in SURROGATE_FORMS:
        raise InputError(f"surrogate form: unknown {form!r} (known: {', '.join(SURROGATE_FORMS)})")
    batches = probe_batches(max_tokens, max_context)
    feats = [BatchFeatures.of(v) for v in batches]
    y = np.array([model.batch_time(v) for v in batches], dtype=np.float64)
    if np.any(y <= 0):
        raise InputError(f"cost model {model.name}: non-positive batch time on a probe batch")
    x = np.array([_columns(f, form) for f in feats])
    coef = wls(x, y, nonneg=[True] * x.shape[1])
    params = dict(zip(_NAMES, map(float, coef[:8]), strict=True))
    if form == "infermax":
        sur: InfermaxLinear | CalibratedCost = InfermaxLinear(**params)
    else:
        sur = CalibratedCost(**params, b2=float(coef[8]), p4=float(coef[9]))
    pred = np.array([sur.batch_time(v) for v in batches])
    return Surrogate(sur, form, ErrorStats.of(pred, y))
