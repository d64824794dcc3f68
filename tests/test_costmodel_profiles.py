"""Profiling tables: the packaged data reads as expected; a malformed table is one clear error."""

import re
import warnings
from pathlib import Path

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
            "column 'time_stats.add.median', line 2: 'x' is not a positive number",
        ),
        (
            lambda d: d.assign(**{"time_stats.emb.median": [-1.0] * len(d)}),
            "'time_stats.emb.median', line 2: -1.0 is not a positive number",
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
    err = capsys.readouterr().err
    # It names the presets and the way out for a tiny model's tables ("pass --model" was a dead end).
    assert "is no preset model's (llama-2-7b" in err and "calibrate --from-replay" in err
    assert "pass --model" not in err
    assert main(["calibrate", str(write(tmp_path, table)), "--gpu", "a100", "--model", "llama-2-70b"]) == 2
    assert "llama-2-70b does not match" in capsys.readouterr().err
    assert main(["calibrate", str(write(tmp_path, table))]) == 2  # tmp_path names no GPU
    assert "no GPU named in the path" in capsys.readouterr().err


# ---------------------------------------------------------------- implausible magnitudes (bug B5)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            1e300,
            r"line 2: 1e\+300 is not a plausible time \(a non-zero time lies between 1e-06 and 1e\+06 ms",
        ),
        (2e6, r"line 2: 2000000\.0 is not a plausible time"),
        (1e-300, r"line 2: 1e-300 is not a plausible time"),
    ],
)
def test_implausible_operator_time_is_refused_naming_column_and_line(tmp_path, table, value, message):
    bad = table.assign(**{"time_stats.mlp_up_proj.median": [value] * len(table)})
    with pytest.raises(InputError, match=r"mlp\.csv: column 'time_stats\.mlp_up_proj\.median', " + message):
        load_compute(write(tmp_path, bad))


def test_time_ceiling_and_floor_themselves_are_plausible(tmp_path, table):
    edge = table.assign(**{"time_stats.mlp_up_proj.median": [1e6] + [1e-6] * (len(table) - 1)})
    # Loads without an error (the first token count is measured twice: the median merges it with 1e-6).
    assert load_compute(write(tmp_path, edge)).layer.max() > 100


def test_count_beyond_two_to_the_53_is_refused(tmp_path, table):
    bad = table.assign(num_tokens=[1e300] * len(table))
    with pytest.raises(
        InputError, match=r"column 'num_tokens', line 2: 1e\+300 is too large \(at most 2\*\*53"
    ):
        load_compute(write(tmp_path, bad))


def test_implausible_attention_time_is_refused(tmp_path):
    df = pd.read_csv(ATTENTION_SAMPLE)
    df.loc[3, "median_ms"] = 1e300
    with pytest.raises(InputError, match=r"column 'median_ms', line 5: 1e\+300 is not a plausible time"):
        load_attention(write(tmp_path, df, "a.csv"))


