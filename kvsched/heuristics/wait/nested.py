"""Nested WAIT (seed 002 §5, Algorithm 2) and §7.2's segment design.

See :mod:`kvsched.heuristics.wait` for the algorithm and what differs from the paper.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvsched.errors import InputError
from kvsched.heuristics.base import SchedulerView
from kvsched.heuristics.checks import (
    check_choice,
    check_count,
    check_eq1_options,
    check_flag,
    check_non_negative_number,
)
from kvsched.heuristics.fluid import fluid_equilibrium
from kvsched.heuristics.wait.gated import StageGated
from kvsched.heuristics.wait.thresholds import (
    Design,
    NestedDesign,
    ThresholdMode,
    eq1_of,
    nested_design,
)
from kvsched.instances.model import Instance, Limits


class NestedWAIT(StageGated):
    """Nested WAIT: seed 002 §5, Algorithm 2 (unknown output lengths; see the module docstring).

    Parameters
    ----------
    name
        Registry name.
    design
        Where the segment ends and rates come from: ``"outputs"`` (the
        instance's output distribution; hindsight at design time only),
        ``"predicted"`` (``predicted_output``) or ``"given"`` (``ends`` and
        ``rates``).
    segments
        At most this many segments when the design is read from an instance:
        distinct lengths if few enough, else equal-width bins up to the longest
        (the paper's 10 bins of 50). ``"auto"``: §7.2's segment design
        (:func:`design_segments`): the distinct lengths are the types, grouped
        into the number of consecutive equal-count segments that minimises
        Eq. (17)'s memory requirement; in overload (no fluid equilibrium, so
        Eq. (16) cannot hold) or for a burst it falls back to 10.
    ends, rates
        Segment ends ``O_1 < ... < O_m`` and per-type rates, for ``design="given"``.
    thresholds, given, margin, batch_size, d0, d1
        As :class:`WAIT` (``given``: per segment).
    eps
        Geometric margin of the fluid thresholds (strict Eq. (12)).
    buffer, delta, horizon
        Reserve Theorem 2's safety buffer (14) for overflow probability
        ``delta`` over ``horizon`` batches when sizing fluid thresholds.
    """

    def __init__(
        self,
        name: str = "nested-wait",
        *,
        design: Design = "outputs",
        segments: int | Literal["auto"] = 10,
        ends: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        thresholds: ThresholdMode = "fluid",
        given: Sequence[int] | None = None,
        margin: float = 0.0,
        eps: float = 0.05,
        buffer: bool = True,
        delta: float = 0.1,
        horizon: int = 10_000,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        check_choice("design", design, Design)
        check_choice("thresholds", thresholds, ThresholdMode)
        if design == "given" and (ends is None or rates is None):
            raise ValueError("design='given' needs ends and rates")
        if isinstance(segments, str) and segments != "auto" and segments.isdigit():
            segments = int(segments)  # from the command line
        if segments != "auto":
            check_count("segments", segments)  # (inf raised OverflowError in int())
        if not 0 < delta < 1:  # (NaN fails 0 < delta)
            raise ValueError(f"delta must lie strictly between 0 and 1; got {delta!r}")
        check_flag("buffer", buffer)
        check_count("horizon", horizon)
        for key, value in (("eps", eps), ("margin", margin)):
            check_non_negative_number(key, value)  # NaN passed "< 0"
        check_eq1_options(batch_size, d0, d1)
        self.name = name
        self.design = design
        self.segments: int | Literal["auto"] = segments if segments == "auto" else int(segments)
        self.ends = tuple(int(v) for v in ends) if ends is not None else None
        self.rates = tuple(float(v) for v in rates) if rates is not None else None
        self.thresholds = thresholds
        self.given = tuple(int(v) for v in given) if given is not None else None
        self.margin, self.eps = float(margin), float(eps)
        self.buffer, self.delta, self.horizon = bool(buffer), float(delta), int(horizon)
        self.batch_size = batch_size
        self.d0, self.d1 = d0, d1
        self.uses_true_output = design == "outputs"

    @property
    def params(self) -> Mapping[str, Any]:
        keys = ("design", "segments", "ends", "rates", "thresholds", "given", "margin", "eps")
        keys += ("buffer", "delta", "horizon", "batch_size", "d0", "d1")
        return {k: getattr(self, k) for k in keys}

    def __repr__(self) -> str:
        return f"NestedWAIT({self.name!r}, design={self.design!r})"

    def _read_design(
        self, instance: Instance, prompt: int = 1, d0: float = 1.0, d1: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        self.segment_choice_: SegmentChoice | None = None
        if self.design == "given":
            return np.array(self.ends), np.array(self.rates)
        if self.design == "predicted":
            if any(r.predicted_output is None for r in instance.requests):
                raise InputError(
                    f"policy {self.name!r}: design='predicted' needs predicted_output everywhere"
                )
            lengths = np.array([r.predicted_output for r in instance.requests], dtype=np.int64)
        else:
            lengths = np.array([r.output for r in instance.requests], dtype=np.int64)
        uniq, per_length = np.unique(lengths, return_counts=True)
        arrivals = np.array([r.arrival for r in instance.requests])
        span = float(arrivals.max() - arrivals.min())
        count = self.segments
        if count == "auto":
            count = 10  # the fallback: §6's 10 bins
            if span > 0:
                choice = design_segments(
                    uniq, per_length / span, prompt, d0, d1, instance.limits.block_size,
                    eps=self.eps, delta=self.delta, horizon=self.horizon,
                )  # fmt: skip
                if choice is not None:
                    self.segment_choice_ = choice
                    return choice.ends, choice.rates
        if uniq.size <= count:
            ends = uniq
        else:
            width = -(-int(uniq.max()) // count)
            ends = np.unique(np.minimum(width * np.arange(1, count + 1), uniq.max()))
        # A length joins the first bin ending at or after it.
        kind = np.searchsorted(ends, lengths, side="left")
        counts = np.bincount(np.minimum(kind, ends.size - 1), minlength=ends.size).astype(float)
        keep = counts > 0
        ends, counts = ends[keep], counts[keep]
        return ends, (counts / span if span > 0 else counts * math.inf)

    def reset(self, instance: Instance) -> None:
        self._setup(instance)
        d0, d1 = eq1_of(instance.time_model)
        d0 = self.d0 if self.d0 is not None else d0
        d1 = self.d1 if self.d1 is not None else d1
        prompt = round(float(self._prompt.mean()))
        ends, rates = self._read_design(instance, prompt, d0, d1)
        if self.given is not None:
            if len(self.given) != ends.size or min(self.given) < 1:
                raise InputError(f"policy {self.name!r}: given needs {ends.size} thresholds >= 1")
            design = NestedDesign(ends, rates, np.array(self.given, dtype=np.int64), math.nan, math.nan)
        else:
            burst = not np.isfinite(rates).all()  # every request at once: overload, counts as weights
            weights = np.asarray(self._burst_counts(instance, ends), dtype=float) if burst else rates
            design = nested_design(
                ends, weights, prompt, d0, d1, self._limits, mode=self.thresholds, margin=self.margin,
                eps=self.eps, batch_size=self.batch_size, buffer=self.buffer, delta=self.delta,
                horizon=self.horizon, overload=burst, strict=False,
            )  # fmt: skip
        self.design_ = design
        self.thresholds_ = design.thresholds
        self._starts = np.concatenate([[0], design.ends[:-1]])
        self.eq1_ = (d0, d1)

    def _burst_counts(self, instance: Instance, ends: np.ndarray) -> np.ndarray:
        if self.design == "given":
            return np.asarray(self.rates, dtype=float)
        src = [r.output if self.design == "outputs" else r.predicted_output for r in instance.requests]
        kind = np.minimum(np.searchsorted(ends, np.array(src), side="left"), ends.size - 1)
        return np.bincount(kind, minlength=ends.size)

    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, stage, side="right") - 1

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return stage == self._starts[group]

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        ok = entry_counts >= self.thresholds_
        return np.cumprod(ok).astype(bool)  # the prefix rule

    def _steady_limit(self, view: SchedulerView, req: np.ndarray, limit: int) -> int:
        """WAIT's run condition, with members that may cross into the next segment only in the drain.

        A member's segment, and whether it sits in its segment's entry queue, are
        read from its stage. Before the drain (requests still to arrive) a crossing
        can change the eligible prefix: the run ends before any member reaches the
        next segment's start (no run when one sat at its own start at call 0: it
        leaves the entry queue at call 1).

        In the drain every group with an active request is eligible, so all active
        requests stay kept whatever their segments. A segment is a range of stages,
        so (segment, stage) is the stage, and the order (segment, stage, running
        first, arrival) is the order (stage, running first, arrival): members still
        move together and keep their order, and a member meets an outsider exactly
        when it reaches the outsider's stage (WAIT's test on stages alone). What a
        crossing changes is the cap of its stage: the members sharing a call-0 stage
        ``s`` (``c`` of them, all selected) stay selected at ``s + j`` while
        ``c <= n`` of the segment of ``s + j``; the run ends before the first
        segment start where that fails.
        """
        act, stage, _ = self._kept
        member = np.zeros(view.n, dtype=bool)
        member[req] = True
        inside = member[act]
        s0 = stage[inside]  # call-0 stages of the members
        starts = self._starts
        if view.next_arrival() is not None:
            nxt = np.searchsorted(starts, s0, side="right")  # index of the next segment start
            if (starts[nxt - 1] == s0).any():
                return 0
            ahead = nxt < starts.size
            if ahead.any():
                limit = min(
                    limit, int((starts[np.minimum(nxt, starts.size - 1)][ahead] - s0[ahead]).min()) - 1
                )
                if limit <= 0:
                    return 0
            return super()._steady_limit(view, req, limit)
        outside = stage[~inside]
        one = np.zeros  # every stage in one group: the stage alone decides
        limit = self._apart(one(s0.size, np.int64), s0, one(outside.size, np.int64), outside, limit)
        stages, count = np.unique(s0, return_counts=True)
        # Segment starts above each members' stage whose cap is below the count of that stage.
        gap = starts[None, :] - stages[:, None]
        short = (gap > 0) & (self.thresholds_[None, :] < count[:, None])
        if short.any():
            limit = min(limit, int(gap[short].min()) - 1)
        return self._fitting(view, req, limit) if limit > 0 else 0


def segment_groups(m: int, count: int) -> list[np.ndarray]:
    """§7.2's partition of types ``0 .. m-1`` (sorted by length) into ``count`` consecutive segments.

    The paper takes ``Delta L = m / L`` types a segment (types 1 .. Delta L, Delta L + 1 ..
    2 Delta L, ...), assuming L divides m; otherwise (our reading) the sizes differ by
    at most one, the longer segments first (:func:`numpy.array_split`).
    """
    if not 1 <= count <= m:
        raise ValueError(f"need 1 <= segments <= {m} types; got {count}")
    return np.array_split(np.arange(m), count)


@dataclass(frozen=True, slots=True)
class SegmentChoice:
    """The outcome of §7.2's segment design (:func:`design_segments`).

    Parameters
    ----------
    count
        The chosen number of segments L.
    ends, rates
        Its segments: the longest output of each, and the aggregated rate ``lambda'_k``.
    memory
        Eq. (17)'s terms per candidate L = 1, 2, ... (rows): the batch memory
        ``M^pi`` (Term 1), the boundary queues ``sum_k (l + l'_{k-1}) n_k`` (Term 2) and the
        safety buffer ``sum_k (l + l'_{k-1}) ln(L B / delta) / theta_k`` (Term 3); ``inf``
        where Eq. (16) cannot hold (an unstable fluid, or a boundary with no negative drift).
    """

    count: int
    ends: np.ndarray
    rates: np.ndarray
    memory: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """Eq. (17)'s requirement per candidate L (the sum of the three terms)."""
        return self.memory.sum(axis=1)


def design_segments(
    lengths: Sequence[int],
    rates: Sequence[float],
    prompt: int,
    d0: float,
    d1: float,
    block_size: int = 1,
    *,
    max_segments: int = 64,
    eps: float = 0.05,
    delta: float = 0.1,
    horizon: int = 10_000,
) -> SegmentChoice | None:
    """§7.2's segment design: how many segments Nested WAIT should group its types into.

    Seed 002 §7.2 groups the m types (output lengths ``l'_1 < ... < l'_m``) into L
    consecutive equal-count segments (:func:`segment_groups`), each with the
    aggregated rate ``lambda'_k`` and a threshold satisfying Eq. (16), and plots
    Eq. (17)'s memory requirement against L (Figures 15-18): U-shaped, "too few
    segments waste memory by over-provisioning for heterogeneous types, ... too
    many ... increase overhead from maintaining separate queues". The paper names
    no selection rule; **our reading** takes the L (up to ``max_segments``; ties:
    the smallest) that minimises that requirement, with thresholds as
    :func:`nested_design` sizes them at the fluid equilibrium (``n_k = ceil(Delta T*
    Lambda_k (1 + eps)^(k-1))``, which meets Eq. (16) strictly) and the memory
    computed exactly rather than with the printed ``k Delta L / 2`` midpoints
    (digest ``002.md`` §7 item 9). Memory limits play no part: the requirement is
    what the design *needs*.

    Returns ``None`` when no L gives a finite requirement (overload: no equilibrium).
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    lens = np.asarray(lengths, dtype=np.int64)[order]
    lam = np.asarray(rates, dtype=float)[order]
    if lens.size == 0 or (np.diff(lens) <= 0).any() or lam.shape != lens.shape:
        raise InputError("segment design: lengths must be distinct, one rate each")
    unbounded = Limits(kv_capacity=2**62 // block_size * block_size, block_size=block_size)
    top = min(lens.size, max_segments)
    memory = np.full((top, 3), math.inf)
    for count in range(1, top + 1):
        groups = segment_groups(lens.size, count)
        ends = np.array([lens[g[-1]] for g in groups])
        seg = np.array([lam[g].sum() for g in groups])
        if not fluid_equilibrium(seg, np.full(count, prompt), ends, d0, d1).stable:
            continue
        d = nested_design(ends, seg, prompt, d0, d1, unbounded, eps=eps, delta=delta, horizon=horizon)
        if not math.isfinite(d.buffer):
            continue
        starts = np.concatenate([[0], ends[:-1]])
        boundary = block_size * -(-(prompt + starts[1:] - 1) // block_size)
        queues = float(boundary @ d.thresholds[1:])
        memory[count - 1] = (d.memory, queues, d.buffer - queues)
    total = memory.sum(axis=1)
    if not np.isfinite(total).any():
        return None
    best = int(np.argmin(total)) + 1
    groups = segment_groups(lens.size, best)
    return SegmentChoice(
        best,
        np.array([lens[g[-1]] for g in groups]),
        np.array([lam[g].sum() for g in groups]),
        memory,
    )
