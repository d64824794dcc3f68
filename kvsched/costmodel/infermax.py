"""The InferMax linear batch-time model (seed 003, Sec. 3.2).

The paper gives the terms but no equation and no coefficients; this is the
reconstruction in ``shared/notes/003_004.md`` (A2)::

    T(B) = a0 + a1 * sum_{r in B} c_r                                  # non-attention
         + [B has a decode]  * (b0 + b1 * sum_{r decode} m_r)           # decode attention
         + [B has a prefill] * (p0 + p1 * sum_{r prefill} (c_r^2 + 2 m_r c_r)
                                   + p2 * sum_{r prefill} m_r + p3 * |B_prefill|)

where c_r is the tokens processed for r in the batch and m_r the KV it holds
before the batch (a decode reads m_r KV tokens; the paper's "r.m"). Refill chunks
count as prefill. Coefficients are whole-model seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvsched.costmodel.base import BatchView

_DECODE = 1  # Phase.DECODE; kept literal so cost models do not import the schedule package
_sum = np.add.reduce  # the ufunc itself: the ndarray method's Python layer costs more on small batches


@dataclass(frozen=True, slots=True)
class InfermaxLinear:
    """InferMax's linear cost model.

    The defaults are **placeholders**: a rough whole-model least-squares fit to
    the bundled Vidur profiling data for Llama-2-7B on one A100 (non-attention
    operators x 32 layers; the 400-row attention sample), in seconds. The
    calibrated coefficients come from ``kvsched calibrate``.

    Parameters
    ----------
    a0, a1
        Non-attention bias and per-token slope.
    b0, b1
        Decode-attention bias and slope per KV token read.
    p0, p1, p2, p3
        Prefill-attention bias, slope on sum(c^2 + 2mc), slope on the KV read by
        chunks (sum m), and cost per prefill request.
    """

    a0: float = 3.5e-3
    a1: float = 6.4e-5
    b0: float = 1.9e-3
    b1: float = 2.7e-7
    p0: float = 2.0e-3
    p1: float = 3.9e-9
    p2: float = 0.0
    p3: float = 1.0e-4
    name: str = "infermax-linear"

    def __post_init__(self) -> None:
        for key, value in self.coefficients().items():
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"cost model infermax-linear: coefficient {key} must be >= 0, got {value}")

    def coefficients(self) -> dict[str, float]:
        out = asdict(self)
        out.pop("name")
        return out

    def batch_time(self, view: BatchView) -> float:
        c = view.tokens
        m = view.context
        dec = view.phases == _DECODE
        num_decodes = int(np.count_nonzero(dec))
        t = self.a0 + self.a1 * float(_sum(c))
        if num_decodes:
            t += self.b0 + self.b1 * float(_sum(m[dec] if num_decodes < dec.size else m))
        num_prefills = dec.size - num_decodes
        if num_prefills:
            pre = ~dec
            cp = c[pre].astype(np.float64)
            mp = m[pre].astype(np.float64)
            t += (
                self.p0
                + self.p1 * float(_sum(cp * cp + 2.0 * mp * cp))
                + self.p2 * float(_sum(mp))
                + self.p3 * float(num_prefills)
            )
        return t

    def decode_run_times(self, context: np.ndarray, k: int) -> np.ndarray:
        """:meth:`batch_time` of ``k`` decode batches with KV ``context + j``, in its exact float order."""
        n = int(context.size)
        base = self.a0 + self.a1 * float(n)
        kv = float(_sum(context)) + float(n) * np.arange(k, dtype=np.float64)  # exact: integers < 2**53
        return base + (self.b0 + self.b1 * kv)

    def chunk_run_times(
        self, context: np.ndarray, chunk_context: int, chunk_tokens: int, k: int, last: int = 0
    ) -> np.ndarray:
        """:meth:`batch_time` of ``k`` mixed batches (decodes with KV ``context + j``, then one chunk of
        c tokens on m + j c; ``last`` tokens in the last batch if ``last`` > 0), in its float order
        on Python floats (one chunk: its sums are its own values)."""
        n = int(context.size)
        kv0, m0, step = int(_sum(context)) if n else 0, int(chunk_context), int(chunk_tokens)
        out = []
        for j in range(k):
            c = float(last if last and j == k - 1 else step)
            m = float(m0 + j * step)
            t = self.a0 + self.a1 * float(n + c)
            if n:
                t += self.b0 + self.b1 * float(kv0 + n * j)
            t += self.p0 + self.p1 * (c * c + 2.0 * m * c) + self.p2 * m + self.p3 * 1.0
            out.append(t)
        return np.array(out, dtype=np.float64)
