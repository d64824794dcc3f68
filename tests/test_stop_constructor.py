"""The :class:`~kvsched.stop.Deadline` constructor refuses what is not a deadline, and
:class:`~kvsched.stop.DeadlineReached` is a user-facing error with a message."""

from __future__ import annotations

import math
import pickle
import time

import pytest

import kvsched as kv
from kvsched.errors import InputError, KvschedError
from kvsched.stop import Deadline, DeadlineReached


def test_a_number_of_seconds_is_refused_with_a_pointer_to_after():
    # Deadline(30) was a monotonic reading of 30 (long past): solve returned at once, compare ran nothing.
    with pytest.raises(InputError, match=r"Deadline\.after\(30"):
        Deadline(30)
    with pytest.raises(InputError, match=r"Deadline\.after"):
        Deadline(end=5.0)


@pytest.mark.parametrize(
    ("end", "limit", "message"),
    [
        (math.nan, 1.0, "NaN"),
        (1.0e9, math.nan, "NaN"),
        (math.nan, math.inf, "NaN"),
        (1.0e9, 0.0, "limit must be a positive"),
        (1.0e9, -1.0, "limit must be a positive"),
        ("30", 1.0, "end must be a number"),
        (1.0e9, None, "limit must be a number"),
        (True, 1.0, "end must be a number"),
    ],
)
def test_bad_fields_are_one_input_error(end, limit, message):
    with pytest.raises(InputError, match=message):
        Deadline(end, limit)


def test_internal_two_field_construction_still_works():
    now = time.monotonic()
    d = Deadline(now + 5, 10)  # positional (end, limit), as the stages and tests build it
    assert d.bounded and not d.expired() and isinstance(d.limit, float)
    assert Deadline(end=0.0, limit=1.0).expired()
    assert not Deadline().bounded and Deadline() == Deadline.never()
    after = Deadline.after(2)
    assert 0 < after.remaining() <= 2 and after.limit == 2.0
    assert after.share(0.5).end <= after.end and after.before(0.5).end < after.end
    assert "left of 2 s" in repr(after)


def test_deadline_reached_is_a_kvsched_error_with_a_message():
    err = DeadlineReached()
    assert isinstance(err, KvschedError) and str(err)
    with pytest.raises(KvschedError, match="deadline passed"):
        Deadline(end=0.0, limit=1.0).check()
    again = pickle.loads(pickle.dumps(DeadlineReached("simulate: late")))
    assert str(again) == "simulate: late"


def test_a_direct_deadline_of_seconds_no_longer_makes_solve_return_at_once():
    inst = kv.load_instance(kv.example("figure15"))
    with pytest.raises(InputError, match=r"Deadline\.after"):
        kv.solve(inst, formulation="batch", solver="cpsat", deadline=kv.Deadline(30))
