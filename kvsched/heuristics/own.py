"""A scheduler written outside kvsched, run with its decisions checked for form before the core sees them.

The semantic core checks every batch's *rules* (memory, budgets, phases) and names the broken one. What it
takes for granted is the *form* a registered policy always gives it: positions and token counts as integers,
as many tokens as requests, positions inside the instance. A policy of one's own can get that wrong (a
request's id instead of its position, a float chunk, ``None``), which would surface as a ``ValueError`` or an
``IndexError`` from numpy, or a float truncated without a word. :class:`CheckedPolicy` turns each such
decision into one :class:`~kvsched.errors.KvschedError` naming the policy, the field and the batch's time,
and an exception the policy raises into an :class:`OwnPolicyError` caused by it; the registered policies
skip it (their hot loop pays nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsched.errors import InputError, KvschedError
from kvsched.heuristics.base import Decision, Policy, SchedulerView
from kvsched.instances.model import Instance

#: What an object needs to be run as a scheduler (:class:`~kvsched.heuristics.base.Policy`).
POLICY_MEMBERS = ("name", "uses_true_output", "params", "reset", "next_batch")


def missing_members(value: object) -> list[str]:
    """The members of :data:`POLICY_MEMBERS` that ``value`` lacks (empty: it can be run)."""
    return [m for m in POLICY_MEMBERS if not hasattr(value, m)]


def is_own(policy: Policy) -> bool:
    """Whether ``policy`` was written outside kvsched (its class, not a subclass, is defined elsewhere)."""
    return not type(policy).__module__.startswith("kvsched.")


class OwnPolicyError(KvschedError):
    """A scheduler of one's own raised: its exception is this one's ``__cause__`` (the traceback into the
    policy's code), and a comparison or a sweep reports it in the policy's row instead of stopping."""


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
        try:
            self._policy.reset(instance)
        except KvschedError:
            raise
        except Exception as exc:
            raise OwnPolicyError(f"policy {self.name!r}: reset raised {type(exc).__name__}: {exc}") from exc

    def next_batch(self, view: SchedulerView) -> Decision | None:
        try:
            decision = self._policy.next_batch(view)
        except KvschedError:
            raise
        except Exception as exc:
            raise OwnPolicyError(
                f"policy {self.name!r} at t={view.now:g}: next_batch raised {type(exc).__name__}: {exc}"
            ) from exc
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


#: A policy written in a file, as the command line names it: ``path/to/file.py:ClassName``.
FILE_REF_HINT = "FILE.py:CLASS (a Python file and the policy class in it)"


def is_file_ref(text: str) -> bool:
    """Whether ``text`` names a policy class in a file (``FILE.py:CLASS``) rather than a registered policy."""
    path, sep, name = text.rpartition(":")
    return bool(sep) and path.endswith(".py") and bool(name)


def build_policy(name: str, params: Mapping[str, Any] | None = None, what: str = "policy") -> Policy:
    """The policy ``name`` names, built with ``params``: one of one's own (``FILE.py:CLASS``, read from its
    file) or a registered one (an unknown name is one error naming ``what`` and the closest names)."""
    from kvsched.heuristics.registry import check_policy_name, make_policy

    if is_file_ref(name):
        return load_policy_file(name, params)
    return make_policy(check_policy_name(name, what), **dict(params or {}))


def load_policy_file(ref: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy class ``CLASS`` of the Python file ``FILE`` (``ref`` is ``FILE.py:CLASS``), built with
    ``params`` as keyword arguments; every failure (no such file, an import that raises, no such class, a
    constructor that refuses the parameters, an object that is not a policy) is one :class:`InputError`
    naming ``ref``. The file runs as Python code, as ``python FILE`` would run it."""
    import importlib.util
    import sys
    from pathlib import Path

    path_text, _, class_name = ref.rpartition(":")
    path = Path(path_text)
    if not is_file_ref(ref):
        raise InputError(f"{ref}: expected {FILE_REF_HINT}")
    if not path.is_file():
        raise InputError(f"{ref}: {path} is not a file")
    module_name = f"kvsched_policy_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"{ref}: {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: whatever it raises is its error, named in one line
        sys.modules.pop(module_name, None)
        raise InputError(f"{ref}: importing {path} raised {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, type) and hasattr(v, "next_batch"))
        known = f" (classes with next_batch there: {', '.join(found)})" if found else ""
        raise InputError(f"{ref}: {path} has no {class_name!r}{known}")
    try:
        policy = cls(**dict(params or {}))
    except Exception as exc:  # a constructor refusing its parameters, or failing: one line naming it
        raise InputError(f"{ref}: {class_name}(...) raised {type(exc).__name__}: {exc}") from None
    missing = missing_members(policy)
    if missing:
        raise InputError(
            f"{ref}: {class_name} is not a policy (it has no {', '.join(missing)}; see kvsched.Policy)"
        )
    return policy
