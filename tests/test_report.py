"""HTML reports: self-contained pages with the tables and embedded figures; rendered by headless Chromium."""

from __future__ import annotations

import base64
import html
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from kvsched.analysis.compare import MAX_REGRET_ALL, MAX_REGRET_SCOPE, REGRET
from kvsched.analysis.report import database_report, instance_report
from kvsched.analysis.spec import parse_spec
from kvsched.analysis.sweep import run_sweep
from kvsched.cli import main
from kvsched.csp import SolverOptions
from kvsched.errors import InputError
from kvsched.instances.io import load_instance
from tests.test_examples import EXAMPLES
from tests.test_sweep import TINY

FIG15 = EXAMPLES / "figure15.json"
FAST = SolverOptions(time_limit=10, threads=1)
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
_IMG = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _assert_self_contained(page: str) -> list[bytes]:
    """No external reference of any kind; returns the embedded PNGs."""
    images = [base64.b64decode(m) for m in _IMG.findall(page)]
    text = _IMG.sub("<img>", page)  # base64 payloads contain '/'
    assert "//" not in text  # no http://, https:// or protocol-relative //host
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text
    assert not re.findall(r'(?:src|href)="', text)
    assert all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in images)
    return images


@pytest.fixture(scope="module")
def instance_page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-instance")
    inst = load_instance(FIG15)
    return instance_report(
        inst,
        out,
        policies=["vllm", "vllm-ef", "sarathi"],
        solver="cpsat",
        formulation="batch",
        options=FAST,
        source=str(FIG15),
    )


