"""Errors that reach the user as one clear line."""

import os


class KvschedError(Exception):
    """A user-facing error: bad input, an impossible request, wrong units.

    The CLI prints ``str(error)`` on one line and exits non-zero; it never shows a
    traceback for this class.
    """


class InputError(KvschedError):
    """A file or argument that cannot be read or does not fit its schema."""


class InfeasibleInstanceError(KvschedError):
    """An instance with a request that can never be served (e.g. I + O - 1 > M)."""


def expect_path(value: object, name: str = "path") -> str | os.PathLike[str]:
    """``value`` if it names a file (a ``str`` or a :class:`os.PathLike` such as :class:`pathlib.Path`),
    else the one :class:`InputError` the API's readers and writers raise for it (``Path(None)`` would
    raise a TypeError from inside pathlib)."""
    if isinstance(value, str) or (isinstance(value, os.PathLike) and isinstance(os.fspath(value), str)):
        return value
    raise InputError(f"{name}: expected a file path (a str or a pathlib.Path), got {type(value).__name__}")
