"""Certified regret at scale: issue 15's target table (run by hand, not a test).

Usage::

    python benchmarks/regret_scale.py                                  # every case, 60 s limit
    python benchmarks/regret_scale.py --limit 10 --sizes 100,1000      # a quick pass on the small sizes
    python benchmarks/regret_scale.py --cases sharegpt-10k,calibrated --markdown table.md
    python benchmarks/regret_scale.py --folder runs/ --reuse           # the table again from saved results

Each row runs ``kvsched solve INSTANCE --time-limit LIMIT --json FILE`` (``--formulation auto``, the
default) as its own process, as ``benchmarks/deadline.py`` does: the wall time is the whole command, loading
included, and the result is what that command claims (incumbent, bound, bound source, gap over every legal
schedule). Instances are made with ``kvsched generate`` and then, where the case needs it, rewritten by the
helpers below (Poisson arrivals, KV capacity, lengths); every instance file is kept in ``--folder``.

Cases (``--cases`` takes case names or these group names):

* ``sharegpt-10k``: ``kvsched generate sharegpt --n 10000`` (seed 0): unit time, all at 0, M = 100,000.
  Target gap <= 0.5% in <= 10 s, so this row runs with a 10 s limit (or ``--limit`` if smaller).
* ``poisson``: ShareGPT, Azure conversation and Azure code lengths (``generate sharegpt / azure-conv /
  azure-code``, seed 0, the first n requests), Poisson arrivals, unit time (arrivals rounded up to whole
  slots), M = 20,000, n in ``--sizes``. The *memory load* is rho = rate x mean(A_j) / M, with A_j = O_j I_j +
  O_j (O_j - 1) / 2 the KV area of request j (KV-token-slots it must hold, notes/005 Sec. 2.1): the rate per
  slot is chosen to give each rho of ``--loads`` (default 1.0; the issue's range is 0.7-1.3). The Azure code
  trace holds 8,819 requests: its "10k" row is the whole trace. Target <= 2%.
* ``budget``: the same with a token budget C = P = 2048. Target <= 3%.
* ``calibrated``: Azure conversation, 1k (and 10k, ``--sizes``) requests, the shipped fit
  ``llama-2-7b_a100-80gb_tp1`` (seconds), C = P = 512, M = 125,885 (``kvsched capacity --model llama-2-7b
  --gpu a100-80gb``), Poisson arrivals in seconds at the rate where ``sarathi`` keeps the KV cache 70% busy
  on average over its makespan (time-weighted, idle time counting as empty), found by bisection on the 1k
  instance and used for 10k too. Targets <= 5% (1k), <= 10% (10k).
* ``linear``: ``benchmarks/bounds.py``'s chunked linear cases: ShareGPT lengths / 10, all at 0, M = 20/30/40%
  of the summed peaks I + O - 1, C = P = 64, ``infermax-linear``, n = 100 and 200. Recorded (2% to beat).

Columns: instance, n, cost model, M, C = P, load, incumbent (and which heuristic found it), the best policy
the pipeline ran (how far the incumbent is from it), bound, bound source, gap, target, wall time against
the row's limit, and the machine's 1-minute load average when the row finished. The machine is shared: read wall times with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

CLI = [sys.executable, "-m", "kvsched.cli"]
A100_LLAMA2_7B_M = 125_885  # kvsched capacity --model llama-2-7b --gpu a100-80gb
CALIBRATED = "llama-2-7b_a100-80gb_tp1"
TRACE_LABEL = {"sharegpt": "ShareGPT", "azure-conv": "Azure conv", "azure-code": "Azure code"}
TRACE_SIZE = {"azure-code": 8_819}  # requests in the whole trace that fit M = 20,000


@dataclass(frozen=True)
class Case:
    """One row of the table: how its instance is made, and the issue's target for it."""

    name: str
    group: str
    kind: str  # kvsched generate KIND
    n: int
    target: float | None  # certified gap to reach, None: record only
    cost_model: str = "unit"
    kv: int | None = None  # M in tokens (None: the share of summed peaks below, or the generator's)
    kv_share: float | None = None  # M as this share of the summed peaks I + O - 1
    budget: int | None = None  # C = P
    load: float | None = None  # memory load rho (Poisson arrivals)
    kv_busy: float | None = None  # Poisson rate where sarathi keeps this share of the KV busy
    divide: int = 1  # lengths divided by this (rounded, at least 1)
    target_s: float | None = None  # wall-time target; also the case's time limit (at most --limit)
    extra: tuple[str, ...] = field(default=())


