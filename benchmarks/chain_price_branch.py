"""Price and branch on the chain relaxation: do its integer points beat the pipeline? (run by hand, not a test).

Usage::

    python benchmarks/chain_price_branch.py --folder DIR                       # Azure code 100
    python benchmarks/chain_price_branch.py --folder DIR --cases azure-code-1k-rho1 --prefix 300 --mip 300

Under unit time, total latency, no token budget and whole-slot arrivals the chain relaxation's integer
version *is* the problem (``chain_milp.py``'s docstring): one chain of op slots per request, the ops of a
slot holding at most M. So any integer point of the column generation's restricted master is a legal
schedule. This script measures whether such points beat the pipeline's schedule:

1. the pipeline's schedule ``U`` (``FOLDER/NAME.sched.json`` from ``kvsched solve NAME.json --time-limit 60
   -o ...``; else ``chain_milp.incumbent_of``'s incumbent stage plus local search);
2. the chain Lagrangian (``--lagrangian`` seconds) and, from its multipliers padded with zeros to ``H'``
   slots (past the pipeline's last op, ``--pad`` more, so that the memory rows cover every slot the
   schedules use), ``chain_colgen.colgen`` until the master is the LP (or ``--colgen`` seconds): the pool
   holds the chains of the pipeline's schedule, of the ``chain_colgen.POLICIES``' schedules, of the seeding
   ascent and of every pricing;
3. **reinsertion** (``--reinsert`` seconds): each request in turn (latest finishers first) taken out of the
   pipeline's chains and put back on its earliest-finishing chain in the KV the others leave (an exact
   programme over (ops done, slot)), passes until none improves; every chain found joins the pool, and the
   result warm-starts the MIP (a 1-opt check of the pipeline's schedule in the chain model);
4. the **restricted master as a MIP** (HiGHS, ``--threads``, ``--mip`` seconds): binary lambda, one chain
   per request, memory rows ``<= M`` on every slot ``< H'`` written plainly (not differenced: HiGHS's
   knapsack cuts need the rows), chains with an op at ``>= H'`` and the zero-price tails left out, warm
   started with the pipeline's chains. Its proven bound is a bound over the *pool* only (restricted
   columns), not on the problem;
5. optionally (``--dive`` seconds) a diving heuristic: fix the requests integral in the master and the one
   of largest fractional lambda (to its chain of largest lambda that fits the KV the fixed ones leave),
   re-solve the master with pricing (``colgen`` again on the same pool), repeat until all are fixed;
6. each integer point decoded into a schedule (``window.plan_schedule``: one batch per slot, paused
   requests evicted where needed, free here) and **replayed by the core**; the value reported is the
   replay's total latency.

Each row prints: the instance, n, H', U, the Lagrangian, column generation's best L and master (the LP),
the pool's columns, the MIP's value and bound (restricted), its status and seconds, the replayed value
of its schedule, the reinsertion's and the dive's replayed values, and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from kvsched.csp.bounds.chain import ChainData
from kvsched.csp.bounds.seconds_lagrangian import incumbent_chains
from kvsched.csp.incumbents.window import OpPlan, plan_schedule
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.highs import new_highs, run_highs, use_highs_threads
from kvsched.instances.io import save_instance
from kvsched.instances.model import Instance
from kvsched.schedule.validate import Trace, instance_cost_model, replay
from kvsched.stop import Deadline

sys.path.insert(0, str(Path(__file__).parent))
import chain_colgen
import chain_milp

#: Source name on the decoded schedules.
SOURCE = "chain-price-branch"


class Pool(chain_colgen.Master):
    """The colgen master that also keeps every column's chain (its op slots below the horizon).

    Without a chunk cap a column's rows are its ops' slots (< H) and its values their KV, so the
    chain is whole exactly when it has ``O_j`` rows; the zero-price tails have none.
    """

    def __init__(self, data: ChainData, horizon: int, threads: int) -> None:
        self.request: list[int] = []
        self.cost: list[float] = []
        self.slots: list[np.ndarray] = []
        self.kv: list[np.ndarray] = []
        self.fixed: set[int] = set()  # requests a dive has fixed: pricing adds none of their chains
        super().__init__(data, horizon, profile=True)
        self.h.setOptionValue("threads", threads)
        use_highs_threads(threads)

    def _add(self, cost, req, index, value) -> None:
        for j, c, r, v in zip(req, cost, index, value, strict=True):
            self.request.append(int(j))
            self.cost.append(float(c))
            self.slots.append(np.asarray(r, dtype=np.int64))
            self.kv.append(np.asarray(v, dtype=np.float64))
        super()._add(cost, req, index, value)

    def add(self, data, found, pi, y, cand=None) -> int:
        """As the master's, leaving out the requests a dive has fixed."""
        if cand is None and self.fixed:
            cand = np.array([j for j in range(self.n) if j not in self.fixed], dtype=np.int64)
        return super().add(data, found, pi, y, cand)

    def whole(self) -> np.ndarray:
        """Indices (into the recorded columns) of the chains with every op below the horizon."""
        out = self.data.output
        return np.array(
            [k for k, (j, s) in enumerate(zip(self.request, self.slots, strict=True)) if s.size == out[j]]
        )

    def lambdas(self) -> np.ndarray:
        """The master's current lambda of each recorded column (after a solve)."""
        x = np.asarray(self.h.getSolution().col_value)
        return x[self.horizon : self.horizon + len(self.request)]


