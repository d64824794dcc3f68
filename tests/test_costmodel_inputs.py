"""Cost-model inputs a probe found mishandled: wrong time units, short tables, flags, knot names, ``unit``."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsched.cli import main
from kvsched.costmodel import make_cost_model
from kvsched.costmodel.calibrate import (
    ATTENTION_SAMPLE,
    ATTENTION_WINDOW_S,
    COMPUTE_WINDOW_S,
    DATA_DIR,
    PACKAGED_COMPUTE,
    calibrate,
)
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.coeffile import COEFFICIENT_DIR, load_coefficients
from kvsched.costmodel.presets import get_model
from kvsched.costmodel.profiles import load_attention, load_compute
from kvsched.errors import InputError

LLAMA7_A100 = DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "a100-80gb")]
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiling"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "costmodels.md"


def _table(rows: int = 30) -> pd.DataFrame:
    df = pd.read_csv(LLAMA7_A100)
    df = df[df.num_tensor_parallel_workers == 1].sort_values("num_tokens", kind="stable")
    return df.head(rows).reset_index(drop=True)  # the smallest token counts: 1, 2, 3, ...


def _write(folder: Path, df: pd.DataFrame, name: str = "mlp.csv") -> Path:
    folder.mkdir(parents=True, exist_ok=True)  # under a100/: the GPU comes from the path
    path = folder / name
    df.to_csv(path, index=False)
    return path


def _scaled(df: pd.DataFrame, factor: float, prefix: str = "time_stats.") -> pd.DataFrame:
    out = df.copy()
    cols = [c for c in out.columns if c.startswith(prefix) or c == prefix]
    out[cols] = out[cols] * factor
    return out


# ------------------------------------------------------------ F1: times in the wrong unit
@pytest.mark.parametrize(("factor", "unit"), [(1e-3, "seconds, not ms"), (1e3, "µs, not ms")])
def test_compute_table_in_seconds_or_microseconds_is_refused(tmp_path, capsys, factor, unit):
    path = _write(tmp_path / "a100", _scaled(_table(), factor))
    with pytest.raises(
        InputError, match=rf"^{re.escape(str(path))}: column time_stats.<op>.median: .*{unit}"
    ):
        calibrate(path)
    out = tmp_path / "o.json"
    assert main(["calibrate", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"look like {unit}" in err and not out.exists()


def test_attention_table_in_seconds_is_refused(tmp_path):
    att = _write(tmp_path, _scaled(pd.read_csv(ATTENTION_SAMPLE), 1e-3, "median_ms"), "attention.csv")
    with pytest.raises(InputError, match=rf"^{re.escape(str(att))}: column 'median_ms': .*seconds, not ms"):
        calibrate(LLAMA7_A100, attention=att)


def _compute_tables() -> list[Path]:
    found = sorted((DATA_DIR / "compute").rglob("mlp.csv"))
    return found + (sorted((SHARED / "compute").rglob("mlp.csv")) if SHARED.is_dir() else [])


def test_every_shipped_table_is_inside_the_unit_windows():
    """The windows were chosen to pass every real table, at every tp they hold."""
    from kvsched.costmodel.calibrate import _resolve

    tables = _compute_tables()
    assert len(tables) >= 7
    for path in tables:
        for tp in sorted(set(pd.read_csv(path).num_tensor_parallel_workers)):
            prof = load_compute(path, int(tp))
            spec, _ = _resolve(prof, path, None, None)
            assert COMPUTE_WINDOW_S[0] <= prof.total(spec.layers)[0] <= COMPUTE_WINDOW_S[1], (path, tp)
    layers = get_model("llama-2-7b").layers
    for path in [ATTENTION_SAMPLE, *([SHARED / ATTENTION_SAMPLE.relative_to(DATA_DIR)] * SHARED.is_dir())]:
        for tp in (1, 8):
            a = load_attention(path, tp)
            t = np.concatenate([a.decode_time, a.prefill_time])
            assert ATTENTION_WINDOW_S[0] <= t.min() * layers <= ATTENTION_WINDOW_S[1], (path, tp)


# ------------------------------------------------------------ F3: too few rows, named
def test_too_few_rows_for_cross_validation_names_the_file_and_the_real_minimum(tmp_path, capsys):
    path = _write(tmp_path / "a100", _table(3))
    # 3 rows meet the fit's minimum, but every fold would refit on 2: the table needs 4.
    with pytest.raises(
        InputError, match=rf"^{re.escape(str(path))}: the token term .* at least 4 rows .* got 3"
    ):
        calibrate(path)
    five = _write(tmp_path / "a100", _table(5), "five.csv")
    with pytest.raises(InputError, match=r"five\.csv: .* at least 6 rows with --folds 2, got 5"):
        calibrate(five, folds=2)
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvsched calibrate: error: {path}: ")


def test_a_row_shortfall_in_a_fit_is_a_fit_error_so_callers_name_the_table(tmp_path):
    from kvsched.costmodel.fitting import FitError, fit_decode, fit_token_term

    with pytest.raises(FitError, match=r"^the linear token term needs at least 3 rows, got 2"):
        fit_token_term("linear", np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    with pytest.raises(FitError, match=r"^decode attention needs at least 3 rows"):
        fit_decode(np.array([1.0, 2.0]), np.array([5.0, 5.0]), np.array([1.0, 2.0]))
    att = pd.read_csv(ATTENTION_SAMPLE)
    decode = att[~att.is_prefill.astype(bool)].index
    few = _write(tmp_path, att.drop(index=decode[2:]), "att.csv")  # 2 decode rows: not even a fit
    with pytest.raises(InputError, match=rf"^{re.escape(str(few))}: decode attention needs at least 3 rows"):
        calibrate(LLAMA7_A100, attention=few)
    three = _write(tmp_path, att.drop(index=decode[3:]), "att3.csv")  # 3: a fit, but no 10-fold one
    with pytest.raises(
        InputError, match=r"att3\.csv: decode attention .* at least 4 rows with --folds 10, got 3"
    ):
        calibrate(LLAMA7_A100, attention=three)


# ------------------------------------------------------------ F4: the attention flags
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attention_model": "llama2"}, r"^--attention-model: unknown model 'llama2'"),
        ({"attention_gpu": "a10"}, r"^--attention-gpu: unknown gpu 'a10'"),
    ],
)
def test_a_bad_attention_preset_names_its_own_flag(kwargs, message):
    with pytest.raises(InputError, match=message):
        calibrate(LLAMA7_A100, **kwargs)


# ------------------------------------------------------------ F5: one name per knot
def test_non_canonical_or_duplicate_knots_are_refused(tmp_path):
    with pytest.raises(InputError, match=r"'step0128': write the knot without leading zeros \(step128\)"):
        make_cost_model("calibrated", {"a0": 1e-3, "step0128": 1e-3})
    with pytest.raises(InputError, match="unexpected parameter"):
        make_cost_model("calibrated", {"a0": 1e-3, "step\u0661\u0662\u0668": 1e-3})  # Arabic-Indic 128
    with pytest.raises(ValueError, match="step128 is given twice"):
        CalibratedCost(a0=1e-3, steps=((128, 1e-3), (128, 2e-3)))
    doc = json.loads((COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json").read_text())
    doc["params"]["step0128"] = 0.5
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"dup\.json: .*'step0128': write the knot without leading zeros"):
        load_coefficients(path)


# ------------------------------------------------------------ F6: unit's slot
@pytest.mark.parametrize("slot", [-1.0, 0.0, float("nan"), float("inf")])
def test_unit_slot_must_be_finite_and_positive(slot, tmp_path):
    with pytest.raises(InputError, match=r"cost model unit: slot must be a finite number > 0"):
        make_cost_model("unit", {"slot": slot})
    assert make_cost_model("unit", {"slot": 2.0}).slot == 2.0
    path = tmp_path / "unit.json"
    path.write_text(
        json.dumps(
            {"schema_version": 1, "kind": "kvsched.cost-coefficients", "name": "unit", "params": {"slot": -1}}
        )
    )
    with pytest.raises(InputError, match=r"unit\.json: .*slot must be a finite number > 0"):
        load_coefficients(path)


# ------------------------------------------------------------ F12, F13: folds used, whole lines
def test_folds_beyond_the_rows_are_reported_as_used(tmp_path, capsys):
    path = _write(tmp_path / "a100", _table(12))
    cal = calibrate(path, folds=1000, report_forms=("stepped",))
    assert cal.folds == 12
    assert cal.document()["meta"]["cv"] == {"folds": 12, "seed": 0, "folds_requested": 1000}
    # As asked, the record is unchanged (the shipped files stay byte for byte).
    assert calibrate(path, folds=3, report_forms=("stepped",)).document()["meta"]["cv"] == {
        "folds": 3,
        "seed": 0,
    }
    out = (
        tmp_path / ("a_directory_whose_name_is_long_enough_to_pass_eighty_columns_on_its_own" * 2) / "c.json"
    )
    out.parent.mkdir()
    assert main(["calibrate", str(path), "--folds", "1000", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "12-fold, leave-one-out: --folds 1000 exceeds the 12 rows" in captured.out
    assert f"wrote stepped coefficients to {out}\n" in captured.err  # one line, not cut at 80 columns


# ------------------------------------------------------------ F14: no CUDA graphs on CPU
def test_cpu_options_do_not_claim_cuda_graphs():
    torch = pytest.importorskip("torch")
    from kvsched.executor.engine import engine_options

    described = engine_options(torch.device("cpu"), graphs=True, mixed_graphs=True).describe()
    assert described["graphs"] and described["cuda_graphs"] is False


# ------------------------------------------------------------ F16: p3 pinned in whole-batch fits
def test_whole_batch_fit_pins_p3_when_no_batch_has_two_prefills():
    from kvsched.costmodel.base import BatchView
    from kvsched.costmodel.features import BatchFeatures
    from kvsched.costmodel.fitting import fit_batches

    truth = CalibratedCost.from_params(
        a0=9e-3, a1=1.2e-5, b0=4e-4, b1=2.7e-7, p0=1.2e-3, p1=1.6e-9, p2=3.5e-7
    )
    rng = np.random.default_rng(2)
    feats, times = [], []
    for _ in range(60):
        n_dec, n_pf = int(rng.integers(1, 30)), int(rng.integers(0, 2))
        c = [1] * n_dec + rng.integers(1, 200, n_pf).tolist()
        m = rng.integers(0, 2000, n_dec + n_pf).tolist()
        v = BatchView(np.array(c), np.array(m), np.array([1] * n_dec + [0] * n_pf, dtype=np.int8))
        feats.append(BatchFeatures.of(v))
        times.append(truth.batch_time(v))
    params = fit_batches(feats, np.array(times), form="linear").params
    assert params["p3"] == 0.0 and params["p0"] == pytest.approx(1.2e-3, rel=1e-6)


# ------------------------------------------------------------ F7, F8, F9: the docs' numbers
def test_docs_numbers_match_the_data():
    text = " ".join(DOCS.read_text().split())
    a100 = load_compute(LLAMA7_A100, 1)
    total = dict(zip(a100.num_tokens, a100.total(32) * 1e3, strict=True))
    assert f"the profile itself: {total[384]:.1f} ms at 384, {total[392]:.1f} ms at 392" in text
    h100 = pd.read_csv(DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "h100-80gb")])
    up = (
        h100[h100.num_tensor_parallel_workers == 1]
        .groupby("num_tokens")["time_stats.mlp_up_proj.median"]
        .median()
    )
    below, above = up[136] / up[128] - 1, up[136] / up[144] - 1
    assert f"median is {below:.0%} above the one at 128 tokens and {above:.0%} above the one at 144" in text
    knots = [
        sum(k.startswith("step") for k in json.loads(p.read_text())["params"])
        for p in sorted(COEFFICIENT_DIR.glob("*.json"))
    ]
    assert f"at most {max(knots)} knots" in text


# ------------------------------------------------------------ F18: a coefficient file that lost one
A100_FILE = COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json"


def _edited(tmp_path: Path, edit, name: str = "mine.json") -> Path:
    doc = json.loads(A100_FILE.read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["params"].pop("a0"),
            r"mine\.json: params\.a0: missing, but a file with meta\.param_count",
        ),
        (lambda d: d["params"].pop("p3"), r"params\.p3: missing"),  # a zero, listed since param_count
        (lambda d: d["params"].pop("step2048"), r"params: 53 coefficients, but meta\.param_count is 54"),
        (
            lambda d: d["meta"].update(param_count="54"),
            r"meta\.param_count: '54' is not a positive whole number",
        ),
    ],
)
def test_a_coefficient_file_that_lost_a_coefficient_is_refused(tmp_path, capsys, edit, message):
    """The shipped A100 file without a0 used to load silently (a makespan of 1.24 s for 8.12 s)."""
    path = _edited(tmp_path, edit)
    with pytest.raises(InputError, match=message):
        load_coefficients(path)
    argv = ["generate", "synthetic", "--n", "2", "--cost-model", str(path), "-o", str(tmp_path / "i.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err)


def test_files_without_a_count_load_as_before_and_zeros_do_not_reach_instances(tmp_path):
    shipped_params = load_coefficients(A100_FILE).params
    # As written before param_count: zero scalars left out, no count. Loads, and a missing key is 0.
    old = _edited(tmp_path, lambda d: (d["meta"].pop("param_count"), d["params"].pop("p3")), "old.json")
    assert load_coefficients(old).params == shipped_params
    # The instance's time_model is CalibratedCost.params(): the zeros a file lists are dropped again.
    cost = make_cost_model("calibrated", shipped_params)
    assert "p3" not in shipped_params and shipped_params == cost.params()
    assert json.loads(A100_FILE.read_text())["params"]["p3"] == 0.0
    for path in COEFFICIENT_DIR.glob("*.json"):  # every shipped file is counted and complete
        doc = json.loads(path.read_text())
        assert doc["meta"]["param_count"] == len(doc["params"]) and {"a0", "p3", "p4"} <= set(doc["params"])


def test_a_shipped_file_whose_meta_names_another_model_is_refused(tmp_path, monkeypatch):
    import kvsched.costmodel.coeffile as coeffile

    lie = _edited(tmp_path, lambda d: d["meta"].update(model="llama-2-70b"), A100_FILE.name)
    assert (
        load_coefficients(lie).meta["model"] == "llama-2-70b"
    )  # a file of one's own: nothing to check it by
    monkeypatch.setattr(coeffile, "COEFFICIENT_DIR", tmp_path)  # now it is the shipped file of that name
    with pytest.raises(
        InputError, match=r"meta\.model: 'llama-2-70b', but the file is the one for model 'llama-2-7b'"
    ):
        load_coefficients(lie)
    with pytest.raises(InputError, match=r"meta\.model: 'llama-2-70b'"):
        coeffile.resolve_cost_model(A100_FILE.stem)
