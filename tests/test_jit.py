"""Cold numba kernels under a deadline: compile only where it fits, else the interpreted path or no stage."""

import pytest

from kvsched import jit
from kvsched.cli import main
from kvsched.csp import SolverOptions, solve
from kvsched.csp.incumbents import _kernel, greedy
from kvsched.csp.incumbents.greedy import PY_SECONDS_PER_BATCH, interpreted_seconds
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.instances.sharegpt import sharegpt
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline


def _instance(n: int = 12) -> Instance:
    requests = tuple(Request(f"r{k}", float(k), 4 + k % 5, 3 + k % 4) for k in range(n))
    return Instance(requests, Limits(kv_capacity=32), TimeModel("unit"))


class _ColdKernel:
    """A kernel that was never compiled: calling it is the compile this test must not see."""

    signatures = ()

    def __call__(self, *args):
        raise AssertionError("compiled a cold kernel")


def test_a_kernel_that_ran_is_compiled():
    greedy(_instance())  # compiles or loads the cache
    assert jit.is_compiled(_kernel.advance_jit)


def test_use_compiled_weighs_the_compile_against_the_time_left(monkeypatch):
    cold, warm = _ColdKernel(), _kernel.advance_jit
    greedy(_instance())
    assert jit.use_compiled([warm], Deadline.after(0.01))
    assert not jit.use_compiled([cold, warm], Deadline.after(1.0))
    assert jit.use_compiled([cold], Deadline.after(jit.COMPILE_SECONDS + 5))
    assert jit.use_compiled([cold], Deadline.never())
    # A family is priced per cold kernel: two need twice the time.
    assert jit.compile_seconds([cold, warm, _ColdKernel()]) == 2 * jit.COMPILE_SECONDS
    assert not jit.use_compiled([cold, _ColdKernel()], Deadline.after(jit.COMPILE_SECONDS + 5))
    assert jit.use_compiled([cold, _ColdKernel()], Deadline.after(2 * jit.COMPILE_SECONDS + 5))
    # A cold kernel is still worth compiling where the interpreted path would take longer.
    assert jit.use_compiled([cold], Deadline.after(1.0), interpreted_seconds=2 * jit.COMPILE_SECONDS)


def test_a_cold_greedy_kernel_with_a_short_deadline_runs_interpreted(monkeypatch):
    inst = _instance()
    expected = greedy(inst)
    monkeypatch.setattr(_kernel, "advance_jit", _ColdKernel())
    got = greedy(inst, deadline=Deadline.after(2.0))  # the cold kernel would raise
    assert got.value == expected.value and replay(inst, got.schedule).ok
    with pytest.raises(AssertionError, match="compiled a cold kernel"):
        greedy(inst)  # no deadline: the compile is worth it (and cached for the next command)


def test_interpreted_estimate_is_low():
    inst = sharegpt(60, 3, Limits(kv_capacity=20_000))
    batches = greedy(inst).stats["batches"]
    assert 0 < interpreted_seconds(inst) <= PY_SECONDS_PER_BATCH * batches


def test_cold_lagrangian_kernels_with_a_short_limit_skip_the_stage(monkeypatch):
    inst = _instance(20)
    monkeypatch.setattr(jit, "is_compiled", lambda dispatcher: False)
    result = solve(
        inst, formulation="auto", options=SolverOptions(time_limit=3.0), deadline=Deadline.after(3.0)
    )
    assert "kernels are not compiled yet" in result.stats["lagrangian"]
    assert result.best_bound is not None and replay(inst, result.schedule).ok


def test_warmup_prints_one_line_per_kernel_family(capsys):
    assert main(["warmup"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "greedy",
        "knapsack-greedy",
        "chain-lagrangian",
        "seconds-lagrangian",
    ]
    assert all(" s, " in line for line in lines)


def test_solve_says_when_its_kernels_are_cold(monkeypatch, capsys):
    from kvsched.commands.warmup import note_cold_kernels

    note_cold_kernels("solve")
    assert capsys.readouterr().err == ""  # warm (the tests above ran them)
    monkeypatch.setattr(jit, "is_compiled", lambda dispatcher: False)
    note_cold_kernels("solve")
    err = capsys.readouterr().err
    assert err.startswith(
        "kvsched solve: note: the compiled kernels (greedy, knapsack-greedy, chain-lagrangian, seconds-lagrangian)"
    )
    assert "kvsched warmup" in err and err.count("\n") == 1


@pytest.mark.parametrize("objective", ["total-latency", "sum-ttft"])
@pytest.mark.parametrize("limit", [None, 5.0])
def test_the_chain_lagrangian_calls_only_the_kernels_its_guard_checks(monkeypatch, objective, limit):
    # The guard (use_compiled over compiled_kernels) and `kvsched warmup` both read compiled_kernels: a kernel
    # the Lagrangian calls but that list leaves out is compiled inside a time-limited solve. price_contiguous
    # once was, and a warm 8 s pipeline took 10.5 s.
    from kvsched.commands.warmup import FAMILIES
    from kvsched.csp.bounds import _block_kernels, _chain_kernels, chain_lagrangian
    from kvsched.csp.bounds.chain import compiled_kernels

    guarded = {k.py_func.__name__ for k in compiled_kernels(objective)}
    warmed = {k.py_func.__name__ for k in FAMILIES["chain-lagrangian"][0]()}
    called: set[str] = set()
    for module in (_chain_kernels, _block_kernels):
        for name in ("price_chains", "chain_loads", "band_widths", "price_contiguous", "price_blocks"):
            kernel = getattr(module, name, None)
            if kernel is not None:

                def spy(*args, kernel=kernel, name=name):
                    called.add(name)
                    return kernel(*args)

                monkeypatch.setattr(module, name, spy)
    deadline = None if limit is None else Deadline.after(limit)
    for spans in (None, ()):  # the default (a time-limited small instance prices slots alone) and slots only
        chain_lagrangian(_instance(), objective, max_iterations=4, deadline=deadline, spans=spans)
    assert called and called <= guarded <= warmed
