"""The ``kvsched`` command line.

Each command lives in :mod:`kvsched.commands`; this module assembles the parser
and turns every :class:`~kvsched.errors.KvschedError` into one line on stderr.
Exit codes: 0 ok, 1 schedule illegal, 2 bad input, 3 internal error (a bug: one
line with a hint to report it; ``KVSCHED_DEBUG=1`` prints the traceback).
"""

# ruff: noqa: E402 - the clock starts before the heavy imports
from __future__ import annotations

import time

_STARTED = time.monotonic()  # before the heavy imports: --time-limit covers them too

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from kvsched import __version__
from kvsched.commands import (
    analysis,
    bound,
    costmodel,
    executor,
    instances,
    schedules,
    simulate,
    solve,
    warmup,
)
from kvsched.commands.common import EXIT_ERROR, EXIT_INTERNAL
from kvsched.errors import KvschedError
from kvsched.stop import mark_start

#: Command modules, in the order ``kvsched --help`` lists them.
COMMAND_MODULES = (instances, schedules, simulate, solve, bound, costmodel, executor, analysis, warmup)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsched",
        description="Optimal schedules for LLM inference, and every practical scheduler measured against them.",
    )
    parser.add_argument("--version", action="version", version=f"kvsched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    global _STARTED
    # A command from the command line (argv None: the console script, python -m kvsched.cli) counts
    # its imports, once; a call with arguments (tests, the Python API) or a later one starts now, or
    # its deadline would count the time since the module was imported (a test collection, a notebook).
    mark_start(_STARTED if argv is None else None)
    _STARTED = None
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KvschedError as exc:
        print(f"kvsched {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"kvsched {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (kvsched ... | head): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's final flush cannot fail again
        return 141
    except Exception as exc:  # a bug: one line and a hint, the traceback only on request
        if os.environ.get("KVSCHED_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        detail = (str(exc).splitlines() or [""])[0][:300]
        print(
            f"kvsched {args.command}: internal error: {type(exc).__name__}: {detail} -- this is a bug in "
            "kvsched; please report it with the command line (KVSCHED_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
