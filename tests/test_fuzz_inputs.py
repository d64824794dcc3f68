"""Malformed inputs never crash: loaders raise only ``KvschedError``, commands exit 0, 1 or 2 in time.

Each example mutates one field of a valid instance, schedule (kvsched or InferMax
format) or CSV trace (a nasty value, a deleted or unknown key), or writes bytes
that are not a document at all, and runs it through the loaders and through
``kvsched validate``, ``simulate``, ``solve`` and ``compare`` in process. Exit 3
(an internal error) or an escaping exception is a bug; so is a solve or compare
that runs past its time limit plus the grace :class:`~kvsched.stop.Deadline` allows.
Derandomized with fixed example counts, so the run is the same every time and fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.cli import main
from kvsched.costmodel import UnitCost
from kvsched.errors import KvschedError
from kvsched.instances.io import instance_to_dict, load_csv_trace, load_instance
from kvsched.instances.model import Limits, TimeModel
from kvsched.schedule.io import infermax_document, load_schedule, schedule_to_dict
from kvsched.stop import GRACE_SECONDS
from tests.test_schedule_io import evicting_instance, evicting_schedule

TIME_LIMIT = 0.3
#: Time a solve or compare may take: its limit plus the grace a Deadline allows (the command's whole run),
#: plus 0.5 s for this harness on a shared, loaded 2-core test machine.
ALLOWED = TIME_LIMIT + GRACE_SECONDS + 0.5
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

INSTANCE = evicting_instance()
SCHEDULE = evicting_schedule(INSTANCE, UnitCost())
BASE_INSTANCE = instance_to_dict(INSTANCE)
BASE_SCHEDULE = schedule_to_dict(SCHEDULE, INSTANCE)
BASE_INFERMAX = infermax_document(SCHEDULE, INSTANCE)

NASTY: list[Any] = [
    0,
    -1,
    1,
    True,
    False,
    None,
    2**31,
    2**62,
    2**63,
    2**64 + 1,
    -(2**63) - 1,
    1e308,
    -1e308,
    float("inf"),
    float("nan"),
    0.5,
    1e-320,
    "",
    "r0",
    "R1",
    "decode",
    "1",
    [],
    {},
    [[]],
    [1, 2, 3],
    ["R1", 1, "prefill"],
    {"0": 1},
    {"a": {"b": [1]}},
]
values = st.one_of(
    st.sampled_from(NASTY),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for k, value in enumerate(doc):
            out += _paths(value, (*prefix, k))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """The JSON text of ``base`` with one field replaced, deleted or joined by an unknown one."""
    doc = json.loads(json.dumps(base))
    path = draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra"]))
    if action == "replace":
        parent[path[-1]] = draw(values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent["surprise"] = draw(values)
    else:
        parent.append(draw(values))
    return json.dumps(doc)


RAW = st.sampled_from(
    [
        b"",
        b"\xff\xfe\x00{",
        b'{"schema_version": 1, "name": "\xc3\x28"}',
        b"[" * 50_000 + b"]" * 50_000,
        b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
        b'{"schema_version": 1, "limits": {"kv_capacity": ' + b"9" * 5_000 + b"}}",
        b"{not json",
        b"null",
        b"[]",
        b'"text"',
    ]
)
instance_texts = st.one_of(mutated(BASE_INSTANCE), RAW)
schedule_texts = st.one_of(mutated(BASE_SCHEDULE), mutated(BASE_INFERMAX), RAW)

CSV_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens"
csv_cells = st.one_of(
    st.sampled_from(["0", "1", "4", "-1", "1e308", "nan", "inf", "", "x", "2.5", str(2**64), "True", '"'])
)
csv_texts = st.one_of(
    st.lists(st.tuples(csv_cells, csv_cells, csv_cells), min_size=0, max_size=4).map(
        lambda rows: "\n".join([CSV_HEADER, *(",".join(r) for r in rows)]) + "\n"
    ),
    st.sampled_from(["", "a,b\n1,2\n", CSV_HEADER + "\n0,4,2,9,9\n", "\xff"]),
)


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _run(*argv: str) -> tuple[int, float]:
    """Run ``kvsched ARGV`` in process, quietly; (exit status, seconds)."""
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own usage errors exit 2
            code = exc.code
    assert code in (0, 1, 2), f"kvsched {' '.join(argv)} exited {code}: {err.getvalue().strip()}"
    return code, time.monotonic() - start


def _loads_or_input_error(load) -> Any:  # type: ignore[no-untyped-def]
    try:
        return load()
    except KvschedError:
        return None


@settings(FUZZ, max_examples=60)
@given(text=instance_texts)
def test_instance_loader_and_quick_commands(tmp_path: Path, text: str | bytes) -> None:
    path = _write(tmp_path / "inst.json", text)
    _loads_or_input_error(lambda: load_instance(path))
    good = _write(tmp_path / "sched.json", json.dumps(BASE_SCHEDULE))
    _run("validate", str(path), str(good))
    _run("simulate", str(path), "-p", "sarathi")


@settings(FUZZ, max_examples=60)
@given(text=schedule_texts)
def test_schedule_loader_and_validate(tmp_path: Path, text: str | bytes) -> None:
    inst = _write(tmp_path / "inst.json", json.dumps(BASE_INSTANCE))
    path = _write(tmp_path / "sched.json", text)
    _loads_or_input_error(lambda: load_schedule(path, INSTANCE))
    _run("validate", str(inst), str(path))
    _run("convert", str(inst), str(path), "--to", "infermax", "-o", str(tmp_path / "out.json"))


@settings(FUZZ, max_examples=40)
@given(text=csv_texts)
def test_csv_loader_and_simulate(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "trace.csv", text)
    _loads_or_input_error(lambda: load_csv_trace(path, Limits(kv_capacity=64), TimeModel()))
    _run("simulate", str(path), "-M", "64", "-p", "vllm")


@pytest.fixture(scope="module")
def warm_solver(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One untimed solve and compare first: a fresh process's first solve pays for lazy imports."""
    path = _write(tmp_path_factory.mktemp("warm") / "inst.json", json.dumps(BASE_INSTANCE))
    _run("solve", str(path), "--time-limit", str(TIME_LIMIT))
    _run("compare", str(path), "--policies", "vllm", "--time-limit", str(TIME_LIMIT))


