"""Instance files: round trip, CSV traces, and one clear error per bad input."""

import dataclasses
import json

import pytest

from kvsched.errors import InfeasibleInstanceError, InputError
from kvsched.instances.io import load_instance, save_instance
from kvsched.instances.model import Instance, Limits, Request, TimeModel


def doc(**over):
    d = {
        "schema_version": 1,
        "kind": "kvsched.instance",
        "name": "t",
        "limits": {"kv_capacity": 16, "max_batch_tokens": 8},
        "time_model": {"name": "unit"},
        "requests": [
            {"id": "a", "arrival": 0, "prompt": 4, "output": 3},
            {"id": "b", "arrival": 1.5, "prompt": 2, "output": 2, "ttft_slo": 2.0, "cls": "paying"},
        ],
    }
    d.update(over)
    return d


def write(tmp_path, data, name="i.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_round_trip(tmp_path):
    inst = load_instance(write(tmp_path, doc()))
    assert inst.requests[1] == Request("b", 1.5, 2, 2, cls="paying", ttft_slo=2.0)
    assert inst.limits == Limits(kv_capacity=16, max_batch_tokens=8)
    out = tmp_path / "o.json"
    save_instance(inst, out)
    again = load_instance(out)
    assert again == inst


def test_peak_kv_is_prompt_plus_output_minus_one():
    assert Request("x", 0, 10, 5).peak_kv == 14


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["requests"][0].update(prompt=0), r"requests\.0\.prompt: Input should be greater than 0"),
        (
            lambda d: d["requests"][1].update(output=-3),
            r"requests\.1\.output: Input should be greater than 0",
        ),
        (lambda d: d["requests"][0].update(colour="red"), r"requests\.0\.colour: unknown field"),
        (lambda d: d.update(extra=1), r"extra: unknown field"),
        (lambda d: d["limits"].pop("kv_capacity"), r"limits\.kv_capacity: required field is missing"),
        (lambda d: d["requests"][0].update(arrival=-1), r"requests\.0\.arrival"),
        (lambda d: d["requests"][0].update(prompt="many"), r"requests\.0\.prompt"),
        (lambda d: d["requests"][1].update(id="a"), r"duplicate request id 'a'"),
        (lambda d: d.update(schema_version=7), r"schema_version: 7 is not supported"),
        (lambda d: d["time_model"].update(name="warp"), r"unknown cost model 'warp'"),
        (lambda d: d["limits"].update(block_size=32), r"block_size 32 is larger than kv_capacity 16"),
    ],
)
def test_bad_instance_gives_one_line_naming_the_field(tmp_path, mutate, message):
    d = doc()
    mutate(d)
    with pytest.raises(InputError, match=message) as err:
        load_instance(write(tmp_path, d))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "i.json"))


def test_malformed_json_and_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"not valid JSON \(line 1"):
        load_instance(write(tmp_path, "{nope"))
    with pytest.raises(InputError, match="no such file"):
        load_instance(tmp_path / "absent.json")


def test_request_that_can_never_fit_is_rejected_by_name(tmp_path):
    d = doc()
    d["requests"][1].update(prompt=12, output=6)  # 12 + 6 - 1 = 17 > 16
    with pytest.raises(InfeasibleInstanceError, match=r"request 'b': needs 17 KV tokens .* M is 16"):
        load_instance(write(tmp_path, d))
    # Block rounding counts too: 16 tokens in blocks of 3 need 18 > 16.
    inst = Instance((Request("c", 0, 10, 7),), Limits(kv_capacity=16, block_size=3))
    with pytest.raises(InfeasibleInstanceError, match="18 in blocks of 3"):
        inst.check_feasible()


