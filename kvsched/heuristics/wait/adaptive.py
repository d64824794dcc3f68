"""Seed 002 §7.1 / §8.1: WAIT and Nested WAIT re-solving their thresholds under time-varying rates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from kvsched.errors import InputError
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.checks import check_count, check_non_negative_number
from kvsched.heuristics.wait.gated import WAIT
from kvsched.heuristics.wait.nested import NestedWAIT
from kvsched.heuristics.wait.thresholds import (
    Design,
    ThresholdMode,
    TypeKey,
    nested_design,
    wait_thresholds,
)
from kvsched.instances.model import Instance
from kvsched.schedule.search import last_fitting


class _RateTracker:
    """Arrival rates per type, for §7.1's time-varying rates (see :class:`AdaptiveWAIT`).

    Estimated at ``now`` from the last ``window`` arrivals (at most): type j's count
    among them over ``now`` minus the oldest one's arrival, so a lull lowers the
    estimate even before the next arrival. Or, with ``schedule`` (piecewise-constant
    known rates, ``(start, rates)`` pairs), the entry in force at ``now``.
    """

    def __init__(
        self,
        arrival: np.ndarray,
        kind: np.ndarray,
        m: int,
        window: int,
        min_arrivals: int,
        schedule: Sequence[tuple[float, Sequence[float]]] | None,
    ) -> None:
        order = np.argsort(arrival, kind="stable")
        self._arrival = arrival[order]
        self._kind = kind[order]
        self._m = m
        self._window = window
        self._min = min_arrivals
        self._schedule = None
        if schedule is not None:
            starts = [float(t) for t, _ in schedule]
            table = [np.asarray(r, dtype=float) for _, r in schedule]
            if any(r.shape != (m,) for r in table) or sorted(starts) != starts:
                raise InputError(f"rate schedule: start times must increase and give {m} rates each")
            self._schedule = (starts, table)

    def rates(self, now: float, arrived: int) -> np.ndarray | None:
        """The rates at ``now`` with ``arrived`` requests in (``None``: too few to tell)."""
        if self._schedule is not None:
            starts, table = self._schedule
            k = int(np.searchsorted(starts, now, side="right")) - 1
            return table[max(k, 0)]
        lo = max(arrived - self._window, 0)
        span = now - float(self._arrival[lo]) if arrived > 0 else 0.0
        if arrived - lo < self._min or span <= 0:
            return None
        return np.bincount(self._kind[lo:arrived], minlength=self._m) / span


class _Adaptive:
    """What the adaptive WAIT policies share: the rate estimate and when it calls for new thresholds.

    A subclass's ``reset`` sets ``_tracker``, ``rates_`` and ``thresholds_``; its
    ``_resolve(rates)`` returns new thresholds for ``rates`` (and keeps any design).
    """

    def _init_adaptive(
        self,
        window: int,
        min_arrivals: int,
        tolerance: float,
        schedule: Sequence[tuple[float, Sequence[float]]] | None,
    ) -> None:
        check_count("window", window)
        check_count("min_arrivals", min_arrivals)
        check_non_negative_number("tolerance", tolerance)  # NaN and inf passed ">= 0"
        if schedule is not None and (isinstance(schedule, str) or not isinstance(schedule, Sequence)):
            # (0 was taken for "no schedule" without a word)
            raise ValueError(f"schedule must be a list of (time, rates) pairs or None; got {schedule!r}")
        self.window, self.min_arrivals, self.tolerance = int(window), int(min_arrivals), float(tolerance)
        self.schedule = tuple((float(t), tuple(map(float, r))) for t, r in schedule) if schedule else None

    @property
    def params(self) -> Mapping[str, Any]:
        own = {"window": self.window, "min_arrivals": self.min_arrivals, "tolerance": self.tolerance}
        return {**super().params, **own, "schedule": self.schedule}  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, window={self.window})"  # type: ignore[attr-defined]

    def _estimate(self, now: float, arrived: int) -> np.ndarray | None:
        """The tracker's rates at ``now``, as the subclass reads them (per type or per segment), or None."""
        return self._tracker.rates(now, arrived)

    def _new_rates(self, now: float, arrived: int) -> np.ndarray | None:
        """The rates a call at ``now`` adopts, or ``None`` when it keeps the current ones."""
        rates = self._estimate(now, arrived)
        if rates is None or rates.sum() <= 0:
            return None
        cur = self.rates_
        if np.isfinite(cur).all() and np.abs(rates - cur).sum() <= self.tolerance * cur.sum():
            return None
        return rates

    def _adapt(self, view: SchedulerView) -> None:
        if view.next_arrival() is None:
            return  # drain: a window with no more arrivals would shrink the per-stage caps to 1
        rates = self._new_rates(view.now, view.num_arrived)
        if rates is None:
            return
        self.rates_ = rates
        n = self._resolve(rates)
        if not np.array_equal(n, self.thresholds_):
            self.thresholds_ = n
            self.threshold_history_.append((float(view.now), tuple(int(v) for v in n)))

    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._adapt(view)
        return super().next_batch(view)  # type: ignore[misc]

    def _steady_limit(self, view: SchedulerView, req: np.ndarray, limit: int) -> int:
        """The base policy's run condition, and no repeat may adopt new rates (they could move thresholds).

        Known rates (``schedule``) are constant between its start times: the run
        stops before the next one, and is empty if its first repeat already adopts.
        Estimated rates at time t are ``c / (t - a)`` (counts ``c`` and the window's
        oldest arrival ``a`` fixed through the run, nothing arrives): with
        ``x = 1 / (t - a)``, the test ``sum |c x - r| <= tol sum r`` holds on an
        interval of x (a convex function under a level), and x only falls as the
        repeats start later, so once a repeat adopts, every later one would: a binary
        search over the repeats' start times finds the first. In the drain (nothing
        left to arrive) rates are never re-read.
        """
        limit = super()._steady_limit(view, req, limit)  # type: ignore[misc]
        if not limit or view.next_arrival() is None:
            return limit
        starts = view.run_starts()[:limit]
        arrived = view.num_arrived
        if self._new_rates(float(starts[0]), arrived) is not None:
            return 0
        if self.schedule is not None:
            times = [t for t, _ in self.schedule if t > starts[0]]
            return int(np.searchsorted(starts, times[0], side="left")) if times else limit
        if (
            self._estimate(float(starts[0]), arrived) is None
            and self._estimate(float(starts[-1]), arrived) is not None
        ):
            return 0  # a zero-length start (no estimate yet): not worth a proof
        return last_fitting(
            lambda j: int(self._new_rates(float(starts[j - 1]), arrived) is not None) if j else 0, 0, limit
        )


