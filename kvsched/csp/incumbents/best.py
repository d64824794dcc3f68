"""The best incumbent within a deadline: greedy variants first, then the fast registered policies."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.incumbents._kernel import advance_jit
from kvsched.csp.incumbents.admission import LOWEST as LOWEST_CAP
from kvsched.csp.incumbents.admission import peak_running, running_cap_search
from kvsched.csp.incumbents.base import Incumbent, Unbuilt, confirmed, eviction_is_free, replay_seconds
from kvsched.csp.incumbents.complete import SECONDS_PER_REQUEST, reserved_batches
from kvsched.csp.incumbents.greedy import greedy, interpreted_seconds, run_estimate
from kvsched.csp.incumbents.knapsack import KnapsackConfig, knapsack
from kvsched.csp.incumbents.knapsack import applies as knapsack_applies
from kvsched.csp.incumbents.knots import PROMPT_WEIGHTED, prompt_scale, token_caps
from kvsched.csp.incumbents.rules import RULES
from kvsched.csp.objectives import objective_function
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance
from kvsched.jit import compile_seconds, is_compiled
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline


@dataclass(frozen=True, slots=True)
class Variant:
    """One greedy configuration: the keyword arguments of :func:`~kvsched.csp.incumbents.greedy.greedy`."""

    rule: str
    preempt: bool
    lookahead: int = 0
    refill_weight: float = 0.0
    min_chunk: int = 0
    fit_chunk: bool = False
    fill: bool = False
    token_cap: int = 0
    #: At most this many requests holding KV (0: the instance's own limit; :mod:`~kvsched.csp.incumbents.admission`).
    running_cap: int = 0
    #: Add to a request's remaining-area key what its prompt costs, in KV-token decodes (:func:`prompt_scale`).
    prompt_weighted: bool = False

    def kwargs(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("rule", "prompt_weighted")
        }


#: Greedy variants when eviction is free (unit time, no token budget): the first always runs.
#: Notes 005 Sec. 2: smallest remaining area first, preemptive, is best there. Each fills its batches
#: (``fill``): on 27 1k instances (ShareGPT, Azure conv/code; memory loads 0.9-1.1; 3 arrival seeds) each
#: variant's total latency falls 1.3-12.6% (geometric means), the best of the six 1.35% (lower on all 27);
#: 60 s solves of the rho = 1 rows: Azure conv 489,603 -> 464,691, ShareGPT 353,231 -> 351,391.
FREE_EVICTION_VARIANTS: tuple[Variant, ...] = (
    Variant("remaining-area", True, fill=True),
    # The preemptive rules first: at 10k requests (memory load 1) only three or four variants fit a 60 s
    # solve's share, each preemptive one was best on one trace (ShareGPT remaining-area 4.60e6, Azure
    # conversations area 2.91e7, Azure code remaining-output 4.78e5), and no non-preemptive one came
    # within 10% (ShareGPT 5.15e6, Azure conversations 5.70e7).
    Variant("area", True, fill=True),
    Variant("remaining-output", True, fill=True),
    # Filling is not always better: on Azure code 10k (memory load 1) remaining-output without it gives
    # 462,276 against 478,125 with it.
    Variant("remaining-output", True),
    Variant("remaining-area", False, fill=True),
    Variant("area", False, fill=True),
    Variant("fcfs", False, fill=True),
)
#: ... and when an eviction costs time (seconds-based cost models): admissions keep room for the
#: running requests' next decodes (measured: a lookahead of 64 tokens takes 28-45% off total latency
#: on 1k ShareGPT under infermax-linear with C = 512, against none).
COSTLY_EVICTION_VARIANTS: tuple[Variant, ...] = (
    Variant("remaining-area", True, 64),
    Variant("remaining-area", True, 0),
    Variant("remaining-area", False, 16),
    Variant("remaining-area", True, 256),
    Variant("area", False, 64),
    Variant("remaining-area", False, 0),
    # Refill-weighted, with a real first chunk (see BUDGET_VARIANTS): on the six chunked infermax-linear
    # rows of docs/regret_scale.md (C = P = 64) the better of these two is 0.5-6.4% below the six above,
    # greedy alone.
    Variant("remaining-area", True, 16, 4.0, 32, True),
    Variant("remaining-area", False, 0, 16.0, 32, True),
)
#: Where the cost model's token term has cliffs under the budget (:func:`~kvsched.csp.incumbents.knots.token_caps`),
#: these variants run at each cap (:func:`variants_for`): on the A100 rows (Azure conversations,
#: C = P = 512) the first of them capped at 384 tokens is the best greedy at 1k and 10k (15,483 and 8.737e5,
#: against 17,721 and 1.016e6 for the best uncapped variant).
CAPPED_VARIANTS: tuple[Variant, ...] = (
    # Its key weighs the prompt in (:func:`prompt_scale`): on the same rows 14,498 and 7.242e5 (-6.4% and
    # -17.1% against the next one, 15,483 and 8.737e5); at 1k the local search after it (30 s) found
    # nothing better (the next one's went to 15,408). The A100 rows are overloaded (the work arrived
    # exceeds the GPU's time from about 40 s on), where ranking by work in seconds pays.
    Variant("remaining-area", False, 16, prompt_weighted=True),
    Variant("remaining-area", False, 16),
    Variant("remaining-area", False, 0),
    Variant("remaining-area", True, 64),
)
#: ... and under unit time with a token budget, where a refill of m tokens takes ceil(m / C) batches of
#: budget: holders are ranked by what evicting them costs (``refill_weight``), long prompts start only
#: with a real first chunk and started ones go on with what the KV holds (docs/regret_scale.md). The
#: costly variants follow, for the instances where they are best.
BUDGET_VARIANTS: tuple[Variant, ...] = (
    Variant("remaining-area", True, 0, 256.0, 256, True),
    Variant("remaining-area", False, 0, 64.0, 256, True),
    Variant("remaining-area", False, 0, 0.0, 256, True),
    Variant("remaining-area", True, 0, 64.0, 256, True),
    Variant("remaining-area", False, 0),
    Variant("remaining-area", True, 64),
    Variant("remaining-area", False, 16),
    Variant("remaining-area", True, 0, 16.0, 256, True),
    Variant("remaining-area", False, 0, 256.0, 256, True),
    Variant("remaining-area", True, 0),
    Variant("remaining-area", True, 256),
    Variant("area", False, 64),
)
#: The variants for an instance, first one first (:func:`variant_kind`).
VARIANTS = {"free": FREE_EVICTION_VARIANTS, "costly": COSTLY_EVICTION_VARIANTS, "budget": BUDGET_VARIANTS}


def variants_for(instance: Instance, cost_model: CostModel) -> tuple[Variant, ...]:
    """The greedy variants :func:`best_incumbent` runs on ``instance``, first one first.

    :data:`VARIANTS` of its :func:`variant_kind`; under a seconds-based model whose token term has
    cliffs below the budget, :data:`CAPPED_VARIANTS` at the most token-efficient cap come first and at
    the others last (on the A100 rows the second cap, 256, was never the best; on the H100 fit at a
    lighter load every capped variant lost to the uncapped ones by 4-6%).
    """
    kind = variant_kind(instance, cost_model)
    caps = token_caps(cost_model, instance.limits) if kind == "costly" else ()
    first, rest = (caps[:1], caps[1:]) if caps else ((), ())
    head = tuple(replace(v, token_cap=cap) for cap in first for v in CAPPED_VARIANTS)
    tail = tuple(replace(v, token_cap=cap) for cap in rest for v in CAPPED_VARIANTS)
    return head + VARIANTS[kind] + tail


def run_variant(
    instance: Instance, variant: Variant, cost_model: CostModel, **kwargs: Any
) -> Incumbent | Unbuilt:
    """The greedy's schedule for ``variant`` (its key scaled and its name saying so where prompt-weighted).

    Parameters
    ----------
    instance
        The instance.
    variant
        The greedy's rule and parameters.
    cost_model
        The instance's cost model.
    **kwargs
        Further keyword arguments of :func:`~kvsched.csp.incumbents.greedy.greedy` (objective, deadline,
        replay_schedule, build).

    Returns
    -------
    Incumbent or Unbuilt
        The greedy's validated schedule (unbuilt with ``build=False``); a prompt-weighted one says so in its
        params and its name.
    """
    scale = prompt_scale(instance, cost_model, variant.token_cap) if variant.prompt_weighted else None
    cand = greedy(instance, variant.rule, **variant.kwargs(), scale=scale, cost_model=cost_model, **kwargs)
    if scale is None:
        return cand
    name = cand.name + "/prompt-weighted"
    if isinstance(cand, Unbuilt):
        built = cand.build
        return Unbuilt(name, cand.value, cand.objective, cand.stats, lambda: _prompt_weighted(built(), name))
    return _prompt_weighted(cand, name)


def _prompt_weighted(cand: Incumbent, name: str) -> Incumbent:
    """``cand`` named ``name``, its schedule's params saying that its key weighed the prompt in (for the
    local search to re-make it with the same weights under its own)."""
    meta = dict(cand.schedule.meta)
    meta["params"] = {**meta.get("params", {}), PROMPT_WEIGHTED: True}
    return replace(cand, schedule=replace(cand.schedule, meta=meta), name=name)


def variant_kind(instance: Instance, cost_model: CostModel) -> str:
    """Which :data:`VARIANTS` an instance gets.

    ``free`` where eviction is free (:func:`eviction_is_free`), ``budget`` under unit time with a token
    or prefill budget, ``costly`` under seconds-based cost models.
    """
    if eviction_is_free(instance, cost_model):
        return "free"
    return "budget" if isinstance(cost_model, UnitCost) else "costly"


#: Registered policies cheap enough to try (each is one simulation through the core).
FAST_POLICIES: tuple[str, ...] = ("mcsf", "sarathi", "vllm-v1", "rank-o", "sarathi-ef")
#: The *large* sizes start here under a token budget (without one at KNAPSACK_FREE_MIN_REQUESTS, see
#: :func:`_large`): the knapsack greedy takes its large configurations, KNAPSACK_LARGE_CANDIDATES candidates
#: and its fine re-runs, and the first variant's replay is deferred. Where eviction is free the knapsack runs
#: only from the large sizes on: alone it beats the filling greedy and that greedy's local search at 10k
#: (ShareGPT, memory load 1: 4.49e6 against 4.60e6 in a 60 s solve).
KNAPSACK_LARGE_MIN_REQUESTS = 5_000
#: Without a budget the large sizes (and so the knapsack greedy) start at this many requests: with its runs 3-4
#: times faster and at 8,192 cells it gives Azure conversations 1k, rho 1,
#: 457,620 alone against the filling greedy's local search's 463,290 in a minute (a 60 s solve: 9.04% ->
#: 7.67%); on Azure code and ShareGPT 1k the greedy's local search stays ahead and the solves' results are the
#: same within noise (10.71% / 1.34% against 10.65% / 1.31%).
KNAPSACK_FREE_MIN_REQUESTS = 500
#: Candidates a slot at the large sizes: as good as 64 at 10k in half the time
#: (ShareGPT 4.4919e6 both, Azure conversations 3.0759e7 against 3.0784e7, 3.4 s against 7 s; with the budget
#: C = P = 2048, Azure conversations 3.2746e7 against 3.2922e7 in 8.5 s against 15 s at load 3.5).
KNAPSACK_LARGE_CANDIDATES = 32
#: The knapsack greedy's configurations, in order (the first always, the others as time allows). Valuing
#: an item at w / key^power with power < 1 keeps M fuller, which pays where a long queue drains at the rate
#: the memory is used. Greedy alone at memory load 1 against the default (tail 0.25, power 1), 10k requests
#: (Azure code, Azure conversations, ShareGPT): (tail 0.5, power 0.2) -10.0 / -6.2 / -2.3% without a
#: budget and -6.5 / -2.4 / -1.6% at C = P = 2048; (1.0, 0.1) -13.5 / -3.0 / -0.9% and -7.4 / -1.5 / -0.8%.
#: At 1k and 100 requests they are within -1.6..+4% of the default, which then goes first.
KNAPSACK_CONFIGS: tuple[KnapsackConfig, ...] = (
    KnapsackConfig(),
    KnapsackConfig(0.5, 0.2),
    KnapsackConfig(1.0, 0.1),
)
#: At the large sizes the filling ones go first. Under a budget they also weigh
#: a holder's refill more (64) and start a long prompt with at least 512 tokens: at 10k requests and
#: C = P = 2048, against the best of the two filling configurations with the default 16 and 256, (0.5, 0.2)
#: gives Azure code -1.0 / -4.9 / -2.2% at memory loads 0.9 / 1 / 1.1, Azure conversations -1.5 / -1.6 /
#: -1.1%, ShareGPT +0.5 / +0.2 / +0.2%; (1.0, 0.1) Azure code +1.2 / -7.4 / -1.3%, Azure conversations
#: +0.2 / 0.0 / -0.2%. (Both are ignored without a budget.) At 1k they lose (Azure code +7.5% with 64 and
#: 512), so the 1k configurations keep the defaults.
KNAPSACK_LARGE_CONFIGS: tuple[KnapsackConfig, ...] = (
    KnapsackConfig(0.5, 0.2, 64.0, 512),
    KnapsackConfig(1.0, 0.1, 64.0, 512),
    KnapsackConfig(),
)
#: Where the first variant's replay is deferred, the first knapsack configuration runs only if this many
#: times that variant's decisions and build are left, a low estimate of its run (measured at memory load 1,
#: greedy alone, its decisions and build against the first large configuration's run: Azure code 10k 1.2 /
#: 1.6 without / with the budget, ShareGPT 10k about 5, ShareGPT 100k 4.1: 54 s against 13 s). Without it
#: the knapsack ran at 100k requests until the stage's end, was cut and finished against reserved peaks
#: (9.6e7 against the greedy's 7.29e7), and left the chain Lagrangian no time. 2, below most of those
#: ratios: at 10k a skip costs more than a run cut short (Azure code 10k with the budget: its configurations
#: 681k-700k against the greedy variants' 800k-1.1M in a 60 s solve).
KNAPSACK_PER_RUN = 2.0
#: From this many requests on, where the first variant's replay is deferred, the first knapsack configuration
#: may take the whole solve's time (``first_deadline``), not only this stage's share: at 100k requests the
#: share (about 17 s of a 60 s solve) cannot hold it beside the first greedy run (12 s), and its schedule is
#: the one the solve keeps (ShareGPT 100k at memory load 1: 5.35e7 against 7.29e7; 15.56% against 37.98%).
#: Below it the share holds it; at 10k requests all at 0 under a 10 s limit the solve's time would go to a
#: configuration that loses there (3.20e7 against 2.86e7) and leave the chain Lagrangian 0.8 s (0.27%
#: against 0.17%).
KNAPSACK_WHOLE_MIN_REQUESTS = 50_000
#: At the large sizes the FINE_RUNS configurations that did best run again at
#: FINE_CELLS capacity cells, as time allows: at 10k requests and memory load 1 the knapsack's resolution
#: is worth more than its local search (greedy alone, the two filling configurations at 1,024 / 8,192
#: cells: Azure conversations 2.887e7 / 2.818e7, -2.4%; ShareGPT -0.4%; Azure code -0.7%; with the budget
#: C = P = 2048 -0.4 / -0.3 / +0.3%; with the budget at 1k within +-1%, so those keep CELLS; without it
#: Azure conversations 1k -1.3%, which KNAPSACK_FREE_MIN_REQUESTS takes).
FINE_CELLS = 8192
FINE_RUNS = 2
#: A FINE_CELLS run is priced at this many times the same configuration's run at CELLS (measured at 10k
#: requests, load 1: 1.75-4.0).
FINE_COST = 4.0
#: The fine runs may use this share of what the whole solve (``first_deadline``) has left when they start,
#: where that is more than this stage's share leaves: at 10k requests the stage's 30% held one of the two on
#: Azure conversations (the skipped one, (1.0, 0.1), is the better: 2.818e7 against 2.838e7; at 35% it
#: was still skipped) and none under the budget, while the chain Lagrangian after them gains 0.1% from 31 s
#: to 40 s.
FINE_SHARE = 0.45
#: A policy simulation is priced at this many times the greedy's build and replay (it steps the core too).
POLICY_COST_FACTOR = 4.0
#: The policy whose schedule comes first where, under a seconds-based cost model, a greedy run would not
#: fit the deadline (:func:`~kvsched.csp.incumbents.greedy.run_estimate`): one simulation with coalesced
#: decode runs (14-20 s at 100k Azure conversation requests, where the greedy takes 82 s).
FIRST_POLICY = "sarathi"
#: ... and under unit time where the greedy's kernel is cold and neither its compile nor its interpreted run fits
#: (a fresh install under a short limit), the MC-SF paper's own policy first (FIRST_POLICY where it cannot run):
#: on ShareGPT 10k all at 0 under a 10 s limit, mcsf's 5.03e7 in 2.4 s against the interpreted greedy's run,
#: cut short and finished against reserved peaks, 7.25e7 in 32 s.
FIRST_UNIT_POLICY = "mcsf"


def _large(instance: Instance, kind: str) -> bool:
    """Whether ``instance`` is of the large sizes: KNAPSACK_LARGE_MIN_REQUESTS requests, or without a budget
    (``kind`` ``"free"``) KNAPSACK_FREE_MIN_REQUESTS."""
    threshold = KNAPSACK_LARGE_MIN_REQUESTS
    if kind == "free":
        threshold = min(threshold, KNAPSACK_FREE_MIN_REQUESTS)
    return len(instance) >= threshold


def best_incumbent(
    instance: Instance,
    objective: str = "total-latency",
    deadline: Deadline | None = None,
    *,
    variants: Sequence[Variant] | None = None,
    policies: Sequence[str] = FAST_POLICIES,
    cost_model: CostModel | None = None,
    running_caps: bool = True,
    first_deadline: Deadline | None = None,
    given: Incumbent | None = None,
) -> Incumbent:
    """The best validated schedule of the greedy variants and ``policies``, with its value and name.

    ``variants`` defaults to :func:`variants_for` (the instance's :data:`VARIANTS`, after capped ones
    where the token term has cliffs); under unit time
    with a token budget, and without one at the large sizes (:func:`_large`), the knapsack greedy
    (:mod:`~kvsched.csp.incumbents.knapsack`) runs after the first, in :data:`KNAPSACK_CONFIGS`
    (:data:`KNAPSACK_LARGE_CONFIGS` at the large sizes, then the best again at :data:`FINE_CELLS`): the
    first configuration wherever a replay still fits, the others as time allows (at the large sizes the
    first variant is valued on its log and replayed only if it stays the best). Under
    seconds-based cost models and with ``running_caps`` the best variant then runs under running caps as time
    allows (:func:`search_running_caps`: admission control, searched per instance; the pipeline runs it
    later, after its bounds). The
    first variant always runs (it is the first schedule of every time-limited solve; past the deadline it
    finishes in its cheapest mode, and where finishing would overrun ``first_deadline`` it is cut short and
    the requests it left run against reserved peaks, ``stats["cut_for_time"]`` saying how many), except
    under a seconds-based cost model where its run is expected to overrun what is left of ``first_deadline`` (default ``deadline``; the pipeline passes the whole solve's,
    since a first schedule may take more than its share; :func:`~kvsched.csp.incumbents.greedy.run_estimate`):
    then :data:`FIRST_POLICY`'s schedule is the result. Each further candidate runs only if its
    estimated time, priced from the first variant's measured time, fits in what is left, so the
    deadline is kept without interrupting a policy mid-simulation. ``stats`` of the result
    lists every candidate tried (``tried``: name -> value) and those skipped for time.

    ``given``: a validated schedule the caller holds already (a warm start, a policy's schedule). No first
    schedule is then needed: where the first variant's run (a high estimate) would overrun
    ``first_deadline``, or its kernel would have to be compiled, nothing runs and ``given`` is the result
    (every candidate listed as skipped for time). It is not compared with the candidates: the caller
    keeps the better of the two.
    """
    deadline = deadline or Deadline.never()
    objective_function(objective)  # an unknown objective is refused before any work
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    kind = variant_kind(instance, cost_model)
    if variants is None:
        variants = variants_for(instance, cost_model)
    tried: dict[str, float] = {}
    skipped: list[str] = []
    first_deadline = first_deadline or deadline
    if given is not None and first_deadline.bounded:
        cold = not is_compiled(advance_jit)
        if cold or run_estimate(instance, cost_model) > first_deadline.remaining():
            # A schedule is in hand: a run that would overrun (or a compile) only costs the limit.
            return _skipped(given, variants, policies)
    if (
        kind == "costly"
        and first_deadline.bounded
        and run_estimate(instance, cost_model) > first_deadline.remaining()
    ):
        # The greedy's run would overrun: the fast policy's schedule comes first instead (cut for time and
        # finished against reserved peaks where it would overrun too: a greedy run cut at once gave 646,705
        # on 10k requests under the A100 fit, sarathi's whole run 439,576 in about the same time), and
        # nothing else is expected to fit after it.
        return _policy_first(instance, objective, cost_model, variants, policies, first_deadline)
    if (
        first_deadline.bounded
        and not is_compiled(advance_jit)
        and min(compile_seconds([advance_jit]), interpreted_seconds(instance)) > first_deadline.remaining()
    ):
        # A cold kernel (a fresh install): compiling it would overrun, and so would the interpreted greedy (a
        # low estimate of its time says so). A fast policy's schedule comes first; `kvsched warmup` avoids this.
        first_policy = FIRST_UNIT_POLICY if isinstance(cost_model, UnitCost) else FIRST_POLICY
        try:
            return _policy_first(
                instance, objective, cost_model, variants, policies, first_deadline, first_policy
            )
        except KvschedError:  # (mcsf cannot run every instance)
            return _policy_first(instance, objective, cost_model, variants, policies, first_deadline)
    first, *others = variants
    large = _large(instance, kind)
    # At the large sizes (with or without a token budget) the knapsack greedy's schedules are mostly better than this one (docs/regret_scale.md), so it is valued on its log and
    # replayed only if it stays the best (a run cut short for time is replayed all the same): its replay
    # goes to the knapsack.
    deferred = kind in ("budget", "free") and large and knapsack_applies(instance, cost_model)
    cold = not is_compiled(advance_jit)
    t0 = time.perf_counter()
    # Where even this run would overrun the solve's limit (100k requests on a slow machine), it is cut short
    # and the requests it left are finished against reserved peaks (greedy.must_stop): poorer, but on time.
    best = run_variant(
        instance, first, cost_model, objective=objective, deadline=deadline, stop=first_deadline,
        replay_schedule=not deferred,
    )  # fmt: skip
    greedy_cost = time.perf_counter() - t0
    # The others are valued on their own logs (equal to the core's replay, tested) and only the best is
    # replayed at the end: a run then costs its decisions and build, about half of one with its replay
    # at 10k requests, so more variants fit the share. The replay this keeps in hand is the first's (or,
    # deferred, an estimate of it).
    # A deferred replay (the first variant's at the large sizes) is measured on the schedule's first entries:
    # priced at twice the run's decisions and build (their ratio at 10k requests: 1.5-1.8), it was 36 s
    # short on 100k requests on a slower machine, where the knapsack greedy then ran in its place.
    replay_cost = (
        float(best.stats["replay_s"])
        if best.trace is not None
        else replay_seconds(instance, best.schedule, cost_model)
    )
    if cold and is_compiled(advance_jit):
        # The first run compiled the kernel (seconds): price the others from its build and replay instead
        # (deciding takes less than those two), then from the runs themselves.
        greedy_cost = 2.0 * (best.stats["build_s"] + replay_cost)
    tried[best.name] = best.value
    first_run = best
    run_cost = greedy_cost if cold else float(best.stats["decide_s"] + best.stats["build_s"])
    # The later candidates are valued on their logs and left unbuilt (Unbuilt): the best is built and
    # replayed at the end, priced at the first's build and replay.
    finish_cost = float(best.stats["build_s"]) + replay_cost

    def fits(cost: float, until: Deadline = deadline) -> bool:
        return until.remaining() >= cost + finish_cost

    # The first run's peak of requests holding KV: where a running cap starts to bind (read only where caps
    # are searched).
    peak = peak_running(best.trace) if running_caps and kind == "costly" and best.trace is not None else 0
    if (kind == "budget" or (kind == "free" and large)) and knapsack_applies(instance, cost_model):
        # Under a token budget the knapsack greedy, which pins a started prefill to its next chunk and
        # prices what evicting a holder costs, beats the budget variants (C = P = 2048, 1k requests at
        # memory load 1: Azure code 43,335 against 46,613, Azure conversations 483,270 against 504,842).
        # Without a budget it is tried from KNAPSACK_FREE_MIN_REQUESTS on (at 1k the filling greedy's local
        # search still wins on two of three traces; the knapsack's fine runs on the third).
        extra = {"candidates": KNAPSACK_LARGE_CANDIDATES} if large else {}
        knapsack_cost = 0.0
        runs: list[tuple[float, float, KnapsackConfig]] = []  # value, seconds, configuration
        whole = best.trace is None and len(instance) >= KNAPSACK_WHOLE_MIN_REQUESTS
        for k, config in enumerate(KNAPSACK_LARGE_CONFIGS if large else KNAPSACK_CONFIGS):
            # The first configuration runs wherever a replay still fits (the best single one at its size:
            # priced at three greedy runs it was skipped under load at 10k requests and the next one ran in
            # its place, cut short), or, where the first variant's replay was deferred (one is due at the
            # end whichever wins), where a low estimate of its run fits (KNAPSACK_PER_RUN); the others as
            # time allows.
            until = first_deadline if whole and k == 0 else deadline
            if best.trace is not None:
                first_fits = fits(0.0)
            else:  # the deferred replay (and the winner's build) is due after it, whichever wins
                first_fits = until.remaining() >= KNAPSACK_PER_RUN * run_cost + finish_cost
            if not (first_fits if k == 0 else fits(1.5 * knapsack_cost)):
                skipped.append(config.name(kind == "budget"))
                continue
            started = time.perf_counter()
            # Past its deadline the knapsack decides the rest in its fast mode: that deadline leaves the
            # best schedule's build and replay their time.
            cand = knapsack(
                instance, objective=objective, deadline=until.before(finish_cost), replay_schedule=False,
                build=False, **config.kwargs(), **extra,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            knapsack_cost = max(knapsack_cost, seconds)
            runs.append((cand.value, seconds, config))
            tried[cand.name] = cand.value
            best = min(best, cand, key=lambda inc: inc.value)
        if large:
            fine_until = first_deadline.share(FINE_SHARE)
            if fine_until.remaining() <= deadline.remaining():
                fine_until = deadline
            for _, seconds, config in sorted(runs, key=lambda run: run[0])[:FINE_RUNS]:
                fine = replace(config, cells=FINE_CELLS)
                if not fits(FINE_COST * seconds, fine_until):
                    skipped.append(fine.name(kind == "budget"))
                    continue
                cand = knapsack(
                    instance, objective=objective, deadline=fine_until.before(finish_cost), replay_schedule=False,
                    build=False, **fine.kwargs(), **extra,
                )  # fmt: skip
                tried[cand.name] = cand.value
                best = min(best, cand, key=lambda inc: inc.value)
        run_cost = max(run_cost, 0.5 * knapsack_cost)
    for variant in others:
        if not fits(1.5 * run_cost):
            skipped.append(f"greedy:{variant.rule}")
            continue
        started = time.perf_counter()
        cand = run_variant(
            instance, variant, cost_model, objective=objective, deadline=deadline, replay_schedule=False,
            build=False,
        )  # fmt: skip
        run_cost = max(run_cost, time.perf_counter() - started)
        tried[cand.name] = cand.value
        best = min(best, cand, key=lambda inc: inc.value)
    if peak > LOWEST_CAP:
        if isinstance(best, Unbuilt):  # (the caps re-make it from its schedule's params)
            best = best.build()
        before = len(tried)
        best = search_running_caps(
            instance, best, deadline, cost_model=cost_model, peak=peak, tried=tried, run_cost=run_cost
        )
        if len(tried) == before and variant_of(best) is not None:
            skipped.append("greedy:running-cap")
    if best.trace is None:
        started, deferred_first = time.perf_counter(), best is first_run
        best = confirmed(instance, best, cost_model)
        tried[best.name] = best.value
        if deferred_first:
            # Its stats say what its whole run cost, replay included, as where it is replayed at once (the
            # pipeline prices its local search from them).
            best = replace(best, stats={**best.stats, "replay_s": time.perf_counter() - started})
    policy_cost = POLICY_COST_FACTOR * (float(best.stats["build_s"]) + replay_cost)
    for name in policies:
        if deadline.remaining() < 1.5 * policy_cost:
            skipped.append(f"policy:{name}")
            continue
        try:
            cand = _policy(instance, name, objective, cost_model)
        except KvschedError:
            continue  # a policy that cannot run this instance (stalls, needs predictions, ...)
        tried[cand.name] = cand.value
        if cand.value < best.value:
            best = cand
    stats = dict(best.stats)
    stats.update(tried=tried, skipped=skipped)
    return Incumbent(best.name, best.schedule, best.value, objective, stats, best.trace)


def _policy_first(
    instance: Instance,
    objective: str,
    cost_model: CostModel,
    variants: Sequence[Variant],
    policies: Sequence[str],
    deadline: Deadline,
    name: str = FIRST_POLICY,
) -> Incumbent:
    """Policy ``name``'s schedule (cut for ``deadline`` where it would overrun it, its requests left
    finished against reserved peaks), every greedy variant and other policy listed as skipped for time."""
    return _skipped(_policy(instance, name, objective, cost_model, deadline), variants, policies)


def _skipped(first: Incumbent, variants: Sequence[Variant], policies: Sequence[str]) -> Incumbent:
    """``first`` as the result, with every greedy variant and every other policy listed as skipped for time."""
    skipped = [f"greedy:{v.rule}" for v in variants] + [
        f"policy:{p}" for p in policies if first.name != f"policy:{p}"
    ]
    stats = {
        **first.stats,
        "tried": {first.name: first.value},
        "skipped": skipped,
        "greedy_skipped_for_time": True,
    }
    return replace(first, stats=stats)


def _policy(
    instance: Instance, name: str, objective: str, cost_model: CostModel, deadline: Deadline | None = None
) -> Incumbent:
    """The registered policy's schedule as an incumbent (raises :class:`KvschedError` where it cannot run).

    With a bounded ``deadline``, a run that would overrun it is cut and the requests it left are finished
    against reserved peaks (:func:`~kvsched.csp.incumbents.complete.reserved_batches`), by the deadline
    where :data:`~kvsched.csp.incumbents.complete.SECONDS_PER_REQUEST` holds: sarathi's run alone took
    4-10 s on 10k requests under the A100 fit, past a 1 s limit (the name says ``+reserved-batches``
    and ``stats["cut_for_time"]`` how many requests were left).
    """
    finish = reserved_batches if deadline is not None and deadline.bounded else None
    sim = simulate(
        instance, make_policy(name), cost_model, deadline=deadline, finish=finish,
        finish_seconds=SECONDS_PER_REQUEST,
    )  # fmt: skip
    # simulate() stepped every batch through the core and ran until every request completed.
    value = objective_function(objective)(sim.trace)
    stats: dict[str, Any] = {"runtime_s": sim.runtime}
    label = f"policy:{name}"
    if sim.cut:
        label += "+reserved-batches"
        stats["cut_for_time"] = sim.cut
    return Incumbent(label, sim.schedule, value, objective, stats, sim.trace)


def variant_of(incumbent: Incumbent) -> Variant | None:
    """The greedy variant that made ``incumbent``, from its schedule's params (None: not a variant's, e.g. a
    policy's, the knapsack greedy's, one of external priorities, or params that do not make a variant, as a
    warm start's read from a file may have)."""
    meta = incumbent.schedule.meta or {}
    params = meta.get("params")
    policy = str(meta.get("policy", ""))
    if (
        not policy.startswith("greedy:")
        or policy.startswith("greedy:priority")
        or not isinstance(params, dict)
        or params.get("rule", "remaining-area") not in RULES
    ):
        return None
    try:
        return Variant(
            str(params.get("rule", "remaining-area")),
            bool(params.get("preempt", True)),
            int(params.get("lookahead", 0)),
            float(params.get("refill_weight", 0.0)),
            int(params.get("min_chunk", 0)),
            bool(params.get("fit_chunk", False)),
            bool(params.get("fill", False)),
            int(params.get("token_cap", 0)),
            int(params.get("running_cap", 0)),
            bool(params.get(PROMPT_WEIGHTED, False)),
        )
    except (TypeError, ValueError):
        return None


