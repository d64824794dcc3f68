"""The knapsack greedy: where eviction is free, each slot packs the KV by value, not only by rank.

Under unit time without a token or prefill budget an eviction costs nothing (a refill
re-appends the I + G known tokens in one batch that also generates, exactly as a
decode would), so each slot is a free choice of which active requests generate a
token, subject to their KV fitting M: the op of a request that has generated G
tokens holds w = I + G tokens. The priority greedy (:func:`~.greedy.greedy`) walks
the requests by remaining KV area and packs them first-fit; at memory load 1 its
last few percent of M go unused or to whatever fits, and total latency there is
very sensitive to how the memory is used (Azure conversations, 1,000 requests,
M = 20,000: the greedy's 490,122 becomes 439,904 with 2% more memory).

This greedy takes, each slot, the K best requests by remaining KV area (times a
per-request scale, as the local search moves them), runs the best first-fit while
more than a share ``tail`` of M stays free, and then chooses among the rest the subset of
largest total w / key (the weighted-shortest-first ratio: KV this op holds per unit
of the request's remaining area) that fits the KV left, by a 0/1 knapsack over at
most ``cells`` capacity cells (sizes rounded up to a cell, so the choice always
fits), filling what rounding leaves first-fit. Holders that do not run stay paused
where their KV fits and are evicted otherwise.

Measured (load about 2.5, ``python benchmarks/regret_scale.py`` instances, the
greedy alone): Azure conversations 1k at memory load 1, 490,122 -> about 465,000
(-5%); Azure code 1k 37,588 -> 36,953; ShareGPT 1k 353,955 -> 353,272.

Under a token budget C and a prefill budget P (unit time) eviction is no longer free: a
refill takes budget, and known tokens beyond q = min(C, P) take several batches. Items
then also spend tokens (a decode one of C; a prefill or refill all its tokens of C and P),
every pass offers only items that fit the budget left, a request whose known tokens do
not fit starts with a first chunk of at least q / :data:`MIN_CHUNK_SHARE` tokens and then gets its
next chunk first every slot (it holds KV without generating), and holders' keys are
lowered by :data:`HOLD_WEIGHT` times their KV times their refill's batches (what evicting
them costs). The no-budget decisions are unchanged. Against the best of the priority
greedy's budget variants (``best_incumbent(inst, variants=BUDGET_VARIANTS, policies=())``),
greedy alone, C = P = 2048, M = 20,000, 1k requests, memory loads 0.9 / 1 / 1.1: Azure
code -8.1 / -7.0 / -9.1%, Azure conversations -2.4 / -4.3 / -2.7%, ShareGPT +0.1 / -0.1 /
-0.1%.

Where a long queue drains at the rate the memory is used (memory load 1, 10k requests), the share of M
that goes unused decides the latency: there an item's value w / key^p with p < 1 (``ratio_power``) keeps
M fuller at some cost in rank, and :func:`~kvsched.csp.incumbents.best.best_incumbent` runs such
configurations (:class:`KnapsackConfig`) first (docs/regret_scale-probes.md, *The schedules at 10k*).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any, Literal, overload

import numpy as np

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.incumbents import _knapsack_kernel as K
from kvsched.csp.incumbents.base import Incumbent, Unbuilt, has_budget
from kvsched.csp.incumbents.greedy import incumbent_of
from kvsched.csp.incumbents.log import BatchLog, sealed, with_room
from kvsched.csp.objectives import objective_function
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.jit import is_compiled, use_compiled
from kvsched.schedule.data import ProblemData
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline

#: Candidates per slot: the best K waiting requests by key, and more while they hold under 1.5 M
#: between them, up to MAX_CANDIDATES.
CANDIDATES = 64
MAX_CANDIDATES = 512
#: Capacity cells of the knapsack (the KV left is divided into at most this many).
CELLS = 1024
#: Share of M the knapsack chooses for; the best candidates take the rest first-fit, by rank (1: the
#: knapsack chooses for all of M).
TAIL = 0.25
#: Under a budget, the smallest first chunk of a prompt (or refill) longer than q = min(C, P), by default
#: (``min_chunk=None``) q / MIN_CHUNK_SHARE: 256 tokens at q = 2048, as the priority greedy's budget variants
#: use. Measured, greedy alone: at C = P = 2048 (nine 1k instances) q / 8, q / 16, q / 32 give -3.8 / -3.7 /
#: -3.6% against the best budget variant; at C = 2048, P = 512 (Azure code 1k) 256 tokens is +9.3%, 64 -1.0%.
MIN_CHUNK_SHARE = 8
#: Under a budget, a holder's key is lowered by this many times its KV times its refill's batches (measured
#: on nine 1k instances at C = P = 2048, memory loads 0.9-1.1: 0 / 4 / 8 / 16 / 32 give -1.6 / -2.8 / -3.4 /
#: -3.8 / -3.6% against the best budget variant of the priority greedy, geometric mean).
HOLD_WEIGHT = 16.0
#: The power of the key in an item's knapsack value, w / key^power: 1 is the weighted-shortest-first ratio;
#: below 1 the knapsack leans towards filling M (at 0 it packs by KV alone, ties to the better rank).
RATIO_POWER = 1.0
#: The batch and eviction logs start with room for this many entries at least, the item log with room for
#: ITEM_ROOM times sum(O) items beside a slot's candidates (without a budget there are exactly sum(O)); each
#: grows when full.
LOG_ROOM = 1024
ITEM_ROOM = 1.25
#: Slots decided between two deadline checks (compiled, interpreted kernel).
CHUNK_JIT, CHUNK_PY = 4096, 64
#: Seconds the interpreted kernel takes per slot (a high estimate), for choosing it over a cold compile.
PY_SECONDS_PER_SLOT = 2e-3


def compiled_kernels() -> list:
    """The numba kernels this greedy runs (what ``kvsched warmup`` compiles and checks)."""
    return [K.advance_jit]


def applies(instance: Instance, cost_model: CostModel | None = None) -> bool:
    """Whether the knapsack greedy takes ``instance``: unit time and no ``max_running`` cap.

    Token and prefill budgets are taken (first chunks and pinned requests: :mod:`._knapsack_kernel`).
    """
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    return isinstance(cost_model, UnitCost) and instance.limits.max_running is None


def decide(
    instance: Instance,
    *,
    scale: np.ndarray | None = None,
    candidates: int = CANDIDATES,
    cells: int = CELLS,
    tail: float = TAIL,
    min_chunk: int | None = None,
    hold_weight: float = HOLD_WEIGHT,
    chunk_discount: float = 0.0,
    ratio_power: float = RATIO_POWER,
    deadline: Deadline | None = None,
    jit: bool = True,
) -> BatchLog:
    """Run the knapsack greedy's decisions and return its batch log (not yet a schedule).

    Parameters
    ----------
    scale
        Per-request positive factors on the remaining-area keys (default 1).
    candidates, cells, tail
        K, the knapsack's capacity cells, and the share of M it chooses for (the best candidates take
        the rest first-fit by rank).
    min_chunk
        Under a budget, the smallest first chunk a prompt (or refill) longer than q = min(C, P) starts
        with (at most q; default q / :data:`MIN_CHUNK_SHARE`).
    hold_weight
        Under a budget, a request holding m KV tokens waits with its key lowered by ``hold_weight`` times
        m times the batches its refill would take (what evicting it costs), as the priority greedy's
        ``refill_weight`` does; ignored without a budget, where eviction is free.
    chunk_discount
        Under a budget, the knapsack value of a request that starts with a first chunk (its known tokens
        take k > 1 batches) is divided by 1 + ``chunk_discount`` (k - 1): it generates nothing for k
        batches. Measured, greedy alone, against the best budget variant: 0 / 1 give -3.8 / -3.3% at
        C = P = 2048 (nine 1k instances), Azure code 1k rho1 -1.0 / -8.9% at C = 2048, P = 512 and -2.8 /
        -10.5% at C = P = 512, Azure conversations +6.1 / +8.5% and -2.7 / -1.3% there.
    ratio_power
        The knapsack values an item at w / key^``ratio_power`` (:data:`RATIO_POWER`). Below 1 it trades
        rank for a fuller M: at memory load 1 with 10k requests, where the queue is long and a few percent
        of M decide how fast it drains, ``tail=0.5, ratio_power=0.2`` (greedy alone, against the default)
        gives Azure code -10.0%, Azure conversations -6.2%, ShareGPT -2.3% without a budget and
        -6.5 / -2.4 / -1.6% at C = P = 2048; at 1k it is within -1.1..+1.0% (+0.5..+1.0% with the
        budget), at 100 up to +4%.
    deadline
        Once it expires the remaining slots are packed first-fit over the candidates only.
    jit
        Use the compiled kernel (else the interpreted reference, same decisions); a kernel not
        compiled yet is compiled only where that fits the deadline (:func:`kvsched.jit.use_compiled`).

    Raises
    ------
    InputError
        If ``instance`` is not under unit time or it caps the running requests.
    """
    cost_model = instance_cost_model(instance)
    if not applies(instance, cost_model):
        raise InputError("the knapsack greedy needs unit time and no max_running cap")
    instance.check_feasible()
    deadline = deadline or Deadline.never()
    n = len(instance)
    if jit and not is_compiled(K.advance_jit):
        jit = use_compiled(
            [K.advance_jit], deadline, interpreted_seconds=PY_SECONDS_PER_SLOT * n * 8
        )  # about 8 slots a request at memory load 1
    lim = instance.limits
    ia = np.zeros((7, n), dtype=np.int64)  # phase (row 6) starts at PREFILL = 0
    data = ProblemData.of(instance)
    ia[0] = data.prompt
    ia[1] = data.output
    fa = np.zeros((4, n), dtype=np.float64)
    fa[0] = data.arrival
    fa[1] = 1.0 if scale is None else np.asarray(scale, dtype=np.float64)
    if not np.all(np.isfinite(fa[1]) & (fa[1] > 0)):
        raise InputError("knapsack greedy: every scale must be a positive number")
    if not (math.isfinite(ratio_power) and ratio_power >= 0):
        raise InputError(f"knapsack greedy: ratio_power must be a number >= 0, got {ratio_power!r}")
    ia[5] = np.argsort(fa[0], kind="stable")
    candidates = max(1, int(candidates))
    tail = min(1.0, max(0.0, tail))
    budget_c = K.NONE if lim.max_batch_tokens is None else int(lim.max_batch_tokens)
    budget_p = K.NONE if lim.max_prefill_tokens is None else int(lim.max_prefill_tokens)
    q = min(budget_c, budget_p)
    limits = np.array(
        [
            lim.kv_blocks,
            lim.block_size,
            candidates,
            max(1, int(cells)),
            int(tail * lim.kv_blocks),
            0,
            max(candidates, MAX_CANDIDATES),
            budget_c,
            budget_p,
            max(1, min(q // MIN_CHUNK_SHARE if min_chunk is None else int(min_chunk), q)),
        ],
        dtype=np.int64,
    )
    sc = np.zeros(8, dtype=np.int64)
    budgeted = has_budget(instance)
    clock = np.array(
        [
            float(fa[0].min()) if n else 0.0,
            float(cost_model.slot),
            tail,
            float(hold_weight) if budgeted else 0.0,
            max(0.0, float(chunk_discount)),
            float(ratio_power),
        ]
    )
    ib = np.zeros((6, n), dtype=np.int64)
    # Without a budget every item generates a token, so the items are exactly sum(O): the item log is
    # sized for them (a quarter more for a budget's chunks) and grows only if that is short, as does each
    # other buffer (np.zeros commits only the pages written).
    cap = max(LOG_ROOM, 2 * int(ia[1].max(initial=1)))
    bf = np.zeros(cap)
    bi = np.zeros((2, cap + 1), dtype=np.int64)
    it = np.zeros((4, int(limits[6]) + n + int(ITEM_ROOM * ia[1].sum())), dtype=np.int64)
    ev = np.zeros(cap + n, dtype=np.int64)
    kernel = K.advance_jit if jit else K.advance_py
    chunk = CHUNK_JIT if jit else CHUNK_PY
    while n:
        status = kernel(ia, fa, limits, sc, clock, ib, bf, bi, it, ev, chunk)
        if status == K.DONE:
            break
        if status == K.GROW:  # the buffers the kernel's next slot might overrun
            nbat, nit, nev = int(sc[3]), int(sc[4]), int(sc[5])
            bf = with_room(bf, nbat + 2)
            bi = with_room(bi, bf.shape[0] + 1)
            it = with_room(it, nit + int(limits[6]) + n + 1)  # its candidates and pinned requests
            ev = with_room(ev, nev + 2 * n + 1)  # its holders and pinned requests
        if limits[5] == 0 and deadline.expired():
            limits[5] = 1
    nb, ni, ne = int(sc[3]), int(sc[4]), int(sc[5])
    phases = sealed(it[3, :ni].astype(np.int8))  # (the kernel's codes are the core's Phase codes)
    return BatchLog(
        bf[:nb].copy(),
        np.full(nb, float(cost_model.slot)),
        bi[0, : nb + 1].copy(),
        bi[1, : nb + 1].copy(),
        sealed(it[0, :ni]),  # (the kernel is done with its log: the schedule shares it)
        sealed(it[1, :ni]),
        sealed(it[2, :ni]),
        phases,
        ev[:ne].copy(),
    )


@dataclass(frozen=True, slots=True)
class KnapsackConfig:
    """One configuration of the knapsack greedy: the keyword arguments of :func:`knapsack` it sets.

    ``hold_weight`` and ``min_chunk`` act under a token or prefill budget only.
    """

    tail: float = TAIL
    ratio_power: float = RATIO_POWER
    hold_weight: float = HOLD_WEIGHT
    min_chunk: int | None = None
    cells: int = CELLS

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def name(self, budgeted: bool) -> str:
        """The incumbent's name: ``knapsack:remaining-area`` and whatever differs from the defaults."""
        parts = []
        if (self.tail, self.ratio_power) != (TAIL, RATIO_POWER):
            parts.append(f"/tail={self.tail:g}/ratio-power={self.ratio_power:g}")
        if budgeted and self.hold_weight != HOLD_WEIGHT:
            parts.append(f"/hold-weight={self.hold_weight:g}")
        if budgeted and self.min_chunk is not None:
            parts.append(f"/min-chunk={self.min_chunk}")
        if self.cells != CELLS:
            parts.append(f"/cells={self.cells}")
        return "knapsack:remaining-area" + "".join(parts)


