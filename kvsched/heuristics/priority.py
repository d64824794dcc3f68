"""Class priority around any policy (seed 001 Sec. 4.3, the agents' non-preemptive type priority).

Seed 001's Rybko-Stolyar network gives each agent a *non-preemptive priority*
between request types. :class:`ClassPriority` adds that to any registered
policy: the inner policy sees a request only once no request of a higher class
is waiting to start. Concretely, at every batch, classes are visited from the
highest down; all arrived requests of a class are revealed to the inner policy,
and the visit stops at the first class that has a revealed request waiting
(holding no KV: not started, or preempted). A lower class is therefore admitted
only when every arrived request of the higher classes has started; a request
once revealed stays visible, so what has started is never held back
(non-preemptive) and the inner policy's own bookkeeping stays valid.

The class of a request is its :attr:`Request.priority` (larger first) or, with
``classes="paying,free"``, the position of its :attr:`Request.cls` in that list
(first is highest; unlisted classes come last).

Within a batch the inner policy decides as usual: started requests of a lower
class keep their decodes when a higher class arrives. Seed 001's agents also
prefer higher-class *tokens* in every batch ("mixed only when type-B tokens
cannot form a full batch"); that token-level rule needs the inner policy's
ranking and is not what this wrapper does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsched.heuristics.base import Decision, Policy, SchedulerView, steady_chunks, steady_decodes
from kvsched.instances.model import Instance


class GatedView:
    """A :class:`SchedulerView` on which only the revealed requests have arrived.

    Everything else is read through from the real view. ``arrival_order``
    lists the revealed requests in the order they were revealed, then the
    others, so ``arrival_order[:num_arrived]`` only ever grows.
    """

    def __init__(self, view: SchedulerView) -> None:
        self._view = view
        self._revealed: list[int] = []
        self._shown = np.zeros(view.n, dtype=bool)
        self._order: np.ndarray | None = None  # built when read after a change

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def reveal(self, idx: list[int]) -> None:
        self._revealed.extend(idx)
        self._shown[idx] = True
        self._order = None

    @property
    def arrival_order(self) -> np.ndarray:
        if self._order is None:
            every = self._view.arrival_order
            order = np.concatenate([np.asarray(self._revealed, dtype=np.int64), every[~self._shown[every]]])
            order.flags.writeable = False
            self._order = order
        return self._order

    @property
    def num_arrived(self) -> int:
        return len(self._revealed)

    def active(self) -> np.ndarray:
        shown = np.asarray(self._revealed, dtype=np.int64)
        return shown[~self._view.done[shown]]

    def next_arrival(self) -> float | None:
        return self._view.next_arrival()


class ClassPriority:
    """Non-preemptive class priority in front of ``inner`` (see the module docstring).

    Parameters
    ----------
    inner
        The policy that builds the batches.
    classes
        ``None``: classes by :attr:`Request.priority`, larger first. Otherwise
        class names, highest first, matched against :attr:`Request.cls`.
    name
        Registry name recorded in schedules (default ``"class-priority"``).
    """

    def __init__(self, inner: Policy, *, classes: str | None = None, name: str = "class-priority") -> None:
        if classes is not None and (not isinstance(classes, str) or not classes.strip()):
            raise ValueError(f"classes must be comma-separated class names or None; got {classes!r}")
        self.inner = inner
        self.name = name
        self.classes = classes
        self.uses_true_output = inner.uses_true_output

    @property
    def params(self) -> Mapping[str, Any]:
        return {"inner": self.inner.name, "classes": self.classes, "inner_params": dict(self.inner.params)}

    def __repr__(self) -> str:
        return f"ClassPriority({self.inner!r})"

    def level_of(self, instance: Instance) -> np.ndarray:
        """Each request's class rank: 0 is served first."""
        if self.classes is None:
            pri = np.array([r.priority for r in instance.requests], dtype=np.int64)
            return np.unique(-pri, return_inverse=True)[1].astype(np.int64)
        names = [c.strip() for c in self.classes.split(",")]
        rank = {c: k for k, c in enumerate(names)}
        return np.array([rank.get(r.cls or "", len(names)) for r in instance.requests], dtype=np.int64)

    def reset(self, instance: Instance) -> None:
        self.inner.reset(instance)
        self._level = self.level_of(instance)
        levels = int(self._level.max()) + 1 if len(instance) else 0
        self._hidden: list[list[int]] = [[] for _ in range(levels)]  # arrived, not revealed, by class
        self._open: np.ndarray = np.zeros(0, dtype=np.int64)  # revealed and not finished
        self._cursor = 0
        self._gated: GatedView | None = None

    def next_batch(self, view: SchedulerView) -> Decision | None:
        if self._gated is None or self._gated._view is not view:
            self._gated = GatedView(view)
        arrived = view.num_arrived
        for r in view.arrival_order[self._cursor : arrived].tolist():
            self._hidden[self._level[r]].append(r)
        self._cursor = arrived
        self._reveal(view, self._gated)
        return self.inner.next_batch(self._gated)  # type: ignore[arg-type]

    def repeat_decodes(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Coalesced runs (:class:`~kvsched.heuristics.base.SteadyDecodes`): what the inner policy says.

        Through a run nothing arrives, completes or stops holding KV, so the same
        classes stay revealed and the inner policy sees the same gated view.
        """
        inner = steady_decodes(self.inner)
        if inner is None or self._gated is None or self._gated._view is not view:
            return 0
        return inner.repeat_decodes(self._gated, decision, limit)  # type: ignore[arg-type]

    def repeat_chunks(self, view: SchedulerView, decision: Decision, limit: int) -> int:
        """Mixed runs (:class:`~kvsched.heuristics.base.SteadyChunks`): what the inner policy says.

        As for :meth:`repeat_decodes`: nothing arrives or completes before the run's
        last batch, and the chunk's request held KV before the run (it was in the
        batch just applied) and keeps holding it, so no request starts and the
        same classes stay revealed.
        """
        inner = steady_chunks(self.inner)
        if inner is None or self._gated is None or self._gated._view is not view:
            return 0
        return inner.repeat_chunks(self._gated, decision, limit)  # type: ignore[arg-type]

    def _reveal(self, view: SchedulerView, gated: GatedView) -> None:
        """Reveal classes from the highest down, up to the first one with a request waiting to start."""
        self._open = self._open[~view.done[self._open]]
        waiting = set(self._level[self._open[view.kv[self._open] == 0]].tolist())
        for level, hidden in enumerate(self._hidden):
            if hidden:
                gated.reveal(hidden)
                self._open = np.concatenate([self._open, np.asarray(hidden, dtype=np.int64)])
                self._hidden[level] = []
                waiting.add(level)  # nothing just revealed has started
            if level in waiting:
                return


__all__ = ["ClassPriority", "GatedView"]
