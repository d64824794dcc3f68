"""Run a sweep: every unfinished cell of a spec, in parallel, each row committed as it finishes.

:func:`run_cell` does one cell through :func:`kvsched.analysis.compare` (so
every schedule went through the semantic core, which checks each batch as the
simulator or the solver's replay makes it, before its row exists) and returns the row. :func:`run_sweep` skips the cells already
in the database, runs the rest on a process pool (or in this process with one
worker, or on Ray), writes each row as it arrives, and shows a progress bar
with an ETA.

Errors: a :class:`~kvsched.errors.KvschedError` in a cell (an infeasible
generated instance, a policy that cannot run it) is a result like any other:
the row is written with ``status = 'error'`` and the reason. Anything else is a
bug; such a cell is reported and left unwritten, so a rerun tries it again.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
import platform
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kvsched import __version__
from kvsched.analysis.spec import Cell, SweepSpec
from kvsched.analysis.store import open_db
from kvsched.errors import InputError, KvschedError
from kvsched.instances.model import Instance, Limits, TimeModel
from kvsched.stop import Deadline

BACKENDS = ("process", "ray")
#: Python package whose version identifies each solver back end.
SOLVER_PACKAGES = {"highs": "highspy", "cbc": "pulp", "cpsat": "ortools"}


@dataclasses.dataclass(frozen=True, slots=True)
class SweepSummary:
    """What :func:`run_sweep` did."""

    total: int
    skipped: int
    written: int
    errors: int
    failed: tuple[tuple[str, str], ...]  # (cell name, reason) of cells that crashed and were not written
    seconds: float


def build_instance(config: dict[str, Any]) -> Instance:
    """The instance a cell's ``instance`` configuration describes."""
    if "file" in config:
        from kvsched.instances.io import load_instance

        inst = load_instance(config["file"], check_feasible=False)
        if config.get("kv_capacity") is not None:
            limits = dataclasses.replace(inst.limits, kv_capacity=int(config["kv_capacity"]))
            inst = dataclasses.replace(inst, limits=limits)
        return inst
    from kvsched.instances.generators import generate

    limits = Limits(kv_capacity=int(config["kv_capacity"]), **config["limits"])
    tm = config["time_model"]
    return generate(
        config["generator"],
        n=int(config["n"]),
        seed=int(config["seed"]),
        limits=limits,
        time_model=TimeModel(tm["name"], dict(tm["params"])),
        **config["params"],
    )


def _solver_version(name: str) -> str:
    package = SOLVER_PACKAGES.get(name, name)
    try:
        return f"{package} {version(package)}"
    except PackageNotFoundError:
        return package


def _base_row(cell: Cell) -> dict[str, Any]:
    inst = cell.instance
    return {
        "key": cell.key,
        "instance_key": cell.instance_key,
        "sweep": cell.sweep,
        "kind": cell.runner["kind"],
        "name": cell.runner["name"],
        "generator": inst.get("generator"),
        "n": inst.get("n"),
        "seed": inst.get("seed"),
        "kv_capacity": inst.get("kv_capacity"),
        "objective_name": cell.objective,
        "config": cell.config,
        "kvsched_version": f"{__version__} (python {platform.python_version()})",
        "solver_version": None,
    }


