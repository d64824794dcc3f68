"""Replay a schedule on the model, batch by batch, and time every batch.

The semantic core says what each batch does: the runner steps an
:class:`~kvsched.schedule.core.EngineState` alongside (which also validates the
schedule, strictly, against the instance's cost model) and reads from it, for
every item, how much KV its request holds (the first position processed) and,
from the batch record, which requests generate a token and which complete.
The executor adds only the tensor work: the tokens at those positions go
through the model on top of the cached KV, generating requests get the greedy
next token, evicted and completed requests free their KV blocks. A refill is
an item like any other: it recomputes the request's prompt and generated
tokens into fresh blocks.

Prompt tokens are seeded random ids, one stream per request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import torch

from kvsched.costmodel import BatchView, CostModel
from kvsched.errors import InputError
from kvsched.executor.batch import ItemWork
from kvsched.executor.device import Timer, allocating, environment, synchronize
from kvsched.executor.engine import Engine, EngineOptions, engine_options
from kvsched.executor.kvcache import KVPool, KvPoolError
from kvsched.executor.measure import REPLAY_COLUMNS, batch_row
from kvsched.executor.model import Decoder
from kvsched.instances.model import Instance
from kvsched.schedule.core import EngineState, ScheduleError
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import INTERRUPTS, interrupted

#: The most runs of one measurement (``--repeat``): the median of 1000 runs is as steady as a median gets,
#: and a larger number is a typo (``--repeat 1000000000`` ran until killed).
MAX_REPEAT = 1000
#: The most warm-up rounds (``--warmup``), for the same reason.
MAX_WARMUP = 1000


def check_count(value: object, name: str, low: int, high: int | None = None) -> int:
    """``value`` if it is a whole number in ``[low, high]``, else one :class:`InputError` naming ``name``.

    The executor's functions are called from Python too: a ``repeat=0`` once ran each batch once and
    recorded 0 in the metadata, and ``repeat=2.5`` was a bare TypeError.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"{name}: expected a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise InputError(f"{name}: must be {bound}, got {value}")
    return int(value)


