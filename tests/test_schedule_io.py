"""Schedule files: kvsched JSON and InferMax replay format round trips."""

import json

import pytest

from kvsched.costmodel import InfermaxLinear, UnitCost
from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState, Rule
from kvsched.schedule.io import (
    from_infermax,
    infermax_document,
    load_schedule,
    save_schedule,
    schedule_from_dict,
    schedule_to_dict,
)
from kvsched.schedule.ir import Phase, Schedule
from kvsched.schedule.validate import validate

UNIT = TimeModel("unit")


def evicting_instance(time_model: TimeModel = UNIT) -> Instance:
    # Seed 003 Figure 1 flavour: three requests, KV cache of 8.
    reqs = (Request("R1", 0, 4, 3), Request("R2", 0, 2, 2), Request("R3", 0, 3, 2))
    return Instance(reqs, Limits(kv_capacity=8), time_model, "fig1")


def evicting_schedule(inst, cost):
    st = EngineState(inst, cost)
    batches = []
    plan = [
        ([0, 1], [4, 2], []),  # 6 KV; R1, R2 generate token 1
        ([0, 2], [1, 2], [1]),  # evict R2: R1 5 + R3 2 = 7 KV
        ([0], [1], []),  # R1 completes, releasing 6
        ([2, 1], [1, 3], []),  # R3 finishes its prompt; R2 refills I+G = 3 and completes: 6 KV
        ([2], [1], []),  # R3 decodes and completes
    ]
    t = 0.0
    for req, tok, ev in plan:
        b = st.make_batch(t, req, tok, ev)
        st.step(b)
        batches.append(b)
        t = b.end
    return Schedule(tuple(batches), {"policy": "hand"})


@pytest.mark.parametrize("cost", [UnitCost(), InfermaxLinear()])
def test_json_round_trip_is_exact_and_valid(tmp_path, cost):
    tm = TimeModel(cost.name)
    inst = evicting_instance(tm)
    sched = evicting_schedule(inst, cost)
    assert [Phase(int(p)) for p in sched.batches[3].phases] == [Phase.PREFILL, Phase.REFILL]
    path = tmp_path / "s.json"
    save_schedule(sched, inst, path)
    back = load_schedule(path, inst)
    assert back.same_as(sched, tol=0.0)
    assert back.meta == {"policy": "hand"}
    assert validate(inst, back).ok


def test_infermax_format_round_trip():
    inst = evicting_instance()
    sched = evicting_schedule(inst, UnitCost())
    doc = json.loads(json.dumps(infermax_document(sched, inst)))
    assert doc["requests"] == [[4, 3], [2, 2], [3, 2]]
    assert doc["evicted"][1] == [1] and doc["p"][3] == [2, 1] and doc["c"][0] == {"0": 4, "1": 2}
    back = from_infermax(doc, inst, UnitCost())
    assert back.same_as(sched)
    assert validate(inst, back).ok


def test_infermax_import_of_an_illegal_schedule_is_left_to_the_validator():
    inst = evicting_instance()
    doc = {
        "c": [{"0": 4, "1": 2, "2": 3}],
        "p": [[0, 1, 2]],
        "evicted": [[]],
        "requests": [[4, 3], [2, 2], [3, 2]],
    }
    sched = from_infermax(doc, inst, UnitCost())
    rules = {v.rule for v in validate(inst, sched).violations}
    assert Rule.KV_CAPACITY in rules and Rule.INCOMPLETE in rules


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"c": [{"0": 4}], "p": [[1]], "evicted": [[]], "requests": [[4, 3], [2, 2], [3, 2]]},
            r"p\.0: prefill set",
        ),
        (
            {"c": [{"7": 4}], "p": [[7]], "evicted": [[]], "requests": [[4, 3], [2, 2], [3, 2]]},
            "out of range",
        ),
        ({"c": [], "p": [], "evicted": [], "requests": [[4, 3]]}, "1 requests, but the instance has 3"),
        ({"c": [], "requests": [[4, 3], [2, 9], [3, 2]]}, r"requests\.1: \[2, 9\] differs"),
        ({"p": []}, "c: required field is missing"),
    ],
)
def test_bad_infermax_documents(doc, message):
    with pytest.raises(InputError, match=message):
        from_infermax(doc, evicting_instance(), UnitCost())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["batches"][0]["items"][0].__setitem__(0, "ghost"),
            r"batches\.0\.items\.0: unknown request 'ghost'",
        ),
        (
            lambda d: d["batches"][1]["evicted"].append("nobody"),
            r"batches\.1\.evicted\.1: unknown request 'nobody'",
        ),
        (lambda d: d["batches"][0]["items"][0].__setitem__(2, "think"), r"batches\.0\.items\.0\.2"),
        (lambda d: d["batches"][0].update(duration=-1), r"batches\.0\.duration"),
        # Text and true/false are not numbers ("1" was read as 1.0).
        (lambda d: d["batches"][0].update(duration="1"), r"batches\.0\.duration"),
        (lambda d: d["batches"][0].update(start=True), r"batches\.0\.start"),
        (lambda d: d["batches"][0].update(colour=1), r"batches\.0\.colour: unknown field"),
        (lambda d: d.update(schema_version=2), "schema_version: 2 is not supported"),
    ],
)
def test_bad_schedule_documents(mutate, message):
    inst = evicting_instance()
    d = schedule_to_dict(evicting_schedule(inst, UnitCost()), inst)
    mutate(d)
    with pytest.raises(InputError, match=message):
        schedule_from_dict(d, inst)


