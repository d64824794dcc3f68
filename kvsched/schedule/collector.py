"""The cyclic garbage collector, paused around work that makes many long-lived objects and no cycles.

A simulation's trace (records, runs, their arrays) and a loaded instance are
hundreds of thousands of objects without reference cycles, all kept: each pass
of the collector over them frees nothing. Pausing it is not enough on its own:
the collector counts the objects made meanwhile, and the first allocation after
it resumes sets off a pass over every one of them (14 ms after azure-10k's loop,
about 0.4 s at 100,000 requests). :func:`resume_collector` moves them to the
oldest generation instead, as surviving two passes would have, in constant time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def resume_collector() -> None:
    """Enable the collector, the objects made while it was paused counted as old (not young).

    ``gc.freeze`` moves every tracked object to the permanent generation and zeroes
    the young generation's count; ``gc.unfreeze`` moves them all to the oldest
    generation (two list splices). Skipped when someone else froze objects (a
    forking server): unfreezing would release theirs.
    """
    if not gc.get_freeze_count():
        gc.freeze()
        gc.unfreeze()
    gc.enable()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector for the block (if it was enabled), then :func:`resume_collector`."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            resume_collector()


__all__ = ["collector_paused", "resume_collector"]