def test_csv_trace_with_vidur_columns(tmp_path):
    p = write(
        tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n0.5,10,3,x\n1.25,7,1,y\n", "t.csv"
    )
    inst = load_instance(p, limits=Limits(kv_capacity=100), time_model=TimeModel("unit"))
    assert [(r.id, r.arrival, r.prompt, r.output) for r in inst.requests] == [
        ("r0", 0.5, 10, 3),
        ("r1", 1.25, 7, 1),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrived_at,num_prefill_tokens\n0,1\n", "missing column 'num_decode_tokens'"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,0,3\n", "line 2: num_prefill_tokens: 0"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,3\n-1,4,3\n", "line 3: arrived_at"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4.5,3\n", "line 2: num_prefill_tokens: 4.5"),
        ("", "not a readable CSV"),
        # A row wider than the header is refused (pandas used to shift its columns under an implicit index).
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,3\n1,4,3,9\n", "line 3 has 4 fields"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4\n", "line 2: num_decode_tokens: ''"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,abc\n", "line 2: num_decode_tokens: 'abc'"),
        (
            'arrived_at,num_prefill_tokens,num_decode_tokens\n0,"4",3\n1,3.0,2.5\n',
            "line 3: num_decode_tokens: 2.5",
        ),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,nan\n", "line 2: num_decode_tokens: nan"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "no requests"),
    ],
)
def test_bad_csv_trace(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        load_instance(write(tmp_path, text, "t.csv"), limits=Limits(kv_capacity=100))


def test_csv_trace_forms(tmp_path):
    """Quoted fields, blank lines, CRLF line ends and a byte-order mark read as the plain file does."""
    plain = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,3\n1.25,7.0,1\n"
    want = [("r0", 0.5, 10, 3), ("r1", 1.25, 7, 1)]
    forms = [
        plain,
        plain.replace("\n", "\r\n"),
        "\ufeff" + plain,
        plain.replace("\n0.5", "\n\n0.5"),
        plain.replace("10,", '"10",'),
        "num_decode_tokens,x,num_prefill_tokens,arrived_at\n3,a,10,0.5\n1,b,7,1.25\n",
    ]
    for k, text in enumerate(forms):
        inst = load_instance(write(tmp_path, text, f"t{k}.csv"), limits=Limits(kv_capacity=100))
        assert [(r.id, r.arrival, r.prompt, r.output) for r in inst.requests] == want, text
    lengths = "num_prefill_tokens,num_decode_tokens\n10,3\n"
    inst = load_instance(write(tmp_path, lengths, "l.csv"), limits=Limits(kv_capacity=100))
    assert [(r.arrival, r.prompt, r.output) for r in inst.requests] == [(0.0, 10, 3)]


def test_csv_needs_limits(tmp_path):
    p = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n", "t.csv")
    with pytest.raises(InputError, match="--kv-capacity"):
        load_instance(p)


def test_shared_splitwise_trace_loads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "shared/data/traces/splitwise_code.csv"
    if not path.exists():
        pytest.skip("shared data not beside the checkout")
    inst = load_instance(path, limits=Limits(kv_capacity=10**6), time_model=TimeModel("unit"))
    assert len(inst) == 8819
    assert all(r.prompt >= 1 and r.output >= 1 for r in inst.requests)


#: A path no one may write, not even root (Linux: /proc takes no new files).
UNWRITABLE = "/proc/kvsched-test/x.json"
needs_proc = pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux /proc")


def test_save_instance_checks_its_arguments_up_front(tmp_path):
    inst = load_instance(write(tmp_path, doc()))
    with pytest.raises(InputError, match=r"^instance: expected an Instance .* got NoneType$"):
        save_instance(None, tmp_path / "o.json")
    for path in (None, 5, b"o.json"):
        with pytest.raises(InputError, match=r"^path: expected a file path .* got (NoneType|int|bytes)$"):
            save_instance(inst, path)
    # A file that loading refuses is not written: an empty instance wrote one.
    with pytest.raises(InputError, match=r"^requests: an instance needs at least one request$"):
        save_instance(dataclasses.replace(inst, requests=()), tmp_path / "o.json")
    assert not (tmp_path / "o.json").exists()


def test_save_instance_creates_a_missing_folder_and_names_a_path_it_cannot_write(tmp_path):
    inst = load_instance(write(tmp_path, doc()))
    out = tmp_path / "new" / "deeper" / "o.json"
    save_instance(inst, str(out))  # the folders are created, as the commands create theirs
    assert load_instance(out) == inst
    (tmp_path / "d.json").mkdir()
    with pytest.raises(InputError, match=r"^save_instance: .*d\.json is a folder, not a file$"):
        save_instance(inst, tmp_path / "d.json")
    with pytest.raises(InputError, match=r"^save_instance: cannot create the folder .*i\.json"):
        save_instance(inst, tmp_path / "i.json" / "o.json")  # i.json is a file


@needs_proc
def test_save_instance_names_a_path_it_cannot_write():
    inst = Instance((Request("a", 0.0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    with pytest.raises(InputError, match=r"^save_instance: (cannot create the folder )?/proc/kvsched-test"):
        save_instance(inst, UNWRITABLE)
    with pytest.raises(InputError, match=r"^save_instance: /proc/x\.json cannot be written \(.+\)$"):
        save_instance(inst, "/proc/x.json")


def test_write_output_turns_only_os_errors_into_input_errors(tmp_path):
    from kvsched.instances.io import write_output

    def broken(_path):
        raise ValueError("a bug in the writer")

    # A writer's own bug stays a bug: only the file system's refusal is the caller's input error.
    with pytest.raises(ValueError, match="a bug in the writer"):
        write_output(tmp_path / "x.json", "test", broken)
    assert write_output(tmp_path / "a" / "x.txt", "test", lambda p: p.write_text("x")).read_text() == "x"


def _sqlite_file(path):
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE cells (x)")  # a database file gets its header with its first table
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    "header",
    [
        "arrived_at,num_prefill_tokens,num_decode_tokens",
        "num_prefill_tokens,num_decode_tokens",  # lengths only: load_csv_trace reads it too
        '\ufeff"arrived_at","num_prefill_tokens","num_decode_tokens",extra\r',
    ],
)
def test_check_not_input_refuses_a_csv_trace_of_any_kind_of_output(tmp_path, header):
    from kvsched.instances.io import check_not_input

    trace = tmp_path / "trace.csv"
    trace.write_text(f"{header}\n0,10,5\n", encoding="utf-8")
    for kind in ("output", "instance", "database"):
        with pytest.raises(
            InputError, match=r"^-o: .*trace\.csv is a CSV trace .*; refusing to overwrite it$"
        ):
            check_not_input(trace, "-o", kind=kind)


def test_check_not_input_lets_each_kind_replace_only_its_own_kind(tmp_path):
    from kvsched.instances.io import check_not_input

    db = _sqlite_file(tmp_path / "r.sqlite")
    inst = write(tmp_path, doc())
    for kind in ("output", "instance"):
        with pytest.raises(
            InputError, match=r"^--out: .*r\.sqlite is an SQLite database \(a results database\?\)"
        ):
            check_not_input(db, "--out", kind=kind)
    assert check_not_input(db, "--db", kind="database") == db  # sweep --db resumes it
    with pytest.raises(InputError, match=r"is a kvsched instance file; refusing to overwrite it$"):
        check_not_input(inst, "--db", kind="database")
    assert check_not_input(inst, "--out", kind="instance") == inst  # generate --out rewrites it
    # kvsched's own per-request table is no trace (no num_prefill_tokens column): a rerun rewrites it.
    table = tmp_path / "requests.csv"
    table.write_text("id,arrival,prompt,output\nr0,0.0,6,6\n")
    assert check_not_input(table, "--requests-csv") == table
    # A header longer than the bytes read: the names read whole count (a cut last one does not).
    wide = tmp_path / "wide.csv"
    wide.write_text("num_prefill_tokens,num_decode_tokens," + ",".join(f"c{k}" for k in range(1000)) + "\n")
    with pytest.raises(InputError, match="is a CSV trace"):
        check_not_input(wide, "-o")


def test_save_instance_replaces_an_instance_never_a_database_or_a_trace(tmp_path):
    inst = load_instance(write(tmp_path, doc()))
    again = tmp_path / "again.json"
    save_instance(inst, again)
    save_instance(inst, again)  # a rerun replaces its own instance file
    db = tmp_path / "r.json"
    db.write_bytes(b"SQLite format 3\x00" + bytes(100))
    trace = tmp_path / "t.json"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    for path, what in ((db, "SQLite database"), (trace, "trace")):
        before = path.read_bytes()
        with pytest.raises(InputError, match=f"save_instance: .*{what}"):
            save_instance(inst, path)
        assert path.read_bytes() == before


# ----------------------------------------------------------------------------- traces as users have them
TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n1.5,10,5\n"


def test_a_gzip_compressed_trace_reads_as_the_plain_one(tmp_path):
    import gzip

    plain = write(tmp_path, TRACE, "t.csv")
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(TRACE.encode()))
    # Was read as JSON by its .gz suffix: "not UTF-8 text (byte 0x8b at offset 1)".
    assert (
        load_instance(packed, limits=Limits(1000)).requests
        == load_instance(plain, limits=Limits(1000)).requests
    )
    # So is a compressed JSON instance, by its first bytes.
    inst = write(tmp_path, doc())
    (tmp_path / "i.json.gz").write_bytes(gzip.compress(inst.read_bytes()))
    assert load_instance(tmp_path / "i.json.gz") == load_instance(inst)
    # A damaged archive is one line, and no instance is written where it would be read back as a trace.
    (tmp_path / "cut.csv.gz").write_bytes(packed.read_bytes()[:20])
    with pytest.raises(InputError, match=r"cut\.csv\.gz: gzip-compressed, but cannot be decompressed"):
        load_instance(tmp_path / "cut.csv.gz", limits=Limits(1000))
    with pytest.raises(InputError, match=r"a \.csv\.gz file is read as a trace; use \.json"):
        save_instance(load_instance(inst), tmp_path / "new.csv.gz")


def test_a_trace_under_another_name_is_named_as_a_trace(tmp_path):
    import gzip

    txt = write(tmp_path, TRACE, "t.txt")
    with pytest.raises(
        InputError, match=r"t\.txt: read as a JSON instance .* it is a CSV trace .* \(e\.g\. t\.csv\)"
    ):
        load_instance(txt, limits=Limits(1000))
    (tmp_path / "t.gz").write_bytes(gzip.compress(TRACE.encode()))
    with pytest.raises(InputError, match=r"must end in \.csv or \.csv\.gz \(e\.g\. t\.csv\.gz\)"):
        load_instance(tmp_path / "t.gz")
    with pytest.raises(InputError, match="not valid JSON"):  # any other text keeps JSON's own error
        load_instance(write(tmp_path, "hello", "h.txt"))


def test_header_names_are_read_without_the_spaces_around_them(tmp_path):
    # "arrived_at, num_prefill_tokens, ..." was "missing column 'num_prefill_tokens'".
    spaced = write(tmp_path, TRACE.replace(",", ", "), "s.csv")
    plain = write(tmp_path, TRACE, "t.csv")
    assert (
        load_instance(spaced, limits=Limits(1000)).requests
        == load_instance(plain, limits=Limits(1000)).requests
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "0,3000000000,4",
            "line 2: num_prefill_tokens: 3000000000 is not valid (must be a whole number from 1 to 2147483647)",
        ),
        (
            "1e20,3,4",
            "line 2: arrived_at: 1e+20 is not valid (must be a number from 0 to 1e+12, in the time model's unit",
        ),
        ("0,3,0", "line 2: num_decode_tokens: 0 is not valid (must be a whole number from 1 to"),
    ],
)
def test_a_bad_csv_value_is_named_with_the_rule_it_breaks(tmp_path, row, message):
    path = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + row + "\n", "t.csv")
    with pytest.raises(InputError) as err:
        load_instance(path, limits=Limits(1000))
    assert message in str(err.value)


