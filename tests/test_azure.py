"""Azure trace instances, generator help, and cost parameters checked when an instance is generated."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kvsched.cli import main
from kvsched.errors import InputError
from kvsched.instances.azure import load_trace
from kvsched.instances.generators import GENERATORS, describe, generate
from kvsched.instances.io import load_instance
from kvsched.instances.model import Limits, TimeModel

LIMITS = Limits(kv_capacity=16_384)


def _azure(kind: str = "azure-conv", n: int = 40, seed: int = 0, **params: object):
    return generate(kind, n=n, seed=seed, limits=LIMITS, time_model=TimeModel(), **params)


def test_shipped_traces_have_their_documented_sizes_and_sorted_arrivals():
    conv, code = load_trace("conv"), load_trace("code")
    assert (len(conv), len(code)) == (19_366, 8_819)
    for trace in (conv, code):
        assert np.all(np.diff(trace.arrival) >= 0)
        assert trace.prompt.min() >= 1 and trace.output.min() >= 1
    # The services differ as the Splitwise paper says: coding has long prompts and short outputs.
    assert code.prompt.mean() > conv.prompt.mean() and code.output.mean() < conv.output.mean()


def test_first_sample_keeps_the_trace_gaps_and_rate_scale_compresses_them():
    trace = load_trace("conv")
    inst = _azure(n=30, start=0)
    arrivals = np.array([r.arrival for r in inst.requests])
    expected = trace.arrival[:30] - trace.arrival[0]
    assert arrivals == pytest.approx(expected)
    assert [(r.prompt, r.output) for r in inst.requests] == list(
        zip(trace.prompt[:30].tolist(), trace.output[:30].tolist(), strict=True)
    )
    fast = _azure(n=30, start=0, rate_scale=4)
    assert np.array([r.arrival for r in fast.requests]) == pytest.approx(expected / 4)
    slots = _azure(n=30, start=0, units_per_second=50)
    assert np.array([r.arrival for r in slots.requests]) == pytest.approx(expected * 50)


def test_window_random_sample_and_determinism():
    a = _azure("azure-code", n=25, seed=3, start=600, duration=600, sample="random")
    b = _azure("azure-code", n=25, seed=3, start=600, duration=600, sample="random")
    c = _azure("azure-code", n=25, seed=4, start=600, duration=600, sample="random")
    assert a.requests == b.requests and a.requests != c.requests
    lo, hi = a.meta["trace_seconds"]
    assert 600 <= lo <= hi < 1200
    assert a.requests[0].arrival == 0.0
    assert a.meta["params"] == {
        "start": 600.0,
        "duration": 600.0,
        "sample": "random",
        "rate_scale": 1.0,
        "units_per_second": 1.0,
    }
    # meta["params"] rebuilds the same instance.
    again = _azure("azure-code", n=25, seed=3, **a.meta["params"])
    assert again.requests == a.requests


def test_requests_that_cannot_fit_are_skipped_so_every_instance_is_feasible():
    small = Limits(kv_capacity=1024)
    inst = generate("azure-code", n=50, seed=0, limits=small, time_model=TimeModel())
    inst.check_feasible()
    assert inst.meta["skipped_oversize"] > 0


def test_skipped_oversize_counts_the_requests_passed_over_not_the_whole_window():
    # With sample=first it once held the whole window's count (2900) where 10 requests were passed over.
    limits = Limits(kv_capacity=2000)
    trace = load_trace("conv")
    fits = trace.prompt + trace.output - 1 <= 2000
    last = int(np.flatnonzero(fits)[99])  # the 100th request that fits: the last one taken
    first = generate("azure-conv", n=100, limits=limits, time_model=TimeModel())
    assert first.meta["skipped_oversize"] == int(np.count_nonzero(~fits[: last + 1]))
    assert first.meta["skipped_oversize"] < int(np.count_nonzero(~fits))
    random = generate("azure-conv", n=100, limits=limits, time_model=TimeModel(), sample="random")
    assert random.meta["skipped_oversize"] == int(np.count_nonzero(~fits))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rate_scale": 0}, "rate_scale=0.0 must be > 0"),
        ({"sample": "all"}, "sample='all' is not one of first, random"),
        ({"start": 1e9}, "holds 0 requests"),
        ({"arrival": "poisson"}, "unknown parameter 'arrival'"),
    ],
)
def test_bad_azure_parameters_are_one_clear_error(params, message):
    with pytest.raises(InputError, match=message):
        _azure(**params)


def test_every_generator_describes_its_parameters_and_help_prints_them(capsys):
    for kind, spec in GENERATORS.items():
        text = describe(kind)
        for key in spec.keys:
            assert f"  {key} " in text
    assert "without a tokenizer" in describe("sharegpt")
    with pytest.raises(SystemExit) as exc:
        main(["generate", "azure-code", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "rate_scale" in out and "(default 1)" in out and "Azure LLM inference trace 2023" in out


def test_generate_writes_an_azure_instance_that_loads_back(tmp_path):
    out = tmp_path / "az.json"
    assert (
        main(
            ["generate", "azure-conv", "--n", "20", "-M", "16384", "--param", "rate_scale=2", "-o", str(out)]
        )
        == 0
    )
    inst = load_instance(out)
    assert len(inst) == 20 and inst.meta["kind"] == "azure-conv"


def test_an_unknown_cost_parameter_is_refused_before_a_file_is_written(tmp_path, capsys):
    out = tmp_path / "i.json"
    argv = [
        "generate",
        "synthetic",
        "--n",
        "3",
        "--cost-model",
        "roofline",
        "--cost-param",
        "foo=1",
        "-o",
        str(out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "foo" in err and err.count("\n") == 1
    assert not out.exists()


def test_sharegpt_and_azure_import_first_in_a_fresh_interpreter():
    """The generators <-> sharegpt import circle is gone: either module can be imported first."""
    for module in ("kvsched.instances.sharegpt", "kvsched.instances.azure", "kvsched.instances.laws"):
        code = f"import {module}, sys; assert 'kvsched.instances.generators' not in sys.modules"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_limit_flags_keep_the_file_s_other_limits(tmp_path, capsys):
    path = tmp_path / "i.json"
    doc = {
        "schema_version": 1,
        "limits": {"kv_capacity": 64, "max_batch_tokens": 16, "max_prefill_tokens": 8, "max_running": 3},
        "requests": [{"id": "a", "arrival": 0, "prompt": 4, "output": 2}],
    }
    path.write_text(json.dumps(doc))
    assert main(["info", str(path), "-M", "128"]) == 0
    out = capsys.readouterr().out
    assert "128 tokens" in out and "16" in out and "8" in out and "3" in out
    from kvsched.cli import build_parser
    from kvsched.commands.common import load_instance_from_args

    args = build_parser().parse_args(["info", str(path), "-M", "128"])
    lim = load_instance_from_args(str(path), args).limits
    assert (lim.kv_capacity, lim.max_batch_tokens, lim.max_prefill_tokens, lim.max_running) == (128, 16, 8, 3)


def test_generator_integer_bound_is_the_file_format_s():
    from kvsched.instances import generators, io

    assert generators.MAX_INT == io.MAX_TOKENS
