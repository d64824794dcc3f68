"""The schedule objectives (:data:`kvsched.csp.objectives.OBJECTIVES`): values on a trace, a clear error
on anything else."""

from __future__ import annotations

import pytest

from kvsched.csp.objectives import OBJECTIVES, makespan, sum_ttft, total_latency
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from tests.test_examples import EXAMPLES

FIG15 = load_instance(EXAMPLES / "figure15.json")


@pytest.fixture(scope="module")
def run():
    return simulate(FIG15, make_policy("vllm"))


def test_values_on_figure15(run):
    # vllm on Figure 15: TTFT 1, 1, 8, 8 and latencies 4, 7, 11, 14 (seed 003 Fig. 15).
    assert total_latency(run.trace) == pytest.approx(36.0)
    assert sum_ttft(run.trace) == pytest.approx(18.0)
    assert makespan(run.trace) == pytest.approx(14.0)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_a_run_result_or_schedule_is_an_input_error(run, name):
    objective = OBJECTIVES[name]
    with pytest.raises(InputError, match=r"^trace: expected a Trace .*got SimResult \(pass its \.trace\)"):
        objective(run)
    for wrong in (run.schedule, None, 5):
        with pytest.raises(InputError, match=r"^trace: expected a Trace"):
            objective(wrong)
