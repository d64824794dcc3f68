"""Op-chain pricing in seconds for :mod:`kvsched.csp.bounds.seconds_lagrangian`: numba kernels and a
pure-Python reference.

For every request ``j`` and multipliers (machine rows ``mu[l, t]`` for each separable form ``l``,
memory rows ``y[t]``, token rows ``z[t]``, all per slot of length ``delta`` seconds and zero past the
padded horizon) both compute the cheapest chain of its ``O_j`` generating ops in strictly increasing
slots (the relaxation is in the module docstring of :mod:`kvsched.csp.bounds.seconds_lagrangian`).

Per request (arrays of length n): ``release`` (first slot it may be in a batch), ``earliest`` (first
slot its first token may be generated in), ``output`` O, ``prompt`` I, ``arrival`` (seconds),
``life`` (last slot its fixed-cost share ``inv_phi[t]`` applies to), ``offset`` (start of its chain in
the flat chain array).

Per form ``l`` (arrays of length L): ``fd`` / ``fp`` the fixed parts a decode / prefill item shares,
``gd0 + gd1 (S - 1)`` a decode's own piece with S known tokens, ``gr[l, S]`` the piece of a refill's
last chunk, ``pt`` a prompt token's own piece, ``pr`` a prompt chunk's own constant.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

#: Slack on the band's edge against float round-off (a wider band is always exact).
BAND_TOL = 1e-7


@nb.njit(cache=True, inline="always")
def _blocks(tokens: int, block: int) -> float:
    return float((tokens + block - 1) // block)


@nb.njit(cache=True, inline="always")
def _share(t, life_j, inv_phi):  # pragma: no cover - compiled
    """The request's share of a batch's fixed part in slot ``t`` (0 past its life or the horizon)."""
    if t <= life_j and t < inv_phi.size:
        return inv_phi[t]
    return 0.0


@nb.njit(cache=True)
def _decode_piece(fd, gd0, gd1, k, lam, s_tok):  # pragma: no cover - compiled
    """Form ``k``'s piece of a decode with ``s_tok`` known tokens and fixed-part share ``lam``."""
    return lam * fd[k] + gd0[k] + gd1[k] * (s_tok - 1)


@nb.njit(cache=True)
def _refill_piece(fp, gr, k, lam, s_tok):  # pragma: no cover - compiled
    """Form ``k``'s piece of a refill's last chunk ending on ``s_tok`` known tokens."""
    return lam * fp[k] + gr[k, s_tok]


@nb.njit(cache=True)
def _first_piece(fp, pt, pr, k, lam):  # pragma: no cover - compiled
    """Form ``k``'s piece of the prompt chunk generating token 1 (one prompt token of its own)."""
    return lam * fp[k] + pr[k] + pt[k]


@nb.njit(cache=True)
def _token_piece(fp, pt, pr, k, per, q):  # pragma: no cover - compiled
    """Form ``k``'s piece of one more prompt token: its own, a 1/q share of a chunk's constant and ``per``
    of the fixed part."""
    return pt[k] + per * fp[k] + pr[k] / q


@nb.njit(cache=True)
def _token_share(alpha_t, lam_phi, q, kv_tok):  # pragma: no cover - compiled
    """The fixed-part share of one more prompt token: 1/q of the request's, and 1/M by the KV it adds."""
    return alpha_t * lam_phi / q + (1.0 - alpha_t) / kv_tok


@nb.njit(cache=True)
def _op_cost(t, s_tok, lam_phi, alpha, kv_cap, mu, y, z, fd, fp, gd0, gd1, gr, block):  # pragma: no cover
    """Price of a generating op (u >= 2) with ``s_tok`` known tokens in slot ``t``, and its route
    (0: decode, 1: last chunk of a refill)."""
    if t >= y.size:
        return 0.0, 0
    lam = alpha[t] * lam_phi + (1.0 - alpha[t]) * _blocks(s_tok, block) / kv_cap
    dec = 0.0
    ref = 0.0
    for k in range(fd.size):
        m = mu[k, t]
        dec += m * _decode_piece(fd, gd0, gd1, k, lam, s_tok)
        ref += m * _refill_piece(fp, gr, k, lam, s_tok)
    v = y[t] * _blocks(s_tok, block)
    if z.size:
        v += z[t]
    if ref < dec:
        return v + ref, 1
    return v + dec, 0