@pytest.fixture(scope="module")
def database_page(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report-db")
    data = {**TINY, "instances": [{**TINY["instances"][0], "n": [3, 5]}]}
    run_sweep(parse_spec(data), folder / "r.sqlite", workers=1, progress=False)
    return database_report(folder / "r.sqlite", folder / "out")


def test_instance_report_has_the_tables_and_embedded_figures(instance_page):
    page = instance_page.read_text()
    assert instance_page.name == "index.html"
    images = _assert_self_contained(page)
    # Gantt of the optimum, the best and the worst policy; KV; CDFs; solver progress.
    assert len(images) == 6
    for text in ("Exact solution", "optimal", "batch-indexed / cpsat", "vllm-ef", "sarathi", "regret"):
        assert text in page, text
    assert page.count("<table") >= 3
    # The batch-indexed optimum evicts like vLLM (seed 003 Fig. 15(a)): total latency 36, the EF policy 40.
    assert "Best policy: vllm" in page and "worst: vllm-ef" in page
    assert re.search(r"<td>optimum \(batch-indexed/cpsat\)</td>\s*<td>solver</td>\s*<td>36</td>", page)


def test_database_report_has_the_regret_table_and_figures(database_page):
    page = database_page.read_text()
    images = _assert_self_contained(page)
    assert len(images) == 2  # latency vs load, regret vs size
    assert "Regret vs the solver&#x27;s optimum" in page or "Regret vs the solver's optimum" in page
    for text in ("mean_regret_pct", "win_rate", "stability", "sarathi", "vllm-ef"):
        assert text in page, text


def test_cli_report_for_an_instance_and_a_database(tmp_path, capsys):
    out = tmp_path / "inst"
    args = ["report", str(FIG15), "--out", str(out), "--policies", "vllm,vllm-ef", "--time-limit", "10"]
    assert main([*args, "--threads", "1"]) == 0
    assert (out / "index.html").is_file() and "wrote" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["report", str(FIG15), "--out", str(out), "--policies", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["report", str(bad), "--out", str(tmp_path / "never")]) == 2
    assert "not valid JSON" in capsys.readouterr().err and not (tmp_path / "never").exists()


def test_instance_report_without_a_solver_that_fits_says_why(tmp_path):
    # Prompts over C need chunked prefill, which the time-indexed model does not have.
    inst = load_instance(EXAMPLES / "chunked-prefill.json")
    page = instance_report(
        inst, tmp_path, policies=["sarathi", "vllm"], formulation="time", options=FAST
    ).read_text()
    assert "The solver did not run" in page and "chunked prefill" in page
    # vllm (whole prompts) cannot run it either: sarathi is best and worst, one Gantt, KV, CDFs.
    assert len(_assert_self_contained(page)) == 3
    assert re.search(r"<td>vllm</td>\s*<td>policy</td>\s*<td>–</td>", page) and "<th>error</th>" in page


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _distinct_colours(pixels: np.ndarray) -> int:
    """``len(np.unique(rows, axis=0))`` over the pixels' colours, without its lexicographic row sort (30 s on
    a 1280 x 2000 shot on a slow machine): each pixel's channels read as one opaque scalar, sorted as bytes (the
    values are PNG intensities in [0, 1]: no NaN, no -0.0, so distinct bytes are distinct colours)."""
    rows = np.ascontiguousarray(pixels.reshape(-1, pixels.shape[-1]))
    return len(np.unique(rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel()))


@pytest.mark.skipif(
    _chromium() is None, reason="headless Chromium is not installed (apt-get install chromium)"
)
@pytest.mark.parametrize("which", ["instance", "database"])
def test_report_renders_in_headless_chromium(tmp_path, request, which):
    page = request.getfixturevalue(f"{which}_page")
    shot = tmp_path / f"report-{which}.png"
    cmd = [
        str(_chromium()),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert shot.is_file(), done.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    # Rendered content, not a blank page: many distinct colours (text, tables, the embedded figures).
    assert _distinct_colours(pixels) > 50
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def test_gantt_headings_say_what_is_proven(instance_page):
    from types import SimpleNamespace

    from kvsched.analysis.report import gantt_heading
    from kvsched.csp import Scope

    page = instance_page.read_text()
    # The optimum's chart: proven optimal, over which schedules, the objective in words and units.
    assert (
        "the exact solution (batch-indexed / cpsat), proven optimal over every legal schedule: "
        "total latency 36 slots" in page
    )
    assert "the worst policy, vllm-ef: total latency 40 slots" in page
    assert not re.search(r"optimum \S* ?optimal", page)
    assert "tokens_per_slot" in page and "tokens_per_s<" not in page  # slots are not seconds
    stopped = SimpleNamespace(
        formulation="time-indexed", solver="highs", status="feasible", scope=Scope.ALL, best_bound=30.0
    )
    text = gantt_heading("the exact solution", "optimum", "total-latency", 38.0, "s", stopped)
    assert text.startswith("the best schedule found") and "not proven optimal; bound 30" in text
    assert "total latency 38 s" in text


def test_the_anytime_caption_and_the_regret_legend_name_scope_and_bound_source(instance_page, tmp_path):
    page = html.unescape(instance_page.read_text())
    # batch-indexed: every legal schedule; its regret columns say what they are measured against.
    assert "Solver progress (batch-indexed/cpsat, optimal)" in page and "Scope: every legal schedule" in page
    assert re.search(r"bound source: \w+", page)
    for column in (REGRET, MAX_REGRET_SCOPE, MAX_REGRET_ALL):
        assert f"<th>{column}</th>" in page and f"<li>{column}: against" in page
    # time-indexed: a narrower scope, so the caption adds the bound over every legal schedule.
    inst = load_instance(FIG15)
    page = instance_report(inst, tmp_path, policies=["vllm"], formulation="time", options=FAST).read_text()
    page = html.unescape(page)
    assert "Scope: schedules serving each request without a break" in page
    assert "bound source: highs" in page and "bound over every legal schedule: 30" in page
    assert re.search(
        r"<td>vllm</td>\s*<td>policy</td>\s*<td>36</td>\s*<td>contiguous</td>\s*<td>-4</td>", page
    )


def test_cli_report_hands_the_solve_what_is_left_of_the_time_limit(tmp_path, spy):
    import kvsched.analysis as analysis

    calls = spy(analysis, "compare")
    args = ["report", str(FIG15), "--out", str(tmp_path), "--policies", "vllm", "--time-limit", "10"]
    assert main([*args, "--threads", "1"]) == 0
    (deadline,) = [call["deadline"] for call in calls]
    # Counted from the command's start, less the time kept for the figures (1 s of 10).
    assert deadline.limit == 10 and deadline.bounded and deadline.end - time.monotonic() < 9


# ----------------------------------------------------------------------------- arguments, deadline, examples
def _text(path: Path) -> str:
    page = re.sub(r"<style.*?</style>", "", path.read_text(), flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_instance_report_shows_a_comparison_under_its_own_objective(tmp_path):
    from kvsched.analysis.compare import compare

    inst = load_instance(FIG15)
    cmp = compare(inst, ["vllm"], objective="makespan", solver=None)
    text = _text(instance_report(inst, tmp_path, comparison=cmp))
    assert "Policies (makespan, slots)" in text and "total-latency" not in text
    assert "vllm: makespan 14 slots" in text
    with pytest.raises(
        InputError, match=r"^objective: 'total-latency', but the comparison was made for 'makespan'"
    ):
        instance_report(inst, tmp_path / "other", comparison=cmp, objective="total-latency")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"out_dir": None}, r"^out_dir: expected a file path"),
        ({"comparison": 5}, r"^comparison: expected a Comparison"),
        ({"source": 5}, r"^source: expected a str"),
        ({"deadline": 5}, r"^deadline: expected a kvsched.Deadline"),
        ({"policies": "nope"}, r"^policies: unknown policy 'nope'"),
        ({"policies": 5}, r"^policies: expected 'all'"),
    ],
)
def test_instance_report_checks_its_arguments(tmp_path, kwargs, message):
    kwargs = {"out_dir": tmp_path / "r", "solver": None, **kwargs}
    with pytest.raises(InputError, match=message):
        instance_report(load_instance(FIG15), kwargs.pop("out_dir"), **kwargs)


@pytest.mark.parametrize("policies", ["vllm", "vllm,sarathi"])
def test_instance_report_takes_policies_as_a_string_as_compare_does(tmp_path, policies):
    text = _text(instance_report(load_instance(FIG15), tmp_path, policies=policies, solver=None))
    for name in policies.split(","):
        assert f" {name} " in text


