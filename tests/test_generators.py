"""Seeded instance generators: determinism, distributions, InferMax workloads, parameters, examples."""

from __future__ import annotations

import dataclasses
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from kvsched.errors import InputError
from kvsched.instances.generators import (
    GENERATORS,
    LARGE,
    MIX_GROUPS,
    SMALL,
    Fixed,
    Gamma,
    LogNormal,
    Poisson,
    SemiOnline,
    Uniform,
    Zipf,
    figure15_limits,
    generate,
    infermax_grid,
    infermax_mix,
    parse_params,
    synthetic,
)
from kvsched.instances.io import instance_to_dict, load_instance
from kvsched.instances.model import Instance, Limits, TimeModel

LIMITS = Limits(kv_capacity=1 << 20)
UNIT = TimeModel()


def _gen(kind: str, n: int = 50, seed: int = 0, **params: object) -> Instance:
    return generate(kind, n=n, seed=seed, limits=LIMITS, time_model=UNIT, **params)


def _column(inst: Instance, name: str) -> np.ndarray:
    return np.array([getattr(r, name) for r in inst.requests])


def _gaps(inst: Instance) -> np.ndarray:
    return np.diff(_column(inst, "arrival"))


# ----------------------------------------------------------------------------- determinism


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("synthetic", {"arrival": "poisson", "rate": 3.0, "predict_sigma": 0.5}),
        ("synthetic", {"arrival": "gamma", "rate": 1.0, "cv": 2.0, "prompt": "zipf", "prompt_a": 1.5}),
        ("infermax-mix", {"groups": "LILO+SISO"}),
        ("infermax-grid", {"prompt": 8, "output": 8, "arrival": "poisson", "rate": 1.0}),
    ],
)
def test_same_seed_same_instance_and_other_seed_differs(kind: str, params: dict) -> None:
    a, b, c = _gen(kind, seed=5, **params), _gen(kind, seed=5, **params), _gen(kind, seed=6, **params)
    assert instance_to_dict(a) == instance_to_dict(b)
    assert a.requests != c.requests


def test_ids_follow_arrival_order_and_arrivals_are_sorted() -> None:
    inst = _gen("synthetic", n=200, arrival="gamma", rate=2.0, cv=3.0)
    assert [r.id for r in inst.requests] == [f"r{k}" for k in range(200)]
    assert np.all(_gaps(inst) >= 0)
    assert inst.requests[0].arrival == 0.0


def test_meta_records_everything_needed_to_regenerate() -> None:
    inst = _gen("synthetic", n=30, seed=9, arrival="poisson", rate=0.5, prompt_mean=100.0, tick=1.0)
    assert inst.name == "synthetic-n30-seed9"
    meta = inst.meta
    assert (meta["kind"], meta["n"], meta["seed"]) == ("synthetic", 30, 9)
    # Defaults are filled in, so the record does not depend on today's defaults.
    assert meta["params"]["output"] == "lognormal" and meta["params"]["output_median"] == 128.0
    again = generate(
        meta["kind"], n=meta["n"], seed=meta["seed"], limits=LIMITS, time_model=UNIT, **meta["params"]
    )
    assert instance_to_dict(again) == instance_to_dict(inst)


def test_changing_the_arrival_process_keeps_the_lengths() -> None:
    # Separate random streams: experiments over arrival rates compare the same requests.
    a = _gen("synthetic", n=100, seed=2)
    b = _gen("synthetic", n=100, seed=2, arrival="poisson", rate=4.0)
    assert sorted(zip(_column(a, "prompt"), _column(a, "output"), strict=True)) == sorted(
        zip(_column(b, "prompt"), _column(b, "output"), strict=True)
    )


# ----------------------------------------------------------------------------- distributions


def test_semi_online_puts_every_arrival_at_zero() -> None:
    assert np.all(_column(_gen("synthetic", n=20), "arrival") == 0.0)


