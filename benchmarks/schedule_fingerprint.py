"""Fingerprint every policy's schedules, to prove a speed-up changed no behaviour (run by hand).

Usage::

    python benchmarks/schedule_fingerprint.py --save before.json   # before a change
    python benchmarks/schedule_fingerprint.py --check before.json  # after it: every hash must match
    python benchmarks/schedule_fingerprint.py --check benchmarks/schedule_fingerprint.baseline.json -p sarathi

``schedule_fingerprint.baseline.json`` holds the fingerprints of all 36 policies
on the simulator before issue #16 (commit 7987e18); its 224 entries for the
policies that existed before issue #3 (commit 68c32b5) are unchanged since then.
Policies registered later are not in it and are skipped by ``--check``.

Every registered policy runs on a handful of instances (the packaged examples, a
500-request ShareGPT trace with a small KV cache so that evictions happen, the
same with paged blocks and budgets, chunked-prefill and burst synthetic
traces). Each run is reduced to one SHA-256 over its batches (start, duration,
items, phases, evictions, bit-exact) and the core's per-batch records and final
state; a run that raises is fingerprinted by its error message instead.

Coalesced decode runs (issue #16) are hashed batch by batch (``Schedule`` and
``Trace.records`` spell a run out), so a schedule stored with runs has the
fingerprint of the same batches stored one by one. ``--no-coalesce`` simulates
without runs, to compare the two directly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvsched.errors import KvschedError
from kvsched.heuristics import list_policies, make_policy, simulate
from kvsched.heuristics.simulator import SimResult
from kvsched.instances.generators import Gamma, LogNormal, Poisson, SemiOnline, synthetic
from kvsched.instances.io import load_instance
from kvsched.instances.model import Instance, Limits, TimeModel

EXAMPLES = Path(__file__).resolve().parents[1] / "kvsched" / "instances" / "examples"


def _sharegpt(limits: Limits, arrival: Poisson | SemiOnline, max_total: int) -> Instance:
    from kvsched.instances.sharegpt import sharegpt

    return sharegpt(500, 1, limits, TimeModel("infermax-linear"), arrival=arrival, max_total=max_total)


def instances() -> dict[str, Callable[[], Instance]]:
    """The fingerprinted instances, by name (built lazily: ShareGPT needs the data file)."""
    out: dict[str, Callable[[], Instance]] = {}
    for path in sorted(EXAMPLES.glob("*.json")):
        if path.name.endswith(".schedule.json"):
            continue
        out[path.stem] = lambda path=path: load_instance(path)
    # Whole-prompt policies need every refill (up to I + O - 1) to fit the budgets.
    out["sharegpt-500-m8k"] = lambda: _sharegpt(Limits(8000, 1, 4096), Poisson(30.0), 2048)
    out["sharegpt-500-m6k-paged"] = lambda: _sharegpt(
        Limits(6000, 16, 2048, max_running=48), SemiOnline(), 1024
    )
    out["chunked-300"] = lambda: synthetic(
        300,
        3,
        Limits(4096, 16, 256, max_prefill_tokens=128, max_running=32),
        TimeModel("infermax-linear"),
        arrival=Poisson(40.0),
        prompt=LogNormal.from_mean(400, sigma=1.0, max=1500),
        output=LogNormal.from_mean(120, sigma=1.0, max=1000),
        predict_sigma=0.5,
    )
    out["burst-400"] = lambda: synthetic(
        400,
        7,
        Limits(3000, 1, 1024),
        TimeModel("unit"),
        arrival=Gamma(rate=0.5, cv=4.0),
        prompt=LogNormal.from_mean(120, sigma=0.8, max=500),
        output=LogNormal.from_mean(80, sigma=1.0, max=500),
        tick=1.0,
    )
    return out


def _update(h: hashlib._Hash, arr: np.ndarray, dtype: type) -> None:
    a = np.ascontiguousarray(arr, dtype=dtype)
    h.update(str(a.size).encode())
    h.update(a.tobytes())


def fingerprint(result: SimResult) -> str:
    """SHA-256 of the schedule (bit-exact times) and of what the core recorded."""
    h = hashlib.sha256()
    for b in result.schedule:
        h.update(np.array([b.start, b.duration], dtype=np.float64).tobytes())
        _update(h, b.requests, np.int64)
        _update(h, b.tokens, np.int64)
        _update(h, b.phases, np.int8)
        _update(h, b.evicted, np.int64)
    for r in result.trace.records:
        counts = (r.index, r.num_items, r.num_tokens, r.prefill_tokens, r.num_decodes, r.kv_tokens)
        counts += (r.kv_blocks, r.num_running, r.num_evicted)
        h.update(np.array(counts, dtype=np.int64).tobytes())
        h.update(np.array([r.start, r.end], dtype=np.float64).tobytes())
        _update(h, r.generated, np.int64)
        _update(h, r.completed, np.int64)
    s = result.trace.state
    for arr in (s.first_scheduled, s.first_token, s.completion):
        _update(h, arr, np.float64)
    for arr in (s.evictions, s.processed, s.generated):
        _update(h, arr, np.int64)
    h.update(json.dumps(result.schedule.meta, sort_keys=True, default=str).encode())
    return h.hexdigest()


def run_all(only: list[str] | None = None, *, coalesce: bool = True) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, build in instances().items():
        try:
            inst = build()
        except Exception as exc:  # ShareGPT is optional data: record why it was skipped
            print(f"{name}: skipped ({type(exc).__name__}: {exc})")
            continue
        out[name] = {}
        for spec in list_policies():
            if only and spec.name not in only:
                continue
            t0 = time.perf_counter()
            try:
                digest = fingerprint(simulate(inst, make_policy(spec.name), coalesce=coalesce))
            except KvschedError as exc:
                digest = "error: " + str(exc)
            out[name][spec.name] = digest
            print(f"{name:24s} {spec.name:22s} {time.perf_counter() - t0:6.2f}s {digest[:16]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--save", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument("--check", type=Path, help="compare with the fingerprints in this JSON file")
    parser.add_argument("-p", "--policy", action="append", help="only these policies (repeatable)")
    parser.add_argument("--no-coalesce", action="store_true", help="simulate batch by batch (no runs)")
    args = parser.parse_args(argv)
    got = run_all(args.policy, coalesce=not args.no_coalesce)
    if args.save:
        args.save.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"saved {sum(map(len, got.values()))} fingerprints to {args.save}")
    if args.check:
        want = json.loads(args.check.read_text())
        compared, bad = 0, []
        for inst, per in want.items():
            for pol, digest in per.items():
                if inst in got and pol in got[inst]:
                    compared += 1
                    if got[inst][pol] != digest:
                        bad.append(f"{inst} / {pol}")
        print(f"compared {compared} fingerprints: {len(bad)} differ")
        for line in bad:
            print("  DIFFERS:", line)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
