"""A bound in seconds from a bound in batches: every batch pays its fixed part, for every request still open.

Valid for every legal schedule of an instance under a seconds-based cost model with a separable lower
bound (:mod:`.separable`), for total latency.

**Argument.** Number the batches k = 1, 2, ... in order (the core gives every batch an item), and let
``last_j`` be the one that generates request j's last token. Batches do not overlap and start at time
>= 0, so ``C_j >= sum_{k <= last_j} T_k``. Under a separable form, a batch with an item lasts
``T_k >= F + G_k`` with ``F = fixed + min(fixed_decode, fixed_prefill)`` (it holds a decode or a
prefill) and ``G_k`` the sum of its items' own terms ``g``. Hence

    sum_j C_j  >=  F sum_j last_j  +  sum_j sum_{k <= last_j} G_k.

*First term.* The batches, one per slot and in order, form a legal schedule of the **unit-time copy**
of the instance with every arrival at 0 (same limits; a batch's legality does not depend on its time
once every request has arrived), in which request j completes at slot ``last_j``. So ``sum_j last_j``
is at least any valid bound on that copy's total latency (the unit portfolio, the chain Lagrangian).

*Second term.* Every item of request j lies in a batch ``<= last_j``, so ``sum_{k <= last_j} G_k`` is at
least the own work ``W_j`` (its least total of ``g``: the prompt's chunks and, per later token, the
cheaper of a decode and a whole refill) of every request completed no later than j; summed over j this
is at least the shortest-first sum ``sum_p (W_(1) + ... + W_(p))``.

Both terms are minimised separately (a relaxation), and total latency subtracts the arrivals. It is
strong when everything arrives early and memory or the token budget makes requests wait (many batches
per request); with arrivals spread over time the subtracted arrivals dominate and it is weak.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvsched.csp.bounds.lp_model import exclusive_cumsum
from kvsched.csp.bounds.seconds import Tokens, prompt_isolated, token_costs
from kvsched.csp.bounds.separable import Separable, separable_forms
from kvsched.instances.model import Instance, TimeModel
from kvsched.schedule.validate import instance_cost_model

#: The bound's source name.
SOURCE = "batch-count (seconds)"


def unit_copy(instance: Instance) -> Instance:
    """The unit-time copy with every request arriving at 0 (same limits): its total latency is sum_j last_j."""
    return replace(
        instance,
        time_model=TimeModel("unit"),
        requests=tuple(replace(r, arrival=0.0) for r in instance.requests),
    )


def _own_work(form: Separable, tok: Tokens) -> np.ndarray:
    """W_j: the least total of j's items' own terms (no fixed part: that is shared by the batch)."""
    g = replace(form, fixed=0.0, fixed_decode=0.0, fixed_prefill=0.0)
    return prompt_isolated(g, tok) + tok.over_tokens(exclusive_cumsum(token_costs(g, tok.grid, tok.q_cap)))


def batch_count_bound(instance: Instance, unit_batches: float) -> float | None:
    """The bound on total latency (seconds) given ``unit_batches``, a lower bound on the unit copy's total
    latency (:func:`unit_copy`, slot length 1). None for a cost model with no separable form."""
    lim = instance.limits
    kv = lim.kv_blocks * lim.block_size
    forms = separable_forms(instance_cost_model(instance), int(min(kv, lim.max_batch_tokens or kv)))
    if not forms or not len(instance):
        return None
    tok = Tokens.of(instance)
    best = -np.inf
    for form in forms:
        fixed = form.fixed + min(form.fixed_decode, form.fixed_prefill)
        shortest_first = float(np.cumsum(np.sort(_own_work(form, tok))).sum())
        best = max(best, fixed * float(unit_batches) + shortest_first)
    return max(0.0, best - float(tok.arrival.sum()))
