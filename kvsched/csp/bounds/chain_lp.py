"""The chain LP: the linear programme whose optimum the chain Lagrangian reaches (a yardstick for tests).

Each request's chains are the paths of a small network (nodes: ops done x slot,
after a prompt phase of prompt batches done x other prompt tokens placed or not x
slot; arcs: wait a slot, or run the next op or prompt batch in this slot, or place
the prompt tokens in this slot), so its chain polytope is
integral and the LP with the coupling rows (mem_t) (completions' ghosts included) and (tok_t) of
:mod:`kvsched.csp.bounds.chain` added has the same optimum as the Lagrangian
dual ``max_{y, z >= 0} L(y, z)`` over the same horizon ``H`` (slots ``>= H``
unpriced: from node (u, H) an arc to the sink charges the contiguous finish
``H + O - u``). Sized for small instances only: ``O(sum_j O_j H)`` columns.
"""

from __future__ import annotations

import numpy as np

from kvsched.csp.bounds._chain_kernels import (
    ghost_slots,
    ghost_weight,
    op_weight,
    prompt_weight,
    refill_batches,
)
from kvsched.csp.bounds.chain import LATENCY, ChainData
from kvsched.highs import new_highs, run_highs
from kvsched.stop import Deadline


def chain_lp(data: ChainData, horizon: int, threads: int = 1) -> tuple[float, np.ndarray, np.ndarray]:
    """The chain LP over slots ``< horizon``: its value (slots) and the row duals as ``(y, z)`` (>= 0)."""
    import highspy

    budget = data.budget is not None
    cols: list[tuple[float, list[int], list[float]]] = []  # (cost, rows, coefficients)
    n_mem = horizon
    n_tok = horizon if budget else 0
    row = n_mem + n_tok  # flow rows start after the coupling rows
    rhs: list[float] = []
    for j in range(data.n):
        o, e, r, a = int(data.output[j]), int(data.earliest[j]), int(data.release[j]), float(data.arrival[j])
        i_j = int(data.prompt[j])
        lo = min(r, horizon)
        top = max(horizon, e)
        npre = int(data.pre_offset[j + 1] - data.pre_offset[j])
        node: dict[tuple, int] = {}

        def nid(key: tuple, node=node) -> int:
            if key not in node:
                node[key] = len(node)
            return node[key]

        arcs: list[tuple[float, int, int | None, list[int], list[float]]] = []  # cost, from, to, rows, coefs
        # The prompt phase, nodes ("p", k, placed, t): k of the npre prompt batches before the first
        # token's done, and (with budget rows) whether the other I - 1 prompt tokens are placed yet; they
        # go in one slot of [r, t_1] whatever the batches do (the kernel's two separate minima).
        flags = (0, 1) if budget else (1,)
        for t in range(lo, top):
            for k in range(npre + 1):
                # Waiting after batch k of the last pass holds what it left (nothing is evicted there).
                held = prompt_weight(i_j, npre - k + 1, data.chunk, data.block)
                hold = ([t], [held]) if k > 0 and t < horizon else ([], [])
                for f in flags:
                    arcs.append((0.0, nid(("p", k, f, t)), nid(("p", k, f, t + 1)), *hold))
                    if k < npre:  # prompt batch k + 1 in slot t holds >= I - (npre - k) q tokens
                        rows, coefs = [], []
                        w = prompt_weight(i_j, npre - k, data.chunk, data.block)
                        if t < horizon and w > 0:
                            rows, coefs = [t], [w]
                        arcs.append((0.0, nid(("p", k, f, t)), nid(("p", k + 1, f, t + 1)), rows, coefs))
                if budget:  # place the other I - 1 prompt tokens in slot t
                    rows = [n_mem + t] if t < horizon else []
                    arcs.append(
                        (0.0, nid(("p", k, 0, t)), nid(("p", k, 1, t)), rows, [i_j - 1.0] * len(rows))
                    )
            # Prompt done (and tokens placed): the first token may follow in this slot.
            arcs.append((0.0, nid(("p", npre, 1, t)), nid((0, t)), [], []))
        layers = o if data.objective == LATENCY else 1  # TTFT: later ops are free past H
        held = op_weight(i_j, o, data.block)

        def ghost(last: int, rows: list[int], coefs: list[float], held: float = held) -> None:
            # The completion's ghost (``data.growth`` 0: none) in the memory rows after the last op.
            for k in range(1, min(ghost_slots(held, data.growth), horizon - 1 - last) + 1):
                rows.append(last + k)
                coefs.append(ghost_weight(held, data.growth, k))

        for k in range(npre + 1):
            for f in flags:
                # From slot `top` on nothing is priced: the rest of the prompt batches, then every op,
                # contiguously.
                arcs.append((top + npre - k + layers - a, nid(("p", k, f, top)), None, [], []))
        for u in range(layers):
            # Under a chunk cap a gap between ops holds the KV of op u (I + u - 1 tokens), or the request is
            # evicted ("ev" nodes, free) and its refill's last pass puts k1 batches just before op u + 1.
            gaps = data.chunk > 0 and u >= 1
            if gaps:
                k1 = refill_batches(i_j, u + 1, data.chunk)
                for t in range(e + u, top):
                    arcs.append((0.0, nid((u, t)), nid(("ev", u, t)), [], []))
                    arcs.append((0.0, nid(("ev", u, t)), nid(("ev", u, t + 1)), [], []))
                    if t + k1 >= top:
                        continue
                    rows, coefs = [], []
                    for m in range(1, k1 + 1):
                        if t + k1 - m < horizon:
                            rows.append(t + k1 - m)
                            coefs.append(prompt_weight(i_j + u, m, data.chunk, data.block))
                    if t + k1 < horizon:
                        rows.append(t + k1)
                        coefs.append(op_weight(i_j, u + 1, data.block))
                        if budget:
                            rows.append(n_mem + t + k1)
                            coefs.append(1.0)
                    if u + 1 == layers:
                        ghost(t + k1, rows, coefs)
                        arcs.append((t + k1 + 1 - a, nid(("ev", u, t)), None, rows, coefs))
                    else:
                        arcs.append((0.0, nid(("ev", u, t)), nid((u + 1, t + k1 + 1)), rows, coefs))
                arcs.append((top + k1 + layers - u - a, nid(("ev", u, top)), None, [], []))
            for t in range(lo if u == 0 else e + u, top):
                # Wait a slot: before the first op, holding what the last prompt batch left; after op u,
                # under a chunk cap, holding its KV.
                if u == 0 and npre and t < horizon:
                    hold = ([t], [prompt_weight(i_j, 1, data.chunk, data.block)])
                elif gaps and t < horizon:
                    hold = ([t], [op_weight(i_j, u, data.block)])
                else:
                    hold = ([], [])
                arcs.append((0.0, nid((u, t)), nid((u, t + 1)), *hold))
                if u == 0 and t < e:
                    continue
                rows, coefs = [], []
                if t < horizon:  # op u + 1 in slot t holds I + u tokens
                    rows, coefs = [t], [op_weight(i_j, u + 1, data.block)]
                    if budget:
                        rows.append(n_mem + t)
                        coefs.append(1.0)
                if u + 1 == layers:
                    ghost(t, rows, coefs)
                    arcs.append((t + 1 - a, nid((u, t)), None, rows, coefs))
                else:
                    arcs.append((0.0, nid((u, t)), nid((u + 1, t + 1)), rows, coefs))
            # From slot `top` on nothing is priced: finish contiguously.
            arcs.append((top + layers - u - a, nid((u, top)), None, [], []))
        source = nid(("p", 0, flags[0], lo))
        base = row
        for cost, frm, to, rows, coefs in arcs:
            r_ = [*rows, base + frm]
            c_ = [*coefs, -1.0]
            if to is not None:
                r_.append(base + to)
                c_.append(1.0)
            cols.append((cost, r_, c_))
        # Flow conservation: inflow - outflow = -1 at the source, 0 elsewhere (the sink is implicit).
        flow = np.zeros(len(node))
        flow[source] = -1.0
        rhs.extend(flow.tolist())
        row += len(node)

    h = new_highs(threads)
    inf = highspy.kHighsInf
    lower = np.concatenate([np.full(n_mem + n_tok, -inf), np.array(rhs)])
    upper = np.concatenate(
        [np.full(n_mem, float(data.capacity)), np.full(n_tok, float(data.budget or 0)), np.array(rhs)]
    )
    h.addRows(len(lower), lower, upper, 0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), [])
    start, index, value = [0], [], []
    for _, r_, c_ in cols:
        index.extend(r_)
        value.extend(c_)
        start.append(len(index))
    costs = np.array([c for c, _, _ in cols])
    h.addCols(
        len(cols), costs, np.zeros(len(cols)), np.full(len(cols), inf),
        len(index), np.array(start[:-1], dtype=np.int32), np.array(index, dtype=np.int32), np.array(value),
    )  # fmt: skip
    run_highs(h, Deadline.never(), interrupts=False)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"chain LP: {h.modelStatusToString(h.getModelStatus())}")
    duals = np.array(h.getSolution().row_dual)
    y = np.maximum(0.0, -duals[:n_mem])
    z = np.maximum(0.0, -duals[n_mem : n_mem + n_tok])
    return float(h.getInfo().objective_function_value), y, z
