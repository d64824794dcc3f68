"""``kvsched profile``: the microbenchmarks that fitting needs, in Vidur's table columns.

Three tables, written into one directory:

* ``mlp.csv`` -- every non-attention operator of one layer timed alone per
  token count, in the columns of Vidur's compute tables
  (``time_stats.<op>.median`` in ms, the model's dimensions, ``num_tokens``,
  ``num_tensor_parallel_workers``); :func:`kvsched.costmodel.profiles.load_compute`
  reads it, and ``kvsched calibrate mlp.csv --attention attention.csv`` fits it.
* ``attention.csv`` -- one layer's attention (KV write, gather, attention) in
  the columns of Vidur's attention tables: decode rows (``batch_size`` decodes,
  each reading ``kv_cache_size`` KV) and prefill rows (one chunk of
  ``prefill_chunk_size`` tokens over ``kv_cache_size`` KV), ``median_ms`` per layer.
* ``batches.csv`` -- whole batches through the same forward pass as a replay
  (decode batches, prefill chunks, and mixed batches of one chunk plus decodes),
  in the replay table's columns, so ``kvsched calibrate --from-replay
  batches.csv`` fits the whole-batch model; ``batches.json`` beside it records
  the device, versions and settings.

Like seed 000's Fig. 5 and seed 003's Fig. 3, the grids vary the batch size,
the KV each decode reads, the chunk size and the context of a chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from kvsched.costmodel import BatchView, CostModel
from kvsched.costmodel.profiles import ATTENTION_COLUMNS, LAYER_OPS
from kvsched.errors import InputError
from kvsched.executor.batch import ItemWork, attend_fn, plan_batch
from kvsched.executor.device import Timer, capture_graph, environment, synchronize
from kvsched.executor.engine import Engine, EngineOptions, engine_options
from kvsched.executor.fused import SmallOps
from kvsched.executor.measure import REPLAY_COLUMNS, batch_row, replay_files, write_files
from kvsched.executor.model import Decoder, rope_tables
from kvsched.executor.runner import MAX_REPEAT, MAX_WARMUP, check_count, describe_attention, new_pool, warm_up
from kvsched.schedule.ir import Batch, Phase
from kvsched.stop import INTERRUPTS, interrupted

MS = 1e3
BLOCK_SIZE = 16
#: Calls of an operator captured in one CUDA graph when the engine runs graphs: replays then time the
#: GPU's work back to back, as inside a decode graph, not the host launching one small kernel.
GRAPH_CALLS = 10


@dataclass(frozen=True, slots=True)
class Grid:
    """The sizes profiled.

    Parameters
    ----------
    tokens
        Token counts of the compute table.
    decode_batch, decode_kv
        Decode batches: this many decodes, each reading this much KV.
    prefill_chunk, prefill_kv
        Prefill rows: one chunk of this many tokens over this much KV.
    mixed_decodes, mixed_kv
        Mixed batches: one chunk (``prefill_chunk``, no context) plus this many
        decodes each reading this much KV.
    """

    tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_kv: tuple[int, ...]
    prefill_chunk: tuple[int, ...]
    prefill_kv: tuple[int, ...]
    mixed_decodes: tuple[int, ...]
    mixed_kv: tuple[int, ...]


GRIDS = {
    "full": Grid(
        tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096),
        decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        decode_kv=(128, 256, 512, 1024, 2048, 4096),
        prefill_chunk=(16, 32, 64, 128, 256, 512, 1024, 2048),
        prefill_kv=(0, 256, 512, 1024, 2048, 4096),
        mixed_decodes=(1, 8, 32, 128),
        mixed_kv=(512, 2048),
    ),
    "quick": Grid(
        tokens=(1, 2, 4, 8, 16, 32),
        decode_batch=(1, 2, 4),
        decode_kv=(8, 16, 32),
        prefill_chunk=(2, 4, 8, 16),
        prefill_kv=(0, 8, 16),
        mixed_decodes=(1, 4),
        mixed_kv=(8,),
    ),
}  # fmt: skip


#: The tables of a profile, in the order they are measured: (kind, file name).
TABLES = (("compute", "mlp.csv"), ("attention", "attention.csv"), ("batches", "batches.csv"))


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """Where the tables went and how many rows each has (rows skipped for lack of pool memory).

    After Ctrl-C (``interrupted``), a table of which no row was measured was not written: its path is
    ``None``; the tables measured in part hold the rows finished before it.
    """

    compute: Path | None
    attention: Path | None
    batches: Path | None
    rows: dict[str, int]
    skipped: int
    interrupted: bool = False


class _Bench:
    """Shared state of one profiling run: model, timer, repetitions, random ids."""

    def __init__(self, model: Decoder, repeat: int, options: EngineOptions) -> None:
        self.model = model
        self.options = options
        self.timer = Timer(model.device)
        self.repeat = repeat
        self.rng = np.random.default_rng(0)
        self.gen = torch.Generator(device=model.device).manual_seed(0)
        #: Operators and attention rows timed as graph replays, and those timed eagerly.
        self.graphed = self.eager = 0
        #: Each table's rows as they are measured (a stage appends to its list, so that Ctrl-C leaves
        #: the rows finished before it), and the rows skipped for lack of pool memory.
        self.rows: dict[str, list[Any]] = {kind: [] for kind, _ in TABLES}
        self.skipped = 0

    def median_ms(self, fn: Callable[[], Any]) -> float:
        """fn's median time in ms: over replays of a CUDA graph of :data:`GRAPH_CALLS` calls when the
        engine runs graphs on CUDA (what a decode graph's operator costs), else over calls."""
        fn()  # first call outside the timing: per-shape kernel selection
        graph = self._captured(fn) if self.model.device.type == "cuda" and self.options.graphs else None
        if graph is None:
            self.eager += 1
            return self.timer.median(fn, self.repeat)[1] * MS
        self.graphed += 1
        return self.timer.median(graph.replay, self.repeat)[1] * MS / GRAPH_CALLS

    @staticmethod
    def _captured(fn: Callable[[], Any]) -> Any:
        """A CUDA graph of GRAPH_CALLS calls of fn, or None when fn cannot be captured."""

        def calls() -> None:
            for _ in range(GRAPH_CALLS):
                fn()

        try:
            return capture_graph(calls)
        except RuntimeError:  # e.g. an operator that reads a device value on the host
            torch.cuda.synchronize()
            return None

    def randn(self, *shape: int) -> torch.Tensor:
        m = self.model
        return torch.randn(shape, generator=self.gen, device=m.device, dtype=torch.float32).to(m.dtype)

    def ids(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.model.cfg.shape.vocab, n, dtype=np.int64)


# ------------------------------------------------------------------ compute
def profile_compute(bench: _Bench, grid: Grid) -> pd.DataFrame:
    """Vidur's compute table: each operator of layer 0 timed alone, per token count (ms).

    The operators are those the decode graphs run: compiled when the engine compiles them.
    """
    m = bench.model
    before = m.ops
    if bench.options.compile and bench.options.graphs:
        m.use_ops(SmallOps.compiled())
    try:
        return _compute_rows(bench, grid)
    finally:
        m.use_ops(before)


def _compute_rows(bench: _Bench, grid: Grid) -> pd.DataFrame:
    m = bench.model
    s = m.cfg.shape
    layer = m.layers[0]
    rows = bench.rows["compute"] = []
    for n in grid.tokens:
        x, y = bench.randn(n, s.hidden), bench.randn(n, s.hidden)
        ids = torch.as_tensor(bench.ids(n), device=m.device)
        q, k, _ = layer.attn_pre_proj(x)
        cos, sin = rope_tables(torch.arange(n, device=m.device), s.head_dim, m.cfg.rope_theta, m.dtype)
        a = bench.randn(n, s.heads, s.head_dim)
        gate_up, h = bench.randn(n, 2 * s.ffn), bench.randn(n, s.ffn)
        ops: dict[str, Callable[[], Any]] = {
            "emb": lambda ids=ids: m.emb(ids),
            "input_layernorm": lambda x=x: layer.input_layernorm(x),
            "attn_pre_proj": lambda x=x: layer.attn_pre_proj(x),
            "attn_rope": lambda q=q, k=k, cos=cos, sin=sin: layer.attn_rope(q, k, cos, sin),
            "attn_post_proj": lambda a=a: layer.attn_post_proj(a),
            "post_attention_layernorm": lambda x=x: layer.post_attention_layernorm(x),
            "mlp_up_proj": lambda x=x: layer.mlp_up_proj(x),
            "mlp_act": lambda g=gate_up: layer.mlp_act(g),
            "mlp_down_proj": lambda h=h: layer.mlp_down_proj(h),
            "add": lambda x=x, y=y: x + y,
        }
        assert set(ops) == {"emb", *LAYER_OPS}
        row: dict[str, Any] = {f"time_stats.{op}.median": bench.median_ms(fn) for op, fn in ops.items()}
        row.update(
            n_head=s.heads,
            n_kv_head=s.kv_heads,
            n_embd=s.hidden,
            n_expanded_embd=s.ffn,
            vocab_size=s.vocab,
            use_gated_mlp=True,
            num_tokens=n,
            num_tensor_parallel_workers=1,
        )
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ attention
def _held(pool: Any, contexts: list[int]) -> None:
    """Give owner i ``contexts[i]`` KV tokens (values do not change timing)."""
    pool.reset()
    for owner, kv in enumerate(contexts):
        if kv:
            pool.append(owner, kv)


def profile_attention(bench: _Bench, grid: Grid, pool_tokens: int) -> tuple[pd.DataFrame, int]:
    """Vidur's attention table for layer 0 (ms per layer), and the rows skipped for pool size."""
    m = bench.model
    s = m.cfg.shape
    pool = new_pool(m, pool_tokens, BLOCK_SIZE, layers=1)
    rows: list[Any] = []
    bench.rows["attention"], skipped = rows, 0

    def time_items(contexts: list[int], tokens: list[int]) -> float | None:
        need = sum(-(-(kv + c) // BLOCK_SIZE) for kv, c in zip(contexts, tokens, strict=True))
        if need > pool.num_blocks:
            return None
        _held(pool, contexts)
        items = [
            ItemWork(i, kv, bench.ids(c), False)
            for i, (kv, c) in enumerate(zip(contexts, tokens, strict=True))
        ]
        plan = plan_batch(pool, items, m.device, bench.options.attention)  # type: ignore[arg-type]
        t = plan.num_tokens
        q, k, v = (
            bench.randn(t, s.heads, s.head_dim),
            bench.randn(t, s.kv_heads, s.head_dim),
            bench.randn(t, s.kv_heads, s.head_dim),
        )
        attend = attend_fn(pool, plan, bench.options.kernels)
        return bench.median_ms(lambda: attend(0, q, k, v))

    for b in grid.decode_batch:
        for kv in grid.decode_kv:
            ms = time_items([kv] * b, [1] * b)
            if ms is None:
                skipped += 1
                bench.skipped += 1
                continue
            rows.append((1, b, 0, kv, False, ms))
    for c in grid.prefill_chunk:
        for kv in grid.prefill_kv:
            ms = time_items([kv], [c])
            if ms is None:
                skipped += 1
                bench.skipped += 1
                continue
            rows.append((1, 1, c, kv, True, ms))
    return pd.DataFrame(rows, columns=list(ATTENTION_COLUMNS)), skipped


# ------------------------------------------------------------------ whole batches
def _batch_specs(grid: Grid) -> list[tuple[list[int], list[int], list[int]]]:
    """(contexts, tokens, phases) of every whole batch profiled."""
    dec, pre = int(Phase.DECODE), int(Phase.PREFILL)
    specs = []
    for b in grid.decode_batch:
        for kv in grid.decode_kv:
            specs.append(([kv] * b, [1] * b, [dec] * b))
    for c in grid.prefill_chunk:
        for kv in grid.prefill_kv:
            specs.append(([kv], [c], [pre]))
    for c in grid.prefill_chunk:
        for b in grid.mixed_decodes:
            for kv in grid.mixed_kv:
                specs.append(([0, *[kv] * b], [c, *[1] * b], [pre, *[dec] * b]))
    return specs


def profile_batches(
    bench: _Bench, grid: Grid, pool_tokens: int, predict: CostModel | None
) -> tuple[pd.DataFrame, int]:
    """Whole-batch times in the replay table's columns, and the rows skipped for pool size."""
    m = bench.model
    pool = new_pool(m, pool_tokens, BLOCK_SIZE)
    specs = _batch_specs(grid)
    longest = max(kv + c for ctx, tok, _ in specs for kv, c in zip(ctx, tok, strict=True))
    engine = Engine(m, pool, bench.options, longest)
    rows: list[Any] = []
    bench.rows["batches"], skipped = rows, 0
    for contexts, tokens, phases in specs:
        need = sum(-(-(kv + c) // BLOCK_SIZE) for kv, c in zip(contexts, tokens, strict=True))
        if need > pool.num_blocks:
            skipped += 1
            bench.skipped += 1
            continue
        _held(pool, contexts)
        items = [
            ItemWork(i, kv, bench.ids(c), True)
            for i, (kv, c) in enumerate(zip(contexts, tokens, strict=True))
        ]
        (plan, prep) = bench.timer.time(lambda items=items: engine.plan(items))
        engine.step(plan)  # first run outside the timing: per-shape kernel selection, graph capture
        _, secs = engine.step(plan, bench.repeat)
        n = len(tokens)
        batch = Batch.of(0.0, 0.0, np.arange(n), tokens, phases)
        view = BatchView(batch.tokens, np.asarray(contexts, dtype=np.int64), batch.phases)
        rows.append(
            batch_row(
                len(rows),
                batch,
                view,
                measured=secs * m.cfg.layer_scale,
                measured_raw=secs,
                predicted=predict.batch_time(view) if predict is not None else float("nan"),
                host_prep=prep,
                kv_blocks=pool.used_blocks,
                spread=engine.timer.spread(),
            )
        )
    return pd.DataFrame(rows, columns=list(REPLAY_COLUMNS)), skipped


def default_pool_tokens(model: Decoder, grid: Grid, memory_share: float = 0.7) -> int:
    """Enough KV slots for the largest batch of the grid, capped on CUDA by a share of free memory."""
    specs = _batch_specs(grid)
    need = max(
        sum(-(-(kv + c) // BLOCK_SIZE) for kv, c in zip(ctx, tok, strict=True)) for ctx, tok, _ in specs
    )
    tokens = need * BLOCK_SIZE
    if model.device.type == "cuda":
        s = model.cfg.shape
        per_token = 2 * model.cfg.layers * s.kv_heads * s.head_dim * torch.finfo(model.dtype).bits // 8
        free, _ = torch.cuda.mem_get_info(model.device)
        tokens = min(tokens, int(memory_share * free / per_token) // BLOCK_SIZE * BLOCK_SIZE)
    return max(tokens, BLOCK_SIZE)


def run_profile(
    model: Decoder,
    out_dir: str | Path,
    *,
    grid: Grid,
    repeat: int = 5,
    pool_tokens: int | None = None,
    predict: CostModel | None = None,
    warmup: int = 2,
    options: EngineOptions | None = None,
    what: str = "out_dir",
) -> ProfileResult:
    """Run every microbenchmark and write the three tables into ``out_dir``.

    ``options`` say how batches run (default: the device's, as in a replay). The tables and
    ``batches.json`` are written atomically, together, at the end (a refused write is one
    :class:`InputError` naming ``what``, the flag or argument that named ``out_dir``). After Ctrl-C the
    rows measured so far are written (a table with none is not; with no row at all, nothing is),
    ``batches.json`` records ``interrupted: true`` and each table's rows, and the result says
    ``interrupted``: the tables finished long before are not lost.

    Raises
    ------
    InputError
        When ``repeat`` (1 to :data:`~kvsched.executor.runner.MAX_REPEAT`), ``warmup`` (0 to
        :data:`~kvsched.executor.runner.MAX_WARMUP`) or ``pool_tokens`` (None or at least one block,
        :data:`BLOCK_SIZE` tokens) is out of range, or a table cannot be written.
    """
    repeat = check_count(repeat, "repeat", 1, MAX_REPEAT)
    warmup = check_count(warmup, "warmup", 0, MAX_WARMUP)
    if pool_tokens is not None:
        pool_tokens = check_count(pool_tokens, "pool_tokens", 1)
        if pool_tokens < BLOCK_SIZE:  # (the pool's own error named no flag: "capacity 1 holds no block")
            raise InputError(
                f"pool_tokens: {pool_tokens} holds no KV block of {BLOCK_SIZE} tokens; give {BLOCK_SIZE} or more"
            )
    options = options or engine_options(model.device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pool_tokens = pool_tokens or default_pool_tokens(model, grid)
    bench = _Bench(model, repeat, options)
    try:
        with torch.inference_mode():
            warm_up(model, warmup, options)
            profile_compute(bench, grid)
            profile_attention(bench, grid, pool_tokens)
            # The one-layer attention pool is freed before the whole-model pool is made.
            synchronize(model.device)
            profile_batches(bench, grid, pool_tokens, predict)
    except INTERRUPTS as exc:  # Ctrl-C: the tables (and rows) measured so far are written below
        if not interrupted(exc):
            raise
        stopped = True
    else:
        stopped = False
    rows = bench.rows
    frames = {
        "compute": pd.DataFrame(rows["compute"]),
        "attention": pd.DataFrame(rows["attention"], columns=list(ATTENTION_COLUMNS)),
        "batches": pd.DataFrame(rows["batches"], columns=list(REPLAY_COLUMNS)),
    }
    # A finished profile writes every table (an empty one too: all its rows skipped); an interrupted
    # one only those it has rows of, leaving any older file of that name as it was.
    paths = {kind: out / name if not stopped or rows[kind] else None for kind, name in TABLES}
    meta = {
        "kind": "kvsched.profile",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model.cfg.name,
        "layers": model.cfg.layers,
        "full_layers": model.cfg.shape.layers,
        "layer_scale": model.cfg.layer_scale,
        "seed": model.cfg.seed,
        "repeat": repeat,
        "warmup": warmup,
        "pool_tokens": pool_tokens,
        "block_size": BLOCK_SIZE,
        "grid": asdict(grid),
        "predicted_with": {"name": predict.name} if predict is not None else None,
        **environment(model.device, model.dtype),
        "engine": options.describe(),
        "attention": describe_attention(options),
        # mlp.csv and attention.csv rows: timed as replays of CUDA graphs of GRAPH_CALLS calls, or eagerly.
        "operator_timing": {"graph_calls": GRAPH_CALLS, "graphed": bench.graphed, "eager": bench.eager},
    }
    if stopped:
        meta.update(interrupted=True, rows={kind: len(rows[kind]) for kind, _ in TABLES})
    files = [
        (path, frames[kind].to_csv(index=False)) for kind, path in paths.items() if path and kind != "batches"
    ]
    # batches.json beside batches.csv; with no batch measured, alone: it says what the other tables hold.
    batches = paths["batches"] or out / "batches.csv"
    files += replay_files(frames["batches"], meta, batches)[0 if paths["batches"] else 1 :]
    if not stopped or any(rows.values()):  # (interrupted in the warm-up: nothing measured, nothing written)
        write_files(files, what)
    return ProfileResult(
        paths["compute"],
        paths["attention"],
        paths["batches"],
        rows={kind: len(rows[kind]) for kind, _ in TABLES},
        skipped=bench.skipped,
        interrupted=stopped,
    )