def test_requests_a_trace_cannot_fit_are_named_by_line_and_counted(tmp_path):
    # A blank line shifts the file's lines from the requests' positions: the error names the line.
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,3\n\n1,90,20\n2,4,3\n3,95,10\n"
    path = write(tmp_path, text, "t.csv")
    with pytest.raises(InfeasibleInstanceError) as err:
        load_instance(path, limits=Limits(50))
    message = str(err.value)
    assert message.startswith(f"{path}: line 4: needs 109 KV tokens (I + O - 1 = 90 + 20 - 1)")
    assert message.endswith("(2 of the 4 requests cannot fit M; this is the first)") and "'r1'" not in message
    # A JSON instance keeps its ids (they are the file's), with the count as well.
    with pytest.raises(InfeasibleInstanceError, match=r"request 'a': .*it can never complete$"):
        load_instance(write(tmp_path, doc()), limit_overrides={"kv_capacity": 5})


def test_a_trace_without_limits_names_the_python_argument_too(tmp_path):
    with pytest.raises(
        InputError, match=r"--kv-capacity on the command line; limits= or limit_overrides= in Python"
    ):
        load_instance(write(tmp_path, TRACE, "t.csv"))


def test_a_shipped_coefficient_set_is_taken_by_name_and_copied_into_the_instance(tmp_path):
    from kvsched.costmodel.coeffile import resolve_cost_model

    stem = "llama-2-7b_a100-80gb_tp1"
    inst = load_instance(write(tmp_path, TRACE, "t.csv"), limits=Limits(1000), time_model=TimeModel(stem))
    # As --cost-model makes it: the set's model and coefficients, never a reference back to the file.
    assert inst.time_model == TimeModel(*resolve_cost_model(stem))
    from kvsched.instances.io import load_csv_trace

    assert load_csv_trace(tmp_path / "t.csv", Limits(1000), TimeModel(stem)).time_model == inst.time_model
    tuned = load_instance(write(tmp_path, doc()), time_model=TimeModel(stem, {"a0": 0.5}))
    assert tuned.time_model.name == "calibrated" and tuned.time_model.params["a0"] == 0.5
