"""CalibratedCost.decode_run_until leaves a cut past SMALL batches to the caller without pricing them first.

When SMALL batches of the longest duration among them end well before ``until``,
the method answers ``None`` at once (the caller then prices the run on arrays);
otherwise it prices the batches one by one as before. Either way it answers
``None`` exactly when more than SMALL batches are asked for and SMALL of them
start before ``until``, and otherwise the durations of the batches that do and
the last one's end, bit for bit those of the per-batch loop.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kvsched.costmodel import make_cost_model
from kvsched.costmodel.base import decode_run_times
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.costmodel.small import SMALL
from kvsched.schedule.core import TIME_TOL


def _cut(durations: np.ndarray, start: float, until: float) -> tuple[int, float]:
    """The stepper's cut spelled out: how many batches start before ``until``, and the last one's end."""
    keep, t = 0, start
    for d in durations.tolist():
        if t + TIME_TOL >= until:
            break
        t += d
        keep += 1
    return keep, t


@pytest.mark.parametrize("preset", ["llama-2-7b_a100-80gb_tp1"])
def test_the_bound_answers_as_the_loop(monkeypatch, preset):
    # The module itself (kvsched.costmodel's attribute of that name is its factory function).
    calibrated = sys.modules[CalibratedCost.__module__]
    cost = make_cost_model("calibrated", dict(resolve_cost_model(preset)[1]))
    rng = np.random.default_rng(3)
    for n in (1, 9, 64, 200):
        context = rng.integers(1, 4000, n)
        for k in (SMALL - 1, SMALL, SMALL + 1, 500):
            durations = decode_run_times(cost, context, k)
            start = float(rng.uniform(0, 1000))
            ends = np.add.accumulate(np.concatenate(([start], durations)))
            # Around the end of the first SMALL batches (where the bound must not answer early), and far.
            pivot = float(ends[min(SMALL, k) - 1])
            untils = [pivot * (1 + f) for f in (-1e-6, -1e-12, 0.0, 1e-12, 1e-6, 1e-3)]
            untils += [float(ends[-1]) + 1.0, float(ends[-1]) * 2, start, start + TIME_TOL]
            for until in untils:
                got = cost.decode_run_until(context, k, start, until, TIME_TOL)
                with monkeypatch.context() as m:
                    m.setattr(calibrated, "_MARGIN", float("inf"))  # the bound never answers: the loop
                    loop = cost.decode_run_until(context, k, start, until, TIME_TOL)
                keep, end = _cut(durations, start, until)
                if k > SMALL and keep >= SMALL:
                    assert got is None and loop is None
                    continue
                assert got is not None and loop is not None
                np.testing.assert_array_equal(got[0], durations[:keep])
                np.testing.assert_array_equal(loop[0], durations[:keep])
                assert got[1] == loop[1] == end
