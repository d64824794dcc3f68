"""best_incumbent's time at scale: the deferred first replay and the first knapsack configuration."""

import importlib
from dataclasses import replace

import numpy as np
import pytest

from kvsched.csp.incumbents import best_incumbent
from kvsched.csp.incumbents.knapsack import KnapsackConfig
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline
from tests.incumbent_instances import budget_instance, make_instance, objective_value

best_module = importlib.import_module("kvsched.csp.incumbents.best")


def _spy_first_run(monkeypatch, **stats):
    """Record run_variant's keyword arguments; the first run's stats are overwritten with ``stats``."""
    calls: list[dict] = []
    real = best_module.run_variant

    def spy(*args, **kwargs):
        cand = real(*args, **kwargs)
        calls.append(kwargs)
        return replace(cand, stats={**cand.stats, **stats}) if len(calls) == 1 else cand

    monkeypatch.setattr(best_module, "run_variant", spy)
    return calls


def _free_instance(rng: np.random.Generator, n: int):
    """Unit time, no budget (eviction is free), tight KV."""
    reqs = [
        (int(rng.integers(1, 30)), int(rng.integers(1, 20)), float(rng.integers(0, 30))) for _ in range(n)
    ]
    return make_instance(reqs, max(i + o - 1 for i, o, _ in reqs) + int(rng.integers(0, 20)))


@pytest.mark.parametrize("make", [budget_instance, _free_instance])
def test_large_instances_replay_the_first_variant_only_where_it_stays_the_best(monkeypatch, make):
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
    # No knapsack configuration: the first variant, valued on its log, must come back replayed by the core.
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_CONFIGS", ())
    calls = _spy_first_run(monkeypatch)
    rng = np.random.default_rng(5)
    for _ in range(3):
        calls.clear()
        inst = make(rng, 20)
        first = best_incumbent(
            inst, policies=(), variants=best_module.variants_for(inst, instance_cost_model(inst))[:1]
        )
        assert calls[0]["replay_schedule"] is False
        assert first.trace is not None and first.value == objective_value(inst, first)
        both = best_incumbent(inst, policies=())
        assert both.trace is not None and both.value == objective_value(inst, both)
        assert both.value == min(both.stats["tried"].values())


def test_small_budget_instances_still_replay_the_first_variant(monkeypatch):
    calls = _spy_first_run(monkeypatch)
    best_incumbent(budget_instance(np.random.default_rng(6), 20), policies=())
    assert calls[0].get("replay_schedule", True) is True


def test_the_first_knapsack_configuration_runs_where_three_greedy_runs_do_not_fit(monkeypatch):
    """Priced out at three greedy runs, the first configuration still runs (and not the second in its place)."""
    configs = (KnapsackConfig(0.5, 0.2), KnapsackConfig(1.0, 0.1))
    monkeypatch.setattr(best_module, "KNAPSACK_CONFIGS", configs)
    _spy_first_run(monkeypatch, decide_s=1e6)  # the greedy looks slow: nothing priced from it fits
    inst = budget_instance(np.random.default_rng(7), 20)
    got = best_incumbent(inst, deadline=Deadline.after(600.0), policies=())
    first, second = (c.name(True) for c in configs)
    assert first in got.stats["tried"]
    assert got.trace is not None and got.value == objective_value(inst, got)
    # Where no replay fits any more, no configuration starts.
    late = best_incumbent(inst, deadline=Deadline.after(1e-9), policies=())
    assert not any(name.startswith("knapsack") for name in late.stats["tried"])
    assert first in late.stats["skipped"] and second in late.stats["skipped"]


def test_with_the_first_replay_deferred_the_first_configuration_needs_its_run_and_the_replay(monkeypatch):
    """A replay is due at the end whichever schedule wins (priced by replay_seconds, measured): the first
    configuration runs only where a low estimate of its own run (KNAPSACK_PER_RUN greedy runs) and that
    replay fit, and its deadline leaves the replay its time."""
    configs = (KnapsackConfig(0.5, 0.2), KnapsackConfig(1.0, 0.1))
    first = configs[0].name(True)
    inst = budget_instance(np.random.default_rng(8), 20)
    real_knapsack = best_module.knapsack
    for replay_s, runs in ((150.0, True), (250.0, False)):
        monkeypatch.undo()
        monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
        monkeypatch.setattr(best_module, "KNAPSACK_LARGE_CONFIGS", configs)
        monkeypatch.setattr(best_module, "replay_seconds", lambda *args, r=replay_s: r)
        left: list[float] = []

        def spy(*args, left=left, **kwargs):
            left.append(kwargs["deadline"].remaining())
            return real_knapsack(*args, **kwargs)

        monkeypatch.setattr(best_module, "knapsack", spy)
        # A greedy run priced at 200 s: the knapsack's 400 s and the replay fit the 600 s at 150 s, not at 250 s.
        _spy_first_run(monkeypatch, decide_s=200.0, build_s=0.0)
        got = best_incumbent(inst, deadline=Deadline.after(600.0), policies=())
        assert (first in got.stats["tried"]) is runs and (first in got.stats["skipped"]) is not runs
        assert got.trace is not None and got.value == objective_value(inst, got)
        if runs:
            assert 600.0 - replay_s - 5.0 < left[0] <= 600.0 - replay_s


