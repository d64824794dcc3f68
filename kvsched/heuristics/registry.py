"""Named scheduling policies, one registry for every family.

* seed 003: InferMax's Algorithm 1 with the flags of one row of Table 1 (plus
  its eviction-free twin, suffix ``-ef``), the Sec. 4.6 ranking schedulers and
  the Sec. 6 scheduler (:class:`InferMax` configurations);
* deployed engines and seed 001: vLLM v1, Orca, FasterTransformer, K-FCFS;
* seed 004: MC-SF (Algorithms 1 and 2) and the alpha-protection baselines;
* seed 002: WAIT and Nested WAIT;
* seed 000: RAD and SLAI (its Sec. 7 variants);
* seed 001 Sec. 4.3: the class-priority wrapper around any of these.

:func:`make_policy` builds one, with any parameter overridden by keyword.

Budgets: a policy uses the instance's C, P and ``max_running`` when set and its
own defaults otherwise (C = 4096, Llama-2-7B); a parameter may make a budget
stricter, never looser than the instance. SARATHI's P = 512 is such a stricter
token budget; "P = C" and "P = 4096" rows use ``prefill_budget=None`` (P = C, or
the instance's P).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from kvsched.errors import InputError
from kvsched.heuristics.base import Policy
from kvsched.heuristics.infermax import InferMax
from kvsched.heuristics.spec import PolicySpec

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


def _engine_entries() -> dict[str, PolicySpec]:
    """Deployed engines (vLLM v1, Orca, FasterTransformer) and seed 001's K-FCFS family."""
    from kvsched.heuristics.engines import FasterTransformer, Orca, VllmV1
    from kvsched.heuristics.kfcfs import KFCFS

    seed001 = "seed 001 Sec. 3"
    kfcfs = (
        "Work-conserving K-FCFS (seed 001 Sec. 2.3, Theorem 1): the k_prefill oldest prefill-phase and "
        "k_decode oldest decode-phase requests (all by default) are eligible; they fill the token "
        "budget in {order}, decodes 1 token, prompts split at the budget edge. Memory is not in the "
        "paper: a candidate preempts lower-ranked running requests by recompute."
    )
    return {
        "vllm-v1": PolicySpec(
            "vllm-v1",
            VllmV1,
            "vLLM v1 (chunked prefill on): running requests first under the token budget (chunked "
            "prefills, decodes), then waiting ones FCFS only in a step that preempted nothing, at most "
            "max_num_seqs = 256 running; when blocks run out the newest running request is preempted by "
            "recompute and re-queued at the front. Follows vllm/v1/core/sched/scheduler.py (FCFS); "
            "seed 001 only cites it as work-conserving.",
            seed001 + " ('latest vLLM with chunked prefill'); vLLM v1 scheduler",
        ),
        "orca": PolicySpec(
            "orca",
            Orca,
            "Orca as seed 001 describes it: every prompt first (FCFS, the one meeting the token budget "
            "split, as the paper's work-conservation needs), then one decode per running request until "
            "the budget is full; each admitted request reserves max_seq_len = 4096 tokens (Orca/Vidur). "
            "The real Orca has no token budget and never splits a prompt.",
            seed001,
        ),
        "fastertransformer": PolicySpec(
            "fastertransformer",
            FasterTransformer,
            "FasterTransformer as seed 001 describes it: request-level batching, decode-prioritised. "
            "While any request decodes, decode-only batches; a new cohort of whole prompts starts only "
            "when none decodes. Each admitted request reserves max_seq_len = 4096 tokens.",
            seed001,
        ),
        "kfcfs": PolicySpec(
            "kfcfs",
            KFCFS,
            kfcfs.format(order="arrival order (FCFS)"),
            "seed 001 Sec. 2.3",
            MappingProxyType({"order": "fcfs"}),
        ),
        "kfcfs-sp": PolicySpec(
            "kfcfs-sp",
            KFCFS,
            kfcfs.format(order="shortest-prompt-first order"),
            "seed 001 Sec. 2.3",
            MappingProxyType({"order": "shortest-prompt"}),
        ),
        "kfcfs-sr": PolicySpec(
            "kfcfs-sr",
            KFCFS,
            kfcfs.format(order="smallest-remaining-tokens-first order")
            + " Remaining tokens use the true output length by default (hindsight); "
            "lengths='predicted' uses predicted_output instead.",
            "seed 001 Sec. 2.3",
            MappingProxyType({"order": "shortest-remaining", "lengths": "true"}),
        ),
    }


