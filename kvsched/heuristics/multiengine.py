"""Several identical engines behind a load balancer (seed 001 Sec. 4.1, Proposition 1).

Each request is sent to one of K engines when it arrives; every engine runs its
own copy of a policy on the requests it was sent (its *sub-instance*) in the
ordinary simulator, so every engine's schedule is stepped and validated through
the semantic core. The balancers of seed 001 Sec. 4.1:

* ``random``: uniformly at random (seeded);
* ``jlr``, join the least requests: the engine with the fewest requests sent to
  it and not yet completed;
* ``jlot``, join the least outstanding tokens: the engine with the fewest tokens
  still to process, counted as ``lengths`` says:

  - ``"known"`` (default): what the engine knows, the unprocessed prompt (or
    refill) tokens plus one token per decoding request;
  - ``"predicted"``: each unfinished request's I + Ô - 1 minus its KV, Ô its
    ``predicted_output`` (at least G + 1);
  - ``"true"``: the same with the true O (hindsight, for comparison).

Ties go to the lowest engine index.

How the engine states at an arrival are known
---------------------------------------------
A balancer needs every engine's state at the arrival time, which depends on what
was sent to it before. :func:`~kvsched.heuristics.simulator.simulate` runs a
whole instance at once and cannot take a request mid-run, so dispatch is decided
by stepping the K engines in lock-step, event by event, through the single
engine's step loop (:class:`~kvsched.heuristics.step.Stepper`: decided when a
batch starts, applied by the semantic core when it ends), each policy seeing
only the requests sent to its engine. The policy is asked for a batch exactly
when :func:`simulate` would ask it: when the engine's previous batch ends, or at
the arrival of a request sent to an idle engine; a decision at an arrival time
is made once every request of that time has been sent. Coalesced decode runs
are cut at the next dispatch: a run holds only the batches that batch-by-batch
stepping would decide before it and apply by it. At an arrival the
balancer sees the state after every batch that has ended by then (a batch still
running has not completed anything).

The results are then the ordinary :func:`simulate` of every engine's
sub-instance (its core checks every batch; its trace is what
:func:`~kvsched.schedule.validate.replay` of the schedule would build). For a
causal policy the two runs are the same trajectory, so the balancer saw exactly
the states the reported runs went through; :attr:`MultiEngineResult.consistent`
checks that, engine by engine. Policies that read the whole instance up front
(WAIT's designed thresholds, MC-SF's semi-online checks) are reset on the whole
instance in the lock-step run and on their sub-instance in the reported one, so
for them the check can fail: dispatch then followed an approximate trajectory.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from kvsched.costmodel import CostModel
from kvsched.errors import InputError
from kvsched.heuristics.base import Policy
from kvsched.heuristics.priority import GatedView
from kvsched.heuristics.registry import make_policy
from kvsched.heuristics.simulator import SimResult, simulate
from kvsched.heuristics.step import Stepper
from kvsched.instances.model import Instance
from kvsched.schedule.core import TIME_TOL
from kvsched.schedule.ir import Batch, Run, Schedule
from kvsched.schedule.metrics import request_metrics, time_unit
from kvsched.schedule.tokens import first_arrival
from kvsched.schedule.validate import Trace, instance_cost_model

if TYPE_CHECKING:
    import pandas as pd

Balancer = Literal["random", "jlr", "jlot"]
Lengths = Literal["known", "predicted", "true"]
BALANCERS: tuple[str, ...] = get_args(Balancer)


class _LiveEngine:
    """One engine stepped in lock-step over the whole instance, seeing only what was sent to it.

    It runs the single engine's step loop (:class:`~kvsched.heuristics.step.Stepper`):
    a batch (or a coalesced run) is decided when the previous one ends (or at the
    arrival of a request sent to an idle engine) and committed when it ends. A
    run is cut at the next dispatch (the ``horizon`` of :meth:`Stepper.decide`):
    it holds only batches that batch-by-batch stepping would decide before the
    dispatch and commit by it, so the balancer sees the same states.
    """

    def __init__(self, instance: Instance, policy: Policy, cost_model: CostModel, coalesce: bool) -> None:
        self.stepper = Stepper(instance, policy, cost_model, coalesce=coalesce)
        self.state = self.stepper.state
        self.gated = GatedView(self.stepper.view)
        self.sent: list[int] = []
        self.pending: Batch | Run | None = None
        self.decide_at: float | None = 0.0  # None: idle until a request is sent

    @property
    def entries(self) -> list[Batch | Run]:
        """The batches and runs decided so far (the committed ones, then the one running)."""
        done = self.stepper.entries
        return done if self.pending is None else [*done, self.pending]

    def send(self, j: int, t: float) -> None:
        self.sent.append(j)
        self.gated.reveal([j])
        self.stepper.forget_repeat()  # the policy sees the new request at its next decision
        if self.decide_at is None and self.pending is None:
            self.decide_at = t

    def advance(self, t: float) -> None:
        """Apply the batches that end by ``t``; make the decisions due strictly before ``t``."""
        stepper = self.stepper
        while True:
            if self.pending is not None:
                if self.pending.end > t + TIME_TOL:
                    return
                stepper.commit(self.pending)
                self.pending = None
                self.decide_at = self.state.clock
            if self.decide_at is None or self.decide_at >= t - TIME_TOL:
                return
            now = max(self.decide_at, self.state.clock)
            self.pending = stepper.decide(now, self.gated, t)  # type: ignore[arg-type]
            if self.pending is None:
                self.decide_at = None  # every request sent so far has arrived: idle until the next

    def load(self, what: str, outputs: np.ndarray | None) -> int:
        """Unfinished requests (``"jlr"``) or outstanding tokens (``"jlot"``) sent to this engine."""
        sent = np.asarray(self.sent, dtype=np.int64)
        open_ = sent[~self.state.done[sent]]
        if what == "jlr":
            return int(open_.size)
        st = self.state
        out = (
            st.generated[open_] + 1
            if outputs is None
            else np.maximum(outputs[open_], st.generated[open_] + 1)
        )
        return int((st.prompt[open_] + out - 1 - st.kv[open_]).sum())


_Segment = tuple[int, np.ndarray, np.ndarray | None]


def _segments(entries: Sequence[Batch | Run]) -> tuple[np.ndarray, list[_Segment]]:
    """Every batch's start, and each entry as (the index after its last batch, requests, tokens).

    A decode-only run's tokens are ``None`` (one per request in every batch).
    """
    starts: list[np.ndarray] = []
    segments: list[_Segment] = []
    end = 0
    for e in entries:
        if type(e) is Run:
            starts.append(e.starts())
            end += e.repeat
            if e.chunk is None:
                segments.append((end, e.requests, None))
            else:
                req, tok, _ = e.items()  # the decodes, then the chunk
                if e.chunk.last:  # the last batch's chunk is the prompt's rest
                    segments.append((end - 1, req, tok))
                    tok = e.last_tokens()
                segments.append((end, req, tok))
        else:
            starts.append(np.array([e.start]))
            end += 1
            segments.append((end, e.requests, e.tokens))  # type: ignore[union-attr]
    return (np.concatenate(starts) if starts else np.zeros(0)), segments


def _same_tokens(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        other = b if a is None else a
        return other is None or bool((other == 1).all())
    return np.array_equal(a, b)


def _same_start(online: Sequence[Batch | Run], final: Schedule, sent: list[int], n: int) -> bool:
    """Whether the lock-step batches are the first batches of the reported run (positions mapped).

    The two sides may cut runs differently, so every batch's start is compared,
    then the requests and tokens once per piece in which neither side changes entry.
    """
    a_starts, a_segs = _segments(online)
    b_starts, b_segs = _segments(final.entries)
    m = a_starts.size
    if m > b_starts.size:
        return False
    b_starts = b_starts[:m]
    if (np.abs(a_starts - b_starts) > TIME_TOL * np.maximum(1.0, np.abs(a_starts))).any():
        return False
    local = np.full(n, -1, dtype=np.int64)
    local[np.sort(np.asarray(sent, dtype=np.int64))] = np.arange(len(sent))
    i = j = 0
    while i < len(a_segs):
        a_end, a_req, a_tok = a_segs[i]
        b_end, b_req, b_tok = b_segs[j]
        if not np.array_equal(local[a_req], b_req) or not _same_tokens(a_tok, b_tok):
            return False
        # Step past whichever entry ends first (both, when they end together).
        i += a_end <= b_end
        j += b_end <= a_end
    return True


@dataclass(frozen=True, slots=True, eq=False)
class MultiEngineResult:
    """The outcome of :func:`simulate_engines`.

    Parameters
    ----------
    instance
        The whole workload.
    balancer, lengths
        How requests were dispatched.
    dispatch
        The engine each request (by position in ``instance``) was sent to.
    engines
        Each engine's sub-instance (its requests keep their ids).
    results
        Each engine's simulation (``None`` for an engine that got nothing).
    traces
        Each engine's trace, as the simulator's core checked and applied its schedule (what a
        strict :func:`~kvsched.schedule.validate.replay` would build).
    consistent
        Per engine, whether the lock-step run the balancer watched is the
        start of the reported run (always, for causal policies).
    runtime
        Wall-clock seconds in all.
    """

    instance: Instance
    balancer: str
    lengths: str
    dispatch: np.ndarray
    engines: tuple[Instance, ...]
    results: tuple[SimResult | None, ...]
    traces: tuple[Trace | None, ...]
    consistent: tuple[bool, ...]
    runtime: float

    def request_metrics(self) -> pd.DataFrame:
        """:func:`~kvsched.schedule.metrics.request_metrics` of every engine, with an ``engine`` column."""
        import pandas as pd  # only for the frame: a single-engine `simulate` need not import pandas

        frames = []
        for k, trace in enumerate(self.traces):
            if trace is not None:
                frame = request_metrics(trace)
                frame.insert(0, "engine", k)
                frames.append(frame)
        merged = pd.concat(frames)
        return merged.loc[[r.id for r in self.instance.requests]]

    def summary(self) -> dict[str, Any]:
        """Whole-system figures over every engine (times in the instance's unit)."""
        req = self.request_metrics()
        done = [t for t in self.traces if t is not None]
        makespan = max((t.state.clock for t in done), default=0.0)
        # Rates from the first arrival, as the serving metrics' duration; named by the time unit.
        span = makespan - first_arrival(done)
        generated = int(req["generated"].sum())
        slo = req["slo_met"].dropna()
        return {
            "engines": len(self.engines),
            "balancer": self.balancer,
            "requests_per_engine": [len(e) for e in self.engines],
            "num_requests": len(req),
            "num_completed": int(req["complete"].sum()),
            "makespan": makespan,
            "mean_latency": float(req["latency"].mean()),
            "p50_latency": float(req["latency"].quantile(0.5)),
            "p99_latency": float(req["latency"].quantile(0.99)),
            "mean_ttft": float(req["ttft"].mean()),
            "p50_ttft": float(req["ttft"].quantile(0.5)),
            "p99_ttft": float(req["ttft"].quantile(0.99)),
            "max_tbt": float(req["tbt_max"].max()),
            f"tokens_per_{time_unit(self.instance)}": generated / span if span > 0 else float("nan"),
            "evictions": int(req["evictions"].sum()),
            "batches": sum(len(t.records) for t in done),
            "slo_attainment": float(slo.astype(bool).mean()) if len(slo) else None,
            "consistent": all(self.consistent),
        }


def sub_instance(instance: Instance, positions: list[int], engine: int) -> Instance:
    """The requests at ``positions`` (in instance order) as engine ``engine``'s own instance."""
    reqs = tuple(instance.requests[p] for p in sorted(positions))
    meta = {**instance.meta, "engine": engine}
    return dataclasses.replace(
        instance, requests=reqs, name=f"{instance.name or 'instance'}@engine{engine}", meta=meta
    )


#: The most engines behind one balancer: far above any deployment, and built in seconds.
MAX_ENGINES = 10_000


def simulate_engines(
    instance: Instance,
    policy: str,
    *,
    engines: int,
    balancer: Balancer = "jlr",
    params: Mapping[str, Any] | None = None,
    lengths: Lengths = "known",
    seed: int = 0,
    cost_model: CostModel | None = None,
    coalesce: bool = True,
) -> MultiEngineResult:
    """Dispatch ``instance`` over ``engines`` copies of ``policy`` and simulate each (see the module docstring).

    Parameters
    ----------
    instance
        The whole workload.
    policy, params
        Registry name and parameters of the policy every engine runs.
    engines
        K, the number of identical engines (each with the instance's limits and time model).
    balancer
        ``"random"``, ``"jlr"`` or ``"jlot"``.
    lengths
        How ``jlot`` counts outstanding tokens.
    seed
        Seed of the ``random`` balancer.
    cost_model
        Batch durations; defaults to the instance's own time model.
    coalesce
        Let a policy that opted in repeat decode-only batches as coalesced runs,
        in the lock-step run and in every engine's simulation (same batches,
        same dispatch, shorter storage).

    Raises
    ------
    InputError
        For a bad number of engines, balancer or lengths (or predictions missing for ``lengths="predicted"``).
    """
    if not isinstance(engines, int) or isinstance(engines, bool) or not 1 <= engines <= MAX_ENGINES:
        # 10^8 engines: the command built their states for minutes (each engine costs ~0.3 ms).
        raise InputError(f"engines must be a whole number in 1..{MAX_ENGINES:,}, got {engines!r}")
    if balancer not in BALANCERS:
        raise InputError(f"balancer must be one of {', '.join(BALANCERS)}; got {balancer!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"seed (--balancer-seed) must be a whole number >= 0, got {seed!r}")
    if lengths not in get_args(Lengths):
        raise InputError(f"lengths must be one of {', '.join(get_args(Lengths))}; got {lengths!r}")
    if lengths == "predicted" and any(r.predicted_output is None for r in instance.requests):
        raise InputError("lengths=predicted: some requests carry no predicted_output")
    wall = time.perf_counter()
    params = dict(params or {})
    cost = cost_model if cost_model is not None else instance_cost_model(instance)
    instance.check_feasible()
    outputs = None
    if lengths == "predicted":
        outputs = np.array([r.predicted_output for r in instance.requests], dtype=np.int64)
    elif lengths == "true":
        outputs = np.array([r.output for r in instance.requests], dtype=np.int64)
    live = [_LiveEngine(instance, make_policy(policy, **params), cost, coalesce) for _ in range(engines)]
    rng = np.random.default_rng(seed)
    arrival = np.array([r.arrival for r in instance.requests], dtype=np.float64)
    dispatch = np.full(len(instance), -1, dtype=np.int64)
    for j in np.argsort(arrival, kind="stable").tolist():
        t = float(arrival[j])
        if balancer == "random":
            k = int(rng.integers(engines))
        else:
            for eng in live:
                eng.advance(t)
            k = int(np.argmin([eng.load(balancer, outputs) for eng in live]))
        live[k].send(j, t)
        dispatch[j] = k

    subs = tuple(sub_instance(instance, eng.sent, k) for k, eng in enumerate(live))
    results = tuple(
        simulate(sub, make_policy(policy, **params), cost, coalesce=coalesce) if eng.sent else None
        for sub, eng in zip(subs, live, strict=True)
    )
    # The core checked every batch and run of each engine as its simulation made them (one pass, as
    # a single-engine simulate): the simulator's own trace is what replay would build.
    traces = tuple(res.trace if res is not None else None for res in results)
    consistent = tuple(
        res is None or balancer == "random" or _same_start(eng.entries, res.schedule, eng.sent, len(instance))
        for eng, res in zip(live, results, strict=True)
    )
    return MultiEngineResult(
        instance, balancer, lengths, dispatch, subs, results, traces, consistent, time.perf_counter() - wall
    )


__all__ = ["BALANCERS", "Balancer", "Lengths", "MultiEngineResult", "simulate_engines", "sub_instance"]
