"""Probe: the interval-indexed fluid LP of issue 15's A100 row, solved directly with HiGHS (run by hand).

Usage::

    python benchmarks/fluid_lp_probe.py INSTANCE.json --step 1.0 --window 60 [--form K] [--objective mbt]

Variables per request j and interval i = [i D, (i + 1) D) from j's arrival on (and up to ``window`` seconds
after it; later ops go to one overflow column at the window's end, with no capacity: a relaxation):
prefill chunk ops ``p``, decode ops ``d``, prefill tokens ``x``; per interval the batches ``R`` starting in
it and the carry ``o``. Rows: ``p + d <= R`` (one op per batch per request), ``x <= q p``, the machine
``F R + sum (work) <= D + o_i - o_{i-1}`` (0 <= o <= T_max), tokens ``sum (x + d) <= C R``, the decode
fraction done by i <= the prompt fraction done by i, all prompt tokens and O - 1 decodes done, and in the
arrival interval at most ``(end - a) / delta + 1`` ops. Objective ``mbt``: C_j >= mean op start +
(1/n) sum_v v b_v (the MBT form, see docs/bounds.md).

This is issue 15's first experiment, kept to reproduce its numbers. It averages over the prompt chunks as
well, with n = ceil(I/q) + O - 1, which assumes exactly ceil(I/q) chunks (a schedule may use more), and
charges a generating op the decode's cost only: the certified version is
``kvsched.csp.bounds.fluid_lp`` (generating ops only, the cheaper of decode and refill).
"""

from __future__ import annotations

import argparse
import math
import time

import highspy
import numpy as np

from kvsched.csp.bounds.seconds_lagrangian import max_batch_seconds
from kvsched.csp.bounds.separable import separable_forms
from kvsched.instances.io import instance_from_dict, read_json
from kvsched.schedule.validate import instance_cost_model

SOLVER = "ipm"


class Cols:
    def __init__(self) -> None:
        self.n = 0
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.cost: list[np.ndarray] = []

    def add(self, k: int, lo=0.0, hi=math.inf, cost=0.0) -> np.ndarray:
        idx = np.arange(self.n, self.n + k)
        self.n += k
        self.lo.append(np.broadcast_to(np.asarray(lo, float), (k,)).copy())
        self.hi.append(np.broadcast_to(np.asarray(hi, float), (k,)).copy())
        self.cost.append(np.broadcast_to(np.asarray(cost, float), (k,)).copy())
        return idx


class Rows:
    def __init__(self) -> None:
        self.n = 0
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, cols, vals, lo=-math.inf, hi=math.inf) -> int:
        cols = np.asarray(cols, dtype=np.int64)
        self.r.append(np.full(cols.size, self.n))
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, float), (cols.size,)).copy())
        self.lo.append(lo)
        self.hi.append(hi)
        self.n += 1
        return self.n - 1


