"""Bad input is one clear line (exit 2), a bug is exit 3, outputs never destroy inputs, fingerprints match."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.commands import common
from kvsched.costmodel import UnitCost
from kvsched.errors import InputError
from kvsched.instances.io import instance_fingerprint, load_instance, save_instance
from kvsched.schedule.io import FINGERPRINT_KEY, load_schedule, save_schedule
from tests.test_examples import EXAMPLES
from tests.test_schedule_io import evicting_instance, evicting_schedule


@pytest.fixture
def files(tmp_path):
    inst = evicting_instance()
    ipath, spath = tmp_path / "inst.json", tmp_path / "sched.json"
    save_instance(inst, ipath)
    save_schedule(evicting_schedule(inst, UnitCost()), inst, spath)
    return ipath, spath


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt", True, "requests.0.prompt: Input should be a valid integer"),
        ("prompt", 4.0, "requests.0.prompt: Input should be a valid integer"),
        ("prompt", 2**70, "requests.0.prompt: Input should be less than or equal to 2147483647"),
        ("arrival", 1e308, "requests.0.arrival: Input should be less than or equal to"),
        ("arrival", 2**62, "requests.0.arrival: Input should be less than or equal to"),
        ("arrival", "0", "requests.0.arrival: Input should be a valid number"),
    ],
)
def test_out_of_range_and_coerced_values_are_refused(files, capsys, field, value, message):
    doc = _doc(files[0])
    doc["requests"][0][field] = value
    files[0].write_text(json.dumps(doc))
    assert main(["info", str(files[0])]) == 2
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{}", "not UTF-8 text (byte 0xff at offset 0)"),
        # A results database given where a document belongs (e.g. kvsched plot cdf results.sqlite).
        (b"SQLite format 3\x00\x10\x00\xf8" + b"\x00" * 100, "an SQLite database (a results database?)"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
        (b'{"schema_version": 1, "x": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_unreadable_files_are_one_line(files, capsys, content, message):
    files[1].write_bytes(content)
    assert main(["validate", str(files[0]), str(files[1])]) == 2
    assert message in _one_error_line(capsys)
    files[0].write_bytes(content)
    assert main(["simulate", str(files[0]), "-p", "vllm"]) == 2
    assert message in _one_error_line(capsys)


def test_a_schedule_for_another_instance_is_one_error_and_old_files_still_validate(files, tmp_path, capsys):
    assert _doc(files[1])["meta"][FINGERPRINT_KEY] == instance_fingerprint(evicting_instance())
    other = tmp_path / "other.json"
    doc = _doc(files[0])
    doc["requests"][0]["arrival"] = 1.0
    other.write_text(json.dumps(doc))
    assert main(["validate", str(other), str(files[1])]) == 2
    assert "written for another instance" in _one_error_line(capsys)
    old = _doc(files[1])
    del old["meta"][FINGERPRINT_KEY]
    files[1].write_text(json.dumps(old))
    assert main(["validate", str(files[0]), str(files[1])]) == 0
    # The fingerprint describes the file; the loaded schedule's meta does not carry it.
    assert FINGERPRINT_KEY not in load_schedule(files[1], evicting_instance()).meta


def test_limit_flags_override_only_what_they_name(files, tmp_path, capsys):
    doc = _doc(files[0])
    doc["limits"].update(max_batch_tokens=4, max_running=2)
    files[0].write_text(json.dumps(doc))
    inst = load_instance(files[0], limit_overrides={"kv_capacity": 9})
    assert (inst.limits.kv_capacity, inst.limits.max_batch_tokens, inst.limits.max_running) == (9, 4, 2)
    # The schedule batches 6 tokens: illegal under the file's C = 4 even when -M is given.
    assert main(["validate", str(files[0]), str(files[1]), "-M", "9"]) == 1
    with pytest.raises(InputError, match="block_size 16 is larger than kv_capacity 9"):
        load_instance(files[0], limit_overrides={"kv_capacity": 9, "block_size": 16})


def test_outputs_never_overwrite_an_input_and_folders_are_made(files, tmp_path, capsys):
    before = files[0].read_bytes()
    assert main(["simulate", str(files[0]), "-p", "vllm", "-o", str(files[0])]) == 2
    assert "also an input" in _one_error_line(capsys)
    assert files[0].read_bytes() == before
    out = tmp_path / "new" / "deeper" / "s.json"
    assert main(["simulate", str(files[0]), "-p", "vllm", "-o", str(out)]) == 0
    assert main(["validate", str(files[0]), str(out)]) == 0
    capsys.readouterr()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["solve", str(files[0]), "--time-limit", "5", "-o", str(blocker / "s.json")]) == 2
    assert "is not a folder" in _one_error_line(capsys)


def test_outputs_never_overwrite_another_instance_file(files, tmp_path, capsys):
    # Not this command's input, but an instance all the same (a typo in -o): refused as the API refuses it.
    other = tmp_path / "other.json"
    other.write_bytes(files[0].read_bytes())
    before = other.read_bytes()
    for flag in ("-o", "--json"):
        assert main(["simulate", str(files[0]), "-p", "vllm", flag, str(other)]) == 2
        assert "is a kvsched instance file; refusing to overwrite it" in _one_error_line(capsys)
    assert other.read_bytes() == before
    # generate writes instances: replacing one it wrote before is what a rerun does.
    assert main(["generate", "synthetic", "--n", "3", "--out", str(other)]) == 0
    assert len(load_instance(other)) == 3


def test_per_engine_outputs_never_overwrite_an_input(files, tmp_path, capsys):
    # With --engines K, -o OUT writes OUT.engine0.json ... : those names are checked, not OUT.
    src = tmp_path / "e.engine0.json"
    src.write_bytes(files[0].read_bytes())
    before = src.read_bytes()
    argv = ["simulate", str(src), "-p", "vllm", "--engines", "2", "-o", str(tmp_path / "e.json")]
    assert main(argv) == 2
    assert "also an input" in _one_error_line(capsys)
    assert src.read_bytes() == before
    assert main(["simulate", str(files[0]), "-p", "vllm", "--balancer", "random"]) == 2
    assert "--engines 2 or more" in _one_error_line(capsys)


def test_atomic_output_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "x.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), common.atomic_output(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash while writing")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]
    common.write_text_atomic(target, "new")
    assert target.read_text() == "new"


def test_an_internal_error_exits_3_with_a_hint_and_no_traceback(files, capsys, monkeypatch):
    import kvsched.schedule.io as sio

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(sio, "load_schedule", broken)
    monkeypatch.delenv("KVSCHED_DEBUG", raising=False)
    assert main(["validate", str(files[0]), str(files[1])]) == 3
    err = _one_error_line(capsys)
    assert "internal error: ZeroDivisionError: boom" in err and "KVSCHED_DEBUG=1" in err
    monkeypatch.setenv("KVSCHED_DEBUG", "1")
    assert main(["validate", str(files[0]), str(files[1])]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_cost_param_alone_overrides_the_instance_s_own_model(files, tmp_path, capsys):
    doc = _doc(files[0])
    doc["time_model"] = {"name": "hinge", "params": {"c": 1.0, "a": 0.5, "b0": 2.0}}
    files[0].write_text(json.dumps(doc))
    assert main(["info", str(files[0]), "--cost-param", "c=2"]) == 0
    out = capsys.readouterr().out
    assert "hinge" in out and "c=2" in out and "a=0.5" in out
    assert main(["info", str(files[0]), "--cost-param", "nope=1"]) == 2
    assert "nope" in _one_error_line(capsys)


@pytest.mark.parametrize("slot", ["nan", "-3", "0", "inf"])
def test_info_refuses_a_cost_param_simulate_refuses(files, capsys, slot):
    # The same check (the problem data's), the same one line naming the flags, whichever the command.
    for command in (["info", str(files[0])], ["simulate", str(files[0]), "-p", "vllm"]):
        assert main([*command, "--cost-param", f"slot={slot}"]) == 2
        err = _one_error_line(capsys)
        expected = (
            f"kvsched {command[0]}: error: --cost-model/--cost-param: time_model.params: cost model unit: "
        )
        assert err.startswith(expected), err


def test_two_outputs_naming_one_file_are_refused_before_the_work(files, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "simulate",
                str(files[0]),
                "-p",
                "vllm",
                "-o",
                str(out),
                "--json",
                str(tmp_path / "." / "out.json"),
            ]
        )
        == 2
    )
    assert "is also the file of --out" in _one_error_line(capsys)
    assert not out.exists()
    assert (
        main(
            [
                "compare",
                str(files[0]),
                "--policies",
                "vllm",
                "--no-solver",
                "--csv",
                str(out),
                "--json",
                str(out),
            ]
        )
        == 2
    )
    assert "--json" in _one_error_line(capsys) and not out.exists()


def test_replay_and_calibrate_never_overwrite_the_replay_metadata_s_neighbours(files, tmp_path, capsys):
    # replay writes TABLE.csv and TABLE.json: -o sched.csv would put the metadata over the schedule sched.json.
    before = files[1].read_bytes()
    assert main(["replay", str(files[0]), str(files[1]), "-o", str(files[1].with_suffix(".csv"))]) == 2
    assert "--out's metadata" in _one_error_line(capsys) and files[1].read_bytes() == before
    assert main(["replay", str(files[0]), str(files[1]), "-o", str(tmp_path / "m.json")]) == 2
    assert "is also the file of --out" in _one_error_line(capsys)
    # calibrate --from-replay reads the table's metadata too.
    table, side = tmp_path / "m.csv", tmp_path / "m.json"
    table.write_text("x\n1\n")
    side.write_text("{}")
    assert main(["calibrate", "--from-replay", str(table), "-o", str(side)]) == 2
    assert "also an input" in _one_error_line(capsys) and side.read_text() == "{}"


def test_profile_into_a_file_is_one_error_line(files, capsys):
    assert main(["profile", "--out", str(files[0]), "--grid", "quick"]) == 2
    assert "is a file, not a folder" in _one_error_line(capsys)


def test_an_output_through_a_link_writes_through_and_keeps_the_link(tmp_path):
    # -o /dev/stdout is a link (to the file the shell redirects to): replacing it would replace /dev/stdout.
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real)
    common.write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_convert_refuses_a_schedule_of_another_instance(files, tmp_path, capsys):
    other = tmp_path / "other.json"
    doc = _doc(files[0])
    doc["requests"][0]["arrival"] = 5.0
    other.write_text(json.dumps(doc))
    sched = _doc(files[1])
    del sched["meta"][FINGERPRINT_KEY]  # an old file: nothing says which instance it was made for
    files[1].write_text(json.dumps(sched))
    out = tmp_path / "im.json"
    assert main(["convert", str(other), str(files[1]), "--to", "infermax", "-o", str(out)]) == 1
    err = _one_error_line(capsys)
    assert err.startswith("INVALID:") and "before-arrival" in err and not out.exists()


def test_compare_needs_a_policy(files, capsys):
    assert main(["compare", str(files[0]), "--policies", " , ", "--no-solver"]) == 2
    assert "--policies: give at least one" in _one_error_line(capsys)


def test_the_output_time_warning_never_says_0_s():
    from kvsched.schedule.output_time import seconds_text

    assert [seconds_text(x) for x in (0.3, 0.012, 8.74, 123.4)] == ["0.3", "0.012", "8.7", "123"]


def test_an_export_is_checked_before_the_solve_and_a_missing_one_is_an_error(files, tmp_path, capsys):
    # The suffix is refused before any work, not after a finished solve.
    assert main(["solve", str(files[0]), "--time-limit", "5", "--export", str(tmp_path / "m.txt")]) == 2
    assert "--export: m.txt: the file must end in .mps or .lp" in _one_error_line(capsys)
    # 20 requests: auto runs the certified pipeline, which builds no MILP. The schedule is still
    # written; the export asked for is one error line, not a silent success without the file.
    big, out, lp = tmp_path / "big.json", tmp_path / "s.json", tmp_path / "m.lp"
    assert main(["generate", "synthetic", "--n", "20", "-o", str(big)]) == 0
    capsys.readouterr()
    assert main(["solve", str(big), "--time-limit", "2", "-o", str(out), "--export", str(lp)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "--export: no model was written to" in errors[0] and "pipeline" in errors[0]
    assert "Traceback" not in err and out.exists() and not lp.exists()


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["solve", "{i}", "--time-limit", "5", "--seed", "-1"], "--seed"),
        (["calibrate", "--from-replay", "{i}", "--seed", "-1"], "--seed"),
        (["replay", "{i}", "{s}", "--prompt-seed", "-1"], "--prompt-seed"),
        (["replay", "{i}", "{s}", "--seed", str(2**64)], "--seed"),
        (["profile", "-o", "{d}", "--warmup", "-1"], "--warmup"),
        (["simulate", "{i}", "-p", "vllm", "--engines", "2", "--balancer-seed", "-3"], "--balancer-seed"),
        (["generate", "synthetic", "--seed", "-1"], "--seed"),
    ],
)
def test_negative_or_huge_seeds_and_warmups_are_one_usage_line(files, tmp_path, capsys, argv, flag):
    # A negative seed reached numpy's and torch's generators (exit 3, "internal error"); a negative
    # --warmup ran none and wrote warmup: -1 into the table's metadata.
    names = {"{i}": str(files[0]), "{s}": str(files[1]), "{d}": str(tmp_path / "p")}
    with pytest.raises(SystemExit) as exit_:
        main([names.get(a, a) for a in argv])
    assert exit_.value.code == 2
    assert f"argument {flag}:" in _one_error_line(capsys)


def test_the_solver_api_refuses_a_negative_seed():
    from kvsched.csp import SolverOptions, solve

    with pytest.raises(InputError, match=r"options\.seed: must be a whole number >= 0"):
        solve(evicting_instance(), options=SolverOptions(seed=-1))


def test_capacity_and_calibrate_refuse_a_tp_that_cannot_be(tmp_path, capsys):
    # 32 heads over 3 (or 1024) GPUs printed an M for an engine that cannot be built.
    for tp in ("3", "64"):
        assert main(["capacity", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--tp", tp]) == 2
        assert f"32 attention heads cannot be split evenly over {tp} GPUs" in _one_error_line(capsys)
    # An all-reduce table at tp = 1 was never read, even a path that does not exist: now said.
    from kvsched.costmodel.calibrate import DATA_DIR

    table = DATA_DIR / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    argv = ["calibrate", str(table), "--gpu", "h100-80gb", "-o", str(tmp_path / "c.json")]
    assert main([*argv, "--all-reduce", str(tmp_path / "nope.csv")]) == 2
    assert "an all-reduce table is read only with --tp > 1" in _one_error_line(capsys)
    assert not (tmp_path / "c.json").exists()


def test_another_program_s_database_is_refused_and_left_as_it_was(tmp_path, capsys):
    # Reading one (or an empty file) wrote kvsched's tables into it and printed "0 cells", exit 0.
    import sqlite3

    other, empty = tmp_path / "other.sqlite", tmp_path / "empty.sqlite"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    empty.write_bytes(b"")
    before = other.read_bytes()
    for argv in (["results", str(other)], ["regret", str(other)], ["results", str(empty)]):
        assert main(argv) == 2
        assert "not a kvsched results database" in _one_error_line(capsys)
    assert other.read_bytes() == before and empty.read_bytes() == b""


@pytest.mark.parametrize(
    ("which", "edit", "message"),
    [
        (0, lambda d: [], "bad.json: (top level): expected a JSON object, got a list"),
        (0, lambda d: {**d, "limits": None}, "bad.json: limits: expected a JSON object, got null"),
        (1, lambda d: {**d, "batches": [3]}, "bad.json: batches.0: expected a JSON object, got a number"),
        # An InferMax schedule's c.0 is a union member: pydantic's tag dict[constrained-str,...] is not named.
        (1, lambda d: {"c": [[1, 2]], "p": [[]], "evicted": [[]], "requests": []}, "bad.json: c.0: expected"),
    ],
)
def test_a_field_of_the_wrong_json_type_is_named_in_json_s_words(
    files, tmp_path, capsys, which, edit, message
):
    # pydantic's message named the schema class ("... or instance of InstanceSchema").
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(_doc(files[which]))))
    argv = ["info", str(bad)] if which == 0 else ["validate", str(files[0]), str(bad)]
    assert main(argv) == 2
    err = _one_error_line(capsys)
    assert message in err and "Schema" not in err and "[" not in err.split(": error: ")[1].split(":")[1]


def test_an_instance_is_not_written_under_a_name_read_back_as_a_trace(tmp_path, capsys):
    # generate -o i.csv wrote JSON that `kvsched info i.csv` then read as a CSV trace ("missing column").
    out = tmp_path / "i.csv"
    assert main(["generate", "synthetic", "--n", "3", "-o", str(out)]) == 2
    assert "a .csv file is read as a trace; use .json" in _one_error_line(capsys)
    assert not out.exists()
    with pytest.raises(InputError, match=r"use \.json"):
        save_instance(evicting_instance(), tmp_path / "x.CSV")


@pytest.mark.parametrize(
    ("anytime", "message"),
    [
        ("x", "anytime: expected a list of [time, incumbent, bound] rows"),
        ([[0.1, "x", 2.0]], "anytime.0: expected [time >= 0, incumbent, bound]"),
        ([{"t": 1}], "anytime.0: expected"),
        ([[1]], "anytime.0: expected"),
    ],
)
def test_plot_anytime_names_the_bad_row_of_a_result_document(tmp_path, capsys, anytime, message):
    # A hand-edited --json document failed in pandas: exit 3, "internal error" (or, [[1]], a figure).
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"status": "optimal", "objective": 3.0, "runtime": 0.5, "anytime": anytime}))
    assert main(["plot", "anytime", str(doc), "-o", str(tmp_path / "a.png")]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "a.png").exists()


def test_a_coefficient_file_without_params_is_refused(files, tmp_path, capsys):
    # It built the model with every coefficient 0: batches that take no time, metrics of 0 s.
    coef = tmp_path / "c.json"
    coef.write_text(
        json.dumps({"schema_version": 1, "kind": "kvsched.cost-coefficients", "name": "calibrated"})
    )
    assert main(["simulate", str(files[0]), "-p", "vllm", "--cost-model", str(coef)]) == 2
    assert "c.json: params: required field is missing" in _one_error_line(capsys)


@pytest.mark.parametrize("command", ["solve", "compare"])
def test_a_thread_count_no_back_end_can_start_is_refused_before_the_work(files, capsys, command):
    # --threads 100000: HiGHS hung starting them, or aborted the process (SIGABRT) with no error line.
    assert main([command, str(files[0]), "--time-limit", "5", "--threads", "100000"]) == 2
    line = _one_error_line(capsys)
    # Named as the user typed it (it said options.threads, the Python API's field, before).
    assert "--threads: must be a whole number in 1..1024, got 100000" in line
    assert "options." not in line


def test_replay_and_profile_refuse_a_thread_count_torch_cannot_start(files, tmp_path, capsys):
    # torch.set_num_threads(100000) crashed the process (segmentation fault); refused before torch loads.
    assert main(["replay", str(files[0]), str(files[1]), "--threads", "100000"]) == 2
    assert "--threads: must be a whole number in 1..1024, got 100000" in _one_error_line(capsys)
    assert main(["profile", "-o", str(tmp_path / "p"), "--threads", "5000"]) == 2
    assert "--threads: must be a whole number in 1..1024, got 5000" in _one_error_line(capsys)


def test_a_kv_pool_the_machine_cannot_hold_is_one_line(files, tmp_path, capsys):
    # torch's allocator error ("DefaultCPUAllocator: can't allocate memory") was exit 3, internal error.
    pytest.importorskip("torch")
    argv = [
        "replay",
        str(files[0]),
        str(files[1]),
        "-o",
        str(tmp_path / "m.csv"),
        "--pool-capacity",
        str(10**12),
    ]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    # Refused before the allocation where the free memory can be read (the CPU), else by the allocator's error.
    assert len(err) == 1 and "KV pool: 1,000,000,000,000 tokens" in err[0]
    assert "cannot be allocated" in err[0] or "GB free on cpu" in err[0]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_write_the_system_refuses_is_one_error_line_not_a_bug(files, capsys):
    # A full disk once read "internal error: OSError ... this is a bug".
    code = main(["simulate", str(files[0]), "-p", "vllm", "--no-progress", "--json", "/dev/full"])
    assert code == common.EXIT_ERROR
    err = _one_error_line(capsys)
    assert "kvsched simulate: error: No space left on device" in err and "internal error" not in err


def test_an_output_onto_a_pipe_is_written_not_read(files, tmp_path):
    # The check that an output is not an instance file read its target first: on a pipe that read blocked
    # for ever (kvsched simulate ... -o /dev/stdout | cat).
    import os
    import threading

    from kvsched.instances.io import check_not_input

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    checker = threading.Thread(target=lambda: got.append(check_not_input(fifo, "-o")), daemon=True)
    checker.start()
    checker.join(5.0)
    assert got == [fifo]


def test_a_time_limit_past_what_a_wait_takes_is_no_limit(files, capsys):
    # threading refuses waits past TIMEOUT_MAX (about 9.2e9 s): --time-limit 1e10 was an internal error.
    for solver in ("highs", "cpsat"):
        args = ["solve", str(files[0]), "--time-limit", "1e10", "--solver", solver, "--formulation", "batch"]
        assert main(args) == 0, capsys.readouterr().err
        assert "error" not in capsys.readouterr().err


def _results_database(path: Path) -> Path:
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE cells (x)")  # the file gets SQLite's header with its first table
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{inst}", "{sched}", "--to", "kvsched", "--out", "{target}"],
        ["convert", "{inst}", "{sched}", "--to", "infermax", "--out", "{target}"],
        ["simulate", "{inst}", "-p", "vllm", "--no-progress", "--json", "{target}"],
        ["simulate", "{inst}", "-p", "vllm", "--no-progress", "--requests-csv", "{target}"],
        ["results", "{other_db}", "--to", "csv", "--out", "{target}"],
        ["generate", "synthetic", "--n", "3", "--out", "{target}"],
    ],
)
@pytest.mark.parametrize("victim", ["db", "trace"])
def test_no_output_replaces_a_results_database_or_a_csv_trace(files, tmp_path, capsys, argv, victim):
    # Both are inputs of other commands (results/regret/report, simulate TRACE.csv): once overwritten, exit 0.
    if victim == "db":
        target, message = (
            _results_database(tmp_path / "keep.sqlite"),
            "is an SQLite database (a results database?)",
        )
    else:
        target, message = tmp_path / "trace.txt", "is a CSV trace (its header names"
        target.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    before = target.read_bytes()
    names = {"inst": files[0], "sched": files[1], "target": target}
    names["other_db"] = _results_database(tmp_path / "other.sqlite")
    assert main([arg.format(**names) for arg in argv]) == 2
    err = _one_error_line(capsys)
    assert f": {target} {message}" in err and "refusing to overwrite it" in err, err
    assert target.read_bytes() == before


def test_sweep_resumes_its_database_and_refuses_any_other_input(files, tmp_path, capsys):
    import yaml

    spec = tmp_path / "s.yaml"
    instances = [{"file": str(files[0])}]
    spec.write_text(yaml.safe_dump({"name": "t", "instances": instances, "policies": ["vllm"]}))
    db = tmp_path / "r.sqlite"
    for written in ("1 written", "1 already done, 0 written"):  # a database is sweep's own output: resumed
        assert main(["sweep", str(spec), "--db", str(db), "--workers", "1", "--no-progress"]) == 0
        assert written in capsys.readouterr().err
    trace = tmp_path / "trace.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    for other, message in ((files[0], "is a kvsched instance file"), (trace, "is a CSV trace")):
        before = other.read_bytes()
        assert main(["sweep", str(spec), "--db", str(other), "--workers", "1"]) == 2
        assert f"--db: {other} {message}" in _one_error_line(capsys)
        assert other.read_bytes() == before


def test_convert_refuses_infermax_json_into_a_npz_name(files, tmp_path, capsys):
    # load_schedule reads a .npz file as a columnar schedule: the JSON written there could not be read back.
    out = tmp_path / "z.npz"
    assert main(["convert", str(files[0]), str(files[1]), "--to", "infermax", "--out", str(out)]) == 2
    assert "--out: z.npz: the InferMax format is JSON" in _one_error_line(capsys)
    assert not out.exists()
    assert main(["convert", str(files[0]), str(files[1]), "--to", "kvsched", "--out", str(out)]) == 0
    assert load_schedule(out, load_instance(files[0])) is not None  # kvsched's columnar format: read back


def test_atomic_output_names_the_file_given_never_its_temporary_one(tmp_path, monkeypatch):
    # A folder that takes no new file (generate --out /proc/a.json) named ".a.json.f42dc9j3.json", no flag.
    import errno
    import os
    import re
    import tempfile

    target = tmp_path / "a.json"
    name = re.escape(str(target))

    def refuse(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / ".a.json.xyz.json"))

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkstemp", refuse)
        refused = pytest.raises(
            InputError, match=rf"^--out: {name} cannot be written \(No such file or directory\)$"
        )
        with refused, common.atomic_output(target, "--out"):
            pass
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    refused = pytest.raises(
        InputError, match=rf"^--json: {name} cannot be written \(No space left on device\)$"
    )
    with refused, common.atomic_output(target, "--json") as tmp:
        full.filename = str(tmp)  # what open() raises for the temporary file
        raise full
    # An API writer given the temporary file names it: the message names the file the user gave instead.
    refused = pytest.raises(InputError, match=rf"^save_schedule: {name} cannot be written$")
    with refused, common.atomic_output(target) as tmp:
        raise InputError(f"save_schedule: {tmp} cannot be written")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left behind


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_output_in_a_folder_that_takes_no_file_is_one_line_naming_it(files, capsys):
    assert main(["convert", str(files[0]), str(files[1]), "--to", "infermax", "--out", "/proc/z.json"]) == 2
    err = _one_error_line(capsys)
    assert "/proc/z.json" in err and "/proc/.z.json." not in err, err


def test_an_instance_files_own_impossible_time_model_is_refused_by_info_too(tmp_path, capsys):
    # info exited 0 showing "unit (slot=0)" where simulate refused the same file.
    data = json.loads((EXAMPLES / "tiny.json").read_text())
    data["time_model"] = {"name": "unit", "params": {"slot": 0}}
    path = tmp_path / "slot0.json"
    path.write_text(json.dumps(data))
    for command in (["info", str(path)], ["simulate", str(path), "-p", "vllm"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{path}: time_model.params: cost model unit" in err[0], err


# ----------------------------------------------------------------------------- a user's own CSV trace
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _trace(tmp_path: Path, rows: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + rows)
    return path


def test_simulate_notes_an_engine_idle_between_arrivals_far_apart(tmp_path, capsys):
    # Arrivals 5000 slots apart, each request done in about 3: a trace in milliseconds read as seconds
    # (500 requests became a 36-hour run, with no word said).
    sparse = _trace(tmp_path, "0,4,2\n5000,4,2\n10000,4,2\n", "ms.csv")
    assert main(["simulate", str(sparse), "-M", "64", "-p", "sarathi", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kvsched simulate: note: the engine idled 100% of the run" in err
    assert (
        "arrivals span 10000 slot" in err and "if the trace's are in milliseconds, divide them by 1000" in err
    )
    # A trace whose engine works between arrivals gets no note.
    dense = _trace(tmp_path, "0,4,2\n5,4,2\n10,4,2\n", "s.csv")
    assert main(["simulate", str(dense), "-M", "64", "-p", "sarathi", "--no-progress"]) == 0
    assert "note" not in capsys.readouterr().err


def test_simulate_idle_note_thresholds_are_conservative():
    from types import SimpleNamespace

    import numpy as np

    from kvsched.commands.simulate import IDLE_NOTE_GAP_BATCHES, idle_note
    from kvsched.instances.model import Instance, Limits, Request

    inst = Instance((Request("a", 0.0, 4, 2),), Limits(64))

    def note(arrivals, starts, ends):  # a trace's arrivals and a batch clock, as the command hands them
        trace = SimpleNamespace(state=SimpleNamespace(arrival=np.array(arrivals)), instance=inst)
        clock = SimpleNamespace(ends=np.array(ends), starts=lambda: np.array(starts))
        return idle_note(trace, clock)

    gap = IDLE_NOTE_GAP_BATCHES
    assert note([0.0, gap], [0.0, gap], [1.0, gap + 1]) is not None  # idle 99.8%, gaps 1000 batches
    assert note([0.0, gap - 10], [0.0, gap - 10], [1.0, gap - 9]) is None  # gaps just short of that
    # Gaps 2000 batches, but the engine works half the run (1000 batches after the first arrival).
    busy = [float(k) for k in range(1000)] + [2 * gap]
    assert note([0.0, 2 * gap], busy, [b + 1 for b in busy]) is None


def test_simulate_slo_reaches_the_summary_row_and_the_per_request_csv(tmp_path, capsys):
    import pandas as pd

    trace = _trace(tmp_path, "0,4,2\n0,4,2\n0,4,2\n0,4,2\n")
    out = tmp_path / "req.csv"
    argv = ["simulate", str(trace), "-M", "64", "-C", "8", "-p", "sarathi", "--no-progress"]
    assert main([*argv, "--slo", "ttft=1", "--requests-csv", str(out)]) == 0
    text = capsys.readouterr().out
    frame = pd.read_csv(out)
    good = int(frame["good"].sum())
    assert 0 < good < len(frame)  # a budget of 8 tokens: two first tokens in the first slot, two later
    # The summary's SLO row said "no SLOs" and the CSV's flags were empty while goodput counted --slo.
    assert "attainment (ttft <= 1)" in text and f"({good} of 4)" in text
    assert f"goodput (ttft <= 1): {good} of 4 requests" in text
    assert frame["slo_met"].isna().all()  # the requests' own SLOs: none in a trace
    assert main([*argv, "--requests-csv", str(out)]) == 0
    assert "good" not in pd.read_csv(out).columns and "ttft <=" not in capsys.readouterr().out


def test_a_trace_s_impossible_rows_are_named_by_line_on_the_command_line(tmp_path, capsys):
    trace = _trace(tmp_path, "0,4,2\n1,90,20\n2,95,10\n")
    assert main(["info", str(trace), "-M", "50"]) == 2
    err = _one_error_line(capsys)
    # Was "request 'r1': ..." with no word of the second.
    assert f"{trace}: line 3: needs 109 KV tokens" in err and "(2 of the 3 requests cannot fit M" in err


def test_a_compressed_trace_and_a_spaced_header_work_on_the_command_line(tmp_path, capsys):
    import gzip

    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress((HEADER + "0,4,2\n1,5,3\n").encode()))
    assert main(["info", str(packed), "-M", "64"]) == 0
    assert "│ requests " in capsys.readouterr().out
    spaced = _trace(tmp_path, "0, 4, 2\n", "spaced.csv")
    spaced.write_text(HEADER.replace(",", ", ") + "0, 4, 2\n")
    assert main(["info", str(spaced), "-M", "64"]) == 0


@pytest.mark.parametrize(
    ("command", "flag"),
    [("simulate", "-o"), ("simulate", "--json"), ("compare", "--json"), ("solve", "--json")],
)
def test_no_output_replaces_the_cost_model_or_policy_file_it_reads(tmp_path, capsys, command, flag):
    # replay --cost-model fit.json -o fit.json (and simulate, compare, solve) replaced the coefficient file
    # they were reading with their own output: the cost model and FILE.py:CLASS policies are inputs too.
    import shutil

    from kvsched.costmodel.coeffile import COEFFICIENT_DIR

    fit = tmp_path / "fit.json"
    shutil.copy(COEFFICIENT_DIR / "llama-2-7b_a100-80gb_tp1.json", fit)
    before = fit.read_bytes()
    head = [command, str(EXAMPLES / "figure15.json")]
    head += ["-p", "sarathi"] if command == "simulate" else ["--time-limit", "5"]
    assert main([*head, "--cost-model", str(fit), flag, str(fit)]) == 2
    assert "is also an input of this command" in capsys.readouterr().err and fit.read_bytes() == before
    if command == "compare":
        mine = tmp_path / "mine.py"
        mine.write_text("class Mine:\n    pass\n")
        assert main([*head, "--policies", f"sarathi,{mine}:Mine", flag, str(mine)]) == 2
        assert "is also an input of this command" in capsys.readouterr().err
        assert mine.read_text() == "class Mine:\n    pass\n"
