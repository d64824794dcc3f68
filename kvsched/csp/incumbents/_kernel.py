"""The greedy's hot loop: one batch decision after another, on plain arrays.

:func:`advance` is plain Python over scalars and numpy arrays, so that the same
source runs interpreted (:data:`advance_py`, the reference the tests compare
against) and compiled by numba (:data:`advance_jit`). It decides batches only;
it never judges them: the driver turns its log into a
:class:`~kvsched.schedule.ir.Schedule` that the semantic core replays.

The state it keeps mirrors the core's per-request state (G generated, m KV held,
the phase of the next item) so that its decisions are legal by construction;
the replay is what proves it.

Array layout (``n`` requests; rows of 2-D arrays):

* ``ia`` int64 (7, n): prompt I, output O, generated G, KV held m, phase, done, evictions;
* ``fa`` float64 (2, n): arrival, static key (a dynamic rule's per-request scale: 1 for the rule itself);
* ``lim`` int64 (13,): KV blocks, block size, C, P, max_running (-1: none), rule,
  preempt, fast, whether ``clock[1]`` is every batch's duration, admission lookahead (tokens),
  smallest first chunk of an admission (tokens), whether a started prefill shrinks its chunk to fit,
  fill pass (:data:`FILL_OFF`, :data:`FILL_ADMIT`, :data:`FILL_EVICT`);
* ``sc`` int64 (9,): arrival pointer, waiting, holders, batches, items, evictions,
  completed, pending inserts, (unused);
* ``clock`` float64 (3,): the next batch's earliest start, the constant duration, the refill weight;
* ``ib`` int64 (12, n): waiting list (worst first), holders, next holders, pending, arrival
  order, marks, scratch, per span of :data:`SPAN` entries the smallest first item in blocks,
  the fill pass's candidates (request, blocks, waiting index or -1 for an evicted holder, tokens);
* ``fb`` float64 (6, n): waiting keys, holder keys, pending keys, scratch, the keys of this batch's
  items (by position in the batch) and of the fill pass's candidates;
* the log: ``bf`` float64 (2, cap_b) start and duration; ``bi`` int64 (2, cap_b + 1)
  item and eviction offsets; ``it`` int64 (4, cap_i) request, tokens, KV context,
  phase; ``ev`` int64 (cap_e,) evicted requests.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.extending import register_jitable

from kvsched.schedule.ir import Phase

#: The core's phase codes (the log's ``it[3]`` is read as :class:`~kvsched.schedule.ir.Phase` as is); plain
#: ints, which numba freezes into the machine code as constants (the knapsack kernel takes these too).
PREFILL, DECODE, REFILL = int(Phase.PREFILL), int(Phase.DECODE), int(Phase.REFILL)
#: Rule codes: a static key per request, or one that moves as the request generates.
STATIC, REMAINING_AREA, REMAINING_OUTPUT = 0, 1, 2
#: Return codes of :func:`advance`.
DONE, CHUNK, GROW, NEED_DURATION = 0, 1, 2, 3
#: Same tolerance as the core's arrival check (kvsched.schedule.core.TIME_TOL).
ARRIVAL_TOL = 1e-9
_BIG = 1 << 62
#: Waiting-list entries per span whose smallest first item (in KV blocks) is kept, to skip spans that cannot fit.
SPAN = 64
#: More pending inserts than this are merged in one pass rather than inserted one by one.
BULK = 32
#: Fill pass modes: off; replace admissions only (no extra eviction); also evict run holders (free eviction).
FILL_OFF, FILL_ADMIT, FILL_EVICT = 0, 1, 2
#: The fill pass looks at this many not-admitted waiting entries (best first) and this many run items
#: (lowest priority first), and makes at most this many two-for-one and one-for-one swaps per batch.
#: Measured on 27 1k instances (ShareGPT, Azure conv/code; memory loads 0.9-1.1; 3 arrival seeds):
#: 64 and 8 beat 16 and 2 (greedy -2.2% against -1.1% under remaining-output), 128 and 16 gain nothing.
FILL_SCAN, FILL_TAIL, FILL_ROUNDS = 64, 8, 4


# The knapsack kernel calls these helpers too; numba stamps its cached machine code with the calling file
# only, so an edit here reaches a cached knapsack kernel once _knapsack_kernel.py changes (touch it).


@register_jitable
def remaining_area(prompt, output, gen):
    """The KV area of a request's remaining ops (tokens held, summed over them): the remaining-area key.

    Plain Python (the interpreted reference calls it as is) that numba compiles into the kernels, the
    knapsack greedy's too (:mod:`kvsched.csp.incumbents._knapsack_kernel`).
    """
    rem = output - gen
    return rem * prompt + 0.5 * (output - 1 + gen) * rem


@register_jitable
def insert_waiting(wait, wkey, wlen, r, key):
    """Insert request ``r`` with ``key`` into the waiting list ``wait[:wlen]`` (worst first, best last; equal
    keys by position), keys in ``wkey``; returns the index it takes. Both greedy kernels keep the list so."""
    lo, hi = 0, wlen
    while lo < hi:
        mid = (lo + hi) // 2
        if wkey[mid] < key or (wkey[mid] == key and wait[mid] < r):
            hi = mid
        else:
            lo = mid + 1
    for k in range(wlen, lo, -1):
        wait[k], wkey[k] = wait[k - 1], wkey[k - 1]
    wait[lo], wkey[lo] = r, key
    return lo


@register_jitable
def join_arrivals(order, arrival, ptr, n, t, pend, plen):
    """Append to ``pend[:plen]`` the requests arrived by ``t`` (in arrival ``order``, from ``ptr``); returns
    the new ``ptr`` and ``plen``. Both greedy kernels admit arrivals so, with the core's tolerance."""
    while ptr < n and arrival[order[ptr]] <= t + ARRIVAL_TOL:
        pend[plen] = order[ptr]
        plen += 1
        ptr += 1
    return ptr, plen