def test_calibrate_refuses_a_huge_table_in_one_line_without_numpy_warnings(tmp_path, table, capsys):
    """Every mlp_up_proj median 1e300 used to fit a0 = 3e298 and print 0.00 % errors and RuntimeWarnings."""
    (tmp_path / "a100").mkdir()
    path = write(tmp_path / "a100", table.assign(**{"time_stats.mlp_up_proj.median": [1e300] * len(table)}))
    out = tmp_path / "out.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the test
        code = main(["calibrate", str(path), "--folds", "3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and not out.exists() and captured.out == ""
    assert captured.err.count("\n") == 1 and "Warning" not in captured.err
    assert "column 'time_stats.mlp_up_proj.median', line 2: 1e+300 is not a plausible time" in captured.err


def test_calibrate_refuses_a_row_whose_times_are_all_zero(tmp_path, table, capsys):
    """A zero total time used to end in an internal LinAlgError (weights 1 / 0); now its first cell is named."""
    (tmp_path / "a100").mkdir()
    bad = table.copy()
    bad.loc[5, [c for c in bad.columns if c.startswith("time_stats.")]] = 0.0
    path = write(tmp_path / "a100", bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["calibrate", str(path), "--folds", "3", "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "column 'time_stats.emb.median', line 7: 0.0 is not a positive" in err


@pytest.mark.parametrize(
    ("column", "loader"),
    [
        ("time_stats.mlp_up_proj.median", "compute"),
        ("time_stats.add.median", "compute"),
        ("time_stats.all_reduce.median", "all-reduce"),
    ],
)
def test_one_zero_operator_median_is_refused_naming_file_column_and_line(tmp_path, table, column, loader):
    """F2: one 0 median used to pass (it moved a1 by -21 %); a measured kernel time is never 0."""
    if loader == "compute":
        bad = table.copy()
        bad.loc[5, column] = 0.0
        path = write(tmp_path, bad)
        call = lambda: load_compute(path)  # noqa: E731
    else:
        df = pd.read_csv(DATA_DIR / "network/a100_pairwise_nvlink/all_reduce.csv")
        df.loc[5, column] = 0.0
        path = write(tmp_path, df, "all_reduce.csv")
        call = lambda: load_allreduce(path, int(df.num_workers[5]))  # noqa: E731
    msg = rf"{re.escape(str(path))}: column '{re.escape(column)}', line 7: 0\.0 is not a positive number \(a measured"
    with pytest.raises(InputError, match=msg):
        call()


REPLAY = Path(__file__).parent.parent / "benchmarks/data/executor_h100/opt_d10.csv"


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (
            "measured_s",
            1e300,
            r"1e\+300 is not a plausible time \(a non-zero time lies between 1e-09 and 1000 s\)",
        ),
        ("measured_s", 1e-300, r"1e-300 is not a plausible time"),
        ("prefill_quad", 1e300, r"1e\+300 is too large"),
    ],
)
def test_replay_table_goes_through_the_same_magnitude_rule(tmp_path, capsys, column, value, message):
    df = pd.read_csv(REPLAY)
    df.loc[3, column] = value
    path = write(tmp_path, df, "replay.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(
            ["calibrate", "--from-replay", str(path), "--folds", "3", "--out", str(tmp_path / "f.json")]
        )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert re.search(rf"replay\.csv: column '{column}', line 5: {message}", err)


def test_a_replay_table_too_short_to_fit_is_named(tmp_path, capsys):
    # The whole-batch fit needs 12 rows: the error named "profiling table", not the file.
    path = write(tmp_path, pd.read_csv(REPLAY).head(5), "short.csv")
    assert main(["calibrate", "--from-replay", str(path), "--out", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: a whole-batch fit needs at least 12 rows, got 5" in err


def test_a_replay_fit_says_when_it_pins_p3(tmp_path, capsys):
    # Without a batch of two prefills p3 cannot be told from p0: the fit pins it, and says so.
    table = pd.read_csv(REPLAY)
    path = write(tmp_path, table[table["n_prefill"] <= 1], "one-prefill.csv")
    assert (
        main(["calibrate", "--from-replay", str(path), "--folds", "3", "--out", str(tmp_path / "f.json")])
        == 0
    )
    assert "p3 (per prefill) pinned to 0" in capsys.readouterr().out
    assert (
        main(["calibrate", "--from-replay", str(REPLAY), "--folds", "3", "--out", str(tmp_path / "g.json")])
        == 0
    )
    assert "pinned" not in capsys.readouterr().out


# ---------------------------------------------------------------- replay feature columns (F17)
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"tokens": 2.5}, r"column 'tokens', line 5: 2\.5 is not a non-negative integer"),
        (
            {"n_decode": 7.0, "tokens": 2.0, "n_prefill": 0.0, "prefill_tokens": 0.0},
            r"column 'tokens', line 5: 2 is not n_decode \+ prefill_tokens = 7 \+ 0 \(a decode is one token\)",
        ),
        (
            {"n_decode": 0.0, "decode_kv": 5.0},
            r"column 'decode_kv', line 5: 5 is not 0 in a batch without decodes",
        ),
        ({"n_prefill": 3.0}, r"column 'prefill_sq', line 5: .* is no sum of squares of 3 chunks"),
        (
            {"prefill_quad": "odd"},
            r"column 'prefill_quad', line 5: \d+ is not prefill_sq \+ 2 x sum\(c x m\)",
        ),
    ],
)
def test_replay_rows_whose_batch_sums_contradict_are_refused(tmp_path, capsys, edit, message):
    """F17: non-integral or inconsistent feature columns used to be fitted as given."""
    df = pd.read_csv(REPLAY)
    one_chunk = int(df.index[(df["n_prefill"] == 1) & (df["prefill_tokens"] > 3)][0])
    row = df.loc[one_chunk].copy()
    for col, value in edit.items():
        row[col] = row["prefill_sq"] + 1 if value == "odd" else value  # 2 x sum(c x m) is even
    df.loc[3] = row  # line 5
    if "tokens" not in edit:
        df.loc[3, "tokens"] = df.loc[3, "n_decode"] + df.loc[3, "prefill_tokens"]
    path = write(tmp_path, df, "replay.csv")
    code = main(["calibrate", "--from-replay", str(path), "--folds", "3", "--out", str(tmp_path / "f.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "f.json").exists()
    assert re.search(rf"replay\.csv: {message}", err), err


def test_every_shipped_replay_table_passes_the_feature_checks():
    """The relations hold for the batches kvsched itself measured (no true row is refused)."""
    from kvsched.executor.measure import read_replay

    tables = [
        p
        for p in sorted((Path(__file__).parent.parent / "benchmarks/data").rglob("*.csv"))
        if "prefill_quad" in p.read_text().split("\n", 1)[0]
    ]
    assert len(tables) >= 20
    for p in tables:
        assert len(read_replay(p).features) > 0


def test_a_replay_fit_writes_every_coefficient_and_their_count(tmp_path):
    """F18: a file from --from-replay lists its zeros (p3 pinned to 0 here) and counts them."""
    from kvsched.costmodel.calibrated import SCALARS
    from kvsched.costmodel.coeffile import dump_coefficients, load_coefficients
    from kvsched.executor.measure import fit_replay

    table = pd.read_csv(REPLAY)
    doc = fit_replay(write(tmp_path, table[table["n_prefill"] <= 1], "one.csv"), folds=3).document()
    assert set(SCALARS) <= set(doc["params"]) and doc["params"]["p3"] == 0.0
    assert doc["meta"]["param_count"] == len(doc["params"])
    path = tmp_path / "fit.json"
    path.write_text(dump_coefficients(doc))
    assert "p3" not in load_coefficients(path).params  # the instance's time_model leaves the zero out
    del doc["params"]["a0"]
    path.write_text(dump_coefficients(doc))
    with pytest.raises(InputError, match=r"fit\.json: params\.a0: missing"):
        load_coefficients(path)
