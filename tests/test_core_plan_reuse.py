"""What the core carries from a run's plan to its application, and its fast record constructors.

:meth:`~kvsched.schedule.core.EngineState.plan_run` reads the decodes' KV and tokens left
to generate; :meth:`make_run` and :meth:`apply_run` reuse them (the record's KV before the
run, the one decode that completes, the run's end) instead of reading the state again.
Here every run of simulated schedules is made from a plan and applied, beside the same run
built with :meth:`Run.of` (no plan) applied to a second state: records and states must be
identical. The records and runs the core builds through their slot descriptors must equal
the dataclasses' own constructors, and stay frozen.
"""

from __future__ import annotations

import dataclasses
from copy import copy

import numpy as np
import pytest

from kvsched.costmodel import make_cost_model
from kvsched.heuristics import make_policy, simulate
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Chunk, Run
from kvsched.schedule.records import BatchRecord, RunRecord, new_batch_record, new_run_record
from tests.test_runs import _instances
from tests.test_simulator_equivalence import assert_same_state


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype
        elif dataclasses.is_dataclass(x):
            _same(x, y)
        else:
            assert x == y, f.name


def test_fast_constructors_equal_the_dataclasses_and_stay_frozen():
    a, b = np.array([3, 1], dtype=np.int64), np.array([1], dtype=np.int64)
    batch_args = (4, 1.5, 2.25, 3, 40, 38, 2, 900, 57, 6, 1, a, b)
    run = Run.of(2.25, [0.5, 0.75], a, Chunk(7, 30, 0, 0))
    run_args = (5, run, a, 100, 7, 16, 4, b, 12, BatchRecord(*batch_args))
    for fast, slow in (
        (new_batch_record(*batch_args), BatchRecord(*batch_args)),
        (new_run_record(*run_args), RunRecord(*run_args)),
        (Run._trusted(2.25, run.durations, a, run.chunk, run.end), run),
        (Run._trusted(2.25, run.durations, a, run.chunk), run),
        (Batch._trusted(1.5, 0.75, a, b[[0, 0]], b[[0, 0]], b), Batch(1.5, 0.75, a, b[[0, 0]], b[[0, 0]], b)),
    ):
        _same(fast, slow)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(fast, dataclasses.fields(fast)[0].name, 0)


@pytest.mark.parametrize("case", ["poisson-calibrated", "paged-budgets", "tight-unit"])
@pytest.mark.parametrize("policy", ["sarathi", "vllm-v1"])
def test_a_planned_run_applies_as_the_same_run_without_a_plan(case, policy):
    inst = _instances()[case]
    result = simulate(inst, make_policy(policy))
    cost = make_cost_model(inst.time_model.name, dict(inst.time_model.params))
    planned, plain = EngineState(inst, cost), EngineState(inst, cost)
    runs = completing = 0
    for entry in result.schedule.entries:
        if type(entry) is not Run:
            _same(planned.step(entry), plain.step(entry))
            continue
        chunk = entry.chunk
        items = entry.requests if chunk is None else np.append(entry.requests, chunk.request)
        items.setflags(write=False)
        # Planned from the clock up to the run's end: its last batch is the last that starts before it.
        limit, _ = planned.plan_run(items, 0 if chunk is None else chunk.tokens, entry.end)
        assert limit >= entry.repeat
        made = planned.make_run(entry.start, items, entry.repeat, 0 if chunk is None else chunk.tokens)
        np.testing.assert_array_equal(made.durations, entry.durations)
        assert (made.start, made.end, made.chunk) == (entry.start, entry.end, entry.chunk)
        again = Run.of(entry.start, entry.durations, entry.requests, entry.chunk)
        record = planned.step_run(made)
        _same(record, plain.step_run(again))
        runs += 1
        completing += bool(record.completed.size)
    assert_same_state(planned, plain)
    assert runs and completing


def test_a_state_copy_forgets_the_plan():
    inst = _instances()["tight-unit"]
    cost = make_cost_model(inst.time_model.name, dict(inst.time_model.params))
    state = EngineState(inst, cost)
    assert copy(state)._made_run is None
