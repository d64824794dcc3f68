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
import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

# numpy's OpenBLAS starts a thread per core as numpy loads, and they spin waiting for work that a
# command never gives them (its numpy work is element-wise; the few dot products are on a few
# elements): on a busy 2-core machine that cost ~0.04 s of a 1 s `kvsched simulate`. One thread,
# unless the caller chose (set before the first numpy import below; a no-op if numpy is loaded).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kvsched.commands.common import EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, KEPT
from kvsched.errors import KvschedError
from kvsched.stop import INTERRUPTS, interrupted, mark_start

#: Each command and the module of :mod:`kvsched.commands` that registers it, in the order ``kvsched
#: --help`` lists them (tests/test_cli.py checks it against what the modules register).
COMMANDS: dict[str, str] = {
    "generate": "instances",
    "info": "instances",
    "validate": "schedules",
    "convert": "schedules",
    "policies": "simulate",
    "simulate": "simulate",
    "solve": "solve",
    "compare": "solve",
    "bound": "bound",
    "capacity": "costmodel",
    "calibrate": "costmodel",
    "replay": "executor",
    "profile": "executor",
    "sweep": "analysis",
    "results": "analysis",
    "regret": "analysis",
    "plot": "analysis",
    "report": "analysis",
    "warmup": "warmup",
}
#: The command modules, in the same order.
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


class _Version(argparse._VersionAction):
    """``--version``: the installed version, looked up only when asked (importlib.metadata costs ~20 ms)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
    ) -> None:
        from kvsched import __version__

        self.version = f"kvsched {__version__}"
        super().__call__(parser, namespace, values, option)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a usage error as one line (the rule for every bad input), not the usage
    block first: ``kvsched simulate: error: ... (kvsched simulate --help lists the options)``.

    Subcommand parsers are of the same class (``add_subparsers`` takes the parent's).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """argparse's, except that words no parser took are the error of the command they follow.

        argparse reports them from the top level (``kvsched: error: unrecognized arguments``), which
        names no command and points at ``kvsched --help``, not the help that lists the command's options.
        """
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._command_parser(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost (sub)command parser ``parsed`` chose (``kvsched generate synthetic``'s, say)."""
        parser: argparse.ArgumentParser = self
        while True:
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            chosen = getattr(parsed, sub.dest, None) if sub is not None else None
            if sub is None or chosen not in sub.choices:
                return parser
            parser = sub.choices[chosen]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``kvsched`` parser; with ``command`` (a key of :data:`COMMANDS`), only that command's module's.

    A command then imports and registers its own module only, not the other
    eight and what they import (the full parser is for ``kvsched --help``, a
    mistyped command and the tests).
    """
    parser = _Parser(
        prog="kvsched",
        description="Optimal schedules for LLM inference, and every practical scheduler measured against them.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(f"kvsched.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    global _STARTED
    # A command from the command line (argv None: the console script, python -m kvsched.cli) counts
    # its imports, once; a call with arguments (tests, the Python API) or a later one starts now, or
    # its deadline would count the time since the module was imported (a test collection, a notebook).
    mark_start(_STARTED if argv is None else None)
    _STARTED = None
    words = sys.argv[1:] if argv is None else list(argv)
    # The command word comes first (the top level's only options, -h and --version, exit).
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    code = _run(args)
    if argv is None and (KEPT or _highs_busy()) and _alone():
        _leave(code)
    KEPT.clear()
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command: its exit code, every error as one line on stderr."""
    try:
        return int(args.func(args))
    except KvschedError as exc:
        print(f"kvsched {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except INTERRUPTS as exc:  # Ctrl-C, also as a compiled kernel reports it
        if not interrupted(exc):
            return _internal_error(args.command, exc)
        print(f"kvsched {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (kvsched ... | head): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's final flush cannot fail again
        return 141
    except OSError as exc:  # the system refused a read or a write (a full disk, a lost mount): not a bug
        where = f": {exc.filename}" if exc.filename else ""
        print(f"kvsched {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug: one line and a hint, the traceback only on request
        return _internal_error(args.command, exc)


def _internal_error(command: str, exc: BaseException) -> int:
    """A bug: one line and a hint on stderr, the traceback only on request (KVSCHED_DEBUG=1)."""
    if os.environ.get("KVSCHED_DEBUG", "") not in ("", "0"):
        import traceback  # here: only a bug prints one

        traceback.print_exception(exc)
    detail = (str(exc).splitlines() or [""])[0][:300]
    print(
        f"kvsched {command}: internal error: {type(exc).__name__}: {detail} -- this is a bug in "
        "kvsched; please report it with the command line (KVSCHED_DEBUG=1 shows the traceback)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def _highs_busy() -> bool:
    """Whether a HiGHS run left behind at its deadline is still in flight (never imports HiGHS's module)."""
    highs = sys.modules.get("kvsched.highs")
    return highs is not None and highs.busy()


def _alone() -> bool:
    """Whether no thread but the main one would hold up an exit (daemon threads, such as HiGHS's, do not)."""
    return all(t.daemon or t is threading.main_thread() for t in threading.enumerate())


def _leave(code: int) -> NoReturn:
    """End the process now, without freeing what the command kept (:func:`~kvsched.commands.common.keep_until_exit`)
    and without waiting for a HiGHS run left behind at its deadline (:func:`kvsched.highs.run_highs`).

    What an exit does before that still happens: the atexit handlers run and
    the standard streams are flushed. Only with no other non-daemon thread running
    (an exit would wait for it).
    """
    highs = sys.modules.get("kvsched.highs")
    if highs is not None:  # a HiGHS run left behind is not waited for: os._exit ends it with the process
        highs.leave_behind_at_exit()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more to write
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
