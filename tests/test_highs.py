"""HiGHS runs end by their deadline even where HiGHS checks neither its time limit nor its callbacks."""

import time
from types import SimpleNamespace

import numpy as np
import pytest

import kvsched.csp.backends.highs as backend
import kvsched.highs as highs
from kvsched.csp import Deadline, SolverOptions, SolveStatus, solve
from kvsched.csp.model import LinearModel
from kvsched.instances.model import Instance, Limits, Request, TimeModel


class _Callback:
    def __init__(self) -> None:
        self.subscribers = []

    def subscribe(self, f) -> None:
        self.subscribers.append(f)


def _deaf_highs(seconds: float):
    """A stand-in for a HiGHS instance inside presolve: it runs ``seconds`` and polls no callback."""
    h = SimpleNamespace(
        cbSimplexInterrupt=_Callback(), cbIpmInterrupt=_Callback(), cbMipInterrupt=_Callback(), ran=[]
    )

    def run():
        time.sleep(seconds)
        h.ran.append(True)
        return "ok"

    h.run = run
    return h


def test_a_run_that_polls_nothing_is_left_behind_at_the_deadline():
    h = _deaf_highs(1.5)
    start = time.perf_counter()
    assert highs.run_highs(h, Deadline.after(0.2)) is None
    assert time.perf_counter() - start < 0.2 + highs.OVERRUN_GRACE + 0.3
    # The next run waits for it: HiGHS runs share one thread pool.
    assert not h.ran
    assert highs.settle()
    assert h.ran


def test_a_run_within_its_deadline_returns_its_status_and_subscribes_the_interrupts():
    h = _deaf_highs(0.01)
    assert highs.run_highs(h, Deadline.after(5.0)) == "ok"
    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        (check,) = callback.subscribers
        event = SimpleNamespace(interrupted=False)
        event.interrupt = lambda event=event: setattr(event, "interrupted", True)
        check(event)
        assert not event.interrupted  # the deadline is still ahead


def test_a_real_milp_stops_by_its_deadline():
    # A knapsack-like model HiGHS cannot finish in 0.3 s on most machines; either way it is back in time.
    m = LinearModel()
    rng = np.random.default_rng(0)
    xs = [m.add_var(f"x{k}", 0, 1, obj=-float(v)) for k, v in enumerate(rng.integers(50, 100, 400))]
    for _ in range(30):
        m.add_row(xs, rng.integers(1, 60, len(xs)).astype(float), -np.inf, 2_000.0)
    start = time.perf_counter()
    raw = backend.solve_highs(m, SolverOptions(threads=1), Deadline.after(0.3))
    assert time.perf_counter() - start < 0.3 + highs.OVERRUN_GRACE + 0.5
    assert raw.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE, SolveStatus.UNKNOWN)


def test_presolve_is_off_for_a_model_too_large_for_the_time_left(monkeypatch):
    # Same answer without presolve: only the time it may take changes.
    m = LinearModel()
    xs = [m.add_var(f"x{k}", 0, 3, obj=-1.0) for k in range(4)]
    m.add_row(xs, [2.0, 3.0, 4.0, 5.0], -np.inf, 11.0)
    seen = []
    real = backend.highs_model

    def spy(model):
        h = real(model)
        original = h.setOptionValue
        h.setOptionValue = lambda name, value: (seen.append((name, value)), original(name, value))[1]
        return h

    monkeypatch.setattr(backend, "highs_model", spy)
    on = backend.solve_highs(m, SolverOptions(threads=1), Deadline.after(30.0))
    assert ("presolve", "off") not in seen
    monkeypatch.setattr(backend, "PRESOLVE_NONZEROS_PER_SECOND", 0.01)
    off = backend.solve_highs(m, SolverOptions(threads=1), Deadline.after(30.0))
    assert ("presolve", "off") in seen
    assert on.status == off.status == SolveStatus.OPTIMAL and on.objective == pytest.approx(off.objective)


def test_a_solve_whose_back_end_is_left_behind_returns_its_schedule_and_no_back_end_bound(monkeypatch):
    inst = Instance(
        (Request("a", 0.0, 2, 3), Request("b", 0.0, 1, 2), Request("c", 1.0, 3, 2)),
        Limits(kv_capacity=6),
        TimeModel("unit"),
    )
    monkeypatch.setattr(backend, "run_highs", lambda h, deadline: None)
    result = solve(inst, formulation="batch", solver="highs", options=SolverOptions(time_limit=20, threads=1))
    assert result.schedule is not None and result.status == SolveStatus.FEASIBLE
    assert result.stopped == "deadline"
    assert all(b.source != "highs" for b in result.bounds)


def test_a_run_waits_for_one_left_behind_only_until_its_own_deadline():
    slow = _deaf_highs(1.5)
    assert highs.run_highs(slow, Deadline.after(0.05)) is None  # left behind
    start = time.perf_counter()
    nxt = _deaf_highs(0.01)
    assert highs.run_highs(nxt, Deadline.after(0.2)) is None  # the pool is still busy at its deadline
    assert time.perf_counter() - start < 0.2 + 0.3 and not nxt.ran
    highs.settle()
    assert slow.ran and highs.run_highs(nxt, Deadline.after(5.0)) == "ok"


def test_a_forked_child_runs_highs_on_its_own_thread():
    import os

    from kvsched.highs import new_highs

    def solve_lp() -> float:
        h = new_highs(1)
        h.addVars(2, np.zeros(2), np.ones(2))
        h.changeColsCost(2, np.arange(2, dtype=np.int32), np.array([-1.0, -2.0]))
        assert highs.run_highs(h, Deadline.after(10.0)) is not None
        return h.getInfo().objective_function_value

    assert solve_lp() == -3.0  # the parent's worker thread exists before the fork
    pid = os.fork()
    if pid == 0:  # the child: its own worker, or this would wait forever on the parent's
        os._exit(0 if solve_lp() == -3.0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_run_left_behind_is_busy_until_it_ends_and_an_exit_waits_for_it():
    h = _deaf_highs(1.0)
    assert highs.run_highs(h, Deadline.after(0.1)) is None
    assert highs.busy()
    highs._settle_at_exit()  # what the interpreter runs at exit
    assert h.ran and not highs.busy()


_LEFT_BEHIND = """
import sys, time
sys.path.insert(0, {tests!r})
from test_highs import _deaf_highs
import kvsched.highs as highs
from kvsched.stop import Deadline
assert highs.run_highs(_deaf_highs({seconds}), Deadline.after(0.05)) is None
print("left behind", flush=True)
{end}
"""


@pytest.mark.parametrize(
    ("end", "waits"),
    [("", True), ("from kvsched.cli import _leave; _leave(3)", False)],
    ids=["a script waits for it", "a command leaves without it"],
)
def test_how_a_process_ends_beside_a_run_left_behind(end, waits):
    # A script's exit waits for the run: its thread, back from C++ into a finalising interpreter, would
    # abort the process (exit status 134). A command ends with os._exit, which ends the run with it.
    import subprocess
    import sys
    from pathlib import Path

    code = _LEFT_BEHIND.format(tests=str(Path(__file__).parent), seconds=3.0, end=end)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - start
    assert "left behind" in done.stdout, done.stderr
    assert done.returncode == (0 if waits else 3), done.stderr
    if waits:
        assert took >= 3.0
    else:
        assert took < 3.0
