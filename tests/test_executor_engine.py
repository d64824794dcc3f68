"""The engine's paths on CPU: every attention path gives exact tokens; bucketed decode buffers pad with no-ops.

The CUDA-graph capture itself runs only on a GPU; here the same static buffers,
buckets and padding run eagerly (``DecodeGraphs(capture=False)``). The Triton
path runs in Triton's interpreter and skips without triton.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Uniform, synthetic
from kvsched.instances.model import Limits, TimeModel
from tests.test_executor import instances, schedule_of

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    # Triton fixes its mode when it is first imported: the interpreter must be on before (CPU tensors).
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def model():
    from kvsched.executor.model import Decoder, decoder_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Decoder(decoder_config("tiny"))
    torch.set_num_threads(threads)


def test_buckets_are_vllms_capture_sizes():
    from kvsched.executor.graphs import CAPTURE_SIZES, bucket_for

    assert CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16) and CAPTURE_SIZES[-1] == 512
    assert [bucket_for(n) for n in (1, 3, 5, 9, 248, 249, 256, 257, 512, 513)] == [
        1,
        4,
        8,
        16,
        248,
        256,
        256,
        272,
        512,
        None,
    ]


def test_device_defaults_and_bad_options():
    from kvsched.executor.engine import engine_options

    cpu = engine_options(torch.device("cpu"))
    assert (cpu.attention, cpu.kernels.decode, cpu.kernels.prefill, cpu.graphs, cpu.compile) == (
        "paged",
        "torch",
        "torch",
        False,
        False,
    )
    assert not engine_options(torch.device("cpu"), attention="gather", graphs=True).graphs
    with pytest.raises(InputError, match="varlen attention runs on CUDA only"):
        engine_options(torch.device("cpu"), prefill="varlen")
    with pytest.raises(InputError, match="--tile a power of two"):
        engine_options(torch.device("cpu"), tile=48)
    with pytest.raises(InputError, match="--kv-partition must be a multiple of --tile"):
        engine_options(torch.device("cpu"), partition=96)
    with pytest.raises(InputError, match="give one"):
        engine_options(torch.device("cpu"), partition=512, splits=8)
    assert engine_options(torch.device("cpu"), partition=512).kernels.partition == 512
    with pytest.raises(InputError, match="--kernels: expected one of torch, triton"):
        engine_options(torch.device("cpu"), kernels="cuda")
    assert not cpu.mixed_graphs and engine_options(torch.device("cpu"), mixed_graphs=True).mixed_graphs
    if importlib.util.find_spec("triton") is not None:  # CUDA's defaults need only triton to be installed
        cuda = engine_options(torch.device("cuda"))
        assert (cuda.kernels.decode, cuda.kernels.prefill, cuda.graphs, cuda.compile, cuda.mixed_graphs) == (
            "triton",
            "varlen",
            True,
            True,
            True,
        )
        assert not engine_options(torch.device("cuda"), graphs=False).mixed_graphs  # the first engine's flags
        assert not engine_options(torch.device("cuda"), attention="gather").mixed_graphs
    with pytest.raises(InputError, match="--mixed-graphs needs --attention paged"):
        engine_options(torch.device("cpu"), attention="gather", mixed_graphs=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(InputError, match=r"TRITON_INTERPRET=1|pip install triton"):
            engine_options(torch.device("cpu"), kernels="triton")


def _options(path: str):
    from kvsched.executor.engine import EngineOptions
    from kvsched.executor.paged import AttentionKernels

    if path.startswith("triton"):
        pytest.importorskip("triton", reason="triton is not installed: pip install triton (Linux)")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the tiny model runs on CPU: its Triton path needs the interpreter (no GPU)")
        if path == "triton_partition":
            # The decode KV in partitions of one 32-key tile, in the bucket buffers (CUDA graphs on CUDA):
            # a grid of 2 partitions (the 64-slot table's), whatever the batch. Chunks through the reference.
            kernels = AttentionKernels("triton", "torch", partition=32, block_n=32)
            return EngineOptions(kernels=kernels, graphs=True, mixed_graphs=True)
        # Small tiles: the tiny model's sequences span several, and the decode splits.
        return EngineOptions(kernels=AttentionKernels("triton", "triton", splits=2, block_n=16, block_m=16))
    return {
        "gather": EngineOptions(attention="gather"),
        "graphs": EngineOptions(graphs=True),
        "mixed": EngineOptions(graphs=True, mixed_graphs=True),
        # torch's flash varlen call is CUDA-only: its torch stand-in checks the packing of the chunks' KV.
        "varlen": EngineOptions(kernels=AttentionKernels(prefill="varlen")),
    }[path]


@pytest.mark.parametrize("path", ["gather", "graphs", "mixed", "varlen", "triton"])
def test_every_path_gives_each_request_its_solo_tokens(model, path):
    from kvsched.executor.oracle import check_oracle
    from kvsched.executor.runner import replay_on_model

    if path == "triton":  # the interpreter runs a kernel program by program: a small instance
        instance, schedule = _small_instance(4, Uniform(3, 12), 8)
    else:
        instance, schedule = instances()["chunked"], schedule_of("sarathi", "chunked")
    repeat = 2 if path in ("graphs", "mixed") else 1
    result = replay_on_model(model, instance, schedule, warmup=0, repeat=repeat, options=_options(path))
    report = check_oracle(model, instance, result.prompts, result.generated)
    assert report.ok, report.summary()
    assert result.meta["engine"]["attention"] == ("gather" if path == "gather" else "paged")
    if path == "graphs":
        decode_only = sum(all(int(c) == 1 for c in b.tokens) for b in schedule.batches)
        assert result.meta["graphed_batches"] == decode_only > 0
        assert (result.table.measured_spread >= 0).all()  # the spread of each batch's two runs
    if path == "mixed":  # every batch of this small instance fits a decode or a mixed bucket
        assert result.meta["graphed_batches"] == len(schedule.batches)


def _small_instance(requests: int, prompt: Uniform, chunk: int, kv: int = 40):
    """Requests under Sarathi, with chunks as well as decodes: small enough for Triton's interpreter."""
    limits = Limits(kv_capacity=kv, block_size=1, max_prefill_tokens=chunk)
    instance = synthetic(requests, 5, limits, TimeModel("unit"), prompt=prompt, output=Uniform(1, 4))
    schedule = simulate(instance, make_policy("sarathi")).schedule
    assert any(len(set(b.tokens.tolist()) - {1}) for b in schedule.batches)  # chunks as well as decodes
    return instance, schedule


