"""A hand-built :class:`Batch`, :class:`Run` or :class:`Schedule` is checked (converted or refused with
one InputError naming the field) at construction; the core's trusted path stays unchecked; reprs are short."""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvsched as kv
from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request
from kvsched.schedule.ir import Batch, Chunk, Run, Schedule
from kvsched.schedule.validate import validate

a = np.array


@pytest.fixture(scope="module")
def inst():
    return Instance((Request("a", 0, 2, 2), Request("b", 0, 2, 2)), Limits(100))


def test_plain_lists_and_int_times_are_converted(inst):
    s = Schedule([Batch(0, 1, [0, 1], [2, 2], [0, 0]), Batch(1, 1, [0, 1], [1, 1], [1, 1], [])])
    assert type(s.entries) is tuple
    b = s.entries[0]
    assert type(b.start) is float and b.requests.dtype == np.int64 and b.phases.dtype == np.int8
    assert not b.tokens.flags.writeable
    assert validate(inst, s).ok
    same = Schedule((Batch.of(0, 1, [0, 1], [2, 2], [0, 0]), Batch.of(1, 1, [0, 1], [1, 1], [1, 1])))
    assert s.same_as(same)
    assert Batch(0.0, 1.0, a([0]), a([2.0]), a([0])).tokens.tolist() == [2]  # a whole float is taken


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: Batch(0, 1, a([0, 1]), a([2]), a([0, 0])), "same length"),
        (lambda: Batch("0", 1, a([0, 1]), a([2, 2]), a([0, 0])), "Batch.start"),
        (lambda: Batch(0, None, a([0]), a([2]), a([0])), "Batch.duration"),
        (lambda: Batch(0, 1, a([0, 1]), a([1.9, 2.5]), a([0, 0])), "Batch.tokens: 1.9"),
        (lambda: Batch(0, 1, a([0]), a([np.nan]), a([0])), "Batch.tokens"),
        (lambda: Batch(0, 1, ["a"], [2], [0]), "Batch.requests"),
        (lambda: Batch(0, 1, a([[0]]), a([2]), a([0])), "Batch.requests"),
        (lambda: Batch(0, 1, a([0]), a([2]), a([0]), ["b"]), "Batch.evicted"),
        (lambda: Schedule((5,)), r"Schedule.entries\[0\]"),
        (lambda: Schedule((Batch.of(0, 1, [0], [2], [0]), "x")), r"Schedule.entries\[1\]"),
        (lambda: Schedule(5), "Schedule.entries"),
        (lambda: Schedule(Batch.of(0, 1, [0], [2], [0])), "Schedule.entries"),
        (lambda: Schedule((), meta=[1]), "Schedule.meta"),
        (lambda: Run("0", a([1.0]), a([0]), 1.0), "Run.start"),
        (lambda: Run(0.0, ["x"], a([0]), 1.0), "Run.durations"),
        (lambda: Run(0.0, [], a([0]), 1.0), "Run.durations"),
        (lambda: Run(0.0, [1.0], [0.5], 1.0), "Run.requests"),
    ],
)
def test_bad_hand_built_entries_are_one_input_error(build, name):
    with pytest.raises(InputError, match=name):
        build()


def test_a_hand_built_run_is_converted():
    run = Run(0, [1, 1], [0], 2, (1, 3, 0))
    assert type(run.start) is float and run.durations.dtype == np.float64 and type(run.chunk) is Chunk
    assert run.repeat == 2 and run.chunk == Chunk(1, 3, 0)
    assert Run.of(0, [1.0, 1.0], [0]).end == 2.0  # the public builder is unchanged


def test_the_trusted_path_is_not_checked():
    # The core's make_batch path: no __init__, no check (the caller built every field already).
    b = Batch._trusted(0.0, 1.0, [0], [2], [0], [])  # type: ignore[arg-type]
    assert b.requests == [0]


def test_reprs_are_short_and_cheap():
    inst = kv.generate("sharegpt", n=300, limits=kv.Limits(kv_capacity=20000), arrival="poisson", rate=5)
    res = kv.simulate(inst, kv.make_policy("vllm"))
    for obj, head in ((res.schedule, "<Schedule: "), (res.trace, "<Trace of "), (res, "SimResult(")):
        t0 = time.perf_counter()
        text = repr(obj)
        assert time.perf_counter() - t0 < 0.5 and len(text) < 600 and text.startswith(head), text
    assert f"{len(res.schedule):,} batches" in repr(res.schedule)
    assert "300 requests" in repr(res.trace) and "0 violations" in repr(res.trace)
    assert "policy='vllm'" in repr(res)
