"""``replay``, ``profile`` and ``calibrate --from-replay``: Ctrl-C, atomic tables, bounds and damaged tables.

The tiny model on CPU, one thread, no warm-up. Ctrl-C is a KeyboardInterrupt raised from inside the
engine at a chosen batch, as the signal handler raises it between two bytecodes of a long run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsched.cli import main
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.errors import InputError
from kvsched.executor.measure import read_replay, write_replay
from tests.test_executor import _synthetic_replay, instances, run
from tests.test_executor_cli import FAST, SHIPPED, _replay, files  # noqa: F401 (files: a fixture)

TRUTH = CalibratedCost.from_params(a0=9e-3, a1=1.2e-5, b0=4e-4, b1=2.7e-7, b2=3e-5, p0=1.2e-3, p2=3.5e-7)


@pytest.fixture(scope="module")
def model(torch):
    from kvsched.executor.model import Decoder, decoder_config

    return Decoder(decoder_config("tiny"))


def _interrupt_at(monkeypatch, calls: int) -> None:
    """Make the engine's ``calls``-th batch (counting from 1) raise KeyboardInterrupt."""
    from kvsched.executor.engine import Engine

    step, seen = Engine.step, []

    def interrupted_step(self, plan, repeat=1):
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return step(self, plan, repeat)

    monkeypatch.setattr(Engine, "step", interrupted_step)


def _no_model(monkeypatch) -> None:
    import kvsched.commands.executor as ex

    monkeypatch.setattr(ex, "_model", lambda args: pytest.fail("the model was built"))


# ---------------------------------------------------------------- Ctrl-C keeps what was measured
def test_ctrl_c_in_a_replay_keeps_the_batches_measured(torch, files, capsys, monkeypatch):  # noqa: F811
    _interrupt_at(monkeypatch, 4)
    trace = files / "t.json"
    assert _replay(files, "--check-oracle", "--trace", str(trace)) == 130
    err = capsys.readouterr().err
    assert "kept the 3 of" in err and "interrupted (Ctrl-C)" in err and "Traceback" not in err
    table = pd.read_csv(files / "m.csv")
    assert list(table.batch) == [0, 1, 2] and (table.measured_s > 0).all()
    meta = json.loads((files / "m.json").read_text())
    assert meta["interrupted"] is True and meta["batches_measured"] == 3 and meta["batches"] > 3
    assert "oracle" not in meta and not trace.exists()  # both need every batch


def test_ctrl_c_before_any_batch_writes_nothing(torch, files, capsys, monkeypatch):  # noqa: F811
    _interrupt_at(monkeypatch, 1)
    (files / "m.csv").write_text("an older table\n")
    assert _replay(files) == 130
    assert "before any batch was measured" in capsys.readouterr().err
    assert (files / "m.csv").read_text() == "an older table\n"


def test_the_api_returns_the_batches_measured_before_ctrl_c(model, monkeypatch):
    from tests.test_executor import schedule_of

    _interrupt_at(monkeypatch, 3)
    result = run(model, instances()["chunked"], schedule_of("sarathi", "chunked"))
    assert result.interrupted and len(result.table) == 2 and result.meta["batches_measured"] == 2


def test_ctrl_c_in_a_profile_keeps_the_tables_finished(torch, tmp_path, capsys, monkeypatch):
    # The whole batches come last, through the engine: the operator and attention tables are done by then.
    _interrupt_at(monkeypatch, 3)  # (each batch runs once untimed, then timed: the second batch's first)
    argv = ["profile", "--out", str(tmp_path), "--grid", "quick", "--repeat", "1", *FAST]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert "kept what was measured before Ctrl-C" in captured.err
    assert pd.read_csv(tmp_path / "mlp.csv").shape[0] == 6 and (tmp_path / "attention.csv").is_file()
    assert pd.read_csv(tmp_path / "batches.csv").shape[0] == 1
    meta = json.loads((tmp_path / "batches.json").read_text())
    assert meta["interrupted"] is True and meta["rows"]["batches"] == 1


# ---------------------------------------------------------------- writes
def test_an_interrupted_write_leaves_the_previous_table(tmp_path, monkeypatch):
    import kvsched.executor.measure as measure

    table = tmp_path / "m.csv"
    _synthetic_replay(table, TRUTH, n=6)
    before = table.read_bytes(), (tmp_path / "m.json").read_bytes()

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure.json, "dumps", interrupt)  # between the table's text and the metadata's
    with pytest.raises(KeyboardInterrupt):
        write_replay(pd.read_csv(table).iloc[:2], {}, table)
    assert (table.read_bytes(), (tmp_path / "m.json").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "m.json"]  # no temporary file left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_refused_write_names_the_file(torch, files, capsys):  # noqa: F811
    argv = ["replay", str(files / "inst.json"), str(files / "sched.json"), "--out", "/dev/full", *FAST]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvsched replay: error: --out: /dev/full cannot be written (No space left on device)"]


