"""InferMax's unified scheduler (seed 003, Sec. 3.1, Algorithm 1): one flag-driven policy.

Every scheduler of seed 003 (Table 1: vLLM, vLLM_hy, SARATHI and its variants;
their eviction-free twins; Rank_org/I/O of Sec. 4.6; the Sec. 6 "sorting +
histogram" scheduler) is :class:`InferMax` with different flags; the named
configurations live in :mod:`kvsched.heuristics.registry`, its answers to the
simulator's run offers in :mod:`kvsched.heuristics.infermax_runs`.

GETNEXTBATCH, as implemented (``shared/notes/003_004.md`` A3.3)::

    B = []
    for G in GROUPREQUESTS(waiting, running):            # (1) groups in priority order
        for cand in G:
            if cand was evicted in this call: skip
            if not hybrid and B and phase(cand) != phase(B): skip            # (2)
            c = S - m  (chunked prefill: min(c, P - tokens(B)))
            if c < 1 or c > C - tokens(B) or (prefill and c > P - tokens(B)):
                skip                                      # (3) C and P failures never evict
            need = blocks(want(cand)) - blocks(alloc[cand])
            while need > free blocks:                     # (3) M failure
                if cand is waiting: stop admitting (or probe the next one); skip
                evict the lowest-priority running request after cand       # (4)
                ... or, if there is none, cand itself (self-eviction)
            alloc[cand] = max(alloc[cand], want(cand)); B += (cand, c)

Reservations are per request (``alloc``), in whole KV blocks, and freed when a
request completes or is evicted. ``want`` is S (the whole prompt or refill,
even when chunked) at prefill/refill admission and m + 1 for a decode; I + O - 1
for eviction-free (EF) runs; max(S, I + Ô - 1) for the histogram estimate of
Sec. 6. A running chunked prefill already holds its reservation, so it never
needs memory (the paper: R_r^p "can always be allocated"). Because every request's KV stays within its reservation and the
reservations fit in M, the core never sees an over-full cache.

Where the paper leaves a choice open (notes A3.2-A3.3, D7-D11) it is a flag,
with the default that reproduces the paper's worked example (Fig. 15):

* ``reinsert``: where an evicted request re-enters the waiting queue: by its
  arrival (default), at the tail ("appended to R_w"), or at the front (real vLLM).
* ``on_waiting_mfail``: a waiting request that does not fit in M stops admission
  for this batch (default; the paper's "skips to the next group") or lets the
  next waiting request be probed.
* One priority key orders every group and picks victims: (rank value, seq), where
  seq is the arrival order, changed by ``reinsert`` on eviction. Real vLLM keeps
  running requests in admission order instead.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from kvsched.costmodel.small import SMALL, count, isum, nonzero
from kvsched.heuristics.base import Decision, SchedulerView, check_whole_prompt_fits, new_decision
from kvsched.heuristics.checks import check_choice, check_positive
from kvsched.heuristics.infermax_build import Build as _Build
from kvsched.heuristics.infermax_queue import WaitingQueue
from kvsched.heuristics.infermax_runs import RunOffers
from kvsched.instances.model import Instance, Limits
from kvsched.schedule.ir import Phase

Priority = Literal["prefill", "decode", "none"]
Rank = Literal["arrival", "prompt", "output"]
Reserve = Literal["input", "peak", "histogram"]
DecodeOrder = Literal["priority", "kv-desc"]
Victim = Literal["lowest-priority", "smallest-kv"]
Reinsert = Literal["arrival", "tail", "front"]
WaitingFail = Literal["stop", "probe"]

_DECODE = int(Phase.DECODE)
# Constants of the per-batch array operations as 0-d arrays of the operand's dtype (numpy 2 converts
# a Python scalar on every call, about the cost of the operation on a few items): same results.
_DECODE_CODE = np.array(_DECODE, dtype=np.int8)
_ZERO = np.array(0, dtype=np.int64)
_ONE = np.array(1, dtype=np.int64)
_accumulate = np.add.accumulate  # running sums (np.cumsum's wrapper costs more than the sum on a batch)

#: Token budget C when neither the instance nor the policy sets one (Llama-2-7B, seed 003 Sec. 4.1).
DEFAULT_TOKEN_BUDGET = 4096


def stricter(*limits: int | None) -> int | None:
    """The smallest of the limits that are set (``None`` = unlimited)."""
    given = [int(x) for x in limits if x is not None]
    return min(given) if given else None


def effective_budgets(
    limits: Limits,
    token_budget: int | None = None,
    prefill_budget: int | None = None,
    max_running: int | None = None,
) -> tuple[int, int, int | None]:
    """A policy's budgets on an instance of these ``limits``, from its own (``None``: not set).

    C is the stricter of the policy's and the instance's token budgets (:data:`DEFAULT_TOKEN_BUDGET`
    where neither sets one); P the stricter of the policy's and the instance's prefill budgets, and at
    most C; ``max_running`` the stricter of the two (``None``: unlimited).
    """
    c = stricter(token_budget, limits.max_batch_tokens) or DEFAULT_TOKEN_BUDGET
    return (
        c,
        min(prefill_budget or c, limits.max_prefill_tokens or c, c),
        stricter(max_running, limits.max_running),
    )


class InferMax(RunOffers):
    """InferMax's Algorithm 1 GETNEXTBATCH with the flags of seed 003 Table 1, Sec. 4.6 and Sec. 6.

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    priority
        Group order (step 1): ``"prefill"`` = [running mid-prefill, waiting,
        running decodes] (vLLM); ``"decode"`` = [running decodes, running
        mid-prefill, waiting] (SARATHI); ``"none"`` = one group of every request
        (Rank_*). Running mid-prefill requests only exist with ``chunked``; the
        paper's prefill-priority groups are [waiting, running].
    hybrid
        Allow prefill (or refill) and decode items in one batch (step 2).
    chunked
        Chunked prefill: a prefill or refill item takes ``min(S - m, P - tokens)``.
    prefill_budget
        P: a prefill or refill item must fit in ``P - tokens(B)`` (all of B's
        tokens, decodes included, as in the paper). ``None`` means P = C. The
        instance's P, when set, is never exceeded.
    token_budget
        C: tokens per batch. ``None`` uses the instance's C, else 4096. A value
        looser than the instance's is clamped to it.
    max_running
        Requests holding KV (vLLM's ``max_num_seqs``); admission stops at it.
        ``None`` uses the instance's limit (unlimited if unset).
    reserve
        What admission reserves: ``"input"`` = S at prefill/refill and m + 1 per
        decode; ``"peak"`` = I + O - 1 (eviction-free, hindsight); ``"histogram"``
        = max(S, I + Ô - 1) with Ô the ``quantile`` of the output lengths of the
        requests completed so far (Sec. 6), S until ``warmup`` have completed.
    rank
        Key that orders every group, ties broken by seq: ``"arrival"``
        (Rank_org), ``"prompt"`` (Rank_I, small I first) or ``"output"``
        (Rank_O, small O first; hindsight).
    decode_order
        ``"kv-desc"`` orders running decodes by KV held, largest first (Sec. 6).
    victim
        ``"lowest-priority"``: evict the last running request after the candidate
        in priority order; ``"smallest-kv"``: the one holding the least KV (Sec. 6).
    reinsert
        Where an evicted request re-enters the waiting queue: ``"arrival"``,
        ``"tail"`` or ``"front"``.
    on_waiting_mfail
        ``"stop"`` admitting waiting requests for this batch when one does not
        fit in M, or ``"probe"`` the next.
    quantile, warmup
        Ô estimator of ``reserve="histogram"``.
    """

    def __init__(
        self,
        name: str = "infermax",
        *,
        priority: Priority = "decode",
        hybrid: bool = True,
        chunked: bool = True,
        prefill_budget: int | None = None,
        token_budget: int | None = None,
        max_running: int | None = None,
        reserve: Reserve = "input",
        rank: Rank = "arrival",
        decode_order: DecodeOrder = "priority",
        victim: Victim = "lowest-priority",
        reinsert: Reinsert = "arrival",
        on_waiting_mfail: WaitingFail = "stop",
        quantile: float = 0.9,
        warmup: int = 10,
    ) -> None:
        check_choice("priority", priority, Priority)
        check_choice("reserve", reserve, Reserve)
        check_choice("rank", rank, Rank)
        check_choice("decode_order", decode_order, DecodeOrder)
        check_choice("victim", victim, Victim)
        check_choice("reinsert", reinsert, Reinsert)
        check_choice("on_waiting_mfail", on_waiting_mfail, WaitingFail)
        for flag, value in (("hybrid", hybrid), ("chunked", chunked)):
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false; got {value!r}")
        check_positive("prefill_budget", prefill_budget)
        check_positive("token_budget", token_budget)
        check_positive("max_running", max_running)
        if isinstance(quantile, bool) or not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1]; got {quantile!r}")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError(f"warmup must be a positive integer; got {warmup!r}")
        self.name = name
        self.priority = priority
        self.hybrid = hybrid
        self.chunked = chunked
        self.prefill_budget = prefill_budget
        self.token_budget = token_budget
        self.max_running = max_running
        self.reserve = reserve
        self.rank = rank
        self.decode_order = decode_order
        self.victim = victim
        self.reinsert = reinsert
        self.on_waiting_mfail = on_waiting_mfail
        self.quantile = float(quantile)
        self.warmup = warmup
        self.uses_true_output = reserve == "peak" or rank == "output"
        self._budgets: dict[str, int | None] = {}
        # Runs are argued for these flags only (see each method): others do not opt in (no plans in vain).
        if priority != "decode" or not chunked:
            self.repeat_chunks = None  # type: ignore[method-assign,assignment]
            self.chunks_ahead = None  # type: ignore[method-assign,assignment]
        if priority == "none" or decode_order != "priority":
            self.continue_decodes = None  # type: ignore[method-assign,assignment]

    @property
    def params(self) -> Mapping[str, Any]:
        """The flags, plus the budgets in force once :meth:`reset` has seen an instance."""
        out: dict[str, Any] = {
            "priority": self.priority,
            "hybrid": self.hybrid,
            "chunked": self.chunked,
            "prefill_budget": self.prefill_budget,
            "token_budget": self.token_budget,
            "max_running": self.max_running,
            "reserve": self.reserve,
            "rank": self.rank,
            "decode_order": self.decode_order,
            "victim": self.victim,
            "reinsert": self.reinsert,
            "on_waiting_mfail": self.on_waiting_mfail,
        }
        if self.reserve == "histogram":
            out.update(quantile=self.quantile, warmup=self.warmup)
        if self._budgets:
            out["effective"] = dict(self._budgets)
        return out

    def __repr__(self) -> str:
        return f"InferMax({self.name!r})"

    # ----------------------------------------------------------------- set-up
    def reset(self, instance: Instance) -> None:
        lim = instance.limits
        self._C, self._P, self._R = effective_budgets(
            lim, self.token_budget, self.prefill_budget, self.max_running
        )
        self._budgets = {"C": self._C, "P": self._P, "max_running": self._R}
        self._block = lim.block_size
        self._capacity = lim.kv_blocks
        n = self._n = len(instance)
        self._prompt = [r.prompt for r in instance.requests]
        self._prompt_arr = np.array(self._prompt, dtype=np.int64)
        self._alloc = np.zeros(n, dtype=np.int64)  # KV tokens reserved per request
        self._reserved = 0  # KV blocks reserved in all
        self._key: list[tuple[int, int]] = [(0, 0)] * n  # priority: smaller first
        self._seq = [0] * n
        self._counter = 0  # next seq at the tail
        self._front = -1  # next seq at the front
        self._cursor = 0  # arrivals taken so far (prefix of view.arrival_order)
        self._released = 0  # completions seen by the last _release_finished (view.num_done)
        self._waiting = WaitingQueue()  # sorted by key
        self._running = np.zeros(0, dtype=np.int64)  # sorted by key; every one holds a reservation
        self._ones = np.ones(min(self._C, n), dtype=np.int64)  # the tokens of a batch of decodes
        self._ones.flags.writeable = False
        self._hist = np.zeros(0, dtype=np.int64)  # completed requests per output length
        self._seen = 0
        self._estimate: int | None = None
        self._output: np.ndarray | None = None
        # Every running decode's reservation is exactly its KV, as of the batches applied (the last call's
        # build.exact: its batch and the runs after it keep it so, see _grow_decodes).
        self._decodes_exact = False

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._block)

    def _blocks_of(self, tokens: np.ndarray) -> np.ndarray:
        return tokens if self._block == 1 else -(-tokens // self._block)

    # ------------------------------------------------------------ GETNEXTBATCH
    def next_batch(self, view: SchedulerView) -> Decision | None:
        if self.uses_true_output:
            self._output = view.output
        self._take_arrivals(view)
        running = self._release_finished(view)
        build = self._group_running(view, running)
        self._decodes_exact = build.exact

        # Step (1): the groups, in priority order.
        n = build.order.size
        if self.priority == "decode":  # [running decodes, running mid-prefill, waiting]
            first_prefill = build.num_decodes  # decodes come first
            self._consider_decodes(build, 0, first_prefill)
            for rank in range(first_prefill, n):
                self._consider_running(build, rank)
            self._consider_waiting(build, view)
        elif self.priority == "prefill":  # [running mid-prefill, waiting, running decodes]
            first_decode = n - build.num_decodes  # decodes come last
            for rank in range(first_decode):
                self._consider_running(build, rank)
            self._consider_waiting(build, view)
            self._consider_decodes(build, first_decode, n)
        else:  # one group of everything
            self._consider_merged(build, view)

        self._commit(build)
        if not build.requests and not build.parts and not build.evicted:  # (build.empty, without the call)
            self._explain_stall(view)
            return None
        requests, tokens = build.items()
        return new_decision(requests, tokens, build.evicted)  # (Decision(...) at 60% of its cost)

    def _group_running(self, view: SchedulerView, run: np.ndarray) -> _Build:
        """Running requests in global priority order, split by phase (one vectorized read)."""
        if run.size > SMALL:
            # The core's reads (the next item a decode, KV held): when the batch is `run` itself (every
            # running request in this order), the core's batch takes them instead of gathering again.
            # `run` is this policy's own and never written in place: frozen, as the core asks for that.
            run.setflags(False)
            kv, decode, num_decodes = view.read_items(run)
        else:  # (a few items go to the core as lists: the freezing and the reads' record cost more)
            decode = view.phase_of(run) == _DECODE_CODE  # the next item is a decode
            kv = view.kv[run]
            num_decodes = count(decode)
        if self.priority != "none":
            # Phase groups: decodes first (decode priority) or last (prefill priority).
            dec_first = self.priority == "decode"
            if self.decode_order == "kv-desc":
                # Decodes by KV held, largest first; lexsort is stable, so ties keep priority order.
                ranking = np.lexsort((np.where(decode, -kv, 0), decode != dec_first))
                run, decode, kv = run[ranking], decode[ranking], kv[ranking]
            elif (
                0 < num_decodes < run.size
                and nonzero(decode[:num_decodes] if dec_first else decode[run.size - num_decodes :])
                < num_decodes
            ):  # else the decodes are in place already and the stable sort keeps the order
                # A stable sort on "not in the first group" (False first) keeps priority order within groups.
                ranking = (~decode if dec_first else decode).argsort(kind="stable")
                run, decode, kv = run[ranking], decode[ranking], kv[ranking]
        build = _Build(
            view,
            run,
            kv,
            decode,
            num_decodes,
            self._capacity - self._reserved,
            run.size,
            run.size - 1,
        )
        if num_decodes and self.reserve == "input" and self._block == 1 and self.priority != "none":
            build.exact = self._decodes_hold_their_reservations(build)
        return build

    def _decodes_hold_their_reservations(self, build: _Build) -> bool:
        """Whether every running decode's reservation is exactly its KV m, read off sums (no gather).

        With input reservations on blocks of one token each decode then wants exactly one more. Every
        running request's reservation covers its KV (``alloc >= m``, ``tests/test_infermax_reservations.py``),
        so the decodes' are all exact when their excesses sum to 0: the excess of every running request
        (the reservations' total less the KV held, which only running requests hold) less that of the
        others, a few prompts or refills in progress (one group of ranks), read one by one.
        """
        n, num_decodes = build.order.size, build.num_decodes
        if n - num_decodes > SMALL:
            return False
        others = range(num_decodes, n) if self.priority == "decode" else range(n - num_decodes)
        excess = self._reserved - build.view.kv_tokens_used
        alloc, order, kv = self._alloc, build.order, build.kv
        for rank in others:
            excess -= alloc.item(order.item(rank)) - kv.item(rank)
        return excess == 0

    def _consider_decodes(self, build: _Build, lo: int, hi: int) -> None:
        """The running decodes at ranks ``lo:hi``: exactly the per-candidate loop, vectorized.

        Candidates are admitted in bulk for as long as each would pass steps (2)-(3)
        on its own (tokens and reserved blocks grow monotonically, so that is a
        prefix); the first one that does not is handed to :meth:`_consider_running`,
        which may evict, and bulk admission resumes after it.
        """
        if lo >= hi or (not self.hybrid and build.decode_batch is False):
            return  # (2) a prefill batch takes no decodes
        order = build.order[lo:hi]
        # A decode wants m + 1 reserved (I + O - 1 from admission on, eviction-free).
        want = self._peak(order) if self.reserve == "peak" else build.kv[lo:hi] + _ONE
        want_blocks = self._blocks_of(want)
        i = lo
        while i < hi and build.tok < self._C:
            seg = i - lo
            cands = order[seg:] if seg else order
            room = self._C - build.tok  # tokens left: one per decode
            if build.exact and (not build.evicted or self.victim == "lowest-priority"):
                # Each candidate reserved exactly its KV, so each needs one more block (no gather), unless
                # evicted in this call: evictions take the running requests from the last rank down (every
                # rank after build.tail; a candidate evicts itself only when none is left after it), so the
                # live candidates are a prefix. As reading them would: the free blocks and the room stop
                # within the live ones, or let the whole segment through (an evicted one needs nothing).
                size = hi - i
                live = size if not build.evicted else max(0, min(size, build.tail + 1 - i))
                k = size if build.free >= live else build.free
                k = room if room < live and room < k else k
                joined = k if k < live else live
                if joined:
                    pos = cands if joined == cands.size else cands[:joined]
                    self._alloc[pos] = want if joined == want.size else want[seg : seg + joined]  # m + 1
                    self._add_decodes(build, pos, joined, i if joined == k else -1)  # (ranks i onwards)
            else:
                wanted, wanted_blocks = (want[seg:], want_blocks[seg:]) if seg else (want, want_blocks)
                k = self._admit_read(build, cands, wanted, wanted_blocks, i, room)
            i += k
            if i < hi:
                self._consider_running(build, i)
                i += 1

    def _admit_read(
        self, build: _Build, cands: np.ndarray, want: np.ndarray, want_blocks: np.ndarray, i: int, room: int
    ) -> int:
        """Bulk admission of the decodes ``cands`` (from rank ``i``) on their reservations as read: how many
        of them were considered (a prefix; those not evicted earlier in this call joined)."""
        alloc = self._alloc[cands]
        if nonzero(alloc) == alloc.size:
            # Every candidate still holds its reservation (none was evicted in this call).
            ones = False  # need is a mask of the candidates that need one more block
            if self._block == 1:  # blocks are tokens: the new reservations first, need is their growth
                grown = np.maximum(alloc, want)
                if self.reserve != "peak":
                    # A decode wants m + 1 and every reservation covers its request's KV (m <= alloc:
                    # admission reserves S, a decode m + 1, a run the KV it ends with): a candidate
                    # needs exactly one more block where want > alloc, else none (a count, not a sum).
                    need, ones = want > alloc, True
                else:
                    need = grown - alloc
            else:
                grown = None
                need = want_blocks - self._blocks_of(alloc)
                np.maximum(need, _ZERO, out=need)
            taken = count(need) if ones else isum(need)
            if taken <= build.free:  # all fit in memory: only the token budget can stop them
                k = room if room < need.size else need.size
                if k < need.size:
                    taken = count(need[:k]) if ones else isum(need[:k])
            else:
                reserved = _accumulate(need, dtype=np.int64)
                k = int(reserved.searchsorted(build.free, "right"))
                k = room if room < k else k
                taken = int(reserved[k - 1]) if k else 0
            if k:
                if grown is not None:  # max(alloc, want), computed above
                    pos, new = (cands, grown) if k == grown.size else (cands[:k], grown[:k])
                elif k == want.size:  # every candidate: no slices
                    pos, new = cands, np.maximum(alloc, want)
                else:
                    pos, new = cands[:k], np.maximum(alloc[:k], want[:k])
                self._alloc[pos] = new
                self._add_decodes(build, pos, taken, i)  # (ranks i to i + k - 1)
            return k
        alive = alloc > _ZERO  # not evicted earlier in this call
        need = want_blocks - self._blocks_of(alloc)
        np.maximum(need, _ZERO, out=need)
        need *= alive  # an evicted candidate needs nothing (and does not join)
        # Both running sums only grow, so the candidates that fit are a prefix (the ufuncs
        # directly: np.cumsum and np.flatnonzero add Python layers on every call).
        k = int(_accumulate(need).searchsorted(build.free, "right"))
        fit = int(_accumulate(alive, dtype=np.int64).searchsorted(room, "right"))
        k = fit if fit < k else k
        take = alive[:k].nonzero()[0]
        if take.size:
            pos = cands[take]
            self._alloc[pos] = np.maximum(alloc[take], want[take])
            self._add_decodes(build, pos, isum(need[:k]), i if take.size == k else -1)
        return k

    def _add_decodes(self, build: _Build, pos: np.ndarray, taken: int, rank: int) -> None:
        """Admit the decodes ``pos``, which reserved ``taken`` more blocks; ``rank`` is the first one's
        rank when they are consecutive ranks (else -1)."""
        self._reserved += taken
        build.free -= taken
        build.add_decodes(pos, self._ones[: pos.size], rank)

    def _consider_running(self, build: _Build, rank: int) -> None:
        r = build.order.item(rank)
        kv = build.kv.item(rank)  # the view's KV of r (read in this call; the state changes after it)
        # view.unprocessed(r) (S - m) on Python ints: a few scalar reads instead of three array ones.
        unprocessed = self._prompt[r] + build.view.generated.item(r) - kv
        self._consider(build, r, unprocessed, kv, build.decode.item(rank), rank)

    def _consider_waiting(self, build: _Build, view: SchedulerView) -> None:
        """The waiting group, in priority order, until admission stops."""
        waiting = self._waiting
        if not waiting.items:
            return
        prompt, generated, kv = self._prompt, view.generated, view.kv
        C, P, closes = self._C, self._P, not self.hybrid
        for j, r in enumerate(waiting):
            # (_waiting_can_join, without the call: once per waiting candidate)
            if (
                build.waiting_closed
                or build.tok >= C
                or build.tok >= P
                or (closes and build.decode_batch is True)
            ):
                break
            # view.unprocessed(r) (S - m) on Python ints (a waiting request holds no KV: m is 0).
            if self._consider(build, r, prompt[r] + generated.item(r) - kv.item(r), 0, False, -1):
                build.admitted.append(j)

    def _consider_merged(self, build: _Build, view: SchedulerView) -> None:
        """One group of every request (Rank_*): running and waiting merged by priority key."""
        order, decode = build.order.tolist(), build.decode.tolist()
        # The queue's live part, read in place (this call does not change the queue).
        items, head, key = self._waiting.items, self._waiting.head, self._key
        num_waiting = len(items) - head
        i = j = 0
        while i < len(order) or j < num_waiting:
            if j < num_waiting and (i == len(order) or key[items[head + j]] < key[order[i]]):
                if not self._waiting_can_join(build):
                    j = num_waiting
                    continue
                r = items[head + j]
                if self._consider(build, r, int(view.unprocessed(r)), 0, False, -1):
                    build.admitted.append(j)
                j += 1
            elif decode[i]:
                # A run of decodes ahead of the next waiting request goes in bulk.
                end = i + 1
                bound = key[items[head + j]] if j < num_waiting else None
                while end < len(order) and decode[end] and (bound is None or key[order[end]] < bound):
                    end += 1
                self._consider_decodes(build, i, end)
                i = end
            else:
                self._consider_running(build, i)
                i += 1

    def _waiting_can_join(self, build: _Build) -> bool:
        """Whether any waiting request (always a prefill or refill) could still join the batch."""
        if build.waiting_closed or build.tok >= self._C or build.tok >= self._P:
            return False
        return self.hybrid or build.decode_batch is not True

    def _consider(self, build: _Build, cand: int, unprocessed: int, kv: int, decode: bool, rank: int) -> bool:
        """Steps (2)-(4) for one candidate; ``rank`` is its index in ``build.order``, -1 if waiting.

        Returns whether ``cand`` joined the batch.
        """
        waiting = rank < 0
        alloc = self._alloc.item(cand)
        if not waiting and alloc == 0:
            return False  # evicted earlier in this call
        # (2) Hybrid batching.
        if not self.hybrid and build.decode_batch is not None and build.decode_batch != decode:
            return False
        # (3) C and P: a failure skips the candidate and never evicts.
        c = unprocessed
        if not decode and self.chunked:
            room = self._P - build.tok
            c = room if room < c else c  # (min, without the call: once per candidate)
        if c < 1 or c > self._C - build.tok or (not decode and c > self._P - build.tok):
            return False
        if waiting and self._R is not None and build.running >= self._R:
            build.waiting_closed = True
            return False
        # (3) M, with (4) evictions for running candidates.
        if self.reserve == "input" and (waiting or decode):  # _want's m + 1 or S, without the call
            want = kv + 1 if decode else unprocessed + kv
        else:
            want = self._want(cand, waiting, decode, unprocessed + kv, kv, alloc)
        if self._block == 1:  # (blocks are tokens: the same number without two calls)
            need = want - alloc if want > alloc else 0
        else:
            need = max(0, self._blocks(want) - self._blocks(alloc))
        while need > build.free:
            if waiting:
                if self.on_waiting_mfail == "stop":
                    build.waiting_closed = True
                return False
            victim = self._pick_victim(build, rank)
            if victim is None:
                self._evict(build, cand)  # self-eviction: no lower-priority request is left
                return False
            self._evict(build, victim)
        if want > alloc:
            self._alloc[cand] = want
            self._reserved += need
            build.free -= need
        if waiting:
            build.running += 1
        build.requests.append(cand)
        build.tokens.append(c)
        build.tok += c
        if build.decode_batch is None:
            build.decode_batch = decode
        return True

    def _peak(self, idx: np.ndarray) -> np.ndarray:
        """I + O - 1 (hindsight)."""
        assert self._output is not None
        return self._prompt_arr[idx] + self._output[idx] - 1

    def _explain_stall(self, view: SchedulerView) -> None:
        """Fail clearly when nothing runs because a waiting request can never fit the budgets."""
        if self._running.size or not self._waiting or self.chunked:
            return
        check_whole_prompt_fits(self.name, view, self._waiting[0], self._C, self._P, " (chunked=False)")

    def _want(self, cand: int, waiting: bool, decode: bool, known: int, kv: int, alloc: int) -> int:
        """KV tokens ``cand`` must have reserved to run its next item (``known`` = S)."""
        if not waiting and not decode:
            return alloc  # mid-prefill: its whole input was reserved when it started
        if self.reserve == "peak":
            assert self._output is not None
            return self._prompt[cand] + int(self._output[cand]) - 1
        if decode:
            return kv + 1
        if self.reserve == "histogram":
            estimate = self._output_estimate()
            if estimate is not None:
                peak = min(self._prompt[cand] + estimate - 1, self._capacity * self._block)
                return max(known, peak)
        return known

    def _pick_victim(self, build: _Build, rank: int) -> int | None:
        """The running request to evict for the candidate at ``rank``: one after it in priority."""
        order, alloc = build.order, self._alloc
        if self.victim == "lowest-priority":
            while build.tail > rank:
                r = int(order[build.tail])
                build.tail -= 1
                if alloc[r] > 0:
                    return r
            return None
        if build.heap is None:
            build.heap = [(kv, -i) for i, kv in enumerate(build.kv.tolist())]
            heapq.heapify(build.heap)
        while build.heap:
            _, neg = build.heap[0]
            r = int(order[-neg])
            heapq.heappop(build.heap)
            if -neg > rank and alloc[r] > 0:
                return r
        return None

    def _evict(self, build: _Build, r: int) -> None:
        blocks = self._blocks(int(self._alloc[r]))
        self._reserved -= blocks
        build.free += blocks
        build.running -= 1
        self._alloc[r] = 0
        build.evicted.append(r)

    # ------------------------------------------------------------- bookkeeping
    def _take_arrivals(self, view: SchedulerView) -> None:
        """GETNEWREQUESTS: new arrivals join the waiting queue in arrival order."""
        if self._cursor == self._n:
            return  # every request has arrived (no clock read)
        arrived = view.num_arrived
        if arrived == self._cursor:
            return
        waiting, key = self._waiting, self._key
        items = waiting.items  # (the same list object however the queue changes: appended to in place)
        for r in view.arrival_order[self._cursor : arrived].tolist():
            self._seq[r] = self._counter
            self._counter += 1
            new = key[r] = (self._rank_value(r), self._seq[r])
            if not items or key[items[-1]] <= new:
                items.append(r)  # where insort puts it (after every key not above its own), cheaper
            else:
                waiting.insort(r, key.__getitem__)
        self._cursor = arrived

    def _rank_value(self, r: int) -> int:
        if self.rank == "prompt":
            return self._prompt[r]
        if self.rank == "output":
            assert self._output is not None
            return int(self._output[r])
        return 0

    def _release_finished(self, view: SchedulerView) -> np.ndarray:
        """Free the reservations of requests that completed in the last batch; the running array."""
        run = self._running
        # Every running request that had completed was released then, and a request joins the running
        # ones unfinished: with no completion since, none of them is done (no gather).
        completions = view.num_done
        if completions == self._released:
            return run
        completed = view.completed_since(self._released)
        self._released = completions
        if len(completed) == 1:
            # The usual case, one completion since the last call: found by its position, without a
            # gather of `done` over the running ones (a request completes once).
            keep = run != completed[0]
            if nonzero(keep) == run.size:
                return run
        else:
            done = view.done[run]
            if not nonzero(done):
                return run
            completed = run[done].tolist()  # (in running order)
            keep = ~done
        alloc = self._alloc
        for r in completed:
            held = alloc.item(r)  # (a scalar read: no numpy scalar)
            self._reserved -= held if self._block == 1 else self._blocks(held)
            alloc[r] = 0
            if self.reserve == "histogram":
                self._observe(int(view.generated[r]))
        run = self._running = run[keep]
        return run

    def _commit(self, build: _Build) -> None:
        """Move admitted requests to running and evicted ones back to waiting."""
        waiting, key = self._waiting, self._key
        admitted = None
        if build.admitted:  # (most calls admit nothing: no list built)
            admitted = waiting.take(build.admitted)  # (increasing indices, usually the queue's head)
        if build.evicted:
            # Every running request holds a reservation but the ones evicted in this call.
            self._running = self._running[self._alloc[self._running] > _ZERO]
        if admitted:
            self._running = self._merged(self._running, admitted)
        for r in build.evicted:
            if self.reinsert == "tail":
                self._seq[r] = self._counter
                self._counter += 1
            elif self.reinsert == "front":
                self._seq[r] = self._front
                self._front -= 1
            key[r] = (key[r][0], self._seq[r])
            waiting.insort(r, key.__getitem__)

    def _merged(self, run: np.ndarray, new: list[int]) -> np.ndarray:
        """``run`` (sorted by key) with ``new`` inserted where their keys belong."""
        key = self._key
        if len(new) == 1 and run.size <= SMALL:  # the usual admission: one request, on the list
            r = new[0]
            order = run.tolist()
            order.insert(bisect.bisect_right(order, key[r], key=key.__getitem__), r)
            return np.array(order, dtype=np.int64)
        new = sorted(new, key=key.__getitem__)
        if not run.size or key[new[0]] > key[int(run[-1])]:  # all after the running ones (new arrivals)
            return np.concatenate((run, new), dtype=np.int64)
        pieces: list[Sequence[int]] = []
        prev = 0
        for r in new:
            at = bisect.bisect_right(run, key[r], key=key.__getitem__)
            pieces += (run[prev:at], [r])
            prev = at
        pieces.append(run[prev:])
        return np.concatenate(pieces, dtype=np.int64)

    # -------------------------------------------------- Sec. 6 output estimate
    def _observe(self, length: int) -> None:
        if length >= self._hist.size:
            grown = np.zeros(max(2 * self._hist.size, length + 1), dtype=np.int64)
            grown[: self._hist.size] = self._hist
            self._hist = grown
        self._hist[length] += 1
        self._seen += 1
        self._estimate = None

    def _output_estimate(self) -> int | None:
        """Ô: the ``quantile`` of completed output lengths; ``None`` during warm-up."""
        if self._seen < self.warmup:
            return None
        if self._estimate is None:
            target = math.ceil(self.quantile * self._seen)
            self._estimate = int(np.searchsorted(np.cumsum(self._hist), target))
        return self._estimate