class AdaptiveWAIT(_Adaptive, WAIT):
    """WAIT under time-varying arrival rates: seed 002 §7.1 and §8.1.

    §7.1 keeps Algorithm 1 and asks the threshold conditions (15) to hold at every
    instant with the accumulated arrivals over each iteration window; its proof
    (App. D) sizes thresholds for the *worst-case* rate. §8.1: "our algorithm can be
    directly adapted to scenarios with moderate variations in arrival rates ... by
    re-solving the fluid equilibrium". We implement §8.1's recipe (our reading of
    how to apply §7.1 online; the paper gives no estimator): before each batch the
    per-type rates are re-estimated (:class:`_RateTracker`, the last ``window``
    arrivals, or a known piecewise-constant ``schedule``) and, when they moved by
    more than ``tolerance`` (L1, relative), the thresholds are re-solved exactly as
    :class:`WAIT` sizes them (the fluid equilibrium, or the largest that fit M when
    overloaded). The first thresholds are WAIT's (from ``rates`` or the instance).
    A drop in a threshold leaves extra requests at a stage waiting (KV kept); a rise
    admits more. ``threshold_history_`` records ``(time, thresholds)`` at each change.

    Parameters
    ----------
    window
        Arrivals the rate estimate looks back over.
    min_arrivals
        Fewer arrivals in the window keep the current thresholds.
    tolerance
        Relative L1 change of the rates that triggers a re-solve.
    schedule
        Known piecewise-constant rates: ``(start time, per-type rates)`` pairs
        (types in :func:`~kvsched.heuristics.fluid.instance_types` order), instead of estimates.
    types, thresholds, rates, margin, batch_size, d0, d1
        As :class:`WAIT` (no ``given``: fixed thresholds do not adapt).
    """

    def __init__(
        self,
        name: str = "wait-adaptive",
        *,
        window: int = 200,
        min_arrivals: int = 20,
        tolerance: float = 0.1,
        schedule: Sequence[tuple[float, Sequence[float]]] | None = None,
        types: TypeKey = "io",
        thresholds: ThresholdMode = "fluid",
        rates: Sequence[float] | None = None,
        margin: float = 0.0,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        self._init_adaptive(window, min_arrivals, tolerance, schedule)
        super().__init__(
            name, types=types, thresholds=thresholds, rates=rates, margin=margin, batch_size=batch_size,
            d0=d0, d1=d1,
        )  # fmt: skip

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        m = self.thresholds_.size
        self._tracker = _RateTracker(arrival, self._type, m, self.window, self.min_arrivals, self.schedule)
        self._limits_all = instance.limits
        self.threshold_history_: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(self.thresholds_))]

    def _resolve(self, rates: np.ndarray) -> np.ndarray:
        t = self.types_
        d0, d1 = self.eq1_
        return wait_thresholds(
            t.prompt, t.output, rates, d0, d1, self._limits_all, mode=self.thresholds, margin=self.margin,
            batch_size=self.batch_size, strict=False,
        )  # fmt: skip