def test_a_file_that_is_no_npz_archive_is_not_taken_for_a_pickle(tmp_path):
    path = tmp_path / "s.npz"
    path.write_text("garbage")
    with pytest.raises(InputError, match=r"s.npz: not a readable .npz schedule \(not a zip archive\)$"):
        load_schedule(path, evicting_instance())


def test_writers_refuse_a_schedule_of_another_instance_with_one_error(tmp_path):
    # The writers that do not replay met such a schedule as an IndexError from deep inside.
    from kvsched.heuristics import make_policy, simulate
    from kvsched.instances.generators import generate
    from kvsched.instances.io import load_instance
    from kvsched.schedule.perfetto import chrome_trace
    from kvsched.schedule.retime import retime
    from tests.test_examples import EXAMPLES

    inst = load_instance(EXAMPLES / "figure15.json")
    sched = simulate(inst, make_policy("vllm")).schedule
    one = generate("infermax-grid", n=1, prompt=4, output=4)
    for write in (
        lambda: save_schedule(sched, one, tmp_path / "s.json"),
        lambda: chrome_trace(one, sched),
        lambda: retime(one, sched, UnitCost()),
    ):
        with pytest.raises(InputError, match="request position 3, but the instance has 1 request"):
            write()
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_schedule_path_faults_are_one_input_error(tmp_path, suffix):
    inst = evicting_instance()
    sched = evicting_schedule(inst, UnitCost())
    out = tmp_path / "new" / f"s{suffix}"
    save_schedule(sched, inst, out)  # a missing folder is created (as save_figure and the commands do)
    assert load_schedule(out, inst).same_as(sched)
    for path in (None, 5):
        with pytest.raises(InputError, match=r"^path: expected a file path"):
            save_schedule(sched, inst, path)
    (tmp_path / f"d{suffix}").mkdir()
    with pytest.raises(InputError, match=r"^save_schedule: .* is a folder, not a file$"):
        save_schedule(sched, inst, tmp_path / f"d{suffix}")
    with pytest.raises(InputError, match=r"^save_schedule: .* is a folder, not a file$"):
        save_schedule(sched, inst, tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match=r"^save_schedule: cannot create the folder .*f \("):
        save_schedule(sched, inst, tmp_path / "f" / f"s{suffix}")


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux /proc")
def test_save_schedule_names_a_path_it_cannot_write():
    inst = evicting_instance()
    sched = evicting_schedule(inst, UnitCost())
    with pytest.raises(InputError, match=r"^save_schedule: /proc/wrong\.json cannot be written \(.+\)$"):
        save_schedule(sched, inst, "/proc/wrong.json")


def test_load_schedule_with_its_arguments_swapped_names_path(tmp_path):
    import kvsched as kv

    inst = kv.load_instance(kv.example("figure15"))
    path = tmp_path / "s.json"
    save_schedule(Schedule(()), inst, path)
    with pytest.raises(InputError, match=r"^path: .*load_schedule\(path, instance\)"):
        load_schedule(inst, path)
    with pytest.raises(InputError, match=r"^path: expected a file path"):
        load_schedule(5, inst)
    with pytest.raises(InputError, match="instance"):
        load_schedule(path, str(path))
    with pytest.raises(InputError, match=r"^instance: .*save_schedule\(schedule, instance, path\)"):
        save_schedule(Schedule(()), path, inst)


def _same_size_instances() -> tuple[Instance, Instance]:
    """Two instances with the same request ids and sizes but other arrivals: only the fingerprint differs."""
    one = evicting_instance()
    other = Instance(tuple(Request(r.id, 1.0, r.prompt, r.output) for r in one.requests), one.limits, UNIT)
    return one, other


def test_a_schedule_read_for_one_instance_is_not_saved_for_another(tmp_path):
    # It was saved stamped with the other instance's fingerprint, and then refused its real instance.
    one, other = _same_size_instances()
    save_schedule(evicting_schedule(one, UnitCost()), one, tmp_path / "s.json")
    read = load_schedule(tmp_path / "s.json", one)
    with pytest.raises(InputError, match=r"^schedule: it was read for another instance"):
        save_schedule(read, other, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()
    save_schedule(read, one, tmp_path / "t.json")  # its own instance: as before, meta unchanged
    assert load_schedule(tmp_path / "t.json", one).meta == read.meta == {"policy": "hand"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        # A third number 0 was "requests.0.2: Input should be greater than 0", as if a third belonged.
        ({"c": [], "requests": [[4, 3, 0], [2, 2], [3, 2]]}, r"request 0: expected \[I, O\], got 3 numbers"),
        ({"c": [], "requests": [[4, 0], [2, 2], [3, 2]]}, r"request 0: I and O must be > 0, got \[4, 0\]"),
    ],
)
def test_infermax_requests_are_judged_as_pairs_first(doc, message):
    with pytest.raises(InputError, match=message):
        from_infermax(doc, evicting_instance(), UnitCost())


def test_a_file_of_neither_format_says_so(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"C": [], "p": [], "requests": [[4, 3], [2, 2], [3, 2]]}))
    with pytest.raises(InputError, match=r"neither a kvsched schedule .* nor an InferMax one .*'C'"):
        load_schedule(path, evicting_instance())


def test_a_columnar_run_repeated_zero_times_names_the_entry(tmp_path):
    import numpy as np

    from kvsched.schedule.columnar import save_columnar

    inst = evicting_instance()
    save_columnar(evicting_schedule(inst, UnitCost()), inst, tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz") as f:
        cols = dict(f)
    cols["repeat"][2] = 0
    np.savez(tmp_path / "bad.npz", **cols)
    with pytest.raises(InputError, match=r"repeat\[2\] \(entry 2\) is 0; it must be 1 or more$"):
        load_schedule(tmp_path / "bad.npz", inst)
