"""Do the chain LP's fractional chains order requests better than the greedy? LP alpha-points (by hand).

Usage::

    python benchmarks/chain_alpha.py --folder DIR                     # Azure code 100 and 1k
    python benchmarks/chain_alpha.py --folder DIR --cases azure-conv-1k-rho1 --limit 420 --seconds 25

The classical LP-based orderings (Hall, Schulz, Shmoys and Wein 1997; Savelsbergh, Uma and Wein 2005) read
a time-indexed LP's *fractional primal*: each job's mass over time, ordered by an alpha-point (the time by
which a fraction alpha of it is done) or by its mean completion. Here the LP is the chain LP
(:mod:`kvsched.csp.bounds.chain`'s relaxation), solved by ``benchmarks/chain_colgen.py``'s column generation
(``--lagrangian`` seconds of the Lagrangian first, then up to ``--limit`` seconds; the primal of its last
restricted master is cached in ``FOLDER/NAME.primal.npz``): each request is a mixture of chains, so it has a
distribution of completion slots and of op slots. Keys per request: the mean completion slot, the completion
quantiles and the op-mass alpha-points at alpha = 0.2 / 0.5 / 0.8, the mean first-op and op slots.

Printed per case:

* **greedy alone** (``greedy``, preemptive, with and without the fill pass): the remaining-area greedy, each
  key as a static priority (absolute slots), each key as a *sojourn* (key - release + 1) static priority, and
  the remaining-area greedy with per-request scales (sojourn / mean)^p (a tilt of its moving key);
* **local search from each start for ``--seconds``** (``improve``, the pipeline's code path, with the chain
  guide at the Lagrangian's multipliers as the pipeline passes it): from the remaining-area greedy, from the
  tilted greedies (their scales multiply the tilt) and from the sojourn order (``improve(keys=)``);
* the same from two cheap primals: the cheapest chains at the Lagrangian's best multipliers (one pricing),
  and each request's completion averaged over the last half of ``--ergodic`` seconds of subgradient
  pricings from there;
* **where the best schedule loses against the LP, request by request**: its latency minus the LP's mean
  latency, summed over the requests the LP splits over several chains and over those it does not.

Every schedule is replayed by the core (``replay``) and its value checked against the search's. Unit time,
total latency, no token budget (``chain_colgen.py``'s scope). The machine is shared: the 1-minute load
average is printed with every row, and the arms run one after the other in one process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kvsched.csp.incumbents.lns as lns
from kvsched.csp.bounds._ascent import Ascent
from kvsched.csp.bounds._chain_kernels import chain_loads
from kvsched.csp.bounds.chain import ChainData, evaluate
from kvsched.csp.bounds.chain_guide import ChainGuide
from kvsched.csp.incumbents.base import Incumbent
from kvsched.csp.incumbents.greedy import greedy
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline

sys.path.insert(0, str(Path(__file__).parent))
import chain_colgen

CASES = ("azure-code-100-rho1", "azure-code-1k-rho1")
ALPHAS = (0.2, 0.5, 0.8)
#: Powers p of the tilt (sojourn / mean)^p on the remaining-area key.
POWERS = (0.5, 1.0, 2.0)
#: Chain weights below this are zero (HiGHS's primal tolerance).
WEIGHT_TOL = 1e-9


def master_primal(data: ChainData, horizon: int, y0: np.ndarray, upper: float, args, traces) -> dict:
    """Column generation as ``chain_colgen.py`` runs it; the last master's chain weights and op slots."""
    deadline = Deadline.after(args.limit)
    cg = chain_colgen.colgen(data, y0, upper, deadline, (0.9, 0.6, 0.3), 1e-4, args.seed, traces, "ipm")
    master = cg["lp"]
    if len(master.h.getSolution().col_value) != master.h.getNumCol():  # columns added after the last solve
        cg["master"] = min(cg["master"], master.solve()[0])
    x = np.array(master.h.getSolution().col_value)
    lam = x[master.first :]
    npre = np.diff(data.pre_offset)
    return {
        "lam": lam,
        "req": np.array([k[0] for k in master.keys], dtype=np.int64),
        "lens": np.array([s.size for s in master.slots], dtype=np.int64),
        "slots": np.concatenate(master.slots),
        "tail": x[horizon : horizon + data.n],  # each request's all-past-H chain
        "tail_first": np.maximum(horizon + npre, data.earliest),
        "arrival": data.arrival,
        "output": data.output,
        "H": horizon,
        "master": cg["master"],
        "best": cg["best"],
    }


def _quantile(values: np.ndarray, weights: np.ndarray, alpha: float) -> float:
    order = np.argsort(values, kind="stable")
    mass = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(mass / mass[-1], alpha - 1e-12)])


