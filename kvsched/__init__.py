"""kvsched: provably optimal LLM-inference schedules, and every scheduler measured against them.

The nouns a script needs, from one place (as PyJobShop and PyVRP do)::

    import kvsched as kv

    inst = kv.load_instance(kv.example("figure15"))
    run = kv.simulate(inst, kv.make_policy("sarathi"))
    res = kv.solve(inst, formulation="batch", solver="cpsat")

See ``docs/api.md``. Names load on first use (module ``__getattr__``), so
``import kvsched`` stays light: the solvers (OR-Tools, HiGHS), matplotlib and
torch are imported only by what needs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.instances import EXAMPLES_DIR
from kvsched.lazy import lazy_names


def _version() -> str:
    """The installed distribution's version (``__version__``, looked up on first use: importlib.metadata
    and its email and zipfile imports cost every command ~20 ms)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsched")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


#: Public name -> the module that defines it (imported on first access).
_EXPORTS: dict[str, str] = {
    # errors and time budgets
    "KvschedError": "kvsched.errors",
    "InputError": "kvsched.errors",
    "InfeasibleInstanceError": "kvsched.errors",
    "Deadline": "kvsched.stop",
    # instances
    "Instance": "kvsched.instances.model",
    "Request": "kvsched.instances.model",
    "Limits": "kvsched.instances.model",
    "TimeModel": "kvsched.instances.model",
    "load_instance": "kvsched.instances.io",
    "save_instance": "kvsched.instances.io",
    "load_csv_trace": "kvsched.instances.io",
    "generate": "kvsched.instances.generators",
    # schedules, the validator, metrics
    "Schedule": "kvsched.schedule.ir",
    "Batch": "kvsched.schedule.ir",
    "Run": "kvsched.schedule.ir",
    "Phase": "kvsched.schedule.ir",
    "load_schedule": "kvsched.schedule.io",
    "save_schedule": "kvsched.schedule.io",
    "Trace": "kvsched.schedule.validate",
    "replay": "kvsched.schedule.validate",
    "validate": "kvsched.schedule.validate",
    "ScheduleError": "kvsched.schedule.records",
    "Violation": "kvsched.schedule.records",
    "retime": "kvsched.schedule.retime",
    "RunMetrics": "kvsched.schedule.metrics",
    "request_metrics": "kvsched.schedule.metrics",
    "batch_metrics": "kvsched.schedule.metrics",
    "run_metrics": "kvsched.schedule.metrics",
    "print_summary": "kvsched.schedule.metrics",
    "SLO": "kvsched.schedule.serving",
    "ServingMetrics": "kvsched.schedule.serving",
    "parse_slo": "kvsched.schedule.serving",
    "serving_metrics": "kvsched.schedule.serving",
    "chrome_trace": "kvsched.schedule.perfetto",
    "write_chrome_trace": "kvsched.schedule.perfetto",
    # cost models
    "CostModel": "kvsched.costmodel",
    "make_cost_model": "kvsched.costmodel",
    "UnitCost": "kvsched.costmodel",
    "InfermaxLinear": "kvsched.costmodel",
    "HingeCost": "kvsched.costmodel",
    "StaircaseCost": "kvsched.costmodel",
    "RadTiling": "kvsched.costmodel",
    "Roofline": "kvsched.costmodel",
    "CalibratedCost": "kvsched.costmodel",
    # policies and the simulator
    "POLICIES": "kvsched.heuristics",
    "Policy": "kvsched.heuristics",
    "Decision": "kvsched.heuristics",
    "SchedulerView": "kvsched.heuristics",
    "SimResult": "kvsched.heuristics",
    "list_policies": "kvsched.heuristics",
    "make_policy": "kvsched.heuristics",
    "simulate": "kvsched.heuristics",
    "simulate_engines": "kvsched.heuristics",
    # exact solvers and bounds
    "solve": "kvsched.csp",
    "Result": "kvsched.csp",
    "SolveStatus": "kvsched.csp",
    "SolverOptions": "kvsched.csp",
    "Scope": "kvsched.csp",
    "Bound": "kvsched.csp",
    "OBJECTIVES": "kvsched.csp.objectives",
    "lower_bounds": "kvsched.csp.bounds",
    # studies
    "Comparison": "kvsched.analysis.compare",
    "compare": "kvsched.analysis.compare",
    "add_regret": "kvsched.analysis.compare",
    "plot_gantt": "kvsched.analysis.plots",
    "plot_kv": "kvsched.analysis.plots",
    "plot_cdfs": "kvsched.analysis.plots",
    "plot_anytime": "kvsched.analysis.plots",
    "save_figure": "kvsched.analysis.plots",
    "instance_report": "kvsched.analysis.report",
}


