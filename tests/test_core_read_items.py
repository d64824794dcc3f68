"""The core's read of a policy's running requests, taken by make_batch for a batch of that very array."""

from __future__ import annotations

import numpy as np

from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Phase
from kvsched.schedule.validate import instance_cost_model


def _state(n: int = 100) -> EngineState:
    """``n`` requests (prompt 2, output 3) at t = 0, unit time."""
    inst = Instance(
        tuple(Request(f"r{i}", 0, 2, 3) for i in range(n)), Limits(kv_capacity=10 * n), TimeModel("unit")
    )
    return EngineState(inst, instance_cost_model(inst))


def _frozen(values) -> np.ndarray:
    out = np.array(values, dtype=np.int64)
    out.setflags(write=False)
    return out


def test_a_batch_of_the_read_array_takes_the_reads_and_equals_a_fresh_one():
    """Half the requests decode, the others start: the batch made of the read array shares its
    positions and the core's reads, and equals the batch made of a copy (phases, duration, record)."""
    state, other = _state(), _state()
    first = np.arange(50)
    for s in (state, other):
        s.step(s.make_batch(0.0, first, np.full(50, 2)))  # 50 prompts done: 50 decodes
    run = _frozen(np.arange(80))
    tok = np.where(run < 50, 1, 2)
    kv, is_decode, num_decodes = state.read_items(run)
    assert not (kv.flags.writeable or is_decode.flags.writeable)
    assert num_decodes == 50 and np.array_equal(kv, state.kv[run])
    shared = state.make_batch(state.clock, run, tok)
    fresh = other.make_batch(other.clock, run.copy(), tok)
    assert shared.requests is run and state._made.kv is kv and state._made.is_decode is is_decode
    assert np.array_equal(shared.phases, fresh.phases) and shared.duration == fresh.duration
    assert state._quick(shared) is not None
    a, b = state.step(shared), other.step(fresh)
    assert (a.num_decodes, a.num_tokens, a.kv_tokens, a.num_running) == (
        b.num_decodes,
        b.num_tokens,
        b.kv_tokens,
        b.num_running,
    )
    assert np.array_equal(state.kv, other.kv) and np.array_equal(state.generated, other.generated)


def test_a_stale_a_writeable_or_an_evicting_read_is_not_taken():
    """After an apply the read is stale (the phases moved on); a writeable array is not remembered (its
    caller may change it); a batch with evictions derives its own phases."""
    state = _state()
    run = _frozen(np.arange(10))
    state.read_items(run)
    state.step(state.make_batch(0.0, run, np.full(10, 2)))  # prompts done: the next items are decodes
    stale = state.make_batch(state.clock, run, np.ones(10, dtype=np.int64))
    assert np.array_equal(stale.phases, state._phase[run]) and state._made.num_decodes == 10

    writeable = np.arange(10, dtype=np.int64)
    state.read_items(writeable)
    assert state._read is None or state._read[0] is not writeable
    batch = state.make_batch(state.clock, writeable, np.ones(10, dtype=np.int64))
    assert batch.requests is not writeable

    run = _frozen(np.arange(10))
    assert state.read_items(run)[2] == 10
    evicting = state.make_batch(state.clock, run, np.ones(10, dtype=np.int64), evicted=[0])
    assert state._made.num_decodes == 9 and evicting.phases[0] == Phase.REFILL


def test_infermax_takes_the_reads_and_builds_the_same_schedule():
    """Sarathi on 300 requests at t = 0: some batches are the policy's running array itself, and the
    schedule is the one built when the core never keeps a read."""
    rng = np.random.default_rng(3)
    reqs = tuple(
        Request(f"r{i}", 0, int(rng.integers(20, 400)), int(rng.integers(5, 200))) for i in range(300)
    )
    inst = Instance(reqs, Limits(kv_capacity=20_000, max_batch_tokens=512), TimeModel("unit"))
    taken = []
    real_make = EngineState.make_batch

    def counting(self, start, requests, tokens, evicted=()):
        read = self._read
        taken.append(read is not None and requests is read[0] and read[1] == self.num_batches)
        return real_make(self, start, requests, tokens, evicted)

    real_read = EngineState.read_items

    def forgetful(self, req):
        out = real_read(self, req)
        self._read = None
        return out

    EngineState.make_batch = counting
    try:
        shared = simulate(inst, make_policy("sarathi"))
        EngineState.read_items = forgetful
        plain = simulate(inst, make_policy("sarathi"))
    finally:
        EngineState.make_batch = real_make
        EngineState.read_items = real_read
    assert sum(taken) > 10
    assert len(shared.schedule.entries) == len(plain.schedule.entries)
    for a, b in zip(shared.schedule.entries, plain.schedule.entries, strict=True):
        assert type(a) is type(b) and a.start == b.start and a.duration == b.duration
        for x, y in zip(a.items(), b.items(), strict=True):
            assert np.array_equal(x, y)
