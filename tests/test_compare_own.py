"""Your own scheduler in a comparison: Policy objects beside registered names, and schedules made elsewhere."""

import json
import time
from types import MappingProxyType

import pandas as pd
import pytest

import kvsched as kv
from kvsched.analysis import compare
from kvsched.cli import main
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.instances.io import load_instance
from tests.test_examples import EXAMPLES
from tests.test_heuristics_own import POLICY_FILE

FIG15 = load_instance(EXAMPLES / "figure15.json")
TOTAL = OBJECTIVES["total-latency"]


class FirstComeWhole:
    """Requests one at a time, whole prompt then every decode: always legal, never fast."""

    name = "one-at-a-time"
    uses_true_output = False
    params = MappingProxyType({})

    def reset(self, instance):
        self.resets = getattr(self, "resets", 0) + 1

    def next_batch(self, view):
        active = view.active()
        if not active.size:
            return None
        r = int(active[0])
        return kv.Decision([r], [int(view.unprocessed(r))])


class Greedy(FirstComeWhole):
    """Admits every waiting prompt at once, whatever the memory: the core refuses its first batch that overflows."""

    name = "greedy-overflow"

    def next_batch(self, view):
        active = view.active()
        if not active.size:
            return None
        return kv.Decision(active.tolist(), [int(view.unprocessed(int(r))) for r in active])


def test_a_policy_object_is_a_row_named_by_its_name_and_measured_by_the_core():
    mine = FirstComeWhole()
    cmp = compare(FIG15, [mine, "vllm"], solver=None)
    t = cmp.table
    assert list(t.index) == ["one-at-a-time", "vllm"]
    assert mine.resets == 1
    trace = kv.validate(FIG15, cmp.schedules["one-at-a-time"])
    assert trace.ok and t.loc["one-at-a-time", "objective"] == TOTAL(trace)
    # One request at a time on figure 15 (4 requests, 4 + 8 + 12 + 16 slots) is the eviction-free serial order.
    assert t.loc["one-at-a-time", "objective"] == 40


def test_a_single_policy_object_and_the_regret_interval_against_the_solve():
    cmp = compare(FIG15, FirstComeWhole(), formulation="batch", solver="cpsat",
                  options=kv.SolverOptions(time_limit=30, threads=1))  # fmt: skip
    assert cmp.result.status == kv.SolveStatus.OPTIMAL and cmp.result.objective == 36
    assert cmp.table.loc["one-at-a-time", "regret_vs_solver"] == 4


def test_an_illegal_decision_is_the_rows_error_not_the_end_of_the_comparison():
    tight = kv.Instance(
        requests=FIG15.requests, limits=kv.Limits(kv_capacity=FIG15.limits.kv_capacity), name="fig15"
    )
    cmp = compare(tight, [Greedy(), "vllm"], solver=None)
    assert "kv" in cmp.table.loc["greedy-overflow", "error"].lower()
    assert cmp.table.loc["vllm", "objective"] == 36


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ([FirstComeWhole, "vllm"], r"policies: FirstComeWhole is a class: pass an instance"),
        ([object()], r"policies: expected a policy name or a Policy object, got object \(it has no name"),
        ([FirstComeWhole(), FirstComeWhole()], r"'one-at-a-time' given more than once"),
        ([type("Named", (FirstComeWhole,), {"name": "vllm"})(), "vllm"], r"'vllm' given more than once"),
        ([type("Blank", (FirstComeWhole,), {"name": " "})()], r"name names its row: expected a non-empty"),
        ([type("Flat", (FirstComeWhole,), {"next_batch": 3})()], r"Flat.next_batch is not a method"),
        ([FirstComeWhole(), "nope"], r"unknown policy 'nope'"),
    ],
)
def test_a_policy_list_that_cannot_run_is_one_input_error(policies, message):
    with pytest.raises(InputError, match=message):
        compare(FIG15, policies, solver=None)


def test_policy_params_cannot_name_a_policy_object():
    with pytest.raises(InputError, match=r"'one-at-a-time' is a Policy object: give its parameters"):
        compare(FIG15, [FirstComeWhole()], solver=None, policy_params={"one-at-a-time": {"x": 1}})


