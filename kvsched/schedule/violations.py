"""The worded check of a batch: every rule it breaks, located by batch and request.

The core (:class:`~kvsched.schedule.core.EngineState`) accepts most batches on its quick
path; a batch that path does not accept comes here, where each broken rule is found and
worded. The rules are the core's (its module docstring states them); this module only
spells out which one a batch breaks and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsched.costmodel.base import BatchView
from kvsched.schedule.ir import Batch, Phase
from kvsched.schedule.records import Rule, Violation

if TYPE_CHECKING:
    from kvsched.schedule.core import EngineState

#: Absolute tolerance on times (overlap, arrival).
TIME_TOL = 1e-9
#: Relative tolerance of a batch's duration against its cost model.
DURATION_RTOL = 1e-6


def full_check(state: EngineState, batch: Batch, index: int | None = None) -> list[Violation]:
    """Every rule ``batch`` breaks if applied to ``state`` now, each worded (the state is not changed)."""
    idx = state.num_batches if index is None else index
    out: list[Violation] = []

    def add(rule: Rule, msg: str, pos: int | None = None) -> None:
        rid = state.ids[pos] if pos is not None and 0 <= pos < state.n else None
        out.append(Violation(rule, msg, idx, rid))

    req, tok, ev = batch.requests, batch.tokens, batch.evicted
    if req.size == 0:
        add(Rule.EMPTY_BATCH, "a batch must process at least one item")
    if not np.isfinite(batch.start):
        add(Rule.OVERLAP, f"start {batch.start!r} is not a finite time")
    elif batch.start < state.clock - TIME_TOL:
        add(Rule.OVERLAP, f"starts at {batch.start:g}, before the previous batch ends at {state.clock:g}")
    if not np.isfinite(batch.duration) or batch.duration < 0:
        add(Rule.WRONG_DURATION, f"duration {batch.duration!r} is not a finite non-negative number")

    # Unknown positions are reported and dropped from the remaining checks.
    known = (req >= 0) & (req < state.n)
    for k in np.flatnonzero(~known):
        add(Rule.UNKNOWN_REQUEST, f"item refers to request position {int(req[k])}, not in the instance")
    ev_known = (ev >= 0) & (ev < state.n)
    for k in np.flatnonzero(~ev_known):
        add(Rule.UNKNOWN_REQUEST, f"eviction of request position {int(ev[k])}, not in the instance")
    req, tok, phases_declared = req[known], tok[known], batch.phases[known]
    ev = ev[ev_known]

    # Evictions.
    ev_unique, ev_counts = np.unique(ev, return_counts=True)
    for pos in ev_unique[ev_counts > 1]:
        add(Rule.BAD_EVICTION, "evicted twice before the same batch", int(pos))
    for pos in ev_unique[state.kv[ev_unique] == 0]:
        what = "completed" if state.done[pos] else "holds no KV"
        add(Rule.BAD_EVICTION, f"evicted but it {what}", int(pos))
    for pos in np.intersect1d(ev_unique, req):
        add(Rule.BAD_EVICTION, "evicted and processed in the same batch", int(pos))

    # Items.
    uniq, counts = np.unique(req, return_counts=True)
    for pos in uniq[counts > 1]:
        add(Rule.DUPLICATE_ITEM, f"appears {int(counts[uniq == pos][0])} times in one batch", int(pos))
    for k in np.flatnonzero(state.done[req]):
        add(Rule.AFTER_COMPLETION, "processed after it completed", int(req[k]))
    late = state.arrival[req] > batch.start + TIME_TOL
    for k in np.flatnonzero(late):
        pos = int(req[k])
        add(
            Rule.BEFORE_ARRIVAL,
            f"processed at {batch.start:g}, before it arrives at {state.arrival[pos]:g}",
            pos,
        )
    for k in np.flatnonzero(tok < 1):
        add(Rule.BAD_TOKENS, f"{int(tok[k])} tokens; an item processes at least 1", int(req[k]))

    phases, context = state._phases_after(req, ev_unique)
    unprocessed = state.prompt[req] + state.generated[req] - context
    live = ~state.done[req]
    for k in np.flatnonzero(live & (phases_declared != phases)):
        pos = int(req[k])
        derived = Phase(int(phases[k]))
        code = int(phases_declared[k])
        if code == Phase.DECODE:
            rest = "prompt" if derived == Phase.PREFILL else "refill"
            add(
                Rule.DECODE_BEFORE_PREFILL,
                f"decode while {int(unprocessed[k])} {rest} tokens are unprocessed",
                pos,
            )
        else:
            label = Phase(code).label if code in Phase._value2member_map_ else f"code {code}"
            add(Rule.PHASE_MISMATCH, f"labelled {label} but the request is in {derived.label}", pos)
    for k in np.flatnonzero(live & (tok > unprocessed)):
        add(
            Rule.TOO_MANY_TOKENS,
            f"{int(tok[k])} tokens but only {int(unprocessed[k])} are left to process",
            int(req[k]),
        )

    # Batch-wide budgets, on what the schedule claims to process.
    lim = state.instance.limits
    total = int(tok.sum())
    if lim.max_batch_tokens is not None and total > lim.max_batch_tokens:
        add(Rule.TOKEN_BUDGET, f"{total} tokens exceed the token budget C = {lim.max_batch_tokens}")
    prefill_tokens = int(tok[phases != Phase.DECODE].sum())
    if lim.max_prefill_tokens is not None and prefill_tokens > lim.max_prefill_tokens:
        add(
            Rule.PREFILL_BUDGET,
            f"{prefill_tokens} prefill/refill tokens exceed the prefill budget P = {lim.max_prefill_tokens}",
        )
    _, kv_blocks, running = _during(state, req, np.maximum(tok, 0), ev_unique, context)
    if lim.max_running is not None and running > lim.max_running:
        add(Rule.MAX_RUNNING, f"{running} requests hold KV, more than max_running = {lim.max_running}")
    if kv_blocks > state.kv_block_capacity:
        held = kv_blocks * state.block_size
        add(Rule.KV_CAPACITY, f"holds {held} KV tokens during the batch, more than M = {lim.kv_capacity}")

    if state.cost_model is not None and req.size and np.isfinite(batch.duration):
        expected = state.cost_model.batch_time(BatchView(tok, context, phases))
        if abs(batch.duration - expected) > DURATION_RTOL * max(1.0, abs(expected)):
            add(
                Rule.WRONG_DURATION,
                f"lasts {batch.duration!r} but the cost model {state.cost_model.name!r} gives {expected!r}",
            )
    return out


def _during(
    state: EngineState, req: np.ndarray, tok: np.ndarray, ev: np.ndarray, context: np.ndarray
) -> tuple[int, int, int]:
    """KV tokens, KV blocks and requests holding KV during the batch."""
    ev_kv = state.kv[ev]
    kv_tokens = state.kv_tokens - int(ev_kv.sum()) + int(tok.sum())
    blocks_before = state.kv_blocks - int(state._blocks(ev_kv).sum())
    kv_blocks = blocks_before + int((state._blocks(context + tok) - state._blocks(context)).sum())
    running = state.num_holding - int((ev_kv > 0).sum()) + int(((context == 0) & (tok > 0)).sum())
    return kv_tokens, kv_blocks, running


__all__ = ["DURATION_RTOL", "TIME_TOL", "full_check"]
