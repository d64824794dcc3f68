"""A Lagrangian bound in seconds: op chains on slots of the shortest batch, priced by the machine.

A lower bound on total latency valid for **every** legal schedule of an instance under a seconds-based
cost model with a separable lower bound (:mod:`.separable`): chunked prefill, pauses, evictions and
refills, idling, token and prefill budgets.

**Slots.** Let ``delta`` be a lower bound on the duration of any batch with at least one item (the
largest over the separable forms of ``fixed + min(decode item, prefill item)``). Batches do not
overlap, so the starts of two batches are at least ``delta`` apart, and mapping a batch that starts at
``s`` to slot ``floor(s / delta)`` puts distinct batches in distinct, increasing slots. Request ``j``
generates token ``u`` in the batch of slot ``t_{j,u}``: ``t_{j,1} < ... < t_{j,O}``, ``t_{j,1} >=
floor(a_j / delta) + ceil(I_j / q) - 1``, and ``C_j >= delta (t_{j,O} + 1)`` (the last batch starts in
its slot and lasts at least ``delta``).

**The machine rows.** For each separable form ``l`` (``T(B) >= F + [dec] F_dec + [pre] F_pre + sum
g(item)``) and each window ``W`` of consecutive slots, the batches starting in ``W`` run one after
another, from no earlier than the window's start plus ``o_{W-1}`` (what the batch running at the
window's start still had to do) to no later than its end plus ``o_W``, so

    sum over batches k starting in W of T_k  <=  |W| delta + o_W - o_{W-1},   0 <= o_W <= T_max,

with ``T_max`` an upper bound on any batch's duration. Split each batch's fixed part among its items:
an item of request ``j`` in slot ``t`` gets ``lam_{j,t}`` of it, for any fixed weights ``lam >= 0``
with ``sum_j lam_{j,t} <= 1`` in every slot (here ``1 / Phi(t)`` for the requests in the system in
slot ``t`` of an incumbent schedule, 0 for the others: a batch holds each request at most once, so
the shares sum to at most the whole fixed part). Each item's *piece* is its share plus its own
``g``; a batch's pieces sum to at most its duration. Dropping every item but the ops below (the prompt
chunks other than the last, a refill's chunks other than its last, the KV of paused requests) only
lowers the left-hand side. The ops are: the last prompt chunk (generates token 1: at least one token,
its share of ``F + F_pre``), the other ``I - 1`` prompt tokens in slots ``[floor(a_j / delta),
t_{j,1}]`` at most ``q`` per slot (each slot used holds a chunk: ``1 / q`` of its share and constant per
token), and for ``u >= 2`` either a decode reading ``I + u - 2`` KV or the last chunk of a refill of
``I + u - 1`` tokens (the cheaper piece).

**The memory and token rows** are the chain Lagrangian's (:mod:`.chain`): the generating batch holds
all ``I + u - 1`` known tokens (in blocks) and processes at least one token of the request.

**Dualising** the machine rows with ``mu_{l,W} >= 0``, memory with ``y_W`` and tokens with ``z_W``
(constant over each window: a restriction of the dual, so still a bound) gives, for every schedule,

    total latency >= sum_j price_j - delta sum_{l,W} |W| mu_{l,W} + T_max sum_W min(0, m_{W+1} - m_W)
                     - M sum_W |W| y_W - C sum_W |W| z_W,          m_W = sum_l mu_{l,W},

where ``price_j`` is the cheapest chain of ``j`` (ops in strictly increasing slots, the prompt tokens
in the cheapest slots, cost ``delta (t_O + 1) - a_j`` plus each op's pieces times the prices), a dynamic
programme over (ops done, slot) in a band that any chain cheaper than a known one must use; slots past
the horizon are free (the zero-price tail). ``o_W`` sits at ``T_max`` where the machine price drops.
Any multipliers ``>= 0`` give a valid bound; a stabilised subgradient ascent improves them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from kvsched.costmodel import CalibratedCost, CostModel, HingeCost, InfermaxLinear, StaircaseCost, UnitCost
from kvsched.csp.bounds._ascent import Signed, Subgradient
from kvsched.csp.bounds.separable import SAFETY, Separable, separable_forms, tau_max
from kvsched.csp.certificate import Bound, Scope
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.records import RunRecord
from kvsched.schedule.validate import Trace, instance_cost_model
from kvsched.schedule.violations import TIME_TOL
from kvsched.stop import Deadline

#: The bound's source name.
SOURCE = "seconds-lagrangian"
#: Separable forms (machine rows per window) at most.
MAX_FORMS = 3
#: Windows of the dual (slots are grouped so that there are about this many).
WINDOWS = 1500
#: Dual windows last at least this many times the longest batch.
SPAN = 4.0
#: Extra horizon past the incumbent's makespan (share of it).
HORIZON_MARGIN = 0.05
#: The ascent (:class:`kvsched.csp.bounds._ascent.Subgradient`) halves its step after this many
#: iterations without improvement.
PATIENCE = 10
#: Start and step of the share mixture (1: the incumbent's requests in the system share a batch's fixed
#: part; 0: the items share it by the KV they hold).
ALPHA0 = 0.5
#: Warm start of the first form's machine prices: this share of the requests in the incumbent's system.
WARM = 0.0
ALPHA_STEP = 0.1
#: Seconds per op (output token) of building the relaxation's data from the incumbent's trace, and of the
#: first pricing from its chains. Measured 2026-11-29 on the 2-core machine at load 2 under the A100 fit:
#: the data 0.1 / 0.5 / 9.4 s and a pricing 0.1-0.5 / 1.1-1.5 / 13.7-17.3 s at 0.25M / 2.2M / 34.5M ops
#: (Azure conversations 1k and 10k, ShareGPT 100k), so about 0.3 and 0.5 us an op, with margin here.
PREPARE_SECONDS_PER_OP = 4e-7
PRICING_SECONDS_PER_OP = 8e-7


def _kernels():
    """The compiled kernels, imported on first use (numba's import takes about a second)."""
    from kvsched.csp.bounds import _seconds_kernels

    return _seconds_kernels


def compiled_kernels() -> list:
    """The numba kernels :func:`seconds_lagrangian` calls (see :func:`kvsched.jit.use_compiled`)."""
    k = _kernels()
    return [k.price_chains, k.chain_loads]


def max_batch_seconds(cost: CostModel, tau_max: int, kv: int, s_max: int) -> float | None:
    """An upper bound on the duration of any batch of at most ``tau_max`` tokens on ``kv`` KV tokens,
    no request holding more than ``s_max`` (None for a cost model this module does not bound).

    A batch's items process c_i >= 1 tokens (sum <= tau_max) on m_i KV (sum m_i <= kv, c_i + m_i <=
    s_max): so sum (c^2 + 2mc) <= 2 s_max tau_max, sum m over prefill items <= min(kv, tau_max s_max),
    sum c^2 <= tau_max^2, and there are at most tau_max items.
    """
    quad = 2.0 * s_max * tau_max
    pf_kv = min(kv, tau_max * s_max)
    if isinstance(cost, InfermaxLinear):
        return (
            cost.a0 + cost.a1 * tau_max + cost.b0 + cost.b1 * kv + cost.p0
            + cost.p1 * quad + cost.p2 * pf_kv + cost.p3 * tau_max
        )  # fmt: skip
    if isinstance(cost, CalibratedCost):
        loads = np.arange(0, tau_max + 1, dtype=np.float64)
        return (
            float(np.max(cost.non_attention(loads))) + cost.b0 + cost.b1 * kv + cost.b2 * tau_max + cost.p0
            + cost.p1 * quad + cost.p2 * pf_kv + cost.p3 * tau_max + cost.p4 * tau_max**2
        )  # fmt: skip
    if isinstance(cost, HingeCost):
        return cost.c + cost.a * max(0.0, tau_max - cost.b0)
    if isinstance(cost, StaircaseCost):
        return cost.c + cost.a * math.ceil(tau_max / cost.b0)
    return None


@dataclass(frozen=True, slots=True, eq=False)
class BatchBounds:
    """What the seconds bounds read of a batch under an instance's cost model: its separable lower bounds, the
    most tokens a batch holds (``tau_max``) and the longest any batch can last (``t_max``)."""

    cost: CostModel
    forms: list[Separable]
    tau_max: int
    t_max: float


def batch_bounds(instance: Instance) -> BatchBounds | None:
    """The instance's :class:`BatchBounds`; None for the unit model, an instance with no requests, or a cost
    model without separable forms or a largest batch time."""
    cost = instance_cost_model(instance)
    if not len(instance) or isinstance(cost, UnitCost) or instance.time_model.name == "unit":
        return None
    lim = instance.limits
    kv_tokens = int(lim.kv_blocks * lim.block_size)
    most = tau_max(instance)
    forms = separable_forms(cost, most)
    s_max = max(r.prompt + r.output for r in instance.requests)
    t_max = max_batch_seconds(cost, most, kv_tokens, s_max)
    if not forms or t_max is None:
        return None
    return BatchBounds(cost, forms, most, float(t_max))


def shortest_batch(form: Separable) -> float:
    """A lower bound on any batch with at least one item under ``form`` (an item processes >= 1 token)."""
    decode = form.fixed_decode + form.per_token + form.decode
    prefill = (
        form.fixed_prefill + form.per_token + form.prefill_token + form.prefill
        + form.prefill_quad + form.prefill_sq
    )  # fmt: skip
    return form.fixed + min(decode, prefill)


def _pick_forms(forms: list[Separable]) -> list[Separable]:
    """Up to MAX_FORMS forms, from the one with the largest fixed part to the steepest."""
    order = sorted(forms, key=lambda f: -f.fixed)
    if len(order) <= MAX_FORMS:
        return order
    pick = np.unique(np.linspace(0, len(order) - 1, MAX_FORMS).round().astype(int))
    return [order[i] for i in pick]


@dataclass(frozen=True, slots=True, eq=False)
class SecondsChainData:
    """An instance as the seconds relaxation sees it (slot length ``delta`` seconds; times, slot 0 included,
    count from the first arrival)."""

    release: np.ndarray
    earliest: np.ndarray
    output: np.ndarray
    prompt: np.ndarray
    arrival: np.ndarray  # seconds after the first arrival
    life: np.ndarray  # last slot of each request's fixed-cost share
    offset: np.ndarray
    inv_phi: np.ndarray  # per slot < horizon: 1 / (requests sharing it)
    delta: float
    q: float
    block: int
    capacity: int  # KV blocks
    budget: int | None
    t_max: float
    horizon: int
    group: int  # slots per dual window
    forms: tuple[Separable, ...]
    coeffs: tuple[np.ndarray, ...]  # the kernels' arrays per form: fd, fp, gd0, gd1, gr, pt, pr
    prev: np.ndarray | None  # the incumbent's op slots (a feasible chain per request), or None
    upper: float  # the incumbent's total latency

    @property
    def requests(self) -> tuple[np.ndarray, ...]:
        """The kernels' per-request arrays (see :func:`kvsched.csp.bounds._seconds_kernels.price_chains`)."""
        return self.release, self.earliest, self.output, self.prompt, self.arrival, self.life, self.offset

    @property
    def sizes(self) -> tuple[float, float, int, float, float]:
        """The kernels' sizes: slot length, chunk cap, KV block, KV capacity in blocks and in tokens."""
        return self.delta, self.q, self.block, float(self.capacity), float(self.capacity * self.block)

    @property
    def windows(self) -> int:
        return -(-self.horizon // self.group)

    def window_sizes(self) -> np.ndarray:
        sizes = np.full(self.windows, self.group, dtype=np.float64)
        sizes[-1] = self.horizon - self.group * (self.windows - 1)
        return sizes

    def slots(self, per_window: np.ndarray) -> np.ndarray:
        """Per-window values spread over the slots (last axis)."""
        return np.ascontiguousarray(np.repeat(per_window, self.group, axis=-1)[..., : self.horizon])

    def windowed(self, per_slot: np.ndarray) -> np.ndarray:
        """Per-slot sums gathered per window (last axis)."""
        return np.add.reduceat(per_slot, np.arange(0, self.horizon, self.group), axis=-1)


def _coeffs(forms: list[Separable], q: float, s_max: int) -> tuple[np.ndarray, ...]:
    s = np.arange(s_max + 1, dtype=np.float64)
    gr = np.zeros((len(forms), s_max + 1))
    for k, f in enumerate(forms):
        own = f.per_token + f.prefill_token

        def chunk(c, f=f, own=own):
            # The last chunk of a refill: c tokens on top of S - c (c^2 + 2mc = 2Sc - c^2).
            return (
                own * c
                + f.prefill
                + f.prefill_quad * (2 * s * c - c * c)
                + f.prefill_kv * (s - c)
                + f.prefill_sq * c * c
            )

        big = np.minimum(s, q) if math.isfinite(q) else s
        # 2Sc - c^2 and the rest are concave in c: the least is at an end, c = 1 or c = min(q, S).
        gr[k] = np.where(s >= 1, np.minimum(chunk(1.0), chunk(np.maximum(big, 1.0))), 0.0)
    return (
        np.array([f.fixed + f.fixed_decode for f in forms]),  # fd
        np.array([f.fixed + f.fixed_prefill for f in forms]),  # fp
        np.array([f.per_token + f.decode for f in forms]),  # gd0
        np.array([f.decode_kv for f in forms]),  # gd1
        np.ascontiguousarray(np.maximum(gr, 0.0)),  # gr
        np.array([f.per_token + f.prefill_token + f.prefill_quad + f.prefill_sq for f in forms]),  # pt
        np.array([f.prefill for f in forms]),  # pr
    )


def incumbent_chains(
    data_release, earliest, output, offset, delta, trace: Trace, origin: float = 0.0
) -> np.ndarray | None:
    """The slots of each request's generating batches in ``trace`` (None if they break the relaxation).

    A run of k decode batches is read whole: each of its requests generates in every batch, so its next k
    chain entries are the batches' slots (spelling the run out as batch records took 50 s at 100k requests).

    Parameters
    ----------
    data_release
        Per request, its release slot (unused; kept for the callers' argument order).
    earliest
        Per request, the earliest slot of its first generating batch.
    output
        Per request, its output tokens O (its chain's length).
    offset
        Per request, where its chain starts in the flat array (exclusive prefix sums of ``output``).
    delta
        Slot length in seconds: a batch starting at t lies in slot ``floor((t - origin) / delta)``.
    trace
        A validated schedule's trace.
    origin
        The time slot 0 starts at (the first arrival less the core's TIME_TOL: no batch starts before it).

    Returns
    -------
    np.ndarray or None
        The flat chains (int64, ``output.sum()`` entries), or None when a request's batches are missing, start
        before its earliest slot or share a slot (the relaxation's chains are strictly increasing).
    """
    chains = np.full(int(output.sum()), -1, dtype=np.int64)
    done = np.zeros(output.size, dtype=np.int64)
    for rec in trace.entries:
        if type(rec) is RunRecord:
            gen = np.asarray(rec.requests, dtype=np.int64)
            if gen.size:
                slots = np.floor((rec.run.starts() - origin) / delta).astype(np.int64)
                steps = np.arange(slots.size, dtype=np.int64)
                chains[(offset[gen] + done[gen])[:, None] + steps[None, :]] = slots[None, :]
                done[gen] += slots.size
            continue
        gen = np.asarray(rec.generated, dtype=np.int64)
        if not gen.size:
            continue
        slot = math.floor((rec.start - origin) / delta)
        chains[offset[gen] + done[gen]] = slot
        done[gen] += 1
    if np.any(done != output) or np.any(chains[offset] < earliest):
        return None
    steps = np.diff(chains)
    inside = np.ones(steps.size, dtype=bool)
    inside[offset[1:] - 1] = False
    if np.any(steps[inside] <= 0):
        return None
    return chains


def prepare(instance: Instance, incumbent: Trace) -> SecondsChainData:
    """The relaxation's data; ``incumbent`` (a validated schedule's trace) sets the horizon and shares."""
    if not len(instance):
        raise InputError("the seconds Lagrangian needs at least one request")
    lim = instance.limits
    bb = batch_bounds(instance)
    if bb is None:
        raise InputError(
            f"the seconds Lagrangian does not bound the {instance_cost_model(instance).name!r} cost model"
        )
    all_forms, t_max = bb.forms, bb.t_max
    delta = max(shortest_batch(f) for f in all_forms) * (1.0 - SAFETY)
    if not delta > 0:
        raise InputError("the seconds Lagrangian needs a positive shortest batch time")
    forms = _pick_forms(all_forms)
    prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
    output = np.array([r.output for r in instance.requests], dtype=np.int64)
    # Slots count from the first arrival, before which no batch starts (but for the core's TIME_TOL): from
    # time 0, arrivals at 1e6 s made 1.9e8 slots of 5.4 ms (4.7 GB, 9-16 s of a 2 s solve of three requests,
    # 2026-11-29). Latencies are differences, so times relative to it give the same bound. A batch holding j
    # starts at s >= a_j - TIME_TOL, so its slot floor((s - origin) / delta) is at least j's release.
    absolute = np.array([r.arrival for r in instance.requests], dtype=np.float64)
    first = float(absolute.min())
    origin = first - TIME_TOL
    arrival = absolute - origin
    release = np.floor((absolute - first) / delta).astype(np.int64)
    chunk = min((c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None), default=None)
    q = math.inf if chunk is None else float(chunk)
    earliest = release + (np.maximum(1, -(-prompt // chunk)) - 1 if chunk is not None else 0)
    offset = np.concatenate([[0], np.cumsum(output)[:-1]]).astype(np.int64)
    completion = np.asarray(incumbent.state.completion, dtype=np.float64) - origin
    horizon = max(1, math.ceil(float(completion.max()) * (1 + HORIZON_MARGIN) / delta) + 1)
    life = np.minimum(np.floor(completion / delta).astype(np.int64), horizon - 1)
    count = np.zeros(horizon + 1)
    np.add.at(count, np.minimum(release, horizon), 1.0)
    np.add.at(count, np.minimum(life + 1, horizon), -1.0)
    phi = np.cumsum(count)[:horizon]
    inv_phi = np.where(phi > 0, 1.0 / np.maximum(phi, 1.0), 0.0) * (1.0 - SAFETY)
    # Windows several times the longest batch: the overrun o_W <= T_max costs little against them.
    group = max(1, -(-horizon // WINDOWS), math.ceil(SPAN * t_max / delta))
    prev = incumbent_chains(release, earliest, output, offset, delta, incumbent, origin)
    return SecondsChainData(
        release=release,
        earliest=earliest,
        output=output,
        prompt=prompt,
        arrival=arrival,
        life=life,
        offset=offset,
        inv_phi=inv_phi,
        delta=delta,
        q=q,
        block=int(lim.block_size),
        capacity=int(lim.kv_blocks),
        budget=lim.max_batch_tokens,
        t_max=float(t_max),
        horizon=horizon,
        group=group,
        forms=tuple(forms),
        coeffs=_coeffs(forms, q, int((prompt + output).max())),
        prev=prev,
        upper=float(np.sum(completion - arrival)),
    )


@dataclass(frozen=True, slots=True, eq=False)
class Pricing:
    """One evaluation of the Lagrangian: its value (seconds), chains and the rows' loads per window."""

    value: float
    price: np.ndarray
    chains: np.ndarray
    first: np.ndarray
    machine: np.ndarray  # (forms, windows): pieces per window
    memory: np.ndarray  # blocks per window
    tokens: np.ndarray  # tokens per window (empty without a budget)
    d_alpha: np.ndarray  # derivative of the chains' priced pieces in the share mixture, per window


def _multipliers(data: SecondsChainData, mu, y, z):
    mu = np.ascontiguousarray(np.maximum(mu, 0.0), dtype=np.float64).reshape(len(data.forms), data.windows)
    y = np.maximum(np.asarray(y, dtype=np.float64), 0.0)
    z = np.maximum(np.asarray(z, dtype=np.float64), 0.0) if data.budget is not None else np.zeros(0)
    return mu, y, z


def dual_value(data: SecondsChainData, price_sum: float, mu, y, z) -> float:
    """The Lagrangian value for chain prices summing to ``price_sum`` at multipliers ``(mu, y, z)``."""
    sizes = data.window_sizes()
    m = mu.sum(axis=0)
    drops = np.minimum(0.0, np.append(m[1:], 0.0) - m)  # o_W = T_max where the price falls after W
    value = price_sum - data.delta * float((mu * sizes).sum()) + data.t_max * float(drops.sum())
    value -= data.capacity * float(y @ sizes)
    if z.size:
        value -= float(data.budget) * float(z @ sizes)
    return value


def evaluate(data: SecondsChainData, mu, y, z=None, alpha=None, *, prev: np.ndarray | None = None) -> Pricing:
    """The Lagrangian at per-window multipliers: mu (forms x windows), y, z and the share mixture
    alpha in [0, 1] (windows; default 1: the incumbent's shares only)."""
    mu, y, z = _multipliers(data, mu, y, np.zeros(0) if z is None else z)
    alpha_s = data.slots(_mixture(data, alpha))
    k = _kernels()
    z_s = data.slots(z) if z.size else np.zeros(0)
    prices = (data.slots(mu), data.slots(y), z_s, data.inv_phi, alpha_s)
    use_prev = prev is not None
    prev_arr = prev if use_prev else np.zeros(1, dtype=np.int64)
    price, chains, first = k.price_chains(data.requests, data.sizes, prices, data.coeffs, prev_arr, use_prev)
    machine, memory, tokens, d_alpha = k.chain_loads(
        data.requests, data.sizes, prices, data.coeffs, chains, first
    )
    value = dual_value(data, float(price.sum()), mu, y, z)
    return Pricing(
        value,
        price,
        chains,
        first,
        data.windowed(machine),
        data.windowed(memory),
        data.windowed(tokens) if z.size else np.zeros(0),
        data.windowed(d_alpha),
    )


def _mixture(data: SecondsChainData, alpha) -> np.ndarray:
    if alpha is None:
        return np.ones(data.windows)
    return np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)


def evaluate_reference(data: SecondsChainData, mu, y, z=None, alpha=None) -> float:
    """The Lagrangian by the plain-Python reference pricing (full programme): for tests, tiny instances."""
    mu, y, z = _multipliers(data, mu, y, np.zeros(0) if z is None else z)
    z_s = data.slots(z) if z.size else np.zeros(0)
    prices = (data.slots(mu), data.slots(y), z_s, data.inv_phi, data.slots(_mixture(data, alpha)))
    price = _kernels().price_chains_reference(data.requests, data.sizes, prices, data.coeffs)
    return dual_value(data, float(price.sum()), mu, y, z)


@dataclass(frozen=True, slots=True, eq=False)
class SecondsLagrangian:
    """The bound, the multipliers that gave it and how it was reached (``history``: (seconds, bound))."""

    bound: Bound
    mu: np.ndarray
    y: np.ndarray
    z: np.ndarray
    iterations: int
    seconds: float
    incumbent: float
    history: tuple[tuple[float, float], ...] = field(default=())


def in_system(data: SecondsChainData) -> np.ndarray:
    """Requests in the system per window of the incumbent, averaged over the window's slots."""
    return data.windowed(
        np.where(data.inv_phi > 0, 1.0 / np.where(data.inv_phi > 0, data.inv_phi, 1.0), 0.0)
    ) / (data.window_sizes())


def predict_start(instance: Instance) -> float:
    """Seconds the data and the first pricing are predicted to take (neither checks a deadline inside)."""
    ops = float(sum(r.output for r in instance.requests))
    return (PREPARE_SECONDS_PER_OP + PRICING_SECONDS_PER_OP) * ops


def seconds_lagrangian(
    instance: Instance,
    objective: str = "total-latency",
    *,
    incumbent: Trace,
    deadline: Deadline | None = None,
    max_iterations: int = 200,
) -> SecondsLagrangian:
    """The best seconds-Lagrangian bound on total latency reached within ``deadline``.

    Parameters
    ----------
    incumbent
        A validated schedule's trace: its makespan sets the horizon, the requests it holds in the
        system share each slot's fixed cost, its occupancy warm-starts the machine prices, its value is
        the Polyak target and its op slots give each request a first known chain.
    deadline
        Checked before every pricing; a pricing predicted to overrun is not started.
    """
    wall = time.perf_counter()
    deadline = deadline or Deadline.never()
    if objective != "total-latency":
        raise InputError(f"the seconds Lagrangian bounds total latency, not {objective!r}")
    data = prepare(instance, incumbent)
    nf, nw = len(data.forms), data.windows
    sizes = data.window_sizes()
    mu = np.zeros((nf, nw))
    mu[0] = WARM * in_system(data)
    y = np.zeros(nw)
    z = np.zeros(nw if data.budget is not None else 0)
    alpha = np.full(nw, ALPHA0)
    history: list[tuple[float, float]] = []
    prev: list[np.ndarray | None] = [data.prev]
    scale_mu, scale_y = data.delta * sizes, data.capacity * sizes
    scale_z = float(data.budget) * sizes if data.budget is not None else sizes

    def price(x: tuple[np.ndarray, ...], reset: bool) -> tuple[float, tuple[np.ndarray, ...]]:
        mu, y, z, alpha = x
        got = evaluate(data, mu, y, z, alpha, prev=prev[0])
        prev[0] = got.chains
        # Subgradients of the rows divided by their right-hand sides.
        m = mu.sum(axis=0)
        o = np.where(m > np.append(m[1:], 0.0), data.t_max, 0.0)  # o_W after window W
        g_mu = (got.machine - data.delta * sizes - o + np.concatenate([[0.0], o[:-1]])) / scale_mu
        g_y = got.memory / scale_y - 1.0
        g_z = got.tokens / scale_z - 1.0 if z.size else z
        return got.value, (g_mu, g_y, g_z, got.d_alpha)

    def improved(value: float) -> None:
        history.append((time.perf_counter() - wall, to_bound(value)))

    # The share mixture: any alpha in [0, 1] is valid; it moves towards the side that prices more.
    first = PRICING_SECONDS_PER_OP * float(data.output.sum())  # a first pricing predicted to overrun: none
    ascent = Subgradient(
        data.upper, price, (scale_mu, scale_y, scale_z, 1.0), on_improve=improved, patience=PATIENCE,
        signed={3: Signed(ALPHA_STEP, 0.0, 1.0)}, first_cost=lambda x: first,
    )  # fmt: skip
    ascent.run((mu, y, z, alpha), deadline, max_iterations)
    best = ascent.best
    best_mu, best_y, best_z, _ = ascent.best_x
    iterations = ascent.iterations
    return SecondsLagrangian(
        bound=Bound(to_bound(best), SOURCE, Scope.ALL),
        mu=best_mu,
        y=best_y,
        z=best_z,
        iterations=iterations,
        seconds=time.perf_counter() - wall,
        incumbent=data.upper,
        history=tuple(history),
    )


def to_bound(value: float) -> float:
    """A reported bound: float round-off in the prices' sums cannot lift it above a schedule."""
    if not math.isfinite(value):
        return 0.0
    return max(0.0, value - 1e-9 * max(1.0, abs(value)))
