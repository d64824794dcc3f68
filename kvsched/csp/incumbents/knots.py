"""Token caps at the cliffs of a cost model's token term: batches that stop short of a step.

A calibrated token term N(tau) is a staircase on a line (GEMM kernels switch tile
shapes at a few token loads), and its steps can be large: the shipped
``llama-2-7b_a100-80gb_tp1`` set charges 23.5 ms for 384 tokens and 30.6 ms for
385. A schedule that fills every batch up to the budget C = 512 pays such a step
in most batches, for a handful of extra tokens. Capping the batch at the knot
below a cliff keeps the tokens per second high (384 tokens cost 0.061 ms each,
512 cost 0.064 ms) and the batches shorter, which every decoding request waits
through. Measured on the A100 rows of ``benchmarks/regret_scale.py`` (Azure
conversations, 6.15 requests/s, C = P = 512), the best of the eight greedy
variants for seconds-based models, greedy alone: 1k 17,721 at the budget, 15,483
capped at 384; 10k 1.016e6 and 8.737e5 (sarathi with its budget at 384: 16,358
against 19,277 at 1k).
"""

from __future__ import annotations

import numpy as np

from kvsched.costmodel.base import CostModel
from kvsched.csp.incumbents.rules import kv_area
from kvsched.instances.model import Instance, Limits
from kvsched.schedule.data import ProblemData

#: A knot is a cliff when the token term jumps by at least this share of its value there.
CLIFF = 0.1
#: Caps are looked for from this share of the budget up (smaller batches waste the fixed cost).
LOWEST = 0.25
#: At most this many caps, the most token-efficient first.
MOST = 2


def token_caps(cost_model: CostModel, limits: Limits, most: int = MOST) -> tuple[int, ...]:
    """Token loads just below the cliffs of ``cost_model``'s token term, under the token budget.

    A load ``k`` qualifies when ``N(k + 1) - N(k) >= CLIFF * N(k)`` and ``LOWEST * B <= k < B``,
    with ``B = min(C, P)``; they are ranked by the time per token ``N(k) / k``. Empty for a model
    without a stepped token term (linear, roofline) and for an instance without a token budget.
    """
    token_term = getattr(cost_model, "non_attention", None)
    budgets = [b for b in (limits.max_batch_tokens, limits.max_prefill_tokens) if b is not None]
    if token_term is None or not budgets or getattr(cost_model, "is_linear", False):
        return ()
    budget = int(min(budgets))
    tau = np.arange(1, budget + 1, dtype=np.float64)
    value = np.asarray(token_term(tau), dtype=np.float64)
    jump = value[1:] - value[:-1]  # N(k + 1) - N(k) for k = 1 .. B - 1
    k = tau[:-1]
    cliff = (jump >= CLIFF * value[:-1]) & (k >= LOWEST * budget) & (value[:-1] > 0)
    if not cliff.any():
        return ()
    loads = k[cliff]
    per_token = value[:-1][cliff] / loads
    order = np.argsort(per_token, kind="stable")[:most]
    return tuple(int(loads[i]) for i in order)


#: The params key of a greedy schedule whose key was scaled by :func:`prompt_scale`.
PROMPT_WEIGHTED = "prompt_weighted"


def prompt_scale(instance: Instance, cost_model: CostModel, token_cap: int) -> np.ndarray | None:
    """Per-request factors on the remaining-area key that add a prompt's cost: ``1 + w I / A``.

    ``A = O I + O (O - 1) / 2`` is the request's KV area, so a waiting request's key becomes
    ``A + w I``: its work in seconds over ``b1``, the seconds one KV token adds to a decode, where
    ``w = (N(cap) / cap) / b1`` prices a prompt token at the token term's time per token at the cap
    (226 for the A100 set at 384: a prompt token costs as much as 226 KV tokens of decode attention).
    Plain remaining area ranks a long prompt with a short output as small. None where the cost model
    has no token term or no per-KV-token decode cost.
    """
    token_term = getattr(cost_model, "non_attention", None)
    b1 = float(getattr(cost_model, "b1", 0.0))
    if token_term is None or b1 <= 0.0 or token_cap <= 0:
        return None
    weight = float(token_term(float(token_cap))) / token_cap / b1
    data = ProblemData.of(instance)
    prompt = data.prompt.astype(np.float64)
    area = np.maximum(kv_area(prompt, data.output), 1.0)
    return 1.0 + weight * prompt / area
