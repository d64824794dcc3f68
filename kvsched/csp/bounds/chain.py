"""Time-indexed Lagrangian relaxation of the memory and token-budget rows, with op-chain pricing.

A lower bound on total latency (or sum of TTFT) valid for **every** legal
schedule of a unit-time instance: chunked prefill, pauses, evictions, idling.

**The relaxation.** Let a batch that starts at time ``s`` (in slots) occupy slot
``floor(s)``. Batches last one slot and do not overlap, so distinct batches
occupy distinct slots, in order, and a batch a request is in occupies a slot
``>= r_j = floor(a_j)``. Request ``j`` generates token ``u`` (``u = 1..O_j``)
in some batch; call its slot ``t_{j,u}``. These slots strictly increase in
``u`` (one token per batch), ``t_{j,1} >= r_j + ceil(I_j / q) - 1`` (the prompt
needs that many batches of at most ``q = min(C, P)`` tokens), and the request
completes at ``C_j >= t_{j,O_j} + 1`` (TTFT ``>= t_{j,1} + 1``). While it
generates token ``u`` the batch holds all its ``I_j + u - 1`` known tokens (a
prefill, a decode and a refill all end with every known token held), so

    sum over the ops (j, u) with t_{j,u} = t of  w_{j,u}  <=  M,   w_{j,u} = blocks(I_j + u - 1),  (mem_t)

for every slot ``t``. Under a chunk cap ``q`` the first token's batch is the last
of at least ``K_j = ceil(I_j / q)`` batches of the prompt's last pass (after an
eviction the prompt starts again from no KV), each processing at most ``q`` of
its tokens, so the ``m``-th of them before it (``m = 1..K_j - 1``) holds at least
``I_j - m q`` tokens after it: these **prompt batches** add
``blocks(I_j - m q)`` to (mem_t) in strictly increasing slots ``>= r_j`` before
``t_{j,1}``, and nothing is evicted in that pass, so in a slot between two of them
(or between the last and ``t_{j,1}``) the earlier one's KV is held. A gap after
the ``m``-th costs its weight, as much as that batch in the gap's slot, while the
one before it weighs less: moving a batch later never costs more, so the
cheapest chain has them in the ``K_j - 1`` slots just before ``t_{j,1}``. In the
same way a gap between ``t_{j,u-1}`` and ``t_{j,u}`` either holds the KV of op
``u - 1`` in each of its slots, or is an eviction whose refill's last pass has
``ceil(S / q) - 1`` batches (``S = I_j + u - 1``) just before ``t_{j,u}``, the
``m``-th before it holding ``S - m q``: the slot pricing charges the cheaper
(without a cap a gap is free). Other prompt batches, the KV held before an
eviction, and refill tokens hold more: dropping them only relaxes (mem_t). With a token budget ``C``, the generating batch processes at least one
of the request's tokens, and its other ``I_j - 1`` prompt tokens are processed
in slots ``[r_j, t_{j,1}]``, so

    sum_j ([t_{j,u} = t, any u] + x_{j,t})  <=  C    (tok_t)

where ``x_{j,t} >= 0`` spread the other ``I_j - 1`` prompt tokens over slots
``[r_j, t_{j,1}]`` in any way (the per-request chunk cap ``q`` and the refill
tokens are dropped: relaxations again). Under unit time the objective ``sum_j (C_j - a_j)`` is at least
``sum_j (t_{j,O_j} + 1 - a_j)``. Dualise (mem_t) with ``y_t >= 0`` and (tok_t)
with ``z_t >= 0`` for the slots ``t < H`` (and ``y_t = z_t = 0`` beyond: any
``y, z >= 0`` give a bound). For every schedule

    objective  >=  sum_j price_j(y, z) - M sum_t y_t - C sum_t z_t  =  L(y, z),

where ``price_j`` is the cheapest chain of request ``j``: the minimum over
strictly increasing slots ``t_1 < ... < t_O`` (``t_1 >=`` its earliest slot)
and a spread ``x`` of its other prompt tokens of

    t_O + 1 - a_j + sum_u (w_{j,u} y_{t_u} + z_{t_u}) + sum_t z_t x_t  (+ its ghost's price, below);

the spread is linear, so at its cheapest all ``I_j - 1`` tokens sit in the
cheapest slot ``p in [r_j, t_1]``; the prompt batches add their weighted prices,
in slots chosen independently of ``p``.

**Ghosts** (total latency under a token budget ``C``). Every token a batch
processes adds at most one token of KV (at most one block: ``c`` tokens grow a
request by at most ``ceil(c / b) <= c`` blocks), and nothing else adds KV, so the
KV held grows by at most ``G = C`` a slot. A request completing in slot ``c``
frees ``h_j = w_{j,O_j}`` then, so with ``K(t)`` the KV held in slot ``t`` and
``K(c) <= M``, ``M - K(c + k) >= h_j - k G``: for ``k = 1, 2, ...`` that much stays
free. Several completions: let ``S`` be those with ``h_j - (t - c_j) G > 0`` at
slot ``t`` and ``s`` the earliest of their slots; ``K(t) <= K(s) + (t - s) G -
sum_S h_j``, so ``M - K(t) >= sum_S h_j - (t - s) G >= sum_S (h_j - (t - c_j) G)``
(each ``t - c_j >= 1``, one of them is ``t - s``). So (mem_t) holds with each
completed request's **ghost** ``max(0, h_j - (t - t_{j,O_j}) G)`` added to its
left side: the chain pays its ghost's prices after its last op. The LP without
ghosts already has them in sum (its memory row at ``t - 1`` and token row at
``t`` give ``K(t) <= M + G - drops``), but only for the chains' mixture: a chain
completing in slot ``c`` with weight ``x < 1`` leaves ``x h_j - G``, nothing for
small ``x``, where its own ghost leaves ``x (h_j - G)``. The block programme
prices them too: a chain finishing in a block puts its last op in the slot of
the block where that op's objective term and ghost cost least.

Chains may run past ``H``, where nothing is priced ("the zero-price tail"):
without it the bound would silently assume the optimum ends by ``H``. The
price is a dynamic programme over (ops done, slot), ``O(O_j x window)``: op
``u`` in slot ``t`` costs its price plus the running minimum of op ``u - 1``
over the earlier slots. Every chain costs at least ``t_O + 1 - a_j`` (prices
are ``>= 0``), so an optimal chain of request ``j`` ends by ``a_j + U_j - 1``
for any chain cost ``U_j`` known in advance (contiguous from its earliest
slot, wholly past ``H``, or last iteration's optimum re-priced): op ``u`` lies
in the diagonal band ``[e_j + u - 1, e_j + u - 1 + width)``, ``width = a_j +
U_j - O_j - e_j + 1``. The band is exact, not a restriction. The compiled
kernel (:mod:`kvsched.csp.bounds._chain_kernels`) runs it in parallel over
requests; a numpy path evaluates the full programme for the tests.

``sum_j (t_{j,O_j} + 1)`` is an integer, so the bound on total latency is
``ceil(L + sum a_j) - sum a_j`` (times the slot length).

**Sum of TTFT.** The objective charges ``t_1`` only; the ops after the first
can be pushed past ``H`` at zero price, so the chain price reduces to the
first op (plus its prompt tokens). Valid, but only the first token's memory
and tokens are priced, so this bound is weak when memory is tight.

**Makespan** is not a sum over requests, so the decomposition does not apply
directly (a feasibility version, "no ``y`` proves the chains cannot all end by
``H``", would be a binary search over ``H``); :func:`chain_lagrangian` refuses it.

**Dual method.** (1) One exact pricing at ``y = 0`` (each request alone): a
valid bound at once. (2) Multipliers constant on blocks of ``B`` slots, coarse
to fine (:mod:`kvsched.csp.bounds.chain_blocks`): a restriction of the dual, so
every value is a bound, and the exact price at such multipliers costs about
``B`` times less. (3) The exact chain pricing on single slots continues from the
best block point; every value is a bound. The block levels run the proximal
bundle of :mod:`kvsched.csp.bounds._bundle`, the slot phase the projected
subgradient of :mod:`kvsched.csp.bounds._ascent` (Polyak steps, volume-style
averaging, resets to the best point). Warm start ``y_t = alpha N(t) / M`` or
``alpha R(t) / M`` (``N(t)`` requests in the system, ``R(t)`` requests not yet
complete, in slot ``t`` of an incumbent schedule), the best of a search over
``alpha`` along each ray on the coarsest blocks. The deadline is
checked before every pricing, and a pricing whose predicted time exceeds what is
left is not started.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from kvsched.costmodel import UnitCost
from kvsched.csp.bounds._ascent import Ascent
from kvsched.csp.bounds.chain_blocks import METHODS, block_ascent, block_spans, finer_start, ray_search
from kvsched.csp.bounds.mbt import mean_busy_dual
from kvsched.csp.certificate import Bound, Scope
from kvsched.errors import InputError, KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance
from kvsched.schedule.validate import Trace, instance_cost_model
from kvsched.stop import Deadline

#: Objective codes of the kernels (``_chain_LATENCY`` and ``.TTFT``).
LATENCY, TTFT = 0, 1
#: Objectives the chain relaxation bounds.
OBJECTIVES = {"total-latency": LATENCY, "sum-ttft": TTFT}
#: Policies tried in turn for an incumbent when none is given (fast; Sarathi chunks, so budgets never stall it).
WARM_POLICIES = ("sarathi", "vllm")
#: Slack on rounding the bound up to the next integer number of slots (float round-off).
ROUND_TOL = 1e-6
#: Slot pricings that must fit in the time left, and in SLOT_SECONDS, for the block phase to be skipped. The
#: second cap keeps a longer limit from switching an instance with dear pricings to the slower slot ascent
#: (Azure conversations 1k, 0.6 s a pricing: 420,559 in a 60 s solve with blocks, 417,589 in a 300 s solve
#: without them).
SLOT_PRICINGS = 300
SLOT_SECONDS = 30.0
#: Share of the time left that the warm start's scaling may take (a few coarse pricings).
START_SHARE = 0.15
#: Share of the time left after that in which the mean-busy-time prices may be priced on finer blocks
#: (:func:`.chain_blocks.finer_start`, which stops at the first level that does not pay). On Azure
#: conversations 10k the 256-slot level is worth 2.692e7 against 2.590e7 at 1,024 slots, and the block ascent
#: gains nothing after it in 300 s; with the start's 15% share that level never fitted a 30 s Lagrangian.
FINER_SHARE = 0.5
#: Pricings on the coarsest blocks the block ascent needs before it can gain on a finer start. Where fewer fit in
#: the time left, the finer start may take all of it: on Azure conversations 10k with a budget (0.8-1.3 s a
#: coarse pricing, none of the ascent's levels beat the finer start in 300 s) the 256-slot level (8.7 s, worth
#: 2.730e7 against 2.628e7 at 1,024 slots) fitted the half share of a 33 s Lagrangian but not of a 28 s one.
ASCENT_PRICINGS = 30
#: Share of the time left that the block-constant multipliers (:mod:`.chain_blocks`) may take first.
BLOCK_SHARE = 0.85
#: Dynamic-programme cells per second assumed for a first chain pricing (measured ~3.7e8 on 2 loaded cores).
CELLS_PER_SECOND = 2.5e8
#: States per second assumed for a first block pricing (an under-estimate on 2 loaded cores).
BLOCK_STATES_PER_SECOND = 5e7
#: Extra slots of dual horizon past the incumbent's makespan (share of it).
HORIZON_MARGIN = 0.05


@dataclass(frozen=True, slots=True, eq=False)
class ChainData:
    """A unit-time instance as the chain relaxation sees it (times in slots).

    Parameters
    ----------
    release, earliest
        First slot each request may be in a batch; first slot it may generate its first token in.
    output, prompt, arrival
        O, I and the arrival in slots (real).
    offset
        Where each request's chain starts in a flat chain array.
    chunk, pre_offset
        The chunk cap ``q = min(C, P)`` (0 without a budget), and where each request's prompt batches
        before its first token's start in a flat array of them (``n + 1`` entries; ``earliest -
        release`` of them each, none without a cap).
    block, capacity, budget
        Block size, KV capacity in blocks, token budget C (None: no budget rows).
    growth
        The most the KV may grow in one slot, in blocks, for the completions' ghosts: C under a token
        budget and total latency, else 0 (no ghosts).
    slot
        The time model's slot length (bounds are returned in the instance's time unit).
    objective
        Kernel objective code.
    origin
        Whole slots taken off every time: the first arrival's slot. Both objectives are sums of times
        less arrivals, so they are the same counted from there, and the relaxation's arrays then span
        the schedule, not the time before it (arrivals at 1e7 slots took 822 MB). Times read off a
        trace are in slots less ``origin`` (:meth:`slots_of`).
    """

    release: np.ndarray
    earliest: np.ndarray
    output: np.ndarray
    prompt: np.ndarray
    arrival: np.ndarray
    offset: np.ndarray
    chunk: int
    pre_offset: np.ndarray
    block: int
    capacity: int
    budget: int | None
    slot: float
    objective: int
    growth: int = 0
    origin: int = 0

    @classmethod
    def from_instance(cls, instance: Instance, objective: str = "total-latency") -> ChainData:
        cost = instance_cost_model(instance)
        if not isinstance(cost, UnitCost):
            raise InputError(f"the chain Lagrangian needs the unit time model, not {cost.name!r}")
        if objective not in OBJECTIVES:
            raise InputError(
                f"the chain Lagrangian bounds {', '.join(OBJECTIVES)}, not {objective!r} "
                "(makespan is not a sum over requests)"
            )
        if not len(instance):
            raise InputError("the chain Lagrangian needs at least one request")
        lim = instance.limits
        prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
        output = np.array([r.output for r in instance.requests], dtype=np.int64)
        arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64) / cost.slot
        # (A float less a whole number below it, under 2**53, is exact: the shift moves no arrival.)
        origin = int(np.floor(arrival.min()))
        arrival -= origin
        release = np.floor(arrival + 1e-9).astype(np.int64)
        chunk = min(
            (c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None), default=None
        )
        earliest = release.copy()
        if chunk is not None:
            earliest += np.maximum(1, -(-prompt // chunk)) - 1
        offset = np.concatenate([[0], np.cumsum(output)[:-1]]).astype(np.int64)
        pre_offset = np.concatenate([[0], np.cumsum(earliest - release)]).astype(np.int64)
        return cls(
            release=release,
            earliest=earliest,
            output=output,
            prompt=prompt,
            arrival=arrival,
            offset=offset,
            chunk=int(chunk or 0),
            pre_offset=pre_offset,
            block=int(lim.block_size),
            capacity=int(lim.kv_blocks),
            budget=lim.max_batch_tokens,
            slot=float(cost.slot),
            objective=OBJECTIVES[objective],
            # Each token a batch processes adds at most one block (a request's blocks grow by at most
            # ceil(c / b) <= c for c tokens), so C bounds the growth in blocks too; under the first-token
            # objective the chains have no last op to follow.
            growth=int(lim.max_batch_tokens or 0) if OBJECTIVES[objective] == LATENCY else 0,
            origin=origin,
        )

    def slots_of(self, times: np.ndarray) -> np.ndarray:
        """Times of the instance (its time unit, from 0) as this relaxation counts them: slots from the origin."""
        return times / self.slot - self.origin

    @property
    def n(self) -> int:
        return int(self.output.size)

    def to_bound(self, value: float) -> float:
        """The objective bound (instance time unit) implied by a Lagrangian value ``value`` (slots)."""
        if not math.isfinite(value):
            return -math.inf
        total = float(self.arrival.sum())
        slots = math.ceil(value + total - ROUND_TOL * max(1.0, abs(value + total)))
        return self.slot * (slots - total)


@dataclass(frozen=True, slots=True, eq=False)
class ChainPricing:
    """One evaluation of ``L(y, z)``: the value (slots), the chains and the subgradient's loads."""

    value: float
    price: np.ndarray
    chains: np.ndarray
    prompt_slot: np.ndarray
    load: np.ndarray  # blocks the chains put in each slot < H
    tokens: np.ndarray  # tokens (empty without budget rows)


