"""KV capacity M from a model, a GPU and a tensor-parallel degree (seed 004, Sec. 7).

Seed 004's formula is::

    M = (Total Memory - Model Size) / (KV Cache Size per Token)
      = (tp x GPU memory - P x D) / (2 x L x H x D)

with memory in GB (10^9 bytes), P the parameter count, D the bytes per value,
L the layers and H the hidden size. 2 x L x H x D counts a key and a value of
the full hidden size per layer: that is only right for multi-head attention.
Under grouped-query attention each layer stores ``kv_heads x head_dim`` values
for K and for V, so the per-token size is 2 x L x kv_heads x head_dim x D.

For Llama-2-70B on two A100-80GB the paper's own numbers give
20e9 / 2,621,440 = 7,629 tokens, yet the paper states 16,492; with the model's
8 KV heads the per-token size is 327,680 B (8x smaller) and M = 61,035.
Both formulas here use the paper's accounting (nominal P, memory in GB, no
activation or framework reserve), so they differ only in the per-token size.

Tensor parallelism splits the KV heads over the GPUs: each holds kv_heads / tp
of them. Where tp is larger than kv_heads, a head cannot be split, so each GPU
holds one whole KV head (vLLM replicates them: ``max(1, kv_heads // tp)`` a GPU),
and the KV of a token takes tp / kv_heads times the bytes of the formula above;
tp must then be a multiple of kv_heads (and below it, a divisor), as engines
require. Llama-2-70B (8 KV heads) on 16 GPUs stores each token twice.
A real engine gets less: it reserves activation workspace and often caps the
memory it uses; the GPU executor should measure free memory instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.costmodel.presets import GpuSpec, ModelSpec
from kvsched.errors import InputError

#: M as a paper states it, where it does: (model, GPU, tp) -> tokens.
STATED = {("llama-2-70b", "a100-80gb", 2): 16_492}  # seed 004 Sec. 7


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """KV capacity by both per-token formulas, with the quantities behind them.

    Parameters
    ----------
    model, gpu
        The presets used.
    tp
        Tensor-parallel degree (number of GPUs holding the model).
    memory_bytes
        tp x GPU memory (GB as 10^9 bytes).
    weight_bytes
        Nominal parameters x bytes per value (seed 004's "P x D").
    kv_bytes_paper, kv_bytes_gqa
        Bytes per KV token: 2 x L x H x D (seed 004) and
        2 x L x kv_heads x head_dim x D (correct under GQA). Only the GQA size is
        multiplied by tp / kv_heads where tp exceeds the KV heads (each GPU then holds
        a copy of one); the paper's formula counts every query head's KV, which
        splits across any tp, so it has nothing to replicate.
    tokens_paper, tokens_gqa
        M by each formula, rounded down to whole tokens.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    memory_bytes: float
    weight_bytes: float
    kv_bytes_paper: int
    kv_bytes_gqa: int
    tokens_paper: int
    tokens_gqa: int

    @property
    def stated(self) -> int | None:
        """M as a seed paper states it for this setting, if it does."""
        return STATED.get((self.model.name, self.gpu.name, self.tp))

    @property
    def free_bytes(self) -> float:
        return self.memory_bytes - self.weight_bytes


def kv_capacity(model: ModelSpec, gpu: GpuSpec, tp: int = 1) -> CapacityReport:
    """M in tokens for ``model`` on ``tp`` GPUs of kind ``gpu``.

    Raises
    ------
    InputError
        If ``tp`` < 1, does not divide the attention heads, neither divides the KV heads nor is a multiple of
        them, or the weights do not fit in the memory.
    """
    if tp < 1:
        raise InputError(f"--tp: must be >= 1, got {tp}")
    if model.heads % tp:  # tensor parallelism gives each GPU an equal share of the attention heads
        raise InputError(
            f"--tp: {model.name}'s {model.heads} attention heads cannot be split evenly over {tp} GPUs"
        )
    kv = model.kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):  # each GPU holds kv / tp heads, or one of tp / kv copies of one
        raise InputError(
            f"--tp: {model.name}'s {kv} KV heads cannot be split evenly over {tp} GPUs, nor replicated on "
            f"them (tp must divide {kv} or be a multiple of it)"
        )
    memory = tp * gpu.memory_bytes
    weights = model.nominal_params * model.dtype_bytes
    free = memory - weights
    if free <= 0:
        raise InputError(
            f"--tp: {model.name} weights ({weights / 1e9:.0f} GB) do not fit in {tp} x {gpu.name} "
            f"({memory / 1e9:.0f} GB); use a larger --tp"
        )
    # Heads replicated where tp exceeds them: tp GPUs of one head each hold tp / kv copies of every head.
    copies = max(1, tp // kv)
    paper, gqa = model.kv_bytes_per_token_mha, model.kv_bytes_per_token * copies
    # Floor, not round: a fractional token of KV cannot be stored.
    return CapacityReport(model, gpu, tp, memory, weights, paper, gqa, int(free // paper), int(free // gqa))
