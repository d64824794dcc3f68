"""Priority rules of the greedy: which request goes first (smallest key first, ties by position).

A rule is either *static* (one key per request, fixed for the whole run: total KV
area, output length, arrival, or keys given from outside such as a relaxation's
alpha-points) or *dynamic* (the key moves as the request generates: remaining KV
area, remaining output; optionally scaled per request). Dynamic keys only change
when a request generates a token, so a waiting request's key is frozen while it
waits; the kernel relies on that to keep the waiting list sorted once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsched.csp.incumbents._kernel import REMAINING_AREA, REMAINING_OUTPUT, STATIC
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.data import ProblemData


def kv_area(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """KV area of each request: sum over its O generating ops of the KV they hold, I + u - 1."""
    o = output.astype(np.float64)
    return o * prompt + 0.5 * o * (o - 1)


def _columns(instance: Instance) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = ProblemData.of(instance)  # read-only: a rule's keys are new arrays
    return data.prompt, data.output, data.arrival


def _static(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
    def keys(instance: Instance) -> tuple[int, np.ndarray]:
        prompt, output, arrival = _columns(instance)
        return STATIC, np.array(fn(prompt, output, arrival), dtype=np.float64)  # a copy: fcfs's is arrival

    return keys


def _dynamic(code: int):
    def keys(instance: Instance) -> tuple[int, np.ndarray]:
        return code, np.ones(len(instance), dtype=np.float64)  # per-request scales of the moving key

    return keys


#: Rule name -> function of the instance giving (kernel rule code, static keys).
RULES: dict[str, Callable[[Instance], tuple[int, np.ndarray]]] = {
    "remaining-area": _dynamic(REMAINING_AREA),
    "area": _static(lambda i, o, a: kv_area(i, o)),
    "remaining-output": _dynamic(REMAINING_OUTPUT),
    "output": _static(lambda i, o, a: o),
    "peak": _static(lambda i, o, a: i + o - 1),
    "fcfs": _static(lambda i, o, a: a),
}


def rule_keys(
    instance: Instance, rule: str, priority: np.ndarray | None = None, scale: np.ndarray | None = None
) -> tuple[int, np.ndarray]:
    """The kernel's rule code and static keys for ``rule``, or for external ``priority`` keys.

    Parameters
    ----------
    rule
        A name in :data:`RULES` (ignored when ``priority`` is given).
    priority
        One finite key per request, smallest first (e.g. alpha-points or start times
        of a relaxation): the hook through which relaxations guide the greedy.
    scale
        One positive factor per request on a dynamic rule's key (the key still moves as the
        request generates): how the local search moves requests earlier or later under a
        dynamic rule. A static rule's keys are multiplied by it too.
    """
    if priority is not None:
        keys = np.asarray(priority, dtype=np.float64).reshape(-1)
        if keys.size != len(instance) or not np.isfinite(keys).all():
            raise InputError(f"priority: expected {len(instance)} finite keys, got {keys.size}")
        code, base = STATIC, keys.copy()
    else:
        try:
            code, base = RULES[rule](instance)
        except KeyError:
            raise InputError(f"greedy rule {rule!r} is unknown (known: {', '.join(RULES)})") from None
    if scale is not None:
        factors = np.asarray(scale, dtype=np.float64).reshape(-1)
        if factors.size != len(instance) or not (np.isfinite(factors) & (factors > 0)).all():
            raise InputError(f"scale: expected {len(instance)} positive finite factors, got {factors.size}")
        base = base * factors
    return code, base
