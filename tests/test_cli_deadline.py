"""The solve command's own time: output kept from the solve, metrics computed once, where the time went."""

import json

import pytest

from kvsched.cli import main
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule import metrics, serving
from kvsched.schedule.output_time import OUTPUT_SECONDS, OUTPUT_SHARE, output_seconds, solve_deadline
from kvsched.stop import Deadline
from tests.test_examples import EXAMPLES

FIG15 = str(EXAMPLES / "figure15.json")


def _instance(n: int, output: int) -> Instance:
    requests = tuple(Request(f"r{k}", float(k), 10, output) for k in range(n))
    return Instance(requests, Limits(kv_capacity=10 * output), TimeModel("unit"))


def test_output_time_grows_with_tokens_and_with_what_is_written():
    small, large = _instance(10, 10), _instance(1000, 1000)
    assert output_seconds(small) == pytest.approx(OUTPUT_SECONDS, abs=1e-3)
    summary = output_seconds(large)
    assert summary > output_seconds(small)
    assert output_seconds(large, ["summary", "json"]) > summary
    assert output_seconds(large, ["summary", "schedule.json"]) > output_seconds(
        large, ["summary", "schedule.npz"]
    )


def test_the_solve_keeps_the_output_time_but_at_most_half_the_limit(capsys):
    large = _instance(1000, 1000)  # a million output tokens
    deadline = Deadline.after(100.0)
    kept = deadline.end - solve_deadline(deadline, large, ["summary", "json"], warn="solve").end
    assert kept == pytest.approx(output_seconds(large, ["summary", "json"]))
    assert capsys.readouterr().err == ""
    short = Deadline.after(1.0)
    kept = short.end - solve_deadline(short, large, ["summary", "schedule.json"], warn="solve").end
    assert kept == pytest.approx(OUTPUT_SHARE * 1.0)
    err = capsys.readouterr().err
    assert err.startswith("kvsched solve: warning: --time-limit 1: its output (summary, schedule.json)")
    assert ".npz" in err and err.count("\n") == 1
    assert solve_deadline(Deadline.never(), large) == Deadline.never()


def _count_request_metrics(monkeypatch, calls: list) -> None:
    """Count every computation of the per-request columns (``request_columns``, or a whole ``request_metrics``)."""
    columns, frame = metrics.request_columns, metrics.request_metrics
    monkeypatch.setattr(metrics, "request_columns", lambda *a, **k: calls.append(1) or columns(*a, **k))
    monkeypatch.setattr(metrics, "request_metrics", lambda *a, **k: calls.append(1) or frame(*a, **k))
    monkeypatch.setattr(serving, "request_metrics", lambda *a, **k: calls.append(1) or frame(*a, **k))


def test_solve_computes_the_request_metrics_once(tmp_path, monkeypatch):
    calls: list = []
    _count_request_metrics(monkeypatch, calls)
    out = tmp_path / "r.json"
    assert main(["solve", FIG15, "--time-limit", "10", "--json", str(out)]) == 0
    assert len(calls) == 1  # the summary table and the JSON document read one frame
    doc = json.loads(out.read_text())
    assert doc["mean_ttft"] is not None and doc["p99_itl"] is not None
    at = doc["command_seconds"]
    assert 0 < at["loaded"] <= at["solved"] <= at["summarised"] < 10


def test_simulate_computes_the_request_metrics_once(tmp_path, monkeypatch):
    calls: list = []
    _count_request_metrics(monkeypatch, calls)
    args = ["simulate", FIG15, "-p", "vllm", "--json", str(tmp_path / "s.json")]
    assert main([*args, "--requests-csv", str(tmp_path / "r.csv")]) == 0
    assert len(calls) == 1
    assert json.loads((tmp_path / "s.json").read_text())["num_requests"] == 4


def test_a_command_that_ends_past_its_limit_says_where_the_time_went(capsys):
    import time

    from kvsched.commands.common import note_late

    on_time = Deadline(time.monotonic() + 5.0, 10.0)
    note_late(on_time, {"solved": 4.0})
    assert capsys.readouterr().err == ""
    # 10 s limit, ended 6 s ago: the solve returned at 14 s (its first schedule took that long).
    late_solve = Deadline(time.monotonic() - 6.0, 10.0)
    note_late(late_solve, {"solved": 14.0})
    err = capsys.readouterr().err
    assert err.startswith(
        "kvsched solve: note: ended 6.0 s past --time-limit 10 (the solve returned at 14.0 s"
    )
    # Solved at 9 s, ended at 16 s: the output's 7 s.
    late_output = Deadline(time.monotonic() - 6.0, 10.0)
    note_late(late_output, {"solved": 9.0})
    assert "(the output took 7.0 s after the solve)" in capsys.readouterr().err
    # Within max(1 s, 5%) of the limit is on time.
    note_late(Deadline(time.monotonic() - 0.5, 10.0), {"solved": 9.0})
    assert capsys.readouterr().err == ""