@nb.njit(cache=True)
def _first_cost(t, prompt_j, lam_phi, alpha, kv_cap, mu, y, z, fp, pt, pr, block):  # pragma: no cover
    """Price of the op generating token 1 in slot ``t``: a prompt chunk of at least one token."""
    if t >= y.size:
        return 0.0
    lam = alpha[t] * lam_phi + (1.0 - alpha[t]) * _blocks(prompt_j, block) / kv_cap
    v = y[t] * _blocks(prompt_j, block)
    for k in range(fp.size):
        v += mu[k, t] * _first_piece(fp, pt, pr, k, lam)
    if z.size:
        v += z[t]
    return v


@nb.njit(cache=True)
def _token_price(t, lam_phi, alpha, kv_tok, mu, z, fp, pt, pr, q):  # pragma: no cover - compiled
    """Price of one more prompt token in slot ``t``: its own piece, a 1/q share of a chunk's
    constant and of the request's share, and 1/M of the fixed part by the KV it adds."""
    if t >= mu.shape[1]:
        return 0.0
    per = _token_share(alpha[t], lam_phi, q, kv_tok)
    v = 0.0
    for k in range(fp.size):
        v += mu[k, t] * _token_piece(fp, pt, pr, k, per, q)
    if z.size:
        v += z[t]
    return v


@nb.njit(cache=True)
def _insert(best, count, k, v):  # pragma: no cover - compiled
    """Keep the ``k`` smallest values seen in ``best[:count]`` (ascending); returns the new count."""
    if count < k:
        i = count
        count += 1
    elif v < best[k - 1]:
        i = k - 1
    else:
        return count
    while i > 0 and best[i - 1] > v:
        best[i] = best[i - 1]
        i -= 1
    best[i] = v
    return count


@nb.njit(cache=True)
def _fill(best, count, k, rest, q):  # pragma: no cover - compiled
    """Least price of ``rest`` tokens at most ``q`` per slot in the cheapest slots held in ``best``."""
    if rest <= 0:
        return 0.0
    v = 0.0
    left = float(rest)
    for i in range(min(count, k)):
        take = min(left, q)
        v += take * best[i]
        left -= take
    return v


#: Slots before a known chain's first op (at least) searched for its other prompt tokens' cheapest slots
#: when it is re-priced for a band (:func:`_chain_price`).
LOOKBACK = 64


@nb.njit(cache=True)
def _chain_price(j, slots, best, count, k, requests, sizes, prices, forms):  # pragma: no cover - compiled
    """A price of request ``j``'s chain with op ``u`` in slot ``slots[u - 1]``: its other prompt tokens in
    the cheapest slots before ``earliest`` (``best[:count]``) and in the last ``LOOKBACK + 4 k`` slots up to
    the first op's. A placement, not always the cheapest: the price is at least the chain's least and is
    only ever used as an upper bound on the request's price (the band). Searching every slot from
    ``earliest`` cost O(queueing delay x k) a request: 8 of 9 s of the first pricing on 10k A100 requests
    re-pricing sarathi's chains, whose first tokens wait minutes (thousands of slots)."""
    _, earliest, output, prompt, arrival, life, _ = requests
    delta, q, block, kv_cap, kv_tok = sizes
    mu, y, z, inv_phi, alpha = prices
    fd, fp, gd0, gd1, gr, pt, pr = forms
    o, i_j, lf = output[j], prompt[j], life[j]
    t1 = slots[0]
    tmp = best.copy()
    if k:
        # Slots from earliest on number t1 - earliest + 1 >= 1 and, with those before it, at least k.
        for s in range(max(earliest[j], t1 - LOOKBACK - 4 * k), t1 + 1):
            count = _insert(
                tmp, count, k, _token_price(s, _share(s, lf, inv_phi), alpha, kv_tok, mu, z, fp, pt, pr, q)
            )
    c = _first_cost(t1, i_j, _share(t1, lf, inv_phi), alpha, kv_cap, mu, y, z, fp, pt, pr, block)
    c += _fill(tmp, count, k, i_j - 1, q)
    for u in range(2, o + 1):
        t = slots[u - 1]
        c += _op_cost(
            t, i_j + u - 1, _share(t, lf, inv_phi), alpha, kv_cap, mu, y, z, fd, fp, gd0, gd1, gr, block
        )[0]
    return c + delta * (slots[o - 1] + 1) - arrival[j]


