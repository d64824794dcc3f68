"""CBC, run as a child process that ends at the deadline.

The model goes to CBC as an MPS file (written by HiGHS, indicators as big-M
rows) with the warm start as a CBC solution file (``-mips``). CBC's own
``-sec`` limit is not a wall clock (it counts from after its preprocessing and
has been seen to run 72 s for a 30 s limit), so the process gets SIGINT at the
deadline (CBC then stops and writes its best solution) and is killed if it has
not exited shortly after.

Bound semantics: CBC's solution file states only its status and objective, not
its dual bound, so a bound is reported only when CBC proves optimality (then it
is the objective, at the gap it was given).

Values: the text solution file prints each value to 8 significant digits (an
arrival at 123,456,789 slots reads back as 123,456,790, and a time of 0.0113920195
s as 0.01139202), so the values come from CBC's binary solution (``-saveSolution``,
full doubles) and the text file gives only the status line.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kvsched.csp.backends.highs import write_model
from kvsched.csp.backends.options import RawSolution, SolverOptions
from kvsched.csp.model import LinearModel
from kvsched.csp.result import SolveStatus
from kvsched.errors import InputError
from kvsched.stop import Deadline

#: Seconds CBC gets after SIGINT to write its solution before it is killed.
KILL_AFTER = 0.5


def cbc_path() -> str:
    """The CBC binary that PuLP ships."""
    import pulp

    path = pulp.PULP_CBC_CMD().path
    if not path or not Path(path).exists():
        raise InputError("--solver cbc: PuLP's CBC binary is missing (pip install 'pulp>=3.3,<4')")
    return path


def _write_start(path: Path, hint: np.ndarray, integer: list[bool]) -> None:
    lines = ["Stopped on time - objective value 0\n"]
    for k, (v, is_int) in enumerate(zip(hint, integer, strict=True)):
        value = round(float(v)) if is_int else float(v)
        lines.append(f"{k:>7} c{k} {value!r} 0\n")
    path.write_text("".join(lines))


def _read_solution(path: Path, binary: Path, n: int) -> tuple[str, np.ndarray | None]:
    """CBC's status line (from the text solution ``path``) and its values (from the ``binary`` one;
    None without a solution)."""
    if not path.exists():
        return "", None
    lines = path.read_text().splitlines()
    if not lines:
        return "", None
    head = lines[0].strip()
    if "objective value" not in head or head.startswith("Infeasible"):
        return head, None
    return head, _read_binary(binary, n)


def _read_binary(path: Path, n: int) -> np.ndarray | None:
    """The column values of CBC's binary solution file: two int32 (rows r, columns c), the objective, then
    float64 row activities (r), row duals (r), column values (c) and reduced costs (c)."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    if len(raw) < 16:
        return None
    rows, cols = np.frombuffer(raw[:8], dtype=np.int32)
    values = np.frombuffer(raw[16:], dtype=np.float64)
    if cols != n or values.size < 2 * rows + cols:  # not this model's: no solution rather than a wrong one
        return None
    return values[2 * rows : 2 * rows + cols].copy()


def solve_cbc(model: LinearModel, options: SolverOptions, deadline: Deadline) -> RawSolution:
    """Solve with CBC in a child process, warm-started from ``model.hint``, ended at ``deadline``."""
    binary = cbc_path()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvsched-cbc-") as tmp:
        d = Path(tmp)
        mps, mst, sol, full = d / "model.mps", d / "start.mst", d / "solution.txt", d / "solution.bin"
        write_model(model, str(mps))
        args = [binary, str(mps)]
        if model.hint is not None:
            _write_start(mst, model.hint, model.integer)
            args += ["-mips", str(mst)]
        if deadline.bounded:
            args += ["-sec", f"{max(0.01, deadline.remaining()):.3f}"]
        args += ["-threads", str(options.threads), "-randomSeed", str(max(1, options.seed))]
        if options.gap > 0:
            args += ["-ratioGap", str(options.gap)]
        args += ["-solve" if any(model.integer) else "-initialSolve", "-solution", str(sol)]
        args += ["-saveSolution", str(full)]  # the values in full precision (see the module's docstring)
        out = None if options.log else subprocess.DEVNULL
        proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        stopped = ""
        try:
            proc.wait(timeout=deadline.remaining() if deadline.bounded else None)
        except subprocess.TimeoutExpired:
            stopped = "deadline"
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # CBC stops and writes its best solution
                try:
                    proc.wait(timeout=KILL_AFTER)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=KILL_AFTER)
        head, x = _read_solution(sol, full, model.num_vars)
    runtime = time.perf_counter() - start
    obj = model.objective_value(x) if x is not None else None
    if head.startswith("Optimal") and not stopped:
        # At a positive gap CBC's "optimal" only means "within the gap": no bound then.
        return RawSolution(SolveStatus.OPTIMAL, x, obj, obj if options.gap == 0 else None, runtime)
    if head.startswith("Infeasible") and not stopped:
        return RawSolution(SolveStatus.INFEASIBLE, None, None, None, runtime)
    status = SolveStatus.FEASIBLE if x is not None else SolveStatus.UNKNOWN
    return RawSolution(status, x, obj, None, runtime, stopped=stopped or "limit")
