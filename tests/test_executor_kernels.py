"""The in-place attention: torch references against plain attention, Triton kernels against the references.

The Triton kernels run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``,
set here before the kernels' module is imported); without triton those tests
skip with the reason. Sizes are tiny: the interpreter runs a kernel program by program.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    # Triton fixes its mode when it is first imported: the interpreter must be on before (CPU tensors).
    os.environ.setdefault("TRITON_INTERPRET", "1")
#: Where the kernels run: the GPU when there is one, else the interpreter on CPU tensors.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _triton():
    """The kernels' module, in the interpreter on CPU (skips without triton)."""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton (Linux)")
    from kvsched.executor import triton_attention

    return triton_attention


def _pool(slots: int, kv_heads: int, dim: int, seed: int = 0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, kv_heads, dim, generator=gen)
    v = torch.randn(slots, kv_heads, dim, generator=gen)
    return k.to(device), v.to(device)


def _sequences(lens: list[int], slots: int, seed: int = 1) -> list[np.ndarray]:
    """Disjoint, shuffled slots for sequences of these lengths (a fragmented pool)."""
    perm = np.random.default_rng(seed).permutation(slots)
    out, at = [], 0
    for n in lens:
        out.append(perm[at : at + n].astype(np.int64))
        at += n
    return out


