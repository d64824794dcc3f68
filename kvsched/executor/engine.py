"""The engine settings and the object that plans, runs and times batches with them.

:class:`EngineOptions` says how a batch runs: which attention (in place or
gathered), which kernels, whether decode-only batches go through CUDA graphs
and whether the small operators are compiled. :func:`engine_options` fills in
the defaults of a device: on CUDA everything fast (Triton decode, flash varlen
prefill, graphs, compiled small operators); on CPU the torch references,
eager, so tests neither compile nor need triton. :class:`Engine` is what the
replay and the profiler drive.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kvsched.errors import InputError
from kvsched.executor.batch import ATTENTION, BatchPlan, ItemWork, plan_batch, run_batch
from kvsched.executor.device import Timer
from kvsched.executor.fused import SmallOps
from kvsched.executor.graphs import DecodeGraphs
from kvsched.executor.kvcache import KVPool
from kvsched.executor.mixed_graphs import CHUNK_COUNTS, MixedGraphs
from kvsched.executor.model import Decoder
from kvsched.executor.paged import AttentionKernels

KERNELS = ("torch", "triton")
PREFILL = ("torch", "triton", "varlen")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How batches run.

    Parameters
    ----------
    attention
        ``paged`` (in place) or ``gather`` (the first GPU run's padded groups).
    kernels
        Decode and prefill implementations of the in-place attention.
    graphs
        Decode-only batches through static bucketed buffers (CUDA graphs on CUDA).
    mixed_graphs
        Batches with prefill chunks through static buffers per (decodes, chunk rows, chunks)
        bucket (:mod:`kvsched.executor.mixed_graphs`; CUDA graphs on CUDA). On by default on
        CUDA: on the H100 it took the batches with chunks from 2.8-4.2 times the vLLM-profiled
        model to 0.7-1.0 (docs/executor.md, third GPU run).
    compile
        The small operators through ``torch.compile``: inside the decode graphs when there are
        graphs (the batches outside them run the operators uncompiled), else in every batch.
        A compiled function costs about 0.1 ms of host time a call (TorchDynamo's guards and
        wrappers): in a captured graph that is paid once, but a batch outside the graphs
        calls four of them per layer, and on the H100 that made those batches slower than
        uncompiled ones (mixed batches of the lengths / 10 Sarathi replay, p50 52.7 ms
        compiled against 36.7 ms uncompiled; docs/executor.md, second GPU run).
    cuda_graphs
        Whether the static buffers of ``graphs`` and ``mixed_graphs`` are captured as CUDA graphs:
        :func:`engine_options` sets it from the device (on CPU the buffers run eagerly, a stand-in the
        tests use); None (options built directly) means on exactly where the device is CUDA.
    """

    attention: str = "paged"
    kernels: AttentionKernels = field(default_factory=AttentionKernels)
    graphs: bool = False
    compile: bool = False
    mixed_graphs: bool = False
    cuda_graphs: bool | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "attention": self.attention,
            "kernels": asdict(self.kernels),
            "graphs": self.graphs,
            "compile": self.compile,
            "mixed_graphs": self.mixed_graphs,
            # graphs / mixed_graphs say the static buffers ran; on CPU (--cuda-graphs there) no CUDA graph
            # is captured, and a table's metadata must not claim one. None: options built directly.
            "cuda_graphs": self.cuda_graphs,
            # The largest bucket's chunk count: it was 8 before the third GPU run, so tables say which.
            "mixed_chunks_max": CHUNK_COUNTS[-1] if self.mixed_graphs else None,
        }


