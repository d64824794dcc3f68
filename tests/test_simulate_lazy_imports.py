"""``kvsched simulate`` without a progress bar does not import rich's progress modules (4 ms a command)."""

import subprocess
import sys

_WRAPPER = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write(f"@@progress {'rich.progress' in sys.modules}\\n"))
sys.argv = ["kvsched", *sys.argv[1:]]
runpy.run_module("kvsched.cli", run_name="__main__", alter_sys=True)
"""


def test_simulate_without_a_bar_leaves_rich_progress_unimported(tmp_path):
    trace = tmp_path / "trace.csv"
    rows = [f"{0.5 * k},{3 + k % 5},{2 + k % 7}" for k in range(20)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    args = ["simulate", str(trace), "-p", "sarathi", "--kv-capacity", "64", "--no-progress"]
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "@@progress False" in out.stderr