def _plain(q, k, v, past: int):
    """Attention of c queries (c, heads, d) over L keys (L, kv_heads, d), token j seeing keys 0 .. past + j."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("chd,lhd->hcl", q, k) * q.shape[-1] ** -0.5
    j = torch.arange(q.shape[0])[:, None]
    s = s.masked_fill(torch.arange(k.shape[0])[None, :] > past + j, float("-inf"))
    return torch.einsum("hcl,lhd->chd", s.softmax(-1), v)


HEADS = [(4, 2), (2, 2), (8, 1)]  # (query heads, KV heads): GQA, MHA, MQA


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS)
def test_references_equal_plain_attention(heads, kv_heads):
    from kvsched.executor.paged import decode_reference, prefill_reference, slot_table, varlen_reference

    dim, slots = 16, 200
    kp, vp = _pool(slots, kv_heads, dim, device="cpu")
    lens, chunks = [5, 40, 1, 17], [5, 3, 1, 17]
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, chunks, 0, torch.device("cpu"))
    q = torch.randn(sum(chunks), heads, dim)
    want = torch.cat(
        [
            _plain(q[st.cu_q[i] : st.cu_q[i + 1]], kp[s], vp[s], s.size - c)
            for i, (s, c) in enumerate(zip(seqs, chunks, strict=True))
        ]
    )
    got = prefill_reference(q, kp, vp, st.table, st.lens, st.cu_q, st.max_q)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    packed = varlen_reference(q, kp[st.packed], vp[st.packed], st.cu_q, st.cu_k, st.max_q, st.max_k)
    torch.testing.assert_close(packed, want, rtol=1e-5, atol=1e-5)
    # Decodes: the last token of each sequence; a length-0 row (graph padding) gives zeros.
    dec = slot_table(seqs, [1] * len(seqs), 0, torch.device("cpu"))
    qd = torch.randn(len(seqs), heads, dim)
    want = torch.cat([_plain(qd[i : i + 1], kp[s], vp[s], s.size - 1) for i, s in enumerate(seqs)])
    torch.testing.assert_close(decode_reference(qd, kp, vp, dec.table, dec.lens), want, rtol=1e-5, atol=1e-5)
    zero = decode_reference(qd, kp, vp, dec.table, torch.zeros_like(dec.lens))
    assert torch.equal(zero, torch.zeros_like(zero))


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS)
@pytest.mark.parametrize("splits", [1, 3])
def test_triton_decode_equals_the_reference(heads, kv_heads, splits):
    ta = _triton()
    from kvsched.executor.paged import decode_reference, slot_table

    dim, slots = 16, 300
    kp, vp = _pool(slots, kv_heads, dim)
    lens = [1, 37, 70, 16, 0]  # a length-0 row: graph padding
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, [1] * len(lens), 0, DEVICE)
    q = torch.randn(len(lens), heads, dim).to(DEVICE)
    got = ta.decode_attention(q, kp, vp, st.table, st.lens, splits=splits, block_n=16)
    want = decode_reference(q, kp, vp, st.table, st.lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))


# GQA with a graph bucket's static grid (8 partitions of 16, where this batch needs 5), MHA with just enough
@pytest.mark.parametrize(("heads", "kv_heads", "partition", "splits"), [(4, 2, 16, 8), (2, 2, 32, 3)])
def test_triton_decode_in_partitions_equals_the_reference(heads, kv_heads, partition, splits):
    """KV split by length: short sequences in one partition, long ones in several, merged; extra programs idle."""
    ta = _triton()
    from kvsched.executor.paged import decode_reference, slot_table

    dim, slots = 16, 300
    kp, vp = _pool(slots, kv_heads, dim, seed=partition + splits)
    # length 0 (graph padding), < P, = P, P + 1, several P, not a multiple: 70 keys need 5 partitions of 16
    lens = [0, 5, 16, 17, 48, 70, 1, 33]
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, [1] * len(lens), 0, DEVICE)
    q = torch.randn(len(lens), heads, dim).to(DEVICE)
    got = ta.decode_attention(q, kp, vp, st.table, st.lens, splits=splits, partition=partition, block_n=16)
    want = decode_reference(q, kp, vp, st.table, st.lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    # A batch whose sequences all fit one partition runs as one split: the kernel writes the output itself.
    short = slot_table(seqs[:3] + seqs[6:7], [1] * 4, 0, DEVICE)
    got = ta.decode_attention(
        q[:4], kp, vp, short.table, short.lens, splits=1, partition=partition, block_n=16
    )
    torch.testing.assert_close(
        got, decode_reference(q[:4], kp, vp, short.table, short.lens), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS[:2])
def test_triton_prefill_equals_the_reference(heads, kv_heads):
    ta = _triton()
    from kvsched.executor.paged import prefill_reference, slot_table

    dim, slots = 16, 300
    kp, vp = _pool(slots, kv_heads, dim)
    # a whole prompt, a chunk over 27 cached, a short chunk, and an empty chunk last (it starts past q's end)
    lens, chunks = [20, 45, 3, 6], [20, 18, 2, 0]
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, chunks, 0, DEVICE)
    q = torch.randn(sum(chunks), heads, dim).to(DEVICE)
    got = ta.prefill_attention(q, kp, vp, st.table, st.lens, st.cu_q, st.max_q, block_m=16, block_n=16)
    want = prefill_reference(q, kp, vp, st.table, st.lens, st.cu_q, st.max_q)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="bfloat16 kernels at the engine's tile sizes: GPU only"
)
@pytest.mark.parametrize(("heads", "kv_heads"), [(32, 32), (32, 8)])  # Llama-2-7B and Llama-3-8B heads
def test_triton_kernels_in_bfloat16_at_engine_tiles(heads, kv_heads):
    ta = _triton()
    from kvsched.executor.paged import decode_reference, prefill_reference, slot_table

    dim, slots = 128, 20_000
    kp, vp = (t.bfloat16() for t in _pool(slots, kv_heads, dim))
    lens = [1, 300, 4000, 77, 2049, 0]
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, [1] * len(lens), 0, DEVICE)
    q = torch.randn(len(lens), heads, dim).to(DEVICE).bfloat16()
    want = decode_reference(q.float(), kp.float(), vp.float(), st.table, st.lens)
    for splits, partition in ((1, 0), (8, 0), (8, 512), (12, 512)):  # 12: a grid wider than the batch
        got = ta.decode_attention(q, kp, vp, st.table, st.lens, splits=splits, partition=partition)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    chunks = [1, 256, 512, 77, 1000, 0]
    pre = slot_table(seqs, chunks, 0, DEVICE)
    qp = torch.randn(sum(chunks), heads, dim).to(DEVICE).bfloat16()
    want = prefill_reference(qp.float(), kp.float(), vp.float(), pre.table, pre.lens, pre.cu_q, pre.max_q)
    got = ta.prefill_attention(qp, kp, vp, pre.table, pre.lens, pre.cu_q, pre.max_q)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
