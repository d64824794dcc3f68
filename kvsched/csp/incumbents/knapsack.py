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
"""

from __future__ import annotations

import time

import numpy as np

from kvsched.costmodel.base import CostModel
from kvsched.csp.incumbents import _knapsack_kernel as K
from kvsched.csp.incumbents.base import Incumbent, eviction_is_free
from kvsched.csp.incumbents.log import BatchLog
from kvsched.csp.objectives import objective_function
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.jit import is_compiled, use_compiled
from kvsched.schedule.ir import Phase
from kvsched.schedule.validate import instance_cost_model, replay
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
#: Slots decided between two deadline checks (compiled, interpreted kernel).
CHUNK_JIT, CHUNK_PY = 4096, 64
#: Seconds the interpreted kernel takes per slot (a high estimate), for choosing it over a cold compile.
PY_SECONDS_PER_SLOT = 2e-3


def applies(instance: Instance, cost_model: CostModel | None = None) -> bool:
    """Whether the knapsack greedy takes ``instance``: eviction is free and no ``max_running`` cap."""
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    return eviction_is_free(instance, cost_model) and instance.limits.max_running is None


def decide(
    instance: Instance,
    *,
    scale: np.ndarray | None = None,
    candidates: int = CANDIDATES,
    cells: int = CELLS,
    tail: float = TAIL,
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
    deadline
        Once it expires the remaining slots are packed first-fit over the candidates only.
    jit
        Use the compiled kernel (else the interpreted reference, same decisions); a kernel not
        compiled yet is compiled only where that fits the deadline (:func:`kvsched.jit.use_compiled`).

    Raises
    ------
    InputError
        If eviction is not free on ``instance`` (seconds-based time, a token or prefill budget) or it
        caps the running requests.
    """
    cost_model = instance_cost_model(instance)
    if not applies(instance, cost_model):
        raise InputError(
            "the knapsack greedy needs free eviction (unit time, no token or prefill budget) and no "
            "max_running cap"
        )
    instance.check_feasible()
    deadline = deadline or Deadline.never()
    n = len(instance)
    if jit and not is_compiled(K.advance_jit):
        jit = use_compiled(
            [K.advance_jit], deadline, interpreted_seconds=PY_SECONDS_PER_SLOT * n * 8
        )  # about 8 slots a request at memory load 1
    lim = instance.limits
    ia = np.zeros((6, n), dtype=np.int64)
    ia[0] = [r.prompt for r in instance.requests]
    ia[1] = [r.output for r in instance.requests]
    fa = np.zeros((3, n), dtype=np.float64)
    fa[0] = [r.arrival for r in instance.requests]
    fa[1] = 1.0 if scale is None else np.asarray(scale, dtype=np.float64)
    if not np.all(np.isfinite(fa[1]) & (fa[1] > 0)):
        raise InputError("knapsack greedy: every scale must be a positive number")
    ia[5] = np.argsort(fa[0], kind="stable")
    candidates = max(1, int(candidates))
    limits = np.array(
        [
            lim.kv_blocks,
            lim.block_size,
            candidates,
            max(1, int(cells)),
            int(min(1.0, max(0.0, tail)) * lim.kv_blocks),
            0,
            max(candidates, MAX_CANDIDATES),
        ],
        dtype=np.int64,
    )
    sc = np.zeros(7, dtype=np.int64)
    clock = np.array([float(fa[0].min()) if n else 0.0, float(cost_model.slot)])
    ib = np.zeros((5, n), dtype=np.int64)
    # Every item generates a token: at most sum(O) items and batches, and evictions at most items.
    cap = max(1024, min(int(ia[1].sum()), 4 * n + 1024))
    bf = np.zeros(cap)
    bi = np.zeros((2, cap + 1), dtype=np.int64)
    it = np.zeros((3, cap + int(limits[6])), dtype=np.int64)
    ev = np.zeros(cap + n, dtype=np.int64)
    kernel = K.advance_jit if jit else K.advance_py
    chunk = CHUNK_JIT if jit else CHUNK_PY
    while n:
        status = kernel(ia, fa, limits, sc, clock, ib, bf, bi, it, ev, chunk)
        if status == K.DONE:
            break
        if status == K.GROW:  # double every log buffer (rare: the first guess covers most runs)
            bf = np.concatenate([bf, np.zeros_like(bf)])
            bi = np.concatenate([bi, np.zeros_like(bi)], axis=1)
            it = np.concatenate([it, np.zeros_like(it)], axis=1)
            ev = np.concatenate([ev, np.zeros_like(ev)])
        if limits[5] == 0 and deadline.expired():
            limits[5] = 1
    nb, ni, ne = int(sc[3]), int(sc[4]), int(sc[5])
    phases = np.where(
        it[2, :ni] > 0,
        int(Phase.DECODE),
        np.where(_generated_before(it, ia, ni), int(Phase.REFILL), int(Phase.PREFILL)),
    )
    return BatchLog(
        bf[:nb].copy(),
        np.full(nb, float(cost_model.slot)),
        bi[0, : nb + 1].copy(),
        bi[1, : nb + 1].copy(),
        it[0, :ni].copy(),
        it[1, :ni].copy(),
        it[2, :ni].copy(),
        phases.astype(np.int8),
        ev[:ne].copy(),
    )


def _generated_before(it: np.ndarray, ia: np.ndarray, ni: int) -> np.ndarray:
    """Per item holding no KV: whether its request had generated before (a refill, else the prefill)."""
    # An item with no KV processes every known token, I + G: more than I exactly when G > 0.
    return it[1, :ni] > ia[0][it[0, :ni]]


def knapsack(
    instance: Instance,
    *,
    scale: np.ndarray | None = None,
    candidates: int = CANDIDATES,
    cells: int = CELLS,
    tail: float = TAIL,
    objective: str = "total-latency",
    deadline: Deadline | None = None,
    jit: bool = True,
    name: str | None = None,
) -> Incumbent:
    """The knapsack greedy's schedule, replayed through the core, with its objective value.

    Parameters are those of :func:`decide`; ``objective`` names what ``value`` measures.

    Raises
    ------
    InputError
        As :func:`decide`.
    ScheduleError
        If the core rejects a batch (a bug here, never a user error).
    """
    measure = objective_function(objective)
    cost_model = instance_cost_model(instance)
    t0 = time.perf_counter()
    log = decide(
        instance, scale=scale, candidates=candidates, cells=cells, tail=tail, deadline=deadline, jit=jit
    )
    t1 = time.perf_counter()
    label = name or "knapsack:remaining-area"
    params = {"rule": "remaining-area", "candidates": candidates, "cells": cells, "tail": tail}
    schedule = log.to_schedule({"policy": label, "params": params})
    t2 = time.perf_counter()
    trace = replay(instance, schedule, cost_model)
    stats = {
        "decide_s": t1 - t0,
        "build_s": t2 - t1,
        "replay_s": time.perf_counter() - t2,
        "batches": log.num_batches,
        "entries": len(schedule.entries),
        "evictions": log.num_evictions,
    }
    return Incumbent(label, schedule, measure(trace), objective, stats, trace)
