"""Named scheduling policies: seed 003's schedulers as :class:`InferMax` configurations.

Every entry is InferMax's Algorithm 1 with the flags of one row of seed 003
Table 1 (plus its eviction-free twin, suffix ``-ef``), one Sec. 4.6 ranking
scheduler, or the Sec. 6 scheduler. :func:`make_policy` builds one, with any
flag overridden by keyword.

Budgets: a policy uses the instance's C, P and ``max_running`` when set and its
own defaults otherwise (C = 4096, Llama-2-7B); a parameter may make a budget
stricter, never looser than the instance. SARATHI's P = 512 is such a stricter
token budget; "P = C" and "P = 4096" rows use ``prefill_budget=None`` (P = C, or
the instance's P).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvsched.errors import InputError
from kvsched.heuristics.base import Policy
from kvsched.heuristics.infermax import InferMax


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A registered policy.

    Parameters
    ----------
    name
        Registry name.
    factory
        Builds the policy from ``name=`` and keyword parameters.
    description
        What it does, and where the paper and real engines disagree.
    source
        Seed paper and section.
    defaults
        Parameters it runs with unless overridden.
    """

    name: str
    factory: Callable[..., Policy]
    description: str
    source: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def accepted(self) -> list[str]:
        """Parameter names :func:`make_policy` accepts for this policy."""
        sig = inspect.signature(self.factory)
        return [p for p in sig.parameters if p != "name"]


_TABLE1 = "seed 003 Sec. 3.1, Table 1"

#: Table 1 rows: name -> (flags, description).
_TABLE1_ROWS: dict[str, tuple[dict[str, Any], str]] = {
    "vllm": (
        dict(priority="prefill", hybrid=False, chunked=False, prefill_budget=None),
        "vLLM (v0 default): waiting prefills/refills first (FCFS), no hybrid batches, whole prompts, "
        "P = 4096 or the instance's P; a decode that does not fit evicts the latest-arrived running "
        "request, then itself. Real vLLM v0 also pads the token cap, keeps a watermark, caps "
        "max_num_seqs, keeps running requests in admission order and re-queues preempted ones at the "
        "front; the paper (followed here) does none of these.",
    ),
    "vllm-hy": (
        dict(priority="prefill", hybrid=True, chunked=False, prefill_budget=None),
        "vLLM_hy: vLLM with hybrid batching (waiting prefills first, then running decodes in the "
        "same batch). Not a configuration real vLLM v0 offers.",
    ),
    "sarathi": (
        dict(priority="decode", hybrid=True, chunked=True, prefill_budget=512),
        "SARATHI: running decodes first, then running chunked prefills, then waiting requests; "
        "hybrid batches; chunked prefill with token budget P = 512 counted over the whole batch "
        "(decodes included). Sarathi-Serve and Vidur preempt the newest running request and "
        "re-queue it at the front; the paper evicts the lowest-priority one and, by default here, "
        "re-queues it by arrival.",
    ),
    "sarathi-pc": (
        dict(priority="decode", hybrid=True, chunked=True, prefill_budget=None),
        "SARATHI_{P=C}: SARATHI with P = C (4096 by default), so up to C prefill tokens a batch.",
    ),
    "sarathi-nocp": (
        dict(priority="decode", hybrid=True, chunked=False, prefill_budget=None),
        "SARATHI_nocp: SARATHI without chunked prefill (whole prompts), P = 4096.",
    ),
    "sarathi-nohy": (
        dict(priority="decode", hybrid=False, chunked=False, prefill_budget=None),
        "SARATHI_nohy: decode priority without hybrid batches or chunking, P = 4096: any running "
        "decode forces a decode-only batch (Sec. 4.2).",
    ),
}


def _entries() -> dict[str, PolicySpec]:
    out: dict[str, PolicySpec] = {}
    for name, (flags, text) in _TABLE1_ROWS.items():
        out[name] = PolicySpec(name, InferMax, text, _TABLE1, MappingProxyType(dict(flags)))
        out[f"{name}-ef"] = PolicySpec(
            f"{name}-ef",
            InferMax,
            f"Eviction-free {name}: reserves I + O - 1 at admission (hindsight: needs the true O), "
            "so it never evicts. " + text,
            _TABLE1 + " (EF variant, Sec. 4.1 'Schedulers' and 4.4)",
            MappingProxyType({**flags, "reserve": "peak"}),
        )
    rank_base = dict(priority="none", hybrid=True, chunked=True, prefill_budget=None)
    rank_note = (
        " One group of every request (waiting and running) ordered by the key, ties by arrival; "
        "hybrid batches and chunked prefill with P = C. The paper does not state the base "
        "scheduler; these flags follow the public InferMax fork's rank scheduler (chunked, one "
        "sorted list) and are overridable."
    )
    out["rank-org"] = PolicySpec(
        "rank-org",
        InferMax,
        "Rank_org: no prioritization by I or O (arrival order)." + rank_note,
        "seed 003 Sec. 4.6",
        MappingProxyType({**rank_base, "rank": "arrival"}),
    )
    out["rank-i"] = PolicySpec(
        "rank-i",
        InferMax,
        "Rank_I: small prompt I first." + rank_note,
        "seed 003 Sec. 4.6",
        MappingProxyType({**rank_base, "rank": "prompt"}),
    )
    out["rank-o"] = PolicySpec(
        "rank-o",
        InferMax,
        "Rank_O: small output O first (hindsight: needs the true O)." + rank_note,
        "seed 003 Sec. 4.6",
        MappingProxyType({**rank_base, "rank": "output"}),
    )
    out["infermax-sec6"] = PolicySpec(
        "infermax-sec6",
        InferMax,
        "Sec. 6 'sorting + histogram': SARATHI groups with running decodes sorted by KV held "
        "(longest first); on a memory shortage the running request holding the least KV is "
        "evicted first; admission reserves max(S, I + Ô - 1), Ô = p90 of the output lengths of "
        "requests completed so far (S, as SARATHI, until 10 have completed). The paper names "
        "neither the quantile, the warm-up nor P; P = C here, as in the public InferMax fork's "
        "Sec. 6 runs (chunk size 16384 = C).",
        "seed 003 Sec. 6",
        MappingProxyType(
            dict(
                priority="decode",
                hybrid=True,
                chunked=True,
                prefill_budget=None,
                decode_order="kv-desc",
                victim="smallest-kv",
                reserve="histogram",
                quantile=0.9,
                warmup=10,
            )
        ),
    )
    return out


#: Every registered policy, by name.
POLICIES: Mapping[str, PolicySpec] = MappingProxyType(_entries())


def list_policies() -> list[PolicySpec]:
    """Every registered policy, in registry order."""
    return list(POLICIES.values())


def make_policy(name: str, **params: Any) -> Policy:
    """Build the registered policy ``name``, its defaults overridden by ``params``.

    Raises
    ------
    InputError
        For an unknown name, an unknown parameter or a bad value.
    """
    try:
        spec = POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise InputError(f"unknown policy {name!r} (known: {known})") from None
    accepted = spec.accepted()
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InputError(
            f"policy {name!r}: unknown parameter{'s' * (len(unknown) > 1)} {', '.join(unknown)} "
            f"(accepted: {', '.join(accepted)})"
        )
    try:
        return spec.factory(name=name, **{**spec.defaults, **params})
    except (TypeError, ValueError) as exc:
        raise InputError(f"policy {name!r}: {exc}") from None
