"""Deployed engines' schedulers: vLLM v1, Orca and FasterTransformer.

Each is one readable loop per batch over an FCFS waiting queue and the running
requests in admission order, the way the engines themselves are written. They
share :class:`EngineBase`: the queues, the budgets, and per-request KV
reservations in whole blocks, which never exceed M, so the core never sees an
over-full cache. When a running request needs more KV than is free, the newest
running request not already in the batch is preempted by recompute (its KV is
dropped, it goes back to the *front* of the waiting queue and refills later),
as vLLM and Sarathi-Serve do; if there is none, the request preempts itself.

Batch composition follows seed 001 Sec. 3 (Li/Dai/Peng), which describes the
three schedulers in its own token-budget model; where it and the engine's code
disagree, each class says which it follows. vLLM v1 follows the engine
(``vllm/v1/core/sched/scheduler.py``, ``shared/notes/anchors.md`` Sec. 3.1),
which seed 001 only cites as "vLLM with chunked prefill" (work-conserving).
Seed 001's model ignores memory; the memory rules here are the engines'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsched.heuristics.base import Decision, SchedulerView, check_whole_prompt_fits
from kvsched.heuristics.checks import check_positive
from kvsched.heuristics.infermax import effective_budgets
from kvsched.instances.model import Instance
from kvsched.schedule.search import last_fitting

#: Reserved per request by Orca and FasterTransformer: Llama-2's context length (Vidur's max_tokens).
DEFAULT_MAX_SEQ_LEN = 4096
#: vLLM's default ``max_num_seqs``.
DEFAULT_MAX_NUM_SEQS = 256


def is_decode(view: SchedulerView, r: int) -> bool:
    """Whether request ``r``'s next item is a decode (it has generated and is not refilling)."""
    return bool(view.generated[r] > 0 and not view.refilling[r])