def restricted_mip(
    data: ChainData, pool: Pool, start: np.ndarray | None, seconds: float, threads: int
) -> dict:
    """Solve the pool's restricted master as a MIP: one whole chain per request, memory rows <= M.

    Parameters
    ----------
    data
        The chain data (no chunk cap).
    pool
        The column generation's pool.
    start
        Flat chains of a feasible schedule (the warm start), or None.
    seconds
        HiGHS's time limit.
    threads
        HiGHS threads.

    Returns
    -------
    dict
        ``value`` and ``bound`` (slots; the bound is over the pool's chains only), ``status``, ``chains``
        (each request's op slots, or None without a solution), ``hinted``, ``columns``, ``nodes``,
        ``seconds`` and ``found`` (seconds, value) of each improving solution.
    """
    import highspy

    keep = pool.whole()
    n, horizon = data.n, pool.horizon
    req = np.array([pool.request[k] for k in keep])
    h = new_highs(threads)
    lo = np.concatenate([np.ones(n), np.full(horizon, -highspy.kHighsInf)])
    hi = np.concatenate([np.ones(n), np.full(horizon, float(data.capacity))])
    empty = np.zeros(0, dtype=np.int32)
    h.addRows(lo.size, lo, hi, 0, empty, empty, np.zeros(0))
    index = [
        np.concatenate([[j], n + pool.slots[k]]).astype(np.int32) for j, k in zip(req, keep, strict=True)
    ]
    value = [np.concatenate([[1.0], pool.kv[k]]) for k in keep]
    sizes = np.array([i.size for i in index])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    m = keep.size
    cost = np.array([pool.cost[k] for k in keep])
    h.addCols(
        m,
        cost,
        np.zeros(m),
        np.ones(m),
        int(sizes.sum()),
        starts,
        np.concatenate(index),
        np.concatenate(value),
    )
    h.changeColsIntegrality(m, np.arange(m, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * m))
    # Whole slots less the (whole) arrivals: a gap under one slot is closed.
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
    h.setOptionValue("time_limit", seconds)
    hinted = False
    if start is not None:
        where = {(j, pool.slots[k].tobytes()): c for c, (j, k) in enumerate(zip(req, keep, strict=True))}
        x0 = np.zeros(m)
        for j in range(n):
            s, o = int(data.offset[j]), int(data.output[j])
            c = where.get((j, start[s : s + o].astype(np.int64).tobytes()))
            if c is None:
                break
            x0[c] = 1.0
        else:
            sol = highspy.HighsSolution()
            sol.col_value = x0.tolist()
            sol.value_valid = True
            h.setSolution(sol)
            hinted = True
    found: list[tuple[float, float]] = []

    def improving(event) -> None:
        d = event.data_out
        found.append((float(d.running_time), float(d.objective_function_value)))

    h.cbMipImprovingSolution.subscribe(improving)
    use_highs_threads(threads)
    began = time.perf_counter()
    run_highs(h, Deadline.never(), interrupts=False)
    info = h.getInfo()
    chains = None
    if info.primal_solution_status == 2:
        x = np.asarray(h.getSolution().col_value)
        chains = [None] * n
        for c in np.flatnonzero(x > 0.5):
            chains[int(req[c])] = pool.slots[int(keep[c])]
    bound = float(info.mip_dual_bound)
    return {
        "value": float(info.objective_function_value) if chains is not None else None,
        "bound": bound if math.isfinite(bound) else None,
        "status": h.modelStatusToString(h.getModelStatus()),
        "chains": chains,
        "hinted": hinted,
        "columns": m,
        "nodes": int(info.mip_node_count),
        "seconds": time.perf_counter() - began,
        "found": found,
    }


