"""The PyTorch executor on CPU: oracle, KV pool, replay table, profiling tables, calibration from replays.

Everything runs the ``tiny`` preset in float32 with one CPU thread. Tests that
need torch take the ``torch`` fixture (skipped without it); the replay-table
fit and the missing-torch message run without torch.
"""

from __future__ import annotations

import json
import sys
from functools import cache

import numpy as np
import pandas as pd
import pytest

from kvsched.cli import main
from kvsched.costmodel.base import BatchView
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.executor.measure import FEATURES, REPLAY_COLUMNS, batch_row, end_to_end, retime, write_replay
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.io import save_instance
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import ScheduleError
from kvsched.schedule.io import save_schedule
from kvsched.schedule.ir import Batch, Phase, Schedule
from kvsched.schedule.validate import replay

LINEAR = TimeModel("infermax-linear")
UNIT = TimeModel("unit")


@cache
def instances() -> dict[str, Instance]:
    return {
        # P = 8 under prompts of 5..20: chunked prefill; M = 48 in blocks of 4: evictions and refills.
        "chunked": synthetic(
            16,
            3,
            Limits(kv_capacity=48, block_size=4, max_prefill_tokens=8),
            LINEAR,
            prompt=Uniform(5, 20),
            output=Uniform(1, 16),
        ),
        # Whole prompts, M = 24 in blocks of 2: evictions for the engines that preempt.
        "tight": synthetic(
            14, 3, Limits(kv_capacity=24, block_size=2), LINEAR, prompt=Uniform(1, 10), output=Uniform(1, 12)
        ),
        # Arrivals spread over time, unit time.
        "arrivals": synthetic(
            14,
            4,
            Limits(kv_capacity=24),
            UNIT,
            arrival=Poisson(0.5),
            tick=1.0,
            prompt=Uniform(1, 10),
            output=Uniform(1, 12),
        ),
    }


@cache
def schedule_of(policy: str, kind: str) -> Schedule:
    return simulate(instances()[kind], make_policy(policy)).schedule


@pytest.fixture(scope="module")
def model(torch):
    from kvsched.executor.model import Decoder, decoder_config

    return Decoder(decoder_config("tiny"))


def run(model, instance: Instance, schedule: Schedule, **kw):
    from kvsched.executor.runner import replay_on_model

    return replay_on_model(model, instance, schedule, warmup=0, **kw)


def oracle(model, instance: Instance, result):
    from kvsched.executor.oracle import check_oracle

    return check_oracle(model, instance, result.prompts, result.generated)


# ---------------------------------------------------------------- the oracle
CASES = [
    # (policy, instance, what the schedule must exercise)
    ("sarathi", "chunked", {"chunks", "evictions"}),
    ("sarathi-ef", "chunked", {"chunks"}),
    ("kfcfs", "chunked", {"chunks", "evictions"}),
    ("orca", "chunked", {"chunks"}),
    ("vllm", "tight", {"evictions"}),
    ("vllm-ef", "tight", set()),
    ("fastertransformer", "tight", set()),
    ("mcsf", "tight", set()),
    ("sarathi", "arrivals", {"evictions"}),
]


@pytest.mark.parametrize(("policy", "kind", "covers"), CASES, ids=[f"{p}-{k}" for p, k, _ in CASES])
def test_tokens_equal_each_request_run_alone(model, policy, kind, covers):
    instance, schedule = instances()[kind], schedule_of(policy, kind)
    result = run(model, instance, schedule)
    table = result.table
    # The schedule really does what this case is about.
    if "chunks" in covers:  # a prefill or refill chunk on top of KV it already holds
        assert ((table.n_prefill > 0) & (table.prefill_kv > 0)).any()
    if "evictions" in covers:
        assert table.num_evicted.sum() > 0
        assert any((b.phases == Phase.REFILL).any() for b in schedule.batches)
    assert [len(g) for g in result.generated] == [r.output for r in instance.requests]
    report = oracle(model, instance, result)
    assert report.ok, report.summary()
    assert report.tokens == sum(r.output for r in instance.requests)