def cases(sizes: list[int], loads: list[float]) -> list[Case]:
    """Every case of issue 15's target table, for the given sizes and memory loads."""
    out = [Case("sharegpt-10k", "sharegpt-10k", "sharegpt", 10_000, 0.005, target_s=10.0)]
    for group, budget, target in (("poisson", None, 0.02), ("budget", 2048, 0.03)):
        for kind in ("sharegpt", "azure-conv", "azure-code"):
            for n in sizes:
                for rho in loads:
                    m = min(n, TRACE_SIZE.get(kind, n))
                    tag = f"{kind}-{_short(n)}-rho{rho:g}" + ("-c2048" if budget else "")
                    out.append(Case(tag, group, kind, m, target, kv=20_000, budget=budget, load=rho))
    for n in sizes:
        if n >= 1000:
            target = 0.05 if n < 10_000 else 0.10
            out.append(
                Case(
                    f"azure-conv-{_short(n)}-a100",
                    "calibrated",
                    "azure-conv",
                    n,
                    target,
                    cost_model=CALIBRATED,
                    kv=A100_LLAMA2_7B_M,
                    budget=512,
                    kv_busy=0.7,
                )
            )
    for n in (100, 200):
        for share in (0.2, 0.3, 0.4):
            out.append(
                Case(
                    f"sharegpt{n}-linear-kv{round(100 * share)}",
                    "linear",
                    "sharegpt",
                    n,
                    None,
                    cost_model="infermax-linear",
                    kv_share=share,
                    budget=64,
                    divide=10,
                )
            )
    return out


