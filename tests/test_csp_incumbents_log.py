"""The greedy kernels' log buffers: grown only when full, their entries kept."""

import importlib

import numpy as np

from kvsched.csp.incumbents.greedy import decide as greedy_decide
from kvsched.csp.incumbents.log import BatchLog, sealed, with_room
from kvsched.schedule.ir import Phase, Run

greedy_module = importlib.import_module("kvsched.csp.incumbents.greedy")


def test_a_buffer_with_room_is_kept_and_a_full_one_at_least_doubles_with_its_entries():
    buf = np.arange(12, dtype=np.int64).reshape(2, 6)
    assert with_room(buf, 6) is buf
    grown = with_room(buf, 7)
    assert grown.shape == (2, 12) and grown.dtype == buf.dtype
    assert np.array_equal(grown[:, :6], buf) and not grown[:, 6:].any()
    assert with_room(np.zeros(4), 100).shape == (100,)  # more than double where more is needed


def _log(requests):
    n = len(requests)
    return BatchLog(
        np.arange(n, dtype=float), np.ones(n), np.arange(n + 1), np.zeros(n + 1, dtype=np.int64),
        requests, np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int8), np.zeros(0, dtype=np.int64),
    )  # fmt: skip


def test_a_schedule_shares_a_sealed_log_and_copies_one_that_may_still_be_written():
    buffer = np.array([0, 1, 0, 7], dtype=np.int64)
    view = sealed(buffer[:3])
    assert not view.flags.writeable and np.shares_memory(view, buffer)
    shared = _log(view).to_schedule()
    assert np.shares_memory(shared.batches[1].requests, buffer)
    copied = _log(buffer[:3]).to_schedule()  # writeable: the schedule must not see later writes
    buffer[1] = 2
    assert copied.batches[1].requests.tolist() == [1]
    assert not copied.batches[1].requests.flags.writeable


def test_the_greedys_final_log_is_sealed_and_a_probe_taken_mid_run_is_a_copy(monkeypatch):
    """The probe a run takes of its first batches (to price finishing against ``stop``) copies them out of the
    kernel's buffers, which the kernel goes on writing; the final log is a sealed view of them."""
    from kvsched.stop import Deadline
    from tests.incumbent_instances import make_instance

    rng = np.random.default_rng(3)
    reqs = [(int(rng.integers(1, 9)), int(rng.integers(1, 9)), float(rng.integers(0, 5))) for _ in range(40)]
    inst = make_instance(reqs, 16)
    log = greedy_decide(inst, "remaining-area")
    assert not any(a.flags.writeable for a in (log.requests, log.tokens, log.context, log.phases))

    probes: list[tuple[BatchLog, list]] = []
    real = greedy_module._finish_probe

    def captured(instance, cost_model, probe):
        probes.append((probe, probe.requests.tolist()))
        return real(instance, cost_model, probe)

    monkeypatch.setattr(greedy_module, "_finish_probe", captured)
    monkeypatch.setattr(greedy_module, "PROBE_BATCHES", 3)
    monkeypatch.setattr(greedy_module, "CHUNK_PY", 4)  # the interpreted kernel hands back every 4 batches
    # A stop already past: the probe is taken after the first chunk, and the run is then cut short.
    whole = greedy_decide(inst, "remaining-area", jit=False, stop=Deadline.after(1e-9))
    ((probe, seen),) = probes
    assert probe.num_batches == 3 and probe.requests.flags.writeable  # the first 3 of the 4 decided
    assert probe.requests.tolist() == seen  # the kernel wrote on after the probe, not into it
    assert not np.shares_memory(probe.requests, whole.requests)
    assert seen == whole.requests[: probe.item_ptr[-1]].tolist()


def _folded_reference(log: BatchLog) -> list[tuple[int, int]]:
    """The batches each entry covers, batch by batch: a batch extends the run before it where both are
    decode-only and eviction-free, with the same requests in the same order, back to back."""
    spans: list[tuple[int, int]] = []
    for b in range(log.num_batches):
        lo, hi = log.item_ptr[b], log.item_ptr[b + 1]
        plain = not (log.phases[lo:hi] != Phase.DECODE).any() and log.ev_ptr[b] == log.ev_ptr[b + 1]
        if spans and plain and spans[-1][2]:
            p = spans[-1][1] - 1
            plo, phi = log.item_ptr[p], log.item_ptr[p + 1]
            if (
                np.array_equal(log.requests[lo:hi], log.requests[plo:phi])
                and log.start[b] == log.start[p] + log.duration[p]
            ):
                spans[-1] = (spans[-1][0], b + 1, True)
                continue
        spans.append((b, b + 1, plain))
    return [(a, b) for a, b, _ in spans]