def _vllm_schedule():
    return kv.simulate(FIG15, kv.make_policy("vllm")).schedule


def test_a_schedule_made_elsewhere_is_replayed_measured_and_warm_starts_the_solve():
    cmp = compare(FIG15, "sarathi-ef", schedules={"engine-log": _vllm_schedule()}, formulation="batch",
                  solver="cpsat", options=kv.SolverOptions(time_limit=30, threads=1))  # fmt: skip
    t = cmp.table
    assert t.loc["engine-log", "kind"] == "schedule" and t.loc["engine-log", "objective"] == 36
    assert t.loc["engine-log", "regret_vs_solver"] == 0 and t.loc["sarathi-ef", "regret_vs_solver"] == 4
    assert cmp.result.objective <= 36


def test_an_illegal_schedule_is_a_row_with_its_first_violation():
    sched = _vllm_schedule()
    longer = kv.Schedule([b if k != 2 else _longer(b) for k, b in enumerate(sched.entries)], sched.meta)
    cmp = compare(FIG15, [], solver=None, schedules={"late": longer, "other": sched})
    err = cmp.table.loc["late", "error"]
    assert err.startswith("illegal schedule (") and "batch 2: [wrong-duration]" in err
    assert "kvsched.retime(instance, schedule, cost_model) rebuilds them" in err
    assert cmp.table.loc["other", "objective"] == 36
    fixed = kv.retime(FIG15, longer, kv.make_cost_model("unit"))
    assert compare(FIG15, [], solver=None, schedules={"fixed": fixed}).table.loc["fixed", "objective"] == 36


def _longer(batch):
    import dataclasses

    return dataclasses.replace(batch, duration=batch.duration + 3)


def test_a_schedule_of_another_instance_is_refused_in_its_row():
    other = kv.simulate(kv.generate("sharegpt", n=12), kv.make_policy("vllm")).schedule
    cmp = compare(FIG15, [], solver=None, schedules={"other": other})
    err = cmp.table.loc["other", "error"]
    assert err.startswith("illegal schedule (") and "retime" not in err


@pytest.mark.parametrize(
    ("schedules", "message"),
    [
        ([1], r"schedules: expected a mapping of names to Schedule objects, got list"),
        ({"": None}, r"each schedule is named by a non-empty string"),
        ({"vllm": None}, r"'vllm' is also a policy's name"),
        ({"x": "file.json"}, r"schedules\['x'\]: expected a kvsched Schedule, got str"),
    ],
)
def test_bad_schedules_are_one_input_error(schedules, message):
    with pytest.raises(InputError, match=message):
        compare(FIG15, ["vllm"], solver=None, schedules=schedules)


# ----------------------------------------------------------------------------- the command line
FIG15_PATH = str(EXAMPLES / "figure15.json")