def build(inst, form, step: float, window: float, objective: str = "mbt", tangents: int = 24):
    lim = inst.limits
    q = float(min(lim.max_batch_tokens or math.inf, lim.max_prefill_tokens or math.inf))
    cbud = float(lim.max_batch_tokens or math.inf)
    reqs = inst.requests
    a = np.array([r.arrival for r in reqs])
    prompt = np.array([r.prompt for r in reqs], float)
    out = np.array([r.output for r in reqs], float)
    cost = instance_cost_model(inst)
    smax = int((prompt + out).max())
    t_max = max_batch_seconds(
        cost, int(min(lim.kv_blocks * lim.block_size, cbud)), lim.kv_blocks * lim.block_size, smax
    )
    f = form
    fixed = f.fixed + min(f.fixed_decode, f.fixed_prefill)
    delta = fixed + min(f.per_token + f.decode, f.per_token + f.prefill_token + f.prefill)
    dec_cost = f.per_token + f.decode + f.decode_kv * prompt  # token u >= 2 reads S - 1 >= I KV
    tok_cost = f.per_token + f.prefill_token
    chunk_cost = f.prefill
    kp = np.maximum(1.0, np.ceil(prompt / q))
    nd = out - 1
    n_ops = kp + nd
    horizon = a.max() + window
    nint = math.ceil(horizon / step)
    starts = np.arange(nint) * step
    cols, rows = Cols(), Rows()
    R = cols.add(nint, hi=(step + t_max) / delta + 1)
    o = cols.add(nint, hi=t_max)
    machine_terms: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(nint)]
    token_terms: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(nint)]
    ops_terms: list[list[int]] = [[] for _ in range(nint)]  # op columns (p, d) per interval: Y_i
    root_terms: list[list[tuple[int, float]]] = [[] for _ in range(nint)]  # (col, sqrt weight): U_i
    rem_terms: list[list[tuple[int, float]]] = [[] for _ in range(nint)]  # (col, coef) of B_i
    rem_const = np.zeros(nint)
    mbt_cols: list[np.ndarray] = []
    mbt_vals: list[np.ndarray] = []
    const = 0.0
    for j in range(len(reqs)):
        i0 = int(a[j] // step)
        i1 = min(nint, math.ceil((a[j] + window) / step))
        k = i1 - i0
        t = np.maximum(starts[i0:i1], a[j]) - a[j]
        # objective: (1/n) sum ops x start; the overflow column sits at the window's end
        w = 1.0 / n_ops[j]
        pc = cols.add(k, cost=w * t)
        dc = cols.add(k, cost=w * t)
        xc = cols.add(k)
        over_t = starts[i1 - 1] + step - a[j] if i1 == nint else window
        pov = cols.add(1, cost=w * over_t)
        dov = cols.add(1, cost=w * over_t)
        xov = cols.add(1)
        # b_v: prompt ops first (each at least delta), then decodes (fixed + decode cost)
        b = np.concatenate([np.full(int(kp[j]), delta), np.full(int(nd[j]), fixed + dec_cost[j])])
        const += float((np.arange(1, b.size + 1) * b).sum()) / n_ops[j]
        for s in range(k):
            i = i0 + s
            rows.add([pc[s], dc[s], R[i]], [1, 1, -1], hi=0)
            rows.add([xc[s], pc[s]], [1, -q], hi=0)
            machine_terms[i].append(
                (np.array([pc[s], dc[s], xc[s]]), np.array([chunk_cost, dec_cost[j], tok_cost]))
            )
            token_terms[i].append((np.array([xc[s], dc[s]]), np.array([1.0, 1.0])))
            ops_terms[i] += [pc[s], dc[s]]
            root_terms[i] += [(dc[s], math.sqrt(dec_cost[j])), (xc[s], math.sqrt(tok_cost / q))]
        mbt_cols += [pc, dc, pov, dov]
        mbt_vals += [w * t, w * t, np.array([w * over_t]), np.array([w * over_t])]
        # arrival interval: ops start in [a, end)
        rows.add([pc[0], dc[0]], [1, 1], hi=(starts[i0] + step - a[j]) / delta + 1)
        rows.add(np.concatenate([xc, xov]), 1.0, lo=prompt[j], hi=prompt[j])
        rows.add(np.concatenate([dc, dov]), 1.0, lo=nd[j], hi=nd[j])
        rows.add(np.concatenate([pc, pov]), 1.0, lo=kp[j])
        rows.add([xov[0], pov[0]], [1, -q], hi=0)
        # decode fraction done by the end of interval s <= prompt fraction done by then (cumulative columns)
        if True:
            cd = cols.add(k)
            cx = cols.add(k)
            for s in range(k):
                prev_d = [cd[s - 1]] if s else []
                prev_x = [cx[s - 1]] if s else []
                rows.add([cd[s], dc[s], *prev_d], [1, -1] + [-1] * len(prev_d), lo=0, hi=0)
                rows.add([cx[s], xc[s], *prev_x], [1, -1] + [-1] * len(prev_x), lo=0, hi=0)
                if nd[j] > 0:
                    rows.add([cd[s], cx[s]], [1.0 / nd[j], -1.0 / prompt[j]], hi=0)
                # B: the remaining op fraction 1 - (kp cx / I + cd) / n over the part of the interval
                # after a_j and after the first T_max seconds (the span J_i starts by then)
                i = i0 + s
                length = max(0.0, starts[i] + step - max(starts[i], a[j]) - t_max)
                if length > 0:
                    rem_const[i] += length
                    rem_terms[i] += [
                        (cx[s], -length * kp[j] / prompt[j] / n_ops[j]),
                        (cd[s], -length / n_ops[j]),
                    ]
    for i in range(nint):
        cc = [R[i], o[i]] + ([o[i - 1]] if i else [])
        vv = [fixed, -1.0] + ([1.0] if i else [])
        for c_, v_ in machine_terms[i]:
            cc += list(c_)
            vv += list(v_)
        rows.add(cc, vv, hi=step)
        if math.isfinite(cbud) and token_terms[i]:
            cc = [R[i]] + [c for c_, _ in token_terms[i] for c in c_]
            vv = [-cbud] + [1.0] * (len(cc) - 1)
            rows.add(cc, vv, hi=0)
    if objective != "mbt":
        for c in cols.cost:
            c[:] = 0.0
        nvar = cols.add(nint, cost=1.0 if objective == "ps" else 0.0)
        grid = np.geomspace(0.01, 5.0, tangents)
        for i in range(nint):
            if not ops_terms[i]:
                continue
            yc = np.array(ops_terms[i])
            uc = np.array([c for c, _ in root_terms[i]])
            uv = np.array([v for _, v in root_terms[i]])
            for sv in grid:
                # N_i >= F Y_i + 2 s U_i - s^2 R_i
                rows.add(
                    np.concatenate([[nvar[i], R[i]], yc, uc]),
                    np.concatenate([[1.0, sv * sv], np.full(yc.size, -fixed), -2 * sv * uv]),
                    lo=0,
                )
            if rem_terms[i]:
                rc = np.array([c for c, _ in rem_terms[i]])
                rv = np.array([v for _, v in rem_terms[i]])
                rows.add(np.concatenate([[nvar[i]], rc]), np.concatenate([[1.0], -rv]), lo=rem_const[i])
        if objective == "both":
            z = cols.add(1, lo=-math.inf, cost=1.0)
            rows.add(np.concatenate([[z[0]], nvar]), np.concatenate([[1.0], -np.ones(nint)]), lo=0)
            mc, mv = np.concatenate(mbt_cols), np.concatenate(mbt_vals)
            rows.add(np.concatenate([[z[0]], mc]), np.concatenate([[1.0], -mv]), lo=const)
        const = 0.0
    return cols, rows, const, dict(nint=nint, t_max=t_max, fixed=fixed, delta=delta)


def solve(cols: Cols, rows: Rows, threads: int = 2, time_limit: float = 600.0):
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", threads)
    h.setOptionValue("time_limit", time_limit)
    h.setOptionValue("solver", SOLVER)
    h.setOptionValue("run_crossover", "off")
    lp = highspy.HighsLp()
    lp.num_col_ = cols.n
    lp.num_row_ = rows.n
    lp.col_cost_ = np.concatenate(cols.cost)
    lp.col_lower_ = np.concatenate(cols.lo)
    lp.col_upper_ = np.concatenate(cols.hi)
    lp.row_lower_ = np.array(rows.lo)
    lp.row_upper_ = np.array(rows.hi)
    r_all, c_all, v_all = np.concatenate(rows.r), np.concatenate(rows.c), np.concatenate(rows.v)
    order = np.lexsort((r_all, c_all))
    start = np.zeros(cols.n + 1, dtype=np.int64)
    np.add.at(start, c_all + 1, 1)
    start = np.cumsum(start)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = r_all[order]
    lp.a_matrix_.value_ = v_all[order]
    h.passModel(lp)
    h.run()
    info = h.getInfo()
    return h.getModelStatus(), info.objective_function_value, info.mip_dual_bound, h


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("instance")
    ap.add_argument("--step", type=float, default=1.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--form", type=int, default=-1)
    ap.add_argument("--tangents", type=int, default=12)
    ap.add_argument("--solver", default="ipm")
    ap.add_argument("--objective", default="mbt", choices=["mbt", "ps", "both"])
    args = ap.parse_args()
    global SOLVER
    SOLVER = args.solver
    inst = instance_from_dict(read_json(args.instance))
    lim = inst.limits
    tau = int(min(lim.kv_blocks * lim.block_size, lim.max_batch_tokens or 10**9))
    forms = separable_forms(instance_cost_model(inst), tau)
    picks = range(len(forms)) if args.form < 0 else [args.form]
    for k in picks:
        t0 = time.time()
        cols, rows, const, meta = build(inst, forms[k], args.step, args.window, args.objective, args.tangents)
        t1 = time.time()
        status, val, _, _ = solve(cols, rows)
        print(
            f"form {k} line {forms[k].line}: {cols.n} cols {rows.n} rows build {t1 - t0:.1f}s"
            f" solve {time.time() - t1:.1f}s status {status} value {val + const:.1f} (const {const:.1f}) {meta}",
            flush=True,
        )


if __name__ == "__main__":
    main()
