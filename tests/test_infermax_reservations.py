"""InferMax's reservations cover the KV of every running request at each decision.

``_consider_decodes`` counts the running decodes that need one more block (``want > alloc``, with
``want`` = m + 1) instead of summing ``max(alloc, want) - alloc``: the two are equal exactly while
``alloc >= m`` for every running request, which these tests check at every policy call.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.heuristics import list_policies, make_policy, simulate
from kvsched.heuristics.infermax import InferMax
from kvsched.schedule.core import ScheduleError
from tests.test_runs import INSTANCES

INFERMAX = [s.name for s in list_policies() if isinstance(make_policy(s.name), InferMax)]


class _Watched(InferMax):
    """InferMax that checks its reservations against the view's KV before each decision."""

    checked = 0

    def next_batch(self, view):
        running = self._running
        if running.size:
            assert np.all(self._alloc[running] >= view.kv[running]), (self.name, running)
            _Watched.checked += 1
        return super().next_batch(view)


@pytest.mark.parametrize("name", INFERMAX)
def test_every_running_request_holds_a_reservation_that_covers_its_kv(name):
    base = make_policy(name)
    assert isinstance(base, InferMax)
    before = _Watched.checked
    for inst in INSTANCES.values():
        policy = _Watched.__new__(_Watched)
        policy.__dict__.update(base.__dict__)  # the same flags (and the runs it opted out of)
        try:
            simulate(inst, policy)
        except (ScheduleError, AssertionError):  # the core's refusal is a bug; the check's failure too
            raise
        except Exception:  # a policy that cannot run this instance (its budgets) is not checked here
            continue
    assert _Watched.checked > before, name
