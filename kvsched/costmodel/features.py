"""The batch aggregates that the linear and piecewise-linear cost models are linear in.

Every model in this package that a solver can use is a linear combination of a
few sums over the batch (seed 003, Sec. 3.2, and its digest A2). Computing them
once, here, keeps the models and the surrogate fit in agreement about what
"the KV a decode reads" or "the quadratic prefill term" means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import BatchView
from kvsched.costmodel.small import SMALL, isum

#: Phase.DECODE; kept literal so cost models do not import the schedule package.
DECODE = 1


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """Sums over one batch (refill counts as prefill).

    Parameters
    ----------
    tokens
        Tokens processed, sum of c over all items (the token load).
    n_decode
        Number of decode items.
    decode_kv
        KV tokens read by the decodes: sum of m over decode items.
    n_prefill
        Number of prefill and refill items.
    prefill_tokens
        Sum of c over prefill and refill items.
    prefill_quad
        Sum of c^2 + 2mc over prefill and refill items (InferMax's refined
        quadratic term; it telescopes to I^2 over a prompt's chunks).
    prefill_kv
        Sum of m over prefill and refill items (KV read by the chunks).
    prefill_sq
        Sum of c^2 over prefill and refill items.
    """

    tokens: float
    n_decode: float
    decode_kv: float
    n_prefill: float
    prefill_tokens: float
    prefill_quad: float
    prefill_kv: float
    prefill_sq: float

    @classmethod
    def of(cls, view: BatchView) -> BatchFeatures:
        c, m = view.tokens, view.context
        if c.dtype.kind in "iu" and m.dtype.kind in "iu":
            dec = view.phases == DECODE
            return cls.of_counts(c, m, dec, int(np.count_nonzero(dec)), isum(c))
        return cls._of_floats(view)

    @classmethod
    def of_counts(
        cls, c: np.ndarray, m: np.ndarray, dec: np.ndarray, n_decode: int, tokens: int
    ) -> BatchFeatures:
        """The sums of integer tokens ``c`` and KV ``m``, given what the caller has counted already.

        ``dec`` marks the decodes, ``n_decode`` counts them and ``tokens`` is the sum of ``c``
        (the core has all three when it prices a batch). Integer sums, then floats: the same
        values as :meth:`_of_floats` (every sum is an exact integer below 2**53 either way),
        in fewer and cheaper calls; this runs once per simulated batch.
        """
        size = int(c.size)
        if n_decode == size:
            return cls(float(tokens), float(size), float(isum(m)), 0.0, 0.0, 0.0, 0.0, 0.0)
        if size <= SMALL:
            # One pass over the lists: cheaper than a dozen numpy calls on a few items, and the same
            # exact integer sums (Python ints), hence the same floats.
            decode_kv = chunk = quad = kv = sq = 0
            for ci, mi, di in zip(c.tolist(), m.tolist(), dec.tolist(), strict=True):
                if di:
                    decode_kv += mi
                else:
                    chunk += ci
                    sq += ci * ci
                    quad += ci * mi
                    kv += mi
            fsq = float(sq)
            return cls(
                float(tokens),
                float(n_decode),
                float(decode_kv),
                float(size - n_decode),
                float(chunk),
                fsq + 2.0 * float(quad),
                float(kv),
                fsq,
            )
        if n_decode:
            pre = ~dec
            cp, mp = c[pre], m[pre]
            decode_kv = float(isum(m[dec]))
        else:
            cp, mp = c, m
            decode_kv = 0.0
        sq = float(isum(cp * cp))
        return cls(
            tokens=float(tokens),
            n_decode=float(n_decode),
            decode_kv=decode_kv,
            n_prefill=float(size - n_decode),
            prefill_tokens=float(isum(cp)),
            prefill_quad=sq + 2.0 * float(isum(cp * mp)),
            prefill_kv=float(isum(mp)),
            prefill_sq=sq,
        )

    @classmethod
    def _of_floats(cls, view: BatchView) -> BatchFeatures:
        c = view.tokens.astype(np.float64)
        m = view.context.astype(np.float64)
        # Dot products with 0/1 phase weights instead of boolean indexing: this runs once per batch.
        d = (view.phases == DECODE).astype(np.float64)
        cp = c - c * d  # chunk sizes of prefill and refill items, 0 for decodes
        n_decode = float(d.sum())
        sq = float(cp @ c)
        return cls(
            tokens=float(c.sum()),
            n_decode=n_decode,
            decode_kv=float(m @ d),
            n_prefill=float(c.size - n_decode),
            prefill_tokens=float(cp.sum()),
            prefill_quad=sq + 2.0 * float(cp @ m),
            prefill_kv=float(m.sum() - m @ d),
            prefill_sq=sq,
        )
