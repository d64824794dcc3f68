"""``solve()``'s arguments are checked at the entry point (one InputError naming the argument), and its
:class:`~kvsched.csp.result.Result` has a short, cheap repr."""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvsched as kv
from kvsched.csp.backends import SolverOptions
from kvsched.csp.result import Result, SolveStatus
from kvsched.csp.run import check_replayable
from kvsched.errors import InputError
from kvsched.schedule.ir import Batch, Schedule


@pytest.fixture(scope="module")
def inst():
    return kv.load_instance(kv.example("figure15"))


@pytest.mark.parametrize("deadline", [5, 5.0, "5", object()])
def test_a_deadline_that_is_not_a_deadline_is_one_input_error(inst, deadline):
    with pytest.raises(InputError, match=r"deadline: expected a kvsched\.Deadline"):
        kv.solve(inst, deadline=deadline)
    with pytest.raises(InputError, match="deadline"):
        check_replayable(inst, deadline)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        (SolverOptions(gap="0"), "options.gap"),
        (SolverOptions(gap=None), "options.gap"),
        (SolverOptions(gap=float("nan")), "options.gap"),
        (SolverOptions(gap=True), "options.gap"),
        (SolverOptions(gap=1.0), "options.gap"),
        (SolverOptions(seed="1"), "options.seed"),
        (SolverOptions(threads="2"), "options.threads"),
        (SolverOptions(time_limit="1"), "options.time_limit"),
        (SolverOptions(log="False"), "options.log"),
    ],
)
def test_every_solver_option_is_type_checked_first(inst, options, name):
    with pytest.raises(InputError, match=name):
        kv.solve(inst, formulation="batch", solver="cpsat", options=options)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"export": 5}, "export"),
        ({"export": ["m.lp"]}, "export"),
        ({"progress": True}, "progress"),
        ({"progress": 5}, "progress"),
        ({"progress": "print"}, "progress"),
    ],
)
def test_export_and_progress_are_checked_first(inst, kwargs, name):
    with pytest.raises(InputError, match=f"^{name}:"):
        kv.solve(inst, formulation="batch", time_limit=5, **kwargs)


def test_result_repr_is_short_and_says_what_matters(inst):
    got = []
    res = kv.solve(inst, formulation="batch", solver="cpsat", time_limit=10, progress=got.append)
    assert got  # a callable progress is still called
    text = repr(res)
    assert text.startswith("Result(status=") and len(text) < 600
    for part in ("objective=", "best_bound=", "gap=", "scope='all'", "<Schedule: "):
        assert part in text


def test_result_repr_is_cheap_on_a_long_schedule():
    one = np.zeros(1, dtype=np.int64)
    batches = tuple(
        Batch._trusted(float(k), 1.0, one, one, one.astype(np.int8), one[:0]) for k in range(50_000)
    )
    res = Result(SolveStatus.FEASIBLE, 50_000.0, None, None, 1.0, Schedule(batches))
    t0 = time.perf_counter()
    text = repr(res)
    assert time.perf_counter() - t0 < 0.5 and len(text) < 600
    assert "50,000 batches" in text and "best_bound=None" in text