def _kernels():
    """The compiled kernels, imported on first use: numba takes about a second to import."""
    from kvsched.csp.bounds import _chain_kernels

    return _chain_kernels


def compiled_kernels(objective: str = "total-latency") -> list:
    """The numba kernels :func:`chain_lagrangian` calls for ``objective`` (see :func:`kvsched.jit.use_compiled`).

    Under total latency that includes ``price_contiguous``: a time-limited call on a small instance
    skips the block phase and seeds the slot pricing's bands with it. It was once left out, and a
    pipeline whose other kernels were warm compiled it inside an 8 s limit (10.5 s in all).
    """
    from kvsched.csp.bounds import _block_kernels, _bundle_kernels

    k = _kernels()
    out = [
        k.price_chains,
        k.chain_loads,
        k.band_widths,
        _block_kernels.price_blocks,
        _bundle_kernels.simplex_qp_compiled,  # the block levels' bundle steps
    ]
    return [*out, k.price_contiguous] if objective == "total-latency" else out


def evaluate(
    data: ChainData,
    y: np.ndarray,
    z: np.ndarray | None = None,
    *,
    prev: np.ndarray | None = None,
) -> ChainPricing:
    """``L(y, z)`` and each request's optimum chain (numba kernel); ``len(y)`` is the dual horizon H."""
    y = np.ascontiguousarray(y, dtype=np.float64)
    z = np.zeros(0) if z is None or data.budget is None else np.ascontiguousarray(z, dtype=np.float64)
    use_prev = prev is not None
    prev = prev if prev is not None else np.zeros(1, dtype=np.int64)
    kernels = _kernels()
    price, chains, pslot, pre, refilled = kernels.price_chains(
        data.release, data.earliest, data.output, data.prompt, data.arrival, data.offset, data.block,
        y, z, data.objective, prev, use_prev, data.chunk, data.pre_offset, data.growth,
    )  # fmt: skip
    load, tokens = kernels.chain_loads(
        data.output, data.prompt, data.offset, data.block, chains, pslot, y.size, z.size > 0, data.chunk,
        data.pre_offset, pre, refilled, True, data.growth,
    )  # fmt: skip
    value = float(price.sum() - data.capacity * y.sum())
    if z.size:
        value -= float(data.budget) * float(z.sum())
    return ChainPricing(value, price, chains, pslot, load, tokens)


