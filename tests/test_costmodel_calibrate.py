"""Calibration: the committed coefficient files are reproduced; fidelity targets; --cost-model files."""

import json
import shutil
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.costmodel import make_cost_model
from kvsched.costmodel.calibrate import (
    DATA_DIR,
    PACKAGED_COMPUTE,
    SHIPPED,
    attention_scale,
    calibrate,
    coefficient_name,
)
from kvsched.costmodel.coeffile import COEFFICIENT_DIR, load_coefficients, resolve_cost_model, shipped
from kvsched.costmodel.presets import get_gpu, get_model
from kvsched.errors import InputError
from kvsched.instances.io import load_instance

#: The shared data folder beside the repository (CI has it at ../shared).
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiling"


def approx_doc(got, want):
    """Two coefficient documents agree: same structure, numbers to 1e-5 relative."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for key in want:
            approx_doc(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            approx_doc(g, w)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-12)
    else:
        assert got == want


@pytest.fixture(scope="module")
def a100():
    return calibrate(DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "a100-80gb")])


@pytest.fixture(scope="module")
def h100():
    return calibrate(DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "h100-80gb")])


def row(cal, rows, form):
    return next(r for r in cal.fidelity if r.rows == rows and r.form == form).stats


@pytest.mark.parametrize(("model", "gpu", "tp"), SHIPPED)
def test_calibrate_reproduces_the_committed_coefficient_files(model, gpu, tp):
    cal = calibrate(DATA_DIR / PACKAGED_COMPUTE[(model, gpu)], tp=tp)
    committed = json.loads((COEFFICIENT_DIR / coefficient_name(model, gpu, tp)).read_text())
    approx_doc(json.loads(json.dumps(cal.document())), committed)


def test_calibrate_command_reproduces_a_committed_file(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert (
        main(["calibrate", str(DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "h100-80gb")]), "-o", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    assert "fidelity: llama-2-7b on h100-80gb" in text and "stepped *" in text and "derived" in text
    approx_doc(
        json.loads(out.read_text()),
        json.loads((COEFFICIENT_DIR / "llama-2-7b_h100-80gb_tp1.json").read_text()),
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared data folder is not beside the repository")
def test_the_original_vidur_table_gives_the_same_coefficients(tmp_path):
    src = SHARED / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
    assert main(["calibrate", str(src), "-o", str(tmp_path / "x.json")]) == 0
    committed = json.loads((COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json").read_text())
    approx_doc(json.loads((tmp_path / "x.json").read_text()), committed)


def test_llama_2_7b_a100_meets_the_fidelity_targets(a100):
    for rows in ("non-attention", "whole batch"):
        s = row(a100, rows, "stepped")
        assert s.mean <= 0.03 and s.max <= 0.10, rows
    # InferMax's purely linear token term does not meet them over 1..4096 tokens.
    lin = row(a100, "non-attention", "linear")
    assert lin.mean > 0.03 and lin.max > 0.10
    assert a100.terms["decode_attention"].startswith("measured")
    assert a100.r2["non_attention"] > 0.999 and a100.r2["prefill_attention"] > 0.99


def test_llama_2_7b_h100_fidelity_and_its_one_isolated_row(h100):
    s = row(h100, "non-attention", "stepped")
    assert s.mean <= 0.03
    # One row (136 tokens) exceeds 10 %; its own neighbours miss it by more than 10 % too.
    assert s.over_10pct == 1 and s.max < 0.15
    assert row(h100, "non-attention", "neighbours").max > 0.10
    assert h100.terms["decode_attention"].startswith("derived") and "whole batch" not in {
        r.rows for r in h100.fidelity
    }


def test_attention_scaling_factors():
    s = attention_scale(
        (get_model("llama-2-7b"), get_gpu("a100-80gb"), 1),
        (get_model("llama-2-70b"), get_gpu("a100-80gb"), 2),
    )
    assert s["b1"] == pytest.approx(1 / 8)  # 4 KV heads per GPU instead of 32
    assert s["p1"] == pytest.approx(1.0)  # 32 query heads per GPU either way
    h = attention_scale(
        (get_model("llama-2-7b"), get_gpu("a100"), 1), (get_model("llama-2-7b"), get_gpu("h100"), 1)
    )
    assert h["b1"] == pytest.approx(2.039 / 3.35) and h["p1"] == pytest.approx(312 / 989) and h["b0"] == 1.0


def test_calibrate_rejects_bad_options():
    path = DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "a100-80gb")]
    with pytest.raises(InputError, match="unknown form"):
        calibrate(path, form="cubic")
    with pytest.raises(InputError, match="no all-reduce rows for 8 workers"):
        calibrate(path, tp=8)


# ------------------------------------------------------------ coefficient files in use
def test_shipped_files_build_and_name_their_provenance():
    files = shipped()
    assert {coefficient_name(*s)[:-5] for s in SHIPPED} == set(files)
    for path in files.values():
        cf = load_coefficients(path)
        cm = make_cost_model(cf.name, cf.params)
        assert cm.name == "calibrated" and cf.meta["unit"] == "seconds"
        assert set(cf.meta["terms"]) == {"non_attention", "decode_attention", "prefill_attention"}


def test_cost_model_accepts_a_coefficient_file_or_a_shipped_name(tmp_path, capsys):
    src = COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json"
    copy = tmp_path / "mine.json"
    shutil.copy(src, copy)
    params = load_coefficients(src).params
    assert resolve_cost_model(str(copy)) == ("calibrated", params)
    assert resolve_cost_model("llama-2-7b_a100-80gb_tp1") == ("calibrated", params)
    assert resolve_cost_model("unit") == ("unit", {})
    out = tmp_path / "inst.json"
    argv = ["generate", "synthetic", "--n", "5", "--seed", "1", "--cost-model", str(copy), "-o", str(out)]
    assert main(argv) == 0
    inst = load_instance(out)
    assert inst.time_model.name == "calibrated" and inst.time_model.params == params
    copy.unlink()  # the instance carries the coefficients itself
    assert load_instance(out).time_model.params == params
    assert main(["info", str(out), "--cost-model", "llama-2-7b_h100-80gb_tp1"]) == 0
    assert "calibrated" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"kind": "x"}', "kind: expected 'kvsched.cost-coefficients'"),
        (
            '{"schema_version": 1, "kind": "kvsched.cost-coefficients", "name": "calibrated", "params": {"a0": "x"}}',
            "params.a0: 'x' is not a finite number",
        ),
        (
            '{"schema_version": 1, "kind": "kvsched.cost-coefficients", "name": "calibrated", "params": {"q": 1}}',
            "unexpected parameter 'q'",
        ),
    ],
)
def test_bad_coefficient_file_is_one_line(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert (
        main(["generate", "synthetic", "--n", "2", "--cost-model", str(bad), "-o", str(tmp_path / "i.json")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_unknown_cost_model_name_lists_the_choices(capsys):
    with pytest.raises(
        InputError, match=r"not a cost model .* a coefficient file, or a shipped coefficient set"
    ):
        resolve_cost_model("nope")


def test_a_fit_that_cannot_be_done_names_the_table(tmp_path, monkeypatch, capsys):
    """A FitError (the fits do not know files) reaches the user prefixed by the table it came from."""
    import kvsched.costmodel.calibrate as cal
    from kvsched.costmodel.fitting import FitError

    def unfittable(*args, **kwargs):
        raise FitError("the table cannot be fitted: least squares gives non-finite coefficients")

    path = DATA_DIR / PACKAGED_COMPUTE[("llama-2-7b", "a100-80gb")]
    monkeypatch.setattr(cal, "fit_token_term", unfittable)
    with pytest.raises(
        InputError, match=rf"^{path}: the table cannot be fitted: least squares gives non-finite"
    ):
        calibrate(path, folds=3)
    assert main(["calibrate", str(path), "--folds", "3", "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: the table cannot be fitted" in err
    assert not (tmp_path / "o.json").exists()


# ------------------------------------------------------------ F10: the derivation check names its data
def test_the_tp8_derivation_check_names_the_model_it_checks_and_is_printed_once(a100, h100):
    """The check is on the Llama-2-7B/A100 sample whatever the target: its row used to read as the target's."""
    import importlib.util

    for cal in (a100, h100):
        checks = [r.rows for r in cal.fidelity if "derived" in r.rows]
        assert checks == ["prefill attn (layer) tp=8, derived (llama-2-7b on a100-80gb)"]
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "costmodel_fidelity.py"
    spec = importlib.util.spec_from_file_location("costmodel_fidelity", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lines = bench.markdown([a100, h100]).splitlines()
    derived = [line for line in lines if "derived" in line]
    assert len(derived) == 1 and derived[0].startswith("| llama-2-7b | a100-80gb | 1 |")
    # The docs table is what --markdown prints: it holds that one row, with the same label.
    docs = (Path(__file__).resolve().parents[1] / "docs" / "costmodels.md").read_text()
    assert derived[0] in docs