def _short(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


# -- instances ---------------------------------------------------------------------------------------------


class CaseError(Exception):
    """A case whose instance ``kvsched generate`` refused (its error line is the message)."""


def generate(case: Case, folder: Path) -> Path:
    """``kvsched generate`` the case's requests (all at 0 for ShareGPT, the trace's own arrivals for Azure),
    then rewrite lengths, KV capacity and arrivals as the case says. Cached in ``folder``."""
    path = folder / f"{case.name}.json"
    if path.exists():
        return path
    raw = folder / f"{case.name}.generated.json"
    args = [*CLI, "generate", case.kind, "--n", str(case.n), "--seed", "0", "-o", str(raw)]
    if case.kv is not None:
        args += ["-M", str(case.kv)]
    elif case.kv_share is not None:
        args += ["-M", str(10**7)]  # nothing dropped; M is set from the (scaled) peaks below
    if case.budget is not None:
        args += ["-C", str(case.budget), "-P", str(case.budget)]
    if case.cost_model != "unit":
        args += ["--cost-model", case.cost_model]
    made = subprocess.run(args, capture_output=True, text=True)
    if (
        made.returncode
    ):  # e.g. a trace with fewer requests than n: kvsched's one error line, and the next case
        raise CaseError(
            made.stderr.strip().splitlines()[-1] if made.stderr.strip() else f"exit {made.returncode}"
        )
    doc = json.loads(raw.read_text())
    if case.divide > 1:
        divide_lengths(doc, case.divide)
    if case.kv_share is not None:
        set_kv_share(doc, case.kv_share)
    if case.load is not None:
        rate = rate_for_load(doc, case.load)
        poisson_arrivals(doc, rate, seed=0, tick=1.0)
    elif case.kv_busy is not None:
        rate = calibrated_rate(doc, case.kv_busy, folder)
        poisson_arrivals(doc, rate, seed=0, tick=None)
    doc["name"] = case.name
    path.write_text(json.dumps(doc, indent=1))
    raw.unlink()
    return path


def kv_areas(doc: dict) -> np.ndarray:
    """A_j = sum over tokens u = 1..O of the KV held while generating it, I + u - 1."""
    prompt = np.array([r["prompt"] for r in doc["requests"]], dtype=float)
    output = np.array([r["output"] for r in doc["requests"]], dtype=float)
    return output * prompt + output * (output - 1) / 2


def divide_lengths(doc: dict, divide: int) -> None:
    """Prompt and output lengths / ``divide``, rounded, at least 1 (``benchmarks/bounds.py``'s scaling)."""
    for r in doc["requests"]:
        r["prompt"] = max(1, round(r["prompt"] / divide))
        r["output"] = max(1, round(r["output"] / divide))


def set_kv_share(doc: dict, share: float) -> None:
    """M = ``share`` of the summed peaks I + O - 1 (at least the largest peak)."""
    peaks = [r["prompt"] + r["output"] - 1 for r in doc["requests"]]
    doc["limits"]["kv_capacity"] = max(max(peaks), math.ceil(share * sum(peaks)))


def rate_for_load(doc: dict, load: float) -> float:
    """The arrival rate per time unit at which the offered KV area fills ``load`` of M: load x M / mean A."""
    return load * doc["limits"]["kv_capacity"] / float(kv_areas(doc).mean())


def poisson_arrivals(doc: dict, rate: float, *, seed: int, tick: float | None) -> None:
    """Replace the arrivals by a Poisson process of ``rate`` starting at 0 (requests keep their order),
    rounded up to multiples of ``tick`` when given (whole slots under unit time)."""
    n = len(doc["requests"])
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    if tick:
        arrivals = np.ceil(arrivals / tick) * tick
    for r, a in zip(doc["requests"], arrivals, strict=True):
        r["arrival"] = float(a)
    doc.setdefault("meta", {})["arrivals"] = {"process": "poisson", "rate": rate, "seed": seed, "tick": tick}


def kv_busy(doc: dict, policy: str = "sarathi") -> float:
    """Time-average share of M that ``policy`` holds over its makespan (idle stretches count as empty)."""
    from kvsched.heuristics import make_policy, simulate
    from kvsched.instances.io import instance_from_dict
    from kvsched.schedule.metrics import batch_metrics

    sim = simulate(instance_from_dict(doc), make_policy(policy))
    bat = batch_metrics(sim.trace)
    makespan = float(bat["end"].max())
    return float((bat["kv_util"] * bat["duration"]).sum()) / makespan


def calibrated_rate(doc: dict, busy: float, folder: Path) -> float:
    """The Poisson rate at which sarathi keeps ``busy`` of the KV cache in use, by bisection on log(rate)
    over the first 1,000 requests (cached in ``folder`` and shared by the sizes of one cost model)."""
    cache = folder / f"rate-{doc['time_model']['name']}-{doc['limits']['kv_capacity']}-busy{busy:g}.json"
    if cache.exists():
        return float(json.loads(cache.read_text())["rate"])
    probe = json.loads(json.dumps(doc))
    probe["requests"] = probe["requests"][:1000]
    lo, hi = 0.01, 100.0  # requests per second
    steps = []
    for _ in range(12):
        mid = math.sqrt(lo * hi)
        poisson_arrivals(probe, mid, seed=0, tick=None)
        got = kv_busy(probe)
        steps.append((mid, got))
        lo, hi = (mid, hi) if got < busy else (lo, mid)
        if abs(got - busy) < 0.01:
            break
    rate = min(steps, key=lambda s: abs(s[1] - busy))[0]
    cache.write_text(json.dumps({"rate": rate, "steps": steps}))
    return rate


# -- solving -----------------------------------------------------------------------------------------------


def solve(instance: Path, limit: float, folder: Path) -> dict:
    """One ``kvsched solve`` process; its JSON result, wall time and exit status."""
    out = folder / f"{instance.stem}.result.json"
    out.unlink(missing_ok=True)
    args = [*CLI, "solve", str(instance), "--time-limit", f"{limit:g}", "--json", str(out)]
    start = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=5 * limit + 120)
        rc, err = proc.returncode, proc.stderr.strip().splitlines()[-1:]
        if rc not in (0, 2):
            (folder / f"{instance.stem}.stderr.txt").write_text(proc.stderr)
    except subprocess.TimeoutExpired:
        rc, err = -9, ["killed: no result in 5 x limit + 120 s"]
    wall = time.monotonic() - start
    doc = json.loads(out.read_text()) if out.exists() else {}
    row = {"wall": wall, "rc": rc, "error": " ".join(err), "limit": limit, "load1": os.getloadavg()[0]}
    row["doc"] = {
        k: doc.get(k) for k in ("status", "objective", "best_bound", "gap", "bound_source", "scope")
    }
    stats = doc.get("stats") or {}
    row["doc"]["found_by"] = stats.get("found_by")
    row["doc"]["incumbents"] = stats.get("incumbents") or {}
    row["doc"]["stopped"] = doc.get("stopped")
    (folder / f"{instance.stem}.row.json").write_text(json.dumps(row, indent=1))
    return row


# -- table -------------------------------------------------------------------------------------------------

