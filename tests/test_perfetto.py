"""The Chrome/Perfetto trace export: tracks, slices and the KV counter agree with the replayed schedule."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise

import pytest

from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.schedule.metrics import batch_metrics, request_metrics
from kvsched.schedule.perfetto import ENGINE_PID, REQUESTS_PID, US_PER_UNIT, chrome_trace, write_chrome_trace
from kvsched.schedule.validate import replay
from tests.test_examples import EXAMPLES

FIG15 = load_instance(EXAMPLES / "figure15.json")
SHAREGPT = load_instance(EXAMPLES / "sharegpt-small.json")


def _slices(doc, pid):
    out = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["pid"] == pid and e["ph"] in ("X", "i"):
            out[e.get("tid")].append(e)
    return out


def test_figure15_vllm_tracks():
    sched = simulate(FIG15, make_policy("vllm")).schedule
    doc = chrome_trace(FIG15, sched)
    assert doc["otherData"]["time_unit"] == "slot"
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert [names[k + 1] for k in range(4)] == [r.id for r in FIG15.requests]
    req = _slices(doc, REQUESTS_PID)
    us = US_PER_UNIT["slot"]
    # r1 (track 2): prefill [0, 1), evicted [1, 4), refill [4, 5), decodes [5, 7) (seed 003 Fig. 15).
    kinds = [(e["name"], e["ts"] / us, e.get("dur", 0) / us) for e in req[2]]
    assert kinds == [
        ("prefill", 0, 1),
        ("eviction", 1, 0),
        ("evicted", 1, 3),
        ("refill", 4, 1),
        ("decode", 5, 2),
    ]
    # r2 waits (queued) from its arrival until its prefill at 7.
    assert (req[3][0]["name"], req[3][0]["args"]["reason"], req[3][0]["dur"] / us) == ("waiting", "queued", 7)


@pytest.mark.parametrize(
    ("instance", "policy"), [(FIG15, "sarathi"), (SHAREGPT, "sarathi"), (SHAREGPT, "vllm")]
)
def test_slices_cover_each_request_from_arrival_to_completion(instance, policy):
    sched = simulate(instance, make_policy(policy)).schedule
    trace = replay(instance, sched)
    frame = request_metrics(trace)
    doc = chrome_trace(instance, sched)
    us = doc["otherData"]["trace_us_per_time_unit"]
    req = _slices(doc, REQUESTS_PID)
    for k, r in enumerate(instance.requests):
        spans = sorted((e for e in req[k + 1] if e["ph"] == "X"), key=lambda e: e["ts"])
        # Back to back, from arrival to completion, no overlap.
        assert spans[0]["ts"] / us == pytest.approx(r.arrival, abs=1e-9)
        for a, b in pairwise(spans):
            assert (a["ts"] + a["dur"]) == pytest.approx(b["ts"], abs=1e-6)
        end = spans[-1]["ts"] + spans[-1]["dur"]
        assert end / us == pytest.approx(frame.loc[r.id, "completion"], abs=1e-9)
        # Tokens: prompt once per prefill/refill pass, one per decode.
        tokens = defaultdict(int)
        for e in spans:
            tokens[e["name"]] += e["args"].get("tokens", 0)
        assert tokens["prefill"] + tokens["refill"] + tokens["decode"] == frame.loc[r.id, "processed"]
        evictions = sum(e["name"] == "eviction" for e in req[k + 1])
        assert evictions == frame.loc[r.id, "evictions"]


def test_kv_counter_matches_the_batch_metrics():
    sched = simulate(SHAREGPT, make_policy("sarathi")).schedule
    assert sched.has_runs  # the runs are spelled out on the counter
    doc = chrome_trace(SHAREGPT, sched)
    us = doc["otherData"]["trace_us_per_time_unit"]
    bm = batch_metrics(replay(SHAREGPT, sched))
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    during = {}
    for e in counters:  # the last value at a timestamp wins, as in the viewer; "during" is set at the start
        during.setdefault(round(e["ts"] / us, 9), []).append(e["args"]["held"])
    for start, kv in zip(bm["start"], bm["kv_tokens"], strict=True):
        assert during[round(start, 9)][-1] == kv
    assert counters[-1]["args"]["held"] == 0  # everything released at the end
    assert all(e["args"]["capacity"] == SHAREGPT.limits.kv_capacity for e in counters)
    batches = [e for e in doc["traceEvents"] if e["pid"] == ENGINE_PID and e["ph"] == "X"]
    assert sum(e["args"].get("batches", 1) for e in batches) == len(sched)


def test_written_file_is_json(tmp_path):
    sched = simulate(FIG15, make_policy("vllm")).schedule
    path = write_chrome_trace(FIG15, sched, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    assert doc["traceEvents"] and doc["displayTimeUnit"] == "ms"


def test_measured_seconds_override_the_unit():
    from kvsched.schedule.retime import retime

    sched = simulate(FIG15, make_policy("vllm")).schedule
    measured = retime(FIG15, sched, [0.5] * len(sched))
    doc = chrome_trace(FIG15, measured, unit="s")
    assert doc["otherData"]["time_unit"] == "s"
    batches = [e for e in doc["traceEvents"] if e["pid"] == ENGINE_PID and e["ph"] == "X"]
    assert [e["dur"] for e in batches] == [0.5e6] * len(sched)
    with pytest.raises(InputError, match="unit"):
        chrome_trace(FIG15, sched, unit="ms")


def test_cli_trace_flags(tmp_path):
    from kvsched.cli import main

    inst = str(EXAMPLES / "figure15.json")
    sim, solved = tmp_path / "sim.trace.json", tmp_path / "solve.trace.json"
    assert main(["simulate", inst, "-p", "vllm", "--trace", str(sim)]) == 0
    assert main(["solve", inst, "--time-limit", "20", "--trace", str(solved)]) == 0
    for path in (sim, solved):
        doc = json.loads(path.read_text())
        assert {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"} >= {"r0", "r3"}
    # Checked before the work: a trace never overwrites an input.
    assert main(["simulate", inst, "-p", "vllm", "--trace", inst]) == 2
    assert main(["replay", inst, str(EXAMPLES / "figure15-vllm.schedule.json"), "--trace", inst]) == 2


def test_write_chrome_trace_path_faults_are_one_input_error(tmp_path):
    import os

    sched = simulate(FIG15, make_policy("vllm")).schedule
    out = write_chrome_trace(FIG15, sched, tmp_path / "new" / "t.json")  # the folder is created
    assert json.loads(out.read_text())["traceEvents"]
    with pytest.raises(InputError, match=r"^instance: expected an Instance"):
        write_chrome_trace(None, sched, None)  # the arguments in their order: the instance first
    with pytest.raises(InputError, match=r"^path: expected a file path .* got NoneType$"):
        write_chrome_trace(FIG15, sched, None)
    with pytest.raises(InputError, match=r"^write_chrome_trace: .* is a folder, not a file$"):
        write_chrome_trace(FIG15, sched, tmp_path)
    if os.path.isdir("/proc/self"):
        with pytest.raises(InputError, match=r"^write_chrome_trace: /proc/t\.json cannot be written \(.+\)$"):
            write_chrome_trace(FIG15, sched, "/proc/t.json")


def test_a_schedule_read_for_another_instance_is_not_traced(tmp_path):
    # The trace was labelled with the instance given and held the other instance's batches.
    from kvsched.instances.model import Instance, Request
    from kvsched.schedule.io import load_schedule, save_schedule

    inst = load_instance(EXAMPLES / "figure15.json")
    other = Instance(
        tuple(Request(r.id, r.arrival + 1, r.prompt, r.output) for r in inst.requests), inst.limits
    )
    save_schedule(simulate(inst, make_policy("vllm")).schedule, inst, tmp_path / "s.json")
    read = load_schedule(tmp_path / "s.json", inst)
    with pytest.raises(InputError, match=r"^schedule: it was read for another instance"):
        write_chrome_trace(other, read, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()
    assert write_chrome_trace(inst, read, tmp_path / "t.json").is_file()