@register_jitable
def process_item(r, tok, prompt, output, gen, held, phase, done):
    """Apply an item of ``tok`` tokens of request ``r`` to the kernel's mirror of the core's state.

    Holding ``I + G`` tokens makes its next token (decodes from then on); its last one releases its KV
    and marks it done. Both greedy kernels process their items so. It returns nothing: the caller reads
    ``done[r]`` (returning the flag measured 4% slower on the compiled greedy).
    """
    held[r] += tok
    if held[r] == prompt[r] + gen[r]:
        gen[r] += 1
        phase[r] = DECODE
        if gen[r] >= output[r]:
            held[r] = 0
            done[r] = 1


@register_jitable
def evict(r, gen, held, phase):
    """Drop request ``r``'s KV in the mirror: its next item is a prefill, or a refill once it has generated.
    Both greedy kernels evict so (the caller logs the eviction)."""
    held[r] = 0
    phase[r] = REFILL if gen[r] > 0 else PREFILL


@register_jitable
def _rule_key(rule, r, prompt, output, gen, skey):
    """Request ``r``'s key under ``rule`` now: static, or its remaining area or output times its scale."""
    if rule == STATIC:
        return skey[r]
    if rule == REMAINING_AREA:
        return remaining_area(prompt[r], output[r], gen[r]) * skey[r]
    return (output[r] - gen[r]) * skey[r]


