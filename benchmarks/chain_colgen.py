"""Has the chain Lagrangian reached its own LP? Column generation on the chain LP (run by hand, not a test).

Usage::

    python benchmarks/chain_colgen.py --folder DIR                  # the three 1k rows and Azure code 100
    python benchmarks/chain_colgen.py --folder DIR --cases azure-code-100-rho1 --lagrangian 20

The chain Lagrangian (:mod:`kvsched.csp.bounds.chain`) dualises the memory rows of a time-indexed chain
relaxation; its dual maximum is the chain LP (:mod:`kvsched.csp.bounds.chain_lp`), too big to build at
n = 1,000. Column generation reaches that LP from both sides:

* the **restricted master**: min sum_k c_k lambda_k over the chains found so far, one convexity row per
  request (= 1) and one memory row per slot t < H (<= M), plus, per request, its chain wholly past the
  horizon (cost max(H, e) + O - a, no rows: the zero-price tail), so it is always feasible. Its value is an
  *upper* estimate of the LP optimum (fewer columns);
* the **pricing** is the Lagrangian's own exact chain pricing (:func:`kvsched.csp.bounds.chain.evaluate`):
  at any y >= 0 its value L(y) is a valid *lower* bound (and a lower bound on the LP), and each request's
  cheapest chain is the column to add. Master value = best L(y) means both equal the LP optimum.

Stabilised by Wentges smoothing: each iteration prices at ``alpha y_best + (1 - alpha) y_master`` for each
``--alphas`` weight (y_best: the best L so far) and adds every chain with a negative reduced cost at the
master's duals, falling back to the master's own duals when none of them yields one (mispricing); no column
there means the master is the LP optimum. The pool is seeded with the chains of the ``--policies``' schedules
and of the pipeline's (``FOLDER/NAME.sched.json`` if present, from ``kvsched solve ... -o``: each schedule is
a feasible master point, so the master starts at most at the best of them), of a short subgradient run from
the Lagrangian's best point (``--seed`` seconds, every pricing's chains), and of scalings of it.
``chain_lagrangian`` runs first for ``--lagrangian`` seconds (cached in the folder): its value is the
"plateau" column.

The master's memory rows are written in second differences (see :class:`Master`): a chain's load is linear
in t on each run of consecutive slots, so a column has a few nonzeros per run instead of one per op (1.9M
against 0.1M nonzeros on Azure conversations 1k's seed pool), and each master is solved from scratch by
HiGHS's interior point method with crossover (HiGHS's primal simplex from the last basis took minutes a
re-solve there). ``--drop`` deletes unused columns whose reduced cost exceeds it (any restricted master's
value is an upper estimate: the lowest is reported).

Unit time, total latency, no token budget (the rows the diagnostic is about; with a budget the z rows would
need their own duals). Each row prints: instance, n, the dual horizon H, the Lagrangian's value and seconds,
the column generation's best L(y), the master's final value (upper estimate of the LP), the relative gap
between the two, iterations (master solves), columns, seconds, and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from kvsched.csp.bounds import chain_lagrangian
from kvsched.csp.bounds._ascent import Ascent
from kvsched.csp.bounds._chain_kernels import chain_loads, op_weights, price_chains
from kvsched.csp.bounds.chain import LATENCY, ChainData
from kvsched.csp.bounds.seconds_lagrangian import incumbent_chains
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.highs import new_highs, run_highs
from kvsched.instances.io import load_instance
from kvsched.instances.model import Instance
from kvsched.schedule.io import load_schedule
from kvsched.schedule.validate import Trace, replay
from kvsched.stop import Deadline

sys.path.insert(0, str(Path(__file__).parent))
import regret_scale

CASES = ("azure-code-100-rho1", "azure-code-1k-rho1", "azure-conv-1k-rho1", "sharegpt-1k-rho1")
#: Policies whose schedules seed the pool (their chains are feasible points of the master).
POLICIES = "sarathi,vllm,kfcfs-sr,mcsf,rank-o"
#: Reduced cost below which a chain enters the master (slots).
RC_TOL = 1e-6
#: Scalings of the subgradient's best point whose chains seed the pool.
SEED_SCALES = (0.0, 0.8, 0.9, 1.0, 1.1, 1.25)
#: Polyak step factor of the seeding ascent (it starts at the subgradient's best point: small steps).
SEED_FACTOR = 0.25
#: HiGHS's simplex_strategy for the re-solves (4: primal; 0: HiGHS chooses, dual).
PRIMAL = 4


def pricing(data: ChainData, y: np.ndarray):
    """L(y) and every request's cheapest chain at ``y`` (the Lagrangian's exact kernel, no budget rows)."""
    price, chains, pslot, pre, refilled = price_chains(
        data.release, data.earliest, data.output, data.prompt, data.arrival, data.offset, data.block,
        y, np.zeros(0), data.objective, np.zeros(1, dtype=np.int64), False, data.chunk, data.pre_offset,
        data.growth,
    )  # fmt: skip
    value = float(price.sum() - data.capacity * y.sum())
    return value, price, chains, pslot, pre, refilled


def columns(data: ChainData, horizon: int, chains, pslot, pre, refilled, which: np.ndarray):
    """The master columns of requests ``which``: (request, cost, CSC start, row index, value), rows < H.

    Without a chunk cap a chain's load is its ops' weights in their slots (distinct slots), computed in
    numpy; with one, the prompt batches and the gaps' holds count too, so each chain goes through
    :func:`chain_loads` on its own.
    """
    out, offset = data.output, data.offset
    last = chains[offset + out - 1]
    cost = (last + 1 - data.arrival)[which]
    starts, index, value = [0], [], []
    for j in which:
        o, s = int(out[j]), int(offset[j])
        if data.chunk == 0:
            slots = chains[s : s + o]
            w = op_weights(int(data.prompt[j]), o, data.block)
            keep = slots < horizon
            rows, vals = slots[keep], w[keep]
        else:
            p0, p1 = int(data.pre_offset[j]), int(data.pre_offset[j + 1])
            load, _ = chain_loads(
                out[j : j + 1], data.prompt[j : j + 1], np.zeros(1, np.int64), data.block, chains[s : s + o],
                pslot[j : j + 1], horizon, False, data.chunk, np.array([0, p1 - p0], np.int64), pre[p0:p1],
                refilled[s : s + o], True, data.growth,
            )  # fmt: skip
            rows = np.flatnonzero(load)
            vals = load[rows]
        index.append(rows)
        value.append(vals)
        starts.append(starts[-1] + rows.size)
    return cost, np.array(starts), index, value


class Master:
    """The restricted master LP: rows 0..n-1 convexity (= 1), rows n..n+H-1 memory.

    With ``profile`` the memory rows are written in second differences: variables R_t <= M (the load of
    slot t, columns 0..H-1) and rows (K A lambda)_t - (K R)_t = 0 with (K x)_t = x_t - 2 x_{t-1} + x_{t-2}
    (K is invertible, so R = A lambda: the same LP). A chain's load is I + u - 1 on a run of consecutive
    slots, linear in t, so its second difference has 4 nonzeros per run instead of one per op: about
    50 times fewer at n = 1k. The memory duals are then minus the R_t's reduced costs.
    """

    def __init__(self, data: ChainData, horizon: int, profile: bool = True) -> None:
        import highspy

        self.data, self.horizon, self.n, self.profile = data, horizon, data.n, profile
        self.h = new_highs(2)
        self.h.setOptionValue("solver", "simplex")
        self.solves = 0
        self.resolve = "simplex"
        self.seconds = 0.0
        inf = highspy.kHighsInf
        cap = float(data.capacity)
        lo = np.concatenate([np.ones(self.n), np.full(horizon, 0.0 if profile else -inf)])
        up = np.concatenate([np.ones(self.n), np.full(horizon, 0.0 if profile else cap)])
        empty = np.zeros(0, dtype=np.int32)
        self.h.addRows(lo.size, lo, up, 0, empty, empty, np.zeros(0))
        self.cols = 0
        self.nnz = 0
        if profile:  # R_s: -1 in row s, +2 in row s + 1, -1 in row s + 2 (rows < H)
            t = np.arange(horizon)
            idx = np.stack([t, t + 1, t + 2], axis=1)
            val = np.tile([-1.0, 2.0, -1.0], (horizon, 1))
            keep = idx < horizon
            counts = keep.sum(axis=1)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
            self.h.addCols(
                horizon, np.zeros(horizon), np.full(horizon, -inf), np.full(horizon, cap), int(counts.sum()),
                starts, (self.n + idx[keep]).astype(np.int32), val[keep],
            )  # fmt: skip
        self.seen: set[tuple[int, int]] = set()  # (request, hash of its slots): no column twice
        self.first = (horizon if profile else 0) + self.n  # chain columns start after R and the tails
        self.keys: list[tuple[int, int]] = []  # of the chain columns, in order
        self.slots: list[np.ndarray] = []  # each chain column's op slots (for its primal: chain_alpha.py)
        self.nz: list[int] = []
        # The zero-price tail: every op (and prompt batch) past the horizon, no memory rows.
        npre = np.diff(data.pre_offset)
        tail = np.maximum(horizon + npre, data.earliest) + data.output - data.arrival
        self._add(tail, np.arange(self.n), [np.zeros(0, np.int64)] * self.n, [np.zeros(0)] * self.n)

    def _second_difference(self, r: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K a) of a column's load ``a`` (rows ``r``, values ``v``), rows < H, zeros dropped."""
        if not r.size:
            return r, v
        idx = np.concatenate([r, r + 1, r + 2])
        val = np.concatenate([v, -2.0 * v, v])
        keep = idx < self.horizon
        out = np.bincount(idx[keep] - r[0], weights=val[keep])
        nz = np.flatnonzero(np.abs(out) > 1e-9)
        return nz + r[0], out[nz]

    def _add(self, cost, req, index, value) -> None:
        starts, rows, vals = [], [], []
        pos = 0
        for j, r, v in zip(req, index, value, strict=True):
            if self.profile:
                r, v = self._second_difference(r, v)
            starts.append(pos)
            rows.append(np.concatenate([[j], self.n + r]).astype(np.int32))
            vals.append(np.concatenate([[1.0], v]))
            pos += 1 + r.size
            self.nz.append(1 + r.size)
        import highspy

        k = len(starts)
        self.h.addCols(
            k, np.asarray(cost, dtype=np.float64), np.zeros(k), np.full(k, highspy.kHighsInf), pos,
            np.array(starts, dtype=np.int32), np.concatenate(rows), np.concatenate(vals),
        )  # fmt: skip
        self.cols += k
        self.nnz += pos

    def add(
        self,
        data: ChainData,
        found,
        pi: np.ndarray | None,
        y: np.ndarray | None,
        cand: np.ndarray | None = None,
    ) -> int:
        """Add the chains of a pricing ``found`` whose reduced cost at (pi, y) is negative (all without duals)."""
        _, _, chains, pslot, pre, refilled = found
        cand = np.arange(self.n) if cand is None else cand
        cost, _, index, value = columns(data, self.horizon, chains, pslot, pre, refilled, cand)
        keep_cost, keep_req, keep_idx, keep_val = [], [], [], []
        for j, c, r, v in zip(cand, cost, index, value, strict=True):
            if pi is not None:
                rc = c + float(v @ y[r]) - pi[j]
                if rc >= -RC_TOL:
                    continue
            key = (int(j), hash(r.tobytes()) ^ hash(float(c)))
            if key in self.seen:
                continue
            self.seen.add(key)
            self.keys.append(key)
            self.slots.append(chains[int(data.offset[j]) : int(data.offset[j]) + int(data.output[j])].copy())
            keep_cost.append(c)
            keep_req.append(j)
            keep_idx.append(r)
            keep_val.append(v)
        if keep_req:
            self._add(np.array(keep_cost), keep_req, keep_idx, keep_val)
        return len(keep_req)

    def drop(self, threshold: float) -> int:
        """Delete the chain columns at zero with reduced cost above ``threshold`` (they may come back).

        The master is re-solved from scratch (interior point), so a smaller one is a faster one; any
        restricted master's value is still an upper estimate of the LP.
        """
        sol = self.h.getSolution()
        value = np.array(sol.col_value[self.first :])
        rc = np.array(sol.col_dual[self.first :])
        out = np.flatnonzero((value <= 1e-9) & (rc > threshold))
        if out.size:
            self.h.deleteCols(out.size, (out + self.first).astype(np.int32))
            gone = set(out.tolist())
            for i in out:
                self.seen.discard(self.keys[i])
            self.keys = [k for i, k in enumerate(self.keys) if i not in gone]
            self.slots = [k for i, k in enumerate(self.slots) if i not in gone]
            self.nnz -= int(np.sum(np.array(self.nz)[out]))
            self.nz = [k for i, k in enumerate(self.nz) if i not in gone]
            self.cols -= out.size
        return int(out.size)

    def solve(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Run from the previous basis: (value, convexity duals pi, memory duals y >= 0)."""
        import highspy

        tic = time.perf_counter()
        if self.solves == 0 or self.resolve == "ipm":
            # From scratch the interior point method (with crossover: an optimal basis) is far faster
            # than the simplex here, and on re-solves than HiGHS's primal simplex from the last basis.
            self.h.setOptionValue("solver", "ipm")
            self.h.setOptionValue("run_crossover", "on")
        else:
            # From the first basis on, added columns leave it primal feasible: primal simplex goes on from it.
            self.h.setOptionValue("solver", self.resolve)
            self.h.setOptionValue("simplex_strategy", PRIMAL)
        run_highs(self.h, Deadline.never(), interrupts=False)
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            # Seen once at n = 1k after columns were deleted ("Not Set"): the dual simplex from scratch.
            self.h.clearSolver()
            self.h.setOptionValue("solver", "simplex")
            self.h.setOptionValue("simplex_strategy", 1)
            run_highs(self.h, Deadline.never(), interrupts=False)
        self.solves += 1
        self.seconds += time.perf_counter() - tic
        status = self.h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"master: {self.h.modelStatusToString(status)}")
        sol = self.h.getSolution()
        dual = np.array(sol.row_dual)
        value = float(self.h.getInfo().objective_function_value)
        mem = np.array(sol.col_dual[: self.horizon]) if self.profile else dual[self.n :]
        return value, dual[: self.n], np.maximum(0.0, -mem)


def seed_ascent(data: ChainData, y0: np.ndarray, upper: float, master: Master, deadline: Deadline) -> tuple:
    """The subgradient again from ``y0`` (small steps), every pricing's chains into the pool.

    Near the dual optimum the chains of successive iterates are what the LP mixes (the volume
    algorithm's primal average), so they seed the master far better than the chains of one point.
    """
    best: list = [None, y0]
    count = [0]

    def price(y: np.ndarray, z: np.ndarray, reset: bool):
        found = pricing(data, y)
        count[0] += 1
        master.add(data, found, None, None)
        if best[0] is None or found[0] > best[0][0]:
            best[0], best[1] = found, y.copy()
        _, _, chains, pslot, pre, refilled = found
        load, tokens = chain_loads(
            data.output, data.prompt, data.offset, data.block, chains, pslot, y.size, False, data.chunk,
            data.pre_offset, pre, refilled, True, data.growth,
        )  # fmt: skip
        return found[0], load, tokens

    ascent = Ascent(data, upper, price, factor=SEED_FACTOR)
    ascent.run(y0.copy(), np.zeros(0), deadline, 10**6)
    return best[0], best[1], count[0]


def colgen(
    data: ChainData,
    y0: np.ndarray,
    upper: float,
    deadline: Deadline,
    alphas: tuple[float, ...],
    tol: float,
    seed: float,
    traces: list,
    resolve: str = "simplex",
    profile: bool = True,
    drop: float | None = None,
    master: Master | None = None,
) -> dict:
    """Wentges-smoothed column generation from the seed ``y0``: best L(y), master value, counts.

    ``traces``: schedules whose chains seed the pool (each a feasible point of the master, so its value
    starts at most at the best of them). ``master``: an empty master over ``y0.size`` slots to fill (a
    caller that wants the pool afterwards, e.g. ``chain_price_branch.py``); by default a new one.
    """
    tic = time.perf_counter()
    horizon = y0.size
    master = Master(data, horizon, profile) if master is None else master
    master.resolve = resolve
    zero = np.zeros(data.n, dtype=np.int64)
    for trace in traces:
        # The schedule's generating batches as chains (batch at s in slot floor(s / slot)), the relaxation's
        # own reading of an incumbent; None where they break it (never under unit time).
        chains = incumbent_chains(data.release, data.earliest, data.output, data.offset, data.slot, trace)
        if chains is not None:
            master.add(data, (0.0, None, chains, zero, zero, zero.repeat(0)), None, None)
    best, best_y, pricings = seed_ascent(data, y0, upper, master, Deadline.after(seed))
    for s in SEED_SCALES:
        if deadline.expired():
            break
        found = pricing(data, s * best_y)
        pricings += 1
        master.add(data, found, None, None)
        if found[0] > best[0]:
            best, best_y = found, s * best_y
    seeded = time.perf_counter() - tic
    print(f"    seeded: {master.cols} columns ({master.nnz / 1e6:.1f}M nz) from {pricings} pricings, "
          f"best L {best[0]:.3f}, {seeded:.1f} s", flush=True)  # fmt: skip
    value, iterations, price_s, lowest, dropped = np.inf, 0, 0.0, np.inf, 0
    while not deadline.expired():
        value, pi, ym = master.solve()
        lowest = min(lowest, value)  # every restricted master is an upper estimate
        iterations += 1
        if lowest - best[0] <= tol * abs(lowest) or deadline.expired():
            break
        if drop is not None:
            dropped += master.drop(drop)
        added = 0
        t0 = time.perf_counter()
        for a in (*alphas, 0.0):
            # Smoothed points (stability), then, only where they gave nothing, the master's own duals
            # (a = 0: no mispricing). The master solves are the dear part, so every smoothed
            # pricing's columns go in before the next.
            if a == 0.0 and added and 0.0 not in alphas:
                break
            ys = a * best_y + (1 - a) * ym
            found = pricing(data, ys)
            pricings += 1
            if found[0] > best[0]:
                best, best_y = found, ys
            added += master.add(data, found, pi, ym)
            if a == 0.0:
                break
        price_s += time.perf_counter() - t0
        print(
            f"    it {iterations:4d}  master {value:14.3f}  best L {best[0]:14.3f}  gap "
            f"{100 * (value - best[0]) / abs(value):6.3f}%  +{added:5d} cols ({master.cols}, "
            f"{master.nnz / 1e6:.1f}M nz)  {time.perf_counter() - tic:6.1f} s (master {master.seconds:.1f}, "
            f"pricing {price_s:.1f})",
            flush=True,
        )
        if not added:  # no column at the master's own duals: the master is the LP optimum
            break
    return {
        "best": best[0],
        "master": lowest,
        "dropped": dropped,
        "iterations": iterations,
        "pricings": pricings,
        "columns": master.cols,
        "seconds": time.perf_counter() - tic,
        "master_s": master.seconds,
        "seeded_s": seeded,
        "lp": master,  # the last restricted master, solved: its primal is the chains' mixture
    }


def case_instance(name: str, folder: Path) -> Instance:
    """The ``regret_scale`` row ``name`` (a unit-time Poisson case at 100 or 1,000 requests, memory load 1),
    made in ``folder`` if it is not there yet: the instances every chain diagnostic here runs on."""
    known = {c.name: c for c in regret_scale.cases([100, 1000], [1.0])}
    return load_instance(regret_scale.generate(known[name], folder))


def cached_lagrangian(
    instance: Instance, name: str, folder: Path, seconds: float, incumbent: Trace | None = None
) -> np.lib.npyio.NpzFile:
    """``chain_lagrangian`` of ``instance`` for ``seconds``, saved as ``FOLDER/NAME.lagrangian-SECONDS.npz`` and
    read from there next time (fields y, value, seconds, its, upper), for every chain diagnostic here."""
    saved = folder / f"{name}.lagrangian-{seconds:g}.npz"
    if not saved.exists():
        lag = chain_lagrangian(instance, incumbent=incumbent, deadline=Deadline.after(seconds))
        np.savez(
            saved, y=lag.y, value=lag.value, seconds=lag.seconds, its=lag.iterations, upper=lag.incumbent
        )
    return np.load(saved)


def colgen_arguments(doc: str, cases: tuple[str, ...], limit: float) -> argparse.ArgumentParser:
    """The command line every column-generation diagnostic here starts from (this script's and
    ``chain_alpha.py``'s): instance folder, cases, Lagrangian seconds, column generation and seeding seconds."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--folder", required=True, help="where the regret_scale instances are (made if absent)"
    )
    parser.add_argument("--cases", default=",".join(cases), help="regret_scale case names")
    parser.add_argument("--lagrangian", type=float, default=60.0, help="seconds of chain_lagrangian first")
    parser.add_argument("--limit", type=float, default=limit, help="seconds of column generation")
    parser.add_argument("--seed", type=float, default=30.0, help="seconds of seeding ascent (inside --limit)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = colgen_arguments(__doc__, CASES, 300.0)
    parser.add_argument("--policies", default=POLICIES, help="policies whose schedules seed the pool")
    parser.add_argument("--resolve", default="ipm", choices=("simplex", "ipm"), help="master re-solves")
    parser.add_argument("--drop", type=float, default=None, help="delete unused columns with rc above this")
    parser.add_argument("--plain", action="store_true", help="memory rows as they are (not differenced)")
    parser.add_argument(
        "--alphas",
        default="0.9,0.6,0.3",
        help="Wentges weights on the best point: one pricing each per iteration",
    )
    parser.add_argument("--tol", type=float, default=1e-4, help="stop when master - best L <= tol x master")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases.split(","):
        inst = case_instance(name, folder)
        data = ChainData.from_instance(inst)
        if data.budget is not None or data.objective != LATENCY:
            raise SystemExit(f"{name}: this diagnostic covers unit time without a token budget")
        lag = cached_lagrangian(inst, name, folder, args.lagrangian)
        y0, lag_value, lag_s = lag["y"], float(lag["value"]), float(lag["seconds"])
        print(f"{name}: Lagrangian {lag_value:.3f} in {lag_s:.1f} s, {int(lag['its'])} pricings, "
              f"H = {y0.size}", flush=True)  # fmt: skip
        traces = []
        for policy in args.policies.split(","):
            try:
                traces.append(simulate(inst, make_policy(policy)).trace)
            except KvschedError as exc:
                print(f"    {policy}: {exc}")
        found = folder / f"{name}.sched.json"
        if found.exists():  # e.g. `kvsched solve INSTANCE --time-limit 60 -o FOLDER/NAME.sched.json`
            traces.append(replay(inst, load_schedule(found, inst)))
        values = [float(np.sum(t.state.completion - t.state.arrival)) for t in traces]
        print(f"    schedules: {', '.join(f'{v:,.0f}' for v in values)}", flush=True)
        deadline = Deadline.after(args.limit)
        alphas = tuple(float(a) for a in args.alphas.split(","))
        cg = colgen(
            data, y0, float(lag["upper"]), deadline, alphas, args.tol, args.seed, traces, args.resolve,
            profile=not args.plain, drop=args.drop,
        )  # fmt: skip
        load = os.getloadavg()[0]
        rows.append((name, len(inst), y0.size, lag_value, lag_s, cg, load))
        print(f"{name}: CG best L {cg['best']:.3f}, master {cg['master']:.3f}, {cg['iterations']} its, "
              f"{cg['seconds']:.1f} s, load {load:.1f}", flush=True)  # fmt: skip
    head = "instance | n | H | Lagrangian (s) | CG best L | master | master - L | its | pricings | cols | CG s | load"
    print(head)
    for name, n, h, lv, ls, cg, load in rows:
        gap = 100 * (cg["master"] - cg["best"]) / cg["master"]
        print(
            f"{name} | {n} | {h} | {lv:,.1f} ({ls:.0f}) | {cg['best']:,.1f} | {cg['master']:,.1f} | {gap:.2f}% | "
            f"{cg['iterations']} | {cg['pricings']} | {cg['columns']} | {cg['seconds']:.0f} | {load:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
