"""Incumbents: complete schedules, fast, for instances of any size (each replayed through the core).

* :func:`greedy` -- the eviction-aware priority greedy (any rule, or external keys);
* :func:`best_incumbent` -- the best of the greedy variants and the fast registered policies;
* :func:`improve` -- large-neighbourhood search over the greedy's priorities, windows re-ordered and re-simulated;
* :func:`window_search` -- windows of a schedule re-solved exactly with CP-SAT against the residual the
  frozen rest leaves (unit time, no budget; a tool, not run by the pipeline: see its module).
"""

from kvsched.csp.incumbents.base import Incumbent
from kvsched.csp.incumbents.best import (
    FAST_POLICIES,
    VARIANTS,
    Variant,
    best_incumbent,
    eviction_is_free,
    variant_kind,
)
from kvsched.csp.incumbents.greedy import decide, greedy
from kvsched.csp.incumbents.lns import improve
from kvsched.csp.incumbents.log import BatchLog
from kvsched.csp.incumbents.rules import RULES, kv_area, rule_keys
from kvsched.csp.incumbents.window import window_search

__all__ = [
    "FAST_POLICIES",
    "RULES",
    "VARIANTS",
    "BatchLog",
    "Incumbent",
    "Variant",
    "best_incumbent",
    "decide",
    "eviction_is_free",
    "greedy",
    "improve",
    "kv_area",
    "rule_keys",
    "variant_kind",
    "window_search",
]
