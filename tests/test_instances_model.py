"""Requests built a column at a time (:func:`kvsched.instances.model.new_requests`) are the dataclass's.

A CSV trace's requests are made through the slots' descriptors, not the frozen
dataclass's ``__init__`` one object at a time; they must be the same objects
field for field (the defaults included), equal and hashing alike, and as
frozen.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvsched.errors import InfeasibleInstanceError
from kvsched.instances.io import load_csv_trace
from kvsched.instances.model import Instance, Limits, Request, TimeModel, new_requests


def test_new_requests_are_the_dataclass_s():
    ids, arrivals, prompts, outputs = ["a", "b", "r2"], [0.0, 1.5, 2.25], [3, 1, 700], [1, 9, 2]
    got = new_requests(ids, arrivals, prompts, outputs)
    want = [Request(*row) for row in zip(ids, arrivals, prompts, outputs, strict=True)]
    assert got == want and list(map(hash, got)) == list(map(hash, want))
    for g, w in zip(got, want, strict=True):
        assert type(g) is Request
        for f in dataclasses.fields(Request):
            assert getattr(g, f.name) == getattr(w, f.name), f.name
            assert type(getattr(g, f.name)) is type(getattr(w, f.name)), f.name
        with pytest.raises(dataclasses.FrozenInstanceError):
            g.prompt = 5  # type: ignore[misc]
    assert new_requests([], [], [], []) == []


def test_a_csv_trace_s_requests(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,3\n2,7,1\n", encoding="utf-8")
    inst = load_csv_trace(path, Limits(kv_capacity=64), TimeModel())
    assert inst.requests == (Request("r0", 0.5, 10, 3), Request("r1", 2.0, 7, 1))
    assert [type(r.prompt) for r in inst.requests] == [int, int]


def test_a_feasible_instance_is_checked_once(monkeypatch):
    # The greedies check their instance on every run; a frozen instance found feasible is not checked again,
    # and one built from it with other limits (or another instance) is.
    inst = Instance((Request("a", 0.0, 2, 2), Request("b", 0.0, 3, 4)), Limits(kv_capacity=8))
    calls = []
    real = Instance.check_requests
    monkeypatch.setattr(Instance, "check_requests", lambda self: calls.append(self) or real(self))
    inst.check_feasible()
    inst.check_feasible()
    inst.check_feasible(requests=False)
    assert calls == [inst]
    smaller = dataclasses.replace(inst, limits=Limits(kv_capacity=5))
    with pytest.raises(InfeasibleInstanceError, match="request 'b': needs 6 KV tokens"):
        smaller.check_feasible()
    with pytest.raises(InfeasibleInstanceError):
        smaller.check_feasible()  # a failed check is not remembered
    # Checked without its requests, an instance is not remembered: the full check still runs.
    other = Instance((Request("c", 0.0, 1, 1),), Limits(kv_capacity=8))
    other.check_feasible(requests=False)
    other.check_feasible()
    assert calls == [inst, smaller, smaller, other]