def test_instance_report_never_writes_into_the_bundled_examples():
    from kvsched.instances import EXAMPLES_DIR

    page = EXAMPLES_DIR / "index.html"
    assert not page.exists()
    try:
        with pytest.raises(InputError, match=r"^out_dir: .* bundled examples"):
            instance_report(load_instance(FIG15), EXAMPLES_DIR, policies=["vllm"], solver=None)
        with pytest.raises(InputError, match=r"^out_dir: .* bundled examples"):
            database_report("x.sqlite", EXAMPLES_DIR)
        assert not page.exists()
    finally:
        page.unlink(missing_ok=True)  # never leave a stray file in the package, even when failing


def test_instance_report_keeps_time_for_the_figures_from_the_solve(tmp_path, monkeypatch):
    import importlib

    from kvsched.stop import Deadline

    # (The package's attribute `compare` is the function, which hides the module of that name.)
    compare_module = importlib.import_module("kvsched.analysis.compare")

    seen = []
    real = compare_module.compare

    def spy(*args, **kwargs):
        seen.append(kwargs["deadline"])
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_module, "compare", spy)
    instance_report(load_instance(FIG15), tmp_path, policies="vllm", solver=None, deadline=Deadline.after(10))
    (deadline,) = seen
    assert deadline.bounded and deadline.end - time.monotonic() < 5.1  # half of 10 s kept for the figures


def test_instance_report_leaves_out_the_figures_it_has_no_time_for(tmp_path):
    import warnings

    from kvsched.stop import Deadline

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ended by its deadline: no warning
        start = time.monotonic()
        path = instance_report(
            load_instance(FIG15), tmp_path, policies="vllm", solver=None, deadline=Deadline.after(0.8)
        )
    assert time.monotonic() - start < 0.8 + 1.0
    text = _text(path)
    assert "Left out to end by the deadline (0.8 s): the Gantt chart of vllm; KV usage over time" in text
    assert not _assert_self_contained(path.read_text())  # no figure drawn


def test_instance_report_that_ends_late_says_so(tmp_path):
    from kvsched.analysis.compare import compare
    from kvsched.stop import Deadline

    inst = load_instance(FIG15)
    cmp = compare(inst, ["vllm"], solver=None)
    deadline = Deadline.after(0.05)
    time.sleep(1.3)  # past the deadline and its grace (1 s) before the report starts
    with pytest.warns(RuntimeWarning, match=r"^instance_report: ended 1\.\d s past its deadline"):
        path = instance_report(inst, tmp_path, comparison=cmp, deadline=deadline)
    assert "Left out to end by the deadline" in _text(path)


def test_instance_report_draws_the_replays_the_comparison_kept(tmp_path, monkeypatch):
    import importlib

    from kvsched.analysis.compare import compare

    inst = load_instance(EXAMPLES / "sharegpt-small.json")
    cmp = compare(inst, ["vllm", "sarathi", "orca", "fastertransformer"], solver=None, keep_traces=True)
    ran = cmp.table["objective"]
    # Only the best and the worst policy's traces are held (the first of equals), not one per policy.
    assert set(cmp.traces) == {ran.idxmin(), ran.idxmax()}
    assert not compare(inst, ["vllm"], solver=None).traces  # kept only when asked
    report = importlib.import_module("kvsched.analysis.report")

    def no_replay(*args, **kwargs):
        raise AssertionError("the report replayed a schedule the comparison kept")

    monkeypatch.setattr(report, "replay", no_replay)
    page = instance_report(inst, tmp_path, comparison=cmp)
    assert len(_assert_self_contained(page.read_text())) == 4  # two Gantt charts, KV usage, CDFs


def test_cli_report_takes_a_csv_trace_with_the_engine_limit_and_cost_model_flags(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,2\n0,3,3\n1,2,2\n")
    out = tmp_path / "rep"
    # The error said to give --kv-capacity, which report refused as an unrecognized argument.
    argv = ["report", str(trace), "--out", str(out), "--no-solver", "--policies", "sarathi,vllm"]
    assert main([*argv, "-M", "16", "-C", "8", "--cost-model", "unit"]) == 0
    assert (out / "index.html").is_file() and "wrote" in capsys.readouterr().err
    assert main([*argv, "--cost-param", "slot=-1", "-M", "16"]) == 2
    assert "--cost-model/--cost-param" in capsys.readouterr().err


def test_cli_report_refuses_engine_limit_flags_for_a_database(database_page, tmp_path, capsys):
    db = database_page.parents[1] / "r.sqlite"  # the fixture's sweep database
    for flag in (["-M", "64"], ["--cost-model", "unit"]):
        assert main(["report", str(db), "--out", str(tmp_path / "never"), *flag]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "reads each cell's limits and cost model from the database" in err
        assert err.startswith(f"kvsched report: error: {flag[0] if flag[0] != '-M' else '--kv-capacity'}: ")
    assert not (tmp_path / "never").exists()