def test_poisson_mean_interarrival_and_cv() -> None:
    gaps = _gaps(_gen("synthetic", n=5000, arrival="poisson", rate=2.0))
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_keeps_the_mean_rate_and_has_the_requested_cv(cv: float) -> None:
    gaps = _gaps(_gen("synthetic", n=20000, arrival="gamma", rate=4.0, cv=cv))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_tick_rounds_arrivals_up_to_whole_slots() -> None:
    plain = _column(_gen("synthetic", n=100, arrival="poisson", rate=3.0), "arrival")
    ticked = _column(_gen("synthetic", n=100, arrival="poisson", rate=3.0, tick=1.0), "arrival")
    assert np.array_equal(ticked, np.ceil(plain))


def test_uniform_lengths_stay_in_bounds_and_reach_them() -> None:
    x = Uniform(3, 9).sample(np.random.default_rng(0), 5000)
    assert x.dtype == np.int64
    assert (x.min(), x.max()) == (3, 9)
    assert set(np.unique(x)) == set(range(3, 10))


def test_fixed_lengths() -> None:
    assert np.all(Fixed(7).sample(np.random.default_rng(0), 10) == 7)


def test_lognormal_median_and_mean() -> None:
    rng = np.random.default_rng(1)
    x = LogNormal(200.0, 1.0, max=10**9).sample(rng, 5000)
    assert np.median(x) == pytest.approx(200, rel=0.05)
    y = LogNormal.from_mean(300.0, 0.5, max=10**9).sample(rng, 5000)
    assert y.mean() == pytest.approx(300, rel=0.05)


@pytest.mark.parametrize(("mean", "sigma"), [(3000.0, 1.0), (2.0, 2.0), (100.0, 40.0)])
def test_prompt_mean_is_the_mean_of_the_lengths_drawn_after_the_clip(mean: float, sigma: float) -> None:
    # The unclipped formula gave 2121 for 3000 (default max 4096) and failed for sigma=40 ("median must be
    # > 0, got 0.0"): the median is now fitted under the clip and rounding.
    x = _column(_gen("synthetic", n=20000, prompt_mean=mean, prompt_sigma=sigma), "prompt")
    assert x.max() <= 4096
    assert abs(x.mean() - mean) < 4 * x.std() / math.sqrt(len(x))


def test_lognormal_fit_mean_with_sigma_zero_is_the_rounded_mean() -> None:
    assert LogNormal.fit_mean(7.0, 0.0).sample(np.random.default_rng(0), 3).tolist() == [7, 7, 7]


def test_a_tick_with_few_decimals_gives_arrivals_with_as_few() -> None:
    # np.ceil(a / 0.1) * 0.1 wrote arrivals like 1.4000000000000001 into the file.
    arrivals = _column(_gen("synthetic", n=200, arrival="poisson", rate=4.0, tick=0.1), "arrival")
    assert all(len(repr(float(a)).split(".")[1]) == 1 for a in arrivals)
    assert np.allclose(arrivals * 10, np.rint(arrivals * 10), rtol=0, atol=1e-9)


def test_lognormal_is_clipped_to_one_and_max() -> None:
    x = LogNormal(5.0, 3.0, max=50).sample(np.random.default_rng(2), 5000)
    assert x.min() == 1 and x.max() == 50


def test_zipf_is_clipped_and_follows_the_power_law_head() -> None:
    x = Zipf(1.5, max=100).sample(np.random.default_rng(3), 5000)
    assert x.min() == 1 and x.max() == 100
    assert np.mean(x == 100) > 0.01  # the clipped tail piles up at max
    zeta = sum(k**-1.5 for k in range(1, 200000)) + 2 / math.sqrt(200000)
    assert np.mean(x == 1) == pytest.approx(1 / zeta, abs=0.03)


def test_noisy_predictions() -> None:
    exact = _gen("synthetic", n=500, predict_sigma=0.0)
    assert np.array_equal(_column(exact, "predicted_output"), _column(exact, "output"))
    noisy = _gen("synthetic", n=2000, predict_sigma=0.5)
    pred, out = _column(noisy, "predicted_output"), _column(noisy, "output")
    assert pred.min() >= 1 and not np.array_equal(pred, out)
    # Median-unbiased multiplicative noise.
    assert np.median(np.log(pred / out)) == pytest.approx(0.0, abs=0.05)
    assert _gen("synthetic", n=5).requests[0].predicted_output is None


