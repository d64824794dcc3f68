"""Combinatorial lower bounds: a certified gap without solving.

Valid for **every** legal schedule of the instance (chunking and evictions
included), under the unit time model, where every batch lasts one slot:

* *isolated service*: request i needs at least ``b_i = max(1, ceil(I_i / q)) + O_i - 1``
  batches, q = min(C, P) (its prompt in chunks of at most q tokens, the last of
  which generates its first token, then one decode per batch), so it completes
  no earlier than ``a_i + b_i``. Without a budget q is infinite and the prompt
  still takes one batch.
* *KV area*: in slot ``u`` of its decodes it holds at least ``I + u`` KV tokens
  (its first token is generated once all I prompt tokens are held), so it
  occupies at least ``A_i = sum_{u=0}^{O-1} (I + u)`` token-slots (prefill
  chunks only add to this). At most M token-slots fit in a slot, so the k-th
  completion comes no earlier than ``ceil((sum of the k smallest A) / M)``
  slots after the first arrival (batches do not overlap, so that many whole
  batches must have run).
* *token work*: ``sum_i (I_i + O_i - 1)`` tokens at most C per slot.

The sorted completion times dominate each sorted bound vector componentwise,
hence the total-latency bound ``sum_k max(...) - sum_i a_i``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel import UnitCost
from kvsched.errors import InputError
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.validate import instance_cost_model


@dataclass(frozen=True, slots=True)
class LowerBounds:
    """Lower bounds on each objective (in the instance's time unit), and their ingredients."""

    total_latency: float
    makespan: float
    sum_ttft: float
    isolated: float  # sum of isolated service latencies
    area: float  # KV-area bound on total latency
    makespan_area: float
    makespan_tokens: float

    def for_objective(self, name: str) -> float:
        return {"total-latency": self.total_latency, "makespan": self.makespan, "sum-ttft": self.sum_ttft}[
            name
        ]


def lower_bounds(instance: Instance) -> LowerBounds:
    """Lower bounds for ``instance`` (unit time model only)."""
    expect_instance(instance)  # (its fields checked: an impossible one is one error, not a wrong bound)
    cost = instance_cost_model(instance)
    if not isinstance(cost, UnitCost):
        raise InputError(f"combinatorial bounds need the unit time model, not {cost.name!r}")
    slot = cost.slot
    lim = instance.limits
    prompt = np.array([r.prompt for r in instance.requests], dtype=np.float64)
    output = np.array([r.output for r in instance.requests], dtype=np.float64)
    arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64) / slot
    first = arrival  # batches may start at any time, not only on a slot grid
    chunk = min(c for c in (lim.max_batch_tokens, lim.max_prefill_tokens, math.inf) if c is not None)
    # The prompt takes at least one batch even without a budget (q infinite makes ceil(I/q) = 0).
    prefill_batches = np.maximum(1.0, np.ceil(prompt / chunk))
    batches = prefill_batches + output - 1
    alone = first + batches  # completion slot of a request alone
    first_token = first + prefill_batches

    area = output * prompt + output * (output - 1) / 2
    start = float(first.min())
    by_area = start + np.ceil(np.cumsum(np.sort(area)) / lim.kv_capacity)
    completions = np.maximum(np.sort(alone), by_area)
    total_latency = float(completions.sum() - arrival.sum())
    isolated = float((alone - arrival).sum())
    area_total = float(by_area.sum() - arrival.sum())

    makespan_area = float(start + math.ceil(area.sum() / lim.kv_capacity))
    tokens = float((prompt + output - 1).sum())
    makespan_tokens = float(start + math.ceil(tokens / lim.max_batch_tokens)) if lim.max_batch_tokens else 0.0
    makespan = max(float(alone.max()), makespan_area, makespan_tokens)
    return LowerBounds(
        total_latency=slot * max(total_latency, isolated),
        makespan=slot * makespan,
        sum_ttft=slot * float((first_token - arrival).sum()),
        isolated=slot * isolated,
        area=slot * area_total,
        makespan_area=slot * makespan_area,
        makespan_tokens=slot * makespan_tokens,
    )
