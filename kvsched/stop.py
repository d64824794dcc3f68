"""Wall-clock budgets: one :class:`Deadline` handed down through every stage of a command.

Modelled on PyVRP's ``stop`` objects: a stopping criterion is a callable that
answers "should I stop now?". A :class:`Deadline` is created once, where the
command starts (``--time-limit T`` bounds the whole command: parsing, bounds,
warm starts, model building, solving, local search, decoding, validation), and
every loop that can run long asks it. Stages that want a share of what is left
take a :meth:`Deadline.share`, which never ends later than its parent.

It lives at the bottom of the package (beside :mod:`kvsched.errors`) because
every layer, from the simulator to the solvers, checks it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from numbers import Real

from kvsched.errors import InputError, KvschedError

#: A command may end this long after its deadline (returning, validating and writing its result).
GRACE_SECONDS = 1.0
#: ... or this share of the limit, whichever is larger.
GRACE_SHARE = 0.05


#: When the command started (:func:`mark_start`), so that a command's deadline covers its imports too.
_command_start: float | None = None


def mark_start(when: float | None = None) -> None:
    """Record when the command started (the CLI calls this before importing anything heavy)."""
    global _command_start
    _command_start = time.monotonic() if when is None else when


class DeadlineReached(KvschedError):
    """Raised by :meth:`Deadline.check` inside a loop that cannot return a partial answer itself.

    The stage that started the loop catches it and keeps what it had. It reaches the user where a
    public call has nothing to return by its deadline (:func:`kvsched.simulate` with ``deadline=``),
    so it is a :class:`~kvsched.errors.KvschedError` with a message (``except kv.KvschedError`` sees it).
    """

    def __init__(self, message: str = "the deadline passed before the work was done") -> None:
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point in :func:`time.monotonic` time after which work must stop.

    Parameters
    ----------
    end
        The :func:`time.monotonic` reading at which the budget is spent
        (``math.inf``: no limit).
    limit
        The budget in seconds it was created with (``math.inf``: none); kept
        for messages and for the grace allowance.
    """

    end: float = math.inf
    limit: float = math.inf

    def __post_init__(self) -> None:
        # A few comparisons per deadline (made once per command or stage), so that a misread
        # `Deadline(30)` (a monotonic reading long past, not 30 s) or a NaN cannot pass for a budget.
        end, limit = self.end, self.limit
        if type(end) is not float or type(limit) is not float:
            end, limit = _seconds(end, "end"), _seconds(limit, "limit")
            object.__setattr__(self, "end", end)
            object.__setattr__(self, "limit", limit)
        if end != end or limit != limit:  # NaN
            raise InputError(f"Deadline: end and limit must not be NaN (got end={end!r}, limit={limit!r})")
        if not limit > 0:
            raise InputError(f"Deadline: limit must be a positive number of seconds, got {limit!r}")
        if math.isfinite(end) and math.isinf(limit):
            raise InputError(
                f"Deadline({end!r}): the constructor takes a time.monotonic() reading and its budget, "
                f"not seconds from now: use kvsched.Deadline.after({end!r})"
            )

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now (``None``: never)."""
        if seconds is None:
            return cls()
        seconds = check_time_limit(seconds)
        return cls(time.monotonic() + seconds, seconds)

    @classmethod
    def for_command(cls, seconds: float) -> Deadline:
        """A deadline ``seconds`` after the command started (see :func:`mark_start`; else from now)."""
        seconds = check_time_limit(seconds)
        start = time.monotonic() if _command_start is None else _command_start
        return cls(start + seconds, seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls()

    # ------------------------------------------------------------------ queries
    def remaining(self) -> float:
        """Seconds left (never negative; ``math.inf`` without a limit)."""
        return max(0.0, self.end - time.monotonic())

    def elapsed(self) -> float:
        """Seconds since a bounded deadline's budget began (its end less its limit): a command's time so far."""
        return time.monotonic() - (self.end - self.limit)

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def __call__(self) -> bool:
        """PyVRP-style stopping criterion: ``True`` once the deadline has passed."""
        return self.expired()

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.end)

    def check(self) -> None:
        """Raise :class:`DeadlineReached` if the deadline has passed."""
        if time.monotonic() >= self.end:
            raise DeadlineReached

    # -------------------------------------------------------------- sub-budgets
    def share(self, fraction: float, *, at_most: float = math.inf) -> Deadline:
        """A deadline ending after ``fraction`` of what is left now (and after at most ``at_most`` s).

        It never ends later than this one, so a stage cannot overrun its parent.
        """
        left = self.remaining()
        seconds = min(left * fraction if math.isfinite(left) else math.inf, at_most)
        if not math.isfinite(seconds):
            return self
        return Deadline(min(self.end, time.monotonic() + seconds), self.limit)

    def before(self, margin: float) -> Deadline:
        """This deadline brought forward by ``margin`` seconds (time kept for work after a stage)."""
        if not self.bounded:
            return self
        return Deadline(self.end - max(0.0, margin), self.limit)

    def grace(self) -> float:
        """How long after the deadline a command may still end: max(1 s, 5% of the limit)."""
        if not math.isfinite(self.limit):
            return math.inf
        return max(GRACE_SECONDS, GRACE_SHARE * self.limit)

    def __repr__(self) -> str:
        if not self.bounded:
            return "Deadline(never)"
        return f"Deadline({self.remaining():.3f} s left of {self.limit:g} s)"


def _seconds(value: object, name: str) -> float:
    """A :class:`Deadline` field as a float (a real number, not a bool), else an :class:`InputError`."""
    if isinstance(value, bool) or not isinstance(value, int | float | Real):
        raise InputError(
            f"Deadline: {name} must be a number of seconds, got {type(value).__name__} "
            f"(a budget from now is kvsched.Deadline.after(seconds))"
        )
    return float(value)


#: What Ctrl-C may arrive as: a compiled kernel's dispatcher (numba) turns a KeyboardInterrupt raised while it
#: runs Python code of its own (loading a cached kernel) into a SystemError whose cause is the interrupt.
INTERRUPTS = (KeyboardInterrupt, SystemError)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C: a KeyboardInterrupt, or an exception caused by one (see :data:`INTERRUPTS`).

    Catch :data:`INTERRUPTS` and re-raise what this says is not an interrupt::

        try:
            ...
        except INTERRUPTS as exc:
            if not interrupted(exc):
                raise
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def wait_timeout(seconds: float) -> float | None:
    """``seconds`` as a timeout ``threading`` takes: None (wait for ever) for an infinite wait or one past
    ``threading.TIMEOUT_MAX`` (``--time-limit 1e10`` raised OverflowError: about 9.2e9 s is the most a wait
    may be given), and never below 0."""
    import threading  # here: only the solvers' waits need it

    return None if not seconds < threading.TIMEOUT_MAX else max(0.0, seconds)


def check_time_limit(seconds: float, name: str = "--time-limit") -> float:
    """``seconds`` as a float if it is a usable time limit, else one clear :class:`InputError`."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {seconds!r} is not a number of seconds") from None
    if math.isnan(value) or value <= 0 or math.isinf(value):
        raise InputError(f"{name}: {seconds!r} must be a positive, finite number of seconds")
    return value