@dataclass(eq=False)
class ReplayResult:
    """What a replay measured and generated.

    Attributes
    ----------
    table
        One row per batch (columns :data:`kvsched.executor.measure.REPLAY_COLUMNS`).
    prompts
        Prompt token ids per request position.
    generated
        Generated token ids per request position.
    meta
        Model, device, versions and settings of the run.
    """

    table: pd.DataFrame
    prompts: list[np.ndarray]
    generated: list[list[int]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: Ctrl-C stopped the replay: ``table`` holds the batches measured before it (``meta`` says so too),
    #: ``generated`` the tokens made so far, and no request need be complete.
    interrupted: bool = False


def prompt_ids(instance: Instance, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Seeded random prompt token ids, one independent stream per request position."""
    return [
        np.random.default_rng([seed, k]).integers(0, vocab, r.prompt, dtype=np.int64)
        for k, r in enumerate(instance.requests)
    ]


def new_pool(model: Decoder, capacity: int, block_size: int, layers: int | None = None) -> KVPool:
    """An empty KV pool for ``model`` (all its layers unless ``layers`` says fewer).

    A pool the device cannot hold is one :class:`InputError` with its size (torch's allocator error
    reached the user as an internal error).
    """
    s = model.cfg.shape
    layers = model.cfg.layers if layers is None else layers
    size = 2 * capacity * layers * s.kv_heads * s.head_dim * torch.finfo(model.dtype).bits // 8
    hint = "give a smaller --pool-capacity (replay) or --pool-tokens (profile)"
    with allocating(size, model.device, f"KV pool: {capacity:,} tokens", hint):
        return KVPool(capacity, block_size, layers, s.kv_heads, s.head_dim, model.dtype, model.device)


def warm_up(model: Decoder, rounds: int, options: EngineOptions | None = None) -> None:
    """Run a small prefill and a decode ``rounds`` times on a scratch pool (kernel loading, autotuning)."""
    if rounds <= 0:
        return
    pool = new_pool(model, 64, 16)
    engine = Engine(model, pool, options or engine_options(model.device), 64)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.cfg.shape.vocab, 17)
    for _ in range(rounds):
        pool.reset()
        engine.step(engine.plan([ItemWork(0, 0, ids[:16], True)]))
        engine.step(engine.plan([ItemWork(0, 16, ids[16:], True)]))
    synchronize(model.device)


def replay_on_model(
    model: Decoder,
    instance: Instance,
    schedule: Schedule,
    *,
    predict: CostModel | None = None,
    durations: CostModel | None = None,
    pool_capacity: int | None = None,
    repeat: int = 1,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = False,
    options: EngineOptions | None = None,
) -> ReplayResult:
    """Replay ``schedule`` on ``model`` and measure every batch.

    Parameters
    ----------
    predict
        Cost model whose prediction goes next to each measurement (default: the
        instance's own).
    durations
        Cost model the schedule's durations are checked against (default the instance's own; a schedule
        made with another model, ``simulate --cost-model``, names that one).
    pool_capacity
        KV pool size in tokens; default the instance's M. A smaller pool shows
        the pool's own check refusing a schedule the validator accepts.
    repeat
        Runs of each batch; the median time is kept. Rerunning a batch writes
        the same KV into the same slots, so it does not change the outcome.
    warmup
        Warm-up rounds before the first measured batch.
    seed
        Seed of the prompt token ids.
    options
        How batches run (default: :func:`~kvsched.executor.engine.engine_options` of the model's device).

    Returns
    -------
    ReplayResult
        Every batch measured; after Ctrl-C, those measured before it, with ``interrupted`` set and
        ``meta["interrupted"]`` true (minutes of measurements are not thrown away: the caller keeps them).

    Raises
    ------
    InputError
        When ``repeat`` (1 to :data:`MAX_REPEAT`), ``warmup`` (0 to :data:`MAX_WARMUP`), ``pool_capacity``
        (None or >= 1) or ``seed`` (>= 0) is out of range.
    ScheduleError
        When the schedule is illegal for the instance (the semantic core's check).
    KvPoolError
        When a batch needs more KV blocks than the pool has free.
    """
    repeat = check_count(repeat, "repeat", 1, MAX_REPEAT)
    warmup = check_count(warmup, "warmup", 0, MAX_WARMUP)
    seed = check_count(seed, "seed", 0)
    if pool_capacity is not None:  # (0 was taken for "the instance's M")
        pool_capacity = check_count(pool_capacity, "pool_capacity", 1)
    with torch.inference_mode():
        return _replay(
            model,
            instance,
            schedule,
            predict,
            durations,
            pool_capacity,
            repeat,
            warmup,
            seed,
            progress,
            options or engine_options(model.device),
        )


def _replay(
    model: Decoder,
    instance: Instance,
    schedule: Schedule,
    predict: CostModel | None,
    durations: CostModel | None,
    pool_capacity: int | None,
    repeat: int,
    warmup: int,
    seed: int,
    progress: bool,
    options: EngineOptions,
) -> ReplayResult:
    lim = instance.limits
    state = EngineState(instance, durations or instance_cost_model(instance))
    predict = predict or instance_cost_model(instance)
    pool = new_pool(model, pool_capacity or lim.kv_capacity, lim.block_size)
    prompts = prompt_ids(instance, model.cfg.shape.vocab, seed)
    seqs = [p.tolist() for p in prompts]  # known tokens per request: prompt, then generated
    timer = Timer(model.device)
    scale = model.cfg.layer_scale
    engine = Engine(model, pool, options, max((r.prompt + r.output for r in instance.requests), default=1))
    rows: list[dict[str, Any]] = []
    try:
        warm_up(model, warmup, options)
        _run_batches(schedule, state, pool, engine, timer, predict, seqs, scale, repeat, rows, progress)
    except INTERRUPTS as exc:  # Ctrl-C: the batches measured so far are kept (the caller writes them)
        if not interrupted(exc):
            raise
        stopped = True
    else:
        stopped = False
        unfinished = state.finish()
        if unfinished:
            raise ScheduleError(unfinished)
    generated = [seq[len(p) :] for seq, p in zip(seqs, prompts, strict=True)]
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model.cfg.name,
        "layers": model.cfg.layers,
        "full_layers": model.cfg.shape.layers,
        "layer_scale": scale,
        "seed": model.cfg.seed,
        "prompt_seed": seed,
        "repeat": repeat,
        "warmup": warmup,
        "pool_tokens": pool.num_slots,
        "predicted_with": {"name": predict.name},
        **environment(model.device, model.dtype),
        "engine": options.describe(),
        "graphed_batches": engine.graphed,
    }
    meta["attention"] = describe_attention(options)
    if stopped:
        meta.update(interrupted=True, batches_measured=len(rows), batches=len(schedule.batches))
    return ReplayResult(pd.DataFrame(rows, columns=list(REPLAY_COLUMNS)), prompts, generated, meta, stopped)


def _run_batches(
    schedule: Schedule,
    state: EngineState,
    pool: KVPool,
    engine: Engine,
    timer: Timer,
    predict: CostModel,
    seqs: list[list[int]],
    scale: float,
    repeat: int,
    rows: list[dict[str, Any]],
    progress: bool,
) -> None:
    """Run and time every batch, appending its row to ``rows`` as it is measured (so that an interrupt
    leaves the rows of every batch finished before it)."""
    for k, batch in _progress(schedule.batches, progress):
        req = batch.requests
        # KV held before the batch: the first position each item processes. Evictions never
        # touch an item of the same batch (the core refuses that), so this is also after them.
        start = state.kv[req].copy()
        record = state.step(batch)
        for pos in batch.evicted:
            pool.free(int(pos))
        gen = set(record.generated.tolist())
        items = [
            ItemWork(
                int(r), int(s), np.asarray(seqs[r][s : s + c], dtype=np.int64), int(r) in gen, state.ids[r]
            )
            for r, s, c in zip(req, start, batch.tokens, strict=True)
        ]
        for it in items:
            # The core generates exactly when the item reaches the last known token.
            if it.sample != (it.start + it.ids.size == len(seqs[it.owner])):
                raise RuntimeError(
                    f"executor bug: batch {k}, request {it.label}: sampling disagrees with the core"
                )
        try:
            (plan, prep) = timer.time(lambda items=items: engine.plan(items))
        except KvPoolError as exc:
            raise KvPoolError(f"batch {k}: {exc}") from None
        tokens, secs = engine.step(plan, repeat)
        for it, tok in zip((it for it in items if it.sample), tokens, strict=True):
            seqs[it.owner].append(int(tok))
        for pos in record.completed:
            pool.free(int(pos))
        view = BatchView(batch.tokens, start, batch.phases)
        rows.append(
            batch_row(
                k,
                batch,
                view,
                measured=secs * scale,
                measured_raw=secs,
                predicted=predict.batch_time(view),
                host_prep=prep,
                kv_blocks=pool.used_blocks,
                spread=engine.timer.spread(),
            )
        )


def describe_attention(options: EngineOptions) -> str:
    """One line saying how attention ran (for the replay's metadata)."""
    if options.attention == "gather":
        return "torch sdpa over KV gathered from the pool, items in padded groups of similar size"
    k = options.kernels
    graphs = "; decode-only batches padded to buckets (CUDA graphs on CUDA)" if options.graphs else ""
    if options.mixed_graphs:
        graphs += "; batches with chunks padded to buckets (CUDA graphs on CUDA)"
    split = f" in KV partitions of {k.partition}" if k.partition and k.decode == "triton" else ""
    return f"in place over slot tables: decodes {k.decode}{split}, chunks {k.prefill}{graphs}"


def _progress(batches: Iterable, show: bool) -> Iterable:  # type: ignore[type-arg]
    if not show:
        return enumerate(batches)
    from rich.progress import track

    return enumerate(track(list(batches), description="replaying", transient=True))
