"""The RAD tiling model (seed 000, Sec. 3.2, Eq. 4-7).

::

    T_B = (1/mu_Lin) * ceil(tau / t_col)                         # Eq. 4: linear layers
        + tau / mu_nLin                                          # non-linear ops
        + N * sum_{decodes} T_DSA(i)                             # Eq. 5
        + N * g * sum_{prefills} ( ceil((i+c-1)/t_row) ceil(c/t_col) ceil(d/t_red)
                                 + ceil(d/t_row) ceil(c/t_col) ceil((i+c-1)/t_red) )   # Eq. 6

    1/mu_Lin = g * ( 3N ceil(d_x/t_red) ceil(d/t_row) + N ceil(d/t_red) ceil(d_ff/t_row)
                   + N ceil(d_ff/t_red) ceil(d_x/t_row) + ceil(d_x/t_red) ceil(d_out/t_row) )
    T_DSA(i) = v * ( ceil(d/v_col) ceil(i/v_row) + ceil(i/v_col) ceil(d/v_row) )

where g = 1/(s mu(t_row, t_col, t_red)) is the time of one GeMM tile-pair on
the whole GPU and v = 1/mu(v_row, v_col) that of one GeMV tile (Eq. 5 drops
Eq. 3's 1/s; it is absorbed in v). The token dimension is the column
dimension. The paper assumes the model dimensions divide the tiles; the
ceilings here make that exact when they do and pad when they do not.

Index mapping: a decode of a request holding m KV processes token i = m + 1
and attends to i tokens; a chunk of c tokens on top of m starts at i = m + 1,
so i + c - 1 = m + c. Eq. 4 is used as printed: it counts the QKV projections,
two FFN matrices and the final projection, and no attention output projection.
Eq. 7 has no per-batch constant; ``overhead`` (default 0) adds the one that
seed 000's Fig. 5a shows in practice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kvsched.costmodel.base import BatchView
from kvsched.costmodel.features import DECODE
from kvsched.costmodel.presets import GpuSpec, ModelSpec


def _cdiv(a: np.ndarray | float, b: float) -> np.ndarray:
    return np.ceil(np.asarray(a, dtype=np.float64) / b)


@dataclass(frozen=True, slots=True)
class RadTiling:
    """Seed 000's Eq. 7 batch time. Defaults: Llama-2-7B on an A100-80GB (see :func:`rad_params`).

    Parameters
    ----------
    layers
        N.
    d, d_x, d_ff, d_out
        Q/K/V size, layer input size, FFN size, final projection rows (vocabulary).
    t_row, t_col, t_red
        GeMM tile; seed 000 gives 128 x 256 (or 256 x 128) with t_red = 32 as the A100 optimum.
    v_row, v_col
        GeMV tile (not given by the paper).
    gemm_tile_time
        g = 1/(s mu): seconds per GeMM tile-pair on the whole GPU.
    gemv_tile_time
        v = 1/mu(v_row, v_col): seconds per GeMV tile.
    nonlinear_time
        1/mu_nLin: seconds per token for the non-linear operations.
    overhead
        Per-batch constant (not in Eq. 7; default 0).
    """

    layers: float = 32
    d: float = 4096
    d_x: float = 4096
    d_ff: float = 11008
    d_out: float = 32000
    t_row: float = 128
    t_col: float = 256
    t_red: float = 32
    v_row: float = 128
    v_col: float = 128
    gemm_tile_time: float = 2 * 128 * 256 * 32 / 312e12
    gemv_tile_time: float = 2 * 128 * 128 / 2.039e12
    nonlinear_time: float = 32 * 2 * (10 * 4096 + 3 * 11008) / 2.039e12
    overhead: float = 0.0
    name: str = "rad"

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if key == "name":
                continue
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost model rad: {key} must be a finite number >= 0, got {value}")
        for key in ("layers", "d", "d_x", "d_ff", "d_out", "t_row", "t_col", "t_red", "v_row", "v_col"):
            if getattr(self, key) <= 0:
                raise ValueError(f"cost model rad: {key} must be > 0")

    @property
    def inv_mu_lin(self) -> float:
        """1/mu_Lin: time to push one column tile of t_col tokens through every linear layer (Eq. 4)."""
        n, d, dx, dff, dout = self.layers, self.d, self.d_x, self.d_ff, self.d_out
        tr, tk = self.t_row, self.t_red
        tiles = (
            3 * n * math.ceil(dx / tk) * math.ceil(d / tr)
            + n * math.ceil(d / tk) * math.ceil(dff / tr)
            + n * math.ceil(dff / tk) * math.ceil(dx / tr)
            + math.ceil(dx / tk) * math.ceil(dout / tr)
        )
        return self.gemm_tile_time * tiles

    def decode_sa(self, i: np.ndarray) -> np.ndarray:
        """T^{D,SA}(i) of Eq. 5 (one layer) for token indices ``i``."""
        d = self.d
        return self.gemv_tile_time * (
            math.ceil(d / self.v_col) * _cdiv(i, self.v_row)
            + _cdiv(i, self.v_col) * math.ceil(d / self.v_row)
        )

    def prefill_sa(self, i: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Eq. 6 without the factor N: one layer of a chunk of ``c`` tokens starting at index ``i``."""
        span = np.asarray(i, dtype=np.float64) + np.asarray(c, dtype=np.float64) - 1
        cols = _cdiv(c, self.t_col)
        d = self.d
        return self.gemm_tile_time * (
            _cdiv(span, self.t_row) * cols * math.ceil(d / self.t_red)
            + math.ceil(d / self.t_row) * cols * _cdiv(span, self.t_red)
        )

    def batch_time(self, view: BatchView) -> float:
        c = view.tokens.astype(np.float64)
        i = view.context.astype(np.float64) + 1.0  # 1-based index of the first token processed
        dec = view.phases == DECODE
        tau = float(c.sum())
        t = self.overhead + self.inv_mu_lin * math.ceil(tau / self.t_col) + self.nonlinear_time * tau
        if dec.any():
            t += self.layers * float(self.decode_sa(i[dec]).sum())
        pre = ~dec
        if pre.any():
            t += self.layers * float(self.prefill_sa(i[pre], c[pre]).sum())
        return t


def rad_params(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tile: tuple[int, int, int] = (128, 256, 32),
    gemv: tuple[int, int] = (128, 128),
) -> dict[str, float]:
    """RadTiling parameters derived from a model and a GPU description.

    The paper gives no rates (seed 000 digest, Sec. 5), so they are derived:
    a GeMM tile-pair does 2 t_row t_col t_red FLOPs at the GPU's peak; a GeMV
    tile reads 2 v_row v_col bytes at full bandwidth; the non-linear operations
    move about 10 hidden-size and 3 FFN-size vectors per token and layer.
    d is the query size, heads x head_dim.
    """
    t_row, t_col, t_red = tile
    v_row, v_col = gemv
    b = model.dtype_bytes
    return {
        "layers": float(model.layers),
        "d": float(model.heads * model.head_dim),
        "d_x": float(model.hidden),
        "d_ff": float(model.ffn),
        "d_out": float(model.vocab),
        "t_row": float(t_row),
        "t_col": float(t_col),
        "t_red": float(t_red),
        "v_row": float(v_row),
        "v_col": float(v_col),
        "gemm_tile_time": 2.0 * t_row * t_col * t_red / gpu.peak_flops,
        "gemv_tile_time": float(b * v_row * v_col) / gpu.mem_bw,
        "nonlinear_time": model.layers * b * (10 * model.hidden + 3 * model.ffn) / gpu.mem_bw,
    }
