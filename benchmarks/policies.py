"""Time every registered policy on issue #16's 1k case (run by hand, not a test).

Usage::

    python benchmarks/policies.py                    # every policy, one row each, and the total
    python benchmarks/policies.py -p wait -p rad     # only these
    python benchmarks/policies.py -p wait --profile  # ... with the top cProfile entries
    python benchmarks/policies.py --compare          # ... plus kvsched.analysis.compare (no solver) over them

The case (``azure-1k`` of ``benchmarks/simulate.py``): 1,000 Azure conversation
requests (``shared/data/traces/splitwise_conv.csv``, rows in order), Poisson
2 requests/s (seed 0), ``llama-2-7b_a100-80gb_tp1``, C = 512, M = 125,885; the
13 whole-prompt policies (``WHOLE_PROMPT_POLICIES`` of ``benchmarks/simulate.py``:
no chunked prefill, so at C = 512 they would refuse the trace's prompts of up to
4,145 tokens at once) at C = P = 8192, a budget that admits every prompt, as a
real engine without chunked prefill needs.

Columns: *batches* counts engine iterations (a coalesced run of k decode batches
counts k), *runs* the coalesced runs stored, *entries* the schedule's stored
entries (batches and runs), *calls* the policy's ``next_batch`` calls, *in policy*
the CPU seconds spent inside ``next_batch`` and ``repeat_decodes`` (the rest is the
simulator loop and the semantic core), *CPU s*
:func:`kvsched.heuristics.simulate` in this process (CPU seconds, best of
``--repeat``; a policy that cannot run the case fails fast and its seconds count
too). Issue #16's target: the CPU seconds of all 36 policies sum to at most 10 s. The figures are in ``docs/simulation.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import AZURE_WHOLE_C, WHOLE_PROMPT_POLICIES, policy_instances

from kvsched.errors import KvschedError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.schedule.ir import Run


def _counting(policy):
    """Count ``policy.next_batch`` calls and time them and ``repeat_decodes`` (instance attributes
    shadow the methods): ``[calls, seconds inside the policy]``."""
    tally = [0, 0.0]
    inner = policy.next_batch
    clock = time.process_time

    def next_batch(view):
        tally[0] += 1
        t0 = clock()
        try:
            return inner(view)
        finally:
            tally[1] += clock() - t0

    policy.next_batch = next_batch
    repeat = getattr(policy, "repeat_decodes", None)
    if callable(repeat):

        def repeat_decodes(view, decision, limit):
            t0 = clock()
            try:
                return repeat(view, decision, limit)
            finally:
                tally[1] += clock() - t0

        policy.repeat_decodes = repeat_decodes
    return tally


def time_policy(inst, name: str, repeat: int, profiler: cProfile.Profile | None):
    """Best CPU seconds of ``simulate`` for policy ``name``, its last result (or error) and its call count."""
    best = float("inf")
    result: object = None
    calls = [0, 0.0]
    for _ in range(max(repeat, 1)):
        pol = make_policy(name)
        calls = _counting(pol)
        if profiler is not None:
            profiler.enable()
        t0 = time.process_time()
        try:
            result = simulate(inst, pol)
        except KvschedError as exc:  # a policy that cannot run the case: its time still counts
            result = exc
        finally:
            spent = time.process_time() - t0
            if spent < best:
                best, inside = spent, calls[1]
            if profiler is not None:
                profiler.disable()
    return best, result, calls[0], inside


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-p", "--policy", action="append", help="only these policies (repeatable)")
    parser.add_argument("-n", type=int, default=1_000, help="requests (default 1,000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per policy; the best is shown")
    parser.add_argument("--profile", action="store_true", help="print the top cProfile entries per policy")
    parser.add_argument("--top", type=int, default=25, help="cProfile entries to print")
    parser.add_argument(
        "--compare", action="store_true", help="also time kvsched.analysis.compare (no solver) over them"
    )
    args = parser.parse_args(argv)
    console = Console(width=120)
    names = args.policy or list(POLICIES)
    instances = policy_instances(args.n, names)
    whole = sorted(WHOLE_PROMPT_POLICIES.intersection(names))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    console.print(
        f"{args.n:,} Azure requests, Poisson 2/s, C = 512 (whole-prompt policies at C = P = {AZURE_WHOLE_C}: "
        f"{len(whole)} of {len(names)}), M = 125,885; load average {' '.join(load)}"
    )
    table = Table(
        "policy", "batches", "runs", "entries", "calls", "CPU s", "in policy", title=f"{len(names)} policies"
    )
    total = inside_total = 0.0
    failures = 0
    for name in names:
        label = f"{name} (C = {AZURE_WHOLE_C})" if name in WHOLE_PROMPT_POLICIES else name
        profiler = cProfile.Profile() if args.profile else None
        cpu, result, calls, inside = time_policy(instances[name], name, args.repeat, profiler)
        total += cpu
        inside_total += inside
        if isinstance(result, KvschedError):
            failures += 1
            console.print(f"{label}: failed: {str(result)[:90]}")
            table.add_row(label, "failed", "", "", f"{calls:,}", f"{cpu:.2f}", f"{inside:.2f}")
            continue
        entries = result.schedule.entries
        runs = sum(isinstance(e, Run) for e in entries)
        row = (
            label,
            f"{len(result.schedule):,}",
            f"{runs:,}",
            f"{len(entries):,}",
            f"{calls:,}",
            f"{cpu:.2f}",
            f"{inside:.2f}",
        )
        console.print("  ".join(row))
        table.add_row(*row)
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
            print(out.getvalue())
    table.add_row(f"total ({failures} failed)", "", "", "", "", f"{total:.2f}", f"{inside_total:.2f}")
    console.print(table)
    if args.compare:
        from kvsched.analysis import compare

        t0 = time.process_time()
        for inst in {id(i): i for i in instances.values()}.values():  # one comparison per budget
            compare(inst, [p for p in names if instances[p] is inst], solver=None)
        console.print(f"compare (no solver) over {len(names)} policies: {time.process_time() - t0:.2f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