def evaluate_numpy(data: ChainData, y: np.ndarray, z: np.ndarray | None = None) -> float:
    """``L(y, z)`` by the numpy reference (full programme, no band): for tests on small instances."""
    y = np.asarray(y, dtype=np.float64)
    z = np.zeros(0) if z is None or data.budget is None else np.asarray(z, dtype=np.float64)
    price = _kernels().price_chains_numpy(
        data.release, data.earliest, data.output, data.prompt, data.arrival, data.block, y, z, data.objective,
        data.chunk, data.growth,
    )  # fmt: skip
    value = float(price.sum() - data.capacity * y.sum())
    if z.size:
        value -= float(data.budget) * float(z.sum())
    return value


@dataclass(frozen=True, slots=True, eq=False)
class ChainLagrangian:
    """The chain Lagrangian bound and how it was reached.

    ``value`` is the best ``L(y, z)`` in the instance's time unit before rounding
    up; ``bound.value`` is the rounded bound. ``history`` holds ``(seconds,
    bound)`` after each improving iteration (the anytime curve). ``data`` is the
    instance as the relaxation priced it (its objective included), for whoever
    reads the multipliers again (:class:`~kvsched.csp.bounds.chain_guide.ChainGuide`).
    """

    data: ChainData
    bound: Bound
    value: float
    y: np.ndarray
    z: np.ndarray
    iterations: int
    seconds: float
    incumbent: float | None
    history: tuple[tuple[float, float], ...] = field(default=())


