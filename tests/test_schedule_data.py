"""ProblemData: a cost model whose batches of the instance overflow is refused once, as one error line."""

from __future__ import annotations

import pytest

from kvsched.cli import main
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import save_instance
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.data import LONGEST_BATCH, ProblemData


def _instance(name: str, **params: float) -> Instance:
    reqs = tuple(Request(f"r{k}", float(k), 20 + 5 * k, 3 + k) for k in range(4))
    return Instance(reqs, Limits(kv_capacity=4_000, max_batch_tokens=256), TimeModel(name, params))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("infermax-linear", {"a1": 1e308}),  # overflows to inf on the largest batch
        ("infermax-linear", {"b1": 1e305}),  # a KV slope: only decodes that read KV see it
        ("infermax-linear", {"a0": 1e13}),  # finite, but a batch of 300,000 years
    ],
)
def test_a_cost_model_that_overflows_on_this_instance_is_refused(name, params):
    inst = _instance(name, **params)
    with pytest.raises(
        InputError, match=rf"cost model {name}: a batch of this instance would take .* than 1e\+12"
    ):
        ProblemData.build(inst)
    with pytest.raises(InputError):
        simulate(inst, make_policy("sarathi"))


def test_sane_and_large_but_finite_models_pass():
    for inst in (_instance("infermax-linear"), _instance("infermax-linear", a0=1e6), _instance("unit")):
        data = ProblemData.build(inst)
        result = simulate(inst, make_policy("sarathi"))
        assert result.trace.ok and result.trace.state.clock <= 4 * LONGEST_BATCH
        assert data.cost_model.name == inst.time_model.name


def test_the_command_says_it_in_one_line_without_warnings(tmp_path, capsys):
    path = tmp_path / "inst.json"
    save_instance(_instance("infermax-linear"), path)
    code = main(["simulate", str(path), "--policy", "sarathi", "--cost-param", "p1=1e308"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "cost model infermax-linear" in err[0] and "out of range" in err[0]


def test_a_cost_model_whose_batches_take_no_time_is_refused(tmp_path, capsys):
    # `calibrated` leaves absent terms at zero by design (its files list the nonzero ones), so a file with
    # "params": {} made every batch take 0 s: makespan 0, and every rate and seconds bound divided by nothing.
    inst = _instance("calibrated")
    with pytest.raises(InputError, match=r"cost model calibrated: a batch of one prefill token would take 0"):
        ProblemData.build(inst)
    coef = tmp_path / "c.json"
    coef.write_text(
        '{"schema_version": 1, "kind": "kvsched.cost-coefficients", "name": "calibrated", "params": {}}'
    )
    path = tmp_path / "inst.json"
    save_instance(_instance("unit"), path)
    assert main(["simulate", str(path), "--policy", "sarathi", "--cost-model", str(coef)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "take some time" in err[0]
    # One term is enough: a per-token slope alone gives every batch a positive time.
    assert ProblemData.build(_instance("calibrated", a1=1e-5)).cost_model.name == "calibrated"
