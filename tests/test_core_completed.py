"""The core's completion order (``EngineState.completed_since``), which InferMax's release reads."""

from __future__ import annotations

from copy import copy

import numpy as np
import pytest

from kvsched.costmodel import make_cost_model
from kvsched.heuristics import make_policy, simulate
from kvsched.heuristics.base import SchedulerView
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Run
from tests.test_runs import _instances


@pytest.mark.parametrize("case", ["poisson-calibrated", "paged-budgets", "tight-unit"])
@pytest.mark.parametrize("policy", ["sarathi", "vllm-v1"])
def test_completions_are_listed_once_in_the_order_they_happen(case, policy):
    inst = _instances()[case]
    result = simulate(inst, make_policy(policy))
    cost = make_cost_model(inst.time_model.name, dict(inst.time_model.params))
    state = EngineState(inst, cost)
    view = SchedulerView(state)
    seen: list[int] = []
    for entry in result.schedule.entries:
        before = state.num_done
        record = state.step_run(entry) if type(entry) is Run else state.step(entry)
        new = view.completed_since(before)
        # Exactly the entry's completed requests (a run's tail record completes its chunk's request too).
        completed = record.completed.tolist() + (
            record.tail.completed.tolist() if type(entry) is Run and record.tail is not None else []
        )
        assert sorted(new) == sorted(completed)
        seen += new
    assert seen == state.completed_since(0)
    assert len(seen) == len(set(seen)) == state.num_done == len(inst)
    # Completion times never decrease along the list.
    assert np.all(np.diff(state.completion[seen]) >= 0)


def test_a_state_copy_keeps_its_own_completions():
    inst = _instances()["tight-unit"]
    result = simulate(inst, make_policy("sarathi"))
    state = result.trace.state
    twin = copy(state)
    twin._completed.append(-1)
    assert state.completed_since(0) == twin.completed_since(0)[:-1]
    assert state.completed_since(state.num_done) == []
