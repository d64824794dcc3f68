"""The exact time-indexed chain MILP with reduced-cost fixing, measured (run by hand, not a test).

Usage::

    python benchmarks/chain_milp.py --folder DIR                        # the three n = 100 rows, 300 s MILPs
    python benchmarks/chain_milp.py --folder DIR --cases azure-code-100-rho1 --prefix 20,40 --limit 60
    python benchmarks/chain_milp.py --check 30                          # tiny instances against the brute force

Each row: the instance (``--prefix k``: its first k requests), the incumbent ``U`` (``FOLDER/NAME.sched.json``
from ``kvsched solve NAME.json --time-limit 60 -o ...`` if present, else the incumbent stage and the local
search for ``--incumbent`` seconds), the chain Lagrangian's ``L(y)`` after ``--lagrangian`` seconds, the gap
``G = U - L(y)`` the arcs are fixed at, the arcs of the unreduced networks and those kept, the MILP's rows, its
LP relaxation (HiGHS, ``--lp-limit`` seconds, "-" when not solved), and HiGHS's proven bound and best value at
60 s and at the end (``--limit``), with the status and the wall time; "replay" says whether the best MILP
solution, decoded into a schedule, replays through the core at the MILP's value.

**The model** (unit time, no budget).

Each request ``j`` is a path in its own network: node ``(u, t)`` means "``u`` of its
``O_j`` generating ops done, at the start of slot ``t``"; from it a *wait* arc goes to ``(u, t + 1)``
and an *op* arc to ``(u + 1, t + 1)``, the request's op ``u + 1`` running in slot ``t`` and holding its
``w_{j,u+1} = blocks(I_j + u)`` KV there. The path starts at ``(0, r_j)`` (``r_j = floor(a_j)``, its
release slot) and its last op arc, in slot ``t``, ends it at the cost ``t + 1 - a_j`` (its latency).
Flows are binary; one row per slot says that the KV of the op arcs in it is at most ``M``::

    min  sum_j (t_{j,O_j} + 1 - a_j)   s.t.   sum_{(j,u): op u+1 of j in slot t} w_{j,u+1} <= M  for every t.

This is the chain relaxation of :mod:`kvsched.csp.bounds.chain` without a budget (no prompt batches, no
token rows, free gaps: ``chunk = 0``, ``earliest = release``) in integers, with a memory row on *every*
slot (the Lagrangian prices slots ``< H`` only). So its LP relaxation is at least the chain LP
(:func:`kvsched.csp.bounds.chain_lp.chain_lp`) and equals it when no row binds past ``H``.

**What its optimum ranges over** (:func:`applies`). Under unit time, with no token or prefill budget
and no ``max_running``, and with every arrival a whole number of slots, the integer model *is* the
problem: (i) every legal schedule maps to a feasible path set of value at most its own (the chain
relaxation's argument: a batch starting at ``s`` occupies slot ``floor(s)``, a request's generating
ops occupy distinct increasing slots ``>= floor(a_j)``, each holds its ``I + u - 1`` known tokens
during its batch, and ``C_j >= t_{j,O} + 1``); (ii) every feasible path set is a legal schedule of the
same value: one batch per slot with an op, starting at ``t`` (``>= a_j`` because ``a_j`` is a whole
slot), each request generating in it, paused requests evicted where their KV would not fit, which costs
nothing in time because a refill re-appends the ``I + G`` known tokens in the one batch that also
generates (:func:`kvsched.csp.incumbents.base.eviction_is_free`); the batch holds exactly the ops'
KV. The decoded schedule (:func:`kvsched.csp.incumbents.window.plan_schedule`) is replayed by the
core, never trusted alone. Its optimum is therefore the optimum over **every legal schedule** (scope
``all``), and a proven MILP bound is a bound for every legal schedule. With fractional arrivals (ii)
fails (slot ``floor(a_j)`` starts before ``a_j``), and the model is refused. ``--check N`` compares
the MILP's optimum with ``tests/brute.py`` (evictions allowed) on N tiny random instances of this class,
and replays each decoded schedule.

**Reduced-cost fixing.** For memory multipliers ``y >= 0`` (the chain Lagrangian's best, zero past its
horizon) let ``p_j(P) = cost_j(P) + sum_{op arcs of P} w y_t`` be a path's priced cost, ``p_j*`` its
minimum and ``L(y) = sum_j p_j* - M sum_t y_t``. For every feasible path set ``S`` of value ``V(S)``::

    V(S) - L(y) = sum_j (p_j(S_j) - p_j*) + sum_t y_t (M - load_t(S)),

and every term on the right is ``>= 0`` (paths cost at least their minimum; ``S`` fits ``M``). So for
each ``j``, ``p_j(S_j) - p_j* <= V(S) - L(y)``. With ``U`` the incumbent's value, every path set of
value ``<= U`` uses only paths of reduced cost ``<= G = U - L(y)``, and hence only arcs that lie on
such a path: an arc's cheapest path cost is ``F(from) + c(arc) + B(to)`` with ``F`` and ``B`` the
forward and backward dynamic programmes over ``(u, t)`` under ``y``, so arcs with ``F + c + B - p_j*
> G`` are dropped. This also bounds the horizon: a path ending in slot ``t`` costs at least ``t + 1 -
a_j``. The reduced model keeps every path set of value ``<= U``, the incumbent's own (whose chain
value is at most ``U``) included, so its optimum is the full model's and its proven bound is a bound
on it. The fixing is exact, not a heuristic; it is only as strong as ``G`` is small.

**Capped fixing** (``--cap``). Fixing at ``G' < G`` gives a restriction whose proven bound ``B'`` still
yields ``min(B', L(y) + G')`` for every legal schedule (a schedule using a dropped arc has a path of
reduced cost ``> G'``, so ``V > L(y) + G'`` by the identity above), and a restricted optimum ``V' <=
L(y) + G'`` is the optimum.

**Measured** (docs/regret_scale-probes.md, under *Which side is the 1k–10k gap on*): it does not pay
at n = 100. On Azure code the fixing at ``G = 74`` keeps 377k of 1.81M arcs, and HiGHS solves neither
the LP relaxation (dual simplex > 116 s, interior point > 300 s) nor the MILP's root in minutes; capped
at ``G' = 5`` (42k columns) it proves 2,443 against the Lagrangian's 2,438 in a minute (incumbent 2,512).
On the first 20 requests it proves the optimum at once; on the first 30 it does not in a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsched.costmodel import UnitCost
from kvsched.csp.bounds import chain_lagrangian
from kvsched.csp.bounds._chain_kernels import op_weights
from kvsched.csp.bounds.chain import ChainData
from kvsched.csp.bounds.seconds_lagrangian import incumbent_chains
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.incumbents import best_incumbent, improve
from kvsched.csp.incumbents.window import OpPlan, plan_schedule
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.highs import new_highs, run_highs, use_highs_threads
from kvsched.instances.io import load_instance
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.io import load_schedule
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import Trace, instance_cost_model, replay
from kvsched.stop import Deadline

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
import regret_scale

#: Source name of the MILP's proven bound.
SOURCE = "chain-milp"
#: Slack on the reduced-cost test and on rounding (float round-off of the multipliers' sums).
TOL = 1e-6
#: Seconds kept between HiGHS's own time limit and the deadline (reading the solution back, decoding).
MARGIN = 0.2


def applies(instance: Instance, objective: str = "total-latency") -> str | None:
    """Why the chain MILP is not exact for ``instance`` (None: it is, over every legal schedule).

    It needs unit time, total latency, no token or prefill budget, no running cap and every arrival a
    whole number of slots (the module docstring's argument).
    """
    cost = instance_cost_model(instance)
    lim = instance.limits
    if not isinstance(cost, UnitCost):
        return f"needs the unit time model, not {cost.name!r}"
    if objective != "total-latency":
        return f"bounds total latency only, not {objective!r}"
    if lim.max_batch_tokens is not None or lim.max_prefill_tokens is not None:
        return "a token or prefill budget makes refills cost time (the model would be a relaxation)"
    if lim.max_running is not None:
        return "a running cap is not in the model"
    if not len(instance):
        return "no requests"
    arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64) / cost.slot
    if np.any(np.abs(arrival - np.round(arrival)) > 1e-9):
        return "an arrival inside a slot (the model would start its first batch before it)"
    return None


@dataclass(frozen=True, slots=True, eq=False)
class Network:
    """One request's reduced network: the arcs kept, as (ops done ``u``, slot offset ``i = t - r``) pairs.

    Op arc ``(u, i)`` runs op ``u + 1`` in slot ``r + i``; wait arc ``(u, i)`` goes from node ``(u, i)``
    to ``(u, i + 1)``. ``price`` is the request's cheapest priced path cost ``p_j*``.
    """

    release: int
    ops: np.ndarray  # (k, 2) int64
    waits: np.ndarray  # (k, 2) int64
    price: float


@dataclass(frozen=True, slots=True, eq=False)
class Reduction:
    """The reduced networks, the multipliers' value ``L(y)`` and the gap ``G`` they were fixed at."""

    networks: tuple[Network, ...]
    value: float  # L(y), slots
    gap: float  # G = U - L(y)
    full_arcs: int  # arcs of the unreduced networks over the same windows
    seconds: float


def reduce(data: ChainData, y: np.ndarray, upper: float, cap: float = math.inf) -> Reduction:
    """Reduced-cost fixing at multipliers ``y`` (zero past ``len(y)``) for paths of value ``<= upper`` (slots).

    ``data`` must have no chunk cap (``chunk == 0``). First each request's cheapest priced path (over
    the slots up to where its path wholly past ``len(y)`` ends, which costs ``max(r, H) + O - a`` and
    bounds ``p_j*``), so ``L(y)`` and ``G``; then its arcs over windows ``ceil(G)`` slots longer, the
    last slot a path of reduced cost ``<= G`` can reach (it costs at least ``t + 1 - a``). With ``cap``
    below ``U - L(y)`` the arcs are fixed at ``G = cap`` instead (a restriction: see :func:`solve_chain_milp`).
    """
    if data.chunk:
        raise KvschedError("the chain MILP has no prompt batches: it needs an instance without a budget")
    wall = time.perf_counter()
    horizon = y.size
    prices = np.array([_forward(data, j, y, n)[1] for j, n in enumerate(_windows(data, horizon, 0))])
    value = float(prices.sum() - data.capacity * y.sum())
    gap = upper - value
    if gap < -TOL * max(1.0, abs(upper)):
        raise KvschedError(f"the multipliers' bound {value:.3f} is above the incumbent {upper:.3f}")
    gap = max(0.0, min(gap, cap))
    nets, full = [], 0
    for j, n in enumerate(_windows(data, horizon, math.ceil(gap))):
        net, arcs = _network(data, j, y, n, gap)
        nets.append(net)
        full += arcs
    return Reduction(tuple(nets), value, gap, full, time.perf_counter() - wall)


def _windows(data: ChainData, horizon: int, extra: int) -> np.ndarray:
    """Slots each request's programmes run over, from its release: to where its path wholly past
    ``horizon`` ends (``max(r, H) + O - 1``, so its cheapest path is inside), plus ``extra`` slots."""
    last = np.maximum(data.release, horizon) + data.output - 1
    return (last - data.release + 1 + extra).astype(np.int64)


def _weights(data: ChainData, j: int) -> np.ndarray:
    """Op u's KV in blocks (u = 1..O at index u - 1): the relaxation's own weights."""
    return op_weights(int(data.prompt[j]), int(data.output[j]), data.block)


def _prices(y: np.ndarray, r: int, length: int) -> np.ndarray:
    """The multipliers of slots ``r .. r + length - 1`` (zero past ``len(y)``)."""
    out = np.zeros(length)
    hi = min(y.size, r + length)
    if hi > r:
        out[: hi - r] = y[r:hi]
    return out


def _forward(data: ChainData, j: int, y: np.ndarray, length: int) -> tuple[np.ndarray, float]:
    """F[u, i]: the cheapest priced cost of reaching node (u ops done, slot r + i), u = 0..O-1; and p_j*."""
    o, r, a = int(data.output[j]), int(data.release[j]), float(data.arrival[j])
    ys, w = _prices(y, r, length), _weights(data, j)
    f = np.full((o, length + 1), np.inf)
    f[0] = 0.0  # waiting is free
    for u in range(1, o):
        step = np.full(length + 1, np.inf)
        step[1:] = f[u - 1, :-1] + w[u - 1] * ys
        f[u] = np.minimum.accumulate(step)
    last = f[o - 1, :-1] + w[o - 1] * ys + (r + np.arange(length) + 1 - a)
    return f, float(last.min())


def _network(data: ChainData, j: int, y: np.ndarray, length: int, gap: float) -> tuple[Network, int]:
    """Request ``j``'s arcs of reduced cost ``<= gap`` (and its unreduced arc count over the window)."""
    o, r, a = int(data.output[j]), int(data.release[j]), float(data.arrival[j])
    ys, w = _prices(y, r, length), _weights(data, j)
    f, price = _forward(data, j, y, length)
    # B[u, i]: the cheapest cost from node (u, i) to the end (the last op's latency included).
    b = np.full((o + 1, length + 1), np.inf)
    b[o] = r + np.arange(length + 1) - a  # node (O, i): the last op ran in slot r + i - 1, its latency
    for u in range(o - 1, -1, -1):
        step = np.full(length + 1, np.inf)
        step[:-1] = w[u] * ys + b[u + 1, 1:]
        b[u] = np.minimum.accumulate(step[::-1])[::-1]
    limit = price + gap + TOL * max(1.0, abs(price) + abs(gap))
    op_rc = f[:, :-1] + w[:, None] * ys[None, :] + b[1:, 1:]  # op u + 1 in slot r + i, from node (u, i)
    wait_rc = f[:, :-1] + b[:o, 1:]  # node (u, i) to (u, i + 1)
    ops = np.argwhere(op_rc <= limit)
    waits = np.argwhere(wait_rc <= limit)
    full = int(np.isfinite(op_rc).sum() + np.isfinite(wait_rc).sum())
    return Network(r, ops.astype(np.int64), waits.astype(np.int64), price), full


@dataclass(frozen=True, slots=True, eq=False)
class Model:
    """The reduced MILP as CSC columns: ops first, then waits (per request in order)."""

    cost: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray
    integer: np.ndarray  # column indices that are binary (the op arcs: the waits follow by conservation)
    row_lo: np.ndarray
    row_hi: np.ndarray
    mem_slots: np.ndarray  # slot of each memory row (rows 0..len-1)
    op_cols: tuple[dict, ...]  # per request: (u, i) -> column
    wait_cols: tuple[dict, ...]


def build(data: ChainData, red: Reduction) -> Model:
    """The MILP over the reduced networks: flow conservation per node, one memory row per used slot."""
    slots = sorted({int(net.release + i) for net in red.networks for i in net.ops[:, 1].tolist()})
    mem_row = {t: k for k, t in enumerate(slots)}
    n_rows = len(slots)
    cost, counts, index, value, row_lo, row_hi = [], [], [], [], [], []
    integer, op_cols, wait_cols = [], [], []
    col = 0
    for j, net in enumerate(red.networks):
        o, a = int(data.output[j]), float(data.arrival[j])
        w = _weights(data, j)
        nodes: dict[tuple[int, int], int] = {}

        def node(key: tuple[int, int], nodes=nodes) -> int:
            if key not in nodes:
                nodes[key] = len(nodes)
            return nodes[key]

        source = node((0, 0))
        base = n_rows
        ocols, wcols = {}, {}
        for u, i in net.ops.tolist():
            t = net.release + i
            rows, vals = [mem_row[t], base + node((u, i))], [w[u], -1.0]
            if u + 1 < o:
                rows.append(base + node((u + 1, i + 1)))
                vals.append(1.0)
                cost.append(0.0)
            else:
                cost.append(t + 1 - a)
            index.extend(rows)
            value.extend(vals)
            counts.append(len(rows))
            integer.append(col)
            ocols[(u, i)] = col
            col += 1
        for u, i in net.waits.tolist():
            index.extend([base + node((u, i)), base + node((u, i + 1))])
            value.extend([-1.0, 1.0])
            counts.append(2)
            cost.append(0.0)
            wcols[(u, i)] = col
            col += 1
        # inflow - outflow: -1 at the source, 0 elsewhere (the last op arcs leave to an implicit sink).
        rhs = np.zeros(len(nodes))
        rhs[source] = -1.0
        row_lo.append(rhs)
        row_hi.append(rhs)
        n_rows += len(nodes)
        op_cols.append(ocols)
        wait_cols.append(wcols)
    start = np.zeros(len(counts) + 1, dtype=np.int32)
    start[1:] = np.cumsum(counts)
    lo = np.concatenate([np.full(len(slots), -np.inf), *row_lo])
    hi = np.concatenate([np.full(len(slots), float(data.capacity)), *row_hi])
    return Model(
        np.array(cost), start, np.array(index, dtype=np.int32), np.array(value), np.array(integer, dtype=np.int32),
        lo, hi, np.array(slots, dtype=np.int64), tuple(op_cols), tuple(wait_cols),
    )  # fmt: skip


def hint(data: ChainData, model: Model, chains: np.ndarray) -> np.ndarray | None:
    """The column values of flat ``chains`` (a schedule's op slots), or None if an arc was fixed away."""
    x = np.zeros(model.cost.size)
    for j in range(data.n):
        r, o, s = int(data.release[j]), int(data.output[j]), int(data.offset[j])
        slots = chains[s : s + o] - r
        prev = 0
        for u in range(o):
            i = int(slots[u])
            for k in range(prev, i):
                c = model.wait_cols[j].get((u, k))
                if c is None:
                    return None
                x[c] = 1.0
            c = model.op_cols[j].get((u, i))
            if c is None:
                return None
            x[c] = 1.0
            prev = i + 1
    return x


def decode(data: ChainData, model: Model, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each request's op slots (absolute) from a MILP solution's op columns."""
    out = []
    for j in range(data.n):
        slots = sorted((u, int(data.release[j]) + i) for (u, i), c in model.op_cols[j].items() if x[c] > 0.5)
        out.append(np.array([t for _, t in slots], dtype=np.int64))
    return tuple(out)


@dataclass(frozen=True, slots=True, eq=False)
class ChainMilp:
    """What a chain MILP run proved and found.

    ``bound`` is HiGHS's proven dual bound, rounded up to a whole number of slots (None if none);
    ``value`` and ``schedule``/``trace`` the best MILP solution, decoded and replayed by the core
    (None if HiGHS found none better than nothing, or its replay disagreed: ``stats['mismatch']``).
    """

    bound: Bound | None
    value: float | None
    schedule: Schedule | None
    trace: Trace | None
    status: str
    stats: dict = field(default_factory=dict)


def solve_chain_milp(
    instance: Instance,
    y: np.ndarray,
    incumbent: Trace,
    deadline: Deadline,
    *,
    threads: int = 2,
    lp: bool = False,
    snapshots: tuple[float, ...] = (),
    lp_limit: float = math.inf,
    milp_limit: float = math.inf,
    cap: float = math.inf,
) -> ChainMilp:
    """Reduce, build and solve the chain MILP of ``instance`` by ``deadline``.

    Parameters
    ----------
    instance
        An instance :func:`applies` accepts (else :class:`KvschedError`).
    y
        Memory multipliers ``>= 0`` (the chain Lagrangian's best; zero past their length).
    incumbent
        A validated schedule's trace: its value is ``U`` for the fixing, and its op slots the warm start.
    deadline
        HiGHS is interrupted once it has passed.
    threads
        HiGHS threads.
    lp
        Also solve the reduced model's LP relaxation first, for at most ``lp_limit`` seconds (reported in
        ``stats['lp']``).
    milp_limit
        HiGHS's time limit on the MILP (besides the deadline).
    cap
        Fix the arcs at ``G' = min(cap, U - L(y))``. Below ``U - L(y)`` the model is a restriction, and
        its proven bound ``B'`` gives ``min(B', L(y) + G')`` for every legal schedule: a schedule outside
        it has a path of reduced cost ``> G'``, so its value exceeds ``L(y) + G'`` (the identity in the
        module docstring), and one inside is worth at least ``B'``.
    snapshots
        Seconds into the MILP at which its bound and best value are recorded (``stats['at']``).
    """
    import highspy

    why = applies(instance)
    if why is not None:
        raise KvschedError(f"the chain MILP does not apply: {why}")
    data = ChainData.from_instance(instance)
    slot = data.slot
    upper = float(OBJECTIVES["total-latency"](incumbent)) / slot
    red = reduce(data, np.maximum(0.0, np.asarray(y, dtype=np.float64)), upper, cap)
    capped = red.gap < upper - red.value - TOL
    model = build(data, red)
    stats: dict = {
        "lagrangian_value": red.value,
        "gap_fixed": red.gap,
        "arcs_full": red.full_arcs,
        "columns": int(model.cost.size),
        "binaries": int(model.integer.size),
        "rows": int(model.row_lo.size),
        "memory_rows": int(model.mem_slots.size),
        "reduce_s": red.seconds,
    }
    h = new_highs(threads)
    inf = highspy.kHighsInf
    h.addRows(
        model.row_lo.size, np.where(np.isinf(model.row_lo), -inf, model.row_lo), model.row_hi, 0,
        np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0),
    )  # fmt: skip
    n = model.cost.size
    h.addCols(
        n, model.cost, np.zeros(n), np.ones(n), model.index.size, model.start[:-1], model.index, model.value
    )
    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):  # HiGHS's limit misses some
        callback.subscribe(lambda event: event.interrupt() if deadline.expired() else None)
    if lp and not deadline.expired():
        h.setOptionValue("time_limit", max(0.01, min(lp_limit, deadline.remaining() - MARGIN)))
        began = time.perf_counter()
        run_highs(h, Deadline.never(), interrupts=False)
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            stats["lp"] = float(h.getInfo().objective_function_value)
        stats["lp_s"] = time.perf_counter() - began
        h.clearSolver()
    h.changeColsIntegrality(
        model.integer.size, model.integer, np.array([highspy.HighsVarType.kInteger] * model.integer.size)
    )
    # The objective is a whole number of slots less the (whole) arrivals: a gap under one slot is closed.
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
    chains = incumbent_chains(data.release, data.earliest, data.output, data.offset, slot, incumbent)
    if chains is not None:
        x0 = hint(data, model, chains)
        stats["hinted"] = x0 is not None
        if x0 is not None:
            sol = highspy.HighsSolution()
            sol.col_value = x0.tolist()
            sol.value_valid = True
            h.setSolution(sol)
    at: list[tuple[float, float, float | None]] = []
    pending = sorted(snapshots)

    def snap(event) -> None:
        d = event.data_out
        while pending and d.running_time >= pending[0]:
            value = d.objective_function_value
            at.append(
                (pending.pop(0), float(d.mip_dual_bound), float(value) if math.isfinite(value) else None)
            )

    if snapshots:
        h.cbMipInterrupt.subscribe(snap)
    h.setOptionValue("time_limit", max(0.01, min(milp_limit, deadline.remaining() - MARGIN)))
    use_highs_threads(threads)
    began = time.perf_counter()
    run_highs(h, Deadline.never(), interrupts=False)
    stats["milp_s"] = time.perf_counter() - began
    ms = h.getModelStatus()
    info = h.getInfo()
    status = h.modelStatusToString(ms)
    stats["at"] = at
    stats["nodes"] = int(info.mip_node_count)
    stats["capped"] = capped
    regular = ms in (
        highspy.HighsModelStatus.kOptimal,
        highspy.HighsModelStatus.kTimeLimit,
        highspy.HighsModelStatus.kInterrupt,
    )
    bound = None
    if regular and math.isfinite(info.mip_dual_bound):
        # A run proven optimal has no dual bound below its value (an infeasible restriction would be +inf).
        proven = min(info.mip_dual_bound, red.value + red.gap) if capped else info.mip_dual_bound
        stats["restricted_bound"] = float(info.mip_dual_bound)
        total = float(data.arrival.sum())
        slots = math.ceil(proven + total - TOL * max(1.0, abs(proven) + total))
        bound = Bound(slot * max(0.0, slots - total), SOURCE, Scope.ALL)
    elif capped and ms == highspy.HighsModelStatus.kInfeasible:  # nothing inside: every schedule is outside
        total = float(data.arrival.sum())
        proven = red.value + red.gap
        bound = Bound(
            slot * max(0.0, math.ceil(proven + total - TOL * max(1.0, proven + total)) - total),
            SOURCE,
            Scope.ALL,
        )
    schedule = trace = value = None
    if info.primal_solution_status == 2:
        x = np.asarray(h.getSolution().col_value)
        plan = OpPlan(
            np.arange(int(model.mem_slots.max()) + 1, dtype=np.float64) * slot, decode(data, model, x)
        )
        schedule = plan_schedule(instance, plan, slot, {"found_by": SOURCE})
        try:
            trace = replay(instance, schedule, instance_cost_model(instance))
            value = float(OBJECTIVES["total-latency"](trace))
        except KvschedError as exc:  # the model and the core disagree: never trust the MILP alone
            stats["mismatch"] = str(exc)
            schedule = trace = None
        if value is not None and abs(value - slot * info.objective_function_value) > 1e-6 * max(1.0, value):
            stats["mismatch"] = f"replayed {value} against the MILP's {slot * info.objective_function_value}"
    return ChainMilp(bound, value, schedule, trace, status, stats)


# -- the experiment --------------------------------------------------------------------------------------


def prefix(instance: Instance, k: int) -> Instance:
    """The first ``k`` requests of ``instance`` (same limits and time model)."""
    return dataclasses.replace(instance, requests=instance.requests[:k], name=f"{instance.name}[:{k}]")


def incumbent_of(instance: Instance, path: Path, seconds: float) -> Trace:
    """The trace of ``path``'s schedule if it exists, else of the incumbent stage plus the local search."""
    cost = instance_cost_model(instance)
    if path.exists():
        return replay(instance, load_schedule(str(path), instance), cost)
    deadline = Deadline.after(seconds)
    best = best_incumbent(instance, "total-latency", deadline.share(0.5))
    best = improve(instance, best, deadline)
    return best.trace if best.trace is not None else replay(instance, best.schedule, cost)


def _f(x: float | None, digits: int = 0) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def measure(instance: Instance, trace: Trace, args: argparse.Namespace) -> list[str]:
    """One table row (see the module docstring)."""
    wall = time.perf_counter()
    lag = chain_lagrangian(instance, incumbent=trace, deadline=Deadline.after(args.lagrangian))
    res = solve_chain_milp(
        instance, lag.y, trace, Deadline.after(args.limit + (args.lp_limit if args.lp else 0.0)),
        threads=args.threads, lp=args.lp, snapshots=(60.0,), lp_limit=args.lp_limit, milp_limit=args.limit,
        cap=args.cap,
    )  # fmt: skip
    st = res.stats
    at = {t: (b, v) for t, b, v in st.get("at", [])}
    b60, v60 = at.get(60.0, (None, None))
    if b60 is not None and st["capped"]:  # a restriction: what it proves for every schedule
        b60 = min(b60, st["lagrangian_value"] + st["gap_fixed"])
    if 60.0 not in at and st.get("milp_s", 0.0) < 60.0:  # ended before 60 s: its final figures
        b60, v60 = (res.bound.value if res.bound else None), res.value
    replayed = "no solution" if res.value is None else ("mismatch" if "mismatch" in st else "ok")
    upper = float(OBJECTIVES["total-latency"](trace))
    return [
        instance.name, str(len(instance)), _f(upper), _f(st["lagrangian_value"], 2), _f(st["gap_fixed"], 2),
        _f(st["arcs_full"]), _f(st["columns"]), _f(st["rows"]), _f(st.get("lp"), 2), _f(st.get("lp_s"), 1),
        _f(b60, 1), _f(v60), _f(res.bound.value if res.bound else None), _f(res.value), res.status,
        _f(st.get("milp_s"), 1), replayed, _f(time.perf_counter() - wall, 1),
    ]  # fmt: skip


COLUMNS = (
    "instance", "n", "U", "L(y)", "G", "arcs", "kept", "rows", "LP", "LP s", "bound@60", "value@60",
    "bound", "value", "status", "MILP s", "replay", "wall s",
)  # fmt: skip


def check(count: int, seconds: float, cap: float) -> int:
    """Tiny random instances: the MILP's optimum equals the brute force and its schedule replays (with a
    ``cap``: its bound is at most the brute force and its value at least)."""
    from tests.brute import brute_force

    rng = np.random.default_rng(0)
    bad = 0
    for k in range(count):
        n = int(rng.integers(1, 4))
        reqs = tuple(
            Request(f"r{i}", float(rng.integers(0, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4)))
            for i in range(n)
        )
        peak = max(r.peak_kv for r in reqs)
        kv = int(rng.integers(peak, max(peak, sum(r.peak_kv for r in reqs)) + 1))
        inst = Instance(reqs, Limits(kv_capacity=kv), TimeModel("unit"), name=f"tiny{k}")
        opt = brute_force(inst, "total-latency", allow_eviction=True)
        trace = simulate(inst, make_policy("vllm")).trace
        lag = chain_lagrangian(inst, incumbent=trace, deadline=Deadline.after(seconds))
        res = solve_chain_milp(inst, lag.y, trace, Deadline.after(seconds), cap=cap)
        if math.isfinite(cap):
            ok = res.bound is not None and res.bound.value <= opt + 1e-9 and "mismatch" not in res.stats
            ok = ok and (res.value is None or res.value >= opt - 1e-9)
        else:
            ok = res.value is not None and abs(res.value - opt) < 1e-9 and res.bound is not None
            ok = ok and abs(res.bound.value - opt) < 1e-9 and "mismatch" not in res.stats
        bad += not ok
        print(
            f"{inst.name}: n {n} M {kv} brute {opt:g} milp {res.value} bound {res.bound} {'ok' if ok else 'BAD'}"
        )
    print(f"{count - bad} of {count} agree")
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", default="/tmp/kvsched-chain-milp", help="instances and schedules")
    parser.add_argument("--cases", default="azure-code-100-rho1,azure-conv-100-rho1,sharegpt-100-rho1")
    parser.add_argument(
        "--prefix", default="", help="comma-separated k: also the first k requests of each case"
    )
    parser.add_argument("--prefix-only", action="store_true", help="only the prefixes, not the whole cases")
    parser.add_argument("--limit", type=float, default=300.0, help="MILP seconds (default 300)")
    parser.add_argument("--lp-limit", type=float, default=60.0, help="LP relaxation seconds (default 60)")
    parser.add_argument("--no-lp", dest="lp", action="store_false", help="skip the LP relaxation")
    parser.add_argument(
        "--lagrangian", type=float, default=20.0, help="chain Lagrangian seconds (default 20)"
    )
    parser.add_argument("--incumbent", type=float, default=30.0, help="incumbent seconds without a schedule")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cap", type=float, default=math.inf, help="fix the arcs at min(cap, U - L(y))")
    parser.add_argument(
        "--check", type=int, default=0, help="only check N tiny instances against brute force"
    )
    args = parser.parse_args(argv)
    if args.check:
        return check(args.check, 10.0, args.cap)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    picked = regret_scale.select(regret_scale.cases([100], [1.0]), args.cases)
    table = Table(
        title=f"chain MILP with reduced-cost fixing, HiGHS {args.threads} threads, {args.limit:g} s"
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("instance", "status", "replay") else "right")
    refused = 0
    for case in picked:
        path = regret_scale.generate(case, folder)
        full = load_instance(str(path))
        why = applies(full)
        if why is not None:  # (a budget case: one line, and the other cases still run)
            print(f"{case.name}: the chain MILP does not apply: {why}", file=sys.stderr)
            refused += 1
            continue
        sizes = [int(s) for s in args.prefix.split(",") if s]
        for k in sizes + ([] if args.prefix_only else [len(full)]):
            inst = full if k >= len(full) else prefix(full, k)
            sched = folder / (f"{case.name}.sched.json" if inst is full else f"{case.name}-{k}.none")
            row = measure(inst, incumbent_of(inst, sched, args.incumbent), args)
            table.add_row(*row)
            print("  " + " | ".join(row), flush=True)
    Console(width=240).print(table)
    load = os.getloadavg()
    print(
        f"load average (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores"
    )
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