def warm_incumbent(instance: Instance) -> Trace:
    """A quick validated schedule's trace (the first of ``WARM_POLICIES`` that completes the instance)."""
    for name in WARM_POLICIES[:-1]:
        try:
            return simulate(instance, make_policy(name)).trace
        except KvschedError:
            continue
    return simulate(instance, make_policy(WARM_POLICIES[-1])).trace


def not_done(data: ChainData, trace: Trace, horizon: int) -> np.ndarray:
    """R(t): requests not complete by slot ``t < horizon`` of ``trace`` (arrived or not)."""
    done = np.ceil(data.slots_of(trace.state.completion) - 1e-9).astype(np.int64)
    count = np.zeros(horizon + 1)
    np.add.at(count, np.clip(done, 0, horizon), 1.0)
    return data.n - np.cumsum(count)[:horizon]


def in_system(data: ChainData, trace: Trace, horizon: int) -> np.ndarray:
    """N(t): requests arrived and not complete in each slot ``t < horizon`` of ``trace``."""
    done = np.ceil(data.slots_of(trace.state.completion) - 1e-9).astype(np.int64)
    count = np.zeros(horizon + 1)
    np.add.at(count, np.clip(data.release, 0, horizon), 1.0)
    np.add.at(count, np.clip(done, 0, horizon), -1.0)
    return np.cumsum(count)[:horizon]