def test_kv_partitions_give_each_request_its_solo_tokens(model):
    """The decode KV split by length in the bucket buffers: every request's solo tokens."""
    from kvsched.executor.oracle import check_oracle
    from kvsched.executor.runner import replay_on_model

    instance, schedule = _small_instance(3, Uniform(28, 40), 32, kv=130)  # decodes over 1 or 2 partitions
    assert max(r.prompt + r.output for r in instance.requests) > 32
    result = replay_on_model(
        model, instance, schedule, warmup=0, repeat=1, options=_options("triton_partition")
    )
    report = check_oracle(model, instance, result.prompts, result.generated)
    assert report.ok, report.summary()
    assert result.meta["engine"]["kernels"]["partition"] == 32
    assert "in KV partitions of 32" in result.meta["attention"]
    assert result.meta["graphed_batches"] == len(schedule.batches)


def test_kv_partitions_follow_the_longest_sequence_or_the_buckets_width(model):
    """Eagerly, as many partitions as the batch's longest needs; in bucket buffers, as the table's width needs."""
    from kvsched.executor.graphs import DecodeGraphs
    from kvsched.executor.mixed_graphs import MixedGraphs
    from kvsched.executor.paged import AttentionKernels, InPlaceAttention, decode_splits, slot_table
    from kvsched.executor.runner import new_pool

    kernels = AttentionKernels("triton", "torch", partition=16, block_n=16)
    cpu = torch.device("cpu")
    assert [decode_splits(64, 2, k, kernels, cpu) for k in (0, 1, 16, 17, 70)] == [1, 1, 1, 2, 5]
    assert decode_splits(64, 2, 70, AttentionKernels(splits=3), cpu) == 3  # a fixed count, as before
    pool = new_pool(model, 300, 1)
    decodes = slot_table([np.arange(20), np.arange(20, 23)], [1, 1], 0, cpu)
    chunks = slot_table([], [], 2, cpu)
    assert InPlaceAttention(pool, decodes, chunks, kernels).splits == 2  # the longest has 20 keys
    seen = []
    graphs = DecodeGraphs(model, pool, kernels, width=64, capture=False)
    mixed = MixedGraphs(model, pool, kernels, width=64, capture=False)
    assert mixed.width == 2048 and mixed.decode_max == 64  # the chunks' width does not size the decode grid
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(InPlaceAttention, "__call__", lambda self, *a: seen.append(self.splits) or a[1])
        graphs.forward(8)
        mixed.forward((8, 16, 1))
    assert set(seen) == {4}