def test_chunk_groups_give_the_same_tokens(model, monkeypatch):
    """However the gather path groups a batch's multi-token chunks into attention calls, the tokens are exact."""
    from kvsched.executor import batch, gather
    from kvsched.executor.engine import EngineOptions

    seen: list[tuple[int, int]] = []  # (groups, chunks) per batch with chunks
    plan = batch.plan_batch

    def counting(*args, **kw):
        out = plan(*args, **kw)
        chunks = [g for g in out.groups if g.rows.shape[1] > 1]
        if chunks:
            seen.append((len(chunks), sum(g.rows.shape[0] for g in chunks)))
        return out

    monkeypatch.setattr("kvsched.executor.engine.plan_batch", counting)
    # Prompts of very different lengths prefilled together, so the default grouping splits some batches.
    instance = synthetic(12, 4, Limits(kv_capacity=4000), UNIT, prompt=Uniform(2, 300), output=Uniform(1, 4))
    schedule = simulate(instance, make_policy("vllm")).schedule
    counts = {}
    for slack in (-(1 << 40), gather.GROUP_SLACK, 1 << 40):  # every chunk alone, the default, one group
        monkeypatch.setattr(gather, "GROUP_SLACK", slack)
        seen.clear()
        result = run(model, instance, schedule, options=EngineOptions(attention="gather"))
        report = oracle(model, instance, result)
        assert report.ok, report.summary()
        counts[slack] = sum(g for g, _ in seen)
        chunks = sum(c for _, c in seen)
    alone, default, merged = counts.values()
    assert alone == chunks and merged == len(seen)
    assert alone > default > merged


def test_tokens_equal_on_an_exact_solver_schedule(model):
    from kvsched.csp import solve

    instance = synthetic(5, 2, Limits(kv_capacity=12), UNIT, prompt=Uniform(2, 6), output=Uniform(1, 5))
    schedule = solve(instance, formulation="time").schedule
    report = oracle(model, instance, run(model, instance, schedule))
    assert report.ok, report.summary()


def test_oracle_catches_a_cache_that_loses_kv(model, monkeypatch):
    from kvsched.executor.kvcache import KVPool

    write = KVPool.write

    def forgetful(self, layer, slots, k, v):  # the second layer's cache is never written
        if layer == 0:
            write(self, layer, slots, k, v)

    monkeypatch.setattr(KVPool, "write", forgetful)
    instance = instances()["chunked"]
    report = oracle(model, instance, run(model, instance, schedule_of("sarathi", "chunked")))
    assert not report.ok and report.misses > 0
    assert "first disagreement" in report.summary()


def test_generated_tokens_depend_on_the_whole_context(model):
    from kvsched.executor.oracle import reference

    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 128, 12)
    changed = prompt.copy()
    changed[0] = (changed[0] + 1) % 128
    greedy = []
    for p in (prompt, changed):
        tokens: list[int] = []
        for _ in range(8):  # greedy decoding through the reference, one token at a time
            tokens.append(int(reference(model, p, [*tokens, 0]).argmax[-1]))
        greedy.append(tokens)
    assert greedy[0] != greedy[1]