def test_decode_repeats_fold_into_runs_exactly_where_a_batch_by_batch_check_folds_them(monkeypatch):
    from kvsched.csp.incumbents import log as log_module

    rng = np.random.default_rng(11)
    for trial in range(40):
        # Few requests and short batches, so that repeats, reorderings, gaps, chunks and evictions all occur.
        nb = int(rng.integers(1, 40))
        sizes = rng.integers(0, 4, nb)
        ptr = np.concatenate(([0], np.cumsum(sizes)))
        base = rng.integers(0, 3, nb + 1)
        requests = np.concatenate([(np.arange(s) + base[b]) % 4 for b, s in enumerate(sizes)]).astype(
            np.int64
        )
        requests[rng.random(requests.size) < 0.05] = 9  # a different request now and then
        phases = np.where(rng.random(requests.size) < 0.1, Phase.PREFILL, Phase.DECODE).astype(np.int8)
        evictions = (rng.random(nb) < 0.1).astype(np.int64)
        duration = np.where(rng.random(nb) < 0.1, 2.0, 1.0)
        start = np.concatenate(([0.0], np.cumsum(duration)[:-1])) + np.where(rng.random(nb) < 0.1, 0.5, 0.0)
        log = BatchLog(
            start, duration, ptr, np.concatenate(([0], np.cumsum(evictions))), requests,
            np.ones(requests.size, dtype=np.int64), np.zeros(requests.size, dtype=np.int64), phases,
            np.zeros(int(evictions.sum()), dtype=np.int64),
        )  # fmt: skip
        monkeypatch.setattr(log_module, "FOLD_CHUNK", int(rng.integers(1, 8)))  # chunks of a few items
        entries = log.to_schedule().entries
        spans = _folded_reference(log)
        assert len(entries) == len(spans), trial
        for entry, (b, e) in zip(entries, spans, strict=True):
            assert isinstance(entry, Run) == (e - b > 1)
            assert entry.start == log.start[b]
            assert entry.requests.tolist() == log.requests[log.item_ptr[b] : log.item_ptr[b + 1]].tolist()
            if isinstance(entry, Run):
                assert entry.durations.tolist() == log.duration[b:e].tolist()


def test_an_unbuilt_run_is_valued_on_its_log_and_builds_the_same_schedule_when_asked():
    from kvsched.csp.incumbents import greedy
    from kvsched.csp.incumbents.base import Unbuilt, confirmed
    from kvsched.csp.incumbents.knapsack import knapsack
    from kvsched.schedule.validate import instance_cost_model
    from tests.incumbent_instances import budget_instance, make_instance

    rng = np.random.default_rng(4)
    reqs = [
        (int(rng.integers(1, 30)), int(rng.integers(1, 20)), float(rng.integers(0, 30))) for _ in range(25)
    ]
    for inst, make in (
        (make_instance(reqs, 60), lambda i, **kw: greedy(i, "remaining-area", fill=True, **kw)),
        (budget_instance(rng, 25), lambda i, **kw: knapsack(i, **kw)),
    ):
        whole = make(inst)  # built and replayed
        cand = make(inst, replay_schedule=False, build=False)
        assert isinstance(cand, Unbuilt) and cand.name == whole.name and cand.value == whole.value
        kept = confirmed(inst, cand, instance_cost_model(inst))
        assert kept.trace is not None and kept.value == whole.value
        assert kept.schedule.meta == whole.schedule.meta
        assert len(kept.schedule.entries) == len(whole.schedule.entries)
        assert all(
            a.start == b.start for a, b in zip(kept.schedule.entries, whole.schedule.entries, strict=True)
        )


def test_the_local_search_replays_only_the_schedules_it_ends_with(monkeypatch):
    """Candidates move the search on their log values; a search builds and replays only its winner (one
    per line of search), and what it returns is the core's replay of the best."""
    from kvsched.csp.incumbents import greedy
    from kvsched.csp.incumbents.lns import improve
    from kvsched.stop import Deadline
    from tests.incumbent_instances import make_instance, objective_value

    built: list[int] = []
    real = BatchLog.to_schedule

    def counted(self, meta=None):
        built.append(self.num_batches)
        return real(self, meta)

    rng = np.random.default_rng(8)
    for seed in range(3):
        reqs = [
            (int(rng.integers(1, 30)), int(rng.integers(1, 20)), float(rng.integers(0, 30)))
            for _ in range(30)
        ]
        inst = make_instance(reqs, 60)
        start = greedy(inst, "remaining-area", fill=True)
        monkeypatch.setattr(BatchLog, "to_schedule", counted)
        built.clear()
        got = improve(inst, start, Deadline.after(30.0), seed=seed, kick_patience=0)
        monkeypatch.setattr(BatchLog, "to_schedule", real)
        assert got.stats["evaluations"] > 10 * len(built)
        assert len(built) <= 2  # the scales' search and the static orders', each its winner at most
        assert got.trace is not None and got.value == objective_value(inst, got) <= start.value


def test_a_winner_whose_replay_does_not_beat_the_start_is_not_returned():
    # Should a log's value ever disagree with the replay, the search keeps the schedule it started from.
    from kvsched.csp.incumbents import greedy
    from kvsched.csp.incumbents.base import Unbuilt
    from kvsched.csp.incumbents.lns import _settled
    from kvsched.schedule.validate import instance_cost_model
    from tests.incumbent_instances import make_instance

    inst = make_instance([(5, 4, 0.0), (3, 6, 1.0), (8, 2, 2.0)], 12)
    start = greedy(inst, "remaining-area")
    worse = greedy(inst, "fcfs", preempt=False, replay_schedule=False)
    model = instance_cost_model(inst)
    assert worse.value >= start.value
    liar = Unbuilt("lns", start.value - 5.0, start.objective, {}, lambda: worse)
    assert _settled(inst, liar, start, model) is start
    honest = Unbuilt("lns", start.value - 5.0, start.objective, {}, lambda: start)
    assert _settled(inst, start, start, model) is start
    assert _settled(inst, honest, start, model) is start  # the same schedule: not strictly better