def replayed(instance: Instance, data: ChainData, chains: list[np.ndarray]) -> tuple[float | None, str]:
    """The core's total latency of the schedule of ``chains`` (each request's op slots), and a note."""
    slot = data.slot
    last = max(int(c[-1]) for c in chains)
    plan = OpPlan(np.arange(last + 1, dtype=np.float64) * slot, tuple(np.asarray(c) for c in chains))
    schedule = plan_schedule(instance, plan, slot, {"found_by": SOURCE})
    try:
        trace = replay(instance, schedule, instance_cost_model(instance))
    except KvschedError as exc:  # the model and the core disagree: never trust the MIP alone
        return None, f"replay failed: {exc}"
    return float(OBJECTIVES["total-latency"](trace)), "ok"


def dive(data: ChainData, pool: Pool, y0: np.ndarray, upper: float, args: argparse.Namespace) -> dict:
    """Diving: fix the integral requests and the most nearly integral fractional one, price, repeat.

    A request is fixed to a whole chain by setting its other columns' upper bounds to 0; the master is
    re-solved with pricing by ``chain_colgen.colgen``'s own loop on the same pool (:meth:`Pool.add`
    prices no fixed request). The fractional request takes, of its whole chains, the one of largest
    lambda (then cheapest) that fits the KV the fixed chains leave in every slot, so the master stays
    feasible (the unfixed requests keep their tails); with none that fits, :func:`reinsert` makes one
    (its earliest-finishing chain in that KV: a repair, not a priced column).
    """
    fixed: dict[int, int] = {}
    repaired = 0
    left = np.full(pool.horizon, float(data.capacity))  # KV the fixed chains leave per slot
    deadline = Deadline.after(args.dive)
    tic = time.perf_counter()

    def fix(j: int, k: int) -> None:
        _fix(pool, j, k)
        fixed[j] = k
        left[pool.slots[k]] -= pool.kv[k]

    while not deadline.expired():
        pool.solve()  # the last colgen iteration added columns after its solve
        lam = pool.lambdas()
        req = np.array(pool.request)
        best = np.zeros(data.n)
        arg = np.full(data.n, -1)
        for k in np.flatnonzero(lam > 1e-9):
            if lam[k] > best[req[k]]:
                best[req[k]], arg[req[k]] = lam[k], k
        for i in range(data.n):  # the integral ones stay as they are (they fit: the master is feasible)
            if i not in fixed and best[i] >= 1 - 1e-6 and pool.slots[arg[i]].size == data.output[i]:
                fix(i, int(arg[i]))
        frac = [j for j in range(data.n) if j not in fixed]
        if not frac:
            break
        j = max(frac, key=lambda i: best[i])
        mine = [k for k in np.flatnonzero(req == j) if pool.slots[k].size == data.output[j]]
        fits = [k for k in mine if np.all(pool.kv[k] <= left[pool.slots[k]] + 1e-9)]
        if fits:
            fix(j, int(min(fits, key=lambda k: (-lam[k], pool.cost[k]))))
        else:  # repair: its earliest-finishing chain in the KV left, as a new column
            new = reinsert(data, np.array([pool.horizon - 1]), j, left)
            if new is None:
                print(f"    dive: request {j} fits nowhere below H'", flush=True)
                return {"chains": None, "fixed": len(fixed), "seconds": time.perf_counter() - tic}
            w = chain_milp._weights(data, j)
            pool._add([float(new[-1] + 1 - data.arrival[j])], [j], [new], [w])
            fix(j, len(pool.request) - 1)
            repaired += 1
        cg = chain_colgen.colgen(
            data, y0, upper, deadline, (0.9, 0.6, 0.3), args.tol, 0.01, [], "ipm", master=pool
        )
        print(
            f"    dive: {len(fixed)} fixed, master {cg['master']:.3f}, {time.perf_counter() - tic:.0f} s",
            flush=True,
        )
    if len(fixed) < data.n:
        return {"chains": None, "fixed": len(fixed), "seconds": time.perf_counter() - tic}
    chains = [pool.slots[fixed[j]] for j in range(data.n)]
    print(f"    dive: {repaired} requests repaired by reinsertion", flush=True)
    return {"chains": chains, "fixed": len(fixed), "seconds": time.perf_counter() - tic}


