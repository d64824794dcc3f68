"""The bulk request checks of instance loading accept exactly what the schema accepts, with the same values."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.errors import InputError
from kvsched.instances.io import MAX_TIME, MAX_TOKENS, instance_from_dict, load_instance, requests_in_bulk
from kvsched.instances.model import Request

#: Values of every JSON type near each field's edges (types the schema refuses included).
VALUES = st.one_of(
    st.sampled_from([0, 1, -1, 2, MAX_TOKENS, MAX_TOKENS + 1, -MAX_TOKENS, -MAX_TOKENS - 1, 10**30]),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 3.0, MAX_TIME, MAX_TIME * 2, float("nan"), float("inf")]),
    st.sampled_from([True, False, None, "", "a", "b", "r0", [], {}, [1], {"x": 1}]),
)
FIELDS = (
    "id",
    "arrival",
    "prompt",
    "output",
    "predicted_output",
    "cls",
    "priority",
    "ttft_slo",
    "tbt_slo",
    "x",
)


def _good(k: int) -> dict:
    return {"id": f"r{k}", "arrival": float(k), "prompt": 1 + k, "output": 2}


@st.composite
def request_lists(draw):
    raw = [_good(k) for k in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(0, 3))):  # a few fields set to edge values, or removed
        r = draw(st.sampled_from(raw))
        name = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()):
            r[name] = draw(VALUES)
        else:
            r.pop(name, None)
    return raw


def _document(raw) -> dict:
    return {"schema_version": 1, "limits": {"kv_capacity": 10**6}, "requests": raw}


def _schema_only(raw) -> tuple[Request, ...] | str:
    """What the schema alone makes of ``raw``: the requests, or the error line."""
    from kvsched.instances import io

    original = io.requests_in_bulk
    io.requests_in_bulk = lambda _: None
    try:
        return instance_from_dict(_document(raw), "f.json").requests
    except InputError as exc:
        return str(exc)
    finally:
        io.requests_in_bulk = original


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_lists())
def test_bulk_checks_accept_only_what_the_schema_accepts(raw):
    expected = _schema_only(raw)
    bulk = requests_in_bulk(raw)
    if bulk is not None:  # accepted in bulk: the schema accepts it too, with equal values of equal types
        assert bulk == expected
        assert [type(r.arrival) for r in bulk] == [float] * len(bulk)
    try:
        got = instance_from_dict(_document(raw), "f.json").requests
    except InputError as exc:
        got = str(exc)
    assert got == expected  # the same requests, or the same one-line error


def test_integer_times_are_read_as_floats():
    raw = [{"id": "a", "arrival": 3, "prompt": 1, "output": 1, "ttft_slo": 2, "tbt_slo": None}]
    (req,) = requests_in_bulk(raw)
    assert req == Request("a", 3.0, 1, 1, ttft_slo=2.0) and type(req.ttft_slo) is float


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda rs: rs[500].update(prompt=0), r"requests\.500\.prompt: Input should be greater than 0"),
        (lambda rs: rs[999].update(id="r3"), r"duplicate request id 'r3'"),
        (lambda rs: rs[7].update(arrival=True), r"requests\.7\.arrival"),
    ],
)
def test_a_fault_deep_in_a_large_file_is_named_by_the_schema(tmp_path, mutate, message):
    raw = [_good(k) for k in range(1000)]
    mutate(raw)
    path = tmp_path / "i.json"
    path.write_text(json.dumps(_document(raw)))
    with pytest.raises(InputError, match=message):
        load_instance(path)


def test_a_fault_outside_the_requests_is_named_by_the_schema(tmp_path):
    path = tmp_path / "i.json"
    path.write_text(json.dumps({**_document([_good(k) for k in range(100)]), "limits": {"kv_capacity": 0}}))
    with pytest.raises(InputError, match=r"i\.json: limits\.kv_capacity: Input should be greater than 0$"):
        load_instance(path)
