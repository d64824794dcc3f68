"""Profiling tables: the packaged data reads as expected; a malformed table is one clear error."""

import pandas as pd
import pytest

from kvsched.cli import main
from kvsched.costmodel.calibrate import ATTENTION_SAMPLE, DATA_DIR
from kvsched.costmodel.profiles import load_allreduce, load_attention, load_compute
from kvsched.errors import InputError

LLAMA7_A100 = DATA_DIR / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"


def test_packaged_compute_table():
    prof = load_compute(LLAMA7_A100, tp=1)
    # 261 rows, 2048 and 4096 tokens measured twice: merged.
    assert prof.num_tokens.size == 259 and prof.num_tokens[0] == 1 and prof.num_tokens[-1] == 4096
    assert prof.dims == (32, 32, 4096, 11008, 32768)
    assert prof.missing_ops == ()
    # The first row by hand: embedding 0.003 ms plus 32 x the layer's operator medians, in seconds.
    layer_ms = 0.005 + 0.065 + 0.005 + 0.025 + 0.005 + 0.116 + 0.007 + 0.060 + 0.002
    assert prof.total(32)[0] == pytest.approx((0.003 + 32 * layer_ms) * 1e-3)


def test_packaged_attention_and_allreduce_tables():
    a = load_attention(ATTENTION_SAMPLE, 1)
    assert (a.decode_batch.size, a.prefill_chunk.size) == (174, 159)
    assert load_attention(ATTENTION_SAMPLE, 8).prefill_chunk.size == 67
    ar = load_allreduce(DATA_DIR / "network/a100_pairwise_nvlink/all_reduce.csv", 2)
    assert ar.time_of([ar.size[0]])[0] == ar.time[0]
    assert ar.time_of([2 * ar.size[-1]])[0] > ar.time[-1]  # extended beyond the largest message


def write(tmp_path, df, name="mlp.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


@pytest.fixture
def table():
    return pd.read_csv(LLAMA7_A100).head(40)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d.drop(columns=["time_stats.mlp_up_proj.median"]),
            "missing column 'time_stats.mlp_up_proj.median'",
        ),
        (lambda d: d.drop(columns=["num_tokens"]), "missing column 'num_tokens'"),
        (
            lambda d: d.assign(**{"time_stats.add.median": ["x"] + [0.1] * (len(d) - 1)}),
            "column 'time_stats.add.median', line 2: 'x' is not a non-negative number",
        ),
        (
            lambda d: d.assign(**{"time_stats.emb.median": [-1.0] * len(d)}),
            "'time_stats.emb.median', line 2: -1.0 is not a non-negative number",
        ),
        (
            lambda d: d.assign(num_tokens=[0] * len(d)),
            "column 'num_tokens', line 2: 0 is not a positive integer",
        ),
        (
            lambda d: d.assign(num_tensor_parallel_workers=[2] * len(d)),
            r"no rows with num_tensor_parallel_workers = 1 \(have 2\)",
        ),
        (lambda d: d.assign(n_embd=range(len(d))), "describe more than one model|n_embd"),
    ],
)
def test_malformed_compute_table_is_one_clear_error(tmp_path, table, edit, message):
    with pytest.raises(InputError, match=message):
        load_compute(write(tmp_path, edit(table)))


def test_wrong_kind_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="not a compute profiling table"):
        load_compute(ATTENTION_SAMPLE)
    with pytest.raises(InputError, match="profiling table not found"):
        load_compute(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="not a CSV profiling table"):
        load_compute(tmp_path / "empty.csv")
    (tmp_path / "head.csv").write_text("num_tokens,time_stats.mlp_up_proj.median\n")
    with pytest.raises(InputError, match="has no rows"):
        load_compute(tmp_path / "head.csv")


def test_malformed_attention_table(tmp_path):
    df = pd.read_csv(ATTENTION_SAMPLE)
    bad = df.assign(is_prefill=["maybe"] * len(df))
    with pytest.raises(InputError, match="column 'is_prefill', line 2: 'maybe' is not True or False"):
        load_attention(write(tmp_path, bad, "a.csv"))
    bad = df.assign(batch_size=[0] * len(df))
    with pytest.raises(InputError, match="'batch_size', line 2: must be >= 1 for a decode row"):
        load_attention(write(tmp_path, bad, "b.csv"))
    with pytest.raises(InputError, match="missing column 'median_ms'"):
        load_attention(write(tmp_path, df.drop(columns=["median_ms"]), "c.csv"))


def test_calibrate_command_reports_a_malformed_table_in_one_line(tmp_path, table, capsys):
    path = write(tmp_path, table.drop(columns=["time_stats.attn_pre_proj.median"]))
    assert main(["calibrate", str(path), "--gpu", "a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing column 'time_stats.attn_pre_proj.median'" in err


def test_calibrate_needs_a_model_and_a_gpu_it_can_tell(tmp_path, table, capsys):
    odd = table.assign(n_expanded_embd=[12345] * len(table))
    assert main(["calibrate", str(write(tmp_path, odd)), "--gpu", "a100"]) == 2
    assert "describes no preset model" in capsys.readouterr().err
    assert main(["calibrate", str(write(tmp_path, table)), "--gpu", "a100", "--model", "llama-2-70b"]) == 2
    assert "llama-2-70b does not match" in capsys.readouterr().err
    assert main(["calibrate", str(write(tmp_path, table))]) == 2  # tmp_path names no GPU
    assert "no GPU named in the path" in capsys.readouterr().err