@overload
def knapsack(instance: Instance, *, build: Literal[True] = ..., **kwargs: Any) -> Incumbent: ...
@overload
def knapsack(instance: Instance, *, build: bool, **kwargs: Any) -> Incumbent | Unbuilt: ...


def knapsack(
    instance: Instance,
    *,
    scale: np.ndarray | None = None,
    candidates: int = CANDIDATES,
    cells: int = CELLS,
    tail: float = TAIL,
    min_chunk: int | None = None,
    hold_weight: float = HOLD_WEIGHT,
    chunk_discount: float = 0.0,
    ratio_power: float = RATIO_POWER,
    objective: str = "total-latency",
    deadline: Deadline | None = None,
    jit: bool = True,
    name: str | None = None,
    replay_schedule: bool = True,
    build: bool = True,
) -> Incumbent | Unbuilt:
    """The knapsack greedy's schedule, replayed through the core, with its objective value.

    Parameters are those of :func:`decide`; ``objective`` names what ``value`` measures;
    ``replay_schedule=False`` values the schedule on the log instead (as
    :func:`~kvsched.csp.incumbents.greedy.greedy` does; ``trace`` is then None), and with ``build=False``
    too the run comes back :class:`~kvsched.csp.incumbents.base.Unbuilt`.

    Raises
    ------
    InputError
        As :func:`decide`.
    ScheduleError
        If the core rejects a batch (a bug here, never a user error).
    """
    objective_function(objective)  # an unknown objective is refused before any work
    cost_model = instance_cost_model(instance)
    t0 = time.perf_counter()
    log = decide(
        instance,
        scale=scale,
        candidates=candidates,
        cells=cells,
        tail=tail,
        min_chunk=min_chunk,
        hold_weight=hold_weight,
        chunk_discount=chunk_discount,
        deadline=deadline,
        jit=jit,
        ratio_power=ratio_power,
    )
    t1 = time.perf_counter()
    label = name or KnapsackConfig(tail, ratio_power, hold_weight, min_chunk, cells).name(
        has_budget(instance)
    )
    params = {"rule": "remaining-area", "candidates": candidates, "cells": cells, "tail": tail}
    if ratio_power != RATIO_POWER:
        params["ratio_power"] = ratio_power
    if has_budget(instance):
        params["min_chunk"] = min_chunk
        params["hold_weight"] = hold_weight
        params["chunk_discount"] = chunk_discount
    return incumbent_of(
        instance, log, label, params, objective, cost_model, decide_s=t1 - t0, replay_schedule=replay_schedule,
        build=build,
    )  # fmt: skip