def mean_busy_prices(data: ChainData, horizon: int) -> np.ndarray:
    """Memory multipliers from the mean-busy-time LP's dual (:func:`kvsched.csp.bounds.mbt.mean_busy_dual`).

    The chain relaxation contains that LP's constraints (each op holds w in its slot, at most M a
    slot; a chain ends at least its w-weighted mean slot plus its tail after it), so at these prices
    its value starts near the mean-busy-time bound rather than near each request alone. At memory
    load about 1 they are a far better warm start than an incumbent's queue (Azure conversations 1k:
    382,694 at blocks of 128 slots against 247,159 for the best scaled R(t) or N(t); 10k: 2.59e7 at
    blocks of 1,024 against 1.83e7).
    """
    out, prompt = data.output.astype(np.float64), data.prompt.astype(np.float64)
    area = (out * prompt + 0.5 * out * (out - 1)) / data.block  # in blocks, as the chains' w
    return mean_busy_dual(area, data.release.astype(np.float64), float(data.capacity), horizon)


def chain_lagrangian(
    instance: Instance,
    objective: str = "total-latency",
    *,
    incumbent: Trace | None = None,
    deadline: Deadline | None = None,
    max_iterations: int = 5000,
    y0: np.ndarray | None = None,
    spans: tuple[int, ...] | None = None,
    block_method: str = "bundle",
) -> ChainLagrangian:
    """The best chain-Lagrangian bound reached by the stabilised dual methods within ``deadline``.

    Parameters
    ----------
    instance
        A unit-time instance.
    objective
        ``"total-latency"`` or ``"sum-ttft"``.
    incumbent
        A validated schedule's trace: its makespan sets the dual horizon, its
        occupancy the warm start, its value the Polyak target (default: run
        ``WARM_POLICIES``).
    deadline
        Checked before every pricing; the best bound so far is returned when it expires.
    max_iterations
        Pricing calls at most.
    y0
        Warm-start memory multipliers, truncated or padded to the horizon (default: ``N(t) / M`` or
        ``R(t) / M``, requests in the system or not yet complete in the incumbent, whichever scaled
        copy prices best on the coarsest blocks).
    spans
        Block lengths of the block-constant phase, coarse to fine, each dividing the previous
        (``()``: slots only). Default: :func:`kvsched.csp.bounds.chain_blocks.block_spans`, or none
        where ``SLOT_PRICINGS`` slot pricings are predicted to fit in the time left and in ``SLOT_SECONDS``.
    block_method
        The block levels' dual method (:data:`kvsched.csp.bounds.chain_blocks.METHODS`): the proximal
        bundle, or the projected subgradient it replaced (for comparisons).
    """
    if block_method not in METHODS:
        raise InputError(f"block_method must be one of {', '.join(METHODS)}; got {block_method!r}")
    given = spans or ()
    if any(s < 1 for s in given) or any(a <= b or a % b for a, b in itertools.pairwise(given)):
        raise InputError(
            f"spans must be block lengths coarse to fine, each dividing the previous; got {spans}"
        )
    wall = time.perf_counter()
    deadline = deadline or Deadline.never()
    data = ChainData.from_instance(instance, objective)
    trace = incumbent if incumbent is not None else warm_incumbent(instance)
    completion = data.slots_of(trace.state.completion)
    horizon = max(1, math.ceil(float(completion.max()) * (1 + HORIZON_MARGIN)) + 1)
    upper = float(
        np.sum(completion - data.arrival)
        if data.objective == LATENCY
        else np.sum(data.slots_of(trace.state.first_token) - data.arrival)
    )
    if y0 is None:
        y = in_system(data, trace, horizon) / data.capacity
    else:
        y = np.zeros(horizon)
        y[: min(horizon, len(y0))] = np.maximum(0.0, y0[:horizon])
    z = np.zeros(horizon if data.budget is not None else 0)

    history: list[tuple[float, float]] = []

    def record(value: float) -> None:
        if not history or data.to_bound(value) > history[-1][1]:
            history.append((time.perf_counter() - wall, data.to_bound(value)))

    # A valid bound at once: y = 0 prices each request alone (cheap: every band is narrow).
    zero = evaluate(data, np.zeros(horizon), np.zeros_like(z))
    best, best_y, best_z, iterations = zero.value, np.zeros(horizon), np.zeros_like(z), 1
    record(best)
    if spans is None:
        # Blocks pay where slot pricings are dear; where enough of them fit in the time, the slot ascent
        # alone converges sooner (measured: Azure code 1k, 347 slot pricings in 7 s against 40 s for the
        # block ladder to a lower value).
        budget = min(deadline.remaining(), SLOT_SECONDS)
        cheap = deadline.bounded and predict_slots(data, y) * SLOT_PRICINGS <= budget
        spans = () if cheap else block_spans(horizon)
    factor, first_cost, chains = 1.0, (lambda y, z: _predict(data, y, z)), None
    if spans and not deadline.expired():
        # Phase 1: multipliers constant on blocks, coarse to fine: each pricing is a block length
        # cheaper, and every value is a bound.
        if y0 is None:
            # Three warm-start shapes, the mean-busy-time LP's prices and N(t) / M and R(t) / M (the
            # incumbent's queue), each scaled along its ray to the best value (L is concave, so along a
            # ray it is unimodal): which one is nearer the dual optimum depends on the instance (the
            # ascent would take many steps to turn one into another).
            shapes = (
                mean_busy_prices(data, horizon),
                y,
                not_done(data, trace, horizon) / data.capacity,
            )
            start = ray_search(data, shapes, spans[0], deadline.share(START_SHARE), on_value=record)
            iterations += start.iterations
            y, z = start.y, np.zeros(start.y.size if z.size else 0)  # searched at z = 0
            if start.value > best:
                best, best_y, best_z = start.value, y, z
            # The mean-busy-time prices vary inside the coarsest blocks: priced on finer ones they may be
            # worth more. The ladder still starts from the ray's best on the coarsest blocks, but a level
            # hands on that finer point where it did not beat it.
            starved = start.cost * ASCENT_PRICINGS > deadline.remaining()
            share = deadline if starved else deadline.share(FINER_SHARE)
            fine = finer_start(data, shapes[0], spans, share, start.cost, on_value=record)
            if fine is not None:
                iterations += fine.level
                if fine.value > best:
                    best, best_y, best_z = fine.value, fine.y, np.zeros(fine.y.size if z.size else 0)
        blocks = block_ascent(
            data, np.pad(best_y, (0, y.size - best_y.size)), z, upper, deadline.share(BLOCK_SHARE), spans=spans,
            iterations=max_iterations - iterations, on_improve=record, floor=best,
            first_cost=lambda y, z: _predict_blocks(data, y, spans[0]), until=deadline, value=best, first=y,
            predict=lambda y, span: _predict_blocks(data, y, span), method=block_method,
        )  # fmt: skip
        iterations += blocks.iterations
        y, z, factor, chains = blocks.y, blocks.z, blocks.factor, blocks.chains
        if blocks.value > best:
            best, best_y, best_z = blocks.value, blocks.y, blocks.z
        # The block programme's work shrinks at most in proportion to the block length, and the slot
        # kernel is the faster per cell: the last block pricing's time, scaled, over-estimates a slot one.
        first_cost = lambda y, z, cost=blocks.cost * spans[-1]: cost  # noqa: E731
    elif not deadline.expired():
        # A chain pricing at large multipliers has wide bands: shrink them until one fits the time left
        # (a convex combination with y = 0, whose value is already known, loses little).
        for _ in range(8):
            if not deadline.bounded or _predict(data, y, z) < deadline.remaining():
                break
            y, z = 0.7 * y, 0.7 * z
    # Phase 2: the exact chain pricing on single slots; every value is a bound. Where ghosts are priced it
    # starts with a full step rather than the one the block phase shrank to: the slot programme gives the
    # ghosts more room (any slot for the last op, gaps priced), and measured on the tests' budget instances
    # the handed-on step stalls 0.4% short of the LP, a full one 0.17% (no difference at 10k in 40 s).
    exact = Ascent(
        data, upper, _chain_pricer(data, chains), on_improve=record, floor=best, first_cost=first_cost,
        factor=1.0 if data.growth else factor,
    )  # fmt: skip
    exact.run(y, z, deadline, max_iterations - iterations)
    iterations += exact.iterations
    if exact.best > best:
        best, best_y, best_z = exact.best, exact.best_y, exact.best_z
    return ChainLagrangian(
        data=data,
        bound=Bound(max(0.0, data.to_bound(best)), "chain-lagrangian", Scope.ALL),
        value=data.slot * best,
        y=best_y,
        z=best_z,
        iterations=iterations,
        seconds=time.perf_counter() - wall,
        incumbent=data.slot * upper,
        history=tuple(history),
    )


