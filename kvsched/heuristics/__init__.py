"""Heuristic schedulers and the iteration-level simulator that runs them.

>>> from kvsched.heuristics import make_policy, simulate
>>> result = simulate(instance, make_policy("sarathi"))   # doctest: +SKIP

:func:`simulate` steps the semantic core with the batches a :class:`Policy`
returns; the policies of seed 003 (Table 1, Sec. 4.6, Sec. 6) are
configurations of :class:`InferMax` listed in :data:`POLICIES`.
"""

from typing import TYPE_CHECKING

from kvsched.lazy import lazy_names

#: Public name -> the module that defines it, imported on first use: ``kvsched simulate`` loads the
#: registry and the simulator, not the multi-engine dispatcher.
_WHERE = {
    "Decision": "kvsched.heuristics.base",
    "HindsightError": "kvsched.heuristics.base",
    "Policy": "kvsched.heuristics.base",
    "SchedulerView": "kvsched.heuristics.base",
    "FasterTransformer": "kvsched.heuristics.engines",
    "Orca": "kvsched.heuristics.engines",
    "VllmV1": "kvsched.heuristics.engines",
    "InferMax": "kvsched.heuristics.infermax",
    "KFCFS": "kvsched.heuristics.kfcfs",
    "MultiEngineResult": "kvsched.heuristics.multiengine",
    "simulate_engines": "kvsched.heuristics.multiengine",
    "ClassPriority": "kvsched.heuristics.priority",
    "RAD": "kvsched.heuristics.rad",
    "POLICIES": "kvsched.heuristics.registry",
    "PolicySpec": "kvsched.heuristics.registry",
    "list_policies": "kvsched.heuristics.registry",
    "make_policy": "kvsched.heuristics.registry",
    "SimResult": "kvsched.heuristics.simulator",
    "simulate": "kvsched.heuristics.simulator",
    "SLAI": "kvsched.heuristics.slai",
}


__getattr__, __dir__ = lazy_names("kvsched.heuristics", _WHERE, globals())


__all__ = [
    "KFCFS",
    "POLICIES",
    "RAD",
    "SLAI",
    "ClassPriority",
    "Decision",
    "FasterTransformer",
    "HindsightError",
    "InferMax",
    "MultiEngineResult",
    "Orca",
    "Policy",
    "PolicySpec",
    "SchedulerView",
    "SimResult",
    "VllmV1",
    "list_policies",
    "make_policy",
    "simulate",
    "simulate_engines",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these load lazily
    from kvsched.heuristics.base import Decision, HindsightError, Policy, SchedulerView
    from kvsched.heuristics.engines import FasterTransformer, Orca, VllmV1
    from kvsched.heuristics.infermax import InferMax
    from kvsched.heuristics.kfcfs import KFCFS
    from kvsched.heuristics.multiengine import MultiEngineResult, simulate_engines
    from kvsched.heuristics.priority import ClassPriority
    from kvsched.heuristics.rad import RAD
    from kvsched.heuristics.registry import POLICIES, PolicySpec, list_policies, make_policy
    from kvsched.heuristics.simulator import SimResult, simulate
    from kvsched.heuristics.slai import SLAI
