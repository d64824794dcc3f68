"""WAIT (seed 002 §4, Algorithm 1) and the stage-gated selection it shares with Nested WAIT.

See :mod:`kvsched.heuristics.wait` for the algorithm and what differs from the paper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvsched.errors import InputError
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_choice, check_eq1_options, check_non_negative_number
from kvsched.heuristics.fluid import instance_types, kv_mass
from kvsched.heuristics.wait.thresholds import ThresholdMode, TypeKey, eq1_of, wait_thresholds
from kvsched.instances.model import Instance
from kvsched.schedule.search import last_fitting


class StageGated:
    """What WAIT and Nested WAIT share: per-group stage-aligned selection and the LIFO safety net.

    A subclass gives every active request a *group* (a type, or a segment) and
    says which groups are eligible; a group advances ``min(n_g, count)`` requests
    from each of its stages.
    """

    name: str
    uses_true_output: bool
    thresholds_: np.ndarray

    def _setup(self, instance: Instance) -> None:
        lim = instance.limits
        caps = [c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None]
        cap = min(caps) if caps else None
        self._prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
        self._chunk = cap  # the longest prefill or refill chunk
        self._limits = lim
        self._block = lim.block_size
        self._capacity = lim.kv_blocks
        n = len(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        self._rank = np.empty(n, dtype=np.int64)
        self._rank[np.argsort(arrival, kind="stable")] = np.arange(n)
        self._stamp = np.full(n, -1, dtype=np.int64)  # batch of the last (re)admission
        self._batches = 0
        self.evictions = 0

    # subclass hooks ------------------------------------------------------
    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        """Whether each request is in its group's entry queue."""
        raise NotImplementedError

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------------
    def next_batch(self, view: SchedulerView) -> Decision | None:
        act = view.active()
        if act.size == 0:
            return None
        stage = view.generated[act]
        group = self._groups(act, stage)
        # Drain rule: every request is in and the thresholds are dropped, so every group with an
        # active request is eligible: all are kept.
        if view.next_arrival() is not None:
            entry = np.bincount(group[self._entry(group, stage)], minlength=self.thresholds_.size)
            keep = self._eligible(entry)[group]
            if not keep.any():
                return None
            act, stage, group = act[keep], stage[keep], group[keep]
        self._kept = (act, stage, group)  # what repeat_decodes checks a run against
        waits = view.kv[act] == 0
        # Within a (group, stage): running requests first, then by arrival. One integer key when it
        # cannot overflow (ranks are distinct, so any sort of it is lexsort's stable order).
        n = self._rank.size
        span = int(stage.max()) + 1
        if (int(group.max()) + 1) * span * 2 * n < 2**62:
            key = ((group * span + stage) * 2 + waits) * n + self._rank[act]
            order = np.argsort(key)
            act, cell = act[order], key[order] // (2 * n)  # cell: the (group, stage)
        else:
            order = np.lexsort((self._rank[act], waits, stage, group))
            act, cell = act[order], group[order] * span + stage[order]
        new = np.empty(act.size, dtype=bool)
        new[0] = True
        np.not_equal(cell[1:], cell[:-1], out=new[1:])
        if new.all() and self.thresholds_.min() >= 1:  # one request per (group, stage): all selected
            sel = act
        else:
            index = np.arange(act.size)
            within = index - np.maximum.accumulate(np.where(new, index, 0))
            sel = act[within < self.thresholds_[cell // span]]
        return self._fit(view, sel)

    def _fit(self, view: SchedulerView, sel: np.ndarray) -> Decision | None:
        """Cut ``sel`` LIFO until the batch fits M, C, P and max_running (evicting for memory)."""
        b = self._block
        kv = view.kv
        tok = np.asarray(view.unprocessed(sel), dtype=np.int64)
        if self._chunk is not None:
            tok = np.minimum(tok, self._chunk)  # a prompt or refill over C or P goes in chunks
        lim = self._limits
        inf = float("inf")
        c_cap = lim.max_batch_tokens if lim.max_batch_tokens is not None else inf
        p_cap = lim.max_prefill_tokens if lim.max_prefill_tokens is not None else inf
        r_cap = lim.max_running if lim.max_running is not None else inf
        holds = kv[sel] > 0
        num_new = sel.size - int(np.count_nonzero(holds))
        tokens = int(tok.sum())
        if p_cap < inf:  # prefill and refill items: not holding KV, or holding a partial prompt/refill
            fresh = ~holds | (view.generated[sel] == 0) | view.refilling[sel]
            prefill = int(tok[fresh].sum())
        else:
            fresh, prefill = None, 0  # no prefill budget: nothing reads them
        # The extra blocks of the batch's items, and the totals from the core's running counts.
        during = tok if b == 1 else -(-(kv[sel] + tok) // b) - (-(-kv[sel] // b))
        blocks = view.kv_blocks_used + (tokens if b == 1 else int(during.sum()))
        running = view.num_running + num_new
        cap = self._capacity
        alive = np.ones(sel.size, dtype=bool)

        # LIFO, first pass: items not holding KV (all prefill or refill) by arrival, latest first,
        # dropped while the batch breaks a limit.
        if tokens > c_cap or prefill > p_cap or running > r_cap or blocks > cap:
            new = np.flatnonzero(~holds)
            alive[new] = False
            tokens, prefill, blocks, running = self._keep_earliest(
                sel, new, tok, during, alive, (tokens, prefill, blocks, running), (c_cap, p_cap, cap, r_cap)
            )
        self._peak = blocks  # the most blocks the second pass sees (it only drops)
        evicted: list[int] = []
        if tokens > c_cap or prefill > p_cap or blocks > cap:
            # Second pass: running requests by admission, latest first.
            in_batch = dict(zip(sel.tolist(), range(sel.size), strict=True))
            running_all = np.flatnonzero(kv > 0)
            victims = running_all[np.argsort(-self._stamp[running_all], kind="stable")].tolist()
            for r in victims:
                if not (tokens > c_cap or prefill > p_cap or blocks > cap):
                    break
                i = in_batch.get(r)
                memory = blocks > cap  # evict (LIFO by admission); else a budget: pause it
                if i is not None and alive[i]:
                    alive[i] = False
                    blocks -= int(during[i])
                    tokens -= int(tok[i])
                    if fresh is not None and fresh[i]:
                        prefill -= int(tok[i])
                if memory:
                    evicted.append(r)
                    blocks -= int(-(-kv[r] // b))
                    running -= 1
        sel, tok = sel[alive], tok[alive]
        if sel.size == 0:
            return None
        admitted = sel[kv[sel] == 0]
        self._stamp[admitted] = self._batches
        self._batches += 1
        self.evictions += len(evicted)
        return Decision(sel.tolist(), tok.tolist(), evicted)

    def _keep_earliest(
        self,
        sel: np.ndarray,
        new: np.ndarray,
        tok: np.ndarray,
        during: np.ndarray,
        alive: np.ndarray,
        totals: tuple[int, int, int, int],
        caps: tuple[float, float, float, float],
    ) -> tuple[int, int, int, int]:
        """The first pass of the cut: which of the items ``new`` (not holding KV) stay, marked in ``alive``.

        Dropping the latest-arrived first while the batch breaks a limit keeps the
        longest earliest-first prefix that fits: every item adds to every total (its
        tokens, prefill tokens and blocks, one running request), so the totals fall
        with each drop and the first fitting point is the longest fitting prefix. The
        totals are (tokens, prefill, blocks, running) with every item, the limits in
        the same order; returns the totals after the cut.
        """
        c_cap, p_cap, cap, r_cap = caps
        tokens, prefill, blocks, running = totals
        gone_tok = int(tok[new].sum())
        tokens -= gone_tok
        prefill -= gone_tok  # items not holding KV are all prefill or refill
        blocks -= gone_tok if during is tok else int(during[new].sum())
        running -= new.size
        if tokens > c_cap or prefill > p_cap or blocks > cap or running > r_cap:
            return tokens, prefill, blocks, running  # not even the earliest stays
        # The prefix is usually a prompt or two: find it one earliest at a time before sorting all.
        rank = self._rank[sel[new]]
        for _ in range(min(new.size, 4)):
            i = int(rank.argmin())
            item = int(new[i])
            t, d = int(tok[item]), int(during[item])
            if tokens + t > c_cap or prefill + t > p_cap or blocks + d > cap or running + 1 > r_cap:
                return tokens, prefill, blocks, running
            alive[item] = True
            tokens, prefill, blocks, running = tokens + t, prefill + t, blocks + d, running + 1
            rank[i] = self._rank.size  # taken: past every rank
        if rank.min() == self._rank.size:
            return tokens, prefill, blocks, running  # every one stays
        rest = new[rank < self._rank.size]
        order = rest[np.argsort(rank[rank < self._rank.size])]  # the rest, earliest first
        add_tok = np.cumsum(tok[order])
        add_blocks = add_tok if during is tok else np.cumsum(during[order])
        fits = (tokens + add_tok <= c_cap) & (prefill + add_tok <= p_cap) & (blocks + add_blocks <= cap)
        fits &= running + np.arange(1, order.size + 1) <= r_cap
        k = int(np.argmin(fits)) if not fits[-1] else order.size  # the longest fitting prefix
        if k:
            alive[order[:k]] = True
            tokens, prefill = tokens + int(add_tok[k - 1]), prefill + int(add_tok[k - 1])
            blocks, running = blocks + int(add_blocks[k - 1]), running + k
        return tokens, prefill, blocks, running

    # ------------------------------------------------------------ coalesced runs
    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): how long a decode-only batch repeats.

        Why the decision stays the same (call 0 made ``decision``; call j is the j-th
        repeat). Through the run nothing arrives or completes, so the active set, the
        drain rule and every request outside the batch (waiting, frozen, or selected
        and then cut) stay as they are; each batch member is a held decode whose stage
        grows by one per call. Hence:

        * the stage-0 entry queues, so the eligible groups, do not change (a decode is
          never at stage 0; Nested WAIT adds its own segment condition);
        * the selection (the first ``n_g`` of each (group, stage), running first, then
          by arrival) is the same as long as no batch member ever shares a (group,
          stage) with a kept request outside the batch: then every stage of a member
          holds only members (all of them were selected at call 0, and they move
          together, keeping their order) and every other stage only the same outsiders.
          A member of stage ``s`` meets an outsider of the same group at stage
          ``s' >= s`` at call ``s' - s``: the run stops before (or is empty when it
          met one at call 0);
        * the LIFO cut is the same while the batch fits: tokens, prefill tokens and
          running requests are fixed, the blocks only grow, so the first pass drops
          every new item again (it dropped all of them at call 0: the batch is
          decode-only), and the second pass pauses the same running items as long as
          the blocks it starts from (``_peak`` at call 0, plus the members' growth)
          stay within M; once they do not, it would evict, so the run stops before.

        A smaller answer than the longest such stretch is safe (see the contract).
        """
        req = np.asarray(decision.requests, dtype=np.int64)
        k = self._steady_limit(view, req, limit)
        self._batches += k  # every repeat counts as a batch (admission stamps)
        return k

    def _steady_limit(self, view: SchedulerView, req: np.ndarray, limit: int) -> int:
        """The longest run (at most ``limit``) through which selection and cut stay the same."""
        act, stage, group = self._kept
        member = np.zeros(view.n, dtype=bool)
        member[req] = True
        inside = member[act]
        limit = self._apart(group[inside], stage[inside], group[~inside], stage[~inside], limit)
        return self._fitting(view, req, limit) if limit > 0 else 0

    @staticmethod
    def _apart(
        d_group: np.ndarray, d_stage: np.ndarray, f_group: np.ndarray, f_stage: np.ndarray, limit: int
    ) -> int:
        """The most calls (at most ``limit``) before a member (call-0 group and stage ``d_*``), moving up
        one stage a call, shares a (group, stage) with an outsider (``f_*``, fixed); 0 if one does at call 0."""
        if not f_stage.size:
            return limit
        width = int(max(d_stage.max(), f_stage.max())) + 2  # above every stage compared
        d_key = d_group * width + d_stage
        f_key = np.sort(f_group * width + f_stage)
        at = np.searchsorted(f_key, d_key, side="left")
        nxt = f_key[np.minimum(at, f_key.size - 1)]
        same = (at < f_key.size) & (nxt < (d_group + 1) * width)  # an outsider of the same group above
        if same.any():
            limit = min(limit, int((nxt[same] - d_key[same]).min()) - 1)
        return max(limit, 0)

    def _fitting(self, view: SchedulerView, req: np.ndarray, limit: int) -> int:
        """The most calls (at most ``limit``) through which the cut's second pass starts within M."""
        free = self._capacity - self._peak
        kv = view.kv[req]
        if self._block == 1:
            return max(0, min(limit, free // int(req.size)))
        b = self._block
        base = int((-(-kv // b)).sum())
        return last_fitting(lambda j: int((-(-(kv + j) // b)).sum()) - base, free, limit)


class WAIT(StageGated):
    """WAIT: seed 002 §4, Algorithm 1 (known output lengths; see the module docstring).

    Parameters
    ----------
    name
        Registry name.
    types
        ``"io"``: one type per distinct (I, O); ``"cls"``: one per ``cls`` value.
    thresholds
        ``"fluid"``, ``"paper"`` or ``"code"`` (module docstring).
    given
        Explicit per-type thresholds (types in :func:`~kvsched.heuristics.fluid.instance_types` order).
    rates
        Per-type arrival rates (same order); estimated from the instance when ``None``.
    margin
        Fluid mode: thresholds ``ceil(lambda_j Delta T* (1 + margin))``; > 0 gives Theorem 1's strict regime.
    batch_size
        ``B`` for the paper/code formulas (default: the instance's ``max_running``).
    d0, d1
        Eq. (1)'s coefficients; from the instance's time model when ``None``.
    """

    uses_true_output = True

    def __init__(
        self,
        name: str = "wait",
        *,
        types: TypeKey = "io",
        thresholds: ThresholdMode = "fluid",
        given: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        margin: float = 0.0,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        check_choice("types", types, TypeKey)
        check_choice("thresholds", thresholds, ThresholdMode)
        check_non_negative_number("margin", margin)  # NaN passed "< 0" and stalled the policy
        check_eq1_options(batch_size, d0, d1)
        self.name = name
        self.types = types
        self.thresholds = thresholds
        self.given = tuple(int(v) for v in given) if given is not None else None
        self.rates = tuple(float(v) for v in rates) if rates is not None else None
        self.margin = float(margin)
        self.batch_size = batch_size
        self.d0, self.d1 = d0, d1

    @property
    def params(self) -> Mapping[str, Any]:
        return {
            "types": self.types,
            "thresholds": self.thresholds,
            "given": self.given,
            "rates": self.rates,
            "margin": self.margin,
            "batch_size": self.batch_size,
            "d0": self.d0,
            "d1": self.d1,
        }

    def __repr__(self) -> str:
        return f"WAIT({self.name!r}, thresholds={self.thresholds!r})"

    def reset(self, instance: Instance) -> None:
        self._setup(instance)
        t = instance_types(instance, self.types)
        self.types_ = t
        self._type = t.of
        m = t.prompt.size
        d0, d1 = eq1_of(instance.time_model)
        d0 = self.d0 if self.d0 is not None else d0
        d1 = self.d1 if self.d1 is not None else d1
        rates = np.asarray(self.rates, dtype=float) if self.rates is not None else t.rates
        if rates.size != m:
            raise InputError(f"policy {self.name!r}: {rates.size} rates for {m} request types")
        burst = not np.isfinite(rates).all()  # every request at once: overload, counts as weights
        weights = t.count.astype(float) if burst else rates
        if self.given is not None:
            if len(self.given) != m or min(self.given) < 1:
                raise InputError(f"policy {self.name!r}: given needs {m} thresholds >= 1")
            n = np.array(self.given, dtype=np.int64)
        else:
            n = wait_thresholds(
                t.prompt, t.output, weights, d0, d1, instance.limits, mode=self.thresholds,
                margin=self.margin, batch_size=self.batch_size, overload=burst, strict=False,
            )  # fmt: skip
        mass = kv_mass(t.prompt, t.output, instance.limits.block_size)
        # M^pi: the KV of a full batch; above M (too many types for one request a stage, or
        # paper/code thresholds) the LIFO safety net keeps the run legal, evicting if needed.
        self.memory_ = int(n @ mass)
        self.thresholds_ = n
        self.rates_ = rates
        self.eq1_ = (d0, d1)

    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return self._type[act]

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return stage == 0

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        return entry_counts >= self.thresholds_
