"""How many threads a solve may ask for: one range, checked where each entry point reads it.

It lives at the bottom of the package (beside :mod:`kvsched.stop`, which checks the time limit the same
way) so that the CLI and the sweep spec can check ``--threads`` and ``threads:`` without importing the
solvers.
"""

from __future__ import annotations

from kvsched.errors import InputError

#: The most threads accepted (solvers, and torch in the executor's commands): far above any machine's cores,
#: far below what a library can start (100,000 threads: HiGHS hung starting them or aborted the process with
#: SIGABRT without a word; torch crashed with a segmentation fault).
MAX_THREADS = 1024


def check_threads(threads: object, name: str = "--threads") -> int:
    """``threads`` if it is a whole number in 1..:data:`MAX_THREADS`, else one clear :class:`InputError`
    naming ``name`` (the option or field as the caller's user wrote it)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise InputError(f"{name}: must be a whole number in 1..{MAX_THREADS}, got {threads!r}")
    return threads