def advance(ia, fa, lim, sc, clock, ib, fb, bf, bi, it, ev, max_batches):
    """Decide up to ``max_batches`` batches; return why it stopped (:data:`DONE`, ...).

    Every batch: admit arrivals, rank holders (by their current key) and the waiting
    list (sorted once, keys frozen while waiting) in one merged priority order, and
    walk it first-fit. A holder is run if its next item fits, else kept (paused) if
    its KV still fits, else evicted; a waiting request is run if its first item fits.
    With ``preempt`` the two lists interleave by key, so a higher-priority waiting
    request takes memory that lower-priority holders then lose; without it every
    holder comes first (admissions never evict). With ``fast`` the waiting list is
    walked only up to its first misfit.
    """
    prompt, output, gen, held, phase, done, nev = ia[0], ia[1], ia[2], ia[3], ia[4], ia[5], ia[6]
    arrival, skey = fa[0], fa[1]
    wait, hold, hold2, pend, order, mark, tmp, bmin = ib[0], ib[1], ib[2], ib[3], ib[4], ib[5], ib[6], ib[7]
    cand_r, cand_b, cand_w, cand_t = ib[8], ib[9], ib[10], ib[11]
    wkey, hkey, pkey, tmpk, item_key, cand_k = fb[0], fb[1], fb[2], fb[3], fb[4], fb[5]
    n = prompt.shape[0]
    cap_blocks, bs = lim[0], lim[1]
    budget_c = lim[2] if lim[2] >= 0 else _BIG
    budget_p = lim[3] if lim[3] >= 0 else _BIG
    budget_r = lim[4] if lim[4] >= 0 else _BIG
    rule, preempt, fast, const, lookahead = lim[5], lim[6], lim[7], lim[8], lim[9]
    min_chunk, fit_chunk, fill = lim[10], lim[11], lim[12]
    order_ptr, wlen, hlen, nbat, nit, nev_log, ndone, plen = (
        sc[0],
        sc[1],
        sc[2],
        sc[3],
        sc[4],
        sc[5],
        sc[6],
        sc[7],
    )
    t = clock[0]
    refill_weight = clock[2]
    refill_chunk = min(budget_c, budget_p)  # the most a refill can process per batch
    cap_b, cap_i, cap_e = bf.shape[1], it.shape[1], ev.shape[0]
    status = DONE
    decided = 0
    while ndone < n:
        if decided >= max_batches:
            status = CHUNK
            break
        # Arrivals join the pending inserts (evicted requests are already there).
        order_ptr, plen = join_arrivals(order, arrival, order_ptr, n, t, pend, plen)
        if plen > 0:
            # Pending inserts in (key, position) order; the waiting list is kept in the reverse
            # order (best last), so that inserts near the head shift only the few better entries.
            pend[:plen].sort()
            for k in range(plen):
                pkey[k] = _rule_key(rule, pend[k], prompt, output, gen, skey)
            perm = np.argsort(pkey[:plen], kind="mergesort")
            low = wlen  # lowest index whose entry changed
            if plen > BULK:
                # Many at once: merge into best-first order in the scratch rows, then write back reversed.
                a, b, c = wlen - 1, 0, 0
                while a >= 0 or b < plen:
                    if b >= plen or (
                        a >= 0
                        and (
                            wkey[a] < pkey[perm[b]] or (wkey[a] == pkey[perm[b]] and wait[a] < pend[perm[b]])
                        )
                    ):
                        tmp[c], tmpk[c] = wait[a], wkey[a]
                        a -= 1
                    else:
                        tmp[c], tmpk[c] = pend[perm[b]], pkey[perm[b]]
                        b += 1
                    c += 1
                wlen = c
                for k in range(wlen):
                    wait[k], wkey[k] = tmp[wlen - 1 - k], tmpk[wlen - 1 - k]
                low = 0
            else:
                for b in range(plen - 1, -1, -1):
                    lo = insert_waiting(wait, wkey, wlen, pend[perm[b]], pkey[perm[b]])
                    wlen += 1
                    low = min(low, lo)
            for blk in range(low // SPAN, (wlen + SPAN - 1) // SPAN):
                least = _BIG
                for k in range(blk * SPAN, min(wlen, blk * SPAN + SPAN)):
                    least = min(least, (prompt[wait[k]] + gen[wait[k]] + bs - 1) // bs)
                bmin[blk] = least
            plen = 0
        if wlen == 0 and hlen == 0:
            t = arrival[order[order_ptr]]  # nothing to run: idle until the next arrival
            continue
        if nbat + 1 > cap_b or nit + wlen + hlen > cap_i or nev_log + hlen > cap_e:
            status = GROW
            break
        for k in range(hlen):
            r = hold[k]
            hkey[k] = _rule_key(rule, r, prompt, output, gen, skey)
            if refill_weight > 0.0 and held[r] > 0:
                # What evicting r would cost: refilling its KV m takes ceil(m / C) batches of the token
                # budget, all but the last holding KV without generating (with no budget, one batch that
                # generates). In the rule's own units: batches for remaining output, m per batch for the
                # area keys (r's remaining area moves by about m per batch it generates).
                chunks = (held[r] + refill_chunk - 1) // refill_chunk
                if rule == REMAINING_OUTPUT:
                    hkey[k] -= refill_weight * chunks
                else:
                    hkey[k] -= refill_weight * held[r] * chunks
        # Holders were left in last batch's priority order, which their new keys mostly keep:
        # a stable insertion sort is linear on such input (same order as a stable sort).
        for k in range(1, hlen):
            r, kr = hold[k], hkey[k]
            q = k - 1
            while q >= 0 and hkey[q] > kr:
                hold[q + 1], hkey[q + 1] = hold[q], hkey[q]
                q -= 1
            hold[q + 1], hkey[q + 1] = r, kr
        free, tok_left, pre_left, run_left = cap_blocks, budget_c, budget_p, budget_r
        first_item, first_ev = nit, nev_log
        h2 = 0
        admitted = 0
        lowest = 0  # lowest waiting index admitted in this batch
        i, j = 0, wlen - 1  # the waiting list is walked from its best end
        wait_open = True
        while i < hlen or (wait_open and j >= 0):
            take_holder = i < hlen and (not wait_open or j < 0 or preempt == 0 or hkey[i] <= wkey[j])
            if take_holder:
                r = hold[i]
                i += 1
                m = held[r]
                if phase[r] == DECODE:
                    tok = 1 if tok_left >= 1 else 0
                else:
                    tok = min(prompt[r] + gen[r] - m, tok_left, pre_left)
                    if fit_chunk != 0 and (m + tok + bs - 1) // bs > free:
                        # A started prefill or refill goes on with what the KV left holds, rather than
                        # pausing on all it already holds.
                        tok = min(tok, free * bs - m)
                need = (m + tok + bs - 1) // bs
                if tok >= 1 and run_left >= 1 and need <= free:
                    it[0, nit], it[1, nit], it[2, nit], it[3, nit] = r, tok, m, phase[r]
                    item_key[nit - first_item] = hkey[i - 1]
                    nit += 1
                    free -= need
                    tok_left -= tok
                    if phase[r] != DECODE:
                        pre_left -= tok
                    run_left -= 1
                else:
                    keep = (m + bs - 1) // bs
                    if run_left >= 1 and keep <= free:
                        hold2[h2] = r
                        h2 += 1
                        free -= keep
                        run_left -= 1
                    else:
                        ev[nev_log] = r
                        tmpk[nev_log - first_ev] = hkey[i - 1]
                        nev_log += 1
                continue
            if run_left <= 0 or tok_left <= 0 or pre_left <= 0:
                wait_open = False
                continue
            # Skip whole spans of the list whose smallest first item cannot fit (free only shrinks).
            chunk_blocks = (min(tok_left, pre_left) + bs - 1) // bs
            if min(bmin[j // SPAN], chunk_blocks) > free:
                j = (j // SPAN) * SPAN - 1
                continue  # the next waiting entry may now rank after a holder
            r = wait[j]
            j -= 1
            tok = min(prompt[r] + gen[r], tok_left, pre_left)
            need = (tok + bs - 1) // bs
            # An admission leaves room for ``lookahead`` more tokens of every request run so far
            # (and itself), so that the next batches' decodes do not evict what was just prefilled;
            # the first item of a batch needs no room beyond its own (a batch is never empty).
            room = 0 if nit == first_item else lookahead * (nit - first_item + 1)
            # With ``min_chunk`` a request starts only with a first chunk that large (or its whole
            # prompt): a sliver of budget left at the end of a batch would start a long prompt that
            # then holds KV for batches before it generates.
            if need + room <= free and tok >= min(prompt[r] + gen[r], min_chunk):
                it[0, nit], it[1, nit], it[2, nit] = r, tok, 0
                it[3, nit] = PREFILL if gen[r] == 0 else REFILL
                item_key[nit - first_item] = wkey[j + 1]
                nit += 1
                free -= need
                tok_left -= tok
                pre_left -= tok
                run_left -= 1
                mark[r] = 1
                admitted += 1
                lowest = j + 1
            elif fast != 0:
                wait_open = False
        spare = free - (lookahead * (nit - first_item) if lookahead > 0 else 0)
        if fill != FILL_OFF and fast == 0 and spare > 0 and nit > first_item:
            # Fill pass. The walk is first-fit, so every request ranked before a run item that did not
            # fit is larger than that item plus the KV left: no swap keeps the priority order. What
            # pays is running requests closer to completion: one run item (of the lowest priority)
            # is replaced by two that did not fit whose completion rates 1 / (O - G) sum above its
            # own (one more item in the batch), or by one larger with fewer tokens left (more KV used).
            # Candidates: this batch's evicted holders (a decode) and the best FILL_SCAN waiting
            # entries not admitted (their whole first item); a replaced admission stays waiting, a
            # replaced holder is evicted (only with FILL_EVICT, where that is free).
            nc = 0
            for k in range(first_ev, nev_log):
                r = ev[k]
                if phase[r] == DECODE:
                    cand_r[nc], cand_b[nc], cand_w[nc], cand_t[nc] = r, (held[r] + bs) // bs, -1, 1
                    cand_k[nc] = tmpk[k - first_ev]
                    nc += 1
            held_c = nc
            for k in range(wlen - 1, -1, -1):
                if nc >= held_c + FILL_SCAN:
                    break
                r = wait[k]
                if mark[r] == 0:
                    tok = prompt[r] + gen[r]
                    cand_r[nc], cand_b[nc], cand_w[nc], cand_t[nc] = r, (tok + bs - 1) // bs, k, tok
                    cand_k[nc] = wkey[k]
                    nc += 1
            split, swaps = True, 0  # two-for-one swaps first, then one-for-one
            while swaps < 2 * FILL_ROUNDS:
                if split and swaps >= FILL_ROUNDS:
                    split, swaps = False, FILL_ROUNDS
                least = _BIG  # the smallest candidate, to skip those no pair fits with
                for c in range(nc):
                    least = min(least, cand_b[c])
                best_gain, best_p, best_c, best_d = 0, -1, -1, -1
                worst = np.inf
                tail = 0
                for p in range(nit - 1, first_item - 1, -1):
                    if tail >= FILL_TAIL or (split and (best_p >= 0 or run_left < 1)):
                        break
                    admission = it[2, p] == 0
                    if not admission and fill != FILL_EVICT:
                        continue
                    tail += 1
                    rx, tok_x = it[0, p], it[1, p]
                    left_x = output[rx] - gen[rx]
                    room_x = (it[2, p] + tok_x + bs - 1) // bs + spare  # blocks once x is out
                    pre_x = 0 if it[3, p] == DECODE else tok_x
                    for c in range(nc):
                        # Without preemption an admission never evicts a holder: only a holder replaces one.
                        if not admission and preempt == 0 and cand_w[c] >= 0:
                            continue
                        pre_y = cand_t[c] if cand_w[c] >= 0 else 0
                        left_y = output[cand_r[c]] - gen[cand_r[c]]
                        if not split:
                            gain = cand_b[c] + spare - room_x
                            if gain <= best_gain or gain > spare or left_y >= left_x:
                                continue
                            if cand_t[c] > tok_left + tok_x or pre_y > pre_left + pre_x:
                                continue
                            best_gain, best_p, best_c = gain, p, c
                            continue
                        if cand_b[c] + least > room_x:
                            continue
                        for d in range(c + 1, nc):
                            if cand_b[c] + cand_b[d] > room_x:
                                continue
                            if not admission and preempt == 0 and cand_w[d] >= 0:
                                continue
                            left_z = output[cand_r[d]] - gen[cand_r[d]]
                            if left_y * left_z >= left_x * (left_y + left_z):
                                continue  # 1 / left_y + 1 / left_z <= 1 / left_x
                            pre_z = cand_t[d] if cand_w[d] >= 0 else 0
                            if cand_t[c] + cand_t[d] > tok_left + tok_x or pre_y + pre_z > pre_left + pre_x:
                                continue
                            kk = max(cand_k[c], cand_k[d])
                            if kk < worst:
                                worst, best_p, best_c, best_d = kk, p, c, d
                                best_gain = cand_b[c] + cand_b[d] + spare - room_x
                if best_p < 0:
                    if split:
                        split, swaps = False, FILL_ROUNDS
                        continue
                    break
                swaps += 1
                p = best_p
                rx = it[0, p]
                tok_left += it[1, p]
                if it[3, p] != DECODE:
                    pre_left += it[1, p]
                if it[2, p] == 0:
                    mark[rx] = 0  # stays waiting
                    admitted -= 1
                else:
                    ev[nev_log] = rx
                    nev_log += 1
                for w in range(2):
                    c = best_c if w == 0 else best_d
                    if c < 0:
                        break
                    q = p
                    if w == 1:  # the second of a pair is a new item
                        q = nit
                        nit += 1
                        run_left -= 1
                    ry = cand_r[c]
                    tok_left -= cand_t[c]
                    if cand_w[c] >= 0:
                        lowest = cand_w[c] if admitted == 0 else min(lowest, cand_w[c])
                        mark[ry] = 1
                        admitted += 1
                        pre_left -= cand_t[c]
                        it[0, q], it[1, q], it[2, q] = ry, cand_t[c], 0
                        it[3, q] = PREFILL if gen[ry] == 0 else REFILL
                    else:
                        for k in range(first_ev, nev_log):
                            if ev[k] == ry:
                                nev_log -= 1
                                ev[k] = ev[nev_log]
                                break
                        it[0, q], it[1, q], it[2, q], it[3, q] = ry, 1, held[ry], DECODE
                    item_key[q - first_item] = cand_k[c]
                # Used candidates leave the list (the later one first, so that the other keeps its index).
                for c in (max(best_c, best_d), min(best_c, best_d)):
                    if c >= 0:
                        nc -= 1
                        cand_r[c], cand_b[c], cand_w[c], cand_t[c] = (
                            cand_r[nc],
                            cand_b[nc],
                            cand_w[nc],
                            cand_t[nc],
                        )
                        cand_k[c] = cand_k[nc]
                spare -= best_gain
        # Items in position order: a stable layout, so repeated decode batches coalesce into runs.
        perm = np.argsort(it[0, first_item:nit], kind="mergesort")
        for row in range(4):
            seg = it[row, first_item:nit].copy()
            for k in range(perm.shape[0]):
                it[row, first_item + k] = seg[perm[k]]
        # Apply: evictions first (as the core does), then the items.
        for k in range(first_ev, nev_log):
            r = ev[k]
            evict(r, gen, held, phase)
            nev[r] += 1
            pend[plen] = r
            plen += 1
        for k in range(first_item, nit):
            r = it[0, k]
            process_item(r, it[1, k], prompt, output, gen, held, phase, done)
            if done[r]:
                ndone += 1
                continue
            hold2[h2] = r
            h2 += 1
        if admitted > 0:
            # Admitted requests leave the waiting list; only the part above the lowest one moves.
            c = lowest
            for k in range(lowest, wlen):
                r = wait[k]
                if mark[r] == 0:
                    wait[c], wkey[c] = r, wkey[k]
                    c += 1
                else:
                    mark[r] = 0
            wlen = c
            for blk in range(lowest // SPAN, (wlen + SPAN - 1) // SPAN):
                least = _BIG
                for k in range(blk * SPAN, min(wlen, blk * SPAN + SPAN)):
                    least = min(least, (prompt[wait[k]] + gen[wait[k]] + bs - 1) // bs)
                bmin[blk] = least
        for k in range(h2):
            hold[k] = hold2[k]
        hlen = h2
        bf[0, nbat] = t
        bi[0, nbat + 1] = nit
        bi[1, nbat + 1] = nev_log
        decided += 1
        if const != 0:
            bf[1, nbat] = clock[1]
            t = t + clock[1]
            nbat += 1
        else:
            bf[1, nbat] = np.nan
            nbat += 1
            if order_ptr < n:
                status = NEED_DURATION  # the next decision depends on when this batch ends
                break
    sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7] = (
        order_ptr,
        wlen,
        hlen,
        nbat,
        nit,
        nev_log,
        ndone,
        plen,
    )
    clock[0] = t
    return status


#: The interpreted reference (tests compare it with the compiled kernel).
advance_py = advance
#: The compiled kernel (compiled on first use, cached on disk).
advance_jit = nb.njit(cache=True)(advance)
