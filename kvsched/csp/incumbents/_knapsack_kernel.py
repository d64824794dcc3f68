"""The knapsack greedy's hot loop: one slot after another, on plain arrays.

:func:`advance` is plain Python over scalars and numpy arrays, so that the same
source runs interpreted (:data:`advance_py`, the reference the tests compare
against) and compiled by numba (:data:`advance_jit`). It decides batches only;
the driver (:mod:`kvsched.csp.incumbents.knapsack`) turns its log into a schedule
that the semantic core replays.

Without a token budget every item it logs generates a token: a decode of a request
holding its KV, or the whole prompt (prefill) or every known token (refill) of one
holding none. With a budget (C tokens, P prefill and refill tokens a batch) an item
of a request holding no KV processes every known token only where they fit what the
slot's budget leaves beside its holders' decodes; a longer one starts with a first
chunk and is then *pinned* until its prompt (or refill) is done: it holds KV without
generating, so it gets its next chunk first, every slot, and is evicted only as a
last resort (for the best pinned request to progress). Holders' keys carry a bonus
for what evicting them costs (their refill's tokens and batches). The kernel mirrors
the core's per-request state (generated, KV held, phase) so that every batch it logs
is legal; the replay proves it.

Array layout (``n`` requests):

* ``ia`` int64 (7, n): prompt I, output O, generated G, KV held (tokens), done, arrival order, phase (the
  core's :class:`~kvsched.schedule.ir.Phase` codes, as ``it[3]``);
* ``fa`` float64 (4, n): arrival, per-request scale of the key, waiting keys (by list position),
  pinned keys (by list position);
* ``lim`` int64 (10,): KV blocks, block size, candidates K, DP cells, the KV the knapsack chooses for
  (blocks), fast, candidates at most, C, P (:data:`NONE` where unlimited), smallest first chunk;
* ``sc`` int64 (8,): arrival pointer, waiting length, holders, batches, items, evictions, pending,
  pinned;
* ``clock`` float64 (6,): the next batch's start, the slot length, the knapsack's share of M, the
  holders' key bonus per KV token and refill batch (0 without a budget), the first chunks' value
  discount per further batch of their prompt, the power of the key in an item's value (w / key^power);
* ``ib`` int64 (6, n): waiting list (worst first, best last; requests neither done nor pinned),
  holders (not pinned), candidates, scratch, pending inserts (arrivals and last slot's candidates),
  pinned (best first);
* the log: ``bf`` float64 (cap_b,) starts; ``bi`` int64 (2, cap_b + 1) item and eviction offsets;
  ``it`` int64 (4, cap_i) request, tokens, KV context, phase; ``ev`` int64 (cap_e,) evicted requests.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.extending import register_jitable

from kvsched.csp.incumbents._kernel import (
    DECODE,
    evict,
    insert_waiting,
    join_arrivals,
    process_item,
    remaining_area,
)

#: Return codes of :func:`advance`.
DONE, CHUNK, GROW = 0, 1, 2
#: An unlimited budget.
NONE = 1 << 62
#: ``chosen`` codes of a candidate: not (yet) chosen, chosen, left out (its item does not fit the
#: budget left), picked by the knapsack (before the budget check).
_OPEN, _RUN, _OUT, _PICKED = 0, 1, 2, 3


@register_jitable
def _knapsack_row(lower, upper, out, picks, v):
    """One item's row of the 0/1 knapsack: ``out = max(upper, lower + v)``, ``picks`` where that is
    strictly more (``upper``: the row before at the same capacity, ``lower``: ``u`` cells less).

    Two rows rather than one updated top-down in place, and a loop of its own over plain slices: no
    iteration reads what another wrote, so the compiled loop is vectorised (the same values and ties as
    the in-place form; the knapsack's rows 3-4 times faster on their own).
    """
    for x in range(out.shape[0]):
        got = lower[x] + v
        better = got > upper[x]
        picks[x] = better
        out[x] = got if better else upper[x]


def advance(ia, fa, lim, sc, clock, ib, bf, bi, it, ev, max_batches):
    """Decide up to ``max_batches`` batches; return why it stopped (:data:`DONE`, ...).

    Every slot the pinned requests go first, best first: each runs the next chunk of its
    prompt or refill, cut to the budget and the KV left (the best one evicts pinned
    requests from the worst end where it gets no KV at all). Then the slot takes the K
    best waiting requests by key (the candidates; more while they hold less than 1.5
    times the KV left, up to ``lim[6]``), runs the best of them first-fit while the KV
    left stays at least the knapsack's share, then picks among the rest the subset of
    largest total value w / key^power (w: the KV the op holds, in blocks; at power 1
    the weighted-shortest-first ratio, below 1 more weight on filling M) that fits
    what is left, by a 0/1 knapsack over at most ``lim[3]`` capacity cells (item
    sizes rounded up to a cell, so the pick always fits), keeps those of the pick
    whose tokens fit the budget left, best first, and fills what is still left
    first-fit. Every pass offers only items that fit the
    budget left; a first chunk (a request whose known tokens do not fit a slot's
    budget) is packed at its whole prompt, takes all the budget left, and starts only
    with at least ``lim[9]`` tokens (or all a slot's budget leaves). Holders that did
    not run stay paused where their KV fits, and are evicted otherwise. With ``fast``
    the knapsack is skipped (first-fit over the candidates only).
    """
    prompt, output, gen, held, done, order, phase = ia[0], ia[1], ia[2], ia[3], ia[4], ia[5], ia[6]
    arrival, scale, wkey, pkey = fa[0], fa[1], fa[2], fa[3]
    wait, hold, cand, tmp, pend, pin = ib[0], ib[1], ib[2], ib[3], ib[4], ib[5]
    n = prompt.shape[0]
    cap, bs, kmin, cells, floor_all, fast, kmax = lim[0], lim[1], lim[2], lim[3], lim[4], lim[5], lim[6]
    budget_c, budget_p, min_chunk = lim[7], lim[8], lim[9]
    q = min(budget_c, budget_p)  # the most known tokens one batch can (re)process
    ptr, wlen, hlen, nbat, nit, nev, plen, npin = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
    t, slot, tail, hold_w, discount, power = clock[0], clock[1], clock[2], clock[3], clock[4], clock[5]
    cap_b, cap_i, cap_e = bf.shape[0], it.shape[1], ev.shape[0]
    size = np.zeros(kmax, dtype=np.int64)
    units = np.zeros(kmax, dtype=np.int64)
    value = np.zeros(kmax, dtype=np.float64)
    chosen = np.zeros(kmax, dtype=np.int64)
    ctok = np.zeros(kmax, dtype=np.int64)
    best = np.zeros(cells + 1, dtype=np.float64)
    best2 = np.zeros(cells + 1, dtype=np.float64)
    take = np.zeros((kmax, cells + 1), dtype=np.bool_)
    run = np.zeros(kmax + n, dtype=np.int64)
    rtok = np.zeros(n, dtype=np.int64)
    inpin = np.zeros(n, dtype=np.bool_)
    for a in range(npin):
        inpin[pin[a]] = True
    status = DONE
    decided = 0

    def offer(c, tok_left, pre_left, res, chunk_min):
        """The tokens candidate c's item takes in this slot, and whether they fit the budget left: a
        decode's one (of C only), every known token of a request holding no KV, or a first chunk as large
        as the budget left allows (at least ``chunk_min``)."""
        r = cand[c]
        if held[r] > 0:
            return 1, tok_left >= 1
        if ctok[c] < 0:
            tk = min(prompt[r] + gen[r], pre_left, tok_left - res)
            return tk, tk >= chunk_min
        return ctok[c], ctok[c] <= pre_left and ctok[c] <= tok_left - res

    def accept(c, tk, free, tok_left, pre_left, res):
        """Run candidate c with ``tk`` tokens: the KV, token and prefill budgets (and the holders' decode
        reserve) it leaves."""
        chosen[c] = _RUN
        ctok[c] = tk
        if held[cand[c]] > 0:
            return free - size[c], tok_left - tk, pre_left, max(res - 1, 0)
        return free - size[c], tok_left - tk, pre_left - tk, res

    while ptr < n or wlen > 0 or plen > 0 or npin > 0:
        if decided >= max_batches:
            status = CHUNK
            break
        ptr, plen = join_arrivals(order, arrival, ptr, n, t, pend, plen)
        # Pending requests join the waiting list, keyed by their remaining KV area (the KV their
        # remaining ops hold) times their scale; worst first, ties by position, so the best are last.
        for x in range(plen):
            r = pend[x]
            key = remaining_area(prompt[r], output[r], gen[r]) * scale[r]
            if hold_w > 0.0 and held[r] > 0:
                chunks = (held[r] + q - 1) // q
                key = max(key - hold_w * held[r] * chunks * scale[r], 1e-3 * key)
            insert_waiting(wait, wkey, wlen, r, key)
            wlen += 1
        plen = 0
        if wlen == 0 and npin == 0:
            t = arrival[order[ptr]]  # nothing to run: idle until the next arrival
            continue
        if nbat + 1 > cap_b or nit + kmax + npin > cap_i or nev + hlen + npin > cap_e:
            status = GROW
            break
        free = cap
        tok_left, pre_left = budget_c, budget_p
        first_ev = nev
        nrun = 0
        # Budget kept for the decodes of this slot's holders (one token each), so that prefill
        # chunks do not take every token of C from them.
        # At most C - 1, so that the best pinned request can always go on with its chunk.
        res = min(hlen, max(tok_left - 1, 0))
        # A first chunk is at least min_chunk tokens, or all a slot's budget leaves beside the decodes.
        chunk_min = max(1, min(min_chunk, pre_left, tok_left - res))
        if npin > 0:
            # Pinned requests, best first (their order moves little from slot to slot).
            for a in range(npin):
                r = pin[a]
                pkey[a] = remaining_area(prompt[r], output[r], gen[r]) * scale[r]
                free -= (held[r] + bs - 1) // bs
            for a in range(1, npin):
                r, kr = pin[a], pkey[a]
                b = a - 1
                while b >= 0 and (pkey[b] > kr or (pkey[b] == kr and pin[b] > r)):
                    pin[b + 1], pkey[b + 1] = pin[b], pkey[b]
                    b -= 1
                pin[b + 1], pkey[b + 1] = r, kr
            last = npin
            a = 0
            while a < last:
                r = pin[a]
                m = held[r]
                kb = (m + bs - 1) // bs
                # Its next chunk: as much as the budget and the KV left allow.
                tk = min(prompt[r] + gen[r] - m, pre_left, tok_left - res)
                if tk >= 1:
                    while a == 0 and last > 1 and (free + kb) * bs - m < 1:
                        # The best pinned request always progresses: the worst pinned ones make room.
                        last -= 1
                        rr = pin[last]
                        free += (held[rr] + bs - 1) // bs
                        ev[nev] = rr
                        nev += 1
                        evict(rr, gen, held, phase)
                        inpin[rr] = False
                        pend[plen] = rr
                        plen += 1
                    tk = min(tk, (free + kb) * bs - m)
                if tk >= 1:
                    run[nrun] = r
                    rtok[r] = tk
                    nrun += 1
                    free -= (m + tk + bs - 1) // bs - kb
                    tok_left -= tk
                    pre_left -= tk
                a += 1
            npin = last
        free0 = free
        floor = floor_all if free0 == cap else int(tail * free0)
        # Candidates, best first: at least K, and more while they hold less than 1.5 times the KV
        # left (small requests: the K best alone may not fill the memory).
        # The most known tokens an item may still process in this slot.
        qe = min(pre_left, tok_left - res)
        k, total = 0, 0
        while k < wlen and k < kmax and (k < kmin or 2 * total < 3 * free0):
            r = wait[wlen - 1 - k]
            cand[k] = r
            size[k] = (prompt[r] + gen[r] + bs - 1) // bs
            value[k] = size[k] / max(wkey[wlen - 1 - k], 1e-300) ** power
            chosen[k] = _OPEN
            # Tokens of its item: a decode, or every known token (-1: more than a batch holds, so a
            # first chunk, sized when it is chosen).
            ctok[k] = 1 if held[r] > 0 else (prompt[r] + gen[r] if prompt[r] + gen[r] <= qe else -1)
            if ctok[k] < 0 and discount > 0.0:
                # A first chunk generates nothing for the batches its prompt (or refill) takes.
                value[k] /= 1.0 + discount * ((prompt[r] + gen[r] + q - 1) // q - 1)
            total += size[k]
            k += 1
        wlen -= k
        # An item's tokens: a decode's one (of C only), every known token of a request holding no KV,
        # or, where those are more than q, a first chunk as large as the budget left allows (its
        # request is packed at its whole prompt, which its next chunks take, and starts only with at
        # least ``min_chunk`` tokens). ``ok``: whether it fits the budget left.
        first = 0
        while first < k:
            c = first
            if free - size[c] < floor:
                break
            tk, ok = offer(c, tok_left, pre_left, res, chunk_min)
            if ok:
                free, tok_left, pre_left, res = accept(c, tk, free, tok_left, pre_left, res)
            else:
                chosen[c] = _OUT
            first += 1
        if fast == 0 and first < k and free > 0:
            unit = (free + cells - 1) // cells
            room = free // unit
            prev, cur = best, best2
            prev[: room + 1] = 0.0
            for c in range(first, k):
                units[c] = (size[c] + unit - 1) // unit
                if not offer(c, tok_left, pre_left, res, chunk_min)[1]:
                    units[c] = room + 1  # over the budget left: not offered
                u = units[c]
                if u > room:
                    continue
                v = value[c]
                picks = take[c]
                for x in range(u):
                    cur[x] = prev[x]
                    picks[x] = False
                _knapsack_row(
                    prev[: room + 1 - u], prev[u : room + 1], cur[u : room + 1], picks[u : room + 1], v
                )
                prev, cur = cur, prev
            x = room
            for c in range(k - 1, first - 1, -1):
                if units[c] <= room and take[c, x]:
                    chosen[c] = _PICKED
                    x -= units[c]
            # The pick, best first, as far as its tokens fit the budget left.
            for c in range(first, k):
                if chosen[c] != _PICKED:
                    continue
                tk, ok = offer(c, tok_left, pre_left, res, chunk_min)
                if ok:
                    free, tok_left, pre_left, res = accept(c, tk, free, tok_left, pre_left, res)
                else:
                    chosen[c] = _OPEN
        # First chunks hold only their own KV this slot: the rest of their prompt's goes to the fill.
        for c in range(k):
            r = cand[c]
            if chosen[c] == _RUN and held[r] == 0 and ctok[c] < prompt[r] + gen[r]:
                need = (ctok[c] + bs - 1) // bs
                free += size[c] - need
                size[c] = need
        for c in range(first, k):  # what the rounding left, first-fit by priority
            if chosen[c] != _OPEN or size[c] > free:
                continue
            r = cand[c]
            tk, ok = offer(c, tok_left, pre_left, res, chunk_min)
            if ok:
                if held[r] == 0 and tk < prompt[r] + gen[r]:
                    size[c] = (tk + bs - 1) // bs  # a first chunk holds only its own KV
                free, tok_left, pre_left, res = accept(c, tk, free, tok_left, pre_left, res)
        # Holders that did not run: paused where their KV still fits, evicted otherwise.
        h2 = 0
        for x in range(hlen):
            r = hold[x]
            ran = False
            for c in range(k):
                if cand[c] == r and chosen[c] == _RUN:
                    ran = True
                    break
            if ran:
                continue
            keep = (held[r] + bs - 1) // bs
            if keep <= free:
                free -= keep
                tmp[h2] = r
                h2 += 1
            else:
                ev[nev] = r
                nev += 1
                evict(r, gen, held, phase)
                if hold_w > 0.0:
                    # Its waiting key held a bonus for the KV it held: a candidate is keyed again below,
                    # any other leaves the waiting list to be keyed again.
                    cnd = False
                    for c in range(k):
                        if cand[c] == r:
                            cnd = True
                            break
                    if not cnd:
                        y = 0
                        for x2 in range(wlen):
                            if wait[x2] != r:
                                wait[y], wkey[y] = wait[x2], wkey[x2]
                                y += 1
                        wlen = y
                        pend[plen] = r
                        plen += 1
        # Log the items in position order (a stable layout, so repeated decode batches fold into runs).
        bf[nbat] = t
        bi[0, nbat] = nit
        bi[1, nbat] = first_ev
        for c in range(k):
            if chosen[c] == _RUN:
                r = cand[c]
                run[nrun] = r
                rtok[r] = ctok[c]
                nrun += 1
        run[:nrun].sort()
        for c in range(nrun):
            r = run[c]
            it[0, nit], it[1, nit], it[2, nit], it[3, nit] = r, rtok[r], held[r], phase[r]
            nit += 1
            process_item(r, rtok[r], prompt, output, gen, held, phase, done)
        # Pinned requests stay pinned while a chunk of their prompt or refill is left; once it is done
        # they hold KV and wait again. Run candidates that started a chunk join them; other run
        # requests hold KV.
        a2 = 0
        for a in range(npin):
            r = pin[a]
            if done[r] == 0 and phase[r] != DECODE:
                pin[a2] = r
                a2 += 1
            else:
                inpin[r] = False
                if done[r] == 0:
                    pend[plen] = r
                    plen += 1
        npin = a2
        for c in range(nrun):
            r = run[c]
            if done[r] == 1 or inpin[r]:
                continue
            if phase[r] != DECODE:
                pin[npin] = r
                npin += 1
                inpin[r] = True
            else:
                tmp[h2] = r
                h2 += 1
        for x in range(h2):
            hold[x] = tmp[x]
        hlen = h2
        nbat += 1
        bi[0, nbat] = nit
        bi[1, nbat] = nev
        # Every candidate neither done nor pinned goes back to the waiting list (its key moved if it ran).
        for c in range(k):
            r = cand[c]
            if done[r] == 0 and not inpin[r]:
                pend[plen] = r
                plen += 1
        t += slot
        decided += 1
    sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7] = ptr, wlen, hlen, nbat, nit, nev, plen, npin
    clock[0] = t
    return status


advance_py = advance
#: The compiled kernel (numba caches it on disk: ``kvsched warmup`` compiles it ahead of time).
advance_jit = nb.njit(cache=True)(advance)