class Reservations:
    """KV reserved per request, in tokens, and the blocks that takes in all.

    Every running request's KV stays within its reservation and the
    reservations fit in the capacity, so the KV held during a batch fits too.
    """

    def __init__(self, n: int, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.tokens = np.zeros(n, dtype=np.int64)
        self.used = 0  # blocks

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def grow(self, r: int, tokens: int) -> bool:
        """Reserve at least ``tokens`` for ``r``; False (and nothing changes) if the blocks are not free."""
        held = int(self.tokens[r])
        need = max(0, self.blocks(tokens) - self.blocks(held))
        if need > self.free:
            return False
        self.used += need
        self.tokens[r] = max(held, tokens)
        return True

    def release(self, r: int) -> None:
        self.used -= self.blocks(int(self.tokens[r]))
        self.tokens[r] = 0

    def grow_leading(self, idx: np.ndarray, tokens: np.ndarray) -> int:
        """:meth:`grow` of ``idx[i]`` to ``tokens[i]``, one after the other, while each succeeds.

        Returns how many succeeded (a prefix: the needs are not negative, so one
        succeeds exactly when the needs up to it fit what was free at the start).
        ``idx`` are distinct.
        """
        held = self.tokens[idx]
        b = self.block_size
        need = tokens - held if b == 1 else -(-tokens // b) - (-(-held // b))
        np.maximum(need, 0, out=need)
        total = np.add.accumulate(need)
        k = int(total.searchsorted(self.capacity - self.used, side="right"))
        if k:
            self.used += int(total[k - 1])
            self.tokens[idx[:k]] = np.maximum(held[:k], tokens[:k])
        return k


@dataclass(slots=True)
class Draft:
    """The batch being built and the budgets it has left."""

    tokens_left: int  # C minus the batch's tokens
    prefill_left: int  # P minus the batch's prefill and refill tokens
    requests: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    members: set[int] = field(default_factory=set)  # requests in the batch
    gone: set[int] = field(default_factory=set)  # requests preempted for this batch

    def room(self, left: int, prefill: bool) -> int:
        """Tokens an item with ``left`` tokens still to process may take now (0: none)."""
        cap = min(self.tokens_left, self.prefill_left) if prefill else self.tokens_left
        return max(0, min(left, cap))

    def add(self, r: int, c: int, prefill: bool) -> None:
        self.requests.append(r)
        self.tokens.append(c)
        self.members.add(r)
        self.tokens_left -= c
        if prefill:
            self.prefill_left -= c

    def add_decodes(self, reqs: list[int]) -> None:
        """:meth:`add` of one decode token for each of ``reqs``."""
        self.requests += reqs
        self.tokens += [1] * len(reqs)
        self.members.update(reqs)
        self.tokens_left -= len(reqs)

    def decision(self) -> Decision | None:
        if not self.requests and not self.evicted:
            return None
        return Decision(self.requests, self.tokens, self.evicted)


class EngineBase:
    """Queues, budgets and reservations shared by the engine policies.

    Subclasses implement :meth:`_compose` (the batch) and :meth:`_reservation`
    (what admission reserves).

    Parameters
    ----------
    name
        Registry name recorded in schedules.
    token_budget
        C: tokens per batch. ``None`` uses the instance's C, else 4096; a
        looser value than the instance's is clamped to it. The instance's P,
        when set, also caps prefill and refill tokens.
    max_running
        Requests holding KV at once; admission stops at it. ``None`` uses the
        instance's limit (unlimited if unset).
    running_param
        The subclass's name for ``max_running`` (in error messages).
    """

    uses_true_output = False

    def __init__(
        self, name: str, *, token_budget: int | None, max_running: int | None, running_param: str
    ) -> None:
        check_positive("token_budget", token_budget)
        check_positive(running_param, max_running)  # named as the subclass's parameter
        self.name = name
        self.token_budget = token_budget
        self.max_running = max_running
        self._budgets: dict[str, int | None] = {}

    def _own_params(self) -> dict[str, Any]:
        return {"token_budget": self.token_budget, "max_running": self.max_running}

    @property
    def params(self) -> Mapping[str, Any]:
        """The parameters, plus the budgets in force once :meth:`reset` has seen an instance."""
        out = self._own_params()
        if self._budgets:
            out["effective"] = dict(self._budgets)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def reset(self, instance: Instance) -> None:
        lim = instance.limits
        self._C, self._P, self._R = effective_budgets(lim, self.token_budget, max_running=self.max_running)
        self._budgets = {"C": self._C, "P": self._P, "max_running": self._R}
        self._capacity_tokens = lim.kv_blocks * lim.block_size
        self._kv = Reservations(len(instance), lim.block_size, lim.kv_blocks)
        self._waiting: deque[int] = deque()  # FCFS; preempted requests re-enter at the front
        self._running: list[int] = []  # admission order: the newest is last
        self._cursor = 0  # arrivals taken so far (a prefix of view.arrival_order)

    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._sync(view)
        draft = Draft(self._C, self._P)
        self._compose(view, draft)
        if not draft.requests and not draft.evicted:
            self._explain_stall(view)
        return draft.decision()

    def _repeat_reserved_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): a decode-only batch repeats
        while its decodes' reservations fit.

        Only the engines whose batch depends on nothing but the queues, the budgets
        and the reservations opt in (``repeat_decodes = EngineBase._repeat_reserved_decodes``);
        a subclass that reads time or its own history (SLAI) does not inherit it.

        Through a run nothing arrives, completes or is preempted, so the queues and
        the budgets stay as they are, and a waiting request that did not fit still
        does not (its reservation is unchanged and the free blocks only shrink). Each
        decode's reservation grows to its KV plus one; the first batch where they no
        longer all fit would preempt, so the run ends before it.
        """
        return self._grow_reserved(view, np.asarray(decision.requests, dtype=np.int64), limit)

    def _continue_reserved_decodes(
        self, view: SchedulerView, requests: np.ndarray, limit: Callable[[], int]
    ) -> int:
        """Runs after a completion or a finished prompt (:class:`~kvsched.heuristics.base.ContinueDecodes`),
        for the engines that opt in to :meth:`_repeat_reserved_decodes` and compose a batch from the
        running requests (admission order), then the waiting queue, with nothing preempted:
        ``continue_decodes = EngineBase._continue_reserved_decodes`` (vLLM v1, Orca).

        :meth:`next_batch` first syncs (arrivals join the queue, finished requests release their
        reservations: idempotent, so done here). With nothing waiting and the running requests
        exactly ``requests`` in admission order (all decoding: the simulator's guarantee), the
        batch is one decode of each, in that order, while C lasts (n <= C) and each decode's
        reservation grows to its KV plus one without preempting; there are no prompts to go first
        (Orca) and no one to admit. Through the run this holds as :meth:`_repeat_reserved_decodes`
        argues, so the run lasts while the grown reservations fit, from its first batch on.
        """
        self._sync(view)
        n = int(requests.size)
        if self._waiting or len(self._running) != n or n > self._C:
            return 0
        if self._running != requests.tolist():
            return 0
        most = limit()
        return self._grow_reserved(view, requests, most) if most else 0

    def _grow_reserved(self, view: SchedulerView, req: np.ndarray, limit: int) -> int:
        """The batches (at most ``limit``) for which the decodes ``req`` keep fitting their reservations
        of KV plus one, taken as if each batch had been decided (the reservations grown to the last)."""
        kv = view.kv[req]  # batch j = 1, 2, ... of the run wants kv + j reserved
        res = self._kv
        held = res.tokens[req]
        bs = res.block_size
        base = int(np.add.reduce(-(-held // bs)))

        def grown(j: int) -> int:
            return int(np.add.reduce(-(-np.maximum(held, kv + j) // bs))) - base

        k = last_fitting(grown, res.free, limit)
        if k:
            res.used += grown(k)
            res.tokens[req] = np.maximum(held, kv + k)
        return k

    # ------------------------------------------------------------ subclasses
    def _compose(self, view: SchedulerView, draft: Draft) -> None:
        raise NotImplementedError

    def _reservation(self, view: SchedulerView, r: int, c: int) -> int:
        """KV tokens a waiting request reserves when it is admitted with a first item of ``c`` tokens."""
        raise NotImplementedError

    # ------------------------------------------------------------ shared steps
    def _sync(self, view: SchedulerView) -> None:
        """New arrivals join the waiting queue; finished requests release their reservations."""
        arrived = view.num_arrived
        if arrived > self._cursor:
            self._waiting.extend(view.arrival_order[self._cursor : arrived].tolist())
            self._cursor = arrived
        if self._running:
            done = view.done[self._running]
            if done.any():
                for r in np.asarray(self._running)[done].tolist():
                    self._kv.release(r)
                self._running = [r for r, d in zip(self._running, done.tolist(), strict=True) if not d]

    def _admit(self, view: SchedulerView, draft: Draft, *, whole: bool) -> None:
        """Admit waiting requests in FCFS order while the budgets, ``max_running`` and memory allow.

        The first one that does not fit stops admission (head-of-line, as the
        engines do); waiting requests never preempt running ones. With
        ``whole``, a prompt (or refill) must fit the batch in one item.
        """
        while self._waiting and (self._R is None or len(self._running) < self._R):
            r = self._waiting[0]
            if r in draft.gone:
                break  # preempted for this very batch: it cannot also run in it
            left = int(view.unprocessed(r))
            cap = self._max_chunk()
            c = draft.room(left if cap is None else min(left, cap), prefill=True)
            if c < 1 or (whole and c < left):
                break
            if not self._kv.grow(r, self._reservation(view, r, c)):
                break
            self._waiting.popleft()
            self._running.append(r)
            draft.add(r, c, prefill=True)

    def _make_room(self, view: SchedulerView, draft: Draft, r: int, c: int) -> bool:
        """Grow running ``r``'s reservation to hold ``c`` more tokens, preempting the newest if needed.

        Returns False when ``r`` itself had to be preempted (no other running
        request outside the batch was left to preempt).
        """
        want = int(view.kv[r]) + c
        while not self._kv.grow(r, want):
            victim = next((v for v in reversed(self._running) if v != r and v not in draft.members), r)
            self._preempt(draft, victim)
            if victim == r:
                return False
        return True

    def _preempt(self, draft: Draft, r: int) -> None:
        """Preemption by recompute: drop ``r``'s KV and put it at the front of the waiting queue."""
        self._running.remove(r)
        self._kv.release(r)
        draft.evicted.append(r)
        draft.gone.add(r)
        self._waiting.appendleft(r)

    def _decodes(self, view: SchedulerView, draft: Draft) -> None:
        """One decode for every running request in decode phase, oldest first, while the budget lasts."""
        for r in list(self._running):
            if draft.tokens_left < 1:
                break
            if r in draft.members or r in draft.gone or not is_decode(view, r):
                continue
            if self._make_room(view, draft, r, 1):
                draft.add(r, 1, prefill=False)

    def _explain_stall(self, view: SchedulerView) -> None:
        """Fail clearly when a whole-prompt policy can never run the head of the queue."""
        if self._running or not self._waiting or not self._whole_prompts():
            return
        check_whole_prompt_fits(self.name, view, self._waiting[0], self._C, self._P)

    def _whole_prompts(self) -> bool:
        return False

    def _max_chunk(self) -> int | None:
        """The most prompt or refill tokens one item may take (``None``: no cap beyond the budgets)."""
        return None

    def _max_reservation(self, view: SchedulerView, r: int, max_seq_len: int | None) -> int:
        """Orca's and FasterTransformer's admission reservation: the max sequence length.

        At least the prompt (or refill) S; at most the whole cache. ``None``
        reserves S only and lets decodes grow it block by block.
        """
        known = int(view.unprocessed(r))
        if max_seq_len is None:
            return known
        return max(known, min(max_seq_len, self._capacity_tokens))


class VllmV1(EngineBase):
    """vLLM v1's scheduler with chunked prefill on (``vllm/v1/core/sched/scheduler.py``, FCFS policy).

    Per batch, with a token budget C (``max_num_batched_tokens``):

    1. **Running** requests, in admission order: each takes
       ``min(S - m, budget left, long_prefill_threshold)`` tokens, so a
       running prefill is chunked and a decode takes 1. Its KV grows by what
       it processes (vLLM allocates slots for exactly the tokens computed);
       when the blocks are not free, the newest running request is preempted
       by recompute and re-queued at the front, until the request fits or is
       itself preempted, which ends this step.
    2. **Waiting** requests, FCFS, only if nothing was preempted in this step
       and while fewer than ``max_num_seqs`` run: each gets a chunk of its
       prompt (or refill) within the budget left. The first that does not fit
       in memory stops admission; waiting requests never preempt.

    vLLM has no prefill budget; the instance's P, when set, still caps prefill
    and refill tokens. Prefix caching, speculative decoding and the
    ``max_model_len`` cap are not modelled. Seed 001 Sec. 3 calls this
    scheduler work-conserving, which holds while ``max_num_seqs`` and memory
    do not bind.

    Parameters
    ----------
    token_budget
        ``max_num_batched_tokens`` (see :class:`EngineBase`; 4096 by default, as
        every policy here, rather than vLLM's usage-dependent default).
    max_num_seqs
        Requests running at once (default 256, vLLM's default); the instance's
        ``max_running`` is never exceeded.
    long_prefill_threshold
        ``long_prefill_token_threshold``: the most tokens a prefill or refill
        chunk may take per step (``None``: off, vLLM's default).
    """

    repeat_decodes = EngineBase._repeat_reserved_decodes
    continue_decodes = EngineBase._continue_reserved_decodes

    def __init__(
        self,
        name: str = "vllm-v1",
        *,
        token_budget: int | None = None,
        max_num_seqs: int | None = DEFAULT_MAX_NUM_SEQS,
        long_prefill_threshold: int | None = None,
    ) -> None:
        super().__init__(
            name, token_budget=token_budget, max_running=max_num_seqs, running_param="max_num_seqs"
        )
        check_positive("long_prefill_threshold", long_prefill_threshold)
        self.long_prefill_threshold = long_prefill_threshold

    def _own_params(self) -> dict[str, Any]:
        return {
            "token_budget": self.token_budget,
            "max_num_seqs": self.max_running,
            "long_prefill_threshold": self.long_prefill_threshold,
        }

    def _max_chunk(self) -> int | None:
        return self.long_prefill_threshold

    def _chunk(self, view: SchedulerView, draft: Draft, r: int) -> tuple[int, bool]:
        """Tokens running ``r`` takes this step, and whether they are prefill or refill tokens."""
        if is_decode(view, r):
            return draft.room(1, prefill=False), False
        left = int(view.unprocessed(r))
        if self.long_prefill_threshold is not None:
            left = min(left, self.long_prefill_threshold)
        return draft.room(left, prefill=True), True

    def _compose(self, view: SchedulerView, draft: Draft) -> None:
        # Step 1: running requests first. Preemptions pop the tail, which is
        # never before index i, so the index stays valid.
        i = 0
        while i < len(self._running) and draft.tokens_left > 0:
            r = self._running[i]
            c, prefill = self._chunk(view, draft, r)
            if c < 1:  # only the prefill budget P can leave a running item nothing
                i += 1
                continue
            if not self._make_room(view, draft, r, c):
                break  # it preempted itself: nothing more is scheduled this step
            draft.add(r, c, prefill)
            i += 1
        # Step 2: waiting requests, unless this step preempted.
        if not draft.evicted:
            self._admit(view, draft, whole=False)

    def _reservation(self, view: SchedulerView, r: int, c: int) -> int:
        return int(view.kv[r]) + c  # slots for the tokens computed now, no more


class Orca(EngineBase):
    """Orca as seed 001 Sec. 3 describes it: prefill-prioritised iteration-level batching with mixing.

    Per batch: every prefill-phase request first, FCFS (prompts already
    started, then waiting ones), each taking its whole prompt (x_i = p_i);
    only then one decode per running request, FCFS, until the token budget
    C is full. Seed 001 and the engine differ:

    * Seed 001 gives Orca a token budget b; Orca itself has none (only a max
      batch size). The paper is followed: C is the token budget.
    * With ``chunk_prefill`` (default) the prompt that meets the budget is
      split so that the batch is exactly full. Seed 001 counts Orca as
      work-conserving, which needs that split (``shared/notes/001.md`` P4);
      the real Orca runs whole prompts (``chunk_prefill=False``).
    * Seed 001 ignores memory. Admission here follows Orca (and Vidur's
      model of it): each request reserves the maximum sequence length at
      admission, so it never needs memory again unless its I + O - 1 exceeds
      that; then it grows block by block and, if memory is short, the newest
      running request is preempted by recompute (the real Orca would stop the
      request at its max length instead).

    Parameters
    ----------
    token_budget, max_batch_size
        C and the most requests running at once (``max_running``, see
        :class:`EngineBase`).
    max_seq_len
        Tokens reserved per request at admission (at least its prompt or
        refill, at most M); default 4096, Llama-2's context. ``None``
        reserves the prompt only and grows by decodes.
    chunk_prefill
        Split the prompt that meets the token budget.
    """

    repeat_decodes = EngineBase._repeat_reserved_decodes
    continue_decodes = EngineBase._continue_reserved_decodes

    def __init__(
        self,
        name: str = "orca",
        *,
        token_budget: int | None = None,
        max_batch_size: int | None = None,
        max_seq_len: int | None = DEFAULT_MAX_SEQ_LEN,
        chunk_prefill: bool = True,
    ) -> None:
        super().__init__(
            name, token_budget=token_budget, max_running=max_batch_size, running_param="max_batch_size"
        )
        check_positive("max_seq_len", max_seq_len)
        if not isinstance(chunk_prefill, bool):
            raise ValueError(f"chunk_prefill must be true or false; got {chunk_prefill!r}")
        self.max_seq_len = max_seq_len
        self.chunk_prefill = chunk_prefill

    def _own_params(self) -> dict[str, Any]:
        return {
            "token_budget": self.token_budget,
            "max_batch_size": self.max_running,
            "max_seq_len": self.max_seq_len,
            "chunk_prefill": self.chunk_prefill,
        }

    def _whole_prompts(self) -> bool:
        return not self.chunk_prefill

    def _compose(self, view: SchedulerView, draft: Draft) -> None:
        # Prompts first: those already started (only with chunk_prefill), oldest first ...
        for r in list(self._running):
            if is_decode(view, r):
                continue
            c = draft.room(int(view.unprocessed(r)), prefill=True)
            if c < 1:
                break
            if self._make_room(view, draft, r, c):  # a no-op: its prompt was reserved at admission
                draft.add(r, c, prefill=True)
        # ... then new ones, FCFS, while their reservations fit ...
        self._admit(view, draft, whole=not self.chunk_prefill)
        # ... and only then decodes, until the batch is full.
        self._decodes(view, draft)

    def _reservation(self, view: SchedulerView, r: int, c: int) -> int:
        return self._max_reservation(view, r, self.max_seq_len)


class FasterTransformer(EngineBase):
    """FasterTransformer as seed 001 Sec. 3 describes it: request-level batching, decode first.

    While any running request decodes, the batch holds decodes only, FCFS, up
    to the token budget C. Only when none decodes does a new cohort start: a
    prefill-only batch of whole prompts (and refills), FCFS, while they fit in
    C (and P), ``max_batch_size`` and memory. New requests therefore wait for
    the whole cohort to finish, which is what makes it unstable under load
    (seed 001 Sec. 3, Fig. 5).

    Seed 001 ignores memory; each admitted request reserves the maximum
    sequence length, as FasterTransformer (and Vidur's model of it) allocates
    for the batch up front. A request whose I + O - 1 exceeds that grows block
    by block and preempts the newest running request by recompute when memory
    is short; the preempted request rejoins the queue's front and waits for
    the next cohort. Vidur also frees memory only when the whole cohort
    completes; here a finished request's memory is freed at once, which makes
    no difference because nothing is admitted before the cohort is done.

    Parameters
    ----------
    token_budget, max_batch_size
        C and the most requests in a cohort (see :class:`EngineBase`).
    max_seq_len
        Tokens reserved per request at admission (see :class:`Orca`).
    """

    repeat_decodes = EngineBase._repeat_reserved_decodes

    def __init__(
        self,
        name: str = "fastertransformer",
        *,
        token_budget: int | None = None,
        max_batch_size: int | None = None,
        max_seq_len: int | None = DEFAULT_MAX_SEQ_LEN,
    ) -> None:
        super().__init__(
            name, token_budget=token_budget, max_running=max_batch_size, running_param="max_batch_size"
        )
        check_positive("max_seq_len", max_seq_len)
        self.max_seq_len = max_seq_len

    def _own_params(self) -> dict[str, Any]:
        return {
            "token_budget": self.token_budget,
            "max_batch_size": self.max_running,
            "max_seq_len": self.max_seq_len,
        }

    def _whole_prompts(self) -> bool:
        return True

    def _compose(self, view: SchedulerView, draft: Draft) -> None:
        if any(is_decode(view, r) for r in self._running):
            self._decodes(view, draft)  # the cohort decodes; newcomers wait
        else:
            self._admit(view, draft, whole=True)  # nothing decodes: start the next cohort

    def _reservation(self, view: SchedulerView, r: int, c: int) -> int:
        return self._max_reservation(view, r, self.max_seq_len)


__all__ = [
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_MAX_SEQ_LEN",
    "Draft",
    "FasterTransformer",
    "Orca",
    "Reservations",
    "VllmV1",
    "check_positive",
    "is_decode",
]