def _seed000_entries() -> dict[str, PolicySpec]:
    """RAD (Sec. 4.2) and the SLAI variants of Sec. 7 (and App. F.2)."""
    from kvsched.heuristics.rad import RAD
    from kvsched.heuristics.slai import SLAI

    slai = (
        "SLAI{label}: per batch, critical decodes (now >= e + TBT - delta * mean batch time) by deadline, "
        "started prefills, new prefills {order} below alpha = 128 active requests, then non-critical "
        "decodes within beta = 128; token budget 512; delta {offset}. TBT SLOs from the requests "
        "(tbt_slo; default_tbt for those without, None = always critical). vLLM-style memory: preempt "
        "the newest running request by recompute."
    )
    dynamic = "5 while KV-block occupancy < 96%, else 10"
    return {
        "rad": PolicySpec(
            "rad",
            RAD,
            "RAD: pure decode batches over all of D when |D| = t_col* (or nothing waits, or n requests "
            "started this cycle), else the oldest waiting request's whole prompt back to back in chunks of "
            "t_lcm* = LCM(t_row*, t_col*, t_red*); at most t_col* active requests; cycles end when D "
            "empties. Tiles from the instance's rad time model (else 128 x 256, t_red = 32). Fixes the "
            "printed chunk off-by-one; evicts the newest decoding request (LIFO) when memory runs out "
            "(the paper assumes it never does).",
            "seed 000 Sec. 4.2, Algorithm 1",
        ),
        "slai": PolicySpec(
            "slai",
            SLAI,
            slai.format(label=" (SPF, dynamic offset)", order="shortest prompt first", offset=dynamic),
            "seed 000 Sec. 6, Eq. 8; Sec. 7",
            MappingProxyType({"prefill_order": "spf", "dynamic_offset": True}),
        ),
        "slai-fixed": PolicySpec(
            "slai-fixed",
            SLAI,
            slai.format(label=" (SPF, fixed offset)", order="shortest prompt first", offset="= 10"),
            "seed 000 Sec. 6, Eq. 8; Sec. 7",
            MappingProxyType({"prefill_order": "spf", "dynamic_offset": False}),
        ),
        "slai-fcfs": PolicySpec(
            "slai-fcfs",
            SLAI,
            slai.format(label=" (FCFS, fixed offset)", order="in arrival order", offset="= 10"),
            "seed 000 Sec. 6, Eq. 8; Sec. 7",
            MappingProxyType({"prefill_order": "fcfs", "dynamic_offset": False}),
        ),
        "slai-priority": PolicySpec(
            "slai-priority",
            SLAI,
            slai.format(
                label=" (SPF with priority, dynamic offset)",
                order="by request priority, then shortest prompt first",
                offset=dynamic,
            ),
            "seed 000 App. F.2",
            MappingProxyType({"prefill_order": "spf", "dynamic_offset": True, "priority_first": True}),
        ),
    }


def _class_priority(
    name: str = "class-priority", *, inner: str = "sarathi", classes: str | None = None
) -> Policy:
    """:class:`ClassPriority` around the registered policy ``inner``."""
    from kvsched.heuristics.priority import ClassPriority

    spec = POLICIES.get(inner)
    if inner == name or (spec is not None and spec.factory is _class_priority):
        raise ValueError(f"inner must be another policy, not {inner!r}")
    return ClassPriority(make_policy(inner), classes=classes, name=name)


def _seed001_entries() -> dict[str, PolicySpec]:
    return {
        "class-priority": PolicySpec(
            "class-priority",
            _class_priority,
            "Non-preemptive class priority around another policy (inner, default sarathi): a request is "
            "shown to the inner policy only once no request of a higher class waits to start; classes by "
            "Request.priority (larger first) or classes='paying,free' (Request.cls, first highest). "
            "Started requests are never held back; the inner policy composes every batch.",
            "seed 001 Sec. 4.3 (non-preemptive type priority of the agents)",
            MappingProxyType({"inner": "sarathi", "classes": None}),
        ),
    }


def _seed004_entries() -> dict[str, PolicySpec]:
    from kvsched.heuristics.mcsf import SEED004_POLICIES

    return dict(SEED004_POLICIES)


def _seed002_entries() -> dict[str, PolicySpec]:
    from kvsched.heuristics.wait import SEED002_EXTENSIONS, SEED002_POLICIES

    return {**SEED002_POLICIES, **SEED002_EXTENSIONS}


#: The registry's groups, in registry order; each imports its policies' modules when first read.
_GROUPS: tuple[Callable[[], dict[str, PolicySpec]], ...] = (
    _entries,
    _engine_entries,
    _seed004_entries,
    _seed002_entries,
    _seed000_entries,
    _seed001_entries,
)


class _Registry(Mapping[str, PolicySpec]):
    """Every registered policy, by name, read-only and in registry order.

    A group of entries (and its policies' modules) is loaded when a name is
    looked up that the groups before it lack, or when the registry is listed:
    ``make_policy("sarathi")`` imports InferMax alone, not every policy module
    (about 15 ms of a command's start).
    """

    def __init__(self, groups: tuple[Callable[[], dict[str, PolicySpec]], ...]) -> None:
        self._groups = groups
        self._loaded: dict[str, PolicySpec] = {}
        self._next = 0
        self._lock = threading.Lock()  # threads making policies load each group once

    def _load_next(self) -> bool:
        with self._lock:
            if self._next >= len(self._groups):
                return False
            group = self._groups[self._next]()
            clash = sorted(set(group) & set(self._loaded))
            if clash:  # a name registered twice would silently shadow one of them
                raise RuntimeError(f"policy registered twice: {', '.join(clash)}")
            self._loaded = {**self._loaded, **group}  # readers see the old dict or the new, whole
            self._next += 1
            return True

    def _all(self) -> dict[str, PolicySpec]:
        while self._load_next():
            pass
        return self._loaded

    def __getitem__(self, name: str) -> PolicySpec:
        while name not in self._loaded:
            if not self._load_next():
                raise KeyError(name)
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"POLICIES({', '.join(self)})"


#: Every registered policy, by name (read-only).
POLICIES: Mapping[str, PolicySpec] = _Registry(_GROUPS)


def list_policies() -> list[PolicySpec]:
    """Every registered policy, in registry order."""
    return list(POLICIES.values())


def check_policy_name(name: str, what: str = "policy") -> str:
    """``name`` if it is a registered policy, else one :class:`InputError` naming ``what`` and the closest
    registered names (a newcomer's typo, ``sarati``, gets ``did you mean 'sarathi'``)."""
    if name in POLICIES:
        return name
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, list(POLICIES), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise InputError(f"{what}: unknown policy {name!r}{hint} (kvsched policies lists them)")


def make_policy(name: str, **params: Any) -> Policy:
    """Build the registered policy ``name``, its defaults overridden by ``params``.

    Raises
    ------
    InputError
        For an unknown name, an unknown parameter or a bad value.
    """
    spec = POLICIES[check_policy_name(name)]
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