class AdaptiveNestedWAIT(_Adaptive, NestedWAIT):
    """Nested WAIT under time-varying arrival rates: seed 002 §7.1 and §8.1.

    As :class:`AdaptiveWAIT`, with one difference: Nested WAIT does not know a
    request's type at arrival, so only the *total* rate is re-estimated (the last
    ``window`` arrivals), and the design's type mix (its continuation probabilities
    ``p_k``) is kept: the segment rates are the design's, scaled to the estimate,
    and the thresholds are re-sized by :func:`nested_design` (our reading; §7.1's
    conditions (15) are on accumulated per-type arrivals, which an online scheduler
    cannot count before the types reveal themselves). ``schedule`` gives known
    piecewise-constant per-segment rates instead (one per segment of the design).
    """

    def __init__(
        self,
        name: str = "nested-wait-adaptive",
        *,
        window: int = 200,
        min_arrivals: int = 20,
        tolerance: float = 0.1,
        schedule: Sequence[tuple[float, Sequence[float]]] | None = None,
        design: Design = "outputs",
        segments: int | Literal["auto"] = 10,
        ends: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        thresholds: ThresholdMode = "fluid",
        margin: float = 0.0,
        eps: float = 0.05,
        buffer: bool = True,
        delta: float = 0.1,
        horizon: int = 10_000,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        self._init_adaptive(window, min_arrivals, tolerance, schedule)
        super().__init__(
            name, design=design, segments=segments, ends=ends, rates=rates, thresholds=thresholds,
            margin=margin, eps=eps, buffer=buffer, delta=delta, horizon=horizon, batch_size=batch_size,
            d0=d0, d1=d1,
        )  # fmt: skip

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        m = self.thresholds_.size
        kind = np.zeros(arrival.size, dtype=np.int64)  # one stream: the total rate
        if self.schedule is not None:
            self._tracker = _RateTracker(arrival, kind, m, self.window, self.min_arrivals, self.schedule)
        else:
            self._tracker = _RateTracker(arrival, kind, 1, self.window, self.min_arrivals, None)
        rates = self.design_.rates
        self._mix = rates / rates.sum() if np.isfinite(rates).all() and rates.sum() > 0 else None
        self._prompt_mean = round(float(self._prompt.mean()))
        self.rates_ = rates
        self.threshold_history_: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(self.thresholds_))]

    def _estimate(self, now: float, arrived: int) -> np.ndarray | None:
        est = self._tracker.rates(now, arrived)
        if est is None or self.schedule is not None:
            return est
        # One stream (the total rate), split by the design's mix.
        return None if self._mix is None else self._mix * float(est[0])

    def _resolve(self, rates: np.ndarray) -> np.ndarray:
        d0, d1 = self.eq1_
        design = nested_design(
            self.design_.ends, rates, self._prompt_mean, d0, d1, self._limits, mode=self.thresholds,
            margin=self.margin, eps=self.eps, batch_size=self.batch_size, buffer=self.buffer,
            delta=self.delta, horizon=self.horizon, strict=False,
        )  # fmt: skip
        if not np.array_equal(design.thresholds, self.thresholds_):
            self.design_ = design
        return design.thresholds