def test_padding_rows_change_neither_real_rows_nor_the_pool(model):
    from kvsched.executor.batch import ItemWork, plan_batch, run_batch
    from kvsched.executor.device import Timer
    from kvsched.executor.graphs import DecodeGraphs
    from kvsched.executor.paged import AttentionKernels
    from kvsched.executor.runner import new_pool

    rng = np.random.default_rng(0)
    contexts = [3, 17, 1, 30, 8]  # 5 decodes: bucket 8, 3 padding rows
    prompts = [rng.integers(0, 128, kv) for kv in contexts]
    pools = []
    for _ in range(2):  # the same cached KV in both pools
        pool = new_pool(model, 200, 1)
        for owner, ids in enumerate(prompts):
            run_batch(model, pool, plan_batch(pool, [ItemWork(owner, 0, ids, False)], model.device))
        pools.append(pool)
    new = rng.integers(0, 128, len(contexts))
    items = [ItemWork(i, kv, new[i : i + 1], True) for i, kv in enumerate(contexts)]
    eager_pool, graph_pool = pools
    eager = run_batch(model, eager_pool, plan_batch(eager_pool, items, model.device)).tolist()
    graphs = DecodeGraphs(model, graph_pool, AttentionKernels(), width=64, capture=False)
    plan = plan_batch(graph_pool, items, model.device)
    assert graphs.fits(plan) and graphs.load(plan) == 8
    tokens, _ = graphs.run(plan, Timer(model.device), repeat=2)
    assert tokens == eager
    scratch = graph_pool.scratch
    torch.testing.assert_close(graph_pool.k[:, :scratch], eager_pool.k[:, :scratch], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(graph_pool.v[:, :scratch], eager_pool.v[:, :scratch], rtol=1e-6, atol=1e-6)
    assert graph_pool.k[:, scratch].abs().sum() > 0  # the padding rows wrote there, and only there
    assert eager_pool.k[:, scratch].abs().sum() == 0
    # A batch with a chunk, or longer than the table, runs eagerly.
    longer = DecodeGraphs(model, graph_pool, AttentionKernels(), width=16, capture=False)
    assert not longer.fits(plan)


def test_fused_small_ops_compute_the_unfused_operators():
    from kvsched.executor.fused import SmallOps, add_rms_norm, rms_norm, silu_mul

    gen = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(5, 8, generator=gen) for _ in range(3))
    h, stream = add_rms_norm(x, r, w[0], 1e-5)
    assert torch.equal(stream, x + r) and torch.equal(h, rms_norm(x + r, w[0], 1e-5))
    gu = torch.randn(5, 8, generator=gen)
    assert torch.equal(silu_mul(gu), torch.nn.functional.silu(gu[:, :4]) * gu[:, 4:])
    assert not SmallOps().compiled_  # eager unless asked: CPU tests never compile


