"""The public API: ``kvsched``'s names resolve, importing it stays light, docs/api.md's example runs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvsched
from kvsched.analysis.compare import compare
from kvsched.errors import InputError
from kvsched.instances.io import load_instance

DOCS = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_every_exported_name_resolves():
    assert set(kvsched.__all__) == {"EXAMPLES_DIR", "__version__", "example", *kvsched._EXPORTS}
    for name in kvsched.__all__:
        value = getattr(kvsched, name)
        assert value is not None, name
        module = kvsched._EXPORTS.get(name)
        if module is not None:  # the same object as at its home
            assert value is getattr(sys.modules[module], name)
    assert set(kvsched.__all__) <= set(dir(kvsched))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kvsched.nope  # noqa: B018


def test_the_issue_nouns_are_there():
    for name in (
        "Instance",
        "Request",
        "Limits",
        "load_instance",
        "save_instance",
        "Schedule",
        "validate",
        "simulate",
        "POLICIES",
        "solve",
        "Result",
        "compare",
        "run_metrics",
        "serving_metrics",
        "make_cost_model",
        "InputError",
    ):
        assert name in kvsched.__all__


def test_import_is_light():
    code = (
        "import sys, kvsched\n"
        "heavy = [m for m in ('torch', 'ortools', 'highspy', 'matplotlib', 'pandas', 'kvsched.csp') "
        "if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_example_paths():
    assert kvsched.example("figure15").name == "figure15.json"
    with pytest.raises(InputError, match=r"unknown example 'nope'.*figure15"):
        kvsched.example("nope")


def test_docs_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, "docs/api.md has no python block"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(DOCS), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert "optimal 36.0 proven bound 36.0" in out
    assert "vllm: regret 0" in out and "sarathi-ef: regret 4" in out
    assert (tmp_path / "optimum.png").stat().st_size > 0


# ----------------------------------------------------------------------------- compare's arguments
FIG15 = load_instance(kvsched.example("figure15"))


def test_compare_all_means_every_policy():
    cmp = compare(FIG15, "all", solver=None)
    assert list(cmp.table.index) == list(kvsched.POLICIES)
    cmp = compare(FIG15, "vllm, sarathi", solver=None)
    assert list(cmp.table.index) == ["vllm", "sarathi"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policies": ["vllm", "nope"]}, r"^policies: unknown policy 'nope'"),
        ({"policies": "vllm,nope"}, r"^policies: unknown policy 'nope'"),
        ({"policies": ["vllm", "vllm"]}, r"^policies: 'vllm' given more than once"),
        ({"policies": 3}, r"^policies: expected 'all'"),
        ({"policies": [3]}, r"^policies: expected a policy name or a Policy object, got int"),
        ({"policies": ["vllm"], "objective": "speed"}, r"^objective: unknown objective 'speed'"),
        ({"policies": ["vllm"], "solver": "gurobi"}, r"^solver: unknown solver 'gurobi'"),
        ({"policies": ["vllm"], "formulation": "token"}, r"^formulation: unknown formulation 'token'"),
        ({"policies": ["vllm"], "policy_params": {"sarathi": {}}}, r"^policy_params: 'sarathi' not among"),
        (
            {"policies": ["vllm"], "policy_params": {"vllm": {"bogus": 1}}},
            r"^policy_params: .*unknown parameter",
        ),
    ],
)
def test_compare_refuses_bad_arguments(kwargs, message):
    with pytest.raises(InputError, match=message):
        compare(FIG15, solver=kwargs.pop("solver", None), **kwargs)


# ----------------------------------------------------------------------------- policies and their papers
def test_every_policy_names_its_paper():
    from kvsched.heuristics.papers import PAPERS

    for spec in kvsched.list_policies():
        paper = spec.paper
        assert paper is not None, spec.name
        assert paper.title and paper.authors and 2020 < paper.year < 2030
        assert re.fullmatch(r"\d{4}\.\d{5}", paper.arxiv)
    assert {s.paper.seed for s in kvsched.list_policies()} == set(PAPERS)


def test_policies_command_prints_whole_descriptions(capsys):
    from kvsched.cli import main

    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for spec in kvsched.list_policies():
        assert spec.name in out and spec.paper.arxiv in out
    assert "does none of these." in flat  # the end of vLLM's 400-character description
    for paper in {s.paper for s in kvsched.list_policies()}:
        assert paper.arxiv in out and str(paper.year) in out


def test_generate_defaults_to_what_the_command_line_uses():
    inst = kvsched.generate("sharegpt", n=4)
    assert len(inst) == 4
    assert inst.limits == kvsched.Limits(100_000)
    assert inst.time_model == kvsched.TimeModel("unit")
    assert inst.requests == kvsched.generate("sharegpt", n=4, seed=0).requests
    assert (
        kvsched.generate("sharegpt", n=2, time_model="infermax-linear").time_model.name == "infermax-linear"
    )


def test_the_instances_package_exports_its_nouns():
    from kvsched.instances import Instance, Limits, Request, TimeModel, load_instance, save_instance

    assert load_instance is kvsched.load_instance and save_instance is kvsched.save_instance
    assert {Instance, Limits, Request, TimeModel} <= {
        kvsched.Instance,
        kvsched.Limits,
        kvsched.Request,
        kvsched.TimeModel,
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda inst: kvsched.simulate(inst, "vllm"), r"^policy: expected a Policy, got the name 'vllm'"),
        (
            lambda inst: kvsched.simulate("figure15.json", kvsched.make_policy("vllm")),
            r"^instance: expected an",
        ),
        (lambda inst: kvsched.solve(inst, options=kvsched.SolverOptions(gap=2)), r"^options.gap: must be in"),
        (
            lambda inst: kvsched.solve(inst, options=kvsched.SolverOptions(threads=0)),
            r"^options.threads: must",
        ),
        (
            lambda inst: kvsched.solve(inst, options={"time_limit": 5}),
            r"^options: expected kvsched.SolverOptions",
        ),
        (lambda inst: kvsched.save_instance(inst, Path(__file__).parent), r"is a folder, not a file$"),
        (
            lambda inst: kvsched.solve(inst, options=kvsched.SolverOptions(time_limit=-1)),
            r"^options.time_limit: -1 must be a positive",
        ),
        (lambda inst: kvsched.solve(inst, time_limit=float("nan")), r"^time_limit: nan must be"),
        (lambda inst: kvsched.validate(inst, None), r"^schedule: expected a kvsched Schedule, got NoneType$"),
        (
            lambda inst: kvsched.validate(inst, kvsched.simulate(inst, kvsched.make_policy("vllm"))),
            r"got SimResult \(pass its .schedule\)$",
        ),
        (lambda inst: kvsched.plot_gantt(inst, None), r"^schedule: expected a kvsched Schedule"),
        (
            lambda inst: kvsched.serving_metrics(kvsched.simulate(inst, kvsched.make_policy("vllm"))),
            r"^traces: expected a Trace .* got SimResult \(pass its .trace\)$",
        ),
        (
            lambda inst: kvsched.request_metrics(kvsched.simulate(inst, kvsched.make_policy("vllm"))),
            r"^trace: expected a Trace",
        ),
        (lambda inst: kvsched.batch_metrics(None), r"^trace: expected a Trace .* got NoneType$"),
        (lambda inst: kvsched.generate("sharegpt", n=3, limits={"kv_capacity": 5}), r"limits: expected"),
        (
            lambda inst: kvsched.save_schedule(
                inst, kvsched.simulate(inst, kvsched.make_policy("vllm")).schedule, "x"
            ),
            r"^schedule: expected a kvsched Schedule, got Instance$",
        ),
        (
            lambda inst: kvsched.retime(
                inst, kvsched.simulate(inst, kvsched.make_policy("vllm")).schedule, "unit"
            ),
            r"^timing: expected a cost model or one duration per batch, got str$",
        ),
        (lambda inst: kvsched.save_figure(None, "x.png"), r"^fig: expected a matplotlib Figure"),
        (
            lambda inst: kvsched.compare(inst, ["vllm"], solver=None, slo="ttft=1"),
            r"^slo: expected kvsched.SLO\(.*got str \(kvsched.parse_slo\('ttft=1', unit\) reads that form\)$",
        ),
        (
            lambda inst: kvsched.simulate(inst, kvsched.make_policy("vllm"), cost_model="unit"),
            r"^cost_model: expected a cost model",
        ),
        (
            lambda inst: kvsched.simulate(inst, kvsched.make_policy("vllm"), deadline=5),
            r"^deadline: expected",
        ),
        (
            lambda inst: kvsched.validate(
                inst, kvsched.simulate(inst, kvsched.make_policy("vllm")).schedule, "unit"
            ),
            r"^cost_model: expected a cost model, got the name 'unit': use kvsched.make_cost_model$",
        ),
        (
            lambda inst: kvsched.replay(
                inst, kvsched.simulate(inst, kvsched.make_policy("vllm")).schedule, 3
            ),
            r"^cost_model: expected a cost model \(kvsched.make_cost_model\), got int$",
        ),
        (
            lambda inst: kvsched.solve(inst, warm_start="vllm"),
            r"^warm_start: expected a kvsched Schedule, got str$",
        ),
        (
            lambda inst: kvsched.plot_kv(inst, []),
            r"^schedules: expected a mapping of names to schedules, got list$",
        ),
        (lambda inst: kvsched.plot_anytime(None), r"^source: expected a solve's Result"),
        (
            lambda inst: kvsched.simulate(
                kvsched.Instance(inst.requests, kvsched.Limits(8, max_batch_tokens=-1)),
                kvsched.make_policy("vllm"),
            ),
            r"^limits.max_batch_tokens: must be an int from 1 to 2147483647 \(or None: unlimited\), got -1$",
        ),
        (
            lambda inst: kvsched.simulate(
                kvsched.Instance(inst.requests, kvsched.Limits(8.0)), kvsched.make_policy("vllm")
            ),
            r"^limits.kv_capacity: must be an int from 1 to 2147483647, got 8.0$",
        ),
        (
            lambda inst: kvsched.solve(kvsched.Instance(inst.requests, kvsched.Limits(10**20))),
            r"^limits.kv_capacity: must be an int from 1 to 2147483647, got 100000000000000000000$",
        ),
        (
            lambda inst: kvsched.solve(kvsched.Instance(inst.requests, kvsched.Limits(8, block_size=16))),
            r"^limits.block_size: 16 is larger than kv_capacity 8$",
        ),
        (
            lambda inst: kvsched.generate("sharegpt", n=3, time_model=5),
            r"time_model: expected kvsched.TimeModel",
        ),
    ],
)
def test_wrong_arguments_raise_input_error_naming_them(call, message):
    with pytest.raises(InputError, match=message):
        call(load_instance(kvsched.example("figure15")))


def _every_entry_point_refuses(inst: kvsched.Instance, message: str) -> None:
    for call in (
        lambda: kvsched.lower_bounds(inst),
        lambda: kvsched.simulate(inst, kvsched.make_policy("vllm")),
        lambda: kvsched.solve(inst, options=kvsched.SolverOptions(time_limit=5, threads=1)),
        lambda: kvsched.compare(inst, policies=["vllm"], solver=None),
    ):
        with pytest.raises(InputError, match=message):
            call()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            kvsched.Request("x", 0.0, -1, 3),
            r"request 'x' \(#3\): prompt must be an int from 1 to 2147483647, got -1",
        ),
        (kvsched.Request("x", 0.0, 3, 0), r"request 'x' \(#3\): output must be"),
        (kvsched.Request("x", 0.0, 2.5, 3), r"prompt must be an int from 1 to \d+, got 2.5"),
        (kvsched.Request("x", 0.0, 4.0, 3), r"prompt must be an int from 1 to \d+, got 4.0"),
        (kvsched.Request("x", 0.0, 3, float("inf")), r"output must be an int from 1 to \d+, got inf"),
        # Past the file schema's ranges: sums overflow int64, or a simulation runs for billions of batches.
        (
            kvsched.Request("x", 0.0, 10**12, 3),
            r"request 'x' \(#3\): prompt must be an int from 1 to 2147483647",
        ),
        (
            kvsched.Request("x", 0.0, 3, 2**62),
            r"output must be an int from 1 to 2147483647, got 4611686018427387904",
        ),
        (kvsched.Request("x", 1e300, 3, 3), r"arrival must be a number from 0 to 1e\+12, got 1e\+300"),
        (
            kvsched.Request("x", float("nan"), 3, 3),
            r"request 'x' \(#3\): arrival must be a number from 0 to 1e\+12",
        ),
        (kvsched.Request("x", -1.0, 3, 3), r"arrival must be a number from 0 to 1e\+12, got -1.0"),
        (kvsched.Request("r0", 0.0, 3, 3), r"request 'r0' \(#3\): its id is used by an earlier request"),
        # The optional fields, as a file's schema takes them.
        (
            kvsched.Request("x", 0.0, 3, 3, predicted_output=0),
            r"predicted_output must be an int from 1 to \d+ \(or None\), got 0",
        ),
        (
            kvsched.Request("x", 0.0, 3, 3, priority=1.5),
            r"priority must be an int from -2147483647 to 2147483647, got 1.5",
        ),
        (
            kvsched.Request("x", 0.0, 3, 3, ttft_slo=float("nan")),
            r"ttft_slo must be a number above 0 and at most 1e\+12 \(or None\), got nan",
        ),
        (kvsched.Request("x", 0.0, 3, 3, tbt_slo=0.0), r"tbt_slo must be a number above 0"),
        (kvsched.Request("x", 0.0, 3, 3, cls=5), r"cls must be a string \(or None\), got 5"),
        (kvsched.Request(7, 0.0, 3, 3), r"request 7 \(#3\): id must be a non-empty string, got 7"),
    ],
)
def test_a_python_built_instance_with_an_impossible_request_is_one_input_error(bad, message):
    good = tuple(kvsched.Request(f"r{k}", float(k), 4, 2) for k in range(3))
    inst = kvsched.Instance((*good, bad), kvsched.Limits(100), kvsched.TimeModel("unit"))
    _every_entry_point_refuses(inst, message)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # An empty instance crashed solve, lower_bounds and serving_metrics deep inside; a file says
        # the same (its schema needs at least one request).
        (lambda i: kvsched.Instance((), i.limits), r"requests: an instance needs at least one request"),
        (lambda i: kvsched.Instance(({"id": "a"},), i.limits), r"requests\[0\]: expected a kvsched.Request"),
        (lambda i: kvsched.Instance(i.requests, i.limits, None), r"time_model: expected kvsched.TimeModel"),
    ],
)
def test_a_python_built_instance_of_the_wrong_shape_is_one_input_error(make, message):
    inst = make(load_instance(kvsched.example("figure15")))
    _every_entry_point_refuses(inst, message)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: load_instance(None),
            r"path: expected a file path \(a str or a pathlib.Path\), got NoneType",
        ),
        (lambda: load_instance(b"x.json"), r"path: expected a file path .* got bytes"),
        (lambda: load_instance(kvsched.example("tiny"), limits={"kv_capacity": 8}), r"limits: expected"),
        (lambda: load_instance(kvsched.example("tiny"), limits=kvsched.Limits("8")), r"limits.kv_capacity"),
        (lambda: load_instance(kvsched.example("tiny"), limit_overrides=[1]), r"limit_overrides: expected"),
        (lambda: kvsched.example(None), r"example: unknown example None"),
        (lambda: kvsched.generate("synthetic", n=True), r"n must be an integer"),
        (
            lambda: kvsched.replay(*_figure15_run(), then=5),
            r"then: expected a function of the engine state \(or None\), got int",
        ),
    ],
)
def test_api_arguments_of_the_wrong_type_are_one_input_error(call, message):
    with pytest.raises(InputError, match=message):
        call()


def _figure15_run() -> tuple[kvsched.Instance, kvsched.Schedule]:
    inst = load_instance(kvsched.example("figure15"))
    return inst, kvsched.simulate(inst, kvsched.make_policy("vllm")).schedule


def test_a_huge_prediction_noise_stays_in_range():
    # exp(50 z) overflowed to inf, which int64 read as its minimum: predicted outputs of -9.2e18.
    inst = kvsched.generate("synthetic", n=500, predict_sigma=50)
    predicted = [r.predicted_output for r in inst.requests]
    assert min(predicted) == 1 and max(predicted) == 2**31 - 1
    inst.check_requests()


def test_the_api_writers_never_overwrite_an_input(tmp_path):
    inst = load_instance(kvsched.example("figure15"))
    run = kvsched.simulate(inst, kvsched.make_policy("vllm"))
    copy = tmp_path / "inst.json"
    kvsched.save_instance(inst, copy)
    before = copy.read_bytes()
    for write in (
        lambda path: kvsched.save_schedule(run.schedule, inst, path),
        lambda path: kvsched.write_chrome_trace(inst, run.schedule, path),
        lambda path: kvsched.save_figure(kvsched.plot_gantt(inst, run.schedule), path),
    ):
        with pytest.raises(InputError, match=r"is a kvsched instance file; refusing to overwrite it$"):
            write(copy)
        with pytest.raises(InputError, match=r"is in kvsched's bundled examples; write elsewhere$"):
            write(kvsched.EXAMPLES_DIR / "out.json")
    with pytest.raises(InputError, match="bundled examples"):
        kvsched.save_instance(inst, kvsched.example("figure15"))
    assert copy.read_bytes() == before
    assert not (kvsched.EXAMPLES_DIR / "out.json").exists()
    kvsched.save_schedule(run.schedule, inst, tmp_path / "s.json")  # an ordinary output is written
    assert kvsched.load_schedule(tmp_path / "s.json", inst).same_as(run.schedule)


def test_a_python_built_instance_may_hold_numpy_scalars():
    import numpy as np

    reqs = tuple(
        kvsched.Request(
            str(np.str_(f"r{k}")), np.float64(k), np.int64(4), np.int32(2), predicted_output=np.int64(3),
            priority=np.int8(1), ttft_slo=np.float32(5.0),
        )
        for k in range(3)
    )  # fmt: skip
    inst = kvsched.Instance(reqs, kvsched.Limits(np.int64(100)), kvsched.TimeModel("unit"))
    inst.check_feasible()
    assert kvsched.simulate(inst, kvsched.make_policy("vllm")).trace is not None


def test_the_api_writers_never_overwrite_a_results_database_or_a_csv_trace(tmp_path):
    import sqlite3

    inst = load_instance(kvsched.example("figure15"))
    run = kvsched.simulate(inst, kvsched.make_policy("vllm"))
    db = tmp_path / "r.sqlite"
    sqlite3.connect(db).execute("CREATE TABLE cells (x)").connection.commit()
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    before = {p: p.read_bytes() for p in (db, trace)}
    for write in (
        lambda path: kvsched.save_schedule(run.schedule, inst, path),
        lambda path: kvsched.write_chrome_trace(inst, run.schedule, path),
    ):
        with pytest.raises(
            InputError, match=r"r\.sqlite is an SQLite database .*; refusing to overwrite it$"
        ):
            write(db)
        with pytest.raises(InputError, match=r"trace\.csv is a CSV trace .*; refusing to overwrite it$"):
            write(trace)
    assert {p: p.read_bytes() for p in before} == before


def test_docs_own_scheduler_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    own = next(b for b in blocks if "class ShortestPromptFirst" in b)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__docs__"}
    started = time.monotonic()
    exec(compile(own, str(DOCS), "exec"), scope)
    assert time.monotonic() - started < 30
    table = scope["cmp"].table
    assert list(table.index[:4]) == ["shortest-prompt", "vllm", "sarathi", "engine-log"]
    assert table.loc["engine-log", "kind"] == "schedule" and table["error"].isna().all()
    # Every row is a legal schedule at or above the certified bound, the solver's at most each of them.
    lower = scope["cmp"].lower_bound
    assert (table["objective"] >= lower - 1e-6).all()
    assert table.filter(like="optimum", axis=0)["objective"].iloc[0] <= table["objective"].min() + 1e-9
    assert "shortest-prompt" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a newcomer's probe (2026-11-29)
def _fig15_schedule():
    return kvsched.simulate(FIG15, kvsched.make_policy("vllm")).schedule


@pytest.mark.parametrize("fault", ["nan-arrival", "repeated-id"])
def test_every_entry_point_checks_a_python_built_instance(fault):
    # validate, replay, retime, the writers and the plots took a NaN arrival or a repeated id without a word
    # (a schedule "validated", latencies came out NaN); simulate and solve refused them.
    import dataclasses

    reqs = list(FIG15.requests)
    if fault == "nan-arrival":
        reqs[0] = dataclasses.replace(reqs[0], arrival=float("nan"))
        message = rf"request '{reqs[0].id}' \(#0\): arrival must be a number from 0"
    else:
        reqs[1] = dataclasses.replace(reqs[1], id=reqs[0].id)
        message = rf"request '{reqs[0].id}' \(#1\): its id is used by an earlier request"
    bad = dataclasses.replace(FIG15, requests=tuple(reqs))
    sched = _fig15_schedule()
    for call in (
        lambda: kvsched.validate(bad, sched),
        lambda: kvsched.replay(bad, sched),
        lambda: kvsched.retime(bad, sched, kvsched.make_cost_model("unit")),
        lambda: kvsched.chrome_trace(bad, sched),
        lambda: kvsched.plot_gantt(bad, sched),
    ):
        with pytest.raises(InputError, match=message):
            call()


def test_an_instance_name_meta_and_limits_are_checked_and_it_hashes(tmp_path):
    import dataclasses

    with pytest.raises(InputError, match=r"^name: expected a str, got int"):
        kvsched.save_instance(dataclasses.replace(FIG15, name=5), tmp_path / "a.json")
    with pytest.raises(InputError, match=r"^meta: expected a dict"):
        kvsched.validate(dataclasses.replace(FIG15, meta=None), _fig15_schedule())
    with pytest.raises(InputError, match=r"^save_instance: the instance cannot be written as JSON"):
        kvsched.save_instance(dataclasses.replace(FIG15, meta={"x": object()}), tmp_path / "b.json")
    with pytest.raises(InputError, match=r"^limits: expected kvsched.Limits"):
        kvsched.validate(dataclasses.replace(FIG15, limits={"kv_capacity": 8}), _fig15_schedule())
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()
    # A frozen instance hashes (its dict fields kept it from it), consistently with ==.
    twin = dataclasses.replace(FIG15, meta={"other": 1})
    assert hash(FIG15) == hash(dataclasses.replace(FIG15)) and {FIG15: 1}[dataclasses.replace(FIG15)] == 1
    assert twin != FIG15


def test_a_csv_trace_needs_real_limits_and_a_time_model(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,4\n")
    with pytest.raises(InputError, match=r"^limits: expected kvsched.Limits"):
        kvsched.load_csv_trace(csv, {"kv_capacity": 100}, kvsched.TimeModel())
    with pytest.raises(InputError, match=r"^time_model: expected kvsched.TimeModel"):
        kvsched.load_csv_trace(csv, kvsched.Limits(100), "unit")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"thresholds": "paper", "batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": 2.5}, "batch_size must be a positive integer"),
        ({"d0": "x"}, "d0 must be a finite number >= 0 or None"),
        ({"margin": float("nan")}, "margin must be a finite number >= 0"),
    ],
)
def test_the_wait_policys_numbers_are_checked(params, message):
    with pytest.raises(InputError, match=message):
        kvsched.make_policy("wait", **params)


@pytest.mark.parametrize("params", [{"rate": 1e-300}, {"rate": 1.0, "tick": 1e20}])
def test_generate_names_the_arrival_parameters_behind_an_arrival_out_of_range(params):
    with pytest.raises(
        InputError, match=r"^synthetic: the generated instance breaks a request rule \(arrivals"
    ):
        kvsched.generate("synthetic", n=5, arrival="poisson", **params)


def test_simulate_past_its_deadline_is_a_kvsched_error_with_a_message():
    # It raised kvsched.stop.DeadlineReached: no KvschedError, no message (`except kv.KvschedError` missed it).
    inst = kvsched.generate(
        "sharegpt", n=3000, limits=kvsched.Limits(kv_capacity=20000), arrival="poisson", rate=5
    )
    with pytest.raises(
        kvsched.KvschedError, match=r"^simulate: the deadline passed .*\(\d[\d,]* of 3,000 done\)"
    ):
        kvsched.simulate(inst, kvsched.make_policy("sarathi"), deadline=kvsched.Deadline.after(0.05))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, 1.0, 1.0, 1.0), r"^table: expected a pandas DataFrame"),
        (("objective", 1.0, 1.0, 1.0), r"^table: expected a pandas DataFrame"),
        (("no-column", 1.0, 1.0, 1.0), r"^table: .* with no such column"),
        (("frame", "1", 1.0, 1.0), r"^incumbent: expected a number or None, got str"),
        (("frame", 1.0, [1.0], 1.0), r"^bound: expected a number or None, got list"),
        (("frame", 1.0, 1.0, True), r"^lower: expected a number or None, got bool"),
    ],
)
def test_add_regret_checks_its_arguments(args, message):
    import pandas as pd

    frames = {"frame": pd.DataFrame({"objective": [3.0]}), "no-column": pd.DataFrame({"x": [3.0]})}
    table, *rest = args
    with pytest.raises(InputError, match=message):
        kvsched.add_regret(frames.get(table, table) if isinstance(table, str) else table, *rest)
    # Numbers of every kind pass (numpy's included), and None leaves its columns out.
    import numpy as np

    out = kvsched.add_regret(pd.DataFrame({"objective": [3.0]}), np.float64(2.0), 2, None)
    assert out["regret_vs_solver"].tolist() == [1.0] and "max_regret_vs_all_schedules" not in out