@settings(FUZZ, max_examples=10)
@given(text=instance_texts)
def test_solve_and_compare_stay_within_their_time_limit(
    tmp_path: Path, warm_solver: None, text: str | bytes
) -> None:
    path = _write(tmp_path / "inst.json", text)
    limit = str(TIME_LIMIT)
    for argv in (
        ("solve", str(path), "--time-limit", limit),
        ("compare", str(path), "--policies", "vllm,sarathi", "--time-limit", limit),
    ):
        _, seconds = _run(*argv)
        assert seconds <= ALLOWED, f"kvsched {' '.join(argv)} took {seconds:.2f} s (limit {limit} s)"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc"])
def test_a_time_limit_that_is_not_a_positive_finite_number_is_refused(tmp_path: Path, value: str) -> None:
    path = _write(tmp_path / "inst.json", json.dumps(BASE_INSTANCE))
    assert _run("solve", str(path), "--time-limit", value)[0] == 2
    assert _run("compare", str(path), "--time-limit", value)[0] == 2


GENERATOR_VALUES = st.sampled_from(
    [
        "0",
        "-1",
        "1",
        "2",
        "1e30",
        "1e-300",
        "nan",
        "inf",
        "",
        "x",
        "true",
        "2.5",
        str(2**70),
        "poisson",
        "LILO+SISO",
    ]
)


@st.composite
def generate_argv(draw: st.DrawFn) -> list[str]:
    from kvsched.instances.generators import GENERATORS

    kind = draw(st.sampled_from(sorted(GENERATORS)))
    keys = draw(st.lists(st.sampled_from(sorted(GENERATORS[kind].keys)), max_size=3, unique=True))
    argv = ["generate", kind, "--n", draw(st.sampled_from(["1", "3", "5"])), "-M", "4096"]
    for key in keys:
        argv += ["--param", f"{key}={draw(GENERATOR_VALUES)}"]
    return argv


@settings(FUZZ, max_examples=25)
@given(argv=generate_argv())
def test_generate_with_malformed_parameters(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "g.json"
    code, _ = _run(*argv, "-o", str(out))
    if code == 0:  # what generate writes loads back
        load_instance(out)
