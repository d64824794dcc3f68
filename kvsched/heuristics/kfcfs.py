"""Work-conserving K-FCFS (seed 001 Sec. 2.3) with a pluggable order.

Seed 001's Theorem 1 proves that every *work-conserving K-FCFS* scheduler is
throughput-optimal under its token-load time model: when loading tokens of
phase j (prefill or decode), only the K_j oldest requests of that phase may
contribute, any rule may choose among them (FCFS, smallest remaining tokens
first, ...), and a batch must be full (the token budget) whenever the eligible
requests have that many tokens to give (Eq. 2.6). :class:`KFCFS` is that
family with the rule as a parameter; memory, which the paper ignores, is
handled by preemption in the rule's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from kvsched.costmodel.small import nonzero
from kvsched.errors import KvschedError
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_choice, check_positive
from kvsched.heuristics.infermax import effective_budgets
from kvsched.instances.model import Instance

Order = Literal["fcfs", "shortest-prompt", "shortest-remaining"]
Lengths = Literal["true", "predicted"]


class KFCFS:
    """Seed 001's work-conserving K-FCFS scheduler.

    Per batch:

    1. **Eligible**: the ``k_prefill`` earliest-arrived requests with prompt
       (or refill) tokens left, and the ``k_decode`` earliest-arrived requests
       in decode phase (``None``: all of them).
    2. **Rank** the eligible by ``order``, ties by arrival: ``"fcfs"``
       (arrival), ``"shortest-prompt"`` (I) or ``"shortest-remaining"``
       (tokens left to process, I + O - 1 - m, with O the true output or the
       prediction, see ``lengths``).
    3. **Fill** in rank order: a decode takes its one token, a prompt or refill
       everything the budget leaves (the one that meets the budget is split).
       Without memory limits the batch therefore holds min(C, tokens the
       eligible have to give): seed 001's work conservation.

    Memory (not in seed 001): an item's KV grows by the tokens it processes.
    When the blocks are not free, the candidate preempts the running requests
    ranked below it by recompute, lowest first; if that is not enough it is
    skipped, and a skipped request that held no KV yet closes admission for
    the rest of the batch (head-of-line, as FCFS engines do). If nothing at all
    can run, the top-ranked request runs alone after every other is preempted,
    which always fits because I + O - 1 <= M. The instance's P and
    ``max_running``, when set, are obeyed (new requests are not admitted
    beyond ``max_running``).

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    order
        The rule within the eligible set.
    lengths
        Where ``"shortest-remaining"`` gets output lengths: ``"true"`` (the
        instance's O: hindsight, so the policy declares ``uses_true_output``)
        or ``"predicted"`` (``predicted_output``, at least G + 1 once a request
        has outlived its prediction; every request must carry one).
    k_prefill, k_decode
        K_p and K_d.
    token_budget
        The token budget b (C); ``None`` uses the instance's C, else 4096; a
        looser value than the instance's is clamped to it.
    """

    def __init__(
        self,
        name: str = "kfcfs",
        *,
        order: Order = "fcfs",
        lengths: Lengths = "true",
        k_prefill: int | None = None,
        k_decode: int | None = None,
        token_budget: int | None = None,
    ) -> None:
        check_choice("order", order, Order)
        check_choice("lengths", lengths, Lengths)
        check_positive("k_prefill", k_prefill)
        check_positive("k_decode", k_decode)
        check_positive("token_budget", token_budget)
        self.name = name
        self.order = order
        self.lengths = lengths
        self.k_prefill = k_prefill
        self.k_decode = k_decode
        self.token_budget = token_budget
        # Only shortest-remaining reads output lengths, and only "true" ones are hindsight.
        self.uses_true_output = order == "shortest-remaining" and lengths == "true"
        self._budgets: dict[str, int | None] = {}

    @property
    def params(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {
            "order": self.order,
            "lengths": self.lengths,
            "k_prefill": self.k_prefill,
            "k_decode": self.k_decode,
            "token_budget": self.token_budget,
        }
        if self._budgets:
            out["effective"] = dict(self._budgets)
        return out

    def __repr__(self) -> str:
        return f"KFCFS({self.name!r}, order={self.order!r})"

    def reset(self, instance: Instance) -> None:
        if (
            self.order == "shortest-remaining"
            and self.lengths == "predicted"
            and any(r.predicted_output is None for r in instance.requests)
        ):
            raise KvschedError(
                f"policy {self.name!r} ranks by predicted remaining tokens, but some requests of "
                f"{instance.name!r} carry no predicted_output"
            )
        lim = instance.limits
        self._C, self._P, self._R = effective_budgets(lim, self.token_budget)
        self._budgets = {"C": self._C, "P": self._P, "max_running": self._R}
        self._block = lim.block_size

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._block)

    def _key(self, view: SchedulerView, idx: np.ndarray) -> np.ndarray:
        """The ranking key of each request (smaller first); ``idx`` is in arrival order."""
        if self.order == "fcfs":
            return np.arange(idx.size)
        if self.order == "shortest-prompt":
            return view.prompt[idx]
        if self.lengths == "true":
            out = view.output[idx]
        else:
            assert view.predicted_output is not None
            # A request that outlived its prediction has at least one more token to make.
            out = np.maximum(view.predicted_output[idx], view.generated[idx] + 1)
        return view.prompt[idx] + out - 1 - view.kv[idx]

    def next_batch(self, view: SchedulerView) -> Decision | None:
        active = view.active()  # arrival order
        if active.size == 0:
            return None
        decode = (view.generated[active] > 0) & ~view.refilling[active]
        eligible = np.zeros(active.size, dtype=bool)
        eligible[np.flatnonzero(~decode)[: self.k_prefill]] = True  # the K_p oldest in prefill phase
        eligible[np.flatnonzero(decode)[: self.k_decode]] = True  # the K_d oldest in decode phase
        ranking = np.argsort(self._key(view, active), kind="stable")  # ties keep arrival order
        ranked = active[ranking].tolist()
        is_eligible = eligible[ranking].tolist()
        is_decode = decode[ranking].tolist()
        kv = view.kv

        requests: list[int] = []
        tokens: list[int] = []
        evicted: list[int] = []
        gone: set[int] = set()
        tokens_left, prefill_left = self._C, self._P
        free, running = view.kv_blocks_free, view.num_running
        admission_open = True
        tail = len(ranked) - 1  # victims come from the bottom of the ranking, never above a candidate
        # Where the loop can stop early: past the last eligible decode once the prefill budget is
        # spent, and past the last eligible decode or KV holder once admission has closed.
        eligible_decodes = np.flatnonzero((eligible & decode)[ranking])
        last_decode = int(eligible_decodes[-1]) if eligible_decodes.size else -1
        eligible_holders = np.flatnonzero((eligible & (decode | (kv[active] > 0)))[ranking])
        last_holder = int(eligible_holders[-1]) if eligible_holders.size else -1
        for i, r in enumerate(ranked):
            if tokens_left < 1 or (prefill_left < 1 and i > last_decode):
                break
            if not admission_open and i > last_holder:
                break
            if not is_eligible[i] or r in gone:
                continue
            m = int(kv[r])
            holds = m > 0
            if not holds and (not admission_open or (self._R is not None and running >= self._R)):
                continue
            if is_decode[i]:
                c = 1
            elif prefill_left < 1:
                continue  # the prefill budget P is spent; decodes may still join
            else:
                c = min(int(view.unprocessed(r)), tokens_left, prefill_left)
            if c < 1:
                continue
            need = self._blocks(m + c) - self._blocks(m)
            while need > free and tail > i:
                v = ranked[tail]
                tail -= 1
                if kv[v] > 0:  # ranked below the candidate, so not in the batch yet
                    evicted.append(v)
                    gone.add(v)
                    free += self._blocks(int(kv[v]))
                    running -= 1
            if need > free:
                admission_open = admission_open and holds
                continue
            free -= need
            running += 0 if holds else 1
            requests.append(r)
            tokens.append(c)
            tokens_left -= c
            if not is_decode[i]:
                prefill_left -= c
        if not requests:
            return self._alone(view, ranked, is_eligible, is_decode)
        return Decision(requests, tokens, evicted)

    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode-only batch repeats
        as long as the core allows it.

        Through a run nothing arrives, completes or changes phase, so the eligible
        sets, the budgets and every reason a prefill stayed out hold (the free blocks
        only shrink, and no KV holder ranks below a request that failed memory, or it
        would have been evicted). The ranking keeps the decodes' order: FCFS and
        prompt keys are fixed, and true remaining tokens fall by one for every
        decode. The decodes' memory is the core's KV-capacity limit, which ``limit``
        already respects. Predicted remaining tokens can tie as predictions run out
        (and ties reorder), so that ranking is stepped batch by batch.
        """
        if self.order == "shortest-remaining" and self.lengths == "predicted":
            return 0
        return limit

    def continue_decodes(self, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]) -> int:
        """Runs after a completion or a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`).

        :meth:`next_batch` keeps no state between calls, so its decision is read off the
        view. When the active requests are exactly ``requests`` (all decoding, as the
        simulator guarantees), every one is eligible unless K_d < n, and the batch is
        one decode of each in rank order while the budget C lasts (n <= C) and memory
        allows: the run's decodes fit the KV capacity (``limit()`` respects it), so no
        decode lacks blocks and nothing is evicted. So the decision is ``requests``
        exactly when they are in rank order, and then it stays so through the run for
        the reasons :meth:`repeat_decodes` gives (predicted remaining tokens: stepped).
        """
        if self.order == "shortest-remaining" and self.lengths == "predicted":
            return 0
        n = int(requests.size)
        if n > self._C or (self.k_decode is not None and n > self.k_decode):
            return 0
        active = view.active()  # arrival order; ``requests`` are active, so equal sizes mean equal sets
        if active.size != n:
            return 0
        if self.order != "fcfs":
            active = active[np.argsort(self._key(view, active), kind="stable")]  # next_batch's ranking
        if nonzero(active != requests):
            return 0
        return limit()

    def _alone(
        self, view: SchedulerView, ranked: list[int], is_eligible: list[bool], is_decode: list[bool]
    ) -> Decision:
        """Liveness: the top-ranked eligible request alone, every other request's KV dropped."""
        i = is_eligible.index(True)
        r = ranked[i]
        c = 1 if is_decode[i] else min(int(view.unprocessed(r)), self._C, self._P)
        others = [v for v in ranked if v != r and view.kv[v] > 0]
        return Decision([r], [c], others)


__all__ = ["KFCFS", "Lengths", "Order"]