def example(name: str) -> Path:
    """The path of a bundled example instance, by name (``"figure15"``, ``"sharegpt-small"``, ...)."""
    path = EXAMPLES_DIR / f"{name}.json" if isinstance(name, str) else None
    if path is None or name.endswith(".schedule") or not path.is_file():
        known = sorted(p.stem for p in EXAMPLES_DIR.glob("*.json") if not p.stem.endswith(".schedule"))
        from kvsched.errors import InputError

        raise InputError(f"example: unknown example {name!r} (known: {', '.join(known)})")
    return path


_exported, _listed = lazy_names("kvsched", _EXPORTS, globals())


def __getattr__(name: str) -> Any:
    if name != "__version__":
        return _exported(name)  # imports the name's module, then keeps the name here
    value = globals()["__version__"] = _version()
    return value


def __dir__() -> list[str]:
    return sorted({*_listed(), "__version__"})


# Spelled out (not built from _EXPORTS) so that linters and IDEs read it; a test checks they agree.
__all__ = [
    "EXAMPLES_DIR",
    "OBJECTIVES",
    "POLICIES",
    "SLO",
    "Batch",
    "Bound",
    "CalibratedCost",
    "Comparison",
    "CostModel",
    "Deadline",
    "Decision",
    "HingeCost",
    "InfeasibleInstanceError",
    "InfermaxLinear",
    "InputError",
    "Instance",
    "KvschedError",
    "Limits",
    "Phase",
    "Policy",
    "RadTiling",
    "Request",
    "Result",
    "Roofline",
    "Run",
    "RunMetrics",
    "Schedule",
    "ScheduleError",
    "SchedulerView",
    "Scope",
    "ServingMetrics",
    "SimResult",
    "SolveStatus",
    "SolverOptions",
    "StaircaseCost",
    "TimeModel",
    "Trace",
    "UnitCost",
    "Violation",
    "__version__",
    "add_regret",
    "batch_metrics",
    "chrome_trace",
    "compare",
    "example",
    "generate",
    "instance_report",
    "list_policies",
    "load_csv_trace",
    "load_instance",
    "load_schedule",
    "lower_bounds",
    "make_cost_model",
    "make_policy",
    "parse_slo",
    "plot_anytime",
    "plot_cdfs",
    "plot_gantt",
    "plot_kv",
    "print_summary",
    "replay",
    "request_metrics",
    "retime",
    "run_metrics",
    "save_figure",
    "save_instance",
    "save_schedule",
    "serving_metrics",
    "simulate",
    "simulate_engines",
    "solve",
    "validate",
    "write_chrome_trace",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these load lazily
    __version__: str
    from kvsched.analysis.compare import Comparison, add_regret, compare
    from kvsched.analysis.plots import plot_anytime, plot_cdfs, plot_gantt, plot_kv, save_figure
    from kvsched.analysis.report import instance_report
    from kvsched.costmodel import (
        CalibratedCost,
        CostModel,
        HingeCost,
        InfermaxLinear,
        RadTiling,
        Roofline,
        StaircaseCost,
        UnitCost,
        make_cost_model,
    )
    from kvsched.csp import Bound, Result, Scope, SolverOptions, SolveStatus, solve
    from kvsched.csp.bounds import lower_bounds
    from kvsched.csp.objectives import OBJECTIVES
    from kvsched.errors import InfeasibleInstanceError, InputError, KvschedError
    from kvsched.heuristics import (
        POLICIES,
        Decision,
        Policy,
        SchedulerView,
        SimResult,
        list_policies,
        make_policy,
        simulate,
        simulate_engines,
    )
    from kvsched.instances.generators import generate
    from kvsched.instances.io import load_csv_trace, load_instance, save_instance
    from kvsched.instances.model import Instance, Limits, Request, TimeModel
    from kvsched.schedule.io import load_schedule, save_schedule
    from kvsched.schedule.ir import Batch, Phase, Run, Schedule
    from kvsched.schedule.metrics import (
        RunMetrics,
        batch_metrics,
        print_summary,
        request_metrics,
        run_metrics,
    )
    from kvsched.schedule.perfetto import chrome_trace, write_chrome_trace
    from kvsched.schedule.records import ScheduleError, Violation
    from kvsched.schedule.retime import retime
    from kvsched.schedule.serving import SLO, ServingMetrics, parse_slo, serving_metrics
    from kvsched.schedule.validate import Trace, replay, validate
    from kvsched.stop import Deadline