def reinsert(data: ChainData, chain: np.ndarray, j: int, left: np.ndarray) -> np.ndarray | None:
    """Request ``j``'s earliest-finishing chain in the KV ``left`` per slot (the others' chains fixed).

    An exact programme over (ops done, slot): op u + 1 may run in slot t only where its KV fits
    ``left[t]``; waiting is free. ``chain`` (j's own, already out of ``left``) bounds the window: the
    result finishes no later. None if nothing fits before ``len(left)``.
    """
    o, r = int(data.output[j]), int(data.release[j])
    w = chain_milp._weights(data, j)
    end = int(chain[-1]) + 1
    span = end - r
    ok = w[:, None] <= left[None, r:end] + 1e-9  # (O, span)
    reach = np.zeros((o + 1, span + 1), dtype=bool)  # reach[u, i]: u ops done by the start of slot r + i
    reach[0] = True
    for u in range(o):
        step = np.zeros(span + 1, dtype=bool)
        step[1:] = reach[u, :-1] & ok[u]
        reach[u + 1] = np.logical_or.accumulate(step)
    if not reach[o, -1]:
        return None
    out = np.empty(o, dtype=np.int64)
    i = int(np.argmax(reach[o]))  # earliest: the last op ran in slot r + i - 1
    for u in range(o, 0, -1):  # walk back: the latest slot < i where op u fits and u - 1 were done
        k = i - 1
        while not (ok[u - 1, k] and reach[u - 1, k]):
            k -= 1
        out[u - 1] = r + k
        i = k
    return out


def reinsertion(data: ChainData, chains: list[np.ndarray], horizon: int, seconds: float) -> tuple[list, list]:
    """Passes of :func:`reinsert` over every request (latest finishers first) until none improves.

    Returns the final chains and every (request, chain) found on the way (pool columns for the MIP).
    """
    chains = [c.copy() for c in chains]
    left = np.full(horizon, float(data.capacity))
    for j, c in enumerate(chains):
        left[c] -= chain_milp._weights(data, j)
    found = []
    deadline = Deadline.after(seconds)
    better = True
    while better and not deadline.expired():
        better = False
        for j in np.argsort([-(c[-1] + 1 - data.arrival[i]) for i, c in enumerate(chains)]):
            w = chain_milp._weights(data, j)
            left[chains[j]] += w
            new = reinsert(data, chains[j], j, left)
            if new is not None and new[-1] < chains[j][-1]:
                chains[j], better = new, True
                found.append((int(j), new))
            left[chains[j]] -= w
    return chains, found


def _fix(pool: Pool, j: int, k: int) -> None:
    """Request ``j``'s columns other than ``k`` to upper bound 0 (its tail included), and no new ones."""
    cols = [pool.horizon + i for i, r in enumerate(pool.request) if r == j and i != k]
    if cols:
        pool.h.changeColsBounds(
            len(cols), np.array(cols, dtype=np.int32), np.zeros(len(cols)), np.zeros(len(cols))
        )
    pool.fixed.add(j)


def schedule_of(instance: Instance, folder: Path, name: str, seconds: float) -> Trace:
    """The pipeline's schedule ``folder/name.sched.json`` (else the incumbent stage and local search)."""
    path = folder / f"{name}.sched.json"
    if not path.exists():
        print(f"    no {path}: the incumbent stage and local search for {seconds:g} s", flush=True)
    return chain_milp.incumbent_of(instance, path, seconds)


