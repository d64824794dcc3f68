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


def _triton():
    """The kernels' module, in the interpreter on CPU (skips without triton)."""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton (Linux)")
    from kvsched.executor import triton_attention

    return triton_attention


def _pool(slots: int, kv_heads: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, kv_heads, dim, generator=gen)
    v = torch.randn(slots, kv_heads, dim, generator=gen)
    return k, v


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
    kp, vp = _pool(slots, kv_heads, dim)
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
    st = slot_table(seqs, [1] * len(lens), 0, torch.device("cpu"))
    q = torch.randn(len(lens), heads, dim)
    got = ta.decode_attention(q, kp, vp, st.table, st.lens, splits=splits, block_n=16)
    want = decode_reference(q, kp, vp, st.table, st.lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS[:2])
def test_triton_prefill_equals_the_reference(heads, kv_heads):
    ta = _triton()
    from kvsched.executor.paged import prefill_reference, slot_table

    dim, slots = 16, 300
    kp, vp = _pool(slots, kv_heads, dim)
    lens, chunks = [20, 45, 3], [20, 18, 2]  # a whole prompt, a chunk over 27 cached, a short chunk
    seqs = _sequences(lens, slots)
    st = slot_table(seqs, chunks, 0, torch.device("cpu"))
    q = torch.randn(sum(chunks), heads, dim)
    got = ta.prefill_attention(q, kp, vp, st.table, st.lens, st.cu_q, st.max_q, block_m=16, block_n=16)
    want = prefill_reference(q, kp, vp, st.table, st.lens, st.cu_q, st.max_q)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