COLUMNS = (
    "instance", "n", "cost model", "M", "C=P", "load", "incumbent", "found by", "best policy",
    "bound", "bound source", "gap", "target", "wall / limit s",
)  # fmt: skip


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def cells(case: Case, inst: Path, row: dict) -> list[str]:
    """One table row: what the solve command claimed, beside the case's target."""
    doc = row["doc"]
    meta = json.loads(inst.read_text())
    lim = meta["limits"]
    gap = doc.get("gap")
    policies = {k[7:]: v for k, v in doc["incumbents"].items() if k.startswith("policy:") and v is not None}
    best_policy = "-"
    if policies:
        name, value = min(policies.items(), key=lambda kv: kv[1])
        best_policy = f"{name} {value:.6g}"
        if doc.get("objective"):
            best_policy += f" (+{100 * (value / doc['objective'] - 1):.1f}%)"
    if case.load is not None:
        load = f"rho {case.load:g}"
    elif case.kv_busy is not None:
        rate = meta.get("meta", {}).get("arrivals", {}).get("rate")
        load = f"{rate:.3g}/s ({100 * case.kv_busy:.0f}% busy)"
    elif case.kv_share is not None:
        load = f"KV {100 * case.kv_share:.0f}%"
    else:
        load = "all at 0"
    target = "record" if case.target is None else f"<= {100 * case.target:g}%"
    if case.target_s is not None:
        target += f" in {case.target_s:g} s"
    met = gap is not None and case.target is not None and gap <= case.target + 1e-12
    met = met and (case.target_s is None or row["wall"] <= case.target_s)
    status = doc.get("status") or f"exit {row['rc']}: {row['error'][:40]}"
    return [
        case.name,
        f"{len(meta['requests']):,}",
        meta["time_model"]["name"] if case.cost_model == "unit" else case.cost_model,
        f"{lim['kv_capacity']:,}",
        "-" if lim.get("max_batch_tokens") is None else str(lim["max_batch_tokens"]),
        load,
        _fmt(doc.get("objective")),
        str(doc.get("found_by") or "-"),
        best_policy,
        _fmt(doc.get("best_bound")),
        str(doc.get("bound_source") or "-"),
        ("-" if gap is None else f"{100 * gap:.2f}%") + ("" if doc.get("status") else f" ({status})"),
        target + (" ok" if met else ""),
        f"{row['wall']:.1f} / {row['limit']:g} (load {row['load1']:.1f})",
    ]


def markdown(rows: list[list[str]], limit: float) -> str:
    load = os.getloadavg()
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    lines.append("")
    lines.append(
        f"`kvsched solve --time-limit {limit:g}` per row (the 10k ShareGPT row: its target, 10 s); "
        f"wall is the whole command (with the 1-min load average when it ended); load average at the end (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} on {os.cpu_count()} cores."
    )
    return "\n".join(lines) + "\n"


def select(all_cases: list[Case], names: str | None) -> list[Case]:
    if not names:
        return all_cases
    wanted = set(names.split(","))
    picked = [c for c in all_cases if c.name in wanted or c.group in wanted]
    unknown = wanted - {c.name for c in picked} - {c.group for c in picked}
    if unknown:
        raise SystemExit(
            f"unknown case(s): {', '.join(sorted(unknown))}; known: {[c.name for c in all_cases]}"
        )
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=float, default=60.0, help="kvsched solve --time-limit (default 60)")
    parser.add_argument("--sizes", default="100,1000,10000", help="n for the Poisson and calibrated cases")
    parser.add_argument("--loads", default="1.0", help="memory loads rho for the Poisson cases")
    parser.add_argument("--cases", default=None, help="comma-separated case or group names (default: all)")
    parser.add_argument("--folder", default=None, help="instances and results (default: a temp dir)")
    parser.add_argument("--reuse", action="store_true", help="print saved results instead of solving again")
    parser.add_argument("--markdown", default=None, help="also write the table as markdown here")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    loads = [float(s) for s in args.loads.split(",")]
    picked = select(cases(sizes, loads), args.cases)
    console = Console(width=220)
    if args.list:
        for c in picked:
            console.print(f"{c.group:12s} {c.name}", highlight=False)
        return 0
    folder = Path(args.folder or tempfile.mkdtemp(prefix="kvsched-regret-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    for case in picked:
        try:
            inst = generate(case, folder)
        except CaseError as exc:
            console.print(f"  {case.name}: not generated: {exc}", highlight=False)
            continue
        saved = folder / f"{inst.stem}.row.json"
        limit = min(args.limit, case.target_s or args.limit)
        row = json.loads(saved.read_text()) if args.reuse and saved.exists() else solve(inst, limit, folder)
        rows.append(cells(case, inst, row))
        console.print(f"  {case.name}: gap {rows[-1][11]} in {rows[-1][13]} s", highlight=False)
    table = Table(title=f"certified regret at scale: kvsched solve --time-limit {args.limit:g} (issue 15)")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("instance", "found by", "bound source") else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    load = os.getloadavg()
    console.print(
        f"load average (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores;"
        f" instances and results in {folder}",
        highlight=False,
    )
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
