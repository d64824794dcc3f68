"""The simulate, policies, solve and compare commands."""

import json
import os
import subprocess
import sys

from kvsched.cli import main
from kvsched.instances.io import load_instance
from kvsched.schedule.io import load_schedule
from kvsched.schedule.validate import replay
from tests.test_examples import EXAMPLES

FIG15 = str(EXAMPLES / "figure15.json")


def test_policies_lists_the_registry(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "sarathi" in out and "vllm-ef" in out and "seed 003" in out


def test_simulate_writes_a_valid_schedule(tmp_path, capsys):
    out = tmp_path / "s.json"
    csv = tmp_path / "r.csv"
    assert main(["simulate", FIG15, "-p", "vllm", "-o", str(out), "--requests-csv", str(csv)]) == 0
    assert "evictions" in capsys.readouterr().out
    inst = load_instance(FIG15)
    sched = load_schedule(out, inst)
    assert len(sched) == 14 and replay(inst, sched).ok
    assert csv.read_text().count("\n") == 5  # header + 4 requests


def test_solve_writes_schedule_and_result(tmp_path, capsys):
    out, res, mps = tmp_path / "s.json", tmp_path / "r.json", tmp_path / "m.mps"
    args = ["solve", FIG15, "--time-limit", "20", "-o", str(out), "--json", str(res), "--export", str(mps)]
    assert main(args) == 0
    doc = json.loads(res.read_text())
    # --formulation auto: the exact batch-indexed model, over every legal schedule (evictions pay here).
    assert doc["status"] == "optimal" and doc["objective"] == 36 and doc["best_bound"] == 36
    assert doc["scope"] == "all" and doc["stats"]["auto"].endswith("(every legal schedule)")
    inst = load_instance(FIG15)
    assert replay(inst, load_schedule(out, inst)).ok
    assert mps.stat().st_size > 0


def test_compare_csv_and_json(tmp_path):
    csv, js = tmp_path / "c.csv", tmp_path / "c.json"
    assert main(["compare", FIG15, "--policies", "vllm,vllm-ef", "--csv", str(csv), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    names = {r["name"] for r in doc["rows"]}
    assert {"vllm", "vllm-ef"} <= names and doc["result"]["objective"] == 36  # auto: every legal schedule
    assert "regret" in csv.read_text().splitlines()[0]


def test_bad_input_lines(tmp_path):
    # An empty numba cache, as on a fresh install (CI): no note about cold kernels may join the error line.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for args, text in (
        (["simulate", FIG15, "-p", "nope"], "-p/--policy: unknown policy 'nope'"),
        (["simulate", FIG15, "-p", "vlm"], "did you mean 'vllm'"),
        (["compare", FIG15, "--policies", "vllm,vllm"], "--policies: 'vllm' given more than once"),
        (["simulate", FIG15, "-p", "vllm", "--param", "bogus=1"], "unknown parameter"),
        (["compare", FIG15, "--policies", "vllm,zzz"], "unknown policy 'zzz'"),
        (["solve", FIG15, "--time-limit", "-1"], "--time-limit"),
        (
            ["solve", str(EXAMPLES / "sharegpt-small.json"), "--formulation", "time"],
            "needs the unit time model",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kvsched.cli", *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert text in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_solve_no_eviction_restricts_the_batch_model(tmp_path):
    evict, plain = tmp_path / "e.json", tmp_path / "p.json"
    base = ["solve", FIG15, "--formulation", "batch", "--solver", "cpsat", "--time-limit", "30"]
    assert main([*base, "--json", str(evict)]) == 0
    assert main([*base, "--no-eviction", "--json", str(plain)]) == 0
    with_evictions, without = json.loads(evict.read_text()), json.loads(plain.read_text())
    assert with_evictions["status"] == without["status"] == "optimal"
    assert without["stats"]["evictions"] == 0
    assert with_evictions["objective"] == 36 and without["objective"] == 40


def test_solver_options_for_the_other_formulation_are_refused(capsys):
    assert main(["solve", FIG15, "--formulation", "time", "--no-eviction"]) == 2
    assert "--no-eviction: applies to --formulation batch or auto" in capsys.readouterr().err
    assert main(["solve", FIG15, "--formulation", "batch", "--no-strengthen"]) == 2
    assert "--no-strengthen: applies to --formulation time only" in capsys.readouterr().err


def test_solve_reports_the_reduced_cost_windows(capsys):
    assert main(["solve", FIG15, "--formulation", "time", "--time-limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "lagrangian bound" in out and "mean window" in out


def test_compare_passes_the_model_options_to_the_solver(tmp_path):
    out = tmp_path / "c.json"
    args = ["compare", FIG15, "--policies", "vllm", "--formulation", "batch", "--solver", "cpsat"]
    assert main([*args, "--no-eviction", "--time-limit", "30", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["result"]["objective"] == 40 and doc["result"]["stats"]["evictions"] == 0


def test_a_warm_start_file_must_be_a_legal_schedule_of_the_instance(tmp_path, capsys):
    # An .npz schedule is a file, not a policy name; another instance's schedule is refused, not dropped.
    npz = tmp_path / "w.npz"
    assert main(["simulate", FIG15, "-p", "vllm", "-o", str(npz)]) == 0
    assert main(["solve", FIG15, "--time-limit", "10", "--warm-start", str(npz)]) == 0
    capsys.readouterr()
    old = str(EXAMPLES / "figure15-vllm.schedule.json")  # no fingerprint: nothing says which instance
    assert main(["solve", str(EXAMPLES / "tiny.json"), "--time-limit", "10", "--warm-start", old]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warm_start: not a legal schedule" in err, err


def test_a_warm_start_policy_is_cut_at_half_the_time_limit(tmp_path, monkeypatch, capsys):
    # --warm-start NAME simulated the policy whatever --time-limit said (minutes at 100k requests).
    import kvsched.heuristics.simulator as simulator

    monkeypatch.setattr(simulator, "DEADLINE_EVERY", 1)
    inst = tmp_path / "i.json"
    assert main(["generate", "synthetic", "--n", "300", "--out", str(inst)]) == 0
    assert main(["solve", str(inst), "--time-limit", "0.05", "--warm-start", "vllm"]) == 0
    assert "--warm-start vllm did not finish within half of --time-limit 0.05; solving without it" in (
        capsys.readouterr().err
    )


def test_a_solve_stopped_by_ctrl_c_writes_its_best_and_exits_130(tmp_path, monkeypatch, capsys):
    # The outputs hold the best schedule and bound found before Ctrl-C; the exit status and a note on
    # stderr say that it is not a finished solve (it exited 0 and said nothing).
    from kvsched.csp import driver, pipeline

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline at this size
    monkeypatch.setattr(pipeline, "_lagrangian", ctrl_c)
    js, out = tmp_path / "r.json", tmp_path / "s.json"
    inst = str(EXAMPLES / "sharegpt-small.json")
    assert main(["solve", inst, "--time-limit", "20", "--json", str(js), "-o", str(out)]) == 130
    assert "interrupted (Ctrl-C): what was written is what was found" in capsys.readouterr().err
    assert json.loads(js.read_text())["stopped"] == "interrupted" and out.is_file()
