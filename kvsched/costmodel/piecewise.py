"""Token-load models of seed 001 (Sec. 2.1 and its notes): hinge and staircase.

Both say that a batch's time depends only on its token load, the tokens it
processes (prefill, refill and decode alike), and not on the prefill/decode mix
or on the KV the batch reads. They are the models under which seed 001 proves
that work-conserving schedulers are throughput-optimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import BatchView


def _check(name: str, **values: float) -> None:
    for key, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"cost model {name}: {key} must be a finite number >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class HingeCost:
    """Seed 001 Eq. (2.3), as reconstructed: ``t = c + a * max(0, tokens - b0)``.

    Flat at ``c`` while the batch is memory-bound (below ``b0`` tokens), then
    ``a`` per token. The seed's calibrated values were lost in extraction. The
    parameters are seconds, as for every model but ``unit`` (the metrics and
    reports read the times as seconds); the defaults, one second a batch, are
    only a shape.

    Parameters
    ----------
    c
        Time of any batch up to ``b0`` tokens.
    a
        Time per token above ``b0``.
    b0
        Token load at which the batch becomes compute-bound.
    """

    c: float = 1.0
    a: float = 0.0
    b0: float = 0.0
    name: str = "hinge"

    def __post_init__(self) -> None:
        _check(self.name, c=self.c, a=self.a, b0=self.b0)

    def batch_time(self, view: BatchView) -> float:
        tokens = float(np.sum(view.tokens))
        return self.c + self.a * max(0.0, tokens - self.b0)

    def decode_run_times(self, context: np.ndarray, k: int) -> np.ndarray:
        """A decode run keeps its token load, so every batch lasts the same."""
        return np.full(k, self.c + self.a * max(0.0, float(context.size) - self.b0), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class StaircaseCost:
    """Seed 001 v3's staircase: ``t = c + a * ceil(tokens / b0)``.

    Each started block of ``b0`` tokens costs ``a``: one token costs as much as
    ``b0``. The seed's notes quote CodeLlama-34B on one A100-80GB:
    c = 11.28 ms, a = 35.47 ms, b0 = 128, so t(512) = 153.16 ms (in seconds,
    as every model but ``unit``: c = 0.01128, a = 0.03547).

    Parameters
    ----------
    c
        Fixed time per batch.
    a
        Time per started block of ``b0`` tokens.
    b0
        Block size in tokens (> 0).
    """

    c: float = 0.0
    a: float = 1.0
    b0: float = 128.0
    name: str = "staircase"

    def __post_init__(self) -> None:
        _check(self.name, c=self.c, a=self.a, b0=self.b0)
        if self.b0 <= 0:
            raise ValueError(f"cost model staircase: b0 must be > 0, got {self.b0}")

    def batch_time(self, view: BatchView) -> float:
        tokens = float(np.sum(view.tokens))
        return self.c + self.a * math.ceil(tokens / self.b0)

    def decode_run_times(self, context: np.ndarray, k: int) -> np.ndarray:
        """A decode run keeps its token load, so every batch lasts the same."""
        return np.full(k, self.c + self.a * math.ceil(float(context.size) / self.b0), dtype=np.float64)