def test_compiled_operators_go_to_the_graphs_and_eager_batches_keep_their_own():
    from kvsched.executor.batch import ItemWork
    from kvsched.executor.engine import Engine, EngineOptions
    from kvsched.executor.fused import EAGER, SmallOps
    from kvsched.executor.graphs import DecodeGraphs
    from kvsched.executor.model import Decoder, decoder_config
    from kvsched.executor.paged import AttentionKernels
    from kvsched.executor.runner import new_pool

    model = Decoder(decoder_config("tiny"))  # its own: the module's model must keep its operators
    pool = new_pool(model, 64, 1)
    # With graphs, only the graphs get the compiled operators (torch.compile is lazy: nothing compiles here).
    engine = Engine(model, pool, EngineOptions(graphs=True, compile=True), 32)
    assert model.ops is EAGER and engine.graphs is not None and engine.graphs.ops is SmallOps.compiled()
    # Without graphs, every batch runs them.
    Engine(model, pool, EngineOptions(graphs=False, compile=True), 32)
    assert model.ops is SmallOps.compiled()
    model.use_ops(EAGER)

    # The buffers run with their operators and hand the model back its own.
    calls = []

    def counted(fn):
        def run(*args):
            calls.append(fn.__name__)
            return fn(*args)

        return run

    recording = SmallOps(
        *(counted(f) for f in (EAGER.add_rms_norm, EAGER.rms_norm, EAGER.rope_qk, EAGER.silu_mul))
    )
    graphs = DecodeGraphs(model, pool, AttentionKernels(), width=32, capture=False, ops=recording)
    engine = Engine(model, pool, EngineOptions(), 32)
    prompt = engine.plan([ItemWork(0, 0, np.arange(5), True)])
    engine.step(prompt)
    assert calls == []  # the eager batch ran the model's own operators
    decode = engine.plan([ItemWork(0, 5, np.array([7]), True)])
    assert graphs.fits(decode)
    graphs.run(decode, engine.timer, repeat=1)
    assert {"add_rms_norm", "rope_qk", "silu_mul", "rms_norm"} <= set(calls)
    assert model.ops is EAGER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device synchronisation: GPU only")
@pytest.mark.parametrize("prefill", ["varlen", "triton"])
def test_a_mixed_batch_never_waits_for_the_gpu(prefill):
    # A batch outside the graphs is launched from the host; any read of a device value in its forward pass
    # (as SlotTable.rows once was, in every layer) makes the host wait for the GPU, adding the two times.
    from kvsched.executor.batch import ItemWork, run_batch
    from kvsched.executor.engine import Engine, engine_options
    from kvsched.executor.model import Decoder, decoder_config
    from kvsched.executor.runner import new_pool

    cuda = torch.device("cuda")
    model = Decoder(decoder_config("tiny", dtype="bfloat16"), cuda)
    options = engine_options(cuda, prefill=prefill)
    pool = new_pool(model, 256, 1)
    engine = Engine(model, pool, options, 64)
    engine.step(engine.plan([ItemWork(0, 0, np.arange(9), True)]))
    mixed = engine.plan([ItemWork(0, 9, np.array([3]), True), ItemWork(1, 0, np.arange(20), True)])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = run_batch(model, pool, mixed, options.kernels)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (2,)


def test_mixed_buckets():
    from kvsched.executor.batch import ItemWork, plan_batch
    from kvsched.executor.mixed_graphs import MixedGraphs
    from kvsched.executor.model import Decoder, decoder_config
    from kvsched.executor.paged import AttentionKernels
    from kvsched.executor.runner import new_pool

    model = Decoder(decoder_config("tiny"))
    pool = new_pool(model, 4000, 1)
    graphs = MixedGraphs(model, pool, AttentionKernels(), width=64, capture=False)

    def plan(decodes: int, chunks: list[int]):
        items = [ItemWork(i, 0, np.array([1]), True) for i in range(decodes)]
        items += [ItemWork(100 + i, 0, np.ones(c, dtype=np.int64), True) for i, c in enumerate(chunks)]
        pool.reset()
        return plan_batch(pool, items, model.device)

    assert graphs.bucket(plan(3, [20])) == (4, 32, 2)  # 12 padding rows: a padding sequence
    assert graphs.bucket(plan(0, [16])) == (0, 16, 1)  # exactly a bucket: no padding sequence
    assert graphs.bucket(plan(9, [8, 8])) == (16, 16, 2)
    assert graphs.bucket(plan(1, [2] * 8)) == (1, 16, 8)  # 8 chunks, no padding rows
    assert graphs.bucket(plan(1, [3] * 8)) == (1, 32, 16)  # 8 chunks and 8 padding rows: a 9th sequence
    assert graphs.bucket(plan(0, [2] * 64)) == (0, 128, 64)  # 64 chunks, no padding rows
    assert graphs.bucket(plan(0, [2] * 63)) == (0, 128, 64)  # 63 and the padding sequence
    assert graphs.bucket(plan(0, [2] * 65)) is None  # more chunks than the largest bucket
    assert graphs.bucket(plan(2, [])) is None  # decode-only: the decode graphs' batches
    assert graphs.bucket(plan(1, [2049])) is None  # more rows than the largest bucket


