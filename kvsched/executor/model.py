"""A Llama-style decoder in plain PyTorch, with seeded random weights.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP,
as in Llama-2/3 and Mistral. Weights are random (timing does not depend on
their values, and nothing is downloaded) but seeded, so every run of the same
:class:`DecoderConfig` on the same device has the same weights.

The model knows nothing about caches or batches: each layer hands its queries,
keys and values to an *attend* function, which owns the KV cache and the
attention pattern. The executor's paged attention (:mod:`kvsched.executor.batch`)
and the oracle's cache-free causal attention (:mod:`kvsched.executor.oracle`)
are two such functions over the same weights.

Shapes come from the model presets of :mod:`kvsched.costmodel.presets`
(``llama-2-7b-shape`` is the ``llama-2-7b`` preset with random weights); ``tiny``
is a two-layer model for tests on CPU. ``layers`` may build fewer layers than
the shape has; measured times are then scaled by ``full layers / layers``
(:attr:`DecoderConfig.layer_scale`), which scales the embedding and the
sampling head too -- a small overstatement, documented in ``docs/executor.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kvsched.costmodel.presets import MODELS, ModelSpec, get_model
from kvsched.errors import InputError
from kvsched.executor.device import allocating
from kvsched.executor.fused import EAGER, SmallOps

#: attend(layer index, q (T, heads, d), k (T, kv_heads, d), v (T, kv_heads, d)) -> (T, heads, d).
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

SHAPE_SUFFIX = "-shape"


def _param_count(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int
) -> int:
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * ffn
    return 2 * vocab * hidden + layers * (per_layer + 2 * hidden) + hidden


_TINY_DIMS = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 128}
#: A two-layer model with grouped-query attention, small enough for CPU tests.
TINY = ModelSpec(
    "tiny", **_TINY_DIMS, params=_param_count(**_TINY_DIMS), nominal_params=_param_count(**_TINY_DIMS)
)


def model_names() -> list[str]:
    """Names :func:`decoder_config` accepts: ``tiny`` and ``<preset>-shape`` for every preset."""
    return ["tiny", *(f"{name}{SHAPE_SUFFIX}" for name in MODELS)]


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    """What to build.

    Parameters
    ----------
    shape
        The architecture (a :mod:`kvsched.costmodel.presets` model, or :data:`TINY`).
    layers
        Layers actually built (at most ``shape.layers``).
    dtype
        torch dtype name of weights, activations and KV.
    seed
        Seed of the random weights.
    rope_theta, norm_eps
        RoPE base and RMSNorm epsilon (they do not change timing).
    """

    shape: ModelSpec
    layers: int
    dtype: str = "float32"
    seed: int = 0
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    @property
    def name(self) -> str:
        return "tiny" if self.shape is TINY else f"{self.shape.name}{SHAPE_SUFFIX}"

    @property
    def layer_scale(self) -> float:
        """Factor from measured time (``layers`` built) to the full model's time."""
        return self.shape.layers / self.layers


def decoder_config(
    name: str, layers: int | None = None, dtype: str = "float32", seed: int = 0
) -> DecoderConfig:
    """The :class:`DecoderConfig` called ``name`` (``tiny`` or ``<preset>-shape``)."""
    key = name.strip().lower()
    if key == "tiny":
        shape = TINY
    elif key.endswith(SHAPE_SUFFIX):
        try:
            shape = get_model(key.removesuffix(SHAPE_SUFFIX))
        except InputError:
            shape = None
    else:
        shape = None
    if shape is None:
        raise InputError(f"--model: unknown model {name!r} (known: {', '.join(model_names())})")
    if layers is not None and not 1 <= layers <= shape.layers:
        raise InputError(f"--layers: {layers} is not between 1 and the {shape.layers} layers of {name}")
    return DecoderConfig(shape, layers or shape.layers, dtype, seed)


def weight_bytes(cfg: DecoderConfig) -> int:
    """Bytes of the weights :class:`Decoder` builds for ``cfg`` (its layers only, in its dtype)."""
    s = cfg.shape
    count = _param_count(cfg.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab)
    return count * torch.finfo(getattr(torch, cfg.dtype)).bits // 8