# ----------------------------------------------------------------------------- InferMax workloads


def test_infermax_grid_is_b_identical_requests_at_zero() -> None:
    inst = infermax_grid(16, 4, 8, figure15_limits(16))
    assert len(inst) == 8
    assert {(r.arrival, r.prompt, r.output) for r in inst.requests} == {(0.0, 16, 4)}
    assert inst.meta["params"] == {"arrival": "semi-online", "prompt": 16, "output": 4}


@pytest.mark.parametrize(("prompt", "kv"), [(1, 4), (2, 5), (4, 8), (64, 128)])
def test_figure15_capacity_is_max_of_two_prompts_and_one_peak(prompt: int, kv: int) -> None:
    lim = figure15_limits(prompt)
    assert lim.kv_capacity == kv == max(2 * prompt, prompt + 3)
    infermax_grid(prompt, 4, 4, lim).check_feasible()


@pytest.mark.parametrize("groups", ["LILO+SISO", "SILO+LISO", "SISO+SILO"])
@pytest.mark.parametrize("n", [16, 17])
def test_infermax_mix_is_a_shuffled_half_and_half_mix(groups: str, n: int) -> None:
    inst = _gen("infermax-mix", n=n, seed=4, groups=groups)
    first, second = groups.split("+")
    member = [
        next(g for g in (first, second) if r.prompt in MIX_GROUPS[g][0] and r.output in MIX_GROUPS[g][1])
        for r in inst.requests
    ]
    assert member.count(first) == (n + 1) // 2 and member.count(second) == n // 2
    assert member != sorted(member, key=(first, second).index)  # shuffled, not grouped
    assert all(r.arrival == 0.0 for r in inst.requests)


def test_infermax_mix_uses_both_values_of_each_set() -> None:
    inst = infermax_mix(("LISO", "SILO"), 400, 0, LIMITS)
    prompts, outputs = set(_column(inst, "prompt")), set(_column(inst, "output"))
    assert prompts == outputs == set(SMALL) | set(LARGE)


# ----------------------------------------------------------------------------- parameters


def test_parse_params_converts_types() -> None:
    params = parse_params(
        "synthetic",
        ["arrival=gamma", "rate=2", "cv=1.5", "prompt=uniform", "prompt_lo=4", "prompt_hi=10", "tick=1"],
    )
    assert params == {
        "arrival": "gamma",
        "rate": 2.0,
        "cv": 1.5,
        "prompt": "uniform",
        "prompt_lo": 4,
        "prompt_hi": 10,
        "tick": 1.0,
    }
    assert isinstance(params["prompt_lo"], int) and isinstance(params["rate"], float)
    strings = dict(p.split("=") for p in ["arrival=gamma", "rate=2", "cv=1.5"])
    assert instance_to_dict(_gen("synthetic", **params)) != instance_to_dict(_gen("synthetic", **strings))
    assert instance_to_dict(_gen("synthetic", arrival="gamma", rate=2, cv=1.5)) == instance_to_dict(
        _gen("synthetic", **strings)
    )


