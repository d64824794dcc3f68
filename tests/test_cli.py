"""The command line: outputs, exit codes, and one clear line for bad input."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from kvsched.cli import main
from kvsched.costmodel import UnitCost
from kvsched.instances.io import save_instance
from kvsched.schedule.io import infermax_document, save_schedule
from tests.test_schedule_io import evicting_instance, evicting_schedule


@pytest.fixture
def files(tmp_path):
    inst = evicting_instance()
    sched = evicting_schedule(inst, UnitCost())
    ipath, spath = tmp_path / "inst.json", tmp_path / "sched.json"
    save_instance(inst, ipath)
    save_schedule(sched, inst, spath)
    return ipath, spath


def run_cli(*args):
    """Run the real console entry point in a subprocess (what a user sees)."""
    return subprocess.run(
        [sys.executable, "-m", "kvsched.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_info(files, capsys):
    assert main(["info", str(files[0])]) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "KV capacity M" in out and "8 tokens" in out


def test_validate_legal_schedule_with_metrics(files, capsys):
    assert main(["validate", str(files[0]), str(files[1]), "--metrics"]) == 0
    out = capsys.readouterr().out
    assert "valid: 5 batches, 3 requests, makespan 5" in out


def test_validate_reports_every_violation_and_exits_1(files, tmp_path, capsys):
    doc = json.loads(files[1].read_text())
    doc["batches"][0]["items"][0][1] = 5  # R1 prefill of 5 > I = 4
    doc["batches"][2]["start"] = 0.5  # overlaps batch 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(files[0]), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "batch 0, request 'R1': [too-many-tokens] 5 tokens but only 4 are left to process" in out
    assert "batch 2: [overlap]" in out


def test_validate_prints_each_violation_on_one_line_when_piped(tmp_path, capsys, monkeypatch):
    # Rich cut lines at 80 columns off a terminal: a long request id put a violation on two lines.
    monkeypatch.setenv("COLUMNS", "80")
    inst = evicting_instance()
    long_id = "a-request-with-a-rather-long-identifier-from-a-real-trace-R1"
    inst = replace(inst, requests=(replace(inst.requests[0], id=long_id), *inst.requests[1:]))
    ipath, spath, bad = tmp_path / "inst.json", tmp_path / "sched.json", tmp_path / "bad.json"
    save_instance(inst, ipath)
    save_schedule(evicting_schedule(inst, UnitCost()), inst, spath)
    doc = json.loads(spath.read_text())
    doc["batches"][0]["items"][0][1] = 5  # R1 prefill of 5 > I = 4
    doc["batches"][2]["start"] = 0.5  # overlaps batch 1
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(ipath), str(bad)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"batch 0, request '{long_id}': [too-many-tokens] 5 tokens but only 4 are left to process" in lines
    assert all(line.startswith("batch ") for line in lines), lines


def test_convert_to_infermax_and_back(files, tmp_path):
    im = tmp_path / "im.json"
    back = tmp_path / "back.json"
    assert main(["convert", str(files[0]), str(files[1]), "--to", "infermax", "-o", str(im)]) == 0
    inst = evicting_instance()
    assert json.loads(im.read_text()) == json.loads(
        json.dumps(infermax_document(evicting_schedule(inst, UnitCost()), inst))
    )
    assert main(["convert", str(files[0]), str(im), "--to", "kvsched", "-o", str(back)]) == 0
    assert json.loads(back.read_text())["batches"] == json.loads(files[1].read_text())["batches"]
    assert main(["validate", str(files[0]), str(im)]) == 0


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("{not json", "not valid JSON"),
        (
            '{"schema_version": 1, "limits": {"kv_capacity": 4}, "requests": []}',
            "requests: List should have at least 1",
        ),
        (
            '{"schema_version": 1, "limits": {"kv_capacity": 4}, "requests": [{"id": "x", "arrival": 0, "prompt": 4, "output": 3}]}',
            "request 'x': needs 6 KV tokens",
        ),
        (
            '{"schema_version": 1, "limits": {"kv_capacity": 4}, "requests": [{"id": "x", "arrival": 0, "prompt": -2, "output": 1}]}',
            "requests.0.prompt",
        ),
    ],
)
def test_bad_input_is_one_line_without_traceback(tmp_path, content, expect):
    p = tmp_path / "x.json"
    p.write_text(content)
    proc = run_cli("info", p)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvsched info: error: ") and expect in lines[0]
    assert "Traceback" not in proc.stderr


def test_help_everywhere():
    for cmd in ([], ["generate"], ["info"], ["validate"], ["convert"]):
        proc = run_cli(*cmd, "--help")
        assert proc.returncode == 0 and "usage: kvsched" in proc.stdout


def test_missing_schedule_file(files):
    proc = run_cli("validate", files[0], "/nonexistent/s.json")
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["policies", "extra"], "policies"),
        (["info", "{i}", "extra"], "info"),
        (["validate", "{i}", "{s}", "--bogus"], "validate"),
        (["simulate", "{i}", "-p", "vllm", "x", "y"], "simulate"),
        (["generate", "synthetic", "extra"], "generate synthetic"),
    ],
)
def test_an_unrecognized_argument_is_the_error_of_its_command(files, capsys, argv, command):
    # argparse reported it from the top level ("kvsched: error: ...", "kvsched --help lists the options").
    names = {"{i}": str(files[0]), "{s}": str(files[1])}
    with pytest.raises(SystemExit) as exit_:
        main([names.get(word, word) for word in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvsched {command}: error: unrecognized arguments: "), err
    assert f"(kvsched {command} --help lists the options)" in err


def test_names_and_paths_with_brackets_are_printed_as_text_not_markup(files, tmp_path, capsys):
    # "[/]" once crashed rich (exit 3) after the file was written; "[red]" was eaten from the path shown.
    doc = json.loads(files[0].read_text())
    doc["name"] = "[/]boom[bold]"
    named = tmp_path / "q[" / "b]x.json"
    named.parent.mkdir()
    named.write_text(json.dumps(doc))
    assert main(["info", str(named)]) == 0
    assert "instance [/]boom[bold]" in capsys.readouterr().out
    out = tmp_path / "[red]o[/b].json"
    argv = ["generate", "infermax-grid", "--param", "prompt=8", "--param", "output=8", "--n", "1", "--out"]
    assert main([*argv, str(out)]) == 0
    assert f"wrote 1 request to {out}" in capsys.readouterr().err
    assert out.exists()


def test_the_readme_schedule_example_is_valid_for_the_readme_instance(tmp_path, capsys):
    # The two "tiny" blocks once disagreed: the schedule decoded r1 at 0, before it arrived and was prefilled.
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", readme, re.S)
    (tmp_path / "tiny.json").write_text(next(b for b in blocks if '"kvsched.instance"' in b))
    (tmp_path / "tiny_sched.json").write_text(next(b for b in blocks if '"kvsched.schedule"' in b))
    assert main(["validate", str(tmp_path / "tiny.json"), str(tmp_path / "tiny_sched.json")]) == 0
    assert "valid: 10 batches, 2 requests" in capsys.readouterr().out