def run_cell(cell: Cell) -> dict[str, Any]:
    """Run one cell and return its database row.

    A :class:`KvschedError` becomes a row with ``status = 'error'``; anything
    else propagates. A solver cell's ``time_limit`` bounds the whole cell, from
    building its instance through the warm-start policies to the validated
    result (one :class:`~kvsched.stop.Deadline`); its row records the
    ``scope`` and ``bound_source`` of the result.
    """
    from kvsched.analysis.compare import compare
    from kvsched.csp import SolverOptions
    from kvsched.heuristics.own import is_file_ref, load_policy_file
    from kvsched.schedule.serving import parse_slo, time_unit

    row = _base_row(cell)
    runner = cell.runner
    t0 = time.perf_counter()
    try:
        deadline = Deadline.after(runner["time_limit"]) if runner["kind"] == "solver" else None
        instance = build_instance(cell.instance)
        if "file" in cell.instance:
            row["n"] = len(instance)
            row["kv_capacity"] = instance.limits.kv_capacity
        instance.check_feasible()
        # --slo of the sweep (in the runner, not in the key): goodput in the row's metrics.
        slo = parse_slo(runner["slo"], time_unit(instance)) if runner.get("slo") else None
        if runner["kind"] == "policy":
            policy, params = runner["policy"], {runner["policy"]: runner["params"]}
            if is_file_ref(policy):  # a scheduler of one's own (FILE.py:CLASS), built in this process
                policy, params = load_policy_file(policy, runner["params"]), {}
            cmp = compare(
                instance, [policy], objective=cell.objective, solver=None, policy_params=params, slo=slo
            )
            key = cmp.table.index[0]
            line = cmp.table.loc[key]
            if isinstance(line.get("error"), str):
                raise KvschedError(line["error"])
            metrics = cmp.metrics[key]
            serving = cmp.serving[key]
            row.update(status="ok", objective=float(line["objective"]), runtime=float(line["runtime_s"]))
        else:
            options = SolverOptions(
                time_limit=runner["time_limit"],
                threads=runner["threads"],
                gap=runner["gap"],
                seed=runner["seed"],
            )
            # Warm starts of one's own (FILE.py:CLASS) are built in this process, as a policy cell's.
            warm = [load_policy_file(w, {}) if is_file_ref(w) else w for w in runner["warm_start"]]
            cmp = compare(
                instance,
                warm,
                objective=cell.objective,
                solver=runner["solver"],
                formulation=runner["formulation"],
                slo=slo,
                options=options,
                deadline=deadline,
            )
            result = cmp.result
            assert result is not None
            label = next(k for k in cmp.metrics if k.startswith("optimum"))
            metrics = cmp.metrics[label]
            serving = cmp.serving[label]
            row.update(
                status=str(result.status),
                objective=result.objective,
                bound=result.best_bound,
                scope=str(result.scope),
                bound_source=result.bound_source,
                gap=result.gap,
                runtime=result.runtime,
                anytime=[[p.time, p.incumbent, p.bound] for p in result.anytime],
                solver_version=_solver_version(runner["solver"]),
            )
        row["lower_bound"] = cmp.lower_bound
        # The run's rates are left to the serving metrics, whose names say their unit.
        row["metrics"] = {**metrics.to_dict(rates=False), **serving.to_dict()}
    except KvschedError as exc:
        row.update(status="error", error=str(exc), runtime=time.perf_counter() - t0)
    row["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    return row


def _guarded(cell: Cell) -> tuple[Cell, dict[str, Any] | None, str | None]:
    """Run a cell in a worker: (cell, row, None), or (cell, None, reason) for a crash."""
    try:
        return cell, run_cell(cell), None
    except Exception as exc:  # a bug: report it, do not store it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return cell, None, f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"


Outcome = tuple[Cell, dict[str, Any] | None, str | None]


def _inline(cells: list[Cell]) -> Iterator[Outcome]:
    for cell in cells:
        yield _guarded(cell)


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker as soon as the sweep process that started it is gone.

    A killed sweep (SIGKILL, a closed terminal, a CI timeout) runs no clean-up, and its
    workers would go on solving for no one. On Linux the kernel kills the worker with its
    parent (``PR_SET_PDEATHSIG``); everywhere, a watcher thread ends it within half a second.
    """
    if platform.system() == "Linux":
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the watcher below still ends the worker
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:  # the parent died while this worker started
        os._exit(1)
    threading.Thread(target=watch, name="kvsched-parent-watch", daemon=True).start()
    # Ctrl-C reaches the whole process group: the sweep process decides (it ends the workers), and a
    # worker never prints a KeyboardInterrupt traceback of its own. SIGINT was blocked while it started
    # (see _process_pool): ignored now, any pending one is dropped when it is unblocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


#: prctl option: the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def make_pool(workers: int) -> cf.ProcessPoolExecutor:
    """The worker pool of a sweep; its workers die with this process."""
    # spawn: the parent holds threads (the progress bar, HiGHS's pool), which fork would copy mid-flight.
    ctx = multiprocessing.get_context("spawn")
    return cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_die_with_parent, initargs=(os.getpid(),)
    )


def _process_pool(cells: list[Cell], workers: int) -> Iterator[Outcome]:
    pool = make_pool(workers)
    finished = False
    try:
        # The workers start inside submit(): with SIGINT blocked, a Ctrl-C while one is still importing
        # stays pending in it (it inherits the mask) instead of printing its traceback.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            futures = [pool.submit(_guarded, c) for c in cells]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for fut in cf.as_completed(futures):
            yield fut.result()
        finished = True
    finally:
        if not finished:
            # Ctrl-C (or a consumer that stopped): the cells in flight are not waited for (that took 11 s,
            # and once hung for ten minutes joining idle workers); the finished ones are in the database.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)


def _ray(cells: list[Cell], workers: int, address: str | None) -> Iterator[Outcome]:
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray needs Ray: pip install 'kvsched[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(_guarded)
        pending = [remote.remote(c) for c in cells]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def run_sweep(
    spec: SweepSpec,
    db_path: str | Path,
    *,
    workers: int = 2,
    backend: str = "process",
    address: str | None = None,
    base: Path | None = None,
    progress: bool = True,
    console: Console | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    slo: str | None = None,
) -> SweepSummary:
    """Run every cell of ``spec`` not yet in the database at ``db_path``.

    Parameters
    ----------
    workers
        Parallel workers (1: run in this process).
    backend
        ``process`` (a local process pool) or ``ray`` (a local Ray instance, or
        the cluster at ``address``).
    base
        Folder that relative instance-file and ``FILE.py:CLASS`` paths in the spec are relative to (None:
        the working directory). The cells' keys do not depend on it: a file is keyed by its content.
    on_row
        Called after each row is committed.
    slo
        ``ttft=V,tpot=V,e2el=V`` (``--slo``): the goodput of every cell this run
        computes is under these SLOs (recorded in its metrics as ``slo_ttft``, ...).
        Cells already in the database keep theirs: the SLOs are not part of the key.
    """
    if not isinstance(spec, SweepSpec):
        raise InputError(
            f"spec: expected a SweepSpec (kvsched.analysis.spec.load_spec or parse_spec), got {type(spec).__name__}"
        )
    if backend not in BACKENDS:
        raise InputError(f"--backend: unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise InputError(f"workers: expected an integer, got {type(workers).__name__}")
    if workers < 1:
        raise InputError("--workers: must be at least 1")
    t0 = time.perf_counter()
    cells = spec.cells(base)
    console = console or Console(stderr=True)
    written = errors = 0
    failed: list[tuple[str, str]] = []
    with open_db(db_path, create=True) as db:
        done = db.finished()
        todo = [c for c in cells if c.key not in done]
        skipped = len(cells) - len(todo)
        # Every cell of the spec is one of this sweep's, the ones another sweep already wrote too, so
        # --sweep NAME finds them all (the row's sweep column keeps the name of the sweep that wrote it).
        db.add_to_sweep(spec.name, [c.key for c in cells])
        if slo is not None:
            todo = [dataclasses.replace(c, runner={**c.runner, "slo": slo}) for c in todo]
        outcomes: Iterable[Outcome]
        if backend == "ray":
            outcomes = _ray(todo, workers, address)
        elif workers == 1 or len(todo) <= 1:
            outcomes = _inline(todo)
        else:
            outcomes = _process_pool(todo, workers)
        bar = _progress(console)
        task = bar.add_task(f"sweep {spec.name}", total=len(todo))
        with bar if progress else nullcontext():
            for cell, row, reason in outcomes:
                if row is None:
                    failed.append((f"{cell.runner['name']} on {_describe(cell)}", reason or "crashed"))
                else:
                    db.write(row)
                    written += 1
                    errors += row["status"] == "error"
                    if on_row is not None:
                        on_row(row)
                bar.advance(task)
    return SweepSummary(len(cells), skipped, written, errors, tuple(failed), time.perf_counter() - t0)


def _describe(cell: Cell) -> str:
    inst = cell.instance
    if "file" in inst:
        return inst["file"]
    return f"{inst['generator']} n={inst['n']} M={inst['kv_capacity']} seed={inst['seed']} {inst['params']}"
