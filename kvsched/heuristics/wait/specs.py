"""Seed 002's registry entries (merged into :data:`kvsched.heuristics.registry.POLICIES`)."""

from __future__ import annotations

from types import MappingProxyType

from kvsched.heuristics.spec import PolicySpec
from kvsched.heuristics.wait.adaptive import AdaptiveNestedWAIT, AdaptiveWAIT
from kvsched.heuristics.wait.gated import WAIT
from kvsched.heuristics.wait.nested import NestedWAIT

_SOURCE = "seed 002"

#: Seed 002's policies, to merge into :data:`kvsched.heuristics.registry.POLICIES`.
SEED002_POLICIES: dict[str, PolicySpec] = {
    "wait": PolicySpec(
        "wait",
        WAIT,
        "WAIT (known output lengths): one type per distinct (I, O); a type runs only when >= n_j of its "
        "requests wait for prefill, and then advances min(n_j, count) requests from every stage; other "
        "types pause with KV kept. Thresholds from the fluid equilibrium (n_j = ceil(lambda_j dT*)), or the "
        "largest that fit M when overloaded; 'paper' / 'code' give §6.1's formulas. Rates estimated from "
        "the instance; Eq. (1) (d0, d1) from its time model. Once every request has arrived the thresholds "
        "are dropped (drain; not in the paper). Hindsight: needs each request's true O (its type).",
        _SOURCE + " §4, Algorithm 1; §3 fluid model",
        MappingProxyType({"types": "io", "thresholds": "fluid", "margin": 0.0}),
    ),
    "nested-wait": PolicySpec(
        "nested-wait",
        NestedWAIT,
        "Nested WAIT (unknown output lengths): output-length bins (<= 10; distinct lengths or equal-width "
        "bins) cut the stages into nested segments; segments 1..K run, K the longest prefix whose entry "
        "queues hold >= n_k, each advancing min(n_k, count) requests per stage. n_k proportional to the "
        "tail rates Lambda_k (1 + eps)^(k-1), sized from the fluid equilibrium plus Theorem 2's safety "
        "buffer. Overflow evicts LIFO by admission (recompute). Drain rule as WAIT. The design reads the "
        "instance's output distribution (design=outputs, hindsight at design time only); "
        "design=predicted/given do not.",
        _SOURCE + " §5, Algorithm 2, Theorem 2",
        MappingProxyType({"design": "outputs", "segments": 10, "thresholds": "fluid", "eps": 0.05}),
    ),
}

#: Seed 002 §7's extensions, merged into the registry next to :data:`SEED002_POLICIES`.
SEED002_EXTENSIONS: dict[str, PolicySpec] = {
    "wait-adaptive": PolicySpec(
        "wait-adaptive",
        AdaptiveWAIT,
        "WAIT for time-varying arrival rates: before each batch the per-type rates are re-estimated from "
        "the last `window` arrivals (or read from a known piecewise-constant `schedule`) and, when they "
        "moved by more than `tolerance`, the thresholds are re-solved from the fluid equilibrium as in "
        "wait (the paper's 're-solving the fluid equilibrium'; the estimator is ours). Hindsight: needs "
        "each request's true O (its type), as wait.",
        _SOURCE + " §7.1, §8.1; §4 Algorithm 1",
        MappingProxyType({"types": "io", "thresholds": "fluid", "window": 200, "tolerance": 0.1}),
    ),
    "nested-wait-adaptive": PolicySpec(
        "nested-wait-adaptive",
        AdaptiveNestedWAIT,
        "Nested WAIT for time-varying arrival rates: the total arrival rate is re-estimated from the last "
        "`window` arrivals, the segment rates are the design's mix scaled to it, and the thresholds are "
        "re-sized as in nested-wait when the rates moved by more than `tolerance` (types are unknown at "
        "arrival, so the mix is not re-estimated; our reading). Design as nested-wait (segments=auto: "
        "§7.2's segment design).",
        _SOURCE + " §7.1, §8.1; §5 Algorithm 2",
        MappingProxyType(
            {"design": "outputs", "segments": 10, "thresholds": "fluid", "eps": 0.05, "window": 200}
        ),
    ),
}