# ---------------------------------------------------------------- the KV pool
def test_pool_refuses_more_than_its_capacity(torch):
    from kvsched.executor.kvcache import KVPool, KvPoolError

    pool = KVPool(10, 4, layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    assert (pool.num_blocks, pool.num_slots) == (2, 8)
    slots = pool.append(0, 5, "r0")
    assert len(set(slots.tolist())) == 5 and pool.used_blocks == 2
    with pytest.raises(KvPoolError, match=r"request 'r1' needs 1 more block\(s\) of 4 tokens.*0 of 2 blocks"):
        pool.append(1, 1, "r1")
    assert pool.held(1) == 0 and pool.used_blocks == 2  # a refused allocation takes nothing
    pool.free(0)
    assert pool.free_blocks == 2
    pool.append(1, 8)
    assert sorted(pool.slots(1).tolist()) == list(range(8))


def test_valid_schedule_on_a_smaller_pool_is_refused_by_the_pool(model):
    from kvsched.executor.kvcache import KvPoolError

    instance = instances()["chunked"]
    schedule = schedule_of("sarathi", "chunked")
    assert replay(instance, schedule).ok  # the validator accepts it at M = 48
    with pytest.raises(KvPoolError, match=r"^batch \d+: KV pool full: request 'r\d+' needs"):
        run(model, instance, schedule, pool_capacity=32)


def test_illegal_schedule_is_refused_before_any_tensor_work(model):
    instance = Instance((Request("a", 0.0, 6, 2), Request("b", 0.0, 6, 2)), Limits(kv_capacity=8), UNIT)
    # Both prompts at once hold 12 KV tokens, more than M = 8.
    bad = Schedule((Batch.of(0.0, 1.0, [0, 1], [6, 6], [Phase.PREFILL, Phase.PREFILL]),))
    with pytest.raises(ScheduleError, match="kv-capacity"):
        run(model, instance, bad)


# ---------------------------------------------------------------- replay table and CLI
@pytest.fixture
def files(tmp_path):
    instance = instances()["chunked"]
    schedule = schedule_of("sarathi", "chunked")
    save_instance(instance, tmp_path / "inst.json")
    save_schedule(schedule, instance, tmp_path / "sched.json")
    return tmp_path, instance, schedule


def test_replay_command_writes_the_table_and_checks_the_oracle(torch, files, capsys):
    tmp, _, schedule = files
    out = tmp / "measured.csv"
    argv = ["replay", str(tmp / "inst.json"), str(tmp / "sched.json"), "--out", str(out), "--threads", "1"]
    assert main([*argv, "--check-oracle", "--warmup", "0"]) == 0
    assert "16/16 requests identical" in capsys.readouterr().out
    table = pd.read_csv(out)
    assert tuple(table.columns) == REPLAY_COLUMNS
    assert len(table) == len(schedule)
    assert (table.measured_s > 0).all()
    # Predicted with the instance's own model: exactly the schedule's durations.
    np.testing.assert_allclose(table.predicted_s, table.duration, rtol=1e-12)
    np.testing.assert_allclose(table.tokens, [b.num_tokens for b in schedule.batches])
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["oracle"]["match_rate"] == 1.0
    assert meta["model"] == "tiny" and meta["torch"] == torch.__version__
    assert set(meta["summary"]) == {"n", "mean", "p50", "p90", "max"}
    assert "mean_latency" in meta["end_to_end"]
    # The note on a slot-valued cost model is one line, not cut at rich's 80 columns in a log.
    assert main([*argv, "--warmup", "0", "--cost-model", "unit"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 1 and notes[0].startswith("kvsched replay: note:") and notes[0].endswith("seconds")


def test_fewer_layers_scale_the_measured_time(torch):
    from kvsched.executor.model import Decoder, decoder_config

    cfg = decoder_config("llama-3-8b-shape", layers=1)
    assert (cfg.layers, cfg.layer_scale, cfg.shape.kv_heads) == (1, 32.0, 8)
    one = Decoder(decoder_config("tiny", layers=1))
    instance = instances()["tight"]
    table = run(one, instance, schedule_of("vllm", "tight")).table
    np.testing.assert_allclose(table.measured_s, 2.0 * table.measured_raw_s)


def test_bad_model_and_device_are_one_line_errors(torch, files, capsys):
    tmp, _, _ = files
    base = ["replay", str(tmp / "inst.json"), str(tmp / "sched.json"), "--out", str(tmp / "m.csv")]
    assert main([*base, "--model", "gpt-5"]) == 2
    assert main([*base, "--model", "tiny", "--layers", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown model 'gpt-5'" in err[0] and "--layers: 3" in err[1]
    if not torch.cuda.is_available():
        assert main([*base, "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_replay_without_torch_says_how_to_install_it(files, monkeypatch, capsys):
    tmp, _, _ = files
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert main(["replay", str(tmp / "inst.json"), str(tmp / "sched.json")]) == 2
    assert main(["profile", "--out", str(tmp / "prof")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert all("pip install -e .[gpu]" in line and "torch==2.13.0" in line for line in err)


# ---------------------------------------------------------------- end to end
def test_end_to_end_metrics_come_from_the_retimed_schedule():
    instance = instances()["arrivals"]
    schedule = schedule_of("sarathi", "arrivals")
    d = np.full(len(schedule), 0.25)
    timed = retime(instance, schedule, d)
    arrival = np.array([r.arrival for r in instance.requests])
    starts = np.array([b.start for b in timed.batches])
    assert (np.diff(starts) >= 0.25 - 1e-12).all()  # back to back at the least
    assert all(b.start >= arrival[b.requests].max() for b in timed.batches)
    assert replay(instance, timed, check_durations=False).ok
    e2e = end_to_end(instance, schedule, d, d)
    assert (e2e.rel_err == 0).all()
    slower = end_to_end(instance, schedule, 2 * d, d)
    assert slower.loc["makespan", "measured"] > slower.loc["makespan", "predicted"]


# ---------------------------------------------------------------- profiling
def test_profile_tables_have_vidur_columns(model, tmp_path):
    from kvsched.costmodel.calibrate import ATTENTION_SAMPLE, packaged_compute
    from kvsched.costmodel.presets import get_gpu, get_model
    from kvsched.costmodel.profiles import load_attention, load_compute
    from kvsched.executor.profile import GRIDS, run_profile

    res = run_profile(model, tmp_path, grid=GRIDS["quick"], repeat=1, warmup=0)
    vidur = packaged_compute(get_model("llama-2-7b"), get_gpu("h100"))
    assert list(pd.read_csv(res.compute).columns) == list(pd.read_csv(vidur, nrows=1).columns)
    assert list(pd.read_csv(res.attention).columns) == list(pd.read_csv(ATTENTION_SAMPLE, nrows=1).columns)
    assert list(pd.read_csv(res.batches).columns) == list(REPLAY_COLUMNS)
    compute = load_compute(res.compute)
    assert compute.dims == (4, 2, 64, 128, 128) and (compute.layer > 0).all()
    att = load_attention(res.attention)
    assert att.decode_batch.size and att.prefill_chunk.size and (att.prefill_kv > 0).any()
    batches = pd.read_csv(res.batches)
    mixed = (batches.n_decode > 0) & (batches.n_prefill > 0)
    assert mixed.any() and (batches.n_decode == 0).any() and (batches.n_prefill == 0).any()
    assert res.skipped == 0 and len(batches) == res.rows["batches"]


# ---------------------------------------------------------------- calibration from replays (no torch)
def _synthetic_replay(path, truth: CalibratedCost, n: int = 80) -> None:
    """A replay table whose measured times are ``truth``'s times, from varied random batches."""
    rng = np.random.default_rng(3)
    rows = []
    for k in range(n):
        n_dec, n_pf = int(rng.integers(0, 24)), int(rng.integers(0, 3))
        if n_dec + n_pf == 0:
            n_dec = 1
        c = [1] * n_dec + rng.integers(2, 300, n_pf).tolist()
        m = rng.integers(0, 2000, n_dec + n_pf)
        ph = [int(Phase.DECODE)] * n_dec + [int(Phase.PREFILL)] * n_pf
        batch = Batch.of(0.0, 0.0, np.arange(len(c)), c, ph)
        view = BatchView(batch.tokens, m, batch.phases)
        t = truth.batch_time(view)
        rows.append(
            batch_row(k, batch, view, measured=t, measured_raw=t, predicted=2 * t, host_prep=0.0, kv_blocks=0)
        )
    write_replay(pd.DataFrame(rows), {"device_name": "synthetic"}, path)


def test_calibrate_from_replay_recovers_the_model(tmp_path, capsys):
    truth = CalibratedCost.from_params(
        a0=9e-3, a1=1.2e-5, b0=4e-4, b1=2.7e-7, b2=3e-5, p0=1.2e-3, p1=1.6e-9, p2=3.5e-7, p3=2e-4, p4=3.9e-9
    )
    table = tmp_path / "measured.csv"
    _synthetic_replay(table, truth)
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-replay", str(table), "--form", "linear", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "before" in shown and "held out" in shown
    name, params = resolve_cost_model(str(out))  # --cost-model accepts it
    fitted = CalibratedCost.from_params(**params)
    df = pd.read_csv(table)
    feats = [dict(zip(FEATURES, row, strict=True)) for row in df[list(FEATURES)].itertuples(index=False)]
    from kvsched.costmodel.features import BatchFeatures

    pred = np.array([fitted.time_of(BatchFeatures(**f)) for f in feats])
    np.testing.assert_allclose(pred, df.measured_s, rtol=1e-5)
    doc = json.loads(out.read_text())
    assert name == "calibrated" and doc["meta"]["source"] == "replay"
    assert doc["meta"]["fidelity"]["before"]["mean"] == pytest.approx(1.0)  # predicted 2x
    assert doc["meta"]["fidelity"]["held_out"]["max"] < 1e-4
    assert doc["meta"]["replay"]["device_name"] == "synthetic"


def test_calibrate_from_replay_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"tokens": [1.0], "measured_s": [0.1]}).to_csv(bad, index=False)
    assert main(["calibrate", "--from-replay", str(bad)]) == 2
    assert main(["calibrate", "--from-replay", str(bad), "--form", "rad"]) == 2
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert "missing column 'n_decode'" in err[0]
    assert "stepped or linear" in err[1]
    assert "--from-replay" in err[2]
