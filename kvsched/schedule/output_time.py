"""How long a command's (or a report's) output takes, and the part of a time limit its solve may use.

Below the commands: :func:`kvsched.analysis.report.instance_report` keeps time for its figures as ``kvsched
report`` does, from the same estimates (measured figures, in the tables' comments).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from kvsched.instances.model import Instance
from kvsched.stop import Deadline

#: Seconds every command keeps for its output, whatever the instance's size (tables, the result document).
OUTPUT_SECONDS = 0.3
#: Seconds per output token of the instance for each output (the metrics read the per-token events, the
#: JSON schedule and the Perfetto trace spell every token out): high estimates, the most per token measured
#: on 2 cores at load 5 (2026-11-28; ShareGPT with Poisson arrivals, 10k and 100k requests, 3.4 M and
#: 34.5 M tokens; the solve's schedule and vllm's). The summary table (it computes the metrics) 0.7-1.4e-7;
#: ``--json`` reuses them, 0.5-0.8e-9 more; a JSON schedule 2.1-3.3e-6, a ``.npz`` one 0.6-3.0e-7, a
#: Perfetto trace 2.6-4.5e-6. (The figures before, 3.5e-7 for the summary and 2.6e-7 for ``--json``, were
#: taken before their metrics were shared and kept 21 s of a 100k solve's limit for 3.5 s of output.)
OUTPUT_SECONDS_PER_TOKEN = {
    "summary": 1.5e-7,
    "json": 1e-8,
    "schedule.json": 3.5e-6,
    "schedule.npz": 3.0e-7,
    "trace": 4.5e-6,
    "figures": 1.0e-6,
    "figure": 4.5e-6,
    "drawing": 3.0e-7,
    "replay": 1.5e-6,
    "curve": 0.0,
}
#: Seconds an output takes whatever the instance's size. ``report``'s figures (Gantt charts, KV usage, CDFs,
#: the anytime curve; matplotlib's layout and PNG encoding), drawn from the replays its comparison kept: two
#: policies' took 2.3-5.0 s at 1k requests (28k-338k output tokens), 2.8 s and 5.8 s at 10k (2.2 M and 3.4 M)
#: and three schedules' about 21 s at 100k (34.5 M) on 2 cores at load 2.5-3 (2026-11-29; before the traces
#: were kept, 7.8 s at 1k where 1.1e-5 s a token was estimated, 525 s at 100k). One ``drawing`` from a trace
#: at hand: a Gantt chart 4.4 s, KV usage 3.0 s, the CDFs 3.6 s at 100k; a ``replay`` of that schedule 39 s.
#: ``plot``'s one figure (KV usage or CDFs of three schedules, or a Gantt chart, from their traces) took
#: 0.5-2.3 s at 417k tokens, 0.9-9.4 s at 2.2 M and 0.5-1.6 s at 247k (2026-11-29, load 3).
#: ``plot anytime``'s curve has a point per improvement, not per token.
OUTPUT_FIXED_SECONDS = {"figures": 6.0, "figure": 1.5, "drawing": 1.5, "replay": 0.2, "curve": 1.0}
#: The solve keeps at least this share of the limit: beyond it the output overruns (and the command says so).
OUTPUT_SHARE = 0.5


def output_seconds(instance: Instance, outputs: Iterable[str] = ("summary",)) -> float:
    """Estimated seconds a command's ``outputs`` (keys of :data:`OUTPUT_SECONDS_PER_TOKEN`) take for ``instance``."""
    outputs = tuple(outputs)
    tokens = sum(r.output for r in instance.requests)
    fixed = OUTPUT_SECONDS + sum(OUTPUT_FIXED_SECONDS.get(name, 0.0) for name in outputs)
    return fixed + tokens * sum(OUTPUT_SECONDS_PER_TOKEN[name] for name in outputs)


def seconds_text(value: float) -> str:
    """Seconds for a message: whole ones from 10 on, two significant digits below (never "0 s")."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def solve_deadline(
    deadline: Deadline, instance: Instance, outputs: Iterable[str] = ("summary",), *, warn: str = ""
) -> Deadline:
    """The part of a command's ``deadline`` its solve may use: the rest pays for printing and writing.

    ``outputs`` names what the command will write (:func:`output_seconds`); at most
    :data:`OUTPUT_SHARE` of the limit is kept for them. With ``warn`` (the
    command's name), output estimated to take longer than that is announced on
    stderr before the solve starts (the command then ends late by about the
    difference).
    """
    if not deadline.bounded:
        return deadline
    outputs = tuple(outputs)
    needed = output_seconds(instance, outputs)
    reserve = min(OUTPUT_SHARE * deadline.limit, needed)
    if warn and needed > reserve:
        slow = max(outputs, key=OUTPUT_SECONDS_PER_TOKEN.__getitem__)
        hint = " (a .npz schedule writes in a tenth of the time)" if slow == "schedule.json" else ""
        print(
            f"kvsched {warn}: warning: --time-limit {deadline.limit:g}: its output ({', '.join(outputs)}) "
            f"takes about {seconds_text(needed)} s to write for this instance, more than {OUTPUT_SHARE:.0%} of the "
            f"limit; the command will end late{hint}",
            file=sys.stderr,
        )
    return deadline.before(reserve)
