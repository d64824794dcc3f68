"""What a command pays for outside its own work: its imports, the parser, loading, and the exit."""

import argparse
import ast
import importlib
import json
import subprocess
import sys

import pytest

from kvsched.cli import COMMAND_MODULES, COMMANDS, build_parser, main
from kvsched.commands.common import KEPT
from kvsched.errors import InfeasibleInstanceError
from kvsched.instances.model import Instance, Limits, Request


def test_the_commands_table_is_what_the_modules_register():
    registered = []
    for name in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"kvsched.commands.{name}").register(sub)
        registered += [(command, name) for command in sub.choices]
    assert registered == list(COMMANDS.items())
    full = build_parser()
    action = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert list(action.choices) == list(COMMANDS)


def test_a_command_imports_its_own_module_only():
    code = (
        "import sys; from kvsched.cli import build_parser; "
        "build_parser('simulate').parse_args(['simulate', 'x.csv', '-p', 'sarathi']); "
        "print(sorted(m for m in sys.modules if m.startswith('kvsched.commands.') or m == 'importlib.metadata'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = ast.literal_eval(out.stdout)
    assert loaded == ["kvsched.commands.common", "kvsched.commands.outputs", "kvsched.commands.simulate"]


def run_cli(*args, wrapper=""):
    """``python -m kvsched.cli ARGS`` (with ``wrapper``: run through runpy after that code, as the benchmark does)."""
    if wrapper:
        code = f"{wrapper}\nimport runpy, sys\nsys.argv = ['kvsched', *sys.argv[1:]]\n"
        code += "runpy.run_module('kvsched.cli', run_name='__main__', alter_sys=True)"
        cmd = [sys.executable, "-c", code, *map(str, args)]
    else:
        cmd = [sys.executable, "-m", "kvsched.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_version_and_help():
    import kvsched

    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"kvsched {kvsched.__version__}"
    out = run_cli("--help")
    assert out.returncode == 0 and all(f"    {name}" in out.stdout for name in COMMANDS)
    out = run_cli("simulat")
    assert out.returncode == 2 and "invalid choice: 'simulat'" in out.stderr and "'simulate'" in out.stderr
    # A usage error is one line, like every bad input, and says where the options are listed.
    out = run_cli("simulate", "x.json", "--engines", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("kvsched simulate: error: argument --engines")
    assert out.stderr.rstrip().endswith("(kvsched simulate --help lists the options)")


@pytest.fixture
def trace_csv(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [f"{0.5 * k},{3 + k % 5},{2 + k % 7}" for k in range(40)]
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    return path


def test_simulate_leaves_after_the_atexit_handlers_and_the_output(trace_csv, tmp_path):
    # The command line ends without freeing the trace, but as an exit would: every line written,
    # the --json file complete, and the atexit handlers (the benchmark's peak memory) run.
    doc = tmp_path / "summary.json"
    flags = ["--kv-capacity", 64, "-C", 16, "--json", doc, "--no-progress"]
    wrapper = "import atexit, sys\natexit.register(lambda: sys.stderr.write('@@atexit ran\\n'))"
    out = run_cli("simulate", trace_csv, "-p", "sarathi", *flags, wrapper=wrapper)
    assert out.returncode == 0, out.stderr
    assert "@@atexit ran" in out.stderr
    assert out.stdout.rstrip().splitlines()[-1].startswith("simulated ")
    assert json.loads(doc.read_text())["num_completed"] == 40
    again = run_cli("simulate", trace_csv, "-p", "sarathi", *flags[:-3], "--no-progress")
    lines = [line for line in out.stdout.splitlines() if not line.startswith("simulated ")]
    assert lines == [line for line in again.stdout.splitlines() if not line.startswith("simulated ")]


def test_simulate_from_python_keeps_nothing(trace_csv):
    assert main(["simulate", str(trace_csv), "-p", "sarathi", "--kv-capacity", "64", "--no-progress"]) == 0
    assert KEPT == []


def test_simulate_pauses_the_collector_for_its_outputs(trace_csv, monkeypatch):
    # The trace lives to the end of the command: the cyclic collector does not walk it while the
    # metrics and tables are made (a full pass costs ~0.4 s at 100,000 requests), and runs again after.
    import gc

    from kvsched.schedule import metrics

    seen = []
    real = metrics.print_summary
    monkeypatch.setattr(
        metrics, "print_summary", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k)
    )
    assert gc.isenabled()
    assert main(["simulate", str(trace_csv), "-p", "sarathi", "--kv-capacity", "64", "--no-progress"]) == 0
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(metrics, "print_summary", lambda *a, **k: 1 / 0)  # a failing command too
    assert main(["simulate", str(trace_csv), "-p", "sarathi", "--kv-capacity", "64", "--no-progress"]) == 3
    assert gc.isenabled()


def test_bad_input_is_still_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,x\n")
    out = run_cli("simulate", bad, "-p", "sarathi", "--kv-capacity", 64)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("kvsched simulate: error: ")


@pytest.mark.parametrize(
    ("capacity", "block", "peak", "need"),
    [(8, 1, 8, None), (8, 1, 9, 9), (10, 4, 8, None), (10, 4, 9, 12), (12, 4, 12, None), (11, 4, 9, 12)],
)
def test_check_feasible_in_whole_blocks(capacity, block, peak, need):
    # The quick pass over I + O - 1 and the loop that names the request agree on every boundary.
    reqs = (Request("a", 0.0, 2, 2), Request("b", 0.0, peak - 3, 4))
    inst = Instance(reqs, Limits(kv_capacity=capacity, block_size=block))
    if need is None:
        inst.check_feasible()
        return
    with pytest.raises(InfeasibleInstanceError, match=f"request 'b': needs {peak} KV tokens") as err:
        inst.check_feasible()
    assert (f"{need} in blocks of {block}" in str(err.value)) == (need != peak)
