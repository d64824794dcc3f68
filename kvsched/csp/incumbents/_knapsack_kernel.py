"""The knapsack greedy's hot loop: one slot after another, on plain arrays.

:func:`advance` is plain Python over scalars and numpy arrays, so that the same
source runs interpreted (:data:`advance_py`, the reference the tests compare
against) and compiled by numba (:data:`advance_jit`). It decides batches only;
the driver (:mod:`kvsched.csp.incumbents.knapsack`) turns its log into a schedule
that the semantic core replays.

Every item it logs generates a token: a decode of a request holding its KV, or the
whole prompt (prefill) or every known token (refill) of one holding none. So an item
of a request that has generated G tokens holds I + G tokens after the batch, and a
batch's items, plus the holders it keeps, fit the KV capacity.

Array layout (``n`` requests):

* ``ia`` int64 (6, n): prompt I, output O, generated G, KV held (tokens), done, arrival order;
* ``fa`` float64 (3, n): arrival, per-request scale of the key, waiting keys (by list position);
* ``lim`` int64 (7,): KV blocks, block size, candidates K, DP cells, the KV the knapsack chooses for (blocks), fast,
  candidates at most;
* ``sc`` int64 (7,): arrival pointer, waiting length, holders, batches, items, evictions, pending;
* ``clock`` float64 (2,): the next batch's start, the slot length;
* ``ib`` int64 (5, n): waiting list (worst first, best last), holders, candidates, scratch,
  pending inserts (arrivals and last slot's candidates);
* the log: ``bf`` float64 (cap_b,) starts; ``bi`` int64 (2, cap_b + 1) item and eviction offsets;
  ``it`` int64 (3, cap_i) request, tokens, KV context; ``ev`` int64 (cap_e,) evicted requests.
"""

from __future__ import annotations

import numba as nb
import numpy as np

#: Return codes of :func:`advance`.
DONE, CHUNK, GROW = 0, 1, 2
#: Same tolerance as the core's arrival check (kvsched.schedule.core.TIME_TOL).
ARRIVAL_TOL = 1e-9


