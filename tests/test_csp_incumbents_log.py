"""The greedy kernels' log buffers: grown only when full, their entries kept."""

import importlib

import numpy as np

from kvsched.csp.incumbents.greedy import decide as greedy_decide
from kvsched.csp.incumbents.log import BatchLog, sealed, with_room

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


def test_the_greedys_final_log_is_sealed_and_a_probe_taken_mid_run_is_a_copy():
    from tests.incumbent_instances import make_instance

    rng = np.random.default_rng(3)
    reqs = [(int(rng.integers(1, 9)), int(rng.integers(1, 9)), float(rng.integers(0, 5))) for _ in range(12)]
    inst = make_instance(reqs, 16)
    log = greedy_decide(inst, "remaining-area")
    assert not any(a.flags.writeable for a in (log.requests, log.tokens, log.context, log.phases))
    probe = greedy_module._log(
        *(np.array(x) for x in ([log.start, log.duration], [log.item_ptr, log.ev_ptr])),
        np.array([log.requests, log.tokens, log.context, log.phases.astype(np.int64)]),
        log.evicted.copy(),
        np.array([0, 0, 0, log.num_batches, log.requests.size, log.evicted.size, 12, 0, 0]),
        12,
        upto=1,
    )
    assert probe.requests.flags.writeable and probe.num_batches == 1
