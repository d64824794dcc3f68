"""The decoder's small element-wise operators, as pure functions that ``torch.compile`` can fuse.

Each function is one fused kernel once compiled (inductor emits one Triton
kernel per function): residual add + RMSNorm, rotary embedding of q and k,
SiLU(gate) * up. Eager, each is several kernels (RMSNorm alone is about six),
which is what made the eager engine launch-bound on a GPU.

:class:`SmallOps` holds the functions a model uses: eager by default (CPU
tests must not spend minutes compiling), compiled with :meth:`SmallOps.compiled`
(the CUDA default of the replay). Compiling does not change what is computed,
only how many kernels compute it (rounding may differ in the last place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm, computed in float32 as the Llama reference does."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``x + residual`` (``x`` when there is none yet) and its RMSNorm."""
    stream = x if residual is None else x + residual
    return rms_norm(stream, weight, eps), stream


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (T, heads, d) by the angles of its tokens' positions (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of the queries and the keys, in one function (one kernel compiled)."""
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: SiLU of the gate half times the up half."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True, slots=True)
class SmallOps:
    """The small operators a decoder calls (eager functions, or their compiled versions)."""

    add_rms_norm: Callable[..., Any] = add_rms_norm
    rms_norm: Callable[..., Any] = rms_norm
    rope_qk: Callable[..., Any] = rope_qk
    silu_mul: Callable[..., Any] = silu_mul
    compiled_: bool = False

    @classmethod
    def compiled(cls) -> SmallOps:
        """Each operator through ``torch.compile`` (dynamic in the token count, so one compile per shape class).

        One set per process: the warm-up's engine and the replay's share its compiled code.
        """
        return _compiled_ops()


@cache
def _compiled_ops() -> SmallOps:
    def c(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, dynamic=True, fullgraph=True)

    return SmallOps(c(add_rms_norm), c(rms_norm), c(rope_qk), c(silu_mul), True)


EAGER = SmallOps()
