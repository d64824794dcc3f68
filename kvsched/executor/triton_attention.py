"""Triton attention kernels that read the KV pool in place, through per-sequence slot tables.

The pool is token-granular (block size 1 in the shipped instances), so a
sequence's KV is a list of slots, not of pages: a kernel loads each tile's slot
numbers from the sequence's row of a slot table and then the K and V rows at
those slots. Nothing is gathered into a padded copy, so the KV is read once,
as vLLM's paged kernels read it.

* :func:`decode_attention` -- one query token per sequence (flash-decoding):
  one program per (sequence, KV head, KV split); the query heads that share a
  KV head are one tile, so grouped-query attention reads each KV row once.
  KV splits come in two kinds. By count (``partition=0``): each sequence's KV
  in ``splits`` equal parts, each writing a partial result merged by
  :func:`merge_partitions`. By length (``partition=P``, as vLLM's v2 paged
  attention): fixed partitions of P keys, so a sequence of length L has
  ceil(L / P) programs and one of at most P keys one, which writes its output
  directly; programs past a sequence's last partition read and write nothing,
  and :func:`merge_partitions` combines only the partitions a sequence has.
* :func:`prefill_attention` -- chunks of several tokens over their cached KV
  plus themselves (varlen, causal from the lower right: token j of a chunk of c
  over a sequence of L keys sees keys 0 .. L - c + j).

Shapes: q and out (T, heads, d); the pool's K and V of one layer (slots,
kv_heads, d); slot tables (n, width) int32; lengths (n,) int32 = keys each
sequence has, the new tokens included (their KV is written before attention).
A sequence of length 0 (a padding row of a CUDA graph bucket) gets zeros.

This module is imported only when the Triton kernels are used. On CPU tensors
they run in Triton's interpreter, which must be switched on before this module
is imported (``TRITON_INTERPRET=1``); the tests do that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_normalised(Row, heads, stride_qh, d, acc, l_i, mask):
    """Write one sequence's finished heads: the accumulator over its softmax sum (0 where nothing was read)."""
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Row + heads[:, None] * stride_qh + d[None, :], out.to(Row.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _decode_kernel(
    Q,
    K,
    V,
    Table,
    Lens,
    Out,
    Part,
    Mx,
    Sm,
    stride_qn,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_tn,
    scale,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    SPLITS: tl.constexpr,
    PARTITION: tl.constexpr,
    PREC: tl.constexpr,
):
    i = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(Lens + i)
    if PARTITION > 0:  # noqa: SIM108 (a static if: Triton compiles only the taken branch)
        per = PARTITION
    else:
        per = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    lo = s * per
    hi = tl.minimum(lo + per, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = hk * GROUP + g
    gmask = g < GROUP
    q = tl.load(Q + i * stride_qn + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        valid = n < hi
        slot = tl.load(Table + i * stride_tn + n, mask=valid, other=0).to(tl.int64)
        kv_off = slot[:, None] * stride_ks + hk * stride_kh + d[None, :]
        k = tl.load(K + kv_off, mask=valid[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        sc = tl.where(valid[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_off, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    if SPLITS == 1:
        _store_normalised(Out + i * stride_qn, heads, stride_qh, d, acc, l_i, gmask)
    else:
        keep = gmask
        if PARTITION > 0:
            # A sequence of one partition (or none) is written whole here, and the merge skips it;
            # a program past a sequence's last partition writes nothing, and the merge reads nothing there.
            # (Masks as g < a count: Triton's interpreter turns a vector & a scalar into int32.)
            whole = (length <= PARTITION) & (s == 0)
            _store_normalised(
                Out + i * stride_qn, heads, stride_qh, d, acc, l_i, g < tl.where(whole, GROUP, 0)
            )
            keep = g < tl.where((length > PARTITION) & (lo < length), GROUP, 0)
        # Partials (n, heads, SPLITS, D) and (n, heads, SPLITS), contiguous.
        row = (i * GROUP * tl.num_programs(1) + heads) * SPLITS + s
        tl.store(Part + row[:, None] * D + d[None, :], acc, mask=keep[:, None])
        tl.store(Mx + row, m_i, mask=keep)
        tl.store(Sm + row, l_i, mask=keep)


@triton.jit
def _merge_kernel(
    Part,
    Mx,
    Sm,
    Lens,
    Out,
    stride_on,
    stride_oh,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    D: tl.constexpr,
    PARTITION: tl.constexpr,
):
    # One program per (sequence, query head). By length (PARTITION > 0): the ceil(length / PARTITION)
    # partials of a sequence of several partitions; a sequence of one was written by the decode kernel and
    # is left alone. By count (PARTITION = 0): every sequence's SPLITS partials, each written.
    i = tl.program_id(0)
    h = tl.program_id(1)
    length = tl.load(Lens + i)
    if PARTITION > 0:  # a static if: Triton compiles only the taken branch
        parts = tl.minimum(tl.cdiv(length, PARTITION), SPLITS)
    else:
        parts = tl.where(length >= 0, SPLITS, 0)  # every sequence (as a tensor, like the other branch)
    several = parts > 1
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    smask = s < tl.where(several, parts, 0)
    row = (i * tl.num_programs(1) + h) * SPLITS + s
    mx = tl.load(Mx + row, mask=smask, other=float("-inf"))
    sm = tl.load(Sm + row, mask=smask, other=0.0)
    # A split with no keys has max -inf: weight 0. Where none has keys (length 0 split by count, or
    # nothing read), the max is taken as 0, so that the weights are 0 and not NaN (the output is 0).
    top = tl.max(mx, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(mx - top)
    part = tl.load(Part + row[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    num = tl.sum(part * w[:, None], 0)
    den = tl.sum(sm * w, 0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(
        Out + i * stride_on + h * stride_oh + d,
        out.to(Out.dtype.element_ty),
        mask=d < tl.where(several, D, 0),
    )


@triton.jit
def _prefill_kernel(
    Q,
    K,
    V,
    Table,
    Lens,
    CuQ,
    Out,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_tn,
    scale,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    PREC: tl.constexpr,
):
    i = tl.program_id(0)
    mb = tl.program_id(1)
    h = tl.program_id(2)
    hk = h // GROUP
    q0 = tl.load(CuQ + i)
    c = tl.load(CuQ + i + 1) - q0
    length = tl.load(Lens + i)
    past = length - c
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < c
    d = tl.arange(0, D)
    q_off = (q0 + rows)[:, None] * stride_qt + h * stride_qh + d[None, :]
    q = tl.load(Q + q_off, mask=rmask[:, None], other=0.0)
    # Keys the block's last real row sees; none when the block is past the chunk.
    hi = tl.where(mb * BLOCK_M < c, past + tl.minimum(c, (mb + 1) * BLOCK_M), 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        valid = n < hi
        slot = tl.load(Table + i * stride_tn + n, mask=valid, other=0).to(tl.int64)
        kv_off = slot[:, None] * stride_ks + hk * stride_kh + d[None, :]
        k = tl.load(K + kv_off, mask=valid[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        seen = valid[None, :] & (n[None, :] <= past + rows[:, None])
        sc = tl.where(seen, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        # Rows past the chunk may see nothing in a tile: keep their state finite.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(sc - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_off, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + q_off, out.to(Out.dtype.element_ty), mask=rmask[:, None])


def _precision(dtype: torch.dtype) -> str:
    # float32 runs must stay float32 (the oracle is exact there); tf32 would round the products.
    return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    *,
    splits: int = 1,
    partition: int = 0,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """Attention of one query token per sequence over its slots (see the module docstring).

    With ``partition`` P > 0 (a multiple of ``block_n``) the KV splits by length: ``splits`` programs
    per sequence and KV head, each over P keys, where ``splits`` × P must cover the longest sequence
    (more is allowed: the programs past a sequence's partitions do nothing, which keeps a CUDA graph's
    grid fixed). With P = 0, each sequence's KV splits into ``splits`` equal parts.
    """
    assert partition % block_n == 0, "a KV partition is a whole number of tiles"
    n, heads, dim = q.shape
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    out = torch.empty_like(q)
    if n == 0:
        return out
    block_g = max(16, triton.next_power_of_2(group))
    f32 = torch.float32
    part = torch.empty((n, heads, splits, dim), dtype=f32, device=q.device) if splits > 1 else out
    mx = torch.empty((n, heads, splits), dtype=f32, device=q.device) if splits > 1 else out
    sm = torch.empty((n, heads, splits), dtype=f32, device=q.device) if splits > 1 else out
    _decode_kernel[(n, kv_heads, splits)](
        q,
        k_pool,
        v_pool,
        table,
        lens,
        out,
        part,
        mx,
        sm,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        table.stride(0),
        dim**-0.5,
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        D=dim,
        SPLITS=splits,
        PARTITION=partition,
        PREC=_precision(q.dtype),
        num_warps=num_warps,
    )
    if splits > 1:
        merge_partitions(part, mx, sm, lens, out, partition)
    return out


def merge_partitions(
    part: torch.Tensor,
    mx: torch.Tensor,
    sm: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    partition: int,
) -> None:
    """Write into ``out`` (n, heads, d) the merged split-KV partials: ``part`` (n, heads, S, d), running max
    ``mx`` and sum ``sm`` (n, heads, S), float32.

    With ``partition`` P > 0, only sequences of more than P keys: a sequence's partials past
    ceil(length / P) are not read (the decode kernel did not write them), and a sequence of one
    partition keeps what the kernel wrote. With P = 0 (splits by count), every sequence's S partials.
    """
    n, heads, splits, dim = part.shape
    _merge_kernel[(n, heads)](
        part,
        mx,
        sm,
        lens,
        out,
        out.stride(0),
        out.stride(1),
        SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits),
        D=dim,
        PARTITION=partition,
    )


def prefill_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    cu_q: torch.Tensor,
    max_q: int,
    *,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """Causal attention of packed chunks (rows ``cu_q[i] .. cu_q[i+1]-1``) over their slots."""
    t, heads, dim = q.shape
    kv_heads = k_pool.shape[1]
    out = torch.empty_like(q)
    n = table.shape[0]
    if t == 0 or n == 0:
        return out
    _prefill_kernel[(n, triton.cdiv(max_q, block_m), heads)](
        q,
        k_pool,
        v_pool,
        table,
        lens,
        cu_q,
        out,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        table.stride(0),
        dim**-0.5,
        GROUP=heads // kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        D=dim,
        PREC=_precision(q.dtype),
        num_warps=num_warps,
    )
    return out
