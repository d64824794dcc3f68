"""A roofline batch-time model from a model description and a GPU description.

Each kernel takes ``max(FLOPs / (peak x flops_eff), bytes / (bandwidth x bw_eff))``;
a batch's time is the sum over its kernels, per layer times the layers, plus the
LM head, the tensor-parallel all-reduces and a per-batch ``overhead``. Kernels,
per layer and per GPU (tensor parallelism ``tp`` splits heads and the FFN):

* four GEMMs over the batch's tau tokens: QKV projection, attention output
  projection, MLP up (and gate) projection, MLP down projection; a GEMM
  (tau x k) . (k x n) does 2 tau k n FLOPs and moves (k n + tau k + tau n) values;
* element-wise operations (two norms, rotary embedding, activation, two
  residual adds): memory-bound, about 10 hidden-size and 3 FFN-size values per
  token;
* decode attention, one kernel for all decodes: reads sum(m + 1) K and V rows
  of kv_heads x head_dim, 4 (m + 1) heads x head_dim FLOPs each;
* prefill attention, one kernel for all chunks (causal, FlashAttention-style):
  c m + c (c + 1) / 2 query-key pairs of 4 heads x head_dim FLOPs, reading the
  m + c K and V rows and the chunk's queries and outputs;
* two ring all-reduces of tau x hidden values per layer when tp > 1, over
  NVLink: 2 (tp - 1) / tp of the bytes each way.

The LM head runs once per item (one token's logits per request). With
efficiencies 1 and no overhead the model is a lower bound on the batch time.
All parameters are flat floats; defaults describe Llama-2-7B on one A100-80GB.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kvsched.costmodel.base import BatchView
from kvsched.costmodel.features import DECODE
from kvsched.costmodel.presets import GpuSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class Roofline:
    """Roofline batch time in seconds (see the module docstring).

    Parameters
    ----------
    layers, hidden, heads, kv_heads, head_dim, ffn, vocab
        The model (see :class:`~kvsched.costmodel.presets.ModelSpec`).
    gated_mlp
        1 for a SwiGLU MLP (up and gate projections), 0 for a plain one.
    dtype_bytes
        Bytes per weight, activation and KV value.
    peak_flops, mem_bw, link_bw
        The GPU: FLOP/s, HBM bytes/s, NVLink bytes/s.
    tp
        Tensor-parallel degree.
    flops_eff, bw_eff
        Fractions of peak FLOP/s and bandwidth reached (1 = ideal roofline).
    overhead
        Per-batch constant, seconds.
    """

    layers: float = 32
    hidden: float = 4096
    heads: float = 32
    kv_heads: float = 32
    head_dim: float = 128
    ffn: float = 11008
    vocab: float = 32000
    gated_mlp: float = 1.0
    dtype_bytes: float = 2.0
    peak_flops: float = 312e12
    mem_bw: float = 2.039e12
    link_bw: float = 600e9
    tp: float = 1.0
    flops_eff: float = 1.0
    bw_eff: float = 1.0
    overhead: float = 0.0
    name: str = "roofline"

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if key == "name":
                continue
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost model roofline: {key} must be a finite number >= 0, got {value}")
        for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "peak_flops", "mem_bw", "tp"):
            if getattr(self, key) <= 0:
                raise ValueError(f"cost model roofline: {key} must be > 0")
        if not 0 < self.flops_eff <= 1 or not 0 < self.bw_eff <= 1:
            raise ValueError("cost model roofline: flops_eff and bw_eff must be in (0, 1]")
        if self.tp > 1 and self.link_bw <= 0:
            raise ValueError("cost model roofline: link_bw must be > 0 when tp > 1")

    # ------------------------------------------------------------ kernels
    def _kernel(self, flops: float, values: float) -> float:
        compute = flops / (self.peak_flops * self.flops_eff)
        memory = values * self.dtype_bytes / (self.mem_bw * self.bw_eff)
        return max(compute, memory)

    def _gemm(self, tokens: float, k: float, n: float) -> float:
        return self._kernel(2.0 * tokens * k * n, k * n + tokens * k + tokens * n)

    def linear_time(self, tokens: float) -> float:
        """Per-layer time of the GEMMs and element-wise operations for ``tokens`` tokens."""
        h, tp = self.hidden, self.tp
        q = self.heads * self.head_dim / tp
        kv = self.kv_heads * self.head_dim / tp
        ff = self.ffn / tp
        up = (2.0 if self.gated_mlp else 1.0) * ff
        t = (
            self._gemm(tokens, h, q + 2 * kv)
            + self._gemm(tokens, q, h)
            + self._gemm(tokens, h, up)
            + self._gemm(tokens, ff, h)
        )
        return t + self._kernel(0.0, tokens * (10 * h + 3 * ff))

    def decode_attention_time(self, context: np.ndarray) -> float:
        """Per-layer time of one decode-attention kernel over decodes holding ``context`` KV each."""
        if context.size == 0:
            return 0.0
        tp = self.tp
        span = float((context + 1.0).sum())
        flops = 4.0 * span * self.heads * self.head_dim / tp
        values = (
            2.0 * span * self.kv_heads * self.head_dim / tp
            + 2.0 * context.size * self.heads * self.head_dim / tp
        )
        return self._kernel(flops, values)

    def prefill_attention_time(self, chunk: np.ndarray, context: np.ndarray) -> float:
        """Per-layer time of one causal prefill-attention kernel over chunks ``chunk`` on ``context``."""
        if chunk.size == 0:
            return 0.0
        tp = self.tp
        pairs = float((chunk * context + chunk * (chunk + 1.0) / 2.0).sum())
        flops = 4.0 * pairs * self.heads * self.head_dim / tp
        values = (
            2.0 * float((context + chunk).sum()) * self.kv_heads * self.head_dim / tp
            + 2.0 * float(chunk.sum()) * self.heads * self.head_dim / tp
        )
        return self._kernel(flops, values)

    def allreduce_time(self, tokens: float) -> float:
        """Per-layer time of the two tensor-parallel all-reduces (0 when tp = 1)."""
        if self.tp <= 1:
            return 0.0
        payload = tokens * self.hidden * self.dtype_bytes
        return 2.0 * 2.0 * (self.tp - 1) / self.tp * payload / self.link_bw

    def batch_time(self, view: BatchView) -> float:
        c = view.tokens.astype(np.float64)
        m = view.context.astype(np.float64)
        dec = view.phases == DECODE
        tau = float(c.sum())
        per_layer = (
            self.linear_time(tau)
            + self.decode_attention_time(m[dec])
            + self.prefill_attention_time(c[~dec], m[~dec])
            + self.allreduce_time(tau)
        )
        head = self._gemm(float(c.size), self.hidden, self.vocab / self.tp)
        return self.overhead + self.layers * per_layer + head


def roofline_params(
    model: ModelSpec, gpu: GpuSpec, tp: int = 1, *, flops_eff: float = 1.0, bw_eff: float = 1.0
) -> dict[str, float]:
    """Flat :class:`Roofline` parameters for ``model`` on ``tp`` GPUs of kind ``gpu``."""
    return {
        "layers": float(model.layers),
        "hidden": float(model.hidden),
        "heads": float(model.heads),
        "kv_heads": float(model.kv_heads),
        "head_dim": float(model.head_dim),
        "ffn": float(model.ffn),
        "vocab": float(model.vocab),
        "gated_mlp": 1.0 if model.gated_mlp else 0.0,
        "dtype_bytes": float(model.dtype_bytes),
        "peak_flops": gpu.peak_flops,
        "mem_bw": gpu.mem_bw,
        "link_bw": gpu.link_bw,
        "tp": float(tp),
        "flops_eff": flops_eff,
        "bw_eff": bw_eff,
    }
