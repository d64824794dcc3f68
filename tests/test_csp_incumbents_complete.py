"""A greedy run cut short for time, its requests finished against reserved peaks (csp.incumbents.complete)."""

import importlib

import numpy as np
import pytest

from kvsched.csp.certificate import Scope, scope_of
from kvsched.csp.incumbents import best_incumbent, greedy
from kvsched.csp.incumbents.complete import reserved_batches
from kvsched.schedule.core import ScheduleError
from kvsched.schedule.ir import Batch, Run, Schedule
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.incumbent_instances import budget_instance, make_instance, objective_value, random_instance

greedy_module = importlib.import_module("kvsched.csp.incumbents.greedy")


class _After(Deadline):
    """A bounded deadline that has passed once it has been asked ``calls`` times (no clock involved)."""

    def __init__(self, calls: int) -> None:
        object.__setattr__(self, "end", 1e18)
        object.__setattr__(self, "limit", 1.0)
        self.__dict__["calls"] = calls

    def remaining(self) -> float:
        self.__dict__["calls"] -= 1
        return 1e9 if self.__dict__["calls"] >= 0 else 0.0


@pytest.fixture
def one_batch_chunks(monkeypatch):
    """The kernels decide one batch between two checks of ``stop``, so a tiny run can be cut anywhere."""
    monkeypatch.setattr(greedy_module, "CHUNK_JIT", 1)
    monkeypatch.setattr(greedy_module, "CHUNK_PY", 1)


def _instances():
    rng = np.random.default_rng(11)
    out = [random_instance(rng, int(rng.integers(4, 14))) for _ in range(8)]
    out += [budget_instance(rng, 10), budget_instance(rng, 10, "infermax-linear")]
    # Long prompts under a budget: the completion chunks prompts and refills.
    out.append(make_instance([(30, 6, 0), (25, 9, 1), (40, 3, 2), (12, 12, 2)], 60, c=16, p=16))
    return out


@pytest.mark.parametrize("jit", [True, False])
def test_a_run_cut_anywhere_is_finished_legally(one_batch_chunks, jit):
    cut = 0
    for inst in _instances():
        for calls in (0, 1, 3, 8, 20):
            inc = greedy(inst, jit=jit, stop=_After(calls))
            # The schedule is checked again by an independent replay: legal, complete, the value the same.
            trace = replay(inst, inc.schedule)
            assert trace.state.all_done
            assert inc.value == objective_value(inst, inc)
            if "cut_for_time" in inc.stats:
                cut += 1
                assert inc.name.endswith("+reserved-batches")
                assert inc.schedule.meta["completed_against_reserved_peaks"] == inc.stats["cut_for_time"] > 0
            # The counts are the whole schedule's, the completion's batches and evictions included.
            assert inc.stats["batches"] == len(inc.schedule.batches)
            assert inc.stats["evictions"] == sum(b.evicted.size for b in inc.schedule.batches)
    assert cut > 20  # (most of these runs were cut, so the test checks the completion)


def test_a_stop_that_never_comes_changes_nothing(one_batch_chunks):
    for inst in _instances():
        plain = greedy(inst)
        stopped = greedy(inst, stop=Deadline.after(1e6))
        assert stopped.name == plain.name
        assert stopped.value == plain.value
        assert stopped.schedule.same_as(plain.schedule)


def test_the_completion_alone_finishes_every_request_against_reserved_peaks():
    rng = np.random.default_rng(3)
    for inst in [random_instance(rng, 12) for _ in range(6)]:
        made: list[Batch | Run] = []

        def rest(state, made=made):
            for entry in reserved_batches(state):
                made.append(entry)
                yield entry

        trace = replay(inst, Schedule(()), then=rest)
        assert trace.state.all_done
        # Each entry is legal where it stands: the schedule of them replays on its own.
        assert replay(inst, Schedule(tuple(made))).state.all_done
        # Peaks reserved: the running requests' peaks never exceed the capacity, so nothing is evicted.
        assert not trace.state.evictions.any()


def test_replay_checks_what_then_makes():
    inst = make_instance([(4, 3, 0), (5, 2, 0)], 20)
    state_seen = []

    def illegal(state):
        state_seen.append(state.num_batches)
        yield Batch.of(state.clock, 1.0, [0], [99], [0])  # more prompt tokens than the request has

    with pytest.raises(ScheduleError):
        replay(inst, Schedule(()), then=illegal)
    assert state_seen == [0]


def test_best_incumbent_cuts_only_its_first_run(one_batch_chunks, monkeypatch):
    monkeypatch.setattr(greedy_module, "must_stop", lambda stop, finish: True)
    monkeypatch.setattr(greedy_module, "PROBE_BATCHES", 1)  # a tiny run's sample: probed at its first batch
    inst = random_instance(np.random.default_rng(8), 12)
    best = best_incumbent(inst, deadline=Deadline.after(30.0), first_deadline=Deadline.after(30.0))
    first = next(iter(best.stats["tried"]))
    assert first.endswith("+reserved-batches")
    assert replay(inst, best.schedule).state.all_done


def test_scope_of_reads_batches_only():
    run = Run.of(1.0, [1.0, 1.0], [0])
    assert scope_of(Schedule((Batch.of(0, 1, [0], [2], [0]), run))) == Scope.NO_EVICTION
    evicting = Batch.of(3, 1, [1], [2], [0], evicted=[0])
    assert scope_of(Schedule((run, evicting))) == Scope.ALL


def test_the_exact_formulations_first_schedule_is_cut_too(one_batch_chunks, monkeypatch):
    from kvsched.csp import driver
    from kvsched.csp.backends.options import SolverOptions

    stops = []

    def cut_greedy(*args, stop=None, **kwargs):
        stops.append(stop)
        return greedy(*args, stop=_After(2), **kwargs)  # cut after two checks, whatever the time

    monkeypatch.setattr(driver, "greedy", cut_greedy)
    inst = make_instance([(4, 3, 0), (6, 2, 0), (3, 5, 1), (5, 4, 2), (2, 6, 2)], 14)
    result = driver.solve(inst, formulation="time", options=SolverOptions(time_limit=20.0))
    assert stops and stops[0] is not None and stops[0].bounded  # the solve's own deadline is handed on
    assert replay(inst, result.schedule).state.all_done


class _Steady(Deadline):
    """A bounded deadline that never passes and always has ``left`` seconds to go (no clock involved)."""

    def __init__(self, left: float) -> None:
        object.__setattr__(self, "end", 1e18)
        object.__setattr__(self, "limit", left)
        self.__dict__["left"] = left

    def remaining(self) -> float:
        return self.__dict__["left"]


def test_a_run_that_fits_is_not_cut_on_a_first_batch_sample():
    # Under a seconds-based model the kernel hands back every batch for timing, so the cut's first check
    # comes after one batch. A probe of that one item costs a replay's fixed overhead (about 0.2 ms), and
    # priced per item for every request left (150 items each) it once cut 10k A100 requests after their first
    # batch with a minute to go (the whole run took 2 s). Here: 400 requests and a steady 2 s left, which that
    # one-item estimate (about 15 s) says cannot be met, and the run needs a fraction of it.
    rng = np.random.default_rng(5)
    reqs = [(int(rng.integers(20, 200)), int(rng.integers(5, 60)), float(k) * 0.01) for k in range(400)]
    inst = make_instance(reqs, 4000, 256, 256, time_model="infermax-linear")
    inc = greedy(inst, stop=_Steady(2.0))
    assert "cut_for_time" not in inc.stats
    assert inc.value == greedy(inst).value
