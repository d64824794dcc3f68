"""InferMax's answers to run offers: how long its decision stays the same (coalesced runs).

The simulator (:mod:`kvsched.heuristics.step`) offers a policy runs of identical
batches instead of asking it batch by batch: after a decode-only batch
(:class:`~kvsched.heuristics.base.SteadyDecodes`), after decodes plus one prompt
chunk (:class:`~kvsched.heuristics.base.SteadyChunks`) and after a completion or
a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`). Each
answer here is argued from :class:`~kvsched.heuristics.infermax.InferMax`'s
GETNEXTBATCH and updates its reservations as if it had been called that many
times; :class:`RunOffers` is the half of :class:`InferMax` that answers them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvsched.costmodel.small import NUM_OPERANDS, OPERANDS, SMALL, isum, nonzero, operand
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.schedule.search import last_fitting

if TYPE_CHECKING:
    from kvsched.heuristics.infermax import InferMax

_ONE = np.array(1, dtype=np.int64)  # a 0-d operand of the array's dtype (no conversion per call)


class RunOffers:
    """The run half of :class:`~kvsched.heuristics.infermax.InferMax` (its methods read and write its state)."""

    def repeat_decodes(self: InferMax, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode-only batch repeats
        until its decodes' reservations no longer fit.

        Through a run nothing arrives, completes or is evicted, so the groups, their
        order (KV grows equally for every decode) and every reason a prefill or a
        waiting request stayed out hold: budgets are unchanged and the free blocks
        only shrink. The one thing that changes is each decode's reservation of
        m + 1, which grows with its KV; the run lasts while all of them fit (beyond
        that a decode would evict). Eviction-free reservations never grow.
        """
        return self._grow_decodes(view, np.asarray(decision.requests, dtype=np.int64), limit)

    def repeat_chunks(self: InferMax, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Mixed runs (:class:`~kvsched.heuristics.base.SteadyChunks`): SARATHI's steady state while a
        long prompt is chunked (decode priority, chunked prefill, hybrid batches).

        ``decision`` is every running decode D, then a chunk of c tokens of one
        request p that did not finish its prompt, filling the batch to P (n + c =
        P: a chunk is min(S - m, P - tokens), and S - m > c). Through the run
        nothing arrives, completes or is evicted and p never finishes its prompt
        (the simulator's guarantee), so: the groups and their order hold (KV grows
        equally for every decode; p stays mid-prefill); every decode is admitted
        first as long as its reservation of m + 1 fits, exactly as in
        :meth:`repeat_decodes`; p comes first among the running mid-prefill
        requests (any other one before it in priority would have taken the chunk
        in ``decision``: its chunk min(S - m, P - n) >= 1 fits C and P), needs no
        memory (its whole input was reserved when it started) and again gets
        min(S - m, P - n) = c; the batch is then full at P, so no other prefill
        and no waiting request joins. The prompt's last chunk, S - m <= c, may
        leave room: it is the same batch (D, then p's rest) only when no other
        request could take that room, i.e. nothing waits and every running
        request is in the batch; otherwise the run stops before it. Other flag
        sets do not opt in (the constructor hides this method) and answer 0.
        """
        if self.priority != "decode" or not self.chunked:
            return 0
        stretch = self._chunk_stretch(view, decision, 0)
        if stretch is None:
            return 0
        n, chunks, short = stretch
        if limit > chunks and short:
            limit = chunks  # the last chunk would leave room to another request
        if not limit:
            return 0
        return (
            self._grow_decodes(view, np.asarray(decision.requests[:-1], dtype=np.int64), limit)
            if n
            else limit
        )

    def chunks_ahead(
        self: InferMax, view: SchedulerView, decision: Decision, limit: Callable[[], int]
    ) -> int:
        """:meth:`repeat_chunks` asked before the decision's batch applies
        (:class:`~kvsched.heuristics.base.ChunksAhead`): the same answer, read off the state before it.

        The batch will have processed ``c`` tokens of p (p's unprocessed tokens
        are then c fewer) and one token of each decode (each KV then one more: the
        reservations grow from there, ``ahead``); everything else
        :meth:`repeat_chunks` reads (the budget P, the queues, the reservations that
        ``next_batch`` just made) is already as it will be then. Its argument holds
        unchanged, and also for a run whose only batch after this one is the
        prompt's last chunk (then the next decision, when nothing waits and every
        running request is in the batch, is exactly that batch again).
        """
        stretch = self._chunk_stretch(view, decision, int(decision.tokens[-1]))
        if stretch is None:
            return 0
        n, chunks, short = stretch
        if short and chunks <= 0:
            return 0  # (before planning)
        most = limit()
        if most > chunks and short:
            most = chunks
        if most <= 0:
            return 0
        if not n:
            return most
        return self._grow_decodes(view, np.asarray(decision.requests[:-1], dtype=np.int64), most, 1)

    def _chunk_stretch(
        self: InferMax, view: SchedulerView, decision: Decision, done: int
    ) -> tuple[int, int, bool] | None:
        """What :meth:`repeat_chunks` and :meth:`chunks_ahead` read off a decision of n decodes, then a
        chunk of c tokens of p filling the batch to P: n, p's full chunks left once ``done`` more of its
        tokens are processed (before its last chunk), and whether that last chunk would leave room to
        another request (something waits, or a running request is not in the batch). None: the
        decision is no such batch."""
        n = len(decision.requests) - 1
        c = int(decision.tokens[-1])
        if c < 1 or (n and not self.hybrid) or n + c != self._P or len(decision.evict):
            return None
        p = int(decision.requests[-1])
        # view.unprocessed(p) (S - m) on Python ints: scalar reads instead of three array ones.
        chunks = (self._prompt[p] + view.generated.item(p) - view.kv.item(p) - done - 1) // c
        short = bool(self._waiting.items) or self._running.size != n + 1
        return n, chunks, short

    def continue_decodes(
        self: InferMax, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]
    ) -> int:
        """Runs after a completion or a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`).

        :meth:`next_batch` first takes the arrivals and frees finished reservations (so here). With
        nothing waiting and the running requests exactly ``requests`` (decoding, in priority order),
        its groups are these decodes alone, each decoding for as long as :meth:`repeat_decodes`
        argues. Merged groups and ``kv-desc`` do not opt in. ``limit()`` is planned only then.
        """
        if self.uses_true_output:
            self._output = view.output
        # (The queue's list: empty exactly when the queue is, without a method call.)
        if not self._waiting.items:  # (else it stays: arrivals only join the queue)
            self._take_arrivals(view)
        if self._waiting.items:
            return 0
        running = self._release_finished(view)
        # The same positions in the same order, compared as bytes (half the cost of a ufunc and a count):
        # both are int64 (the policy's and the core's), where equal bytes are equal values; positions of
        # another dtype would only differ and answer 0, which is always safe.
        if running.size != requests.size or running.tobytes() != requests.tobytes():
            return 0
        most = limit()
        return self._grow_decodes(view, requests, most) if most else 0

    def declines_continuations(self: InferMax) -> bool:
        """Whether :meth:`continue_decodes` would answer 0 to any offer until this policy is next called
        (:class:`~kvsched.heuristics.base.ContinueDecodes`): requests wait in its queue, which changes
        only in its own calls (arrivals join it in them, and it answers 0 while it is not empty)."""
        return bool(self._waiting.items)

    def _grow_decodes(
        self: InferMax, view: SchedulerView, req: np.ndarray, limit: int, ahead: int = 0
    ) -> int:
        """The batches (at most ``limit``) for which the decodes ``req`` keep fitting their reservations
        of m + 1, taken as if each batch had been decided (the reservations grown to the last one).
        ``ahead``: batches the view's KV is behind (1 before the decision's own batch applies)."""
        if self.reserve == "peak":
            return limit
        kv = view.kv[req]  # each batch j = 1, 2, ... of the run wants kv + j reserved (a fresh gather)
        if ahead:
            kv += operand(ahead)  # (0-d operands: numpy converts a Python int on every call)
        free = self._capacity - self._reserved
        n = req.size
        if self._decodes_exact:
            # Each decode's reservation is exactly its KV (ahead included: the decision reserved m + 1 for
            # its batch): its decision began with every running decode's so (InferMax._group_running), its
            # batch reserved each decode's m + 1 and completed a prompt's S, and runs grow them with the KV.
            # So the linear case below with nothing held beyond the KV, known without reading them.
            k = free // n
            k = limit if limit < k else k
            k = k if k > 0 else 0
            if k:
                self._reserved += n * k
                kv += OPERANDS[k] if k < NUM_OPERANDS else operand(k)
                self._alloc[req] = kv
            return k
        alloc = self._alloc[req]
        linear = held = 0
        if self._block == 1:
            if n <= SMALL:  # the test and the sums on the lists (a few items: cheaper than arrays)
                kv_list, alloc_list = kv.tolist(), alloc.tolist()
                linear = max(map(operator.sub, alloc_list, kv_list), default=0) <= 1
                held = sum(kv_list) - sum(alloc_list)
            else:
                linear = not nonzero(alloc > kv + _ONE)
                held = isum(kv) - isum(alloc)
        if linear:
            # Tokens are blocks and no reservation exceeds kv + 1 (the usual case: each decode
            # reserved m + 1 before the batch that made its KV m + 1), so from j = 1 on each batch
            # reserves one more per decode: grown(j) = sum(kv) + n j - sum(alloc), linear in j.
            k = (free - held) // n
            k = limit if limit < k else k
            k = k if k > 0 else 0  # max(0, min(limit, k)), without two calls
            if k:
                self._reserved += held + n * k  # grown(k)
                # (kv is a fresh gather, or a fresh sum with ahead; the operand from the table, no call)
                kv += OPERANDS[k] if k < NUM_OPERANDS else operand(k)
                self._alloc[req] = kv  # max(alloc, kv + k) = kv + k as alloc <= kv + 1
            return k
        base = isum(self._blocks_of(alloc))

        def grown(j: int) -> int:
            return isum(self._blocks_of(np.maximum(alloc, kv + j))) - base

        k = last_fitting(grown, free, limit)
        if k:
            self._reserved += grown(k)
            self._alloc[req] = np.maximum(alloc, kv + k)
        return k
