"""The cost-model protocol: the time a batch takes, given what it processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


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