# ---------------------------------------------------------------- flags and arguments
def test_an_oracle_limit_needs_check_oracle(torch, files, capsys, monkeypatch):  # noqa: F811
    _no_model(monkeypatch)
    assert _replay(files, "--oracle-limit", "3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--oracle-limit" in err[0] and "--check-oracle" in err[0]


@pytest.mark.parametrize("flag", ["--repeat", "--warmup"])
def test_repeat_and_warmup_are_bounded(torch, files, capsys, monkeypatch, flag):  # noqa: F811
    _no_model(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        _replay(files, flag, "1000000000")
    assert exc.value.code == 2 and "must be from" in capsys.readouterr().err


def test_a_pool_of_less_than_a_block_names_the_flag(torch, tmp_path, capsys, monkeypatch):
    _no_model(monkeypatch)
    assert main(["profile", "--out", str(tmp_path), "--pool-tokens", "1", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pool-tokens: 1 holds no KV block of 16 tokens" in err[0]


@pytest.mark.parametrize(
    ("argument", "value"),
    [("repeat", 0), ("repeat", -1), ("repeat", 2.5), ("repeat", True), ("warmup", -1), ("pool_capacity", 0)],
)
def test_the_api_refuses_what_the_command_line_refuses(model, argument, value):
    from tests.test_executor import schedule_of

    kw = {"warmup": 0, argument: value}
    with pytest.raises(InputError, match=f"^{argument}: "):
        from kvsched.executor.runner import replay_on_model

        replay_on_model(model, instances()["chunked"], schedule_of("sarathi", "chunked"), **kw)


@pytest.mark.parametrize("limit", [0, -1, 2.5])
def test_an_oracle_limit_below_one_is_refused(model, limit):
    from kvsched.executor.oracle import check_oracle

    instance = instances()["chunked"]
    with pytest.raises(InputError, match=r"^limit: "):
        check_oracle(model, instance, [np.zeros(1, np.int64)] * len(instance), [[]] * len(instance), limit)


def test_a_schedule_of_another_cost_model_says_to_name_it(torch, files, capsys, monkeypatch):  # noqa: F811
    from kvsched.costmodel import make_cost_model
    from kvsched.costmodel.coeffile import resolve_cost_model
    from kvsched.heuristics import make_policy, simulate
    from kvsched.schedule.io import save_schedule

    instance = instances()["chunked"]
    timed = simulate(
        instance, make_policy("sarathi"), cost_model=make_cost_model(*resolve_cost_model(SHIPPED))
    )
    save_schedule(timed.schedule, instance, files / "timed.json")
    _no_model(monkeypatch)
    assert _replay(files, schedule="timed.json") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[wrong-duration]" in err[0] and "pass the same --cost-model" in err[0]


# ---------------------------------------------------------------- damaged tables (no torch)
def test_a_truncated_row_is_refused_naming_its_line(tmp_path, capsys):
    table = tmp_path / "m.csv"
    _synthetic_replay(table, TRUTH, n=12)
    text = table.read_text()
    cut = text[: text.rstrip("\n").rindex(",", 0, text.rstrip("\n").rindex(",")) + 6]  # inside measured_s
    table.write_text(cut)
    assert main(["calibrate", "--from-replay", str(table), "-o", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 13: 19 fields, the header has 20 (a truncated file?)" in err[0]
    assert not (tmp_path / "f.json").exists()


def test_a_prediction_column_empty_in_part_is_refused(tmp_path):
    table = tmp_path / "m.csv"
    _synthetic_replay(table, TRUTH, n=12)
    df = pd.read_csv(table)
    df.loc[4, "predicted_s"] = np.nan
    df.to_csv(table, index=False)
    with pytest.raises(InputError, match=r"column 'predicted_s', line 6: empty, but 11 other rows"):
        read_replay(table)
    df["predicted_s"] = np.nan  # a profile without --cost-model: no prediction at all, no "before"
    df.to_csv(table, index=False)
    assert read_replay(table).predicted is None


def test_the_before_line_says_whose_prediction_it_is(tmp_path, capsys):
    table = tmp_path / "batches.csv"
    _synthetic_replay(table, TRUTH, n=30)
    meta = {"kind": "kvsched.profile", "predicted_with": {"name": "calibrated"}}
    (tmp_path / "batches.json").write_text(json.dumps(meta))
    assert main(["calibrate", "--from-replay", str(table), "-o", str(tmp_path / "f.json")]) == 0
    shown = capsys.readouterr().out
    assert "profile's" in shown and "replay's" not in shown  # (the label wraps in the table)
    df = pd.read_csv(table)
    df["predicted_s"] = np.nan
    df.to_csv(table, index=False)
    assert main(["calibrate", "--from-replay", str(table), "-o", str(tmp_path / "g.json")]) == 0
    assert "no 'before' line: batches.csv's predicted_s column is empty" in capsys.readouterr().out