def test_compare_schedule_files_on_the_command_line(tmp_path, capsys):
    mine = tmp_path / "mine.json"
    assert main(["simulate", FIG15_PATH, "-p", "vllm", "-o", str(mine)]) == 0
    doc = json.loads(mine.read_text())
    doc["batches"][1]["duration"] += 2.0  # as measured on an engine, not the unit model's
    late = tmp_path / "late.json"
    late.write_text(json.dumps(doc))
    js = tmp_path / "cmp.json"
    args = ["compare", FIG15_PATH, "--policies", "none", "--no-solver", "--json", str(js)]
    assert main([*args, "--schedule", str(mine), "--schedule", f"measured={late}"]) == 0
    out = capsys.readouterr().out
    assert "measured: refused: illegal schedule" in out and "--retime" in out
    rows = {r["name"]: r for r in json.loads(js.read_text())["rows"]}
    assert rows["mine"]["objective"] == 36 and rows["measured"]["objective"] is None
    assert main([*args, "--schedule", f"measured={late}", "--retime"]) == 0
    rows = {r["name"]: r for r in json.loads(js.read_text())["rows"]}
    assert rows["measured"]["objective"] == 36


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--schedule", "nothere.json"], "--schedule nothere: nothere.json is not a file"),
        (["--schedule", "vllm={mine}", "--policies", "vllm"], "'vllm' is also a policy's name"),
        (["--schedule", "{mine}", "--schedule", "{mine}"], "two schedules named 'mine'"),
        (["--schedule", "{mine}", "--csv", "{mine}"], "--csv: "),
        (["--schedule", "{bad}"], "--schedule bad: "),
    ],
)
def test_compare_schedule_file_errors_are_one_line(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.json"
    assert main(["simulate", FIG15_PATH, "-p", "vllm", "-o", str(mine)]) == 0
    (tmp_path / "bad.json").write_text("{")
    before = mine.read_bytes()
    capsys.readouterr()
    argv = [
        "compare",
        FIG15_PATH,
        "--no-solver",
        *[e.format(mine=mine, bad=tmp_path / "bad.json") for e in extra],
    ]
    if "--policies" not in extra:
        argv += ["--policies", "none"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert mine.read_bytes() == before


def test_report_takes_schedule_files_too(tmp_path, capsys):
    mine = tmp_path / "mine.json"
    assert main(["simulate", FIG15_PATH, "-p", "vllm", "-o", str(mine)]) == 0
    out = tmp_path / "rep"
    argv = ["report", FIG15_PATH, "--policies", "sarathi-ef", "--schedule", f"engine={mine}", "--no-solver"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "engine" in capsys.readouterr().out
    assert ">engine<" in (out / "index.html").read_text()
    assert main([*argv, "--out", str(mine)]) != 0  # the folder may not be an input
    assert "--out" in capsys.readouterr().err


def test_a_sweep_runs_your_own_policy_file_and_keeps_going_past_its_bug(tmp_path):
    import yaml

    from kvsched.analysis.spec import load_spec
    from kvsched.analysis.store import load_results
    from kvsched.analysis.sweep import run_sweep

    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "mine.py").write_text(POLICY_FILE)
    spec = {
        "name": "own",
        "instances": [{"generator": "sharegpt", "n": 12, "kv_capacity": 3000, "seeds": 2}],
        "policies": [
            "vllm",
            {"name": "own/mine.py:Serial", "label": "mine"},
            {"name": "own/mine.py:Serial", "label": "buggy", "params": {"crash_at": 3}},
        ],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_sweep(load_spec(path), tmp_path / "r.sqlite", workers=1, progress=False, base=tmp_path)
    assert done.total == 6
    frame = load_results(tmp_path / "r.sqlite").set_index(["name", "seed"]).sort_index()
    assert (frame.loc["mine", "status"] == "ok").all() and (frame.loc["vllm", "status"] == "ok").all()
    # One request at a time is never better than vLLM's batches here.
    assert (frame.loc["mine", "objective"] >= frame.loc["vllm", "objective"]).all()
    assert (frame.loc["buggy", "status"] == "error").all()
    assert frame.loc["buggy", "error"].str.contains("next_batch raised ZeroDivisionError: my bug").all()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**spec, "policies": ["own/mine.py:Nope"]}))
    with pytest.raises(InputError, match=r"policies.0: .*mine.py:Nope: .*has no 'Nope'"):
        load_spec(bad)


def test_report_refuses_the_bundled_examples_before_any_work(capsys):
    import kvsched

    started = time.monotonic()
    assert main(["report", FIG15_PATH, "--out", str(kvsched.EXAMPLES_DIR)]) == 2
    assert "--out: " in capsys.readouterr().err and time.monotonic() - started < 5
    assert not (kvsched.EXAMPLES_DIR / "index.html").exists()


class CtrlC(FirstComeWhole):
    """Pressed Ctrl-C while it ran."""

    name = "ctrl-c"

    def next_batch(self, view):
        raise KeyboardInterrupt


def test_ctrl_c_during_the_policies_keeps_the_rows_finished_and_starts_nothing():
    from kvsched.analysis.compare import INTERRUPTED

    cmp = compare(FIG15, ["vllm", CtrlC(), "sarathi"], solver="highs")
    t = cmp.table
    assert cmp.interrupted == "during the policies" and cmp.result is None  # no solve after Ctrl-C
    assert t.loc["vllm", "objective"] == 36 and pd.isna(t.loc["vllm", "error"])
    assert list(t.loc[["ctrl-c", "sarathi"], "error"]) == [INTERRUPTED, INTERRUPTED]
    assert not compare(FIG15, ["vllm"], solver=None).interrupted