def primal_keys(primal: dict) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-request keys of the LP mixture (slots), and how many chains each request mixes."""
    lam, req, slots = primal["lam"], primal["req"], primal["slots"]
    starts = np.concatenate([[0], np.cumsum(primal["lens"])])
    n = primal["arrival"].size
    mix: list[list[tuple[float, np.ndarray]]] = [[] for _ in range(n)]
    for c in np.flatnonzero(lam > WEIGHT_TOL):
        mix[req[c]].append((float(lam[c]), slots[starts[c] : starts[c + 1]]))
    for j in np.flatnonzero(primal["tail"] > WEIGHT_TOL):
        mix[j].append((float(primal["tail"][j]), primal["tail_first"][j] + np.arange(primal["output"][j])))
    names = ["mean-completion", "mean-first-op", "mean-op"]
    names += [f"{kind}-{a}" for a in ALPHAS for kind in ("completion", "op-alpha")]
    keys = {k: np.zeros(n) for k in names}
    chains = np.array([len(m) for m in mix])
    for j, m in enumerate(mix):
        w = np.array([lw for lw, _ in m])
        w /= w.sum()
        done = np.array([s[-1] + 1.0 for _, s in m])
        ops = np.concatenate([s for _, s in m]).astype(np.float64)
        mass = np.concatenate([np.full(s.size, lw / s.size) for lw, s in m])
        keys["mean-completion"][j] = w @ done
        keys["mean-first-op"][j] = w @ np.array([s[0] for _, s in m], dtype=np.float64)
        keys["mean-op"][j] = mass @ ops / mass.sum()
        for a in ALPHAS:
            keys[f"completion-{a}"][j] = _quantile(done, w, a)
            keys[f"op-alpha-{a}"][j] = _quantile(ops, mass, a)
    return keys, chains


def cheap_completions(
    data: ChainData, y: np.ndarray, upper: float, seconds: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each request's completion slot in its cheapest chain at ``y``, and its mean over the last half of the
    pricings of ``seconds`` of subgradient ascent from ``y`` (``chain_colgen.py``'s seeding steps)."""
    done: list[np.ndarray] = []

    def price(point: np.ndarray, z: np.ndarray, reset: bool):
        found = chain_colgen.pricing(data, point)
        _, _, chains, pslot, pre, refilled = found
        done.append(chains[data.offset + data.output - 1] + 1.0)
        load, tokens = chain_loads(
            data.output, data.prompt, data.offset, data.block, chains, pslot, point.size, False, data.chunk,
            data.pre_offset, pre, refilled, True, data.growth,
        )  # fmt: skip
        return found[0], load, tokens

    Ascent(data, upper, price, factor=chain_colgen.SEED_FACTOR).run(
        y.copy(), np.zeros(0), Deadline.after(seconds), 10**6
    )
    return done[0], np.mean(done[len(done) // 2 :], axis=0)


def checked(instance: Instance, inc: Incumbent) -> float:
    """The schedule's total latency as the core replays it (equal to the search's own value)."""
    st = replay(instance, inc.schedule).state
    value = float(np.sum(st.completion - st.arrival))
    if abs(value - inc.value) > 1e-6 * max(1.0, value):
        raise AssertionError(f"replay {value} against {inc.value}")
    return value


def tilted(tilt: np.ndarray | None) -> Callable:
    """``lns.rerunner`` with its scales multiplied by ``tilt`` (so ``improve`` searches around the tilt)."""
    original = ORIGINAL_RERUNNER

    def rerunner(instance, incumbent, cost_model):
        rerun = original(instance, incumbent, cost_model)
        if rerun is None or tilt is None:
            return rerun
        return lambda scale, deadline, name: rerun(scale * tilt, deadline, name)

    return rerunner


#: ``improve`` looks its rerunner up in its module: :func:`tilted` replaces it for one search at a time.
ORIGINAL_RERUNNER = lns.rerunner


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def run_case(name: str, folder: Path, args) -> None:
    inst = chain_colgen.case_instance(name, folder)
    data = ChainData.from_instance(inst)
    lag = chain_colgen.cached_lagrangian(inst, name, folder, args.lagrangian)
    cache = folder / f"{name}.primal.npz"
    if not cache.exists():
        traces = []
        for policy in chain_colgen.POLICIES.split(","):
            with contextlib.suppress(KvschedError):  # a policy that cannot run this instance seeds nothing
                traces.append(simulate(inst, make_policy(policy)).trace)
        np.savez(cache, **master_primal(data, lag["y"].size, lag["y"], float(lag["upper"]), args, traces))
    primal = dict(np.load(cache))
    keys, chains = primal_keys(primal)
    release = np.floor(primal["arrival"])
    tie = 1e-6 * np.arange(len(inst))  # ties by position
    print(f"{name}: master {float(primal['master']):,.2f}, best L {float(primal['best']):,.2f}; "
          f"{int((chains > 1).sum())} of {chains.size} requests mix chains (at most {chains.max()})")  # fmt: skip
    prompt = np.array([r.prompt for r in inst.requests])
    for fill in (True, False):
        ra = greedy(inst, "remaining-area", preempt=True, fill=fill)
        print(f"  greedy alone, fill={fill}: remaining-area {checked(inst, ra):,.0f}  ({load()})")
        for k, v in keys.items():
            absolute = greedy(inst, priority=v + tie, preempt=True, fill=fill)
            soj = v - release + 1.0
            sojourn = greedy(inst, priority=soj + tie, preempt=True, fill=fill)
            tilts = [greedy(inst, preempt=True, fill=fill, scale=(soj / soj.mean()) ** p) for p in POWERS]
            print(f"    {k:16s} absolute {checked(inst, absolute):,.0f}  sojourn {checked(inst, sojourn):,.0f}  "
                  f"tilt p = {'/'.join(f'{p:g}' for p in POWERS)}: "
                  f"{' / '.join(f'{checked(inst, t):,.0f}' for t in tilts)}")  # fmt: skip
    y = lag["y"]
    guide = ChainGuide(data, y, np.zeros(0), evaluate(data, y, np.zeros(0)).price)
    arms: list[tuple[str, str, float]] = [("remaining-area", "", 0.0)]
    arms += [(f"tilt {k} p = {p:g}", k, p) for k in ("mean-completion", "op-alpha-0.8") for p in (1.0, 2.0)]
    arms += [(f"sojourn {k}", k, -1.0) for k in ("mean-completion", "op-alpha-0.5")]
    # Cheap primals the pipeline could afford: the cheapest chains at the Lagrangian's best y (one pricing)
    # and their completions averaged over a short subgradient run's pricings (volume-style, its last half).
    keys["y-chains"], keys["ergodic"] = cheap_completions(data, y, float(lag["upper"]), args.ergodic)
    arms += [(f"tilt {k} p = 1", k, 1.0) for k in ("y-chains", "ergodic")]
    arms += [("remaining-area (again)", "", 0.0)]
    best: Incumbent | None = None
    for label, k, p in arms:
        tic = time.perf_counter()
        deadline = Deadline.after(args.seconds)
        soj = keys[k] - release + 1.0 if k else None
        if p < 0:
            lns.rerunner = ORIGINAL_RERUNNER
            start = greedy(inst, priority=soj + tie, preempt=True, fill=True, deadline=deadline)
            found = lns.improve(inst, start, deadline, keys=soj + tie)
        else:
            tilt = (soj / soj.mean()) ** p if soj is not None else None
            lns.rerunner = tilted(tilt)
            start = greedy(inst, preempt=True, fill=True, scale=tilt, deadline=deadline)
            found = lns.improve(inst, start, deadline, guide=guide)
        lns.rerunner = ORIGINAL_RERUNNER
        value = checked(inst, found)
        if best is None or value < best.value:
            best = found
        print(f"  improve {args.seconds:g} s from {label:30s} {start.value:,.0f} -> {value:,.0f}  "
              f"({found.stats.get('evaluations')} candidates, {time.perf_counter() - tic:.1f} s, {load()})")  # fmt: skip
    assert best is not None
    st = replay(inst, best.schedule).state
    excess = (st.completion - st.arrival) - (keys["mean-completion"] - primal["arrival"])
    for label, mask in (("split", chains > 1), ("single", chains == 1)):
        print(f"  best {best.value:,.0f} - LP: {label} requests ({int(mask.sum())}, mean prompt "
              f"{prompt[mask].mean():,.0f}) {excess[mask].sum():,.1f}")  # fmt: skip
    for j in np.argsort(-excess)[:4]:
        q = [keys[f"completion-{a}"][j] - primal["arrival"][j] for a in ALPHAS]
        print(f"    request {j}: I {prompt[j]}, O {primal['output'][j]}, latency {st.completion[j] - st.arrival[j]:,.0f}"
              f" against the LP's mean {keys['mean-completion'][j] - primal['arrival'][j]:,.0f} "
              f"(completion quantiles {' / '.join(f'{v:,.0f}' for v in q)}, {chains[j]} chains)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = chain_colgen.colgen_arguments(__doc__, CASES, 500.0)
    parser.add_argument("--seconds", type=float, default=25.0, help="local search per start")
    parser.add_argument(
        "--ergodic", type=float, default=20.0, help="seconds of subgradient for the ergodic keys"
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in args.cases.split(","):
        run_case(name, folder, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