def _contiguous(data: ChainData, y: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's cheapest contiguous chain at ``(y, z)``: its price and its slots (flat)."""
    price, start = _kernels().price_contiguous(
        data.earliest, data.output, data.prompt, data.arrival, data.block, y, z, np.zeros(1, np.int64), False
    )
    total = int(data.output.sum())
    chains = np.repeat(start, data.output) + (np.arange(total) - np.repeat(data.offset, data.output))
    return price, chains


def _predict(data: ChainData, y: np.ndarray, z: np.ndarray) -> float:
    """Seconds a chain pricing at ``(y, z)`` seeded with contiguous chains may take (band cells)."""
    if data.objective != LATENCY:
        return float(np.sum(_widths(data, y))) / CELLS_PER_SECOND
    price, _ = _contiguous(data, y, z)
    width = np.maximum(1.0, np.floor(data.arrival + price - data.output - data.earliest) + 1)
    return float(np.sum(data.output * width)) / CELLS_PER_SECOND


def predict_slots(data: ChainData, y: np.ndarray) -> float:
    """Seconds a slot pricing at ``y`` may take, from the contiguous-from-earliest bands (``O(n)``)."""
    out = data.output if data.objective == LATENCY else np.ones_like(data.output)
    return float(np.sum(out * _widths(data, y))) / CELLS_PER_SECOND


def _widths(data: ChainData, y: np.ndarray) -> np.ndarray:
    """Each request's band width at ``y`` from its contiguous-from-earliest chain (``O(1)`` each)."""
    return _kernels().band_widths(
        data.earliest, data.output, data.prompt, data.arrival, data.block, y, data.objective
    )


def _predict_blocks(data: ChainData, y: np.ndarray, span: int) -> float:
    """Seconds a block pricing (block length ``span``) at slot multipliers ``y`` may take.

    Per request, ``(O + width) / span`` blocks of at most ``min(width, O)`` states, plus ``O(O + width)``.
    """
    width = _widths(data, y)
    out = data.output if data.objective == LATENCY else np.ones_like(data.output)
    states = (out + width) / span * np.minimum(width, out) + out + width
    return float(np.sum(states)) / BLOCK_STATES_PER_SECOND


def _chain_pricer(data: ChainData, chains: np.ndarray | None = None):
    """Exact chain pricing; last call's chains (first ``chains``, or the contiguous optimum) narrow the bands."""
    prev: list[np.ndarray | None] = [chains]

    def price(y: np.ndarray, z: np.ndarray, reset: bool) -> tuple[float, np.ndarray, np.ndarray]:
        if (reset and chains is None) or prev[0] is None:
            prev[0] = _contiguous(data, y, z)[1] if data.objective == LATENCY else None
        pricing = evaluate(data, y, z, prev=prev[0])
        prev[0] = pricing.chains
        return pricing.value, pricing.load, pricing.tokens

    return price
