"""Heuristic schedulers and the iteration-level simulator that runs them.

>>> from kvsched.heuristics import make_policy, simulate
>>> result = simulate(instance, make_policy("sarathi"))   # doctest: +SKIP

:func:`simulate` steps the semantic core with the batches a :class:`Policy`
returns; the policies of seed 003 (Table 1, Sec. 4.6, Sec. 6) are
configurations of :class:`InferMax` listed in :data:`POLICIES`.
"""

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
