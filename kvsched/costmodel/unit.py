"""Unit time: every batch lasts one slot (seed 004, the MC-SF paper's model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import BatchView


@dataclass(frozen=True, slots=True)
class UnitCost:
    """Every non-empty batch takes exactly ``slot`` time units (default 1)."""

    slot: float = 1.0
    name: str = "unit"

    def batch_time(self, view: BatchView) -> float:
        return self.slot

    def time_of_counts(
        self,
        tokens: np.ndarray,
        context: np.ndarray,
        phases: np.ndarray,
        is_decode: np.ndarray,
        num_decodes: int,
        num_tokens: int,
    ) -> float:
        """:meth:`batch_time` from the caller's counts (:func:`~kvsched.costmodel.base.time_of_counts`)."""
        return self.slot

    def decode_run_times(self, context: np.ndarray, k: int) -> np.ndarray:
        """Every batch of a decode run lasts one slot."""
        return np.full(k, self.slot, dtype=np.float64)

    def chunk_run_times(
        self, context: np.ndarray, chunk_context: int, chunk_tokens: int, k: int, last: int = 0
    ) -> np.ndarray:
        """Every batch of a mixed run lasts one slot."""
        return np.full(k, self.slot, dtype=np.float64)