@nb.njit(cache=True)
def _price_one(j, requests, sizes, prices, forms, prev, use_prev, chains, first):  # pragma: no cover
    release, earliest, output, prompt, arrival, life, offset = requests
    delta, q, block, kv_cap, kv_tok = sizes
    mu, y, z, inv_phi, alpha = prices
    fd, fp, gd0, gd1, gr, pt, pr = forms
    r = release[j]
    e = earliest[j]
    o = output[j]
    i_j = prompt[j]
    a = arrival[j]
    lf = life[j]
    big = y.size
    rest = i_j - 1
    k = 0
    if rest > 0:
        k = 1 if not math.isfinite(q) else int((rest + q - 1) // q)
    best = np.empty(max(k, 1))
    count = 0
    for s in range(r, e):
        count = (
            _insert(
                best, count, k, _token_price(s, _share(s, lf, inv_phi), alpha, kv_tok, mu, z, fp, pt, pr, q)
            )
            if k
            else 0
        )

    # An upper bound on the price: a chain starting at the earliest slot, one wholly past the horizon,
    # or last call's chain re-priced. Every chain costs at least delta (t_O + 1) - a (prices >= 0).
    ub = delta * (max(big + k, e) + o) - a
    ub = min(ub, _chain_price(j, np.arange(e, e + o), best, count, k, requests, sizes, prices, forms))
    if use_prev and prev[offset[j]] >= e:
        last = prev[offset[j] : offset[j] + o]
        ub = min(ub, _chain_price(j, last, best, count, k, requests, sizes, prices, forms))
    width = max(int(np.floor((a + ub) / delta - e - o + BAND_TOL)) + 1, 1)

    f = np.empty(width)
    for d in range(width):
        t = e + d
        lam = _share(t, lf, inv_phi)
        if k:
            count = _insert(best, count, k, _token_price(t, lam, alpha, kv_tok, mu, z, fp, pt, pr, q))
        f[d] = _first_cost(t, i_j, lam, alpha, kv_cap, mu, y, z, fp, pt, pr, block) + _fill(
            best, count, k, rest, q
        )
    arg = np.empty((max(o - 1, 1), width), dtype=np.int32)
    for u in range(2, o + 1):
        run = np.inf
        ra = 0
        base = e + u - 1
        s_tok = i_j + u - 1
        for d in range(width):
            if f[d] < run:
                run = f[d]
                ra = d
            arg[u - 2, d] = ra
            t = base + d
            f[d] = (
                run
                + _op_cost(
                    t, s_tok, _share(t, lf, inv_phi), alpha, kv_cap, mu, y, z, fd, fp, gd0, gd1, gr, block
                )[0]
            )
    price = np.inf
    bd = 0
    for d in range(width):
        v = f[d] + delta * (e + o + d) - a
        if v < price:
            price = v
            bd = d
    d = bd
    for u in range(o, 0, -1):
        chains[offset[j] + u - 1] = e + u - 1 + d
        if u > 1:
            d = arg[u - 2, d]
    first[j] = e + d
    return price


@nb.njit(cache=True, parallel=True)
def price_chains(requests, sizes, prices, forms, prev, use_prev):  # pragma: no cover - compiled
    """Each request's cheapest chain: prices, flat op slots, first-token slots.

    Exact: a chain dearer than a known one (from the earliest slot, wholly past the horizon, or last
    call's ``prev``) is never optimal, and every chain costs at least ``delta (t_O + 1) - a``, so op
    ``u`` of an optimal chain lies in the band ``[e + u - 1, e + u - 1 + width)``.

    Parameters
    ----------
    requests
        ``(release, earliest, output, prompt, arrival, life, offset)``, per request (module docstring).
    sizes
        ``(delta, q, block, kv_cap, kv_tok)``: the slot length, the chunk cap (inf: none), the KV block
        size, the KV capacity in blocks and in tokens.
    prices
        ``(mu, y, z, inv_phi, alpha)``: the multipliers per slot (``mu`` forms x slots, ``z`` empty
        without a budget), the requests' shares and the share mixture.
    forms
        ``(fd, fp, gd0, gd1, gr, pt, pr)``, per form (module docstring).
    prev, use_prev
        Last call's flat chains, and whether to re-price them.
    """
    output, offset = requests[2], requests[6]
    n = output.size
    price = np.empty(n)
    chains = np.empty(offset[n - 1] + output[n - 1], dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    for j in nb.prange(n):
        price[j] = _price_one(j, requests, sizes, prices, forms, prev, use_prev, chains, first)
    return price, chains, first


@nb.njit(cache=True)
def chain_loads(requests, sizes, prices, forms, chains, first):  # pragma: no cover - compiled
    """What the chains put in each slot ``< len(y)``: machine pieces per form, KV blocks, tokens, and
    the derivative of the priced pieces in the share mixture ``alpha`` (arguments as :func:`price_chains`)."""
    release, _, output, prompt, _, life, offset = requests
    _, q, block, kv_cap, kv_tok = sizes
    mu, y, z, inv_phi, alpha = prices
    fd, fp, gd0, gd1, gr, pt, pr = forms
    big = y.size
    n_forms = fd.size
    machine = np.zeros((n_forms, big))
    memory = np.zeros(big)
    tokens = np.zeros(z.size)
    d_alpha = np.zeros(big)
    for j in range(output.size):
        i_j = prompt[j]
        lf = life[j]
        t1 = first[j]
        for u in range(1, output[j] + 1):
            t = chains[offset[j] + u - 1]
            if t >= big:
                continue
            lam_phi = _share(t, lf, inv_phi)
            s_tok = i_j + u - 1
            kv_part = _blocks(s_tok, block) / kv_cap
            lam = alpha[t] * lam_phi + (1.0 - alpha[t]) * kv_part
            memory[t] += _blocks(s_tok, block)
            if z.size:
                tokens[t] += 1.0
            route = 1
            if u > 1:
                route = _op_cost(t, s_tok, lam_phi, alpha, kv_cap, mu, y, z, fd, fp, gd0, gd1, gr, block)[1]
            for k in range(n_forms):
                if u == 1:
                    machine[k, t] += _first_piece(fp, pt, pr, k, lam)
                    d_alpha[t] += mu[k, t] * fp[k] * (lam_phi - kv_part)
                elif route == 0:
                    machine[k, t] += _decode_piece(fd, gd0, gd1, k, lam, s_tok)
                    d_alpha[t] += mu[k, t] * fd[k] * (lam_phi - kv_part)
                else:
                    machine[k, t] += _refill_piece(fp, gr, k, lam, s_tok)
                    d_alpha[t] += mu[k, t] * fp[k] * (lam_phi - kv_part)
        rest = i_j - 1
        if rest <= 0:
            continue
        # The other prompt tokens: the cheapest slots of [release, t1], q per slot (ties: earliest).
        span = t1 - release[j] + 1
        price = np.empty(span)
        for s in range(span):
            t = release[j] + s
            price[s] = _token_price(t, _share(t, lf, inv_phi), alpha, kv_tok, mu, z, fp, pt, pr, q)
        order = np.argsort(price, kind="mergesort")
        left = float(rest)
        for s in order:
            if left <= 0:
                break
            take = min(left, q)
            left -= take
            t = release[j] + s
            if t >= big:
                continue
            lam_phi = _share(t, lf, inv_phi)
            per = _token_share(alpha[t], lam_phi, q, kv_tok)
            for k in range(n_forms):
                machine[k, t] += take * _token_piece(fp, pt, pr, k, per, q)
                d_alpha[t] += take * mu[k, t] * fp[k] * (lam_phi / q - 1.0 / kv_tok)
            if z.size:
                tokens[t] += take
    return machine, memory, tokens, d_alpha


def price_chains_reference(requests, sizes, prices, forms) -> np.ndarray:
    """The reference: each request's price by the full programme in plain Python (no band, no numba).

    First-token slots run from ``earliest`` to the padded horizon plus the prompt's chunks, and op u
    ``u - 1`` slots later than that (past the horizon every price is 0, so no chain gains by ending
    later). Arguments as :func:`price_chains`.
    """
    release, earliest, output, prompt, arrival, life, _ = requests
    delta, q, block, kv_cap, kv_tok = sizes
    mu, y, z, inv_phi, alpha = prices
    fd, fp, gd0, gd1, gr, pt, pr = forms
    big = len(y)
    forms = len(fd)

    def blocks(tok):
        return float(-(-tok // block))

    def share(t, j, s_tok):
        phi = inv_phi[t] if t <= life[j] else 0.0
        return alpha[t] * phi + (1.0 - alpha[t]) * blocks(s_tok) / kv_cap

    def tok_price(t, j):
        if t >= big:
            return 0.0
        phi = inv_phi[t] if t <= life[j] else 0.0
        per = alpha[t] * phi / q + (1.0 - alpha[t]) / kv_tok
        v = sum(mu[k][t] * (pt[k] + per * fp[k] + pr[k] / q) for k in range(forms))
        return v + (z[t] if len(z) else 0.0)

    def op(t, s_tok, j):
        if t >= big:
            return 0.0
        lam = share(t, j, s_tok)
        dec = sum(mu[k][t] * (lam * fd[k] + gd0[k] + gd1[k] * (s_tok - 1)) for k in range(forms))
        ref = sum(mu[k][t] * (lam * fp[k] + gr[k][s_tok]) for k in range(forms))
        return min(dec, ref) + y[t] * blocks(s_tok) + (z[t] if len(z) else 0.0)

    out = np.empty(len(output))
    for j in range(len(output)):
        r, e, o, i_j, a = int(release[j]), int(earliest[j]), int(output[j]), int(prompt[j]), float(arrival[j])
        rest = i_j - 1
        last = max(big, e) + (0 if rest <= 0 else (1 if math.isinf(q) else math.ceil(rest / q)))
        f = []
        for t1 in range(e, last + 1):
            prices = sorted(tok_price(s, j) for s in range(r, t1 + 1))
            fill, left = 0.0, float(rest)
            for p in prices:
                if left <= 0:
                    break
                take = min(left, q)
                fill += take * p
                left -= take
            first = 0.0
            if t1 < big:
                first = y[t1] * blocks(i_j) + (z[t1] if len(z) else 0.0)
                lam = share(t1, j, i_j)
                first += sum(mu[k][t1] * (lam * fp[k] + pr[k] + pt[k]) for k in range(forms))
            f.append(first + fill)
        # Op u sits in slot e + u - 1 + d; op u - 1 in e + u - 2 + d' with d' <= d.
        f = np.array(f)
        for u in range(2, o + 1):
            run = np.minimum.accumulate(f)
            f = np.array([run[d] + op(e + u - 1 + d, i_j + u - 1, j) for d in range(f.size)])
        out[j] = float(np.min(f + delta * (e + o + np.arange(f.size)) - a))
    return out
