"""The per-batch shortcuts of issue #16 against the plain formulations they replace.

Small-array reductions through lists (:mod:`kvsched.costmodel.small`), batch times from
the core's counts (:func:`kvsched.costmodel.base.time_of_counts`), the core's per-request
"left" array and its derived ``processed``, and run_limit's trust in the batch just applied.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from kvsched.costmodel import REGISTRY, BatchView, make_cost_model
from kvsched.costmodel.base import time_of_counts
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.costmodel.features import BatchFeatures
from kvsched.costmodel.small import LIST_MAX, RUNNING_MAX, SMALL, count, fmax, imax, imin, isum
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Phase
from tests.strategies import SETTINGS, legal_schedules


@pytest.mark.parametrize(
    "size",
    [1, 2, LIST_MAX, LIST_MAX + 1, SMALL - 1, SMALL, SMALL + 1, 500, RUNNING_MAX, RUNNING_MAX + 1, 2000],
)
def test_small_reductions_equal_numpy(size):
    rng = np.random.default_rng(size)
    a = rng.integers(-(10**12), 10**12, size)
    assert isum(a) == int(a.sum()) and type(isum(a)) is int
    assert imin(a) == int(a.min()) and imax(a) == int(a.max())
    assert type(imin(a)) is int and type(imax(a)) is int
    f = rng.normal(size=size)
    assert fmax(f) == float(f.max()) and type(fmax(f)) is float
    assert count(a > 0) == int(np.count_nonzero(a > 0)) and type(count(a > 0)) is int


def _model(name: str):
    params = dict(resolve_cost_model("llama-2-7b_a100-80gb_tp1")[1]) if name == "calibrated" else {}
    return make_cost_model(name, params)


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_time_of_counts_is_batch_time_bit_for_bit(model):
    cost = _model(model)
    priced = time_of_counts(cost)
    rng = np.random.default_rng(3)
    for size in (1, 3, 40, 300):
        for mix in ("decode", "prefill", "mixed"):
            phases = {
                "decode": np.full(size, Phase.DECODE),
                "prefill": rng.choice([Phase.PREFILL, Phase.REFILL], size),
                "mixed": rng.choice([Phase.PREFILL, Phase.DECODE, Phase.REFILL], size),
            }[mix].astype(np.int8)
            dec = phases == Phase.DECODE
            tokens = np.where(dec, 1, rng.integers(1, 600, size)).astype(np.int64)
            context = rng.integers(0, 5000, size).astype(np.int64)
            want = cost.batch_time(BatchView(tokens, context, phases))
            got = priced(tokens, context, phases, dec, int(dec.sum()), int(tokens.sum()))
            assert got == want, (model, size, mix)


def test_features_of_counts_equal_the_float_formulation():
    rng = np.random.default_rng(5)
    for size in (1, 7, 100):
        phases = rng.choice([Phase.PREFILL, Phase.DECODE, Phase.REFILL], size).astype(np.int8)
        tokens = rng.integers(1, 600, size).astype(np.int64)
        context = rng.integers(0, 5000, size).astype(np.int64)
        view = BatchView(tokens, context, phases)
        assert BatchFeatures.of(view) == BatchFeatures._of_floats(view)


@SETTINGS
@given(legal_schedules())
def test_left_and_processed_follow_their_definitions(built):
    """``_left`` is S - m (0 once done) and ``processed`` the tokens of every batch, after each batch."""
    state = EngineState(built.instance, built.cost_model)
    processed = np.zeros(state.n, dtype=np.int64)
    for batch in built.schedule.batches:
        again = state.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted)
        state.step(again)
        np.add.at(processed, batch.requests, batch.tokens)
        left = np.where(state.done, 0, state.prompt + state.generated - state.kv)
        np.testing.assert_array_equal(state._left, left)
        np.testing.assert_array_equal(state.processed, processed)


@SETTINGS
@given(legal_schedules())
def test_run_limit_of_the_batch_just_applied_needs_no_recheck(built):
    """run_limit gives the same answer for the applied batch's own positions and for a fresh copy."""
    state = EngineState(built.instance, built.cost_model)
    for batch in built.schedule.batches:
        made = state.make_batch(batch.start, batch.requests, batch.tokens, batch.evicted)
        state.step(made)
        assert state.run_limit(made.requests) == state.run_limit(np.array(made.requests))