def search_running_caps(
    instance: Instance,
    incumbent: Incumbent,
    deadline: Deadline | None = None,
    *,
    cost_model: CostModel | None = None,
    peak: int | None = None,
    tried: dict[str, float] | None = None,
    run_cost: float | None = None,
) -> Incumbent:
    """``incumbent`` or a better schedule of its greedy variant under a running cap, replayed by the core.

    Admission control, searched per instance (:func:`~kvsched.csp.incumbents.admission.running_cap_search`
    on the grid below ``peak``, by default the incumbent's own peak of requests holding KV), under
    seconds-based cost models only (:func:`variant_kind` ``costly``) and for a greedy variant's incumbent
    without a cap; anything else is returned as it is. A run starts only where 1.5 times ``run_cost``
    (default: the incumbent's own decide, build and replay time) and a replay fit before ``deadline``.
    Each capped schedule is recorded in ``tried`` (name -> value).
    """
    deadline = deadline or Deadline.never()
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    variant = variant_of(incumbent)
    if variant is None or variant.running_cap or variant_kind(instance, cost_model) != "costly":
        return incumbent
    if peak is None:
        incumbent = confirmed(instance, incumbent, cost_model)
        peak = peak_running(incumbent.trace)
    stats = incumbent.stats
    cost = [run_cost or sum(float(stats.get(k, 0.0)) for k in ("decide_s", "build_s", "replay_s"))]
    replay_cost = float(stats.get("replay_s", cost[0]))

    def capped(cap: int) -> Incumbent:
        started = time.perf_counter()
        cand = run_variant(
            instance, replace(variant, running_cap=cap), cost_model, objective=incumbent.objective,
            deadline=deadline, replay_schedule=False,
        )  # fmt: skip
        cost[0] = max(cost[0], time.perf_counter() - started)
        return cand

    best = running_cap_search(
        incumbent, peak, capped, lambda: deadline.remaining() >= 1.5 * cost[0] + replay_cost, tried
    )
    return confirmed(instance, best, cost_model)
