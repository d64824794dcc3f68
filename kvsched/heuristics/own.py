"""A scheduler written outside kvsched, run with its decisions checked for form before the core sees them.

The semantic core checks every batch's *rules* (memory, budgets, phases) and names the broken one. What it
takes for granted is the *form* a registered policy always gives it: positions and token counts as integers,
as many tokens as requests, positions inside the instance. A policy of one's own can get that wrong (a
request's id instead of its position, a float chunk, ``None``), which would surface as a ``ValueError`` or an
``IndexError`` from numpy, or a float truncated without a word. :class:`CheckedPolicy` turns each such decision
into one :class:`~kvsched.errors.KvschedError` naming the policy, the field and the batch's time; the
registered policies skip it (their hot loop pays nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsched.errors import KvschedError
from kvsched.heuristics.base import Decision, Policy, SchedulerView
from kvsched.instances.model import Instance


def is_own(policy: Policy) -> bool:
    """Whether ``policy`` was written outside kvsched (its class, not a subclass, is defined elsewhere)."""
    return not type(policy).__module__.startswith("kvsched.")


class CheckedPolicy:
    """``policy`` with every :class:`Decision` it returns checked for form (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._n = 0

    @property
    def name(self) -> str:
        return self._policy.name

    @property
    def uses_true_output(self) -> bool:
        return self._policy.uses_true_output

    @property
    def params(self) -> Mapping[str, Any]:
        return self._policy.params

    def __getattr__(self, attr: str) -> Any:
        # The opt-in contracts (repeat_decodes, ...) are found on the policy itself.
        return getattr(self._policy, attr)

    def reset(self, instance: Instance) -> None:
        self._n = len(instance)
        self._policy.reset(instance)

    def next_batch(self, view: SchedulerView) -> Decision | None:
        decision = self._policy.next_batch(view)
        if decision is None or (type(decision) is not Decision and not isinstance(decision, Decision)):
            return decision  # None idles; anything else the simulator refuses by its type
        where = f"policy {self.name!r} at t={view.now:g}"
        requests = _integers(decision.requests, "requests", where)
        tokens = _integers(decision.tokens, "tokens", where)
        evict = _integers(decision.evict, "evict", where)
        if requests.size != tokens.size:
            raise KvschedError(
                f"{where}: a Decision needs one token count per request, got {requests.size} requests "
                f"and {tokens.size} token counts"
            )
        for field, positions in (("requests", requests), ("evict", evict)):
            bad = positions[(positions < 0) | (positions >= self._n)]
            if bad.size:
                raise KvschedError(
                    f"{where}: Decision.{field} holds {int(bad[0])}, not a request position (0 to "
                    f"{self._n - 1}: a request's place in the instance, not its id)"
                )
        return Decision(requests, tokens, evict)


def _integers(values: object, field: str, where: str) -> np.ndarray:
    """``values`` as a 1-D int64 array, or one error naming ``field``: whole numbers only (no bools)."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise KvschedError(f"{where}: Decision.{field} is not a list of integers ({exc})") from None
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        got = repr(values) if array.ndim == 0 else f"shape {array.shape}"
        raise KvschedError(f"{where}: Decision.{field} must be a flat list of integers, got {got}")
    if array.dtype.kind not in "iu":
        raise KvschedError(f"{where}: Decision.{field} must hold integers, got {array.ravel()[0].item()!r}")
    return array.astype(np.int64)
