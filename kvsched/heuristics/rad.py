"""RAD, the Resource-Aware Dynamic scheduler (seed 000 Sec. 4.2, Algorithm 1).

RAD never mixes prefill and decode work. Every batch is one of:

* a **decode batch**: one decode for every request in the decode set D,
  optimally tiled when ``|D| = t_col*``;
* a **prefill batch**: one chunk of ``t_lcm* = LCM(t_row*, t_col*, t_red*)``
  tokens of a single request, whose whole prompt runs back to back.

Time is cut into *cycles* of at most ``n`` started requests::

    if P and D are empty: idle
    elif |D| = t_col* or P is empty or requests_in_cycle = n: decode batch over all of D
         (when D empties, the cycle ends: requests_in_cycle = 0)
    else: prefill the oldest request of P (FCFS) in chunks of t_lcm*, move it to D,
          requests_in_cycle += 1

Fixes to the printed Algorithm 1 (``shared/notes/000.md`` Sec. 2.1):

* line 13's chunk ``min(t_lcm*, L^P - i)`` with i starting at 1 leaves a token
  behind; the chunk here is ``min(t_lcm*, tokens left)``;
* the cycle counter is reset whenever D is empty at a decision, not only after
  a decode batch: a request with O = 1 completes at its prefill and never
  enters D, and with the printed reset a cycle of such requests would wait
  forever on ``requests_in_cycle = n`` with nothing to decode;
* "no requests in P or Q" is read as P and D.

Our accounting: the prefill emits the first token (O counts it), so a request
decodes O - 1 times in D. What the paper leaves to Assumption 4 (memory for
``t_col*`` requests of maximal length) is not assumed here:

* a prefill starts only if its whole prompt (or refill) plus one decode token
  for every request in D and for itself fit in the free KV blocks (so the next
  decode batch fits; when D is empty only the prompt must fit);
* when a decode batch does not fit, the request that entered D last is evicted
  (recompute, LIFO) and returns to the *front* of P, until the rest fit; its
  refill is a prefill like any other, and it counts as a start of the cycle
  again when it re-enters D.

The instance's budgets are obeyed: a chunk is at most C and P, and the active
cap (and so the size of a decode batch) is ``min(t_col*, max_running, C)``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsched.costmodel.rad import RadTiling
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_positive
from kvsched.heuristics.engines import is_decode
from kvsched.heuristics.infermax import effective_budgets, stricter
from kvsched.instances.model import Instance
from kvsched.schedule.search import last_fitting

#: Cycle length n when none is given: the paper gives no value (Theorem 2 only needs it large).
DEFAULT_CYCLE_FACTOR = 4


def tiling_of(instance: Instance) -> tuple[int, int]:
    """``(t_col*, t_lcm*)`` from the instance's ``rad`` time model, else :class:`RadTiling`'s defaults.

    The tiles are those of :mod:`kvsched.costmodel.rad` (Eq. 4-7): the A100
    optimum 128 x 256 with t_red = 32 unless the instance's time model says
    otherwise.
    """
    tm = instance.time_model
    tiling = RadTiling(**tm.params) if tm.name == "rad" else RadTiling()
    t_row, t_col, t_red = (max(1, round(x)) for x in (tiling.t_row, tiling.t_col, tiling.t_red))
    return t_col, math.lcm(t_row, t_col, t_red)


class RAD:
    """Seed 000's RAD scheduler (Sec. 4.2, Algorithm 1), with the fixes in the module docstring.

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    n
        Requests started per cycle. ``None``: ``4 t_col*`` (the paper gives no
        value; Theorem 2 asks for n > (t_col* - 1) T^max / (eps T^R), which is
        large).
    t_col
        t_col*, the decode batch size that tiles the linear layers optimally
        and the cap on active requests. ``None``: from the instance's ``rad``
        time model, else 256 (:class:`~kvsched.costmodel.rad.RadTiling`).
    t_lcm
        Prefill chunk LCM(t_row*, t_col*, t_red*). ``None``: as ``t_col``
        (256 by default).
    """

    uses_true_output = False

    def __init__(
        self, name: str = "rad", *, n: int | None = None, t_col: int | None = None, t_lcm: int | None = None
    ) -> None:
        for label, value in (("n", n), ("t_col", t_col), ("t_lcm", t_lcm)):
            check_positive(label, value)
        self.name = name
        self.n = n
        self.t_col = t_col
        self.t_lcm = t_lcm
        self._effective: dict[str, int | None] = {}

    @property
    def params(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {"n": self.n, "t_col": self.t_col, "t_lcm": self.t_lcm}
        if self._effective:
            out["effective"] = dict(self._effective)
        return out

    def __repr__(self) -> str:
        return f"RAD({self.name!r})"

    def reset(self, instance: Instance) -> None:
        t_col, t_lcm = tiling_of(instance)
        self._t_col = self.t_col or t_col
        self._t_lcm = self.t_lcm or t_lcm
        self._n = self.n or DEFAULT_CYCLE_FACTOR * self._t_col
        lim = instance.limits
        self._C, prefill, _ = effective_budgets(lim)  # (its own cap, below, reads max_running)
        self._chunk = min(self._t_lcm, prefill)
        self._cap = stricter(self._t_col, lim.max_running, self._C) or self._t_col
        self._effective = {"n": self._n, "t_col": self._t_col, "t_lcm": self._t_lcm, "cap": self._cap}
        self._waiting: deque[int] = deque()  # P, FCFS; evicted requests re-enter at the front
        self._decoding: list[int] = []  # D, in the order requests entered it
        self._prefilling: int | None = None  # the request whose prompt runs back to back
        self._in_cycle = 0
        self._cursor = 0
        #: Index (among this run's batches) of the first prefill batch of each cycle.
        self.cycle_starts: list[int] = []
        self._batches = 0

    # ------------------------------------------------------------------ batches
    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._sync(view)
        decision = self._decide(view)
        if decision is not None:
            self._batches += 1
        return decision

    def _decide(self, view: SchedulerView) -> Decision | None:
        if self._prefilling is not None:
            return self._prefill_chunk(view, self._prefilling)
        if not self._decoding:
            self._in_cycle = 0  # D is empty: the cycle is over
            if not self._waiting:
                return None
        if len(self._decoding) >= self._cap or not self._waiting or self._in_cycle >= self._n:
            return self._decode_batch(view)
        head = self._waiting[0]
        if not self._fits(view, head):
            return self._decode_batch(view)
        if not self._decoding and self._in_cycle == 0:
            self.cycle_starts.append(self._batches)
        self._waiting.popleft()
        self._prefilling = head
        return self._prefill_chunk(view, head)

    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode batch repeats while D fits.

        Why the decision stays the same: a decode-only decision is a decode batch
        over all of D with nothing evicted, and no prefill is under way. Through the
        run nothing arrives or completes, so P, D, the cycle counter and the reason
        for decoding stay as they are: either it did not depend on memory (D full,
        P empty, the cycle's n started) or the head of P did not fit, and it still
        does not: with ``m`` D's KV after this batch, call j needs
        ``blocks(S + 1) + sum(blocks(m + j) - blocks(m + j - 1))`` of
        ``free - sum(blocks(m + j - 1) - blocks(m))`` free blocks, i.e. fits iff
        ``blocks(S + 1) + sum(blocks(m + j)) - sum(blocks(m)) <= free``, whose left
        side only grows. The decode batch evicts at call j iff
        ``sum(blocks(m + j)) - sum(blocks(m)) > free``: the run stops before.
        """
        req = np.asarray(decision.requests, dtype=np.int64)
        kv = view.kv[req]
        free = view.kv_blocks_free
        if view.block_size == 1:
            k = max(0, min(limit, free // max(int(req.size), 1)))
        else:
            b = view.block_size
            base = int((-(-kv // b)).sum())
            k = last_fitting(lambda j: int((-(-(kv + j) // b)).sum()) - base, free, limit)
        self._batches += k
        return k

    def _prefill_chunk(self, view: SchedulerView, r: int) -> Decision:
        return Decision([r], [min(self._chunk, int(view.unprocessed(r)))])

    def _decode_batch(self, view: SchedulerView) -> Decision:
        """One decode for every member of D, evicting the newest while they do not fit."""
        free = view.kv_blocks_free
        need = [self._grow(view, r, 1) for r in self._decoding]
        total = sum(need)
        evicted: list[int] = []
        while total > free and len(self._decoding) > 1:
            victim = self._decoding.pop()  # LIFO: the newest member of D
            total -= need.pop()
            evicted.append(victim)
            self._waiting.appendleft(victim)
            free += view.blocks_for(int(view.kv[victim]))
        return Decision(list(self._decoding), [1] * len(self._decoding), evicted)

    def _grow(self, view: SchedulerView, r: int, tokens: int) -> int:
        m = int(view.kv[r])
        return view.blocks_for(m + tokens) - view.blocks_for(m)

    def _fits(self, view: SchedulerView, r: int) -> bool:
        """Whether ``r``'s whole prompt (or refill) fits, with one decode token for it and for all of D."""
        if len(self._decoding) + 1 > self._cap:
            return False
        known = int(view.unprocessed(r))
        if not self._decoding:
            return view.blocks_for(known) <= view.kv_blocks_free
        need = view.blocks_for(known + 1) + sum(self._grow(view, d, 1) for d in self._decoding)
        return need <= view.kv_blocks_free

    # --------------------------------------------------------------- bookkeeping
    def _sync(self, view: SchedulerView) -> None:
        """New arrivals join P; a finished prefill moves to D; finished decodes leave D."""
        arrived = view.num_arrived
        if arrived > self._cursor:
            self._waiting.extend(view.arrival_order[self._cursor : arrived].tolist())
            self._cursor = arrived
        r = self._prefilling
        if r is not None and (view.done[r] or is_decode(view, r)):
            self._prefilling = None
            self._in_cycle += 1
            if not view.done[r]:
                self._decoding.append(r)
        if self._decoding:
            done = view.done[self._decoding]
            if done.any():
                self._decoding = np.asarray(self._decoding)[~done].tolist()


__all__ = ["DEFAULT_CYCLE_FACTOR", "RAD", "tiling_of"]