# ------------------------------------------------------------------ pieces
def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, (T, head_dim) each."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class DecoderLayer(nn.Module):
    """One transformer layer; one method per operator, under Vidur's operator names."""

    def __init__(self, cfg: DecoderConfig, weight: Callable[[tuple[int, ...], int], nn.Parameter]) -> None:
        super().__init__()
        s = cfg.shape
        self.heads, self.kv_heads, self.head_dim, self.eps = s.heads, s.kv_heads, s.head_dim, cfg.norm_eps
        self.ffn = s.ffn
        self.norm_in = weight((s.hidden,), 0)
        self.w_qkv = weight(((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden), s.hidden)
        self.w_o = weight((s.hidden, s.heads * s.head_dim), s.heads * s.head_dim)
        self.norm_post = weight((s.hidden,), 0)
        self.w_gate_up = weight((2 * s.ffn, s.hidden), s.hidden)
        self.w_down = weight((s.hidden, s.ffn), s.ffn)
        self.ops = EAGER

    def input_layernorm(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.norm_in, self.eps)

    def attn_pre_proj(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = F.linear(h, self.w_qkv)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
        t = h.shape[0]
        return (
            q.reshape(t, self.heads, self.head_dim),
            k.reshape(t, self.kv_heads, self.head_dim),
            v.reshape(t, self.kv_heads, self.head_dim),
        )

    def attn_rope(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rope_qk(q, k, cos, sin)

    def attn_post_proj(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a.reshape(a.shape[0], -1), self.w_o)

    def post_attention_layernorm(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.norm_post, self.eps)

    def mlp_up_proj(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.w_gate_up)

    def mlp_act(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_mul(gate_up)

    def mlp_down_proj(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.w_down)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: AttendFn,
        index: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output and the residual stream before it (added by the next norm, fused)."""
        h, residual = self.ops.add_rms_norm(x, residual, self.norm_in, self.eps)
        q, k, v = self.attn_pre_proj(h)
        q, k = self.attn_rope(q, k, cos, sin)
        a = self.attn_post_proj(attend(index, q, k, v))
        h, residual = self.ops.add_rms_norm(a, residual, self.norm_post, self.eps)
        return self.mlp_down_proj(self.mlp_act(self.mlp_up_proj(h))), residual


class Decoder(nn.Module):
    """The decoder built from ``cfg`` on ``device`` with seeded random weights.

    Matrices are drawn from N(0, 1/fan_in) (activations keep unit scale through
    the layers), the embedding from N(0, 1), norm weights are 1.
    """

    def __init__(self, cfg: DecoderConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype: torch.dtype = getattr(torch, cfg.dtype)
        s = cfg.shape
        # The weights, and the float32 copy each matrix is drawn in (the largest: the embedding or the MLP).
        needed = weight_bytes(cfg) + 4 * max(s.vocab * s.hidden, 2 * s.ffn * s.hidden)
        hint = (
            f"build fewer layers with --layers (measured times are scaled to the {s.layers}), or use a "
            "smaller --dtype"
        )
        with allocating(
            needed, self.device, f"--model {cfg.name} ({cfg.layers} layers in {cfg.dtype})", hint
        ):
            self._build(cfg)

    def _build(self, cfg: DecoderConfig) -> None:
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def weight(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
            if fan_in == 0:
                data = torch.ones(shape, device=self.device, dtype=self.dtype)
            else:
                # Drawn in float32 and cast, so the dtype changes precision, not the weights.
                data = torch.empty(shape, device=self.device, dtype=torch.float32)
                data.normal_(0.0, fan_in**-0.5, generator=gen)
                data = data.to(self.dtype)
            return nn.Parameter(data, requires_grad=False)

        s = cfg.shape
        self.embed = weight((s.vocab, s.hidden), 1)
        self.layers = nn.ModuleList(DecoderLayer(cfg, weight) for _ in range(cfg.layers))
        self.norm = weight((s.hidden,), 0)
        self.lm_head = weight((s.vocab, s.hidden), s.hidden)

    def emb(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn, logit_rows: torch.Tensor
    ) -> torch.Tensor:
        """Logits (float32) of the tokens at ``logit_rows`` after running ``ids`` at ``positions``.

        Parameters
        ----------
        ids, positions
            Token ids and their positions in their sequences, (T,) each, packed.
        attend
            The attention of every layer (it owns the KV cache).
        logit_rows
            Rows of the packed input whose next-token logits are wanted.
        """
        cos, sin = rope_tables(positions, self.cfg.shape.head_dim, self.cfg.rope_theta, self.dtype)
        x, residual = self.emb(ids), None
        for index, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, attend, index)
        x = x[logit_rows] + residual[logit_rows] if residual is not None else x[logit_rows]
        x = self.ops.rms_norm(x, self.norm, self.cfg.norm_eps)
        return F.linear(x, self.lm_head).float()

    @property
    def ops(self) -> SmallOps:
        return self.layers[0].ops if len(self.layers) else EAGER

    def use_ops(self, ops: SmallOps) -> None:
        """Run the small operators through ``ops`` (e.g. :meth:`SmallOps.compiled`)."""
        for layer in self.layers:
            layer.ops = ops