def run(instance: Instance, name: str, folder: Path, args: argparse.Namespace) -> list[str]:
    """One row (see the module docstring)."""
    data = ChainData.from_instance(instance)
    why = chain_milp.applies(instance)
    if why is not None:
        raise SystemExit(f"{name}: {why}")
    trace = schedule_of(instance, folder, name, args.incumbent)
    slot = data.slot
    upper = float(OBJECTIVES["total-latency"](trace)) / slot
    start = incumbent_chains(data.release, data.earliest, data.output, data.offset, slot, trace)
    # (The same cache as chain_colgen.py's: it wrote the fields its readers need, this one fewer once.)
    lag = chain_colgen.cached_lagrangian(instance, name, folder, args.lagrangian, incumbent=trace)
    last = int(start.max()) if start is not None else 0
    horizon = max(lag["y"].size, last + 1 + args.pad)
    y0 = np.zeros(horizon)
    y0[: lag["y"].size] = lag["y"]
    print(
        f"{name}: n {data.n}, U {upper:,.0f}, Lagrangian {float(lag['value']):,.3f}, H' {horizon}", flush=True
    )
    traces = [trace]
    for policy in chain_colgen.POLICIES.split(","):
        try:
            traces.append(simulate(instance, make_policy(policy)).trace)
        except KvschedError as exc:
            print(f"    {policy}: {exc}")
    pool = Pool(data, horizon, args.threads)
    cg = chain_colgen.colgen(
        data, y0, upper, Deadline.after(args.colgen), (0.9, 0.6, 0.3), args.tol, args.seed, traces, "ipm",
        master=pool,
    )  # fmt: skip
    rein_value = None
    if start is not None and args.reinsert > 0:
        own = [start[int(data.offset[j]) : int(data.offset[j] + data.output[j])] for j in range(data.n)]
        rein, extra = reinsertion(data, own, horizon, args.reinsert)
        if extra:  # into the pool (the MIP may combine them) and the MIP's warm start
            cost = [float(c[-1] + 1 - data.arrival[j]) for j, c in extra]
            pool._add(
                cost,
                [j for j, _ in extra],
                [c for _, c in extra],
                [chain_milp._weights(data, j) for j, _ in extra],
            )
            start = np.concatenate(rein)
        rein_value, rnote = replayed(instance, data, rein)
        print(f"    reinsertion: {len(extra)} moves, replay {rein_value} ({rnote})", flush=True)
    mip = restricted_mip(data, pool, start, args.mip, args.threads)
    value, note = (None, "no solution") if mip["chains"] is None else replayed(instance, data, mip["chains"])
    if value is not None and abs(value - slot * mip["value"]) > 1e-6 * max(1.0, value):
        note = f"replayed {value} against the MIP's {slot * mip['value']}"
    firsts = [f"{t:.0f}s:{v:,.0f}" for t, v in mip["found"]]
    print(f"    MIP: {mip['status']}, value {mip['value']}, bound {mip['bound']}, hinted {mip['hinted']}, "
          f"{mip['columns']} columns, {mip['nodes']} nodes, {mip['seconds']:.0f} s; improving {firsts}; "
          f"replay {value} ({note})", flush=True)  # fmt: skip
    dived = None
    if args.dive > 0:
        dv = dive(data, pool, y0, upper, args)
        if dv["chains"] is not None:
            dived, dnote = replayed(instance, data, dv["chains"])
            print(
                f"    dive: {dv['fixed']} fixed, replay {dived} ({dnote}), {dv['seconds']:.0f} s", flush=True
            )
    f = chain_milp._f
    return [
        name, str(data.n), str(horizon), f(upper), f(float(lag["value"]), 2), f(cg["best"], 2),
        f(cg["master"], 2), f(cg["seconds"], 0), str(cg["columns"]), f(mip["value"]), f(mip["bound"], 1),
        mip["status"], f(mip["seconds"], 0), f(value / slot if value is not None else None), note,
        f(rein_value / slot if rein_value is not None else None), f(dived / slot if dived is not None else None),
        f"{os.getloadavg()[0]:.1f}",
    ]  # fmt: skip


COLUMNS = (
    "instance", "n", "H'", "U", "Lagrangian", "CG best L", "master LP", "CG s", "pool", "MIP value",
    "MIP bound (pool)", "MIP status", "MIP s", "replayed", "replay", "reinserted", "dive", "load",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", required=True, help="instances, schedules and cached Lagrangians")
    parser.add_argument("--cases", default="azure-code-100-rho1", help="regret_scale case names")
    parser.add_argument("--prefix", type=int, default=0, help="only the first k requests (FOLDER/NAME-pK)")
    parser.add_argument("--lagrangian", type=float, default=20.0, help="chain Lagrangian seconds")
    parser.add_argument("--colgen", type=float, default=120.0, help="column generation seconds")
    parser.add_argument("--seed", type=float, default=10.0, help="seeding ascent seconds (inside --colgen)")
    parser.add_argument("--tol", type=float, default=1e-4, help="colgen: stop at master - L <= tol x master")
    parser.add_argument("--pad", type=int, default=50, help="memory rows past the pipeline's last op")
    parser.add_argument("--mip", type=float, default=120.0, help="restricted master MIP seconds")
    parser.add_argument(
        "--reinsert", type=float, default=60.0, help="seconds of reinsertion passes (0: none)"
    )
    parser.add_argument("--dive", type=float, default=0.0, help="seconds of diving after the MIP (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="HiGHS threads (masters and MIP)")
    parser.add_argument("--incumbent", type=float, default=30.0, help="incumbent seconds without a schedule")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases.split(","):
        instance = chain_colgen.case_instance(case, folder)
        name = case
        if args.prefix and args.prefix < len(instance):
            instance, name = chain_milp.prefix(instance, args.prefix), f"{case}-p{args.prefix}"
            if not (folder / f"{name}.json").exists():
                save_instance(instance, folder / f"{name}.json")
        rows.append(run(instance, name, folder, args))
    print(" | ".join(COLUMNS))
    for row in rows:
        print(" | ".join(row))
    print(f"HiGHS threads: {args.threads}; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
