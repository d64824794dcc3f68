"""Op-chain pricing kernels for :mod:`kvsched.csp.bounds.chain`: a numba kernel and a numpy reference.

Both compute, for every request ``j`` and multipliers ``y`` (memory rows) and ``z``
(token-budget rows), the cheapest chain of its ``O_j`` generating ops in strictly
increasing slots (see the module docstring of :mod:`kvsched.csp.bounds.chain` for
the relaxation). The numba kernel evaluates the dynamic programme only on the
diagonal band of slots that a chain cheaper than a known one can use (exact, see
:func:`price_chains`); the numpy reference evaluates it on every slot up to the
padded horizon, so the two agreeing checks the band as well as the compiled code.

Arrays (one entry per request): ``release`` (first slot it may use), ``earliest``
(first slot its first token may be generated in), ``output`` (O), ``prompt`` (I),
``arrival`` (in slots, real), ``offset`` (start of its chain in the flat chain
array, the cumulative sum of ``output``), ``pre_offset`` (start of its prompt batches
in the flat array of those, ``n + 1`` entries; request ``j`` has ``pre_offset[j + 1] -
pre_offset[j] = earliest - release`` of them under a chunk cap ``chunk = q > 0``, none
without one). ``y`` and ``z`` are padded with zeros
past the dual horizon so that every slot a chain may use has a price.

The weights here (:func:`op_weight`, :func:`prompt_weight`, :func:`refill_batches`, :func:`ghost_weight`
over :func:`ghost_slots`) are the relaxation's one definition of what an op, a prompt batch, a refill and a
completion's ghost hold: the chain LP (:mod:`kvsched.csp.bounds.chain_lp`) builds its rows from them too.
"""

from __future__ import annotations

import numba as nb
import numpy as np

#: Objective codes (the chain cost charged to the priced op).
LATENCY = 0  # completion - arrival: the last op's slot + 1 - a
TTFT = 1  # first token - arrival: the first op's slot + 1 - a
#: Slack on the band's edge against float round-off (a wider band is always exact).
BAND_TOL = 1e-7


