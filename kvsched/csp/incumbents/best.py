"""The best incumbent within a deadline: greedy variants first, then the fast registered policies."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.incumbents.base import Incumbent
from kvsched.csp.incumbents.greedy import greedy
from kvsched.csp.objectives import objective_function
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline

#: Greedy variants (rule, preempt, lookahead) when eviction is free (unit time, no token budget):
#: the first always runs. Notes 005 Sec. 2: smallest remaining area first, preemptive, is best there.
FREE_EVICTION_VARIANTS: tuple[tuple[str, bool, int], ...] = (
    ("remaining-area", True, 0),
    ("remaining-area", False, 0),
    ("area", True, 0),
    ("area", False, 0),
    ("remaining-output", True, 0),
    ("fcfs", False, 0),
)
#: ... and when an eviction costs (a refill takes budget tokens or time): admissions keep room for the
#: running requests' next decodes (measured: a lookahead of 64 tokens takes 28-45% off total latency
#: on 1k ShareGPT under infermax-linear with C = 512, against none).
COSTLY_EVICTION_VARIANTS: tuple[tuple[str, bool, int], ...] = (
    ("remaining-area", True, 64),
    ("remaining-area", True, 0),
    ("remaining-area", False, 16),
    ("remaining-area", True, 256),
    ("area", False, 64),
    ("remaining-area", False, 0),
)
#: The variants for an instance, first one first.
VARIANTS = {"free": FREE_EVICTION_VARIANTS, "costly": COSTLY_EVICTION_VARIANTS}


def eviction_is_free(instance: Instance, cost_model: CostModel) -> bool:
    """Whether a refill costs nothing: unit time and no token or prefill budget (notes 005 Sec. 2).

    The refill then re-appends I + G tokens in one batch that also generates, exactly like a decode
    (``tests/test_csp_incumbents.py`` checks it by replay).
    """
    lim = instance.limits
    return (
        isinstance(cost_model, UnitCost) and lim.max_batch_tokens is None and lim.max_prefill_tokens is None
    )


#: Registered policies cheap enough to try (each is one simulation through the core).
FAST_POLICIES: tuple[str, ...] = ("mcsf", "sarathi", "vllm-v1", "rank-o", "sarathi-ef")
#: A policy simulation is priced at this many times the greedy's build and replay (it steps the core too).
POLICY_COST_FACTOR = 4.0


def best_incumbent(
    instance: Instance,
    objective: str = "total-latency",
    deadline: Deadline | None = None,
    *,
    variants: Sequence[tuple[str, bool, int]] | None = None,
    policies: Sequence[str] = FAST_POLICIES,
    cost_model: CostModel | None = None,
) -> Incumbent:
    """The best validated schedule of the greedy variants and ``policies``, with its value and name.

    ``variants`` defaults to :data:`FREE_EVICTION_VARIANTS` or :data:`COSTLY_EVICTION_VARIANTS`
    (see :func:`eviction_is_free`). The first variant always runs (it is the first schedule of every time-limited solve; past
    the deadline it finishes in its cheapest mode). Each further candidate runs only if its
    estimated time, priced from the first variant's measured time, fits in what is left, so the
    deadline is kept without interrupting a policy mid-simulation. ``stats`` of the result
    lists every candidate tried (``tried``: name -> value) and those skipped for time.
    """
    deadline = deadline or Deadline.never()
    measure = objective_function(objective)
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    if variants is None:
        variants = VARIANTS["free" if eviction_is_free(instance, cost_model) else "costly"]
    tried: dict[str, float] = {}
    skipped: list[str] = []
    (rule, preempt, lookahead), *others = variants
    t0 = time.perf_counter()
    best = greedy(
        instance,
        rule,
        preempt=preempt,
        lookahead=lookahead,
        objective=objective,
        deadline=deadline,
        cost_model=cost_model,
    )
    greedy_cost = time.perf_counter() - t0
    tried[best.name] = best.value
    for rule, preempt, lookahead in others:
        if deadline.remaining() < 1.5 * greedy_cost:
            skipped.append(f"greedy:{rule}")
            continue
        cand = greedy(
            instance,
            rule,
            preempt=preempt,
            lookahead=lookahead,
            objective=objective,
            deadline=deadline,
            cost_model=cost_model,
        )
        tried[cand.name] = cand.value
        best = min(best, cand, key=lambda inc: inc.value)
    policy_cost = POLICY_COST_FACTOR * (best.stats["build_s"] + best.stats["replay_s"])
    for name in policies:
        if deadline.remaining() < 1.5 * policy_cost:
            skipped.append(f"policy:{name}")
            continue
        try:
            sim = simulate(instance, make_policy(name), cost_model)
        except KvschedError:
            continue  # a policy that cannot run this instance (stalls, needs predictions, ...)
        # simulate() stepped every batch through the core and ran until every request completed.
        value = measure(sim.trace)
        tried[f"policy:{name}"] = value
        if value < best.value:
            best = Incumbent(
                f"policy:{name}", sim.schedule, value, objective, {"runtime_s": sim.runtime}, sim.trace
            )
    stats = dict(best.stats)
    stats.update(tried=tried, skipped=skipped)
    return Incumbent(best.name, best.schedule, best.value, objective, stats, best.trace)
