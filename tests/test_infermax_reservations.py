"""InferMax's reservations cover the KV of every running request at each decision.

``_consider_decodes`` counts the running decodes that need one more block (``want > alloc``, with
``want`` = m + 1) instead of summing ``max(alloc, want) - alloc``: the two are equal exactly while
``alloc >= m`` for every running request, which these tests check at every policy call. With input
reservations on blocks of one token, the decodes are admitted without reading their reservations when
their sum says each is exactly its KV (``_decodes_hold_their_reservations``): checked here against the
reservations read one by one (and a run's decodes, taken the same way), and the schedules against those
of the path that reads them.
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


class _Exact(InferMax):
    """InferMax that checks the sums' answer against every running decode's reservation read one by one."""

    checked = runs = 0

    def _group_running(self, view, run):
        build = super()._group_running(view, run)
        if build.num_decodes and self.reserve == "input" and self._block == 1 and self.priority != "none":
            decodes = build.order[build.decode]
            assert build.exact == bool(np.all(self._alloc[decodes] == view.kv[decodes])), self.name
            _Exact.checked += int(build.exact)
        return build

    def _grow_decodes(self, view, req, limit, ahead=0):
        if self._decodes_exact:  # (a run's decodes, taken on their reservations without reading them)
            assert np.all(self._alloc[req] == view.kv[req] + ahead), self.name
            _Exact.runs += 1
        return super()._grow_decodes(view, req, limit, ahead)


class _Read(InferMax):
    """InferMax that always reads the decodes' reservations (the bulk admission's general path)."""

    def _decodes_hold_their_reservations(self, build):
        return False


def _as(cls: type[InferMax], base: InferMax) -> InferMax:
    policy = cls.__new__(cls)
    policy.__dict__.update(base.__dict__)  # the same flags (and the runs it opted out of)
    return policy


@pytest.mark.parametrize("name", INFERMAX)
def test_exact_reservations_are_read_off_sums_and_admit_what_reading_them_does(name):
    base = make_policy(name)
    assert isinstance(base, InferMax)
    for inst in INSTANCES.values():
        try:
            fast = simulate(inst, _as(_Exact, base))
        except (ScheduleError, AssertionError):
            raise
        except Exception:  # a policy that cannot run this instance (its budgets) is not checked here
            continue
        read = simulate(inst, _as(_Read, base))
        assert len(fast.trace.records) == len(read.trace.records)
        for a, b in zip(fast.schedule, read.schedule, strict=True):
            assert a.start == b.start and a.duration == b.duration
            assert np.array_equal(a.requests, b.requests) and np.array_equal(a.tokens, b.tokens)
            assert np.array_equal(a.evicted, b.evicted)


def test_the_sums_find_exact_reservations():
    _Exact.checked = _Exact.runs = 0
    for inst in INSTANCES.values():
        simulate(inst, _as(_Exact, make_policy("sarathi")))
    assert _Exact.checked > 0 and _Exact.runs > 0