def engine_options(
    device: torch.device,
    *,
    attention: str | None = None,
    kernels: str | None = None,
    prefill: str | None = None,
    graphs: bool | None = None,
    compile: bool | None = None,
    mixed_graphs: bool | None = None,
    splits: int = 0,
    partition: int = 0,
    tile: int = 64,
) -> EngineOptions:
    """The options for ``device``, each None taking the device's default (fast on CUDA, reference on CPU).

    ``splits`` (0: chosen per batch), ``partition`` (keys per KV partition: the decode KV split by
    length; 0: by ``splits``) and ``tile`` (keys per tile, chunk rows per tile) tune the Triton kernels.
    """
    cuda = device.type == "cuda"
    attention = attention or "paged"
    kernels = kernels or ("triton" if cuda else "torch")
    prefill = prefill or ("varlen" if cuda else kernels)
    for flag, value, known in (
        ("--attention", attention, ATTENTION),
        ("--kernels", kernels, KERNELS),
        ("--prefill", prefill, PREFILL),
    ):
        if value not in known:
            raise InputError(f"{flag}: expected one of {', '.join(known)}, got {value!r}")
    if splits < 0 or tile < 16 or tile & (tile - 1):
        raise InputError(f"--kv-splits must be >= 0 and --tile a power of two >= 16, got {splits} and {tile}")
    if partition < 0 or partition % tile:
        raise InputError(f"--kv-partition must be a multiple of --tile ({tile}), got {partition}")
    if partition and splits:
        raise InputError("--kv-partition splits the KV by length, --kv-splits by count: give one")
    if prefill == "varlen" and not cuda:
        raise InputError("--prefill varlen: torch's flash varlen attention runs on CUDA only")
    paged = attention == "paged"
    if mixed_graphs is None:  # the default: on where the decode graphs are (CUDA, in place)
        mixed_graphs = cuda and paged and graphs is not False
    if mixed_graphs and not paged:
        raise InputError("--mixed-graphs needs --attention paged (the graphs read the pool in place)")
    if "triton" in (kernels, prefill) or (mixed_graphs and cuda):  # captured chunks use the Triton kernel
        _check_triton(cuda)
    buffered = (cuda and paged) if graphs is None else graphs and paged
    return EngineOptions(
        attention,
        AttentionKernels(kernels, prefill, splits, partition, block_n=tile, block_m=tile),  # type: ignore[arg-type]
        graphs=buffered,
        compile=cuda if compile is None else compile,
        mixed_graphs=mixed_graphs,
        cuda_graphs=cuda and (buffered or mixed_graphs),
    )


def _check_triton(cuda: bool) -> None:
    """Triton kernels need triton, and on CPU its interpreter (switched on before the kernels load)."""
    # Looked up, not imported: importing triton before TRITON_INTERPRET is set would fix its mode.
    if importlib.util.find_spec("triton") is None:
        raise InputError("the Triton kernels need triton: pip install triton (Linux)")
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError("Triton kernels on CPU run in Triton's interpreter: set TRITON_INTERPRET=1")


class Engine:
    """Plans, runs and times batches on one model and KV pool.

    Parameters
    ----------
    max_len
        The longest sequence a decode may reach (the graphs' slot-table width).
    """

    def __init__(self, model: Decoder, pool: KVPool, options: EngineOptions, max_len: int) -> None:
        self.model, self.pool, self.options = model, pool, options
        self.timer = Timer(model.device)
        compiled = SmallOps.compiled() if options.compile and not model.ops.compiled_ else None
        if compiled is not None and not options.graphs:
            model.use_ops(compiled)
        width = -(-max(max_len, 1) // 64) * 64
        self.graphs = (
            DecodeGraphs(model, pool, options.kernels, width, ops=compiled) if options.graphs else None
        )
        self.mixed = (
            MixedGraphs(model, pool, options.kernels, width, ops=compiled) if options.mixed_graphs else None
        )

    def plan(self, items: Sequence[ItemWork]) -> BatchPlan:
        """Allocate the items' KV and build the batch's tensors."""
        return plan_batch(self.pool, items, self.model.device, self.options.attention)  # type: ignore[arg-type]

    def run(self, plan: BatchPlan) -> list[int]:
        """The batch's sampled tokens, untimed."""
        return run_batch(self.model, self.pool, plan, self.options.kernels).tolist()

    def step(self, plan: BatchPlan, repeat: int = 1) -> tuple[list[int], float]:
        """Run the batch ``repeat`` times: its sampled tokens (item order) and the median time in seconds."""
        for graphs in (self.graphs, self.mixed):
            if graphs is not None and graphs.fits(plan):
                return graphs.run(plan, self.timer, repeat)
        return self.timer.median(lambda: self.run(plan), repeat)

    @property
    def graphed(self) -> int:
        """Batches that ran through the bucketed buffers (decode-only and mixed)."""
        return sum(g.replays for g in (self.graphs, self.mixed) if g is not None)