def test_replay_seconds_scales_its_probe_by_the_entries(monkeypatch):
    """The replay of at most REPLAY_PROBE_ENTRIES first entries (a quarter of them at most) is timed and
    scaled to all of them, with REPLAY_MARGIN."""
    base_module = importlib.import_module("kvsched.csp.incumbents.base")
    probed: list[int] = []

    def per_entry(instance, entries, cost_model):
        probed.append(len(entries))
        return 1e-3 * len(entries)

    monkeypatch.setattr(base_module, "entries_seconds", per_entry)
    monkeypatch.setattr(base_module, "REPLAY_PROBE_ENTRIES", 5)
    inst = _free_instance(np.random.default_rng(9), 30)
    sched = best_incumbent(inst, policies=()).schedule
    n = len(sched.entries)
    assert n >= 20
    got = base_module.replay_seconds(inst, sched, instance_cost_model(inst))
    assert probed == [5] and got == pytest.approx(base_module.REPLAY_MARGIN * 1e-3 * n)
    assert base_module.replay_seconds(inst, replace(sched, entries=sched.entries[:8]), None) == pytest.approx(
        base_module.REPLAY_MARGIN * 1e-3 * 8
    )
    assert probed[-1] == 2  # a quarter of 8
    # Measured for real it is positive, and nothing for no entries.
    monkeypatch.undo()
    assert base_module.replay_seconds(inst, sched, instance_cost_model(inst)) > 0.0
    assert base_module.replay_seconds(inst, replace(sched, entries=()), instance_cost_model(inst)) == 0.0


def test_large_instances_run_their_best_configurations_again_at_fine_cells(monkeypatch):
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
    configs = (KnapsackConfig(0.5, 0.2), KnapsackConfig(1.0, 0.1), KnapsackConfig())
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_CONFIGS", configs)
    monkeypatch.setattr(best_module, "FINE_CELLS", 7)
    for seed in range(3):
        inst = _free_instance(np.random.default_rng(seed), 30)
        got = best_incumbent(inst, policies=())
        tried = got.stats["tried"]
        # The FINE_RUNS configurations that did best at CELLS (ties in run order), again at FINE_CELLS.
        ranked = sorted(configs, key=lambda c: tried[c.name(False)])[: best_module.FINE_RUNS]
        fine = sorted(name for name in tried if name.endswith("/cells=7"))
        assert fine == sorted(replace(c, cells=7).name(False) for c in ranked)
        assert got.value == min(tried.values())
        assert got.trace is not None and got.value == objective_value(inst, got)
    # Priced out, they are listed as skipped.
    monkeypatch.setattr(best_module, "FINE_COST", 1e12)
    got = best_incumbent(inst, deadline=Deadline.after(600.0), policies=())
    assert not any(name.endswith("/cells=7") for name in got.stats["tried"])
    assert sum(name.endswith("/cells=7") for name in got.stats["skipped"]) == best_module.FINE_RUNS


