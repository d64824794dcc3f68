"""Model and GPU descriptions, with presets.

The numbers are public architecture facts (the models' Hugging Face
``config.json``) and vendor data-sheet figures (dense BF16 tensor-core peak,
HBM bandwidth, NVLink bandwidth per GPU). They feed the roofline model, the
RAD tiling defaults, the KV-capacity formula and the scaling of attention
terms to hardware that has no attention profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.errors import InputError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer.

    Parameters
    ----------
    name
        Preset name (lower case, e.g. ``llama-2-7b``).
    layers
        Number of transformer layers L.
    hidden
        Hidden size H (d_x in seed 000).
    heads, kv_heads, head_dim
        Query heads, key/value heads (fewer than ``heads`` under grouped-query
        attention) and the dimension of one head.
    ffn
        FFN (MLP) inner size.
    vocab
        Vocabulary size.
    params
        Parameter count from the architecture.
    nominal_params
        The parameter count in the model's name (70e9 for Llama-2-70B), which
        is what seed 004 Sec. 7 uses for P.
    gated_mlp
        True for SwiGLU MLPs (three FFN matrices instead of two).
    dtype_bytes
        Bytes per weight and per KV element (2 for FP16/BF16).
    aliases
        Other names that select this preset (Hugging Face and Vidur names).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    params: float
    nominal_params: float
    gated_mlp: bool = True
    dtype_bytes: int = 2
    aliases: tuple[str, ...] = ()

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token over all layers: 2 (K and V) x L x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token_mha(self) -> int:
        """Seed 004 Sec. 7's per-token size, 2 x L x H x D: right only without GQA."""
        return 2 * self.layers * self.hidden * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU.

    Parameters
    ----------
    name
        Preset name (e.g. ``a100-80gb``).
    peak_flops
        Dense FP16/BF16 tensor-core peak, FLOP/s.
    mem_bw
        HBM bandwidth, bytes/s.
    memory_gb
        Memory as marketed, in GB (10^9 bytes), as seed 004 Sec. 7 counts it.
    link_bw
        NVLink bandwidth per GPU, bytes/s (for the tensor-parallel all-reduce).
    aliases
        Other names that select this preset (``a100`` is Vidur's name for the
        80 GB part).
    """

    name: str
    peak_flops: float
    mem_bw: float
    memory_gb: float
    link_bw: float
    aliases: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 6.738e9, 7e9,
            aliases=("llama-2-7b-hf", "meta-llama/llama-2-7b-hf", "llama2-7b"),
        ),
        ModelSpec(
            "llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8.030e9, 8e9,
            aliases=("meta-llama-3-8b", "meta-llama/meta-llama-3-8b", "llama3-8b"),
        ),
        ModelSpec(
            "llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 68.977e9, 70e9,
            aliases=("llama-2-70b-hf", "meta-llama/llama-2-70b-hf", "llama2-70b", "llama-70b"),
        ),
        ModelSpec(
            "mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 7.242e9, 7e9,
            aliases=("mistral-7b-v0.1", "mistralai/mistral-7b-v0.1"),
        ),
        ModelSpec(
            "codellama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 33.744e9, 34e9,
            aliases=("codellama-34b-instruct-hf", "codellama/codellama-34b-instruct-hf"),
        ),
    )
}  # fmt: skip

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100-40gb", 312e12, 1.555e12, 40, 600e9),
        GpuSpec("a100-80gb", 312e12, 2.039e12, 80, 600e9, aliases=("a100",)),
        GpuSpec("h100-80gb", 989e12, 3.35e12, 80, 900e9, aliases=("h100", "h100-sxm")),
        GpuSpec("h200-141gb", 989e12, 4.8e12, 141, 900e9, aliases=("h200",)),
    )
}


def _lookup(table: dict, kind: str, name: str, flag: str | None = None):  # type: ignore[no-untyped-def]
    key = name.strip().lower()
    if key in table:
        return table[key]
    for spec in table.values():
        if key in spec.aliases:
            return spec
    known = ", ".join(sorted(table))
    raise InputError(f"{flag or '--' + kind}: unknown {kind} {name!r} (known: {known})")


def get_model(name: str, flag: str = "--model") -> ModelSpec:
    """The model preset called ``name`` (or one of its aliases); an unknown name is blamed on ``flag``."""
    return _lookup(MODELS, "model", name, flag)


def get_gpu(name: str, flag: str = "--gpu") -> GpuSpec:
    """The GPU preset called ``name`` (or one of its aliases); an unknown name is blamed on ``flag``."""
    return _lookup(GPUS, "gpu", name, flag)


def model_from_dims(heads: int, kv_heads: int, hidden: int, ffn: int, vocab: int) -> ModelSpec | None:
    """The preset with these dimensions, or None.

    Vidur pads Llama-2's vocabulary to 32768, so the vocabulary only breaks
    ties (Llama-3-8B and Mistral-7B share every other dimension).
    """
    hits = [
        m for m in MODELS.values() if (m.heads, m.kv_heads, m.hidden, m.ffn) == (heads, kv_heads, hidden, ffn)
    ]
    if not hits:
        return None
    return min(hits, key=lambda m: abs(m.vocab - vocab))


def gpu_from_path(path: str) -> GpuSpec | None:
    """The GPU named by a directory in ``path`` (Vidur's layout: ``compute/a100/...``)."""
    from pathlib import PurePath

    for part in reversed(PurePath(path).parts[:-1]):
        try:
            return get_gpu(part)
        except InputError:
            continue
    return None