@pytest.mark.parametrize(
    ("kind", "pairs", "message"),
    [
        ("synthetic", ["bogus=1"], "unknown parameter 'bogus'"),
        ("synthetic", ["rate"], "'rate' is not key=value"),
        ("synthetic", ["rate=1", "rate=2"], "'rate' is given twice"),
        ("synthetic", ["arrival=poisson"], "missing parameter rate="),
        ("synthetic", ["arrival=poisson", "rate=-1"], "rate=-1.0 must be > 0"),
        ("synthetic", ["arrival=poisson", "rate=0"], "rate=0.0 must be > 0"),
        ("synthetic", ["arrival=poisson", "rate=fast"], "rate='fast' is not a finite number"),
        ("synthetic", ["arrival=poisson", "rate=inf"], "rate='inf' is not a finite number"),
        ("synthetic", ["arrival=gamma", "rate=1"], "missing parameter cv="),
        ("synthetic", ["arrival=weekly"], "arrival='weekly' is not one of"),
        ("synthetic", ["rate=2"], "rate='2' does not apply"),
        ("synthetic", ["prompt=fixed"], "missing parameter prompt_value="),
        ("synthetic", ["prompt=fixed", "prompt_value=2.5"], "prompt_value='2.5' is not an integer"),
        ("synthetic", ["prompt=fixed", "prompt_value=0"], "prompt_value=0 must be >= 1"),
        (
            "synthetic",
            ["prompt=fixed", "prompt_value=3", "prompt_sigma=1"],
            "prompt_sigma='1' does not apply",
        ),
        ("synthetic", ["output=uniform", "output_lo=9", "output_hi=3"], "output_lo, output_hi"),
        ("synthetic", ["output=zipf", "output_a=1"], "output_a=1.0 must be > 1"),
        ("synthetic", ["prompt_median=5", "prompt_mean=6"], "not both"),
        ("synthetic", ["prompt=normal"], "prompt='normal' is not one of"),
        ("synthetic", ["predict_sigma=-0.1"], "predict_sigma=-0.1 must be >= 0"),
        ("synthetic", ["tick=0"], "tick=0.0 must be > 0"),
        ("infermax-grid", ["prompt=4"], "missing parameter output="),
        ("infermax-grid", ["prompt=4", "output=x"], "output='x' is not an integer"),
        ("infermax-mix", [], "missing parameter groups="),
        ("infermax-mix", ["groups=LILO+LILO"], "two different groups"),
        ("infermax-mix", ["groups=LILO+XXXX"], "two different groups"),
        ("sharegpt", ["rule=bytes"], "rule='bytes' is not one of"),
        ("sharegpt", ["rule=words", "chars_per_token=3"], "chars_per_token='3' does not apply"),
        ("sharegpt", ["max_total=1"], "max_total=1 must be >= 2"),
        ("sharegpt", ["turns=last"], "turns='last' is not one of"),
        # Past its range cv**2 once underflowed or overflowed: ZeroDivisionError, OverflowError, a NaN arrival.
        ("synthetic", ["arrival=gamma", "rate=1", "cv=1e-200"], "synthetic: cv must be from 1e-06 to 100"),
        ("synthetic", ["arrival=gamma", "rate=1", "cv=1e155"], "synthetic: cv must be from 1e-06 to 100"),
        ("synthetic", ["arrival=gamma", "rate=1", "cv=1e-155"], "synthetic: cv must be from 1e-06 to 100"),
        ("synthetic", ["prompt_mean=5000"], "synthetic: prompt_mean, prompt_sigma, prompt_max: mean must be"),
        ("synthetic", ["output_mean=1", "output_sigma=0.5"], "output_mean, output_sigma, output_max"),
        # 1e-300 once gave inf token counts, cast to a prompt of -9223372036854775808.
        (
            "sharegpt",
            ["chars_per_token=1e-300"],
            "sharegpt: chars_per_token=1e-300 must be from 0.01 to 1000",
        ),
        ("nonsense", [], "unknown generator 'nonsense'"),
    ],
)
def test_parse_params_errors_name_the_bad_key(kind: str, pairs: list[str], message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_params(kind, pairs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_generate_checks_params_and_sizes_too() -> None:
    with pytest.raises(InputError, match=r"rate=-2\.0 must be > 0"):
        _gen("synthetic", arrival="poisson", rate=-2)
    with pytest.raises(InputError, match="is not a finite number"):
        _gen("synthetic", arrival="poisson", rate=True)
    with pytest.raises(InputError, match=r"n must be an integer in 1\.\.10,000,000"):
        _gen("synthetic", n=0)
    with pytest.raises(InputError, match="seed must be an integer >= 0"):
        _gen("synthetic", seed=-1)


def test_typed_building_blocks_reject_bad_values() -> None:
    for build in (
        lambda: Poisson(0.0),
        lambda: Gamma(1.0, -1.0),
        lambda: Fixed(0),
        lambda: Uniform(0, 3),
        lambda: LogNormal(-1.0),
        lambda: LogNormal.from_mean(0.0),
        lambda: Zipf(0.9),
        lambda: infermax_mix(("SISO",), 4, 0, LIMITS),
    ):
        with pytest.raises(InputError):
            build()


def test_every_registered_kind_documents_its_keys() -> None:
    assert set(GENERATORS) == {
        "synthetic",
        "infermax-grid",
        "infermax-mix",
        "sharegpt",
        "azure-conv",
        "azure-code",
    }
    for spec in GENERATORS.values():
        assert spec.summary and all(spec.keys.values())


def test_typed_and_flat_interfaces_agree() -> None:
    typed = synthetic(
        40,
        3,
        LIMITS,
        UNIT,
        arrival=Poisson(1.5),
        prompt=Zipf(1.2, max=300),
        output=Uniform(1, 20),
    )
    flat = _gen(
        "synthetic",
        n=40,
        seed=3,
        arrival="poisson",
        rate=1.5,
        prompt="zipf",
        prompt_a=1.2,
        prompt_max=300,
        output="uniform",
        output_lo=1,
        output_hi=20,
    )
    assert instance_to_dict(typed) == instance_to_dict(flat)
    assert synthetic(3, 0, LIMITS, prompt=Fixed(1), output=Fixed(1), arrival=SemiOnline()).time_model == UNIT


# ----------------------------------------------------------------------------- shipped examples


def _example_files() -> list[Path]:
    folder = resources.files("kvsched.instances") / "examples"
    # Instances only: ``*.schedule.json`` files are example schedules for them.
    return sorted(
        Path(str(p))
        for p in folder.iterdir()
        if p.name.endswith(".json") and not p.name.endswith(".schedule.json")
    )


def test_the_examples_exist() -> None:
    names = {p.stem for p in _example_files()}
    assert {"tiny", "figure15", "sharegpt-small", "chunked-prefill"} <= names


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.stem)
def test_each_example_loads_and_regenerates_from_its_meta(path: Path) -> None:
    inst = load_instance(path)  # includes check_feasible
    meta = inst.meta
    again = generate(
        meta["kind"],
        n=meta["n"],
        seed=meta["seed"],
        limits=inst.limits,
        time_model=inst.time_model,
        **meta["params"],
    )
    again = dataclasses.replace(
        again, name=inst.name, meta={**again.meta, "description": meta["description"]}
    )
    assert instance_to_dict(again) == instance_to_dict(inst)


def test_figure15_example_matches_the_paper() -> None:
    inst = load_instance(next(p for p in _example_files() if p.stem == "figure15"))
    assert [(r.arrival, r.prompt, r.output) for r in inst.requests] == [(0.0, 4, 4)] * 4
    assert inst.limits.kv_capacity == 8 and inst.time_model.name == "unit"


def test_tiny_example_needs_memory_management() -> None:
    inst = load_instance(next(p for p in _example_files() if p.stem == "tiny"))
    lim = inst.limits
    assert 6 <= len(inst) <= 8 and inst.time_model.name == "unit"
    assert lim.max_batch_tokens is not None and lim.max_prefill_tokens is not None
    # Far more total peak KV than M: not everything can be resident at once.
    assert sum(r.peak_kv for r in inst.requests) > 2 * lim.kv_capacity


def test_chunked_example_has_prompts_longer_than_the_prefill_budget() -> None:
    inst = load_instance(next(p for p in _example_files() if p.stem == "chunked-prefill"))
    budget = inst.limits.max_prefill_tokens
    assert budget is not None and max(r.prompt for r in inst.requests) > budget
    assert all(r.predicted_output is not None for r in inst.requests)