def advance(ia, fa, lim, sc, clock, ib, bf, bi, it, ev, max_batches):
    """Decide up to ``max_batches`` batches; return why it stopped (:data:`DONE`, ...).

    Every slot takes the K best waiting requests by key (the candidates; more while they
    hold less than 1.5 M between them, up to ``lim[6]``), runs the best of them
    first-fit while the KV left stays at least ``lim[4]`` (the share the knapsack
    chooses for), then picks among the rest the subset of largest total value w / key
    (w: the KV the op holds, in blocks; the weighted-shortest-first ratio) that fits
    what is left, by a 0/1 knapsack over at most ``lim[3]`` capacity cells (item sizes
    rounded up to a cell, so the pick always fits), and fills what is still left
    first-fit. Holders that did not run stay paused where their KV fits, and are
    evicted otherwise. With ``fast`` the knapsack is skipped (first-fit over the
    candidates only).
    """
    prompt, output, gen, held, done, order = ia[0], ia[1], ia[2], ia[3], ia[4], ia[5]
    arrival, scale, wkey = fa[0], fa[1], fa[2]
    wait, hold, cand, tmp, pend = ib[0], ib[1], ib[2], ib[3], ib[4]
    n = prompt.shape[0]
    cap, bs, kmin, cells, floor, fast, kmax = lim[0], lim[1], lim[2], lim[3], lim[4], lim[5], lim[6]
    ptr, wlen, hlen, nbat, nit, nev, plen = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6]
    t, slot = clock[0], clock[1]
    cap_b, cap_i, cap_e = bf.shape[0], it.shape[1], ev.shape[0]
    size = np.zeros(kmax, dtype=np.int64)
    units = np.zeros(kmax, dtype=np.int64)
    value = np.zeros(kmax, dtype=np.float64)
    chosen = np.zeros(kmax, dtype=np.int64)
    best = np.zeros(cells + 1, dtype=np.float64)
    take = np.zeros((kmax, cells + 1), dtype=np.bool_)
    status = DONE
    decided = 0
    while ptr < n or wlen > 0 or plen > 0:
        if decided >= max_batches:
            status = CHUNK
            break
        while ptr < n and arrival[order[ptr]] <= t + ARRIVAL_TOL:
            pend[plen] = order[ptr]
            plen += 1
            ptr += 1
        # Pending requests join the waiting list, keyed by their remaining KV area (the KV their
        # remaining ops hold) times their scale; worst first, ties by position, so the best are last.
        for q in range(plen):
            r = pend[q]
            rem = output[r] - gen[r]
            key = (rem * prompt[r] + 0.5 * (output[r] - 1 + gen[r]) * rem) * scale[r]
            lo, hi = 0, wlen
            while lo < hi:
                mid = (lo + hi) // 2
                if wkey[mid] < key or (wkey[mid] == key and wait[mid] < r):
                    hi = mid
                else:
                    lo = mid + 1
            for x in range(wlen, lo, -1):
                wait[x], wkey[x] = wait[x - 1], wkey[x - 1]
            wait[lo], wkey[lo] = r, key
            wlen += 1
        plen = 0
        if wlen == 0:
            t = arrival[order[ptr]]  # nothing to run: idle until the next arrival
            continue
        if nbat + 1 > cap_b or nit + kmax > cap_i or nev + hlen > cap_e:
            status = GROW
            break
        # Candidates, best first: at least K, and more while they hold less than 1.5 M between them
        # (small requests: the K best alone may not fill the memory).
        k, total = 0, 0
        while k < wlen and k < kmax and (k < kmin or 2 * total < 3 * cap):
            r = wait[wlen - 1 - k]
            cand[k] = r
            size[k] = (prompt[r] + gen[r] + bs - 1) // bs
            value[k] = size[k] / max(wkey[wlen - 1 - k], 1e-300)
            chosen[k] = 0
            total += size[k]
            k += 1
        wlen -= k
        free = cap
        first = 0
        while first < k and free - size[first] >= floor:
            chosen[first] = 1
            free -= size[first]
            first += 1
        if fast == 0 and first < k and free > 0:
            unit = (free + cells - 1) // cells
            room = free // unit
            best[: room + 1] = 0.0
            for c in range(first, k):
                units[c] = (size[c] + unit - 1) // unit
                for x in range(room + 1):
                    take[c, x] = False
                if units[c] > room:
                    continue
                for x in range(room, units[c] - 1, -1):
                    got = best[x - units[c]] + value[c]
                    if got > best[x]:
                        best[x] = got
                        take[c, x] = True
            x = room
            for c in range(k - 1, first - 1, -1):
                if units[c] <= room and take[c, x]:
                    chosen[c] = 1
                    free -= size[c]
                    x -= units[c]
        for c in range(first, k):  # what the rounding left, first-fit by priority
            if chosen[c] == 0 and size[c] <= free:
                chosen[c] = 1
                free -= size[c]
        # Holders that did not run: paused where their KV still fits, evicted otherwise.
        first_ev = nev
        h2 = 0
        for q in range(hlen):
            r = hold[q]
            ran = False
            for c in range(k):
                if cand[c] == r and chosen[c] == 1:
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
                held[r] = 0
        # Log the items in position order (a stable layout, so repeated decode batches fold into runs).
        bf[nbat] = t
        bi[0, nbat] = nit
        bi[1, nbat] = first_ev
        m = 0
        for c in range(k):
            if chosen[c] == 1:
                chosen[m] = cand[c]
                m += 1
        chosen[:m].sort()
        for c in range(m):
            r = chosen[c]
            it[0, nit], it[1, nit], it[2, nit] = r, prompt[r] + gen[r] - held[r], held[r]
            nit += 1
            held[r] = prompt[r] + gen[r]
            gen[r] += 1
            if gen[r] >= output[r]:
                held[r] = 0
                done[r] = 1
            else:
                tmp[h2] = r
                h2 += 1
        for q in range(h2):
            hold[q] = tmp[q]
        hlen = h2
        nbat += 1
        bi[0, nbat] = nit
        bi[1, nbat] = nev
        # Every candidate not done goes back to the waiting list (its key moved if it ran).
        for c in range(k):
            if done[cand[c]] == 0:
                pend[plen] = cand[c]
                plen += 1
        t += slot
        decided += 1
    sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6] = ptr, wlen, hlen, nbat, nit, nev, plen
    clock[0] = t
    return status


advance_py = advance
#: The compiled kernel (numba caches it on disk: ``kvsched warmup`` compiles it ahead of time).
advance_jit = nb.njit(cache=True)(advance)
