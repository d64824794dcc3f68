"""A soundness fuzz campaign for every lower bound kvsched reports (issue #15; run by hand, not a test).

Usage::

    python benchmarks/bound_fuzz.py --tiny --cases 500 --seed 0          # against tests/brute.py's optimum
    python benchmarks/bound_fuzz.py --medium --cases 20 --time 600       # against every policy and the pipeline
    python benchmarks/bound_fuzz.py --cases 200 --time 900               # both (the time is split)

kvsched's rule is that a bound comes from a proof and a number is reported only if it is true. This script
looks for the opposite: an instance where some bound is above a schedule of the set the bound claims to cover
(every bound here claims scope ``all``: chunking, pauses, idling, evictions, budgets).

* ``--tiny``: n = 1..4 requests, I <= 4, O <= 3, small M, C, P and ``max_running``, arrivals at 0, spread
  over whole slots or fractional, under unit time (slot 1 and 0.5), infermax-linear (unit-scale and the
  default ms-scale coefficients), a stepped fit with a negative step, a hinge, a staircase, a model where a
  refill is cheaper than a decode, the shipped A100 stepped set, the roofline model and RAD's tiling model. Every bound function is compared
  *individually* against ``tests/brute.py``'s optimum with evictions (Dijkstra over engine states, judged by
  the semantic core) for the objective it bounds: the portfolio's bounds (all three objectives), the
  combinatorial bounds, each separable form's seconds bounds, the chain Lagrangian (ascent, every value of its
  history, forced block phase, random multipliers, its LP), the batch-count bound (with the unit copy's
  portfolio and with its true optimum), the seconds Lagrangian (ascent with a random legal schedule as the
  incumbent, history, random multipliers), the batch-rate LP and the processor-sharing LP on several grids.
  Every ``--solve-every``-th case also runs ``solve()`` (auto; eviction-free where the batch model takes the
  instance, against the eviction-free brute force), the certified pipeline, and under unit time the
  time-indexed model (scope ``contiguous``, against ``contiguous_brute_force``), and checks each result's
  claims: ``optimal`` only at bound == objective and at the optimum of its scope, the gap, bound <= incumbent,
  every bound in ``Result.bounds`` below the optimum of each scope it claims.
* ``--medium``: n = 20..300 from the ShareGPT and Azure generators (lengths scaled down so that 36 policies
  run in seconds) and adversarial shapes (one huge prompt, all outputs 1, M barely above the largest peak, C
  just above the largest prompt, bursts, arrivals after long idle gaps), under unit time, infermax-linear, the
  A100 stepped set (negative steps) and the unit-scale stepped fit. Every bound is compared against the best
  validated schedule of all registered policies (those refusing the instance skipped) and the pipeline's
  incumbent; the pipeline's ``Result`` is checked as above.

Prints one table (family, cases, bounds checked, violations, worst bound / reference) and every violation
with its instance (also written to ``--dump``), and exits 1 if any bound was above a schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.brute, tests.strategies

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.csp.bounds import chain as chain_mod
from kvsched.csp.bounds import chain_lagrangian, portfolio
from kvsched.csp.bounds import seconds_lagrangian as slag
from kvsched.csp.bounds.batch_count import batch_count_bound, unit_copy
from kvsched.csp.bounds.chain_blocks import block_spans
from kvsched.csp.bounds.combinatorial import lower_bounds
from kvsched.csp.bounds.fluid_lp import fluid_lp_anytime, fluid_lp_bound
from kvsched.csp.bounds.seconds import Tokens, seconds_bounds
from kvsched.csp.bounds.separable import separable_forms, tau_max
from kvsched.csp.bounds.sharing_lp import sharing_lp_bound
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.instances.io import instance_to_dict
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

ALL_OBJECTIVES = ("total-latency", "makespan", "sum-ttft")
#: Relative slack against float round-off (the certifier's own tolerance is 1e-6).
TOL = 1e-7

A100 = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))
#: (name, time model, arrival scale: one "slot" of arrivals in the model's time unit)
TINY_MODELS: tuple[tuple[str, TimeModel, float], ...] = (
    ("unit", TimeModel("unit"), 1.0),
    ("unit-half", TimeModel("unit", {"slot": 0.5}), 0.5),
    ("linear", TimeModel("infermax-linear", {"a0": 0.5, "a1": 0.1, "b0": 0.2, "b1": 0.05, "p0": 0.3, "p1": 0.02}), 1.0),
    ("linear-ms", TimeModel("infermax-linear"), 0.01),
    ("stepped", TimeModel("calibrated", {"a0": 0.6, "a1": 0.05, "step2": 0.5, "step3": -0.4, "b1": 0.02, "p1": 0.01}), 1.0),
    (
        "stepped-phases",
        TimeModel("calibrated", {"a0": 0.4, "a1": 0.05, "step2": 0.3, "step4": -0.25, "b0": 0.3, "p0": 0.5, "b1": 0.02, "b2": 0.03, "p1": 0.01, "p3": 0.05, "hinge3": 0.05, "tile3": 0.1}),
        1.0,
    ),
    ("hinge", TimeModel("hinge", {"c": 1.0, "a": 0.3, "b0": 2.0}), 1.0),
    ("staircase", TimeModel("staircase", {"c": 0.5, "a": 0.4, "b0": 2}), 1.0),
    ("refill-cheap", TimeModel("infermax-linear", {"a0": 0.2, "a1": 0.01, "b0": 0.05, "b1": 0.4, "p0": 0.05, "p1": 0.001}), 1.0),
    ("a100-stepped", A100, 0.02),
    ("roofline", TimeModel("roofline"), 0.007),
    ("rad", TimeModel("rad"), 0.008),
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ bookkeeping
@dataclass
class Tally:
    cases: int = 0
    checked: int = 0
    violations: int = 0
    worst: float = 0.0
    errors: int = 0


@dataclass
class Campaign:
    tallies: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    found: list[dict] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    skipped: int = 0

    def check(
        self, family: str, inst: Instance, what: str, objective: str, value: float, ref: float, how: str
    ) -> None:
        """One bound ``value`` against a schedule value ``ref`` of its scope (``how`` names the reference)."""
        if value is None or not math.isfinite(value):
            return
        t = self.tallies[family]
        t.checked += 1
        self.sources[f"{what} [{objective}]"] += 1
        if ref > 0:
            t.worst = max(t.worst, value / ref)
        if value > ref + TOL * max(1.0, abs(ref)):
            t.violations += 1
            self.found.append(
                {
                    "family": family,
                    "bound": what,
                    "objective": objective,
                    "value": value,
                    "reference": ref,
                    "reference_is": how,
                    "instance": instance_to_dict(inst),
                }
            )
            print(
                f"VIOLATION {family}: {what} [{objective}] = {value!r} > {how} {ref!r}\n  {inst_repr(inst)}"
            )

    def claim(self, family: str, inst: Instance, what: str, ok: bool, detail: str) -> None:
        """A solver-result claim (status, gap, scope) that must hold."""
        t = self.tallies[family]
        t.checked += 1
        self.sources[f"claim: {what}"] += 1
        if not ok:
            t.violations += 1
            self.found.append(
                {"family": family, "claim": what, "detail": detail, "instance": instance_to_dict(inst)}
            )
            print(f"VIOLATION {family}: claim {what}: {detail}\n  {inst_repr(inst)}")

    def error(self, family: str, inst: Instance, what: str) -> None:
        self.tallies[family].errors += 1
        print(f"ERROR {family} in {what}: {traceback.format_exc(limit=3)}\n  {inst_repr(inst)}")


def inst_repr(inst: Instance) -> str:
    lim = inst.limits
    reqs = ", ".join(f"({r.arrival:g}, {r.prompt}, {r.output})" for r in inst.requests[:8])
    more = "" if len(inst) <= 8 else f" ... ({len(inst)} requests)"
    return (
        f"requests (a, I, O): {reqs}{more}; M={lim.kv_capacity} block={lim.block_size} C={lim.max_batch_tokens} "
        f"P={lim.max_prefill_tokens} running={lim.max_running}; {inst.time_model.name}"
    )


def is_unit(inst: Instance) -> bool:
    return inst.time_model.name == "unit"


# --------------------------------------------------------------------------------------------- bound families
def every_bound(inst: Instance, rng: np.random.Generator, incumbent, *, tiny: bool, seconds: float) -> list:
    """(name, objective, value) of every bound function on ``inst``, each individually.

    ``incumbent`` is a validated trace (the Lagrangians' horizon and warm start: the bounds must hold whatever
    it is). ``seconds`` caps each iterative bound.
    """
    out: list[tuple[str, str, float]] = []
    for objective in ALL_OBJECTIVES:
        for b in portfolio(inst, objective):
            assert b.scope == Scope.ALL, b
            out.append((f"portfolio: {b.source}", objective, b.value))
    if is_unit(inst):
        lb = lower_bounds(inst)
        out += [
            ("combinatorial.isolated", "total-latency", lb.isolated),
            ("combinatorial.total_latency", "total-latency", lb.total_latency),
            ("combinatorial.makespan", "makespan", lb.makespan),
            ("combinatorial.sum_ttft", "sum-ttft", lb.sum_ttft),
            ("combinatorial.area", "total-latency", lb.area),
            ("combinatorial.makespan_area", "makespan", lb.makespan_area),
            ("combinatorial.makespan_tokens", "makespan", lb.makespan_tokens),
        ]
        out += _chain_bounds(inst, rng, incumbent, tiny=tiny, seconds=seconds)
        return out
    forms = separable_forms(instance_cost_model(inst), tau_max(inst))
    tok = Tokens.of(inst)
    for k, form in enumerate(forms):
        got = seconds_bounds(form, tok)
        for name, objective in (
            ("isolated", "total-latency"),
            ("work_area", "total-latency"),
            ("mbt", "total-latency"),
            ("makespan", "makespan"),
            ("ttft_isolated", "sum-ttft"),
            ("ttft_mbt", "sum-ttft"),
        ):
            out.append(
                (
                    f"seconds form {k}: {name}",
                    "total-latency" if objective == "total-latency" else objective,
                    getattr(got, name),
                )
            )
    if not forms:
        return out
    copy = unit_copy(inst)
    unit = max(b.value for b in portfolio(copy, "total-latency"))
    out.append(("batch-count (copy's portfolio)", "total-latency", batch_count_bound(inst, unit) or 0.0))
    lag = chain_lagrangian(copy, deadline=Deadline.after(seconds), max_iterations=40 if tiny else 300)
    out.append(
        (
            "batch-count (copy's chain Lagrangian)",
            "total-latency",
            batch_count_bound(inst, max(unit, lag.bound.value)) or 0.0,
        )
    )
    out += _seconds_lagrangian_bounds(inst, rng, incumbent, tiny=tiny, seconds=seconds)
    out += _lp_bounds(inst, rng, tiny=tiny, seconds=seconds)
    return out


def _chain_bounds(inst: Instance, rng: np.random.Generator, incumbent, *, tiny: bool, seconds: float) -> list:
    out = []
    for objective in ("total-latency", "sum-ttft"):
        lag = chain_lagrangian(
            inst,
            objective,
            incumbent=incumbent,
            deadline=Deadline.after(seconds),
            max_iterations=60 if tiny else 2000,
        )
        assert lag.bound.scope == Scope.ALL
        out.append(("chain-lagrangian", objective, lag.bound.value))
        out += [("chain-lagrangian history", objective, v) for _, v in lag.history]
        data = chain_mod.ChainData.from_instance(inst, objective)
        horizon = max(1, math.ceil(float(incumbent.state.completion.max()) / data.slot * 1.2) + 1)
        if tiny:
            # The block phase forced (tiny instances would otherwise skip to slots).
            blk = chain_lagrangian(
                inst, objective, incumbent=incumbent, max_iterations=40, spans=block_spans(horizon) or (2, 1)
            )
            out.append(("chain-lagrangian (blocks)", objective, blk.bound.value))
            out += [("chain-lagrangian (blocks) history", objective, v) for _, v in blk.history]
            # Any y, z >= 0 and any horizon give a bound: random multipliers, sparse and dense.
            for _ in range(6):
                h = int(rng.integers(1, 2 * horizon + 2))
                scale = rng.choice([0.05, 0.3, 1.0, 3.0])
                y = rng.exponential(scale, h) * (rng.random(h) < rng.uniform(0.2, 1.0))
                z = rng.exponential(scale / 4, h) if data.budget is not None else None
                out.append(
                    ("chain L(y, z) random", objective, data.to_bound(chain_mod.evaluate(data, y, z).value))
                )
            if data.n <= 3:
                from kvsched.csp.bounds.chain_lp import chain_lp

                value, _, _ = chain_lp(data, min(horizon, 24))
                out.append(("chain LP", objective, data.to_bound(value)))
    return out


def _seconds_lagrangian_bounds(
    inst: Instance, rng: np.random.Generator, incumbent, *, tiny: bool, seconds: float
) -> list:
    out = []
    try:
        lag = slag.seconds_lagrangian(
            inst, incumbent=incumbent, deadline=Deadline.after(seconds), max_iterations=40 if tiny else 200
        )
    except KvschedError as exc:  # a cost model it does not take
        return [("seconds-lagrangian refused: " + str(exc)[:40], "total-latency", -math.inf)]
    assert lag.bound.scope == Scope.ALL
    out.append(("seconds-lagrangian", "total-latency", lag.bound.value))
    out += [("seconds-lagrangian history", "total-latency", v) for _, v in lag.history]
    if tiny:
        data = slag.prepare(inst, incumbent)
        for _ in range(6):
            scale = float(rng.choice([0.1, 0.5, 2.0]))
            nw = data.windows
            mu = rng.exponential(scale, (len(data.forms), nw)) * (rng.random((len(data.forms), nw)) < 0.7)
            y = rng.exponential(scale / max(1, data.capacity), nw) * (rng.random(nw) < 0.5)
            z = (
                rng.exponential(scale / max(1, data.budget or 1), nw)
                if data.budget is not None
                else np.zeros(0)
            )
            alpha = rng.random(nw)
            value = slag.evaluate(data, mu, y, z, alpha).value
            out.append(("seconds L(mu, y, z, alpha) random", "total-latency", slag.to_bound(value)))
    return out


def _lp_bounds(inst: Instance, rng: np.random.Generator, *, tiny: bool, seconds: float) -> list:
    out = []
    if tiny:
        # One grid of each LP per case, drawn (each LP solve takes a second on this machine): fine and coarse
        # intervals, a window short enough to use the overflow, a tail that ends while requests still run.
        scale = _scale_of(inst)
        step, window = [(0.3, 50.0), (1.0, 50.0), (2.5, 3.0)][int(rng.integers(3))]
        got = fluid_lp_bound(inst, step=step * scale, window=window * scale)
        if got.bound is not None:
            out.append((f"batch-rate LP step {step} window {window}", "total-latency", got.bound.value))
        step, tail = [(None, None), (2.5, None), (None, 0.5), (0.7, 2.0)][int(rng.integers(4))]
        got = sharing_lp_bound(
            inst, step=None if step is None else step * scale, tail=None if tail is None else tail * scale
        )
        if got.bound is not None:
            out.append((f"sharing LP step {step} tail {tail}", "total-latency", got.bound.value))
            out += [("sharing LP history", "total-latency", v * (1 - 1e-9)) for _, v in got.history]
        return out
    for got in fluid_lp_anytime(inst, Deadline.after(seconds)):
        if got.bound is not None:
            out.append(("batch-rate LP (anytime)", "total-latency", got.bound.value))
    if len(inst) < 5000:
        got = sharing_lp_bound(inst, Deadline.after(seconds))
        if got.bound is not None:
            out.append(("sharing LP", "total-latency", got.bound.value))
    return out


def _scale_of(inst: Instance) -> float:
    """A batch's typical length in the model's time unit (the LP grids' steps are given in batches)."""
    cm = instance_cost_model(inst)
    from kvsched.schedule.core import EngineState

    s = EngineState(inst, cm)
    b = s.make_batch(0.0, [0], [1])
    return max(1e-6, float(b.duration))


# -------------------------------------------------------------------------------------------- solver claims
def check_result(camp: Campaign, family: str, inst: Instance, res, objective: str, refs: dict) -> None:
    """A Result's claims: optimal only at bound == objective, gap, bound <= every schedule of its scope.

    ``refs`` maps a scope to the optimum (tiny) or best known schedule value (medium) over it, with
    ``exact`` True when that value is an optimum.
    """
    from kvsched.csp.certify import tolerance
    from kvsched.csp.result import SolveStatus, relative_gap

    tag, obj, bound = f"{res.formulation}/{res.solver}", res.objective, res.best_bound

    def claim(what: str, ok: bool, detail: str) -> None:
        camp.claim(family, inst, f"{tag} {what}", ok, detail)

    if res.schedule is not None:
        value = OBJECTIVES[objective](replay(inst, res.schedule))
        claim("objective is its schedule's", abs(value - obj) <= tolerance(value), f"{obj} vs replay {value}")
    claim("gap", res.gap == relative_gap(obj, bound), f"gap {res.gap} for {obj}, {bound}")
    if bound is not None and obj is not None:
        claim("bound <= incumbent", bound <= obj + tolerance(obj), f"{bound} > {obj}")
    if res.status == SolveStatus.OPTIMAL:
        ok = bound is not None and abs(obj - bound) <= tolerance(obj)
        claim("optimal means bound == objective", ok, f"{obj} vs {bound}")
    if res.scope in refs:
        value, exact = refs[res.scope]
        if bound is not None:
            what = f"{tag} result bound ({res.bound_source})"
            camp.check(family, inst, what, objective, bound, value, f"{res.scope} reference")
        if exact and res.status == SolveStatus.OPTIMAL:
            ok = abs(obj - value) <= tolerance(value)
            claim("optimal is the optimum of its scope", ok, f"{obj} vs brute {value} ({res.scope})")
        if exact and obj is not None:
            claim("incumbent >= optimum", obj >= value - tolerance(value), f"{obj} < brute {value}")
    for b in res.bounds:  # each against the reference of every scope it covers
        for scope, (value, _) in refs.items():
            if b.holds_for(scope):
                what = f"{tag} result bounds: {b.source}"
                camp.check(family, inst, what, objective, b.value, value, f"{scope} reference")


# ------------------------------------------------------------------------------------------------------ tiny
def tiny_instance(rng: np.random.Generator) -> tuple[str, Instance]:
    name, model, scale = TINY_MODELS[int(rng.integers(len(TINY_MODELS)))]
    n = int(rng.choice([1, 2, 2, 3, 3, 3, 4]))
    # Sized for the brute force (Dijkstra over engine states and times): smaller as n grows.
    max_prompt, max_output = {1: (5, 4), 2: (4, 3), 3: (3, 3), 4: (3, 2)}[n]
    mode = "zero" if n == 4 else rng.choice(["zero", "slots", "fractional", "late"])
    reqs = []
    for k in range(n):
        if mode == "zero":
            a = 0.0
        elif mode == "slots":
            a = float(rng.integers(0, 4))
        elif mode == "fractional":
            a = float(np.round(rng.uniform(0, 4), 3))
        else:  # a long idle gap before some arrivals
            a = float(rng.choice([0.0, 6.0 + np.round(rng.uniform(0, 2), 2)]))
        reqs.append(
            Request(
                f"r{k}", a * scale, int(rng.integers(1, max_prompt + 1)), int(rng.integers(1, max_output + 1))
            )
        )
    block = int(rng.choice([1, 1, 1, 2]))
    peak = max(r.peak_kv for r in reqs)
    need = -(-peak // block) * block
    kv = need if rng.random() < 0.5 else need + int(rng.integers(0, 2 * need + 1))
    C = None if rng.random() < 0.4 else int(rng.integers(1, 7))
    P = None if rng.random() < 0.5 else int(rng.integers(1, 6))
    running = None if rng.random() < 0.7 else int(rng.integers(1, 4))
    lim = Limits(
        kv_capacity=kv, block_size=block, max_batch_tokens=C, max_prefill_tokens=P, max_running=running
    )
    inst = Instance(tuple(reqs), lim, model, name=f"tiny-{name}")
    inst.check_feasible()
    return name, inst


class TooSlow(Exception):
    """The brute force of a case ran past its cap (the case is skipped and counted)."""


def _alarm(signum, frame):
    raise TooSlow


def capped(seconds: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or :class:`TooSlow` after ``seconds`` of wall clock."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_tiny(camp: Campaign, seed: int, cases: int, stop: float, solve_every: int, brute_cap: float) -> int:
    from kvsched.csp import solve
    from kvsched.csp.pipeline import solve_pipeline
    from kvsched.csp.run import SolveLog
    from tests.brute import brute_force, contiguous_brute_force
    from tests.strategies import build_legal_schedule

    done = 0
    for case in range(cases):
        if time.monotonic() > stop:
            break
        rng = np.random.default_rng([seed, case])
        name, inst = tiny_instance(rng)
        family = f"tiny {name}"
        try:
            opt = {
                obj: capped(brute_cap, brute_force, inst, obj, allow_eviction=True) for obj in ALL_OBJECTIVES
            }
        except TooSlow:
            camp.skipped += 1
            continue
        camp.tallies[family].cases += 1
        done += 1
        if done % 50 == 0:
            checked = sum(t.checked for t in camp.tallies.values())
            print(f"  tiny: {done} cases, {checked} bounds checked, {len(camp.found)} violations", flush=True)
        try:
            built = build_legal_schedule(
                inst, rng, instance_cost_model(inst), p_evict=float(rng.choice([0.0, 0.3]))
            )
            incumbent = replay(inst, built.schedule)
            for obj in ALL_OBJECTIVES:  # the brute force is below a random legal schedule
                camp.claim(
                    family,
                    inst,
                    "brute <= random legal schedule",
                    opt[obj] <= OBJECTIVES[obj](incumbent) + 1e-9 * max(1.0, opt[obj]),
                    f"{obj}",
                )
            for what, objective, value in every_bound(inst, rng, incumbent, tiny=True, seconds=5.0):
                camp.check(family, inst, what, objective, value, opt[objective], "brute-force optimum")
            if not is_unit(inst):
                # The batch-count bound with the unit copy's true optimum (any valid unit bound may be used).
                try:
                    copy_opt = capped(
                        brute_cap, brute_force, unit_copy(inst), "total-latency", allow_eviction=True
                    )
                except TooSlow:
                    copy_opt = None
                if copy_opt is not None:
                    value = batch_count_bound(inst, copy_opt)
                    camp.check(
                        family,
                        inst,
                        "batch-count (copy's optimum)",
                        "total-latency",
                        value or 0.0,
                        opt["total-latency"],
                        "brute-force optimum",
                    )
        except Exception:
            camp.error(family, inst, "bounds")
            continue
        if solve_every and case % solve_every == 0:
            objective = ALL_OBJECTIVES[(case // solve_every) % 3]
            try:
                refs = {Scope.ALL: (opt[objective], True)}
                if inst.time_model.name in ("unit", "infermax-linear"):
                    with contextlib.suppress(TooSlow):
                        value = capped(brute_cap, brute_force, inst, objective, allow_eviction=False)
                        refs[Scope.NO_EVICTION] = (value, True)
                res = solve(inst, objective=objective, time_limit=10)
                check_result(camp, family + " (solve)", inst, res, objective, refs)
                if Scope.NO_EVICTION in refs:  # the eviction-free optimum and its scope (block size 1 only)
                    with contextlib.suppress(KvschedError):
                        res = solve(inst, objective=objective, time_limit=10, allow_eviction=False)
                        check_result(camp, family + " (solve, no eviction)", inst, res, objective, refs)
                res = solve_pipeline(SolveLog(inst, objective, None), objective, Deadline.after(6.0), None)
                check_result(camp, family + " (pipeline)", inst, res, objective, refs)
                if is_unit(inst):  # the time-indexed model and its Lagrangian windows: scope contiguous
                    with contextlib.suppress(TooSlow, KvschedError):
                        value = capped(brute_cap, contiguous_brute_force, inst, objective)
                        res = solve(inst, objective=objective, formulation="time", time_limit=10)
                        check_result(
                            camp, family + " (time)", inst, res, objective, {Scope.CONTIGUOUS: (value, True)}
                        )
            except Exception:
                camp.error(family, inst, "solve")
    return done


# ---------------------------------------------------------------------------------------------------- medium
def _requests(arrival, prompt, output) -> tuple[Request, ...]:
    return tuple(
        Request(f"r{k}", float(a), int(i), int(o))
        for k, (a, i, o) in enumerate(zip(arrival, prompt, output, strict=True))
    )


def medium_instance(rng: np.random.Generator, case: int) -> tuple[str, Instance]:
    """A medium instance of one of the families (cycled by ``case``), under a drawn cost model."""
    from kvsched import generate

    kinds = (
        "sharegpt",
        "azure-conv",
        "azure-code",
        "huge-prompt",
        "outputs-1",
        "tight-M",
        "tight-C",
        "bursts",
        "idle-gaps",
    )
    kind = kinds[case % len(kinds)]
    models = (
        ("unit", TimeModel("unit"), 1.0),
        ("linear-ms", TimeModel("infermax-linear"), 0.02),
        ("a100-stepped", A100, 0.03),
        ("stepped", TINY_MODELS[4][1], 1.0),
    )
    mname, model, scale = models[int(rng.integers(len(models)))]
    n = int(rng.integers(20, 301)) if rng.random() < 0.15 else int(rng.integers(20, 121))
    if kind in ("sharegpt", "azure-conv", "azure-code"):
        big = Limits(kv_capacity=10**6)
        params = {} if kind == "sharegpt" else {"sample": "random"}
        base = generate(
            kind, n=n, seed=int(rng.integers(2**31)), limits=big, time_model=TimeModel("unit"), **params
        )
        div = float(rng.choice([10, 20, 40]))
        prompt = np.array([max(1, round(r.prompt / div)) for r in base.requests])
        output = np.array([max(1, round(r.output / div)) for r in base.requests])
        if rng.random() < 0.5:
            arrival = np.zeros(n)
        else:
            rate = rng.uniform(0.05, 1.0)
            arrival = np.cumsum(rng.exponential(1 / rate, n)) * scale
    else:
        prompt = rng.integers(1, 40, n)
        output = rng.integers(1, 30, n)
        arrival = np.zeros(n)
        if kind == "huge-prompt":
            prompt[int(rng.integers(n))] = int(rng.integers(300, 1500))
        elif kind == "outputs-1":
            output[:] = 1
        elif kind == "bursts":
            starts = np.sort(rng.uniform(0, 50, int(rng.integers(2, 6)))) * scale
            arrival = rng.choice(starts, n) + rng.uniform(0, 0.05, n) * scale
        elif kind == "idle-gaps":
            gaps = np.where(rng.random(n) < 0.1, rng.uniform(200, 2000, n), rng.exponential(1.0, n))
            arrival = np.cumsum(gaps) * scale
        if kind in ("tight-M", "tight-C") and rng.random() < 0.5:
            arrival = np.cumsum(rng.exponential(2.0, n)) * scale
    arrival = np.round(arrival - arrival.min(), 6)
    reqs = _requests(arrival, prompt, output)
    peak = max(r.peak_kv for r in reqs)
    block = int(rng.choice([1, 1, 16])) if kind != "tight-M" else 1
    if kind == "tight-M":
        kv = peak + int(rng.integers(0, 3))
    else:
        kv = max(peak, int(rng.uniform(0.1, 0.6) * sum(r.peak_kv for r in reqs)))
    kv = -(-kv // block) * block
    C = P = None
    if kind == "tight-C":
        C = int(prompt.max()) + int(rng.integers(1, 4))
    elif rng.random() < 0.5:
        C = int(rng.choice([16, 32, 64, 128]))
        P = None if rng.random() < 0.5 else C
    running = None if rng.random() < 0.8 else int(rng.integers(2, 32))
    lim = Limits(
        kv_capacity=kv, block_size=block, max_batch_tokens=C, max_prefill_tokens=P, max_running=running
    )
    inst = Instance(reqs, lim, model, name=f"{kind}-{mname}")
    inst.check_feasible()
    return f"{kind} {mname}", inst


def policy_values(inst: Instance) -> dict[str, tuple[float, object]]:
    """Per objective: the best validated policy schedule's value and its trace (policies refusing skipped)."""
    from kvsched.heuristics import POLICIES, make_policy, simulate

    best: dict[str, tuple[float, object]] = {}
    for name in POLICIES:
        try:
            trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        except KvschedError:
            continue
        for obj in ALL_OBJECTIVES:
            v = OBJECTIVES[obj](trace)
            if obj not in best or v < best[obj][0]:
                best[obj] = (v, trace)
    return best


def run_medium(camp: Campaign, seed: int, cases: int, stop: float, solve_seconds: float) -> int:
    from kvsched.csp import solve

    done = 0
    for case in range(cases):
        if time.monotonic() > stop:
            break
        rng = np.random.default_rng([seed, 10**6 + case])
        try:
            name, inst = medium_instance(rng, case)
        except KvschedError:
            continue
        family = f"medium {name}"
        camp.tallies[family].cases += 1
        done += 1
        t0 = time.monotonic()
        try:
            best = policy_values(inst)
            res = solve(inst, objective="total-latency", time_limit=solve_seconds)
            ref = {obj: best[obj][0] for obj in best}
            if res.objective is not None:
                ref["total-latency"] = min(ref.get("total-latency", math.inf), res.objective)
            trace = best["total-latency"][1]
            for what, objective, value in every_bound(inst, rng, trace, tiny=False, seconds=4.0):
                camp.check(family, inst, what, objective, value, ref[objective], "best validated schedule")
            check_result(
                camp,
                family + " (solve)",
                inst,
                res,
                "total-latency",
                {Scope.ALL: (ref["total-latency"], False)},
            )
        except Exception:
            camp.error(family, inst, "medium")
        print(f"  medium case {case} ({family}, n={len(inst)}): {time.monotonic() - t0:.1f} s", flush=True)
    return done


# ------------------------------------------------------------------------------------------------------ main
def print_table(camp: Campaign, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("family", "cases", "bounds checked", "violations", "errors", "worst bound / reference"):
        table.add_column(col, justify="left" if col == "family" else "right")
    total = Tally()
    for family in sorted(camp.tallies):
        t = camp.tallies[family]
        table.add_row(
            family, str(t.cases), str(t.checked), str(t.violations), str(t.errors), f"{t.worst:.4f}"
        )
        total.cases += t.cases
        total.checked += t.checked
        total.violations += t.violations
        total.errors += t.errors
        total.worst = max(total.worst, t.worst)
    table.add_row(
        "all",
        str(total.cases),
        str(total.checked),
        str(total.violations),
        str(total.errors),
        f"{total.worst:.4f}",
        style="bold",
    )
    Console(width=160).print(table)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=200, help="cases per selected family group")
    ap.add_argument("--time", type=float, default=600.0, help="wall-clock seconds for the whole campaign")
    ap.add_argument("--tiny", action="store_true", help="tiny instances against the brute force")
    ap.add_argument(
        "--medium", action="store_true", help="medium instances against every policy and the pipeline"
    )
    ap.add_argument(
        "--solve-every",
        type=int,
        default=10,
        help="tiny: run solve and the pipeline on every k-th case (0: never)",
    )
    ap.add_argument(
        "--brute-cap", type=float, default=2.0, help="tiny: skip a case whose brute force takes longer"
    )
    ap.add_argument("--solve-seconds", type=float, default=8.0, help="medium: the pipeline's time limit")
    ap.add_argument(
        "--sources", action="store_true", help="also print how often each bound source was checked"
    )
    ap.add_argument(
        "--dump", type=Path, default=None, help="write the violations (with instances) to this JSON file"
    )
    args = ap.parse_args(argv)
    if not args.tiny and not args.medium:
        args.tiny = args.medium = True
    start = time.monotonic()
    camp = Campaign()
    signal.signal(signal.SIGTERM, _interrupted)  # kill PID: stop and print what was checked so far
    try:
        if args.tiny:
            share = args.time if not args.medium else 0.6 * args.time
            run_tiny(camp, args.seed, args.cases, start + share, args.solve_every, args.brute_cap)
        if args.medium:
            run_medium(camp, args.seed, args.cases, start + args.time, args.solve_seconds)
    except KeyboardInterrupt:
        print("interrupted: the table covers the cases finished so far")
    print_table(camp, f"bound fuzz: seed {args.seed}, {time.monotonic() - start:.0f} s")
    if camp.skipped:
        print(f"{camp.skipped} tiny case(s) skipped: brute force over --brute-cap {args.brute_cap:g} s")
    if args.sources:
        for source, count in sorted(camp.sources.items()):
            print(f"{count:8d}  {source}")
    if args.dump is not None:
        args.dump.write_text(json.dumps(camp.found, indent=1, default=str))
    if camp.found:
        print(f"{len(camp.found)} violation(s): a bound above a schedule of its scope, or a false claim")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
