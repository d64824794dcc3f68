"""Errors that reach the user as one clear line."""


class KvschedError(Exception):
    """A user-facing error: bad input, an impossible request, wrong units.

    The CLI prints ``str(error)`` on one line and exits non-zero; it never shows a
    traceback for this class.
    """


class InputError(KvschedError):
    """A file or argument that cannot be read or does not fit its schema."""


class InfeasibleInstanceError(KvschedError):
    """An instance with a request that can never be served (e.g. I + O - 1 > M)."""