@nb.njit(cache=True, inline="always")
def op_weight(prompt: int, u: int, block: int) -> float:
    """Blocks held while generating token ``u`` (1-based): I + u - 1 tokens, rounded up to blocks."""
    return float((prompt + u - 1 + block - 1) // block)


def op_weights(prompt: int, output: int, block: int) -> np.ndarray:
    """:func:`op_weight` for ``u = 1..output`` at index ``u - 1``, as one array (numpy callers)."""
    return (-(-(prompt + np.arange(output, dtype=np.int64)) // block)).astype(np.float64)


@nb.njit(cache=True, inline="always")
def prompt_weight(prompt: int, m: int, chunk: int, block: int) -> float:
    """Blocks held by the ``m``-th prompt batch before the first token's: at least ``I - m q`` tokens."""
    rest = prompt - m * chunk
    return float((rest + block - 1) // block) if rest > 0 else 0.0


@nb.njit(cache=True, inline="always")
def ghost_slots(held: float, growth: int) -> int:
    """Slots a completion's ghost covers after the last op: the ``k >= 1`` with ``k G < held`` (0 without
    ``G``)."""
    return int(np.ceil(held / growth)) - 1 if growth > 0 and held > 0 else 0


@nb.njit(cache=True, inline="always")
def ghost_weight(held: float, growth: int, k: int) -> float:
    """Blocks the ghost of a completion freeing ``held`` blocks holds ``k`` slots after it (``held - k G``)."""
    return held - k * growth


@nb.njit(cache=True, inline="always")
def ghost_price(held: float, growth: int, y, span: int, t: int) -> float:
    """The price of a completion's ghost: ``held - k G`` blocks in slot ``t + k`` for ``k = 1, 2, ...``
    while positive (``G = growth``; none when 0), at prices ``y`` constant on blocks of ``span`` slots
    (1: slot prices), past their end 0.

    A request completing in slot ``t`` frees ``held`` blocks, and the KV as a whole grows by at most
    ``G`` a slot (see :mod:`kvsched.csp.bounds.chain`, *Ghosts*), so that much stays free: priced as if
    the request still held it.
    """
    c = 0.0
    for k in range(1, ghost_slots(held, growth) + 1):
        b = (t + k) // span
        if b >= y.size:
            break
        c += ghost_weight(held, growth, k) * y[b]
    return c


@nb.njit(cache=True)
def _price_one(
    j, requests, block, y, z, has_z, objective, prev, use_prev, chunk, pre_offset, growth, out
):  # pragma: no cover - compiled
    """Request ``j``'s cheapest chain (see :func:`price_chains`): ``requests`` is ``(release, earliest,
    output, prompt, arrival, offset)``; its slots go to ``out``, ``(chains, pslot, pre_chains, refilled)``;
    returns its price."""
    release, earliest, output, prompt, arrival, offset = requests
    chains, pslot, pre_chains, refilled = out
    e = earliest[j]
    o = output[j]
    a = arrival[j]
    # The prompt batches before the first token's: the k-th (k = 1..npre) holds at least
    # I - (npre - k + 1) q tokens (each later batch processes <= q of them).
    npre = pre_offset[j + 1] - pre_offset[j]
    big = y.size  # every slot >= the padded length is priced 0 (the arrays end in zeros)
    # Prompt tokens under the budget rows: z_t for the token generating in slot t, and the I - 1
    # others in the cheapest slot of [release, t] (the per-slot cap q dropped: a relaxation).
    pre_min = np.inf
    pre_arg = release[j]
    if has_z:
        for s in range(release[j], min(e, big)):
            if z[s] < pre_min:
                pre_min = z[s]
                pre_arg = s
    rest = float(prompt[j] - 1)
    # An upper bound on the optimum price: the cheapest of three feasible chains.
    ub = np.inf
    # (1) contiguous from e
    c = 0.0
    m = pre_min
    if has_z and e < big:
        m = min(m, z[e])
        c += z[e] + rest * m
    for u in range(1, o + 1):
        t = e + u - 1
        if t < big:
            c += op_weight(prompt[j], u, block) * y[t]
            if has_z and u > 1:
                c += z[t]
    c += pre_cost(prompt[j], npre, chunk, block, y, 1, e)
    held_last = op_weight(prompt[j], o, block)  # what the request frees when it completes
    if objective == LATENCY:
        c += e + o - a + ghost_price(held_last, growth, y, 1, e + o - 1)
    else:
        c += e + 1 - a
    ub = min(ub, c)
    # (2) every op past the padded horizon, where nothing is priced (the prompt batches too)
    t0 = max(big + npre, e)
    ub = min(ub, t0 + (o if objective == LATENCY else 1) - a)
    # (3) the previous optimum chain, re-priced
    if use_prev and prev[offset[j]] >= 0:
        c = 0.0
        last = 0
        for u in range(1, o + 1):
            t = prev[offset[j] + u - 1]
            if t < 0:  # ops past the horizon (first-token objective)
                break
            if u > 1 and t > last + 1:  # the gap before op u: its price, as the programme charges it
                c += _gap_cost(prompt[j], u, chunk, block, y, last, t)
            last = t
            if t < big:
                c += op_weight(prompt[j], u, block) * y[t]
                if has_z and u > 1:
                    c += z[t]
        t1 = prev[offset[j]]
        c += pre_cost(prompt[j], npre, chunk, block, y, 1, t1)  # prompt batches just before t1
        if has_z:
            mm = pre_min
            for s in range(e, min(t1 + 1, big)):
                mm = min(mm, z[s])
            if t1 < big:
                c += z[t1] + rest * mm
        if objective == LATENCY:
            c += last + 1 - a + ghost_price(held_last, growth, y, 1, last)
        else:
            c += t1 + 1 - a
        ub = min(ub, c)

    # Any chain costs at least its objective term (prices are >= 0): only slots that a chain of
    # cost <= ub can use are evaluated. Op u of such a chain lies in [e + u - 1, e + u - 1 + width).
    if objective == LATENCY:
        width = int(np.floor(a + ub - o - e + BAND_TOL)) + 1
    else:
        width = int(np.floor(a + ub - 1 - e + BAND_TOL)) + 1
    width = max(width, 1)

    # The prompt batches. In the prompt's last pass nothing is evicted, so between two of them (and
    # between the last and the first op) the request holds what the earlier one left: a gap after batch
    # k costs its weight a slot, as much as batch k itself in that slot, while batch k - 1 weighs less.
    # So moving a batch later into a gap never costs more, and the cheapest chain has its batches in the
    # npre slots just before its first op: gm[d] is their price for the first op at e + d.
    gm = np.zeros(width)
    for d in range(width):
        gm[d] = pre_cost(prompt[j], npre, chunk, block, y, 1, e + d)
    f = np.empty(width)
    p1 = np.empty(width, dtype=np.int64)  # where the other prompt tokens go, per first-op slot
    m = pre_min
    marg = pre_arg
    for d in range(width):
        t = e + d
        v = 0.0
        if t < big:
            v = op_weight(prompt[j], 1, block) * y[t]
            if has_z:
                if z[t] < m:
                    m = z[t]
                    marg = t
                v += z[t] + rest * m
        f[d] = v + gm[d]
        p1[d] = marg
    if objective == TTFT:
        best = np.inf
        bd = 0
        for d in range(width):
            v = f[d] + e + d + 1 - a
            if v < best:
                best = v
                bd = d
        chains[offset[j]] = e + bd
        for u in range(2, o + 1):
            chains[offset[j] + u - 1] = -1
        pslot[j] = p1[bd]
        for k in range(npre):
            pre_chains[pre_offset[j] + k] = e + bd - npre + k
        return best

    # Op u at e + u - 1 + d after op u - 1 at band index d' <= d, with the d - d' slots between a gap.
    # Under a chunk cap a gap is not free: the request holds the KV of op u - 1 through it, or drops it
    # and the last pass of its refill (S = I + u - 1 tokens, at most q a batch) has k1 = ceil(S / q) - 1
    # batches before op u, in the gap, holding S - m q each: just before op u by the argument of the
    # prompt batches, so a gap of at least k1 slots. Without a cap (k1 = 0) a gap is free.
    arg = np.empty((o, width), dtype=np.int32)
    how = np.zeros((o, width), dtype=np.int8)  # 1: the gap before op u is a refill (or free)
    fn = np.empty(width)
    for u in range(2, o + 1):
        wu = op_weight(prompt[j], u, block)
        wh = op_weight(prompt[j], u - 1, block)
        k1 = refill_batches(prompt[j], u, chunk)
        base = e + u - 1
        if k1 == 0:
            # A gap is free (no cap, or the refill fits in op u's own batch): the previous op anywhere before.
            run = np.inf
            ra = 0
            for d in range(width):
                if f[d] < run:
                    run = f[d]
                    ra = d
                arg[u - 2, d] = ra
                if chunk > 0:
                    how[u - 2, d] = 1
                f[d] = run + _op_price(wu, base + d, y, z, has_z)
            continue
        run_h = np.inf  # min over d' <= d of f[d'] - held[d'] (held: the prefix sum of wh y over the gap)
        ah = 0
        held = 0.0
        run_r = np.inf  # min over d' <= d - k1 of f[d']
        ar = 0
        for d in range(width):
            if f[d] - held < run_h:
                run_h = f[d] - held
                ah = d
            if d >= k1 and f[d - k1] < run_r:
                run_r = f[d - k1]
                ar = d - k1
            t = base + d
            v = held + run_h
            arg[u - 2, d] = ah
            if run_r < np.inf:
                vr = run_r + pre_cost(prompt[j] + u - 1, k1, chunk, block, y, 1, t)
                if vr < v:
                    v = vr
                    arg[u - 2, d] = ar
                    how[u - 2, d] = 1
            if t < big:
                held += wh * y[t]
            fn[d] = v + _op_price(wu, t, y, z, has_z)
        f[:] = fn
    best = np.inf
    bd = 0
    for d in range(width):
        v = f[d] + e + o - 1 + d + 1 - a + ghost_price(held_last, growth, y, 1, e + o - 1 + d)
        if v < best:
            best = v
            bd = d
    # Backtrack: op u sits at band index d_u; op u - 1 at arg[u - 2, d_u].
    d = bd
    for u in range(o, 0, -1):
        chains[offset[j] + u - 1] = e + u - 1 + d
        if u > 1:
            refilled[offset[j] + u - 1] = how[u - 2, d]
            d = arg[u - 2, d]
    pslot[j] = p1[d]
    for k in range(npre):
        pre_chains[pre_offset[j] + k] = e + d - npre + k
    return best


@nb.njit(cache=True, inline="always")
def _op_price(w, t, y, z, has_z):  # pragma: no cover - compiled
    """The price of an op of weight ``w`` (and its token) in slot ``t``; past the multipliers, 0."""
    if t >= y.size:
        return 0.0
    return w * y[t] + z[t] if has_z else w * y[t]


@nb.njit(cache=True, inline="always")
def refill_batches(prompt, u, chunk):  # pragma: no cover - compiled
    """Batches a refill's last pass has before the one generating token ``u`` (0 without a chunk cap)."""
    return (-(-(prompt + u - 1) // chunk) - 1) if chunk > 0 else 0


@nb.njit(cache=True, inline="always")
def _gap_cost(prompt, u, chunk, block, y, s, t):  # pragma: no cover - compiled
    """The least price of a gap between op ``u - 1`` in slot ``s`` and op ``u`` in slot ``t > s + 1``."""
    hold = 0.0
    wh = op_weight(prompt, u - 1, block)
    for x in range(s + 1, min(t, y.size)):
        hold += wh * y[x]
    k1 = refill_batches(prompt, u, chunk)
    if t - s - 1 >= k1:
        return min(hold, pre_cost(prompt + u - 1, k1, chunk, block, y, 1, t))
    return hold


@nb.njit(cache=True, inline="always")
def pre_cost(prompt, npre, chunk, block, y, span, t1):  # pragma: no cover - compiled
    """The price of ``npre`` prompt batches in the slots just before a first op at ``t1``.

    Shared by the chain kernels (slot prices) and the block kernels (prices per block of slots).

    Parameters
    ----------
    prompt
        The prompt's tokens I.
    npre
        Prompt batches, in slots ``t1 - 1, ..., t1 - npre``.
    chunk
        The largest prefill chunk (see :func:`prompt_weight`).
    block
        The KV block size (see :func:`prompt_weight`).
    y
        Prices, constant on blocks of ``span`` slots; past its end every price is 0.
    span
        Slots per price (1: slot prices).
    t1
        The slot of the first generating op.

    Returns
    -------
    float
        The sum over the prompt batches of their weight times their slot's price.
    """
    c = 0.0
    for m in range(1, npre + 1):
        b = (t1 - m) // span
        if b < y.size:
            c += prompt_weight(prompt, m, chunk, block) * y[b]
    return c


@nb.njit(cache=True, parallel=True)
def price_chains(
    release,
    earliest,
    output,
    prompt,
    arrival,
    offset,
    block,
    y,
    z,
    objective,
    prev,
    use_prev,
    chunk,
    pre_offset,
    growth,
):  # pragma: no cover - compiled
    """Each request's cheapest chain under ``(y, z)``: prices, flat chain slots, prompt slots, the slots of
    the prompt batches before the first token's (flat, at ``pre_offset``), and per op whether the gap
    before it is a refill (else held; flat like the chains).

    Exact: a chain costing more than a known chain (contiguous from the earliest
    slot, all past the horizon, or last call's optimum ``prev``) is never
    optimal, and every chain costs at least its objective term, so op ``u`` of
    an optimal chain lies in a band of slots ``[e + u - 1, e + u - 1 + width)``.
    """
    n = output.size
    price = np.empty(n)
    chains = np.empty(offset[n - 1] + output[n - 1], dtype=np.int64)
    pslot = np.empty(n, dtype=np.int64)
    pre_chains = np.empty(pre_offset[n], dtype=np.int64)
    refilled = np.zeros(chains.size, dtype=np.int8)  # set by _price_one where a gap is a refill
    has_z = z.size > 0
    requests = (release, earliest, output, prompt, arrival, offset)
    out = (chains, pslot, pre_chains, refilled)
    for j in nb.prange(n):
        price[j] = _price_one(
            j, requests, block, y, z, has_z, objective, prev, use_prev, chunk, pre_offset, growth, out
        )
    return price, chains, pslot, pre_chains, refilled


@nb.njit(cache=True)
def chain_loads(
    output,
    prompt,
    offset,
    block,
    chains,
    pslot,
    horizon,
    with_tokens,
    chunk,
    pre_offset,
    pre_chains,
    refilled,
    gaps,
    growth,
):  # pragma: no cover - compiled
    """Blocks (and tokens) the chains, their prompt batches, their gaps and their ghosts put in each slot
    ``< horizon``.

    A gap before op u holds op u - 1's KV, or (``refilled``) has its refill's batches just before op u;
    under ``chunk = 0``, or where the pricing left gaps free (``gaps`` false: the block programme), gaps
    hold nothing. A completion's ghost (:func:`ghost_price`) follows the last op where ``growth > 0``.
    """
    load = np.zeros(horizon)
    tokens = np.zeros(horizon if with_tokens else 0)
    if gaps and chunk > 0:
        for j in range(output.size):
            for u in range(2, output[j] + 1):
                s = chains[offset[j] + u - 2]
                t = chains[offset[j] + u - 1]
                if t <= s + 1 or s < 0:
                    continue
                if refilled[offset[j] + u - 1]:
                    k1 = refill_batches(prompt[j], u, chunk)
                    for m in range(1, k1 + 1):
                        if 0 <= t - m < horizon:
                            load[t - m] += prompt_weight(prompt[j] + u - 1, m, chunk, block)
                else:
                    wh = op_weight(prompt[j], u - 1, block)
                    for x in range(s + 1, min(t, horizon)):
                        load[x] += wh
    for j in range(output.size):
        npre = pre_offset[j + 1] - pre_offset[j]
        for k in range(1, npre + 1):
            t = pre_chains[pre_offset[j] + k - 1]
            if 0 <= t < horizon:  # contiguous before the first op: nothing held in a gap
                load[t] += prompt_weight(prompt[j], npre - k + 1, chunk, block)
    for j in range(output.size):
        for u in range(1, output[j] + 1):
            t = chains[offset[j] + u - 1]
            if 0 <= t < horizon:
                load[t] += op_weight(prompt[j], u, block)
                if with_tokens:
                    tokens[t] += 1.0
        last = chains[offset[j] + output[j] - 1]
        if growth > 0 and last >= 0:
            held = op_weight(prompt[j], output[j], block)
            for k in range(1, min(ghost_slots(held, growth), horizon - 1 - last) + 1):
                load[last + k] += ghost_weight(held, growth, k)
        if with_tokens and pslot[j] < horizon:
            tokens[pslot[j]] += prompt[j] - 1
    return load, tokens


def price_chains_numpy(
    release: np.ndarray,
    earliest: np.ndarray,
    output: np.ndarray,
    prompt: np.ndarray,
    arrival: np.ndarray,
    block: int,
    y: np.ndarray,
    z: np.ndarray,
    objective: int,
    chunk: int = 0,
    growth: int = 0,
) -> np.ndarray:
    """The reference: each request's optimum chain price by the full dynamic programme (no band).

    Slots run from ``earliest`` to the padded length of ``y`` plus ``O`` and the
    prompt batches (past the padding every price is 0, so no chain ends later and
    gains); under a chunk cap the ``earliest - release`` prompt batches run over slots
    from ``release``.
    """
    big = y.size
    prices = np.empty(output.size)
    for j in range(output.size):
        e, o, a, i_j = int(earliest[j]), int(output[j]), float(arrival[j]), int(prompt[j])
        # Prompt batches past the padding are free too: a chain may gain by ending up to npre slots later.
        npre = e - int(release[j]) if chunk else 0
        slots = np.arange(e, max(big + npre, e) + o + 1)
        yy = np.where(slots < big, y[np.minimum(slots, big - 1)], 0.0)
        f = -(-i_j // block) * yy
        if z.size:
            zz = np.where(slots < big, z[np.minimum(slots, big - 1)], 0.0)
            before = z[release[j] : e].min(initial=np.inf) if e > release[j] else np.inf
            f = f + zz + (i_j - 1) * np.minimum(np.minimum.accumulate(zz), before)
        f = f + _prompt_batches_numpy(int(release[j]), e, i_j, chunk, block, y, slots)
        if objective == TTFT:
            prices[j] = float(np.min(f + slots + 1 - a))
            continue
        for u in range(2, o + 1):
            # The previous op at index k, op u at i + 1 > k: the gap slots k + 1 .. i are held (wh each),
            # or a refill's k1 batches sit just before op u (k <= i - k1); free without a chunk cap.
            wh = -(-(i_j + u - 2) // block)
            held = np.concatenate([[0.0], np.cumsum(wh * yy)])
            best = (held[1:] + np.minimum.accumulate(f - held[1:]))[:-1]
            k1 = refill_batches(i_j, u, chunk)
            if k1 < best.size:
                refill = np.full(best.size, np.inf)
                cost = [pre_cost(i_j + u - 1, k1, chunk, block, y, 1, int(t)) for t in slots[1 + k1 :]]
                refill[k1:] = np.minimum.accumulate(f)[: best.size - k1] + np.array(cost)
                best = np.minimum(best, refill)
            step = -(-(i_j + u - 1) // block) * yy[1:]
            if z.size:
                step = step + zz[1:]
            f = best + step
            slots = slots[1:]
            yy = yy[1:]
            if z.size:
                zz = zz[1:]
        held = op_weight(i_j, o, block)
        ghost = np.zeros(slots.size)
        for k in range(1, ghost_slots(held, growth) + 1):
            after = slots + k
            ghost += ghost_weight(held, growth, k) * np.where(after < big, y[np.minimum(after, big - 1)], 0.0)
        prices[j] = float(np.min(f + slots + 1 - a + ghost))
    return prices


def _prompt_batches_numpy(
    r: int, e: int, i_j: int, chunk: int, block: int, y: np.ndarray, slots: np.ndarray
) -> np.ndarray | float:
    """The cheapest run of the ``e - r`` prompt batches ending before each first-op slot in ``slots``, with
    the KV each holds until the next (or the first op)."""
    npre = e - r if chunk else 0
    if npre == 0:
        return 0.0
    grid = np.arange(r, int(slots[-1]) + 1)
    price = np.where(grid < y.size, y[np.minimum(grid, y.size - 1)], 0.0)
    g = prompt_weight(i_j, npre, chunk, block) * price  # the first of them, in any slot from r

    def after(g: np.ndarray, held: float) -> np.ndarray:
        # The cheapest g at an earlier slot t' plus ``held`` x the prices of the slots strictly between.
        cum = np.concatenate([[0.0], np.cumsum(held * price)])  # cum[i]: the slots before grid index i
        best = np.concatenate([[np.inf], np.minimum.accumulate(g - cum[1:])[:-1]])
        return cum[:-1] + best

    for k in range(2, npre + 1):
        g = (
            after(g, prompt_weight(i_j, npre - k + 2, chunk, block))
            + prompt_weight(i_j, npre - k + 1, chunk, block) * price
        )
    last = after(g, prompt_weight(i_j, 1, chunk, block))  # the first op after the last of them
    return last[slots - r]


@nb.njit(cache=True, inline="always")
def _contiguous_cost(s, o, a, i_j, block, big, ycum, tcum, zcum, z):  # pragma: no cover - compiled
    """S + O - a plus the prices of ops S .. S + O - 1 (weights (I + t - S) / block)."""
    end = min(s + o, big)
    v = s + o - a + ((i_j - s) * (ycum[end] - ycum[s]) + tcum[end] - tcum[s]) / block
    if z.size:
        v += zcum[end] - zcum[s] + (i_j - 1) * z[s]
    return v


@nb.njit(cache=True, parallel=True)
def price_contiguous(
    earliest,
    output,
    prompt,
    arrival,
    block,
    y,
    z,
    prev_start,
    use_prev,
):  # pragma: no cover - compiled
    """Each request's cheapest *contiguous* chain (ops in slots S .. S + O - 1): price and start.

    Not a bound for every schedule (pauses are excluded), only a cheap direction for the
    multipliers: ``O(window)`` per request with prefix sums of ``y`` and ``t y``, against
    ``O(O x window)`` for the chain programme. Weights are ``(I + u - 1) / block`` (linear).
    """
    n = output.size
    big = y.size
    ycum = np.zeros(big + 1)
    tcum = np.zeros(big + 1)
    zcum = np.zeros(big + 1)
    for t in range(big):
        ycum[t + 1] = ycum[t] + y[t]
        tcum[t + 1] = tcum[t] + t * y[t]
        if z.size:
            zcum[t + 1] = zcum[t] + z[t]
    price = np.empty(n)
    start = np.empty(n, dtype=np.int64)
    for j in nb.prange(n):
        e, o, a, i_j = earliest[j], output[j], arrival[j], prompt[j]
        best = max(big, e) + o - a  # wholly past the horizon
        bs = max(big, e)
        if use_prev and e <= prev_start[j] < big:
            v = _contiguous_cost(prev_start[j], o, a, i_j, block, big, ycum, tcum, zcum, z)
            if v < best:
                best = v
                bs = prev_start[j]
        # Every start costs at least S + O - a: none after a + best - O can be cheaper.
        s = e
        while s < big and s <= a + best - o + BAND_TOL:
            v = _contiguous_cost(s, o, a, i_j, block, big, ycum, tcum, zcum, z)
            if v < best:
                best = v
                bs = s
            s += 1
        price[j] = best
        start[j] = bs
    return price, start


@nb.njit(cache=True)
def band_widths(earliest, output, prompt, arrival, block, y, objective):  # pragma: no cover - compiled
    """Each request's band width at ``y`` (an estimate of the pricings' work, ``O(1)`` per request).

    The band of :func:`price_chains` without last call's chains (contiguous-from-earliest
    and past-the-horizon chains only, budget rows left out; weights linear): wider than a
    warm call's, used to decide whether a call fits the time left.
    """
    big = y.size
    ycum = np.zeros(big + 1)
    tcum = np.zeros(big + 1)
    for t in range(big):
        ycum[t + 1] = ycum[t] + y[t]
        tcum[t + 1] = tcum[t] + t * y[t]
    width = np.empty(output.size)
    for j in range(output.size):
        e, o, a, i_j = earliest[j], output[j], arrival[j], prompt[j]
        last = o if objective == LATENCY else 1
        ub = max(big, e) + last - a
        if e < big:
            end = min(e + last, big)
            # linear weights, plus one block per op for rounding up
            area = ((i_j - e) * (ycum[end] - ycum[e]) + tcum[end] - tcum[e]) / block + ycum[end] - ycum[e]
            ub = min(ub, e + last - a + area)
        width[j] = max(1.0, np.floor(a + ub - last - e + BAND_TOL) + 1)
    return width
