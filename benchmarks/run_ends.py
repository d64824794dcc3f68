"""Why the simulator's stored entries end, and what each event costs (run by hand, not a test).

Usage::

    python benchmarks/run_ends.py                    # azure-10k, sarathi
    python benchmarks/run_ends.py --case azure-1k -p vllm

Simulates one case of ``benchmarks/simulate.py`` and classifies, from the
schedule and its trace alone, every stored entry (a batch or a coalesced run) by
the event its last batch ends with, and every stored batch (each one a policy
call: runs are offers, not calls) by what came before it:

* ``completion``: a request completed in the entry's last batch;
* ``prompt end``: a prompt (or refill) chunk finished its prompt there;
* ``arrival``: a request arrived by the next batch's start (the policy sees it);
* ``eviction``: the next batch evicts;
* ``other``: none of these (a memory or reservation threshold, a mixed run
  stopped before its prompt's last chunk, a run offer answered 0).

An entry may end with several events: the first in this order names it. The
counts say where entries and policy calls come from (issue #16: each costs tens
of microseconds of Python); ``--no-coalesce`` shows the batch-by-batch baseline.
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import build, cases

from kvsched.heuristics import make_policy, simulate
from kvsched.schedule.core import TIME_TOL
from kvsched.schedule.ir import Run
from kvsched.schedule.records import RunRecord


def classify(case: str, policy: str, coalesce: bool) -> tuple[Counter, Counter, int, int]:
    """(entries by ending, policy calls by what preceded them, entries, batches) of one simulation."""
    chosen = {c.name: c for c in cases(True)}[case]
    result = simulate(build(chosen), make_policy(policy), coalesce=coalesce)
    entries = result.schedule.entries
    # One record per entry (a run that ends with its prompt's last chunk: its tail says how it ended).
    last = []
    records = iter(result.trace.entries)
    for _ in entries:
        rec = next(records)
        if type(rec) is RunRecord and rec.tail is not None:
            rec = next(records)
        last.append(rec)
    arrivals = sorted(r.arrival for r in result.trace.instance.requests)
    ends: Counter = Counter()
    calls: Counter = Counter()
    before = "start"
    for i, (entry, rec) in enumerate(zip(entries, last, strict=True)):
        kind = "run" if type(entry) is Run else "batch"
        if kind == "batch":
            calls[before] += 1
        nxt = entries[i + 1] if i + 1 < len(entries) else None
        if rec.completed.size:
            why = "completion"
        elif type(rec) is not RunRecord and rec.generated.size > rec.num_decodes:
            why = "prompt end"
        elif nxt is not None and bisect.bisect_right(arrivals, nxt.start + TIME_TOL) > bisect.bisect_right(
            arrivals, entry.start + TIME_TOL
        ):
            why = "arrival"
        elif nxt is not None and type(nxt) is not Run and nxt.evicted.size:
            why = "eviction"
        else:
            why = "other"
        ends[(kind, why)] += 1
        before = f"after a {kind} ending with {why}"
    return ends, calls, len(entries), len(result.schedule)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", default="azure-10k", help="a case of benchmarks/simulate.py")
    parser.add_argument("-p", "--policy", default="sarathi")
    parser.add_argument("--no-coalesce", action="store_true", help="step batch by batch")
    args = parser.parse_args(argv)
    ends, calls, num_entries, num_batches = classify(args.case, args.policy, not args.no_coalesce)
    print(f"{args.case} / {args.policy}: {num_batches:,} batches in {num_entries:,} entries")
    print("entries by how their last batch ends:")
    for (kind, why), count in ends.most_common():
        print(f"  {count:8,}  {kind:5s}  {why}")
    print(f"policy calls (stored batches): {sum(calls.values()):,}, by what came before:")
    for before, count in calls.most_common():
        print(f"  {count:8,}  {before}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
