"""Unit time: every batch lasts one slot (seed 004, the MC-SF paper's model)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import BatchView


@dataclass(frozen=True, slots=True)
class UnitCost:
    """Every non-empty batch takes exactly ``slot`` time units (default 1)."""

    slot: float = 1.0
    name: str = "unit"

    def __post_init__(self) -> None:
        # A slot of 0 or less would make batches free or time run backwards; refused here so that the
        # factory and coefficient files fail with this message, not a later one about a missing term.
        if not (math.isfinite(self.slot) and self.slot > 0):
            raise ValueError(f"cost model unit: slot must be a finite number > 0, got {self.slot}")

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
