"""One instance as the simulator, the core and the policies read it: built once.

An :class:`~kvsched.instances.model.Instance` is a tuple of request objects,
convenient to load and write but slow to read on a hot path. :class:`ProblemData`
is the same problem as read-only numpy arrays, the limits in the units the core
counts in (KV in blocks), and the instance's cost-model object, built once per
instance by :meth:`ProblemData.of` (and cached, so every
:class:`~kvsched.schedule.core.EngineState`, view and policy of a run shares one).

Example::

    data = ProblemData.of(instance)
    data.prompt[data.arrival_order[:10]]   # prompts of the first ten arrivals
    data.kv_blocks                         # M in blocks
    data.cost_model.batch_time(view)       # the instance's own cost model
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from kvsched.costmodel import CostModel, make_cost_model
from kvsched.costmodel.base import BatchView
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Phase

#: A token count, or an integer array of them (:meth:`ProblemData.blocks` keeps the kind).
IntOrArray = TypeVar("IntOrArray", int, np.ndarray)

#: Instances whose data is kept (the most recently used ones).
CACHE_SIZE = 8


def _frozen(values: list[float] | list[int], dtype: type) -> np.ndarray:
    arr = np.array(values, dtype=dtype)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class ProblemData:
    """The arrays, limits and cost model of one instance (every array read-only, indexed by position).

    Parameters
    ----------
    instance
        The instance this describes.
    ids
        Request ids, by position.
    arrival, prompt, output
        Arrival time, I and O per request.
    predicted_output
        Predicted O per request, or ``None`` unless every request carries one.
    peak
        I + O - 1: the most KV a request ever holds.
    arrival_order
        Positions sorted by arrival (stable: ties keep position order).
    sorted_arrival
        ``arrival[arrival_order]``.
    block_size, kv_blocks, kv_capacity
        KV block size, the capacity in blocks (the unit the core counts in) and M in tokens.
    max_batch_tokens, max_prefill_tokens, max_running
        C, P and the cap on requests holding KV (``None``: no limit).
    work
        Sum of I + O over the requests.
    cost_model
        The instance's own cost model (``time_model``), built once.
    """

    instance: Instance
    ids: tuple[str, ...]
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    predicted_output: np.ndarray | None
    peak: np.ndarray
    arrival_order: np.ndarray
    sorted_arrival: np.ndarray
    block_size: int
    kv_blocks: int
    kv_capacity: int
    max_batch_tokens: int | None
    max_prefill_tokens: int | None
    max_running: int | None
    work: int
    cost_model: CostModel

    @property
    def n(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, instance: Instance) -> ProblemData:
        """The data of ``instance``, built on first use and then shared (a small per-object cache)."""
        key = id(instance)
        hit = _CACHE.get(key)
        if hit is not None and hit.instance is instance:
            _CACHE.move_to_end(key)
            return hit
        data = cls.build(instance)
        _CACHE[key] = data
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return data

    @classmethod
    def build(cls, instance: Instance) -> ProblemData:
        """Build the data of ``instance`` (uncached; prefer :meth:`of`)."""
        reqs = instance.requests
        arrival = _frozen([r.arrival for r in reqs], np.float64)
        prompt = _frozen([r.prompt for r in reqs], np.int64)
        output = _frozen([r.output for r in reqs], np.int64)
        predicted = [r.predicted_output for r in reqs]
        has_predictions = all(p is not None for p in predicted)
        order = np.argsort(arrival, kind="stable")
        order.flags.writeable = False
        sorted_arrival = arrival[order]
        sorted_arrival.flags.writeable = False
        peak = prompt + output - 1
        peak.flags.writeable = False
        lim = instance.limits
        return cls(
            instance=instance,
            ids=tuple(r.id for r in reqs),
            arrival=arrival,
            prompt=prompt,
            output=output,
            predicted_output=_frozen(predicted, np.int64) if has_predictions else None,  # type: ignore[arg-type]
            peak=peak,
            arrival_order=order,
            sorted_arrival=sorted_arrival,
            block_size=lim.block_size,
            kv_blocks=lim.kv_blocks,
            kv_capacity=lim.kv_capacity,
            max_batch_tokens=lim.max_batch_tokens,
            max_prefill_tokens=lim.max_prefill_tokens,
            max_running=lim.max_running,
            work=int(prompt.sum() + output.sum()),
            cost_model=checked_cost_model(instance),
        )

    def blocks(self, tokens: IntOrArray) -> IntOrArray:
        """KV blocks that hold ``tokens`` KV tokens (an int, or an integer array elementwise)."""
        return -(-tokens // self.block_size)


_CACHE: OrderedDict[int, ProblemData] = OrderedDict()


#: The longest a batch may take, in the instance's time unit (seconds or slots): 1e12 s is 31,700 years, so
#: only a coefficient in the wrong unit or an overflow reaches it, and a million such batches still sum finitely.
LONGEST_BATCH = 1e12


def checked_cost_model(instance: Instance) -> CostModel:
    """The cost model of ``instance``'s time model, refused where a batch of ``instance`` could take longer
    than :data:`LONGEST_BATCH` (or no time: the model's own checks). Independent of the request count:
    commands that never build the problem data (``info``) run it too.

    A finite coefficient can still overflow (1e308 s a token, a KV slope in the wrong unit), and then every
    duration, makespan and bound is inf or nan and would be reported as a number. The largest batches the
    limits allow are the test: one prompt chunk of the most tokens on the rest of the KV, many decodes
    reading half of it, and one decode reading all of it (the models' terms grow with tokens, items and KV).
    """
    tm = instance.time_model
    with np.errstate(all="ignore"):  # an overflow in a model's tables is this check's to report
        model = make_cost_model(tm.name, tm.params)
    lim = instance.limits
    kv = lim.kv_blocks * lim.block_size
    most = max(1, min(kv, lim.max_batch_tokens or kv))
    # Decodes that read half the KV between them (the other half is theirs to hold; at most 4,096 of them, so
    # the probe stays small at any M), and one that reads it all.
    many = max(1, min(most, lim.max_running or most, kv // 2, 4096))
    views = [BatchView(np.array([most]), np.array([kv - most]), np.array([int(Phase.PREFILL)]))]
    for decodes, context in ((many, max(0, kv // (2 * many))), (1, kv - 1)):
        views.append(
            BatchView(
                np.ones(decodes, np.int64), np.full(decodes, context), np.full(decodes, int(Phase.DECODE))
            )
        )
    for view in views:
        with np.errstate(all="ignore"):  # an overflow is this check's answer, not a warning to print
            took = float(model.batch_time(view))
        if not took <= LONGEST_BATCH:  # also nan
            raise InputError(
                f"cost model {model.name}: a batch of this instance would take {took:g} time units, more than "
                f"{LONGEST_BATCH:g}: a coefficient is out of range (too large for its unit)"
            )
    # The smallest batches: one prompt token, one decode reading one KV token. A model whose every term is
    # absent (a coefficient file with "params": {} for `calibrated`, whose absent terms are zero by design)
    # runs them in no time, and then makespans are 0 and every rate and seconds bound divides by nothing.
    for kind, context in ((Phase.PREFILL, 0), (Phase.DECODE, 1)):
        view = BatchView(np.ones(1, np.int64), np.array([context]), np.array([int(kind)]))
        took = float(model.batch_time(view))
        if not took > 0.0:
            raise InputError(
                f"cost model {model.name}: a batch of one {kind.name.lower()} token would take {took:g} time "
                "units: a batch must take some time (the model has no fixed part and no per-token term; "
                "a coefficient is missing)"
            )
    return model


__all__ = ["CACHE_SIZE", "LONGEST_BATCH", "ProblemData"]