def test_mixed_padding_changes_neither_real_rows_nor_the_pool(model):
    from kvsched.executor.batch import ItemWork, plan_batch, run_batch
    from kvsched.executor.device import Timer
    from kvsched.executor.mixed_graphs import MixedGraphs
    from kvsched.executor.paged import AttentionKernels
    from kvsched.executor.runner import new_pool

    rng = np.random.default_rng(1)
    contexts = [3, 17, 30]  # 3 decodes: bucket 4
    prompts = [rng.integers(0, 128, kv) for kv in contexts]
    pools = []
    for _ in range(2):  # the same cached KV in both pools, and a prompt half done
        pool = new_pool(model, 300, 1)
        for owner, ids in enumerate(prompts):
            run_batch(model, pool, plan_batch(pool, [ItemWork(owner, 0, ids, False)], model.device))
        run_batch(model, pool, plan_batch(pool, [ItemWork(5, 0, np.arange(6), False)], model.device))
        pools.append(pool)
    new = rng.integers(0, 128, len(contexts))
    items = [ItemWork(i, kv, new[i : i + 1], True) for i, kv in enumerate(contexts)]
    items.append(ItemWork(5, 6, np.arange(6, 13), True))  # the rest of a prompt: sampled
    items.append(ItemWork(6, 0, np.arange(5), False))  # the first chunk of another: not sampled
    eager_pool, graph_pool = pools
    eager = run_batch(model, eager_pool, plan_batch(eager_pool, items, model.device)).tolist()
    graphs = MixedGraphs(model, graph_pool, AttentionKernels(), width=64, capture=False)
    plan = plan_batch(graph_pool, items, model.device)
    assert graphs.bucket(plan) == (4, 16, 4)  # 12 chunk rows: 4 padding rows, a third sequence
    tokens, _ = graphs.run(plan, Timer(model.device), repeat=2)
    assert tokens == eager and len(tokens) == 4
    scratch = graph_pool.scratch
    torch.testing.assert_close(graph_pool.k[:, :scratch], eager_pool.k[:, :scratch], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(graph_pool.v[:, :scratch], eager_pool.v[:, :scratch], rtol=1e-6, atol=1e-6)
    assert graph_pool.k[:, scratch].abs().sum() > 0  # the padding wrote there, and only there


def test_mixed_bucket_of_many_chunks_gives_the_eager_tokens(model):
    """Twelve chunks (a bucket of 16 sequences, three of them empty) sample what the eager batch samples."""
    from kvsched.executor.batch import ItemWork, plan_batch, run_batch
    from kvsched.executor.device import Timer
    from kvsched.executor.mixed_graphs import MixedGraphs
    from kvsched.executor.paged import AttentionKernels
    from kvsched.executor.runner import new_pool

    rng = np.random.default_rng(2)
    items = [ItemWork(i, 0, rng.integers(0, 128, 2 + i % 5), True) for i in range(12)]
    eager_pool, graph_pool = new_pool(model, 300, 1), new_pool(model, 300, 1)
    eager = run_batch(model, eager_pool, plan_batch(eager_pool, items, model.device)).tolist()
    graphs = MixedGraphs(model, graph_pool, AttentionKernels(), width=64, capture=False)
    plan = plan_batch(graph_pool, items, model.device)
    assert graphs.bucket(plan) == (0, 64, 16)  # 45 rows: a padding sequence of 19
    tokens, _ = graphs.run(plan, Timer(model.device), repeat=1)
    assert tokens == eager and len(tokens) == 12
    scratch = graph_pool.scratch
    torch.testing.assert_close(graph_pool.k[:, :scratch], eager_pool.k[:, :scratch], rtol=1e-6, atol=1e-6)
