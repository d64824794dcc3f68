"""Op-chain pricing under block-constant multipliers: a numba kernel and a plain-Python reference.

:mod:`kvsched.csp.bounds.chain` prices each request's cheapest op chain by a
dynamic programme over (ops done, slot). When the multipliers are constant on
blocks of ``B`` consecutive slots (``y_t = Y_b`` and ``z_t = Z_b`` for
``t in [b B, b B + B)``), a chain's price depends only on how many ops it puts
in each block, on where its first op is (for the prompt tokens) and on where its
last op is (the objective). ``m`` ops in block ``b`` cost ``Y_b (W(u) - W(u - m))
+ Z_b m`` (``W`` the prefix sum of the op weights), fit in distinct slots of the
block if ``m <= cap_b`` (the slots of the block at or after the earliest slot
``e``), and the last of them is at least ``start_b + m - 1`` (``start_b =
max(b B, e)``), which the earliest placement attains. So the programme runs over
(ops done at the end of block ``b``):

    f_b(u) = Y_b W(u) + Z_b u + min_{u - cap_b <= v <= u} [f_{b-1}(v) - Y_b W(v) - Z_b v],

a sliding-window minimum (a monotone deque), ``O(states)`` per block instead of
``O(states x B)``. This is the **exact** chain price at such multipliers (no
relaxation beyond the chain relaxation itself), so with ``B = 1`` it is
:func:`kvsched.csp.bounds._chain_kernels.price_chains` again.

The band argument carries over: a chain costing ``U`` (contiguous from ``e``,
wholly past the horizon, or last call's optimum re-priced) bounds the optimum,
op ``u`` of an optimal chain lies in ``[e + u - 1, e + u - 1 + width)``, so the
ops done at the end of block ``b`` (last slot ``T``) lie in ``[T - e - width +
2, T - e + 1]``: ``width`` states per block, ``(O + width) / B`` blocks. The
other ``I - 1`` prompt tokens sit in the cheapest block from the release's to
the first op's (the cheapest slot of ``[r, t_1]`` when ``z`` is block-constant).
Past the multipliers' end every price is 0 (the zero-price tail).

Under a token budget the objective also charges the completion's ghost after the last op
(:func:`kvsched.csp.bounds._chain_kernels.ghost_price`), which depends on that op's exact
slot: a chain finishing in block ``b`` puts its last op in the slot of the block where the
objective term plus the ghost is least (exact: the last op may sit anywhere after the
block's other ops).

Chains are returned slot by slot (each block's ops at its earliest slots, a last op where
its ghost was priced) so that :func:`kvsched.csp.bounds._chain_kernels.chain_loads` and the
slot-level pricing's band (``prev``) use them unchanged.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kvsched.csp.bounds._chain_kernels import (
    BAND_TOL,
    LATENCY,
    TTFT,
    ghost_price,
    ghost_slots,
    ghost_weight,
    op_weight,
    pre_cost,
    prompt_weight,
)

__all__ = ["LATENCY", "TTFT", "price_blocks", "price_blocks_python"]


@nb.njit(cache=True)
def _pre_min(i_j, npre, chunk, kv_block, span, y, b, s):  # pragma: no cover - compiled
    """The cheapest prompt batches for a first op in block ``b`` at or after slot ``s``, and that slot.

    From slot ``b span + npre`` on they all lie in block ``b`` and cost the same, so only the first
    ``npre + 1`` slots are tried.
    """
    best = np.inf
    at = s
    for t1 in range(s, min(b * span + span - 1, max(s, b * span + npre)) + 1):
        c = pre_cost(i_j, npre, chunk, kv_block, y, span, t1)
        if c < best:
            best = c
            at = t1
    return best, at


@nb.njit(cache=True)
def _price_one(
    j, release, earliest, output, prompt, arrival, offset, kv_block, span, y, z, has_z, objective, prev, use_prev,
    chains, pslot, chunk, pre_offset, pre_chains, growth, reach,
):  # pragma: no cover - compiled  # fmt: skip
    e = earliest[j]
    # The prompt batches before the first op (see _chain_kernels): just before it. Under block-constant
    # multipliers the cheapest of them for a first op in block b is taken on its own (_pre_min), apart
    # from the ops' placement at the block's earliest slots: a lower bound on each chain's price, exact
    # for span 1.
    npre = pre_offset[j + 1] - pre_offset[j]
    o = output[j]
    a = arrival[j]
    r = release[j]
    i_j = prompt[j]
    nblk = y.size
    big = nblk * span  # slots >= big are priced 0
    rest = float(i_j - 1)
    # W(u): blocks held by ops 1..u.
    wsum = np.empty(o + 1)
    wsum[0] = 0.0
    for u in range(1, o + 1):
        wsum[u] = wsum[u - 1] + float((i_j + u - 1 + kv_block - 1) // kv_block)
    # The completion's ghost (total latency under a budget, see _chain_kernels.ghost_price): it depends on
    # the last op's exact slot, so a chain finishing in a block puts its last op where that costs least.
    held = wsum[o] - wsum[o - 1]
    nghost = ghost_slots(held, growth) if objective == LATENCY else 0  # slots it covers after the last op

    # An upper bound on the optimum: (1) contiguous from e, (2) wholly past the horizon, (3) last optimum.
    ub = max(big + npre, e) + (o if objective == LATENCY else 1) - a
    zp = np.inf  # the cheapest z in [r, t] as t grows (block-constant z: a running minimum over blocks)
    zp_at = r
    if has_z:
        for t in range(r, min(e, big)):
            if z[t // span] < zp:
                zp = z[t // span]
                zp_at = t
    c = 0.0
    m = zp
    for u in range(1, o + 1):
        t = e + u - 1
        if t < big:
            c += (wsum[u] - wsum[u - 1]) * y[t // span]
            if has_z:
                c += z[t // span]
                if u == 1:
                    m = min(m, z[t // span])
                    c += rest * m
        if objective == TTFT:
            break
    c += pre_cost(i_j, npre, chunk, kv_block, y, span, e)
    c += e + (o if objective == LATENCY else 1) - a
    if nghost:
        c += ghost_price(held, growth, y, span, e + o - 1)
    ub = min(ub, c)
    if use_prev and prev[offset[j]] >= 0:
        c = 0.0
        last = 0
        for u in range(1, o + 1):
            t = prev[offset[j] + u - 1]
            if t < 0:
                break
            last = t
            if t < big:
                c += (wsum[u] - wsum[u - 1]) * y[t // span]
                if has_z:
                    c += z[t // span]
        t1 = prev[offset[j]]
        c += pre_cost(i_j, npre, chunk, kv_block, y, span, t1)
        if has_z and t1 < big:
            mm = zp
            for t in range(e, t1 + 1):
                mm = min(mm, z[t // span])
            c += rest * mm
        c += (last if objective == LATENCY else t1) + 1 - a
        if nghost:
            c += ghost_price(held, growth, y, span, last)
        ub = min(ub, c)

    if objective == LATENCY:
        width = max(int(np.floor(a + ub - o - e + BAND_TOL)) + 1, 1)
        tmax = e + o - 1 + width - 1  # the last op's latest slot
    else:
        width = max(int(np.floor(a + ub - 1 - e + BAND_TOL)) + 1, 1)
        tmax = e + width - 1
    b0 = e // span
    b1 = tmax // span
    nb_ = b1 - b0 + 1

    if objective == TTFT:
        best = np.inf
        bt = e
        bt1 = e
        bp = r
        zp_run = zp
        zarg = zp_at
        for b in range(b0, b1 + 1):
            s = max(b * span, e)
            yb = y[b] if b < nblk else 0.0
            zb = z[b] if (has_z and b < nblk) else 0.0
            v = wsum[1] * yb + s + 1 - a
            if has_z:
                if zb < zp_run:
                    zp_run = zb
                    zarg = max(b * span, r)
                v += zb + rest * zp_run
            pre, at = _pre_min(i_j, npre, chunk, kv_block, span, y, b, s) if npre else (0.0, s)
            v += pre
            if v < best:
                best = v
                bt = s
                bp = zarg
                bt1 = at
        chains[offset[j]] = bt
        for u in range(2, o + 1):
            chains[offset[j] + u - 1] = -1
        pslot[j] = bp
        for k in range(npre):
            pre_chains[pre_offset[j] + k] = bt1 - npre + k
        return best

    # States: ops done at the end of block b, u in [lo_b, hi_b] (u < o; finishing is handled apart).
    lo = np.empty(nb_ + 1, dtype=np.int64)
    hi = np.empty(nb_ + 1, dtype=np.int64)
    lo[0] = 0  # before block b0: nothing done
    hi[0] = 0
    for k in range(nb_):
        t_end = (b0 + k) * span + span - 1
        lo[k + 1] = max(0, t_end - e - width + 2)
        hi[k + 1] = min(o - 1, t_end - e + 1)
    size = min(width, o) + 1  # states per block: at most the band width, and at most O
    f_prev = np.full(size, np.inf)
    f_prev[0] = 0.0
    f_cur = np.empty(size)
    arg = np.empty((nb_ + 1, size), dtype=np.int32)  # ops done before the block, per state
    parg = np.empty(nb_ + 1, dtype=np.int64)  # prompt slot if the chain starts in this block
    pt1 = np.empty(nb_ + 1, dtype=np.int64)  # the first op's slot its prompt batches were priced for
    dq = np.empty(size + 1, dtype=np.int64)
    g = np.empty(size)
    best = np.inf
    best_k = -1
    best_v = 0
    best_late = 0
    zp_run = zp
    zarg = zp_at
    for k in range(1, nb_ + 1):
        b = b0 + k - 1
        s = max(b * span, e)
        cap = b * span + span - s
        yb = y[b] if b < nblk else 0.0
        zb = z[b] if (has_z and b < nblk) else 0.0
        start_cost = 0.0
        if has_z:
            if zb < zp_run:
                zp_run = zb
                zarg = max(b * span, r)
            start_cost = rest * zp_run
        pt1[k] = s
        if npre:
            pre, pt1[k] = _pre_min(i_j, npre, chunk, kv_block, span, y, b, s)
            start_cost += pre
        parg[k] = zarg
        plo, phi = lo[k - 1], hi[k - 1]
        bend = b * span + span - 1
        if nghost:
            # reach[i]: the least of t - bend + ghost(t) over t in [bend - nghost + 1 + i, bend] (slots whose
            # ghost reaches past the block); before them the ghost lies in this block: yb times its sum.
            for i in range(nghost - 1, -1, -1):
                t = bend - nghost + 1 + i
                reach[i] = t - bend + ghost_price(held, growth, y, span, t)
                if i + 1 < nghost and reach[i + 1] < reach[i]:
                    reach[i] = reach[i + 1]
            inside = 0.0
            for i in range(1, nghost + 1):
                inside += ghost_weight(held, growth, i)
            inside *= yb
        # Finishing in this block: v ops before it, o - v in it, the last at t_last = s + o - v - 1 at the
        # earliest, or later in the block where its ghost costs less.
        for v in range(max(plo, o - cap), min(phi, o - 1) + 1):
            fv = f_prev[v - plo]
            if fv == np.inf:
                continue
            c = fv + yb * (wsum[o] - wsum[v]) + zb * (o - v) + s + o - v - a
            later = 0
            if nghost:
                t_last = s + o - v - 1
                extra = np.inf
                if t_last + nghost <= bend:
                    extra = inside
                i = max(t_last - (bend - nghost + 1), 0)
                if reach[i] + bend - t_last < extra:
                    extra = reach[i] + bend - t_last
                    later = 1
                c += extra
            if v == 0:
                c += start_cost
            if c < best:
                best = c
                best_k = k
                best_v = v
                best_late = later
        clo, chi = lo[k], hi[k]
        if clo > chi:
            break  # every chain in the band has finished
        # f_k(u) = yb W(u) + zb u + min over v in [u - cap, u] of g(v), g(v) = f_{k-1}(v) - yb W(v) - zb v
        # (plus the prompt tokens' price when the chain starts here, v = 0): a monotone deque of v.
        for v in range(plo, phi + 1):
            g[v - plo] = f_prev[v - plo] - yb * wsum[v] - zb * v
        if plo == 0:
            g[0] += start_cost
        head = 0
        tail = 0
        nxt = plo  # next v to push
        if clo == 0:  # not started: no price, no prompt tokens
            f_cur[0] = f_prev[0] if plo == 0 else np.inf
            arg[k, 0] = 0
        for u in range(max(clo, 1), chi + 1):
            top = min(u, phi)
            while nxt <= top:
                gv = g[nxt - plo]
                while tail > head and g[dq[tail - 1] - plo] >= gv:
                    tail -= 1
                dq[tail] = nxt
                tail += 1
                nxt += 1
            while tail > head and dq[head] < u - cap:
                head += 1
            if tail > head:
                w = dq[head]
                f_cur[u - clo] = g[w - plo] + yb * wsum[u] + zb * u
                arg[k, u - clo] = w
            else:
                f_cur[u - clo] = np.inf
                arg[k, u - clo] = -1
        f_prev, f_cur = f_cur, f_prev

    # Backtrack: block k holds ops v_k + 1 .. u_k at its earliest slots (the last op where its ghost was
    # priced).
    u = o
    v = best_v
    k = best_k
    if best_late:
        b = b0 + k - 1
        s = max(b * span, e)
        bend = b * span + span - 1
        t_last = s + o - v - 1
        at = max(t_last, bend - nghost + 1)
        cost = at - t_last + ghost_price(held, growth, y, span, at)
        for t in range(at + 1, bend + 1):
            ct = t - t_last + ghost_price(held, growth, y, span, t)
            if ct < cost:
                cost = ct
                at = t
        chains[offset[j] + o - 1] = at
    while True:
        b = b0 + k - 1
        s = max(b * span, e)
        for q in range(v + 1, u + 1):
            if q == o and best_late:
                continue  # placed above
            chains[offset[j] + q - 1] = s + q - v - 1
        if v == 0:
            pslot[j] = parg[k]
            for q in range(npre):
                pre_chains[pre_offset[j] + q] = pt1[k] - npre + q
            break
        u = v
        k -= 1
        v = arg[k, u - lo[k]]
    return best


@nb.njit(cache=True, parallel=True)
def price_blocks(
    release, earliest, output, prompt, arrival, offset, kv_block, span, y, z, objective, prev, use_prev, chunk,
    pre_offset, growth,
):  # pragma: no cover - compiled  # fmt: skip
    """Each request's cheapest chain under block-constant ``(y, z)`` (``y[b]`` on slots ``[b span, b span + span)``).

    Returns prices, flat chain slots (each block's ops at its earliest slots; ``-1``
    past the first op under the first-token objective), prompt slots and the prompt
    batches' slots, as :func:`kvsched.csp.bounds._chain_kernels.price_chains` does
    (the batches where they were priced: just before the first op's slot in its block
    that prices them cheapest).
    """
    n = output.size
    price = np.empty(n)
    chains = np.empty(offset[n - 1] + output[n - 1], dtype=np.int64)
    pslot = np.empty(n, dtype=np.int64)
    pre_chains = np.empty(pre_offset[n], dtype=np.int64)
    has_z = z.size > 0
    for j in nb.prange(n):
        # Per request, room for the ghost's least costs where it reaches past a block (see _price_one).
        reach = np.empty(max(1, ghost_slots(op_weight(prompt[j], output[j], kv_block), growth)))
        price[j] = _price_one(
            j, release, earliest, output, prompt, arrival, offset, kv_block, span, y, z, has_z, objective, prev,
            use_prev, chains, pslot, chunk, pre_offset, pre_chains, growth, reach,
        )  # fmt: skip
    return price, chains, pslot, pre_chains


def price_blocks_python(
    release: np.ndarray,
    earliest: np.ndarray,
    output: np.ndarray,
    prompt: np.ndarray,
    arrival: np.ndarray,
    kv_block: int,
    span: int,
    y: np.ndarray,
    z: np.ndarray,
    objective: int,
    chunk: int = 0,
    growth: int = 0,
) -> np.ndarray:
    """The reference: the block programme in plain Python, every block to the end of the tail, no band.

    Ops done ``u`` after each block, all ``m <= cap_b`` ops of a block considered
    directly (no deque); blocks run from the earliest slot's to ``O`` slots (and
    the prompt batches) past the multipliers' end (no chain gains by ending later).
    A chain finishing in a block has its last op at every slot of the block tried for its ghost.
    """

    def ghost(held: float, t: int) -> float:
        return sum(
            ghost_weight(held, growth, k) * (float(y[(t + k) // span]) if (t + k) // span < nblk else 0.0)
            for k in range(1, ghost_slots(held, growth) + 1)
        )

    nblk = y.size
    prices = np.empty(output.size)
    for j in range(output.size):
        e, o, a, i_j, r = int(earliest[j]), int(output[j]), float(arrival[j]), int(prompt[j]), int(release[j])
        wsum = np.concatenate([[0.0], np.cumsum([-(-(i_j + u - 1) // kv_block) for u in range(1, o + 1)])])
        zp = (
            min((float(z[t // span]) for t in range(r, min(e, nblk * span))), default=np.inf)
            if z.size
            else 0.0
        )
        npre = e - r if chunk else 0
        f = {0: 0.0}  # ops done -> cheapest price so far (without the objective term)
        best = np.inf
        for b in range(e // span, (max(nblk * span + npre, e) + o) // span + 1):
            s = max(b * span, e)
            cap = b * span + span - s
            yb = float(y[b]) if b < nblk else 0.0
            zb = float(z[b]) if (z.size and b < nblk) else 0.0
            if z.size:
                zp = min(zp, zb)
            new = dict(f)  # no op in this block
            for v, fv in f.items():
                for m in range(1, min(cap, o - v) + 1):
                    c = (
                        fv
                        + yb * (wsum[v + m] - wsum[v])
                        + zb * m
                        + ((i_j - 1) * zp if v == 0 and z.size else 0.0)
                        + (_pre_min_python(i_j, npre, chunk, kv_block, span, y, b, s) if v == 0 else 0.0)
                    )
                    if objective == TTFT:  # the first op prices the chain; the rest go to the tail
                        best = min(best, c - zb * (m - 1) - yb * (wsum[v + m] - wsum[v + 1]) + s + 1 - a)
                        break
                    if v + m == o:
                        held = wsum[o] - wsum[o - 1]
                        last = min(
                            t - (s + m - 1) + ghost(held, t) for t in range(s + m - 1, b * span + span)
                        )
                        best = min(best, c + s + m - 1 + 1 - a + last)
                    else:
                        new[v + m] = min(new.get(v + m, np.inf), c)
            f = new
        prices[j] = best
    return prices


def _pre_min_python(
    i_j: int, npre: int, chunk: int, kv_block: int, span: int, y: np.ndarray, b: int, s: int
) -> float:
    """The cheapest prompt batches for a first op anywhere in block ``b`` at or after ``s`` (every slot tried)."""
    if npre == 0:
        return 0.0

    def price(t: int) -> float:
        return float(y[t // span]) if t // span < y.size else 0.0

    return min(
        sum(prompt_weight(i_j, m, chunk, kv_block) * price(t1 - m) for m in range(1, npre + 1))
        for t1 in range(s, b * span + span)
    )