def test_with_the_first_replay_deferred_the_first_configuration_may_take_the_whole_solves_time(monkeypatch):
    """From KNAPSACK_WHOLE_MIN_REQUESTS requests on its schedule is the one the solve most likely keeps: priced
    against the whole solve's deadline (``first_deadline``), not the stage's share; the later configurations
    keep to the share."""
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
    monkeypatch.setattr(best_module, "KNAPSACK_WHOLE_MIN_REQUESTS", 1)
    configs = (KnapsackConfig(0.5, 0.2), KnapsackConfig(1.0, 0.1))
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_CONFIGS", configs)
    calls = _spy_first_run(monkeypatch, decide_s=100.0, build_s=0.0)  # a knapsack run is priced at 200 s
    monkeypatch.setattr(best_module, "replay_seconds", lambda *args: 200.0)  # and the replay due after it
    inst = _free_instance(np.random.default_rng(10), 20)
    first, second = (c.name(False) for c in configs)
    got = best_incumbent(
        inst, deadline=Deadline.after(150.0), policies=(), first_deadline=Deadline.after(600.0)
    )
    assert first in got.stats["tried"] and second in got.stats["skipped"]
    assert got.trace is not None and got.value == objective_value(inst, got)
    calls.clear()
    alone = best_incumbent(inst, deadline=Deadline.after(150.0), policies=())
    assert first in alone.stats["skipped"] and first not in alone.stats["tried"]
    # Below KNAPSACK_WHOLE_MIN_REQUESTS the stage's share holds it or it is skipped.
    monkeypatch.setattr(best_module, "KNAPSACK_WHOLE_MIN_REQUESTS", len(inst) + 1)
    calls.clear()
    small = best_incumbent(
        inst, deadline=Deadline.after(150.0), policies=(), first_deadline=Deadline.after(600.0)
    )
    assert first in small.stats["skipped"] and first not in small.stats["tried"]


def test_the_fine_runs_may_take_a_share_of_the_whole_solves_time(monkeypatch):
    """Priced out of the stage's share, they still run where FINE_SHARE of the whole solve holds them."""
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_CONFIGS", (KnapsackConfig(0.5, 0.2), KnapsackConfig()))
    monkeypatch.setattr(best_module, "FINE_CELLS", 7)
    monkeypatch.setattr(best_module, "FINE_COST", 1e7)  # a fine run priced at 1e7 times its coarse run's
    inst = _free_instance(np.random.default_rng(12), 30)
    stage = best_incumbent(inst, deadline=Deadline.after(600.0), policies=())
    assert not any(name.endswith("/cells=7") for name in stage.stats["tried"])
    whole = best_incumbent(
        inst, deadline=Deadline.after(600.0), policies=(), first_deadline=Deadline.after(1e9)
    )
    assert sum(name.endswith("/cells=7") for name in whole.stats["tried"]) == best_module.FINE_RUNS
    assert whole.trace is not None and whole.value == objective_value(inst, whole)


def test_without_a_budget_the_knapsack_runs_from_its_own_threshold(monkeypatch):
    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 10**6)
    inst = _free_instance(np.random.default_rng(13), 20)
    monkeypatch.setattr(best_module, "KNAPSACK_FREE_MIN_REQUESTS", 21)
    below = best_incumbent(inst, policies=())
    assert not any(name.startswith("knapsack") for name in below.stats["tried"])
    monkeypatch.setattr(best_module, "KNAPSACK_FREE_MIN_REQUESTS", 20)
    at = best_incumbent(inst, policies=())
    assert any(name.startswith("knapsack") for name in at.stats["tried"])
    assert at.trace is not None and at.value == objective_value(inst, at) == min(at.stats["tried"].values())
    # A budget keeps KNAPSACK_LARGE_MIN_REQUESTS for its large configurations.
    budgeted = best_incumbent(budget_instance(np.random.default_rng(13), 20), policies=())
    assert not any(name.endswith("/cells=8192") for name in budgeted.stats["tried"])


@pytest.mark.parametrize("make", [budget_instance, _free_instance])
def test_only_the_first_run_and_the_best_are_built(monkeypatch, make):
    """The other candidates are valued on their logs and never built (Unbuilt): building cost as much as
    deciding. The result is built, replayed and the best of what was tried."""
    from kvsched.csp.incumbents.log import BatchLog

    monkeypatch.setattr(best_module, "KNAPSACK_LARGE_MIN_REQUESTS", 1)
    monkeypatch.setattr(best_module, "FINE_CELLS", 7)
    built: list[int] = []
    real = BatchLog.to_schedule

    def counted(self, meta=None):
        built.append(self.num_batches)
        return real(self, meta)

    monkeypatch.setattr(BatchLog, "to_schedule", counted)
    for seed in range(3):
        built.clear()
        inst = make(np.random.default_rng(20 + seed), 30)
        got = best_incumbent(inst, policies=())
        tried = got.stats["tried"]
        assert len(tried) >= 4
        assert len(built) == (1 if got.value == tried[next(iter(tried))] else 2)
        assert got.trace is not None and got.value == objective_value(inst, got) == min(tried.values())
